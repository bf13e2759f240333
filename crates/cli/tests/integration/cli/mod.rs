//! The command itself: what it prints besides file contents, and how a
//! system install lets mount(8) and fstab reach it.

mod fstab;
mod text;
