//! A streaming tar reader that reads every layout people's tools write
//! (V7, USTAR, POSIX pax, GNU and old GNU, star) exactly as Go's
//! `archive/tar` reads it, since that is what container runtimes unpack
//! layers with: one tar must give one tree, whoever reads it.
//!
//! - PAX records are walked by their length (`pax`); an `x` header
//!   applies to the next file entry, across any GNU long-name entries in
//!   between; a global `g` header is checked and skipped (Go hands it to
//!   its caller and containerd ignores it).
//! - GNU long names and links (`L`, `K`) win over PAX `path`/`linkpath`.
//! - Numbers are octal or GNU base-256; sizes past 8 GiB come from either.
//! - Sparse files in every GNU format (`sparse`); ACL text as the
//!   kernel's binary xattrs (`acl`).
//! - Meta headers (`x`, `g`, `L`, `K`) hold at most 1 MiB, as in Go, so a
//!   hostile tar cannot make the reader hold more.
//!
//! The crate's `tar` dependency was dropped for this: it split PAX bodies
//! at newlines (refusing binary xattrs, and seeing records inside values
//! that Go sees as data) and read no PAX sparse format.

pub mod acl;
mod fields;
pub mod header;
pub mod pax;
pub mod sparse;

use std::collections::BTreeMap;
use std::io::{self, Read};

use header::{Format, BLOCK};
use pax::Records;
use sparse::Fragment;

/// Most bytes a meta header (`x`, `g`, `L`, `K`) may hold.
pub const MAX_META: u64 = 1 << 20;

/// What an entry is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A regular file (`0`, `\0`, `7`, or old GNU sparse `S`).
    Regular,
    /// A directory (`5`, GNU's dumpdir `D`, or `\0` with a trailing `/`).
    Dir,
    /// A symbolic link (`2`).
    Symlink,
    /// A hard link to an earlier entry (`1`).
    HardLink,
    /// A character device (`3`).
    Char,
    /// A block device (`4`).
    Block,
    /// A fifo (`6`).
    Fifo,
}

/// One entry, with its meta headers applied.
#[derive(Clone, Debug)]
pub struct Entry {
    /// Byte offset of the entry's own header in the stream.
    pub offset: u64,
    /// What the entry is.
    pub kind: Kind,
    /// The path, as the headers give it.
    pub path: Vec<u8>,
    /// The target of a symlink or hard link.
    pub link: Vec<u8>,
    /// Permission bits (`07777`).
    pub mode: u32,
    /// Owner.
    pub uid: i64,
    /// Group.
    pub gid: i64,
    /// Modification time: seconds, and nanoseconds past them.
    pub mtime: i64,
    /// Nanoseconds of the modification time.
    pub nsec: u32,
    /// A device's major number.
    pub major: i64,
    /// A device's minor number.
    pub minor: i64,
    /// The file's size (a sparse file's whole size, holes included).
    pub size: u64,
    /// Byte offset of the data in the stream (past a PAX 1.0 sparse map).
    pub data_at: u64,
    /// Bytes of data stored: `size`, or a sparse file's fragments'.
    pub stored: u64,
    /// A sparse file's data fragments, in order.
    pub sparse: Option<Vec<Fragment>>,
    /// Extended attributes by full name: `SCHILY.xattr.*`,
    /// `LIBARCHIVE.xattr.*`, and ACLs as `system.posix_acl_*`.
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Whether the access ACL came from `SCHILY.acl.access` text (as tar
    /// tools write it) rather than a binary xattr record.
    pub acl_text: bool,
}

/// Why the stream could not be read.
#[derive(Debug, thiserror::Error)]
#[error("{why}")]
pub struct TarError {
    /// Offset of the header at fault (or of the stream's end).
    pub offset: u64,
    /// The entry's path, where one was read.
    pub path: Option<Vec<u8>>,
    /// What is wrong.
    pub why: String,
}

/// Reads entries one after another; each entry's data is read through
/// [`Reader::data`] before the next is asked for (what is left unread is
/// skipped).
pub struct Reader<R> {
    r: R,
    /// Bytes consumed from the stream.
    pos: u64,
    /// Data bytes of the current entry not yet read, then its padding.
    left: u64,
    pad: u64,
    done: bool,
}

fn err(offset: u64, path: Option<&[u8]>, why: impl Into<String>) -> TarError {
    TarError {
        offset,
        path: path.map(<[u8]>::to_vec),
        why: why.into(),
    }
}

impl<R: Read> Reader<R> {
    /// Reads the tar stream `r`.
    pub fn new(r: R) -> Self {
        Reader {
            r,
            pos: 0,
            left: 0,
            pad: 0,
            done: false,
        }
    }

