//! Serve any foliofs [`FileSystem`](foliofs_vfs::FileSystem) over FUSE.
//!
//! The crate is laid out by job, so that each folder answers one question:
//! - `kernel/` speaks the FUSE protocol, in the project's own code: the
//!   records of `fuse.h` (`abi.rs`), every operation named once with its
//!   opcode, name and counter ([`Op`]), requests parsed and answered, the
//!   device, and the two transports, `/dev/fuse` and FUSE over io_uring;
//! - [`mount`](mod@mount) gets a mount and lets it go: [`mount()`] mounts a file
//!   system as `fuse.foliofs` with `mount(2)` (through `fusermount3` for a
//!   user who may not, see [`mount::privilege`]), completes the FUSE
//!   handshake and tunes the mount's bdi, and [`mount::watch`] takes a
//!   mount down after a server that died (`auto_unmount`);
//! - [`server`] answers requests from the file system ([`Mounted::run`]
//!   serves them on several threads until the mount goes away), and does
//!   what spares the kernel round trips: pushing data, passthrough,
//!   polling for the next request, listings built ahead;
//! - [`supervise`] keeps a connection apart from its server
//!   ([`supervise::held`]) and starts a new server on it when one dies;
//! - [`records`] keeps what each live server resolved for `foliofs
//!   mounts`, its request counts, and their publishing
//!   ([`records::published`]);
//! - [`options`] parses the kernel-style `-o` keys of FUSE and `mount(8)`
//!   (the layers below parse their own).
//!
//! The file system's root is node 1 to the kernel, while `st_ino` stays
//! the format's own inode number.

// A descriptor received over a socket (`mount/fusermount.rs`) or inherited
// from a supervisor (`supervise/held.rs`) needs `unsafe` to be owned, the
// ioctls of `/dev/fuse` to be made (`kernel/dev.rs`), and FUSE over
// io_uring its shared rings and buffers (`kernel/uring.rs`); nothing else
// may use it, and each use says why it is sound (`// SAFETY:`).
#![deny(unsafe_code)]
#![warn(missing_docs)]

mod kernel;
pub mod mount;
pub mod options;
pub mod records;
pub mod server;
pub mod supervise;

pub use kernel::{kernel_at_least, Op, COUNTER_NAMES};
pub use mount::{
    find_mount, mount, mount_table, unmount, MountConfig, MountError, MountInfo, MountMethod,
    Mounted, FS_TYPE, IMAGE_READ_AHEAD_KB,
};
pub use options::{
    format_size, parse_size, strip_helper_defaults, MountFlags, MountOptions, OptionError,
};
pub use records::{RequestCounts, EXTRA_NAMES};
pub use server::convert::Overrides;
pub use server::passthrough::Passthrough;
pub use server::profile::{ImageKey, Profile, ProfileError};
pub use server::ServerConfig;
