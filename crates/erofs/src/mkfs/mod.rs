//! Building EROFS images from a directory tree or a tar stream,
//! uncompressed or with LZ4, LZ4HC or Zstd (`compress`): compact inodes wherever the kernel allows, FLAT_PLAIN and
//! FLAT_INLINE (tail packing, off for regular files with
//! `inline_data = false`), directories sorted as the kernel searches them,
//! every file type, hard links, inline and shared xattrs with the name
//! filter, 512- to 4096-byte blocks.
//!
//! File data is written once, in the order it arrives, straight to its
//! place in the image; only metadata is kept in memory (and the tails to
//! inline, in a spill file), so a tar of any size needs the same memory
//! per entry. The image is reproducible: a fixed epoch, a UUID from the
//! content's hash unless one is given, and every structure in byte order
//! of names. It is written to a temporary file beside the target and
//! renamed into place only when complete.
//!
//! The job is split as the image is: the tree in memory (`tree`), data
//! and the spill file (`data`), the metadata layout with directories and
//! inodes (`layout`), xattrs (`xattr`), the superblock (`superblock`), and
//! the two sources, a directory (`source_dir`) and a tar (`source_tar`,
//! read by `tar`); sparse files, from either, are stored by `sparse`.
//! With compression, file data goes through an ordered queue of segments
//! that workers compress; the queue holds a few segments per worker, so
//! memory stays bounded, and everything is written in the order read.

mod compress;
mod data;
mod error;
mod layout;
mod markers;
mod merge;
mod source_dir;
mod source_tar;
mod sparse;
mod superblock;
pub mod tar;
mod tree;
mod xattr;
mod zindex;

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};

pub use compress::{Compression, Compressor, ZSTD_DEFAULT_LEVEL};
pub use error::BuildError;
pub use markers::first_overlay_marker;
pub use merge::MergeLayer;
pub use source_tar::open_tar;

use crate::format::{NAME_LEN_MAX, SUPER_OFFSET, VOLUME_NAME_SIZE};
use data::Writer;
use tree::{Body, Meta, NodeId, Tree};

/// What to build.
#[derive(Clone, Debug)]
pub struct Options {
    /// log2 of the block size: 9 (512 bytes) to 12 (4096), which every
    /// kernel with 4 KiB pages mounts.
    pub blkszbits: u8,
    /// Inline the tails of regular files after their inodes
    /// (`-E noinline_data` turns it off; directories and symlinks are
    /// inlined either way, as mkfs.erofs does).
    pub inline_data: bool,
    /// Every inode's mtime and the image's epoch (`-T`); without it each
    /// entry keeps its own and the epoch is the commonest of them.
    pub time: Option<i64>,
    /// `time` is the epoch (the build time) only: every entry keeps its
    /// own mtime (mkfs.erofs's `--mkfs-time`). Entries whose mtime is not
    /// the epoch then take extended inodes.
    pub time_epoch_only: bool,
    /// The UUID (`-U`); without it one is made from a hash of the image's
    /// content.
    pub uuid: Option<[u8; 16]>,
    /// Every file owned by root (`--all-root`).
    pub all_root: bool,
    /// Turn AUFS whiteouts into overlayfs's (`--aufs`, tar sources only).
    pub aufs: bool,
    /// Make the image durable (`fsync`) before returning.
    pub fsync: bool,
    /// The volume label (at most 15 bytes).
    pub volume: Vec<u8>,
    /// Compress regular files (`-z`, `-C`); `None` for an uncompressed
    /// image.
    pub compression: Option<Compression>,
    /// Threads compressing (`--workers`); 0: one per CPU. The image is the
    /// same whatever the number.
    pub workers: usize,
    /// Full lcluster indexes, 8 bytes a block, rather than compact ones
    /// (`-E legacy-compress`).
    pub legacy_compress: bool,
    /// An index image of a tar (`--tar=i`): metadata only, each regular
    /// file's data left in the tar, which is the image's extra device
    /// (`-o device=TAR`, or the tar appended to the image). Blocks are
    /// the tar's 512 bytes; nothing is compressed.
    pub tar_index: bool,
    /// A merge copies every byte of its layers' files into the image,
    /// which then needs no layer to be read (mkfs.erofs's
    /// `--clean=data`); without it, files point into their layers.
    pub merge_copy: bool,
    /// How a merge opens its layer images: a layer in remote storage is
    /// read through the disk cache and within the timeouts these say.
    pub layer_open: foliofs_block::OpenOptions,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            blkszbits: 12,
            inline_data: true,
            time: None,
            time_epoch_only: false,
            uuid: None,
            all_root: false,
            aufs: false,
            fsync: false,
            volume: Vec::new(),
            compression: None,
            workers: 0,
            legacy_compress: false,
            tar_index: false,
            merge_copy: false,
            layer_open: foliofs_block::OpenOptions::default(),
        }
    }
}

