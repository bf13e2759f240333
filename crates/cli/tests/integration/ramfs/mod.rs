//! ramfs: POSIX behaviour of a writable mount, pjdfstest and fsx, memory
//! pressure.

mod behaviour;
mod fsx;
mod pjdfstest;
mod pressure;
