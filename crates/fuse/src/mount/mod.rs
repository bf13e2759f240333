//! Getting a mount and letting it go, which is the host's business more
//! than FUSE's: who may call `mount(2)` and who needs `fusermount3`
//! ([`privilege`], [`fusermount`]), the mount table, the handshake and bdi
//! tuning of a new mount, and the watcher that takes a mount down after
//! its server died ([`watch`]). What runs on a mount once it is up is
//! `server/`'s; what keeps it across servers is `supervise/`'s.

mod attach;
pub mod fusermount;
pub mod privilege;
mod session;
mod table;
pub mod watch;

pub(crate) use attach::{attach, detach, Attached};
pub use attach::{unmount, MountError, MountMethod, FS_TYPE};
pub(crate) use session::{clones, start_spin, tune_bdi};
pub use session::{mount, MountConfig, Mounted, IMAGE_READ_AHEAD_KB};
pub use table::{find_mount, mount_table, MountInfo};