/// What was built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Summary {
    /// Bytes of the image.
    pub image_size: u64,
    /// Inodes written.
    pub inodes: u64,
    /// Bytes of regular file data stored.
    pub data_bytes: u64,
    /// The UUID written.
    pub uuid: [u8; 16],
    /// Of a merged image: bytes of its layers' files copied into it,
    /// where no chunk could point at them (inline tails, compressed data).
    pub copied_bytes: u64,
    /// The directories no entry declared (paths joined by `/`, the root
    /// empty), which a merge of this image as a layer keeps as the layers
    /// below have them.
    pub implied_dirs: Vec<Vec<u8>>,
}

/// An image under construction: entries go in through a source, then
/// [`Builder::finish`] writes the metadata and renames the image into
/// place. Dropped unfinished, it leaves nothing behind.
pub struct Builder {
    opts: Options,
    tree: Tree,
    w: Writer,
    tmp: tempfile::TempPath,
    image: PathBuf,
    data_bytes: u64,
    /// Bytes copied out of layers, for a merged image.
    copied_bytes: u64,
    /// Segments read but not yet written, oldest first, and the workers
    /// compressing them, when compressing.
    queue: Option<compress::Queue>,
    /// Compressed files being written, by the slot their segments name.
    zfiles: Vec<compress::ZFile>,
    /// The extra devices a merged image points into.
    devices: Vec<superblock::Device>,
}

impl Builder {
    /// Starts an image to be renamed to `image` when finished.
    pub fn new(image: &Path, opts: Options) -> Result<Builder, BuildError> {
        Builder::with_devices(image, opts, Vec::new())
    }

    /// Starts an image whose files may point into `devices`, device id 1
    /// on.
    pub(crate) fn with_devices(
        image: &Path,
        opts: Options,
        devices: Vec<superblock::Device>,
    ) -> Result<Builder, BuildError> {
        if !(9..=12).contains(&opts.blkszbits) {
            return Err(BuildError::Option(format!(
                "block size {}: must be 512, 1024, 2048 or 4096 bytes",
                1u64 << opts.blkszbits.min(63)
            )));
        }
        if opts.volume.len() >= VOLUME_NAME_SIZE {
            return Err(BuildError::Option(format!(
                "volume label is {} bytes; at most {} fit",
                opts.volume.len(),
                VOLUME_NAME_SIZE - 1
            )));
        }
        if opts.tar_index && opts.blkszbits != 9 {
            return Err(BuildError::Option(format!(
                "-b {}: --tar=i uses the tar's 512-byte blocks",
                1u64 << opts.blkszbits
            )));
        }
        if opts.tar_index && opts.compression.is_some() {
            return Err(BuildError::Option(
                "--tar=i: an index image leaves the data in the tar, so -z has nothing to compress"
                    .into(),
            ));
        }
        let dir = match image.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        let name = image
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = tempfile::Builder::new()
            .prefix(&format!(".{name}."))
            .tempfile_in(dir)
            .map_err(BuildError::io(format!(
                "creating an image in {}",
                dir.display()
            )))?;
        let (file, tmp) = tmp.into_parts();
        let blksz = 1u64 << opts.blkszbits;
        let w = Writer::new(
            file,
            blksz,
            superblock::first_free_block(blksz, devices.len()),
        )
        .map_err(BuildError::io("writing the image"))?;
        let queue = match opts.compression {
            None => None,
            Some(c) => {
                c.check(blksz).map_err(BuildError::Option)?;
                let workers = match opts.workers {
                    0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
                    n => n,
                };
                Some(compress::Queue::new(c, blksz as usize, workers).map_err(BuildError::Option)?)
            }
        };
        let implicit = Meta {
            mode: 0o040755,
            uid: 0,
            gid: 0,
            mtime: opts.time.unwrap_or(0),
            nsec: 0,
            xattrs: BTreeMap::new(),
        };
        Ok(Builder {
            opts,
            tree: Tree::new(implicit),
            w,
            tmp,
            image: image.to_owned(),
            data_bytes: 0,
            copied_bytes: 0,
            queue,
            zfiles: Vec::new(),
            devices,
        })
    }

