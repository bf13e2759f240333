//! Answering a request: every request but FORGET gets exactly one reply,
//! which a [`Reply`] sends once, through whichever transport the request
//! came by ([`Sink`]).

use std::io;

use zerocopy::{Immutable, IntoBytes};

/// Where a transport sends replies: `/dev/fuse` writes them at once, an
/// io_uring entry keeps them until it commits.
pub trait Sink {
    /// Sends the reply to `unique`: `errno` 0 with `parts` after the
    /// header, or a positive errno alone.
    fn send(&self, unique: u64, errno: i32, parts: &[&[u8]]) -> io::Result<()>;
}

impl Sink for super::Dev {
    fn send(&self, unique: u64, errno: i32, parts: &[&[u8]]) -> io::Result<()> {
        self.reply(unique, errno, parts)
    }
}

/// The reply owed to one request. Dropping it unsent answers `EIO`, so a
/// handler that forgets to reply cannot leave a process waiting.
pub struct Reply<'a> {
    unique: u64,
    sink: &'a dyn Sink,
    done: bool,
}

impl<'a> Reply<'a> {
    /// The reply to request `unique`, to go out through `sink`.
    pub fn new(unique: u64, sink: &'a dyn Sink) -> Reply<'a> {
        Reply {
            unique,
            sink,
            done: false,
        }
    }

    fn finish(&mut self, errno: i32, parts: &[&[u8]]) {
        self.done = true;
        if let Err(e) = self.sink.send(self.unique, errno, parts) {
            log::warn!("cannot send the reply to request {}: {e}", self.unique);
        }
    }

    /// Fails the request with `errno` (positive).
    pub fn error(mut self, errno: i32) {
        self.finish(errno, &[]);
    }

    /// Succeeds with no payload.
    pub fn ok(mut self) {
        self.finish(0, &[]);
    }

    /// Succeeds with `parts`, sent one after another.
    pub fn parts(mut self, parts: &[&[u8]]) {
        self.finish(0, parts);
    }

    /// Succeeds with one record.
    pub fn record<T: IntoBytes + Immutable>(self, r: &T) {
        self.parts(&[r.as_bytes()]);
    }

    /// A request that takes no reply (FORGET and its batches, INTERRUPT).
    pub fn none(mut self) {
        self.done = true;
    }
}

impl Drop for Reply<'_> {
    fn drop(&mut self) {
        if !self.done {
            log::error!("request {} left without a reply: EIO", self.unique);
            self.finish(libc::EIO, &[]);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;

    #[derive(Default)]
    struct Capture(RefCell<Vec<(u64, i32, Vec<u8>)>>);

    impl Sink for Capture {
        fn send(&self, unique: u64, errno: i32, parts: &[&[u8]]) -> io::Result<()> {
            self.0.borrow_mut().push((unique, errno, parts.concat()));
            Ok(())
        }
    }

    #[test]
    fn every_reply_goes_out_once_and_a_forgotten_one_as_eio() {
        let c = Capture::default();
        Reply::new(1, &c).record(&7u64);
        Reply::new(2, &c).error(libc::ENOENT);
        Reply::new(3, &c).none();
        drop(Reply::new(4, &c));
        let got = c.0.borrow();
        assert_eq!(got[0], (1, 0, 7u64.to_ne_bytes().to_vec()));
        assert_eq!(got[1], (2, libc::ENOENT, vec![]));
        assert_eq!(got[2], (4, libc::EIO, vec![]));
        assert_eq!(got.len(), 3);
    }
}