    /// Bytes consumed from the stream so far.
    pub fn position(&self) -> u64 {
        self.pos
    }

    /// The stream under the reader, for what follows the last entry.
    pub fn into_inner(self) -> R {
        self.r
    }

    /// Reads up to `buf.len()` bytes, fewer only at the stream's end.
    fn fill(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut got = 0;
        while got < buf.len() {
            match self.r.read(&mut buf[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.pos += got as u64;
                    return Err(e);
                }
            }
        }
        self.pos += got as u64;
        Ok(got)
    }

    /// Skips `n` bytes; false if the stream ended first.
    fn skip(&mut self, mut n: u64) -> io::Result<bool> {
        let mut buf = [0u8; 8192];
        while n > 0 {
            let want = n.min(buf.len() as u64) as usize;
            let got = self.fill(&mut buf[..want])?;
            if got == 0 {
                return Ok(false);
            }
            n -= got as u64;
        }
        Ok(true)
    }

    /// The current entry's stored data (a sparse file's fragments, one
    /// after another).
    pub fn data(&mut self) -> Data<'_, R> {
        Data { t: self }
    }

    /// Reads a meta header's whole body.
    fn meta_body(&mut self, at: u64, size: u64, what: &str) -> Result<Vec<u8>, TarError> {
        if size > MAX_META {
            return Err(err(
                at,
                None,
                format!("a {what} of {size} bytes; at most {MAX_META} are read"),
            ));
        }
        let mut v = vec![0; size as usize];
        let got = self
            .fill(&mut v)
            .map_err(|e| err(at, None, format!("reading a {what}: {e}")))?;
        if got < v.len() {
            return Err(err(
                at,
                None,
                format!("the tar ends inside a {what} ({got} of {size} bytes)"),
            ));
        }
        self.left = 0;
        Ok(v)
    }

    /// Finishes the previous entry: skips its unread data and padding.
    fn finish_entry(&mut self) -> Result<(), TarError> {
        let (left, pad) = (self.left, self.pad);
        self.left = 0;
        self.pad = 0;
        let at = self.pos;
        let io = |e: io::Error| err(at, None, format!("reading the tar: {e}"));
        if !self.skip(left).map_err(io)? {
            return Err(err(self.pos, None, "the tar ends inside an entry's data"));
        }
        // Go tolerates a stream that ends in the last entry's padding.
        self.skip(pad)
            .map_err(|e| err(self.pos, None, format!("reading the tar: {e}")))?;
        Ok(())
    }

    /// Reads one header block; `None` at the end of the archive.
    fn block(&mut self) -> Result<Option<(u64, [u8; BLOCK])>, TarError> {
        let at = self.pos;
        let mut b = [0u8; BLOCK];
        let got = self
            .fill(&mut b)
            .map_err(|e| err(at, None, format!("reading a header: {e}")))?;
        if got == 0 {
            return Ok(None);
        }
        if got < BLOCK {
            return Err(err(
                at,
                None,
                format!("the tar ends inside a header ({got} of 512 bytes)"),
            ));
        }
        if b.iter().all(|&c| c == 0) {
            let mut b2 = [0u8; BLOCK];
            let got = self
                .fill(&mut b2)
                .map_err(|e| err(at, None, format!("reading a header: {e}")))?;
            if got == 0 || (got == BLOCK && b2.iter().all(|&c| c == 0)) {
                return Ok(None);
            }
            return Err(err(
                at,
                None,
                "a zero block followed by something other than the second zero block that ends a tar",
            ));
        }
        Ok(Some((at, b)))
    }

