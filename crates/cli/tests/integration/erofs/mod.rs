//! EROFS: mkfs.erofs images against the kernel's EROFS driver, damaged
//! images, concurrent reads through a mount.

mod conformance;
mod corrupt;
mod mount;
