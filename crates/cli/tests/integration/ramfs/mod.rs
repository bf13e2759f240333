//! ramfs: POSIX behaviour of a writable mount, pjdfstest and fsx.

mod behaviour;
mod fsx;
mod pjdfstest;