    /// The next entry, or `None` at the end of the archive.
    pub fn next_entry(&mut self) -> Result<Option<Entry>, TarError> {
        if self.done {
            return Ok(None);
        }
        self.finish_entry()?;
        let mut pending = Pending::default();
        loop {
            let Some(hd) = self.header()? else {
                self.done = true;
                if !pending.is_empty() {
                    return Err(err(
                        self.pos,
                        None,
                        "the tar ends after a meta header, with no entry for it",
                    ));
                }
                return Ok(None);
            };
            if self.meta_header(&hd, &mut pending)? {
                continue;
            }
            if let Some(e) = self.file_entry(hd, &mut pending)? {
                return Ok(Some(e));
            }
        }
    }

    /// The current entry stores `stored` bytes of data, then its padding.
    fn expect_data(&mut self, stored: u64) {
        self.left = stored;
        self.pad = stored.next_multiple_of(BLOCK as u64) - stored;
    }

    /// Reads the next header block and checks and parses it; `None` at the
    /// end of the archive.
    fn header(&mut self) -> Result<Option<Header>, TarError> {
        let Some((at, b)) = self.block()? else {
            return Ok(None);
        };
        let fmt = header::format(&b).ok_or_else(|| {
            err(
                at,
                None,
                "a header whose checksum is wrong (not a tar, or a damaged one)",
            )
        })?;
        let fields = fields::parse_header(&b, fmt)
            .map_err(|why| err(at, Some(header::string(&b[header::NAME])), why))?;
        let typ = b[header::TYPEFLAG];
        let header_only = matches!(typ, b'1' | b'2' | b'3' | b'4' | b'5' | b'6');
        let stored = if header_only { 0 } else { fields.size };
        self.expect_data(stored);
        Ok(Some(Header {
            at,
            b,
            fmt,
            fields,
            typ,
            stored,
        }))
    }

    /// Reads a meta header (`x`, `g`, `L`, `K`) into `pending`, past its
    /// body; false, reading nothing, for any other header.
    fn meta_header(&mut self, hd: &Header, pending: &mut Pending) -> Result<bool, TarError> {
        let (at, typ, stored) = (hd.at, hd.typ, hd.stored);
        match typ {
            b'x' | b'g' => {
                let what = if typ == b'x' {
                    "PAX header"
                } else {
                    "PAX global header"
                };
                let body = self.meta_body(at, stored, what)?;
                let r = pax::parse(&body).map_err(|why| err(at, None, format!("{what}: {why}")))?;
                if typ == b'x' {
                    pending.records = Some(r);
                } else {
                    // Go returns a global header to its caller as an
                    // entry of its own, so what came before it applies
                    // to nothing; containerd then skips it.
                    *pending = Pending::default();
                }
            }
            b'L' | b'K' => {
                let what = if typ == b'L' {
                    "GNU long name"
                } else {
                    "GNU long link"
                };
                let body = self.meta_body(at, stored, what)?;
                let s = header::string(&body);
                // What follows the first NUL must be padding: Go would
                // cut a name there, and a name cut short is not what
                // the writer meant.
                if body[s.len()..].iter().any(|&c| c != 0) {
                    return Err(err(at, Some(s), format!("a NUL byte inside a {what}")));
                }
                if typ == b'L' {
                    pending.long_name = Some(s.to_vec());
                } else {
                    pending.long_link = Some(s.to_vec());
                }
            }
            _ => return Ok(false),
        }
        self.finish_entry()?;
        Ok(true)
    }