    /// Applies `-T` and `--all-root` to an entry's attributes, and checks
    /// its xattrs can be stored.
    fn meta(&self, mut m: Meta) -> Result<Meta, String> {
        if let (Some(t), false) = (self.opts.time, self.opts.time_epoch_only) {
            m.mtime = t;
            m.nsec = 0;
        }
        if self.opts.all_root {
            m.uid = 0;
            m.gid = 0;
        }
        for (n, v) in &m.xattrs {
            xattr::check(n, v)?;
        }
        Ok(m)
    }

    /// The room a regular file's tail may take after its inode (judged at
    /// the extended size and with every xattr inline), if tails are
    /// inlined at all.
    fn tail_room(&self, m: &Meta) -> Option<u64> {
        let used = crate::format::MAX_INODE_SIZE as u64 + xattr::inline_size(&m.xattrs);
        (self.opts.inline_data).then(|| (1u64 << self.opts.blkszbits).saturating_sub(used))
    }

    /// Checks a path's components against the format's limits.
    fn check_names(comps: &[&[u8]]) -> Result<(), String> {
        for c in comps {
            if c.len() > NAME_LEN_MAX {
                return Err(format!(
                    "a name of {} bytes; at most {NAME_LEN_MAX} fit",
                    c.len()
                ));
            }
        }
        Ok(())
    }

    /// Adds a regular file whose `size` bytes `r` yields.
    pub(crate) fn add_file(
        &mut self,
        comps: &[&[u8]],
        meta: Meta,
        r: &mut dyn Read,
        size: u64,
        what: &dyn Fn() -> String,
    ) -> Result<NodeId, EntryError> {
        Self::check_names(comps).map_err(EntryError::Bad)?;
        let meta = self.meta(meta).map_err(EntryError::Bad)?;
        let limit = u64::from(u32::MAX) << self.opts.blkszbits;
        let used = self.w.next_block << self.opts.blkszbits;
        if size > limit.saturating_sub(used) {
            return Err(EntryError::Bad(format!(
                "{size} bytes do not fit an image of 2^32 {}-byte blocks",
                1u64 << self.opts.blkszbits
            )));
        }
        let room = self.tail_room(&meta);
        if self.queue.is_some() {
            return self.add_compressed(comps, meta, r, size, room, what);
        }
        let d = self
            .w
            .file(r, size, room, what)
            .map_err(EntryError::Build)?;
        self.data_bytes += size;
        self.tree
            .insert(comps, meta, Body::File(d))
            .map_err(EntryError::Bad)
    }

    /// Adds a regular file of an index image, whose `size` bytes are at
    /// byte `at` of the tar.
    pub(crate) fn add_indexed(
        &mut self,
        comps: &[&[u8]],
        meta: Meta,
        at: u64,
        size: u64,
    ) -> Result<NodeId, String> {
        Self::check_names(comps)?;
        let meta = self.meta(meta)?;
        if !at.is_multiple_of(512) {
            return Err(format!("data at byte {at}, not on a 512-byte block"));
        }
        if (at + size).div_ceil(512) > u64::from(u32::MAX) {
            return Err(format!(
                "data ends at byte {}, past what 32-bit block addresses reach",
                at + size
            ));
        }
        self.data_bytes += size;
        self.tree
            .insert(comps, meta, Body::File(data::FileData::in_tar(size, at)))
    }

