//! ramfs: POSIX behaviour of a writable mount, pjdfstest and fsx.

mod behaviour;
mod datapath;
mod fsx;
mod pjdfstest;
