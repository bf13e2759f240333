//! A tar stream as a source: ustar, GNU (long names and links, sparse
//! files) and PAX (path, linkpath, size, uid, gid through the `tar`
//! crate; mtime with nanoseconds, `SCHILY.xattr.*` and
//! `LIBARCHIVE.xattr.*` here), plain, gzip or zstd. Later entries replace
//! earlier ones, parents nobody declared are made, and with `aufs` the
//! AUFS whiteouts become overlayfs's, as `mkfs.erofs --aufs` makes them.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;

use base64::Engine;
use tar::EntryType;

use super::tree::{Body, Meta};
use super::{BuildError, Builder, EntryError};

const AUFS_PREFIX: &[u8] = b".wh.";
const AUFS_OPAQUE: &[u8] = b".wh..wh..opq";
const OVERLAY_OPAQUE: &[u8] = b"trusted.overlay.opaque";
/// Set on a directory holding whiteouts, as mkfs.erofs does, so that
/// overlayfs does not list such a directory straight from this layer.
const OVERLAY_ORIGIN: &[u8] = b"trusted.overlay.origin";

/// Opens a tar file, or standard input for `-`, decompressing gzip or
/// zstd as its first bytes say; with `plain`, refusing them (an index
/// image points into the tar's own bytes).
pub fn open_tar(path: &Path, plain: bool) -> io::Result<Box<dyn Read>> {
    let raw: Box<dyn Read> = if path == Path::new("-") {
        Box::new(io::stdin())
    } else {
        Box::new(File::open(path)?)
    };
    let mut r = BufReader::with_capacity(1 << 20, raw);
    let head = r.fill_buf()?;
    let compressed = [&[0x1f, 0x8b][..], &[0x28, 0xb5, 0x2f, 0xfd]]
        .iter()
        .any(|m| head.starts_with(m));
    if plain && compressed {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the tar is compressed; an index image points into the tar's own bytes, \
             so give it the tar uncompressed",
        ));
    }
    Ok(if head.starts_with(&[0x1f, 0x8b]) {
        Box::new(flate2::read::MultiGzDecoder::new(r))
    } else if head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        Box::new(zstd::stream::read::Decoder::with_buffer(r)?)
    } else {
        Box::new(r)
    })
}

/// A path's components from the root, resolving "." and ".." lexically;
/// a path that climbs out of the root is refused.
pub(super) fn components(path: &[u8]) -> Result<Vec<&[u8]>, String> {
    let mut out: Vec<&[u8]> = Vec::new();
    for c in path.split(|&b| b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => {
                if out.pop().is_none() {
                    return Err("the path climbs out of the root (\"..\")".into());
                }
            }
            c => out.push(c),
        }
    }
    Ok(out)
}

/// A PAX time, `[-]SECONDS[.FRACTION]`, as seconds and nanoseconds.
pub(super) fn pax_time(v: &[u8]) -> Option<(i64, u32)> {
    let s = std::str::from_utf8(v).ok()?;
    let (neg, s) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s),
    };
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    if int.is_empty() || !int.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let sec: i64 = int.parse().ok()?;
    let mut digits: String = frac.chars().take(9).collect();
    while digits.len() < 9 {
        digits.push('0');
    }
    let nsec: u32 = digits.parse().ok()?;
    Some(match (neg, nsec) {
        (false, n) => (sec, n),
        (true, 0) => (-sec, 0),
        (true, n) => (-sec - 1, 1_000_000_000 - n),
    })
}

/// A stream that counts the bytes read from it.
pub(crate) struct Counted<R> {
    inner: R,
    pub bytes: u64,
}

impl<R: Read> Counted<R> {
    pub fn new(inner: R) -> Self {
        Counted { inner, bytes: 0 }
    }

    /// Reads to the end: the stream's whole length.
    pub fn rest(&mut self) -> io::Result<u64> {
        io::copy(self, &mut io::sink())?;
        Ok(self.bytes)
    }
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bytes += n as u64;
        Ok(n)
    }
}

