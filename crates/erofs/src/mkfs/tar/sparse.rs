//! GNU sparse files: the map of data fragments (old GNU in the header and
//! its extension blocks; PAX 0.0 and 0.1 in records; PAX 1.0 at the start
//! of the data), checked as Go's `archive/tar` checks it, and the file's
//! bytes rebuilt from the fragments stored one after another.

use std::io::{self, Read};

use super::header::{self, Format, BLOCK};
use super::pax::{self, Records};
use super::{err, Entry, TarError};

/// Most fragments one file may have: a map is held in memory until the
/// file is written, so a hostile one must not grow without end.
pub const MAX_FRAGMENTS: usize = 1 << 22;

/// A data fragment: its offset in the file and its length.
pub type Fragment = (u64, u64);

/// Checks that fragments are in order, do not overlap and end within
/// `size`.
pub fn validate(map: &[Fragment], size: u64) -> Result<(), String> {
    let mut end = 0u64;
    for (i, &(off, len)) in map.iter().enumerate() {
        let e = off
            .checked_add(len)
            .ok_or_else(|| format!("sparse fragment {i} ends past 2^64"))?;
        if off < end {
            return Err(format!(
                "sparse fragment {i} at {off} overlaps or precedes the one before (which ends at {end})"
            ));
        }
        if e > size {
            return Err(format!(
                "sparse fragment {i} ends at {e}, past the file's size {size}"
            ));
        }
        end = e;
    }
    Ok(())
}

/// Which PAX sparse format the records describe: `Some(true)` for 1.0
/// (map in the data), `Some(false)` for 0.0/0.1 (map in the records),
/// `None` for a plain file. An unknown version is a plain file, as Go
/// reads it.
pub fn pax_version(r: &Records) -> Option<bool> {
    let major = pax::get(r, b"GNU.sparse.major");
    let minor = pax::get(r, b"GNU.sparse.minor");
    match (major, minor) {
        (Some(b"0"), Some(b"0" | b"1")) => Some(false),
        (Some(b"1"), Some(b"0")) => Some(true),
        (Some(_), _) | (_, Some(_)) => None,
        _ => pax::get(r, b"GNU.sparse.map")
            .filter(|m| !m.is_empty())
            .map(|_| false),
    }
}

fn number(v: &[u8], what: &str) -> Result<u64, String> {
    pax::int(v)
        .and_then(|n| u64::try_from(n).ok())
        .ok_or_else(|| format!("{what} {:?} is not a size", String::from_utf8_lossy(v)))
}

/// The map of PAX 0.0 / 0.1: `GNU.sparse.numblocks` pairs in
/// `GNU.sparse.map`.
pub fn map_0x(r: &Records) -> Result<Vec<Fragment>, String> {
    let n = number(
        pax::get(r, b"GNU.sparse.numblocks").unwrap_or(b""),
        "GNU.sparse.numblocks",
    )?;
    let text = pax::get(r, b"GNU.sparse.map").unwrap_or(b"");
    let fields: Vec<&[u8]> = if text.is_empty() {
        Vec::new()
    } else {
        text.split(|&c| c == b',').collect()
    };
    if fields.len() as u64 != n.saturating_mul(2) {
        return Err(format!(
            "GNU.sparse.numblocks is {n} but GNU.sparse.map holds {} numbers",
            fields.len()
        ));
    }
    fields
        .chunks(2)
        .map(|p| {
            Ok((
                number(p[0], "a sparse offset")?,
                number(p[1], "a sparse length")?,
            ))
        })
        .collect()
}

/// Reads the map PAX 1.0 keeps at the start of the data: decimal numbers
/// each ending in a newline (the count, then offset and length pairs),
/// in whole 512-byte blocks. Returns the map and the bytes it took.
pub fn map_1x0(r: &mut dyn Read, available: u64) -> Result<(Vec<Fragment>, u64), String> {
    let mut buf: Vec<u8> = Vec::new();
    let mut pos = 0usize;
    let mut used = 0u64;
    let mut block = [0u8; 512];
    let mut next = |buf: &mut Vec<u8>, pos: &mut usize, used: &mut u64| -> Result<u64, String> {
        loop {
            if let Some(nl) = buf[*pos..].iter().position(|&c| c == b'\n') {
                let tok = &buf[*pos..*pos + nl];
                let v = number(tok, "a number in the sparse map")?;
                *pos += nl + 1;
                return Ok(v);
            }
            if buf.len() - *pos > 64 {
                return Err("a number in the sparse map runs on past 64 bytes".into());
            }
            if *used + 512 > available {
                return Err("the sparse map runs past the entry's data".into());
            }
            r.read_exact(&mut block)
                .map_err(|e| format!("reading the sparse map: {e}"))?;
            *used += 512;
            buf.drain(..*pos);
            *pos = 0;
            buf.extend_from_slice(&block);
        }
    };
    let n = next(&mut buf, &mut pos, &mut used)?;
    if n > MAX_FRAGMENTS as u64 {
        return Err(format!(
            "a sparse map of {n} fragments; at most {MAX_FRAGMENTS} are read"
        ));
    }
    let mut map = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let off = next(&mut buf, &mut pos, &mut used)?;
        let len = next(&mut buf, &mut pos, &mut used)?;
        map.push((off, len));
    }
    Ok((map, used))
}

