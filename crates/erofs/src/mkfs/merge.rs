//! Layer images stacked into one tree, as overlayfs shows a stack of
//! lower directories and as the OCI image spec applies layers: each
//! layer, lowest first, is walked into the tree; a whiteout (a character
//! device 0:0, or a `.wh.NAME` in a layer built without `--aufs`) takes
//! the name away from what is below, an opaque directory
//! (`trusted.overlay.opaque=y`, or one holding `.wh..wh..opq`) hides all
//! that is below it, anything but a directory replaces the whole entry
//! below, and directories merge with the upper one's attributes. The
//! markers are applied and left out, as overlayfs hides them.
//!
//! File data stays in the layers: a merged regular file is chunk-based,
//! its chunk indexes pointing into its layer, which is an extra device of
//! the merged image (its tag the layer's UUID, as mkfs.erofs's rebuild
//! mode writes it). Only what a layer keeps where no chunk can point
//! (an inline tail, compressed data, a layer's own extra devices) is
//! copied, and counted.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Read;
use std::path::{Path, PathBuf};

use foliofs_vfs::{FileType, Scratch};
use zerocopy::IntoBytes;

use super::data::FileData;
use super::superblock::Device;
use super::tree::{Body, Meta, NodeId, ROOT};
use super::{BuildError, Builder, EntryError, Options, Summary};
use crate::data::Phys;
use crate::format::{erofs_inode_chunk_index, CHUNK_FORMAT_BLKBITS_MASK, NULL_ADDR};
use crate::inode::Inode;
use crate::Erofs;

const OVERLAY_PREFIX: &[u8] = b"trusted.overlay.";
/// overlayfs's escape for a `trusted.overlay.*` xattr that is the
/// layer's own content.
const ESCAPED_PREFIX: &[u8] = b"trusted.overlay.overlay.";
pub(super) const OPAQUE: &[u8] = b"trusted.overlay.opaque";
pub(super) const AUFS_PREFIX: &[u8] = b".wh.";
pub(super) const AUFS_OPAQUE: &[u8] = b".wh..wh..opq";

/// Most extra devices the format's device table counts.
pub const MAX_LAYERS: usize = u16::MAX as usize - 1;

/// Most chunks a merged file is cut into (8 bytes of index each).
const MAX_CHUNKS: u64 = 1 << 22;

/// A layer of a merge: an image, and the directories in it that its tar
/// implied rather than declared ([`Summary::implied_dirs`] of its build;
/// empty for an image of unknown origin, whose directories then all
/// count as declared).
#[derive(Clone, Debug, Default)]
pub struct MergeLayer {
    /// The layer image.
    pub path: PathBuf,
    /// Paths joined by `/`, the root empty.
    pub implied: HashSet<Vec<u8>>,
}

impl From<PathBuf> for MergeLayer {
    fn from(path: PathBuf) -> Self {
        MergeLayer {
            path,
            implied: HashSet::new(),
        }
    }
}

/// A layer image opened for the merge.
struct Layer {
    path: PathBuf,
    implied: HashSet<Vec<u8>>,
    fs: Erofs,
    /// Its device id in the merged image.
    dev: u16,
    /// Inodes of this layer already in the tree, for hard links.
    linked: HashMap<u64, NodeId>,
}

/// Where a stretch of a file's bytes is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Src {
    /// A hole: zeros, nowhere.
    Hole,
    /// Blocks of the layer, from this one on.
    Blocks(u64),
    /// Only readable through the layer's reader: copied.
    Copy,
}

