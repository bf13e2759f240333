//! A tar stream as a source, plain, gzip or zstd, read by [`super::tar`]
//! and put into the tree as containerd unpacks a layer (the rules are
//! listed on [`add_tar`]). With `aufs` the AUFS whiteouts become
//! overlayfs's, as `mkfs.erofs --aufs` makes them.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::Path;

use super::tar::{self, Kind};
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

/// Longest path the kernel takes in one system call (`PATH_MAX` less
/// its NUL): no extraction could make a longer one, and it bounds the
/// depth of the tree a tar can ask for.
const PATH_MAX: usize = 4095;

/// A path's components from the root, cleaned as Go's `filepath.Clean`
/// cleans them (`./` prefixes, `.` and duplicate slashes dropped, `..`
/// taken lexically). A path that is absolute or climbs out of the root
/// is refused: containerd would quietly unpack it somewhere else than it
/// says, and GNU tar strips or refuses it, so no two readers agree.
pub(super) fn components(path: &[u8]) -> Result<Vec<&[u8]>, String> {
    if path.first() == Some(&b'/') {
        return Err("an absolute path; a layer's paths are relative to its root".into());
    }
    if path.len() > PATH_MAX {
        return Err(format!(
            "a path of {} bytes; the kernel takes at most {PATH_MAX}",
            path.len()
        ));
    }
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

/// Checks an entry's ACLs as the kernel would take them, and makes its
/// mode and access ACL agree, as unpacking makes them: where the ACL came
/// as tar tools' text, GNU tar and bsdtar set it after the mode, so the
/// ACL gives the permission bits; where it came as a binary xattr (as Go
/// and docker write it), containerd sets the mode after it, and `chmod`
/// rewrites the ACL's owner, mask and others entries. An empty value is
/// no ACL, as `setxattr` takes it.
fn acls(meta: &mut Meta, from_text: bool, kind: Kind) -> Result<(), String> {
    for name in [tar::acl::ACCESS, tar::acl::DEFAULT] {
        let Some(v) = meta.xattrs.get(name) else {
            continue;
        };
        if v.is_empty() {
            meta.xattrs.remove(name);
            continue;
        }
        tar::acl::validate(v).map_err(|why| {
            format!(
                "{}: not a POSIX ACL the kernel takes: {why}",
                String::from_utf8_lossy(name)
            )
        })?;
        if name == tar::acl::DEFAULT && kind != Kind::Dir {
            return Err("a default ACL on something that is not a directory".into());
        }
    }
    if let Some(v) = meta.xattrs.get_mut(tar::acl::ACCESS) {
        if from_text {
            meta.mode = (meta.mode & !0o777) | tar::acl::mode_bits(v);
        } else {
            tar::acl::chmod(v, meta.mode);
        }
        // An access ACL of the owner, group and others entries alone says
        // no more than the mode: the kernel keeps it as the mode only, so
        // no extraction has the xattr (GNU tar writes one beside a
        // directory's default ACL).
        if v.len() == 4 + 3 * 8 {
            meta.xattrs.remove(tar::acl::ACCESS);
        }
    }
    Ok(())
}

/// An id from a tar, which must fit EROFS's 32 bits.
fn id(v: i64, what: &str) -> Result<u32, String> {
    u32::try_from(v).map_err(|_| format!("{what} {v} does not fit 32 bits"))
}

/// Adds every entry of the tar `r` to `b`, as containerd unpacks a layer
/// (which reads it with Go's `archive/tar`, as [`super::tar`] does):
/// - later entries replace earlier ones; a directory over a directory
///   keeps what is in it and takes the new attributes; anything else
///   replaces the whole entry, a subtree included;
/// - a hard link names the file its target is when the link is read, so
///   a later entry that replaces the target leaves the link on the old
///   file;
/// - symlinks among an entry's parents (and a hard link target's) are
///   followed, within the root: an absolute target starts at the root
///   and `..` stops there; the entry's own name is never followed;
/// - parents no entry declared are made 0755 root:root;
/// - paths are cleaned (`./a//b/` is `a/b`); absolute paths, `..` past
///   the root, names over 255 bytes and paths over 4095 are refused.
pub(crate) fn add_tar(b: &mut Builder, r: impl Read) -> Result<(), BuildError> {
    let mut t = tar::Reader::new(r);
    let mut marks = Marks::default();
    // The last entry read, (header offset, path), for errors past it.
    let mut last: Option<(u64, String)> = None;
    loop {
        let e = match t.next_entry() {
            Ok(Some(e)) => e,
            Ok(None) => break,
            Err(err) => return Err(stream_error(err, &last)),
        };
        last = Some((e.offset, String::from_utf8_lossy(&e.path).into_owned()));
        add_entry(b, &mut t, e, &mut marks)?;
    }
    marks.apply(b, last.as_ref().map_or(0, |l| l.0))
}

/// A tar reading error as the build reports it: at an entry where the
/// reader had its path, else after the last entry read.
fn stream_error(err: tar::TarError, last: &Option<(u64, String)>) -> BuildError {
    match (&err.path, last) {
        (Some(p), _) => BuildError::Tar {
            path: String::from_utf8_lossy(p).into_owned(),
            offset: err.offset,
            why: err.why,
        },
        (None, Some((at, name))) => BuildError::Stream {
            offset: err.offset,
            why: format!(
                "at byte {}, after entry {name:?} (header at byte {at}): {}",
                err.offset, err.why
            ),
        },
        (None, None) => BuildError::Stream {
            offset: err.offset,
            why: format!("the first header, at byte {}: {}", err.offset, err.why),
        },
    }
}

/// Directories that hold whiteouts, and opaque ones: marked once every
/// entry is in, so that a later entry for the directory keeps them.
#[derive(Default)]
struct Marks {
    with_whiteouts: Vec<Vec<Vec<u8>>>,
    opaque: Vec<Vec<Vec<u8>>>,
}

impl Marks {
    /// Sets the marks' xattrs; `offset` is the last header's, for errors.
    fn apply(self, b: &mut Builder, offset: u64) -> Result<(), BuildError> {
        for (list, name, value) in [
            (&self.with_whiteouts, OVERLAY_ORIGIN, &b""[..]),
            (&self.opaque, OVERLAY_OPAQUE, &b"y"[..]),
        ] {
            for dir in list {
                let refs: Vec<&[u8]> = dir.iter().map(Vec::as_slice).collect();
                b.dir_xattr(&refs, name, value)
                    .map_err(|why| BuildError::Tar {
                        path: String::from_utf8_lossy(&dir.join(&b'/')).into_owned(),
                        offset,
                        why,
                    })?;
            }
        }
        Ok(())
    }
}

/// Puts one entry into the tree.
fn add_entry<R: Read>(
    b: &mut Builder,
    t: &mut tar::Reader<R>,
    mut e: tar::Entry,
    marks: &mut Marks,
) -> Result<(), BuildError> {
    let shown = String::from_utf8_lossy(&e.path).into_owned();
    let offset = e.offset;
    let bad = |why: String| BuildError::Tar {
        path: shown.clone(),
        offset,
        why,
    };
    let mut meta = Meta {
        mode: e.mode,
        uid: id(e.uid, "uid").map_err(bad)?,
        gid: id(e.gid, "gid").map_err(bad)?,
        mtime: e.mtime,
        nsec: e.nsec,
        xattrs: std::mem::take(&mut e.xattrs),
    };
    acls(&mut meta, e.acl_text, e.kind).map_err(bad)?;
    let given = components(&e.path).map_err(bad)?;
    // The entry's parents with symlinks followed; its own name as given.
    let mut comps: Vec<Vec<u8>> = match given.split_last() {
        Some((name, parents)) => {
            let mut p = b.tree.resolve(parents).map_err(bad)?;
            p.push(name.to_vec());
            p
        }
        None => Vec::new(),
    };
    if b.opts.aufs && aufs_marker(b, &mut comps, &mut meta, marks).map_err(bad)? {
        return Ok(());
    }
    let comps: Vec<&[u8]> = comps.iter().map(Vec::as_slice).collect();
    if comps.is_empty() && e.kind != Kind::Dir {
        return Err(bad(format!(
            "a {} naming the root: the root must be a directory",
            match e.kind {
                Kind::Regular => "file",
                Kind::Symlink => "symlink",
                Kind::HardLink => "hard link",
                Kind::Char | Kind::Block => "device",
                Kind::Fifo => "fifo",
                Kind::Dir => unreachable!(),
            }
        )));
    }
    match e.kind {
        Kind::Regular if b.opts.tar_index => {
            if e.sparse.is_some() {
                return Err(bad("a sparse file: its data is not one run of the tar, \
                     so an index image cannot point at it; use --tar=f"
                    .into()));
            }
            meta.mode |= 0o100000;
            b.add_indexed(&comps, meta, e.data_at, e.size)
                .map_err(bad)?;
        }
        Kind::Regular => {
            meta.mode |= 0o100000;
            let what = || format!("tar entry {shown:?} (header at byte {offset})");
            let mut data = t.data();
            let res = match &e.sparse {
                Some(map) => b.add_sparse(&comps, meta, &mut data, map, e.size, &what),
                None => b.add_file(&comps, meta, &mut data, e.size, &what),
            };
            res.map_err(|err| match err {
                EntryError::Bad(why) => bad(why),
                EntryError::Build(err) => err,
            })?;
        }
        Kind::Dir => {
            meta.mode |= 0o040000;
            b.add(&comps, meta, Body::Dir(Default::default()))
                .map_err(bad)?;
        }
        Kind::Symlink => {
            meta.mode |= 0o120000;
            b.add(&comps, meta, Body::Symlink(e.link.clone()))
                .map_err(bad)?;
        }
        Kind::HardLink => hard_link(b, &comps, &e.link).map_err(bad)?,
        Kind::Char | Kind::Block => {
            meta.mode |= if e.kind == Kind::Char {
                0o020000
            } else {
                0o060000
            };
            // Linux's dev_t: 12 bits of major, 20 of minor.
            let (major, minor) = (e.major, e.minor);
            if !(0..4096).contains(&major) || !(0..1 << 20).contains(&minor) {
                return Err(bad(format!(
                    "device {major}:{minor} is past Linux's 12-bit major and 20-bit minor"
                )));
            }
            b.add(&comps, meta, Body::Device(major as u32, minor as u32))
                .map_err(bad)?;
        }
        Kind::Fifo => {
            meta.mode |= 0o010000;
            b.add(&comps, meta, Body::Special).map_err(bad)?;
        }
    }
    Ok(())
}

/// With `--aufs`: turns an AUFS opaque marker into the xattr on its
/// directory and a `.wh.NAME` into overlayfs's whiteout for NAME. True
/// when the entry was such a marker (and is done with).
fn aufs_marker(
    b: &mut Builder,
    comps: &mut [Vec<u8>],
    meta: &mut Meta,
    marks: &mut Marks,
) -> Result<bool, String> {
    let Some((name, parents)) = comps.split_last() else {
        return Ok(false);
    };
    if name.as_slice() == AUFS_OPAQUE {
        let parents: Vec<&[u8]> = parents.iter().map(Vec::as_slice).collect();
        b.dir_xattr(&parents, OVERLAY_OPAQUE, b"y")?;
        marks
            .opaque
            .push(parents.iter().map(|c| c.to_vec()).collect());
        return Ok(true);
    }
    let Some(target) = name.strip_prefix(AUFS_PREFIX) else {
        return Ok(false);
    };
    if target.is_empty() {
        return Err("a whiteout that names nothing".into());
    }
    let target = target.to_vec();
    let n = comps.len();
    // A whiteout beneath a name this tar made a file hides nothing the
    // file does not already hide (a directory that became a file, as
    // umoci writes it).
    if !b.tree.is_dir_or_missing(&comps[..n - 1]) {
        return Ok(true);
    }
    comps[n - 1] = target;
    let refs: Vec<&[u8]> = comps.iter().map(Vec::as_slice).collect();
    // overlayfs's whiteout: a character device 0:0 with no permission
    // bits, as mkfs.erofs and overlayfs make it.
    meta.mode = 0o020000;
    b.add(&refs, meta.clone(), Body::Device(0, 0))?;
    marks.with_whiteouts.push(comps[..n - 1].to_vec());
    Ok(true)
}

/// Links `comps` to the hard link's target, whose parents' symlinks are
/// followed as an entry's are.
fn hard_link(b: &mut Builder, comps: &[&[u8]], link: &[u8]) -> Result<(), String> {
    if comps.is_empty() {
        return Err("a hard link may not replace the root".into());
    }
    let tc = components(link).map_err(|why| format!("hard link target: {why}"))?;
    let Some((tname, tparents)) = tc.split_last() else {
        return Err("a hard link to the root".into());
    };
    let mut target = b.tree.resolve(tparents)?;
    target.push(tname.to_vec());
    let target: Vec<&[u8]> = target.iter().map(Vec::as_slice).collect();
    b.link(comps, &target)
}