    /// Adds any other entry (`comps` empty: the root, which must be a
    /// directory).
    pub(crate) fn add(&mut self, comps: &[&[u8]], meta: Meta, body: Body) -> Result<(), String> {
        Self::check_names(comps)?;
        let meta = self.meta(meta)?;
        if let Body::Symlink(t) = &body {
            if t.len() >= 1 << self.opts.blkszbits.max(12) {
                return Err(format!(
                    "a symlink target of {} bytes; at most 4095 fit",
                    t.len()
                ));
            }
        }
        if comps.is_empty() {
            if !matches!(body, Body::Dir(_)) {
                return Err("the root must be a directory".into());
            }
            self.tree.set_root(meta);
            return Ok(());
        }
        self.tree.insert(comps, meta, body).map(|_| ())
    }

    /// Adds a hard link at `comps` to the entry at `target`.
    pub(crate) fn link(&mut self, comps: &[&[u8]], target: &[&[u8]]) -> Result<(), String> {
        Self::check_names(comps)?;
        let t = self.tree.lookup(target).ok_or_else(|| {
            format!(
                "hard link to {:?}, which no earlier entry made",
                String::from_utf8_lossy(&target.join(&b'/'))
            )
        })?;
        self.tree.link(comps, t)
    }

    /// Sets an xattr on the directory at `comps` (made if missing).
    pub(crate) fn dir_xattr(
        &mut self,
        comps: &[&[u8]],
        name: &[u8],
        value: &[u8],
    ) -> Result<(), String> {
        Self::check_names(comps)?;
        let d = self.tree.dir(comps)?;
        self.tree.nodes[d]
            .meta
            .xattrs
            .insert(name.to_vec(), value.to_vec());
        Ok(())
    }

