//! ramfs: POSIX behaviour of a writable mount, pjdfstest and fsx, memory
//! pressure.

mod behaviour;
mod datapath;
mod fsx;
mod pjdfstest;
mod pressure;
mod survive;
