//! romfs: images from genromfs and `foliofs mkfs`, mounted and read through
//! the library, against the source tree and Linux's own romfs driver.

mod genromfs;
mod hostile;
mod kernel;
mod mkfs;
mod mount;
pub mod util;