/// The bytes of a sparse file of `size` bytes from its fragments' data,
/// stored one after another in `inner`: zeros in the holes.
pub struct Expand<'a> {
    inner: &'a mut dyn Read,
    map: &'a [Fragment],
    size: u64,
    pos: u64,
    next: usize,
}

impl<'a> Expand<'a> {
    /// The file of `size` bytes with `map`'s fragments read from `inner`.
    pub fn new(inner: &'a mut dyn Read, map: &'a [Fragment], size: u64) -> Self {
        Expand {
            inner,
            map,
            size,
            pos: 0,
            next: 0,
        }
    }
}

impl Expand<'_> {
    /// Moves `n` bytes on (at most to the end), reading and dropping only
    /// the stored data among them: a hole is passed over at no cost, where
    /// reading it would make every one of its zeros (a tar of a few
    /// hundred bytes may claim a hole of exabytes).
    pub fn skip(&mut self, n: u64) -> io::Result<()> {
        let target = self.pos.saturating_add(n).min(self.size);
        while self.pos < target {
            while self
                .map
                .get(self.next)
                .is_some_and(|&(off, len)| self.pos >= off + len)
            {
                self.next += 1;
            }
            match self.map.get(self.next) {
                Some(&(off, _)) if off < target && self.pos < off => self.pos = off,
                Some(&(off, len)) if off < target => {
                    let want = (off + len).min(target) - self.pos;
                    let got = io::copy(&mut (&mut *self.inner).take(want), &mut io::sink())?;
                    if got < want {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "the tar ends inside a sparse file's data",
                        ));
                    }
                    self.pos += want;
                }
                _ => self.pos = target,
            }
        }
        Ok(())
    }
}

impl Read for Expand<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.pos >= self.size || buf.is_empty() {
            return Ok(0);
        }
        while self.next < self.map.len() {
            let (off, len) = self.map[self.next];
            if self.pos >= off + len {
                self.next += 1;
                continue;
            }
            if self.pos < off {
                let n = (off - self.pos).min(buf.len() as u64) as usize;
                buf[..n].fill(0);
                self.pos += n as u64;
                return Ok(n);
            }
            let n = (off + len - self.pos).min(buf.len() as u64) as usize;
            let got = self.inner.read(&mut buf[..n])?;
            if got == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the tar ends inside a sparse file's data",
                ));
            }
            self.pos += got as u64;
            return Ok(got);
        }
        let n = (self.size - self.pos).min(buf.len() as u64) as usize;
        buf[..n].fill(0);
        self.pos += n as u64;
        Ok(n)
    }
}

/// A sparse entry's map, read as its format says, into its entry.
impl<R: Read> super::Reader<R> {
    /// Reads an old GNU sparse entry's map (the header's four slots, then
    /// extension blocks while the flag says there are more).
    pub(super) fn old_gnu_sparse(
        &mut self,
        b: &[u8; BLOCK],
        fmt: Format,
        e: &mut Entry,
    ) -> Result<(), TarError> {
        let at = e.offset;
        let bad = |why: String| err(at, Some(&e.path), why);
        if fmt != Format::Gnu {
            return Err(bad(
                "a GNU sparse entry ('S') in a header that is not GNU's".into(),
            ));
        }
        let real = header::number(&b[header::GNU_REALSIZE])
            .map_err(|w| bad(format!("sparse real size: {w}")))?;
        let mut map = Vec::new();
        let slots = |area: &[u8], map: &mut Vec<Fragment>| -> Result<(), String> {
            for pair in area.chunks_exact(24) {
                if pair[0] == 0 {
                    break;
                }
                let off = header::number(&pair[..12])?;
                let len = header::number(&pair[12..])?;
                let (Ok(off), Ok(len)) = (u64::try_from(off), u64::try_from(len)) else {
                    return Err("a negative sparse offset or length".into());
                };
                if map.len() >= MAX_FRAGMENTS {
                    return Err(format!("more than {} sparse fragments", MAX_FRAGMENTS));
                }
                map.push((off, len));
            }
            Ok(())
        };
        slots(&b[header::GNU_SPARSE], &mut map).map_err(bad)?;
        let mut more = b[header::GNU_IS_EXTENDED] != 0;
        while more {
            let mut ext = [0u8; BLOCK];
            let got = self
                .fill(&mut ext)
                .map_err(|e| bad(format!("reading a sparse extension block: {e}")))?;
            if got < BLOCK {
                return Err(bad("the tar ends inside a sparse extension block".into()));
            }
            slots(&ext[..header::SPARSE_EXT_ENTRIES * 24], &mut map).map_err(bad)?;
            more = ext[header::SPARSE_EXT_IS_EXTENDED] != 0;
        }
        let real = u64::try_from(real).map_err(|_| bad("a negative sparse real size".into()))?;
        e.data_at = self.pos;
        self.set_sparse(e, map, real)
    }