impl Builder {
    /// Builds one image of the layer images `layers`, lowest first.
    pub fn build_merge(
        layers: &[MergeLayer],
        image: &Path,
        opts: Options,
    ) -> Result<Summary, BuildError> {
        if opts.compression.is_some() {
            return Err(BuildError::Option(
                "--merge: -z: a merged image's files point into their layers, \
                 so there is nothing to compress"
                    .into(),
            ));
        }
        if opts.tar_index {
            return Err(BuildError::Option(
                "--merge: --tar=i: the sources are layer images, not a tar".into(),
            ));
        }
        if layers.is_empty() {
            return Err(BuildError::Option("--merge: no layer given".into()));
        }
        if layers.len() > MAX_LAYERS {
            return Err(BuildError::Option(format!(
                "--merge: {} layers; an EROFS image has at most {MAX_LAYERS} extra devices",
                layers.len()
            )));
        }
        // Opened a few at once: a layer in a registry costs requests to
        // open (its chunk index, its tree, its superblock), which need not
        // wait for one another. Each thread takes the next layer as soon
        // as it is done with one, so one slow layer holds up no group.
        let next = std::sync::atomic::AtomicUsize::new(0);
        let slots: Vec<std::sync::Mutex<Option<_>>> =
            layers.iter().map(|_| std::sync::Mutex::new(None)).collect();
        std::thread::scope(|s| {
            for _ in 0..OPEN_AT_ONCE.min(layers.len()) {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(l) = layers.get(i) else { return };
                    let r = open_layer(&l.path, i, &opts);
                    *slots[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
                });
            }
        });
        let results = slots.into_iter().map(|m| {
            m.into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .expect("every layer was opened")
        });
        let mut opened = Vec::with_capacity(layers.len());
        let mut devices = Vec::with_capacity(layers.len());
        for (l, r) in layers.iter().zip(results) {
            let (mut layer, device) = r?;
            layer.implied = l.implied.clone();
            opened.push(layer);
            devices.push(device);
        }
        if opts.merge_copy {
            // Self-contained: no file points into a layer.
            devices.clear();
        }
        let mut b = Builder::with_devices(image, opts, devices)?;
        for layer in &mut opened {
            b.add_layer(layer)?;
        }
        b.finish()
    }

    /// Stacks one layer onto the tree.
    fn add_layer(&mut self, layer: &mut Layer) -> Result<(), BuildError> {
        let root = layer.fs.superblock().root_nid;
        // (the layer's directory, its path)
        let mut todo: Vec<(u64, Vec<Vec<u8>>)> = vec![(root, Vec::new())];
        // Each directory once: a damaged layer that lists a directory in
        // itself would otherwise be walked for ever.
        let mut seen = HashSet::new();
        while let Some((nid, comps)) = todo.pop() {
            let shown = shown(&comps);
            let path = layer.path.clone();
            if !seen.insert(nid) {
                return Err(layer_error(
                    &path,
                    &shown,
                    format!("directory nid {nid} is listed twice (a loop in a damaged image)"),
                ));
            }
            let bad = |e: foliofs_vfs::Error| layer_error(&path, &shown, e.to_string());
            let inode = layer.fs.inode(nid).map_err(bad)?;
            let entries = entries(&layer.fs, &inode).map_err(bad)?;
            let (meta, opaque) = self.layer_meta(layer, &inode).map_err(bad)?;
            let opaque = opaque || entries.iter().any(|(n, _)| n.as_slice() == AUFS_OPAQUE);
            let implied = layer.implied.contains(&comps.join(&b'/'));
            let dir = self
                .merged_dir(&comps, meta, opaque, implied)
                .map_err(|why| layer_error(&path, &shown, why))?;
            for (name, child) in entries {
                let mut at_path = comps.clone();
                at_path.push(name.clone());
                let shown = shown_child(&comps, &name);
                let at = |why: String| layer_error(&path, &shown, why);
                if name.as_slice() == AUFS_OPAQUE {
                    continue;
                }
                if let Some(target) = name.strip_prefix(AUFS_PREFIX) {
                    self.tree.remove(dir, target);
                    continue;
                }
                let ci = layer.fs.inode(child).map_err(|e| at(e.to_string()))?;
                let rdev = ci.rdev();
                if ci.kind == FileType::CharDevice && rdev.major == 0 && rdev.minor == 0 {
                    self.tree.remove(dir, &name);
                    continue;
                }
                if ci.kind == FileType::Directory {
                    todo.push((child, at_path));
                    continue;
                }
                if let Err(e) = self.add_layer_entry(layer, &ci, &at_path) {
                    return Err(match e {
                        EntryError::Bad(why) => at(why),
                        EntryError::Build(e) => e,
                    });
                }
            }
        }
        Ok(())
    }

    /// The merged directory at `comps` for a layer's directory: made (in
    /// place of whatever was there) or merged with the one below, whose
    /// entries an opaque one drops. It takes `meta`, unless its layer only
    /// implied it and there is a directory below, whose attributes it
    /// keeps (as OCI's changesets and `umoci unpack` have it).
    fn merged_dir(
        &mut self,
        comps: &[Vec<u8>],
        meta: Meta,
        opaque: bool,
        implied: bool,
    ) -> Result<NodeId, String> {
        let refs: Vec<&[u8]> = comps.iter().map(Vec::as_slice).collect();
        let below = self
            .tree
            .lookup(&refs)
            .filter(|&n| matches!(self.tree.nodes[n].body, Body::Dir(_)));
        let n = match below {
            Some(n) if implied => n,
            _ if refs.is_empty() => {
                let meta = self.meta(meta)?;
                self.tree.set_root(meta);
                ROOT
            }
            _ => {
                let meta = self.meta(meta)?;
                self.tree.insert(&refs, meta, Body::Dir(BTreeMap::new()))?
            }
        };
        if opaque {
            self.tree.clear(n);
        }
        Ok(n)
    }

    /// Adds a layer's non-directory at `path`: a hard link to what this
    /// layer already put in, or a new entry replacing what is below.
    fn add_layer_entry(
        &mut self,
        layer: &mut Layer,
        inode: &Inode,
        path: &[Vec<u8>],
    ) -> Result<(), EntryError> {
        let refs: Vec<&[u8]> = path.iter().map(Vec::as_slice).collect();
        if let Some(&node) = layer.linked.get(&inode.nid) {
            return self.tree.link(&refs, node).map_err(EntryError::Bad);
        }
        let bad = |e: foliofs_vfs::Error| EntryError::Bad(e.to_string());
        let (meta, _) = self.layer_meta(layer, inode).map_err(bad)?;
        let meta = self.meta(meta).map_err(EntryError::Bad)?;
        let fs = &layer.fs;
        let node = match inode.kind {
            FileType::RegularFile => {
                let data = self.layer_file(layer, inode, &meta)?;
                self.data_bytes += inode.size;
                self.tree
                    .insert(&refs, meta, Body::File(data))
                    .map_err(EntryError::Bad)?
            }
            FileType::Symlink => {
                let target = fs.read_to_vec(inode, 0, inode.size as usize).map_err(bad)?;
                self.tree
                    .insert(&refs, meta, Body::Symlink(target))
                    .map_err(EntryError::Bad)?
            }
            FileType::CharDevice | FileType::BlockDevice => {
                let r = inode.rdev();
                self.tree
                    .insert(&refs, meta, Body::Device(r.major, r.minor))
                    .map_err(EntryError::Bad)?
            }
            _ => self
                .tree
                .insert(&refs, meta, Body::Special)
                .map_err(EntryError::Bad)?,
        };
        if inode.nlink > 1 {
            layer.linked.insert(inode.nid, node);
        }
        Ok(())
    }

    /// A layer inode's attributes with the overlay markers left out, and
    /// whether it is an opaque directory.
    fn layer_meta(&self, layer: &Layer, inode: &Inode) -> foliofs_vfs::Result<(Meta, bool)> {
        let mut xattrs = BTreeMap::new();
        let mut opaque = false;
        for x in layer.fs.xattrs(inode)? {
            let value = layer.fs.xattr_value(&x)?;
            if let Some(rest) = x.name.strip_prefix(ESCAPED_PREFIX) {
                let mut name = OVERLAY_PREFIX.to_vec();
                name.extend_from_slice(rest);
                xattrs.insert(name, value);
            } else if x.name.as_slice() == OPAQUE {
                opaque = value.as_slice() == b"y";
            } else if !x.name.starts_with(OVERLAY_PREFIX) {
                xattrs.insert(x.name, value);
            }
        }
        let meta = Meta {
            mode: u32::from(inode.mode),
            uid: inode.uid,
            gid: inode.gid,
            mtime: inode.mtime.sec,
            nsec: inode.mtime.nsec,
            xattrs,
        };
        Ok((meta, opaque && inode.kind == FileType::Directory))
    }

    /// Where a layer file's data is for the merged image: chunk indexes
    /// into the layer's blocks, with what no chunk can point at copied;
    /// or, when nothing can be pointed at, a plain copy.
    fn layer_file(
        &mut self,
        layer: &Layer,
        inode: &Inode,
        meta: &Meta,
    ) -> Result<FileData, EntryError> {
        let what = || format!("{}: nid {}", layer.path.display(), inode.nid);
        let bad = |e: foliofs_vfs::Error| EntryError::Bad(e.to_string());
        let size = inode.size;
        let segs = if self.opts.merge_copy {
            vec![(0, size, Src::Copy)]
        } else {
            segments(&layer.fs, inode, self.w.blksz).map_err(bad)?
        };
        if !segs.iter().any(|s| matches!(s.2, Src::Blocks(_))) {
            // Nothing to point at (compressed, inline, empty, or all
            // holes): the file's bytes, copied.
            let room = self.tail_room(meta);
            let mut r = LayerReader::new(&layer.fs, inode);
            let d = self
                .w
                .file(&mut r, size, room, &what)
                .map_err(EntryError::Build)?;
            if segs.iter().any(|s| s.2 == Src::Copy) {
                self.copied_bytes += size;
            }
            return Ok(d);
        }
        let bits = chunkbits(&segs, size, self.opts.blkszbits);
        let chunk = 1u64 << bits;
        let count = size.div_ceil(chunk);
        if count > MAX_CHUNKS {
            return Err(EntryError::Bad(format!(
                "{size} bytes in {count} pieces: more than {MAX_CHUNKS} chunks"
            )));
        }
        let blksz = self.w.blksz;
        let mut indexes = Vec::with_capacity(count as usize * 8);
        let mut seg = 0;
        for i in 0..count {
            let start = i * chunk;
            while segs[seg].1 <= start {
                seg += 1;
            }
            let (from, _, src) = segs[seg];
            let (device, blk) = match src {
                Src::Hole => (0, u64::from(NULL_ADDR)),
                Src::Blocks(b) => (layer.dev, b + (start - from) / blksz),
                Src::Copy => {
                    let end = (start + chunk).min(size);
                    let bytes = layer
                        .fs
                        .read_to_vec(inode, start, (end - start) as usize)
                        .map_err(bad)?;
                    self.copied_bytes += bytes.len() as u64;
                    let at = self
                        .w
                        .blocks(&bytes)
                        .map_err(|e| EntryError::Build(BuildError::io("writing the image")(e)))?;
                    (0, at)
                }
            };
            if blk > u64::from(u32::MAX) && blk != u64::from(NULL_ADDR) {
                return Err(EntryError::Bad(format!(
                    "block {blk}: past what 32-bit block addresses reach"
                )));
            }
            let index = erofs_inode_chunk_index {
                startblk_hi: 0.into(),
                device_id: device.into(),
                startblk_lo: (blk as u32).into(),
            };
            indexes.extend_from_slice(index.as_bytes());
        }
        let off = self
            .w
            .spill_indexes(&indexes)
            .map_err(|e| EntryError::Build(BuildError::io("writing the spill file")(e)))?;
        Ok(FileData {
            indexes: Some((bits, off, count as u32)),
            ..FileData::placed_later(size)
        })
    }
}

