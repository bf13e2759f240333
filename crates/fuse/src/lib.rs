//! Serve any foliofs [`FileSystem`](foliofs_vfs::FileSystem) over FUSE.
//!
//! [`options`] parses kernel-style `-o` strings; [`mount`] mounts a file
//! system as `fuse.foliofs` with `mount(2)`, completes the FUSE handshake and
//! tunes the mount's bdi; [`Mounted::run`] serves requests on several threads
//! until the mount goes away. The file system's root is node 1 to the kernel,
//! while `st_ino` stays the format's own inode number.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod convert;
mod ids;
pub mod options;
mod server;
mod session;

pub use convert::Overrides;
pub use options::{format_size, parse_size, MountFlags, MountOptions, OptionError};
pub use server::ServerConfig;
pub use session::{
    find_mount, mount, mount_table, unmount, MountConfig, MountError, MountInfo, Mounted, FS_TYPE,
};