    /// Reads a PAX sparse file's map (0.0 and 0.1 from the records, 1.0
    /// from the start of the data) and its real name and size.
    pub(super) fn pax_sparse(&mut self, recs: &Records, e: &mut Entry) -> Result<(), TarError> {
        let Some(in_data) = pax_version(recs) else {
            return Ok(());
        };
        let at = e.offset;
        if let Some(name) = pax::get(recs, b"GNU.sparse.name").filter(|n| !n.is_empty()) {
            e.path = name.to_vec();
        }
        let size = pax::get(recs, b"GNU.sparse.size")
            .filter(|v| !v.is_empty())
            .or_else(|| pax::get(recs, b"GNU.sparse.realsize").filter(|v| !v.is_empty()));
        let real = match size {
            Some(v) => pax::int(v)
                .and_then(|n| u64::try_from(n).ok())
                .ok_or_else(|| {
                    err(
                        at,
                        Some(&e.path),
                        format!("GNU sparse size {:?}", String::from_utf8_lossy(v)),
                    )
                })?,
            None => e.stored,
        };
        let map = if in_data {
            let stored = e.stored;
            let (map, used) = {
                let mut d = self.data();
                map_1x0(&mut d, stored)
            }
            .map_err(|w| err(at, Some(&e.path), w))?;
            e.stored -= used;
            e.data_at += used;
            map
        } else {
            let m = map_0x(recs).map_err(|w| err(at, Some(&e.path), w))?;
            if m.len() > MAX_FRAGMENTS {
                return Err(err(
                    at,
                    Some(&e.path),
                    format!("more than {} sparse fragments", MAX_FRAGMENTS),
                ));
            }
            m
        };
        self.set_sparse(e, map, real)
    }

    fn set_sparse(&mut self, e: &mut Entry, map: Vec<Fragment>, real: u64) -> Result<(), TarError> {
        let bad = |why: String| err(e.offset, Some(&e.path), why);
        validate(&map, real).map_err(bad)?;
        let in_map: u64 = map.iter().map(|f| f.1).sum();
        if in_map != e.stored {
            return Err(bad(format!(
                "the sparse map holds {in_map} bytes of data but the entry stores {}",
                e.stored
            )));
        }
        e.size = real;
        e.sparse = Some(map);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expand_fills_holes() {
        let map = [(2, 5), (18, 3)];
        let mut data: &[u8] = b"abcdefgh";
        let mut out = Vec::new();
        Expand::new(&mut data, &map, 25)
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out, b"\0\0abcde\0\0\0\0\0\0\0\0\0\0\0fgh\0\0\0\0");
    }

    #[test]
    fn skip_passes_holes_and_drops_data() {
        let map = [(2, 5), (18, 3), (1 << 60, 2)];
        let mut data: &[u8] = b"abcdefghij";
        let mut e = Expand::new(&mut data, &map, u64::MAX);
        e.skip(4).unwrap();
        let mut b = [0u8; 5];
        e.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"cde\0\0");
        // Exabytes of hole, then into the last fragment: instant.
        e.skip((1 << 60) - 9 + 1).unwrap();
        let mut b = [0u8; 2];
        e.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"j\0");
        let mut short: &[u8] = b"ab";
        assert!(Expand::new(&mut short, &[(0, 5)], 9).skip(9).is_err());
    }

    #[test]
    fn maps_are_checked() {
        assert!(validate(&[(0, 5), (5, 5)], 10).is_ok());
        assert!(validate(&[(0, 5), (4, 5)], 10).is_err());
        assert!(validate(&[(0, 11)], 10).is_err());
        assert!(validate(&[(u64::MAX, 2)], u64::MAX).is_err());
    }

    #[test]
    fn map_1x0_reads_whole_blocks() {
        let mut d = b"2\n0\n5\n4096\n7\n".to_vec();
        d.resize(512, 0);
        d.extend_from_slice(b"DATA");
        let (map, used) = map_1x0(&mut d.as_slice(), d.len() as u64).unwrap();
        assert_eq!(map, vec![(0, 5), (4096, 7)]);
        assert_eq!(used, 512);
        let endless = vec![b'1'; 2048];
        assert!(map_1x0(&mut endless.as_slice(), 2048).is_err());
        assert!(map_1x0(&mut &b"99999999999\n"[..], 512).is_err());
    }
}