/// Opens layer `i` of a merge, and its slot in the device table.
/// Layers opened at once.
const OPEN_AT_ONCE: usize = 8;
/// The most of a layer's metadata read ahead as it is opened.
const METADATA_AHEAD: u64 = 4 << 20;

fn open_layer(path: &Path, i: usize, opts: &Options) -> Result<(Layer, Device), BuildError> {
    let blkszbits = opts.blkszbits;
    let fs = Erofs::open(path, &opts.layer_open, &[]).map_err(|e| {
        layer_error(
            path,
            "",
            format!("not a layer image this merge can use: {e}"),
        )
    })?;
    let sb = fs.superblock();
    // The walk reads every inode and directory: read ahead from where the
    // inodes start (to the end, where this builder puts them), so that a
    // layer in a registry comes in a few large requests rather than one
    // per block as the walk meets them.
    let meta = u64::from(sb.meta_blkaddr) << sb.blkszbits;
    let end = fs.block_dev().size();
    if meta < end {
        fs.block_dev()
            .store()
            .will_need(meta, (end - meta).min(METADATA_AHEAD));
    }
    if sb.blkszbits != blkszbits {
        return Err(layer_error(
            path,
            "",
            format!(
                "{}-byte blocks; the merged image has {}-byte blocks (give -b {})",
                1u64 << sb.blkszbits,
                1u64 << blkszbits,
                1u64 << sb.blkszbits
            ),
        ));
    }
    if !fs.device_slots().is_empty() {
        return Err(layer_error(
            path,
            "",
            "has extra devices of its own; merge the layers it is made of instead".into(),
        ));
    }
    // The store's size, not the file's: a layer may be a remote object.
    let size = fs.block_dev().size();
    let tag: Vec<u8> = sb
        .uuid
        .iter()
        .flat_map(|b| format!("{b:02x}").into_bytes())
        .collect();
    let device = Device {
        tag,
        blocks: size.div_ceil(1 << blkszbits),
        // Not mapped into the unified block space: every chunk names its
        // device, and the merged image's own blocks must not fall in a
        // layer's range.
        uniaddr: 0,
    };
    let layer = Layer {
        path: path.to_owned(),
        implied: HashSet::new(),
        fs,
        dev: (i + 1) as u16,
        linked: HashMap::new(),
    };
    Ok((layer, device))
}