    /// The file entry of header `hd`, with what `pending` holds for it
    /// applied; `None` for a GNU volume label, skipped.
    fn file_entry(&mut self, hd: Header, pending: &mut Pending) -> Result<Option<Entry>, TarError> {
        let Header {
            at,
            b,
            fmt,
            fields: mut h,
            typ,
            ..
        } = hd;
        let recs = pending.records.take().unwrap_or_default();
        let (xattrs, acl_text) = pending.apply(&recs, &mut h, at)?;
        let Some(kind) = kind(typ, &h.path).map_err(|why| err(at, Some(&h.path), why))? else {
            // A GNU volume label names the archive, not a file.
            self.expect_data(h.size);
            self.finish_entry()?;
            return Ok(None);
        };
        // The size PAX gave is what is stored, for all but headers
        // that carry no data.
        let stored = if matches!(kind, Kind::Regular) || typ == b'D' {
            h.size
        } else {
            0
        };
        self.expect_data(stored);
        let mut e = Entry {
            offset: at,
            kind,
            path: h.path,
            link: h.link,
            mode: (h.mode & 0o7777) as u32,
            uid: h.uid,
            gid: h.gid,
            mtime: h.mtime,
            nsec: h.nsec,
            major: h.major,
            minor: h.minor,
            size: stored,
            data_at: self.pos,
            stored,
            sparse: None,
            xattrs,
            acl_text,
        };
        if typ == b'D' {
            // A GNU dumpdir's data lists names for incremental
            // restores; the directory is all it makes. The list is
            // still what `data` yields, so `stored` counts it.
            e.size = 0;
        } else if typ == b'S' {
            self.old_gnu_sparse(&b, fmt, &mut e)?;
        } else if kind == Kind::Regular {
            self.pax_sparse(&recs, &mut e)?;
        }
        Ok(Some(e))
    }
}

/// A header block, checked and parsed.
struct Header {
    /// Its offset in the stream.
    at: u64,
    b: [u8; BLOCK],
    fmt: Format,
    fields: fields::Fields,
    typ: u8,
    /// The data bytes that follow it, as its own size field gives them.
    stored: u64,
}

/// Extended attributes by full name.
type Xattrs = BTreeMap<Vec<u8>, Vec<u8>>;

/// The meta headers read since the last file entry, for the next one.
#[derive(Default)]
struct Pending {
    records: Option<Records>,
    long_name: Option<Vec<u8>>,
    long_link: Option<Vec<u8>>,
}

impl Pending {
    fn is_empty(&self) -> bool {
        self.records.is_none() && self.long_name.is_none() && self.long_link.is_none()
    }

    /// Applies PAX records `recs` to `h`, then the GNU long names, which
    /// win; returns the entry's xattrs, its ACLs among them, and whether
    /// it had an access ACL.
    fn apply(
        &mut self,
        recs: &Records,
        h: &mut fields::Fields,
        at: u64,
    ) -> Result<(Xattrs, bool), TarError> {
        let bad = |why: String, path: &[u8]| err(at, Some(path), why);
        let (mut xattrs, acls) = fields::apply_records(recs, h).map_err(|w| bad(w, &h.path))?;
        if let Some(n) = self.long_name.take() {
            h.path = n;
        }
        if let Some(l) = self.long_link.take() {
            h.link = l;
        }
        let acl_text = acls.iter().any(|a| a.0 == acl::ACCESS);
        for (name, text) in acls {
            match acl::to_xattr(&text, &acl::host_id).map_err(|w| bad(w, &h.path))? {
                Some(v) => {
                    xattrs.insert(name.to_vec(), v);
                }
                None => {
                    xattrs.remove(name);
                }
            }
        }
        Ok((xattrs, acl_text))
    }
}

/// What a file entry of type flag `typ` at `path` is; `None` for a GNU
/// volume label.
fn kind(typ: u8, path: &[u8]) -> Result<Option<Kind>, String> {
    Ok(Some(match typ {
        b'0' | b'7' => Kind::Regular,
        0 if path.ends_with(b"/") => Kind::Dir,
        0 => Kind::Regular,
        b'S' => Kind::Regular,
        b'1' => Kind::HardLink,
        b'2' => Kind::Symlink,
        b'3' => Kind::Char,
        b'4' => Kind::Block,
        b'5' | b'D' => Kind::Dir,
        b'6' => Kind::Fifo,
        b'V' => return Ok(None),
        t => {
            return Err(format!(
                "entry type {:?}, which no file system stores (not a file, directory, link, device or fifo)",
                t as char
            ))
        }
    }))
}

/// The current entry's stored data, read through the [`Reader`].
pub struct Data<'a, R> {
    t: &'a mut Reader<R>,
}

impl<R: Read> Read for Data<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = (self.t.left.min(buf.len() as u64)) as usize;
        if n == 0 {
            return Ok(0);
        }
        let got = loop {
            match self.t.r.read(&mut buf[..n]) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                other => break other?,
            }
        };
        self.t.pos += got as u64;
        self.t.left -= got as u64;
        Ok(got)
    }
}

#[cfg(test)]
pub(crate) mod tests;
