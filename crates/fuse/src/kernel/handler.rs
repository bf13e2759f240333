//! What a server settles with the kernel, apart from how requests reach
//! it: both transports (`conn.rs` over `/dev/fuse`, `uring.rs` over
//! io_uring) take a [`Handler`] and what INIT [`Agreed`], and neither
//! depends on the other for them.

use super::abi::{self, InitIn};
use super::{Reply, Request};

/// What serves a connection's requests.
pub trait Handler: Send + Sync + 'static {
    /// Chooses the INIT reply's flags and limits from what the kernel
    /// offers (`offered`: `flags`, and `flags2` above bit 32).
    fn init(&self, offered: u64, init: &InitIn) -> Init;

    /// Answers one request (INIT is answered by the handshake).
    fn handle(&self, req: Request<'_>, reply: Reply<'_>);

    /// The connection is gone: the file system was unmounted.
    fn destroy(&self) {}
}

/// A server's side of INIT.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Init {
    /// The flags taken, among those offered.
    pub flags: u64,
    /// Readahead in bytes (it can only lower the kernel's).
    pub max_readahead: u32,
    /// Largest request in pages (`FUSE_MAX_PAGES`); also the largest
    /// WRITE, `max_pages * 4096` bytes.
    pub max_pages: u16,
    /// Background requests (readahead, async reads) in flight at most.
    pub max_background: u16,
    /// Background requests beyond which the kernel counts the connection
    /// as congested.
    pub congestion_threshold: u16,
    /// Stack depth of backing files (passthrough); 0 without.
    pub max_stack_depth: u32,
}

/// What the handshake agreed on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Agreed {
    /// The protocol's minor version.
    pub minor: u32,
    /// The flags in force: what the server took of the kernel's offer.
    pub flags: u64,
    /// The largest WRITE, in bytes.
    pub max_write: u32,
    /// What the kernel offered (`HAS_RESEND` among them says whether it
    /// can resend the requests a dead server took).
    pub offered: u64,
}

impl Agreed {
    /// The size of a buffer that holds any request: the largest write, its
    /// header and arguments, rounded up to a page, and never under the
    /// kernel's minimum.
    pub fn buffer_size(&self) -> usize {
        (self.max_write as usize + 4096).max(abi::MIN_READ_BUFFER)
    }
}