pub(super) fn layer_error(path: &Path, entry: &str, why: String) -> BuildError {
    BuildError::Source {
        path: if entry.is_empty() {
            path.to_owned()
        } else {
            PathBuf::from(format!("{}:{entry}", path.display()))
        },
        why,
    }
}

pub(super) fn shown(comps: &[Vec<u8>]) -> String {
    let mut s = String::from("/");
    s.push_str(&String::from_utf8_lossy(&comps.join(&b'/')));
    s
}

pub(super) fn shown_child(comps: &[Vec<u8>], name: &[u8]) -> String {
    let mut s = shown(comps);
    if !comps.is_empty() {
        s.push('/');
    }
    s.push_str(&String::from_utf8_lossy(name));
    s
}

/// A directory's entries, "." and ".." left out: (name, nid).
pub(super) fn entries(fs: &Erofs, dir: &Inode) -> foliofs_vfs::Result<Vec<(Vec<u8>, u64)>> {
    let bs = u64::from(fs.superblock().block_size());
    let mut out = Vec::new();
    for b in 0..dir.size.div_ceil(bs) {
        fs.with_dir_block(dir, b, |blk| {
            for i in 0..blk.len() {
                let e = blk.get(i);
                if e.name != b"." && e.name != b".." {
                    out.push((e.name.to_vec(), e.nid));
                }
            }
            Ok(())
        })?;
    }
    Ok(out)
}

