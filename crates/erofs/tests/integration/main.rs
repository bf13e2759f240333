//! The EROFS library's integration tests, one binary: images mkfs.erofs
//! built read back as their source trees hold them, and damage of one kind
//! at a time is reported as that kind.

mod damage;
mod mkfs_images;