/// Adds every entry of the tar `r` to `b`.
pub(crate) fn add_tar(b: &mut Builder, r: impl Read) -> Result<(), BuildError> {
    let mut ar = tar::Archive::new(r);
    let entries = ar.entries().map_err(|e| BuildError::Stream {
        offset: 0,
        why: e.to_string(),
    })?;
    let mut last: Option<(u64, String)> = None;
    // Directories that hold whiteouts, and opaque ones: marked once every
    // entry is in, so that a later entry for the directory keeps them.
    let mut with_whiteouts: Vec<Vec<Vec<u8>>> = Vec::new();
    let mut opaque: Vec<Vec<Vec<u8>>> = Vec::new();
    for e in entries {
        let mut e = e.map_err(|err| BuildError::Stream {
            offset: last.as_ref().map_or(0, |l| l.0),
            why: match &last {
                Some((at, name)) => {
                    format!("the header after entry {name:?} (at byte {at}): {err}")
                }
                None => format!("the first header: {err}"),
            },
        })?;
        let offset = e.raw_header_position();
        let raw_path = e.path_bytes().into_owned();
        let shown = String::from_utf8_lossy(&raw_path).into_owned();
        last = Some((offset, shown.clone()));
        let bad = |why: String| BuildError::Tar {
            path: shown.clone(),
            offset,
            why,
        };
        let kind = e.header().entry_type();
        if kind.is_pax_global_extensions() {
            continue;
        }
        let h = e.header();
        let mut meta = Meta {
            mode: h.mode().map_err(|err| bad(format!("mode: {err}")))? & 0o7777,
            uid: u32::try_from(h.uid().map_err(|err| bad(format!("uid: {err}")))?)
                .map_err(|_| bad("uid past 32 bits".into()))?,
            gid: u32::try_from(h.gid().map_err(|err| bad(format!("gid: {err}")))?)
                .map_err(|_| bad("gid past 32 bits".into()))?,
            mtime: h.mtime().map_err(|err| bad(format!("mtime: {err}")))? as i64,
            nsec: 0,
            xattrs: BTreeMap::new(),
        };
        let (major, minor) = (
            h.device_major().ok().flatten().unwrap_or(0),
            h.device_minor().ok().flatten().unwrap_or(0),
        );
        let link = e.link_name_bytes().map(|l| l.into_owned());
        if let Some(pax) = e
            .pax_extensions()
            .map_err(|err| bad(format!("PAX header: {err}")))?
        {
            for ext in pax {
                let ext = ext.map_err(|err| bad(format!("PAX header: {err}")))?;
                let (k, v) = (ext.key_bytes(), ext.value_bytes());
                if k == b"mtime" {
                    (meta.mtime, meta.nsec) = pax_time(v).ok_or_else(|| {
                        bad(format!("PAX mtime {:?}", String::from_utf8_lossy(v)))
                    })?;
                } else if let Some(name) = k.strip_prefix(b"SCHILY.xattr.") {
                    meta.xattrs.insert(name.to_vec(), v.to_vec());
                } else if let Some(name) = k.strip_prefix(b"LIBARCHIVE.xattr.") {
                    let name: Vec<u8> = percent_encoding::percent_decode(name).collect();
                    let value = base64::engine::general_purpose::STANDARD_NO_PAD
                        .decode(
                            v.strip_suffix(b"=")
                                .unwrap_or(v)
                                .strip_suffix(b"=")
                                .unwrap_or(v),
                        )
                        .map_err(|err| bad(format!("LIBARCHIVE.xattr value: {err}")))?;
                    meta.xattrs.insert(name, value);
                } else if k.starts_with(b"GNU.sparse.") {
                    return Err(bad("PAX sparse files (GNU format 0.x/1.0) are not read; \
                         write the tar with --format=gnu"
                        .into()));
                }
            }
        }
        let mut comps = components(&raw_path).map_err(bad)?;
        if b.opts.aufs {
            if let Some((&name, parents)) = comps.split_last() {
                if name == AUFS_OPAQUE {
                    b.dir_xattr(parents, OVERLAY_OPAQUE, b"y").map_err(bad)?;
                    opaque.push(parents.iter().map(|c| c.to_vec()).collect());
                    continue;
                }
                if let Some(target) = name.strip_prefix(AUFS_PREFIX) {
                    if target.is_empty() {
                        return Err(bad("a whiteout that names nothing".into()));
                    }
                    let n = comps.len();
                    comps[n - 1] = target;
                    // overlayfs's whiteout: a character device 0:0 with no
                    // permission bits, as mkfs.erofs and overlayfs make it.
                    meta.mode = 0o020000;
                    b.add(&comps, meta, Body::Device(0, 0)).map_err(bad)?;
                    with_whiteouts.push(comps[..n - 1].iter().map(|c| c.to_vec()).collect());
                    continue;
                }
            }
        }
        let target = || -> Result<Vec<u8>, BuildError> {
            link.clone()
                .ok_or_else(|| bad("a link entry without a target".into()))
        };
        match kind {
            EntryType::GNUSparse if b.opts.tar_index => {
                return Err(bad("a sparse file: its data is not one run of the tar, \
                     so an index image cannot point at it; use --tar=f"
                    .into()));
            }
            EntryType::Regular | EntryType::Continuous if b.opts.tar_index => {
                meta.mode |= 0o100000;
                b.add_indexed(&comps, meta, e.raw_file_position(), e.size())
                    .map_err(bad)?;
            }
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => {
                meta.mode |= 0o100000;
                let size = e.size();
                let what = || format!("tar entry {shown:?} (header at byte {offset})");
                b.add_file(&comps, meta, &mut e, size, &what)
                    .map_err(|err| match err {
                        EntryError::Bad(why) => bad(why),
                        EntryError::Build(err) => err,
                    })?;
            }
            EntryType::Directory => {
                meta.mode |= 0o040000;
                b.add(&comps, meta, Body::Dir(Default::default()))
                    .map_err(bad)?;
            }
            EntryType::Symlink => {
                meta.mode |= 0o120000;
                b.add(&comps, meta, Body::Symlink(target()?)).map_err(bad)?;
            }
            EntryType::Link => {
                let t = target()?;
                let tc = components(&t).map_err(bad)?;
                if comps.is_empty() {
                    return Err(bad("a hard link may not replace the root".into()));
                }
                b.link(&comps, &tc).map_err(bad)?;
            }
            EntryType::Char | EntryType::Block => {
                meta.mode |= if kind == EntryType::Char {
                    0o020000
                } else {
                    0o060000
                };
                b.add(&comps, meta, Body::Device(major, minor))
                    .map_err(bad)?;
            }
            EntryType::Fifo => {
                meta.mode |= 0o010000;
                b.add(&comps, meta, Body::Special).map_err(bad)?;
            }
            other => {
                return Err(bad(format!(
                    "entry type {:?} is not one EROFS stores",
                    other.as_byte() as char
                )))
            }
        }
    }
    for (list, name, value) in [
        (&with_whiteouts, OVERLAY_ORIGIN, &b""[..]),
        (&opaque, OVERLAY_OPAQUE, &b"y"[..]),
    ] {
        for dir in list {
            let refs: Vec<&[u8]> = dir.iter().map(Vec::as_slice).collect();
            b.dir_xattr(&refs, name, value)
                .map_err(|why| BuildError::Tar {
                    path: String::from_utf8_lossy(&dir.join(&b'/')).into_owned(),
                    offset: last.as_ref().map_or(0, |l| l.0),
                    why,
                })?;
        }
    }
    Ok(())
}
