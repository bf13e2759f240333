//! The body of a READDIR or READDIRPLUS reply: entries packed one after
//! another, each padded to 8 bytes, up to the size the kernel asked for.

use zerocopy::IntoBytes;

use super::abi::{align8, Dirent, EntryOut};

/// A listing reply being filled. One per server thread, reused: it never
/// shrinks, so the hot path allocates nothing once it has grown.
#[derive(Debug, Default)]
pub struct DirBuf {
    buf: Vec<u8>,
    max: usize,
    /// The cookie of the last entry added (where a next listing resumes).
    last_off: u64,
    /// An entry did not fit: the listing goes on past this reply.
    full: bool,
}

impl DirBuf {
    /// Starts a reply of at most `size` bytes.
    pub fn start(&mut self, size: u32) {
        self.buf.clear();
        self.max = size as usize;
        self.last_off = 0;
        self.full = false;
    }

    fn put(&mut self, entry: Option<&EntryOut>, d: Dirent, name: &[u8]) -> bool {
        let head = entry.map_or(0, |_| size_of::<EntryOut>()) + size_of::<Dirent>();
        let len = align8(head + name.len());
        if self.buf.len() + len > self.max {
            self.full = true;
            return false;
        }
        self.last_off = d.off;
        if let Some(e) = entry {
            self.buf.extend_from_slice(e.as_bytes());
        }
        self.buf.extend_from_slice(d.as_bytes());
        self.buf.extend_from_slice(name);
        let pad = len - head - name.len();
        self.buf.extend_from_slice(&[0u8; 8][..pad]);
        true
    }

    /// Adds a READDIR entry: inode number `ino` (`d_ino`), the cookie to
    /// resume after it, its `d_type`. False, adding nothing, when it does
    /// not fit.
    pub fn push(&mut self, ino: u64, off: u64, kind: u32, name: &[u8]) -> bool {
        let d = Dirent {
            ino,
            off,
            namelen: name.len() as u32,
            kind,
        };
        self.put(None, d, name)
    }

    /// Adds a READDIRPLUS entry: `entry` as a LOOKUP reply would give it
    /// (node id 0 links no inode in the kernel: no LOOKUP count, no
    /// FORGET), with `d_ino` `ino`.
    pub fn push_plus(
        &mut self,
        entry: &EntryOut,
        ino: u64,
        off: u64,
        kind: u32,
        name: &[u8],
    ) -> bool {
        let d = Dirent {
            ino,
            off,
            namelen: name.len() as u32,
            kind,
        };
        self.put(Some(entry), d, name)
    }

    /// The reply's body.
    pub fn bytes(&self) -> &[u8] {
        &self.buf
    }

    /// Where the listing resumes after this reply, if an entry did not fit
    /// in it (the directory goes on past it): the last entry's cookie.
    pub fn resumes_at(&self) -> Option<u64> {
        (self.full && !self.buf.is_empty()).then_some(self.last_off)
    }

    /// The reply's body, taken out (the buffer is left empty).
    pub fn take_bytes(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_padded_to_eight_bytes_and_stop_at_the_size() {
        let mut b = DirBuf::default();
        b.start(64);
        assert!(b.push(5, 1, 8, b"abc"));
        assert_eq!(b.bytes().len(), 32);
        assert_eq!(&b.bytes()[24..27], b"abc");
        assert!(b.push(6, 2, 4, b"defghijk"));
        assert_eq!(b.bytes().len(), 64);
        assert_eq!(b.resumes_at(), None, "nothing left out yet");
        assert!(!b.push(7, 3, 8, b"x"), "over the size asked for");
        assert_eq!(b.bytes().len(), 64);
        assert_eq!(b.resumes_at(), Some(2), "after the last entry added");
        b.start(200);
        let e = EntryOut::default();
        assert!(b.push_plus(&e, 9, 1, 8, b"n"));
        assert_eq!(b.bytes().len(), 160);
        assert!(!b.push_plus(&e, 9, 2, 8, b"n"));
    }
}