/// A file's bytes as stretches: (start, end, where), in order, covering
/// the file. Compressed files are one stretch to copy.
fn segments(fs: &Erofs, inode: &Inode, blksz: u64) -> foliofs_vfs::Result<Vec<(u64, u64, Src)>> {
    let size = inode.size;
    if inode.layout.is_compressed() {
        return Ok(vec![(0, size, Src::Copy)]);
    }
    let mut segs: Vec<(u64, u64, Src)> = Vec::new();
    let mut pos = 0;
    while pos < size {
        let run = fs.map_flat(inode, pos, size)?;
        let end = (run.la + run.len).min(size);
        if run.la > pos || end <= pos {
            return Ok(vec![(0, size, Src::Copy)]);
        }
        let src = match run.phys {
            Phys::Hole => Src::Hole,
            Phys::At(0, p) => {
                let p = p + (pos - run.la);
                if p % blksz == 0 && pos % blksz == 0 {
                    Src::Blocks(p / blksz)
                } else {
                    Src::Copy
                }
            }
            _ => Src::Copy,
        };
        match segs.last_mut() {
            Some(last) if last.2 == Src::Copy && src == Src::Copy => last.1 = end,
            Some(last) if last.2 == Src::Hole && src == Src::Hole => last.1 = end,
            Some(last) if matches!((last.2, src), (Src::Blocks(a), Src::Blocks(b)) if a + (last.1 - last.0) / blksz == b && (last.1 - last.0) % blksz == 0) => {
                last.1 = end
            }
            _ => segs.push((pos, end, src)),
        }
        pos = end;
    }
    // A stretch that ends inside a block, short of the file's end, cannot
    // be cut into chunks: the whole file is copied.
    if segs.iter().any(|s| s.1 < size && s.1 % blksz != 0) {
        return Ok(vec![(0, size, Src::Copy)]);
    }
    Ok(segs)
}

