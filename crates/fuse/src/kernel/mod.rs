//! The FUSE protocol, spoken over `/dev/fuse` by the project's own code
//! rather than a library's: what the kernel sends and takes is in
//! [`abi`]; [`Op`] names every operation once (opcode, name, counter);
//! [`Request`] parses a request, [`Reply`] answers it once;
//! [`Dev`] reads, writes, clones the connection and registers backing
//! files; [`conn`] negotiates INIT and runs the server threads.
//!
//! Why our own: the levers that are left between a FUSE server and the
//! kernel are in this layer (listing entries that link no inode, the
//! flags that spare requests, replies written from the block cache
//! without a copy, FUSE over io_uring), and no well-kept library had them.

pub mod abi;
pub mod conn;
mod dev;
mod dirbuf;
mod handler;
mod op;
mod release;
mod reply;
mod request;
pub mod uring;

pub use dev::Dev;
pub use dirbuf::DirBuf;
pub use handler::{Agreed, Handler, Init};
pub use op::{Op, COUNTER_NAMES};
pub use release::kernel_at_least;
pub use reply::Reply;
pub use request::{Args, Request};