    /// The epoch: `-T`, else the commonest mtime (ties to the earliest),
    /// so that as many inodes as possible are compact.
    fn epoch(&self) -> (i64, u32) {
        if let Some(t) = self.opts.time {
            return (t, 0);
        }
        let mut count: HashMap<(i64, u32), u64> = HashMap::new();
        for n in &self.tree.nodes {
            if n.meta.mtime >= 0 {
                *count.entry((n.meta.mtime, n.meta.nsec)).or_default() += 1;
            }
        }
        count
            .into_iter()
            .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(&a.0)))
            .map_or((0, 0), |(t, _)| t)
    }

    /// Writes the metadata and the superblock, and renames the image into
    /// place. `tar_bytes` is the length of the tar an index image's data
    /// is in.
    fn finish_with(mut self, tar_bytes: Option<u64>) -> Result<Summary, BuildError> {
        self.drain()?;
        // Stops the workers.
        self.queue = None;
        let implied_dirs = self.tree.implied_dirs();
        let (epoch, nsec) = self.epoch();
        let compression = self.opts.compression;
        let blksz = self.w.blksz;
        let placed = layout::write(
            &self.tree,
            &mut self.w,
            &layout::Params {
                epoch,
                nsec,
                zindex: zindex::Shape {
                    blkszbits: self.opts.blkszbits,
                    big: compression.is_some_and(|c| u64::from(c.pcluster) > blksz),
                    algorithm: compression
                        .map_or(crate::format::Algorithm::Lz4, |c| c.compressor.on_disk()),
                    compact: !self.opts.legacy_compress,
                },
            },
        )?;
        let uuid = self.opts.uuid.unwrap_or_else(|| {
            let mut u = self.w.digest().to_le_bytes();
            // An RFC 9562 version 8 (vendor-defined) UUID.
            u[6] = (u[6] & 0x0f) | 0x80;
            u[8] = (u[8] & 0x3f) | 0x80;
            u
        });
        let blocks = self.w.next_block;
        let sb = superblock::encode(&superblock::Fields {
            blkszbits: self.opts.blkszbits,
            root_nid: placed.root_nid,
            inos: placed.inos,
            epoch,
            nsec,
            blocks,
            meta_blkaddr: placed.meta_blkaddr,
            xattr_blkaddr: placed.xattr_blkaddr,
            uuid,
            volume: self.opts.volume.clone(),
            xattr_filter: placed.xattr_filter,
            devices: match tar_bytes {
                // The tar's 512-byte blocks, mapped right after the image
                // so that the tar may also be appended to it.
                Some(b) => vec![superblock::Device {
                    tag: Vec::new(),
                    blocks: b.div_ceil(512),
                    uniaddr: blocks,
                }],
                None => self.devices.clone(),
            },
            compression: placed.compressed.then(|| superblock::Compr {
                max_pclusterblks: compression
                    .map_or(1, |c| (u64::from(c.pcluster) >> self.opts.blkszbits) as u8),
                zstd_window_log: compression.and_then(|c| c.zstd_window_log()),
            }),
        });
        let file = self.w.into_image();
        let wio = BuildError::io("writing the image");
        file.write_all_at(&sb, SUPER_OFFSET).map_err(wio)?;
        let image_size = blocks << self.opts.blkszbits;
        file.set_len(image_size)
            .map_err(BuildError::io("writing the image"))?;
        file.set_permissions(std::fs::Permissions::from_mode(0o644))
            .map_err(BuildError::io("writing the image"))?;
        if self.opts.fsync {
            file.sync_all()
                .map_err(BuildError::io("syncing the image"))?;
        }
        drop(file);
        self.tmp.persist(&self.image).map_err(|e| {
            BuildError::io(format!("renaming to {}", self.image.display()))(e.error)
        })?;
        if self.opts.fsync {
            let dir = match self.image.parent() {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => Path::new("."),
            };
            std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(BuildError::io(format!("syncing {}", dir.display())))?;
        }
        Ok(Summary {
            image_size,
            inodes: placed.inos,
            data_bytes: self.data_bytes,
            uuid,
            copied_bytes: self.copied_bytes,
            implied_dirs,
        })
    }

    /// Writes the metadata and the superblock, and renames the image into
    /// place.
    pub fn finish(self) -> Result<Summary, BuildError> {
        self.finish_with(None)
    }

    /// Builds an image of the directory tree at `src`.
    pub fn build_dir(src: &Path, image: &Path, opts: Options) -> Result<Summary, BuildError> {
        if opts.tar_index {
            return Err(BuildError::Option(format!(
                "--tar=i: {} is a directory; an index image is made of a tar",
                src.display()
            )));
        }
        let mut b = Builder::new(image, opts)?;
        source_dir::add_tree(&mut b, src)?;
        b.finish()
    }

    /// Builds an image of the tar stream `r` (plain, gzip or zstd; plain
    /// only for an index image, whose data stays in it).
    pub fn build_tar(r: impl Read, image: &Path, opts: Options) -> Result<Summary, BuildError> {
        let mut b = Builder::new(image, opts)?;
        if !b.opts.tar_index {
            source_tar::add_tar(&mut b, r)?;
            return b.finish();
        }
        let mut counted = source_tar::Counted::new(r);
        source_tar::add_tar(&mut b, &mut counted)?;
        // The device is the whole tar, its end-of-archive blocks and
        // padding included, as a file holding it has them.
        let tar_bytes = counted.rest().map_err(|e| BuildError::Stream {
            offset: counted.bytes,
            why: format!("reading past the tar's last entry: {e}"),
        })?;
        b.finish_with(Some(tar_bytes))
    }
}

fn truncated(what: &dyn Fn() -> String, size: u64, got: u64) -> BuildError {
    BuildError::Io {
        what: what(),
        source: std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!("truncated: {size} bytes of data expected, {got} found"),
        ),
    }
}

/// What went wrong with one entry: its own fault, or the build's.
pub(crate) enum EntryError {
    Bad(String),
    Build(BuildError),
}

#[cfg(test)]
mod tests;