/// log2 of the chunk size for a file of these stretches: the largest
/// that lets every chunk lie within one stretch (the whole file in one
/// chunk when it is one stretch), as far as the format's 5 bits of chunk
/// size above the block allow.
fn chunkbits(segs: &[(u64, u64, Src)], size: u64, blkszbits: u8) -> u8 {
    let max = blkszbits + CHUNK_FORMAT_BLKBITS_MASK as u8;
    let mut bits = (64 - size.saturating_sub(1).leading_zeros()) as u8;
    for s in segs.iter().filter(|s| s.1 < size) {
        bits = bits.min(s.1.trailing_zeros() as u8);
    }
    bits.clamp(blkszbits, max)
}

/// A layer file's bytes through the layer's reader.
struct LayerReader<'a> {
    fs: &'a Erofs,
    inode: &'a Inode,
    pos: u64,
    scratch: Scratch,
}

impl<'a> LayerReader<'a> {
    fn new(fs: &'a Erofs, inode: &'a Inode) -> Self {
        LayerReader {
            fs,
            inode,
            pos: 0,
            scratch: Scratch::new(),
        }
    }
}

impl Read for LayerReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.inode.size.saturating_sub(self.pos);
        let want = (buf.len() as u64).min(left).min(1 << 20) as u32;
        if want == 0 {
            return Ok(0);
        }
        let got = self
            .fs
            .read_inode(self.inode, self.pos, want, &mut self.scratch)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        buf[..got.len()].copy_from_slice(got);
        self.pos += got.len() as u64;
        Ok(got.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testimage::{TestImage, ROOT};

    #[test]
    fn a_layer_that_lists_a_directory_in_itself_is_refused_not_walked_for_ever() {
        let mut t = TestImage::new(0, 0);
        t.root(&[("loop", ROOT, 2)]);
        let dir = tempfile::tempdir().unwrap();
        let layer = dir.path().join("layer.erofs");
        std::fs::write(&layer, &t.bytes).unwrap();
        let img = dir.path().join("merged.erofs");
        let err = Builder::build_merge(&[MergeLayer::from(layer)], &img, Options::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("listed twice"), "{err}");
        assert!(!img.exists());
    }

    #[test]
    fn one_stretch_is_one_chunk_and_cuts_set_the_chunk_size() {
        // 10,000 bytes in one stretch: one chunk of 16 KiB.
        assert_eq!(chunkbits(&[(0, 10_000, Src::Blocks(3))], 10_000, 12), 14);
        // A tail after three blocks: chunks of one block, so the tail's
        // is its own.
        let segs = [(0, 12_288, Src::Blocks(3)), (12_288, 13_000, Src::Copy)];
        assert_eq!(chunkbits(&segs, 13_000, 12), 12);
        // A cut at 8 KiB: 8 KiB chunks.
        let segs = [(0, 8192, Src::Hole), (8192, 16_384, Src::Blocks(9))];
        assert_eq!(chunkbits(&segs, 16_384, 12), 13);
        // Never below a block, never above what 5 bits of chunk size say.
        assert_eq!(chunkbits(&[(0, 100, Src::Blocks(1))], 100, 12), 12);
        assert_eq!(
            chunkbits(&[(0, 1 << 50, Src::Blocks(1))], 1 << 50, 12),
            12 + 31
        );
    }
}
