//! Read EROFS images: the superblock, compact and extended inodes, flat,
//! inline, chunk-based and LZ4-compressed data, directories, symlinks,
//! device nodes and extended attributes, served through
//! [`foliofs_vfs::FileSystem`].
//!
//! Inode numbers are EROFS nids, as the kernel reports them in `st_ino`.
//! Every structure is bounds-checked where it is read: a damaged image gives
//! [`Error::Corrupt`] naming the offset and what was wrong, for the file that
//! touches the damage, and never a panic or an allocation the image could not
//! back.

pub mod chunk;
pub mod decompress;
pub mod dirent;
pub mod extent;
pub mod fsck;
pub mod inode;
pub mod superblock;
pub mod xattr;
pub mod zmap;

use std::cell::RefCell;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use foliofs_block::{BlockDev, BlockSizeChoice, OpenOptions, MAX_BLOCK_SIZE, MIN_BLOCK_SIZE};
use foliofs_vfs::{
    Attr, DirEntry, Error, FileSystem, FileType, FsInfo, Ino, Result, Scratch, StatFs,
};

use chunk::{ChunkEntry, ChunkFormat};
use dirent::{DirBlock, DIRENT_SIZE};
pub use extent::Extent;
pub use fsck::FsckReport;
pub use inode::{Inode, Layout};
use superblock::{DeviceSlot, Superblock, DEVT_SLOT_SIZE, SUPER_OFFSET, SUPER_SIZE};
use xattr::LongPrefix;
use zmap::{ZExtent, ZInfo};

/// Longest name EROFS stores.
pub const NAME_MAX: u32 = 255;
/// Longest symlink target read (the kernel's `PATH_MAX` less the NUL).
const SYMLINK_MAX: u64 = 4095;
/// Decompressed extents kept for sequential readers.
const ZCACHE_ENTRIES: usize = 32;
/// Directory blocks whose entries' inodes one READDIRPLUS prefetches (at
/// 4 KiB blocks, some ten thousand entries).
const PREFETCH_DIR_BLOCKS: u64 = 64;

/// An extra device: its table slot and, unless it lives inside the primary
/// image (a flat layout), the opened device.
#[derive(Debug)]
struct ExtraDevice {
    slot: DeviceSlot,
    dev: Option<BlockDev>,
}

/// Where a run of file bytes lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phys {
    Hole,
    /// Device index (0 = primary) and byte position.
    At(usize, u64),
}

/// A run of uncompressed file data starting at logical offset `la`.
#[derive(Clone, Copy, Debug)]
struct Run {
    la: u64,
    len: u64,
    phys: Phys,
}

thread_local! {
    /// Buffer for pieces of a read that spans several runs or extents.
    static PIECE: RefCell<Scratch> = RefCell::new(Scratch::new());
    /// Buffer for directory blocks.
    static DIRBUF: RefCell<Scratch> = RefCell::new(Scratch::new());
}

/// Runs `f` with a thread-local scratch, or a fresh one if that one is busy
/// (a nested call).
fn with_scratch<R>(
    key: &'static std::thread::LocalKey<RefCell<Scratch>>,
    f: impl FnOnce(&mut Scratch) -> R,
) -> R {
    key.with(|cell| match cell.try_borrow_mut() {
        Ok(mut s) => f(&mut s),
        Err(_) => f(&mut Scratch::new()),
    })
}

/// A decompressed extent: owning nid, logical start, bytes.
type CachedExtent = (u64, u64, Arc<Vec<u8>>);

/// An open EROFS image.
#[derive(Debug)]
pub struct Erofs {
    dev: BlockDev,
    sb: Superblock,
    devices: Vec<ExtraDevice>,
    device_id_mask: u16,
    prefixes: Vec<LongPrefix>,
    /// Recently decompressed extents: (nid, logical start, bytes).
    zcache: Mutex<Vec<CachedExtent>>,
    path: PathBuf,
}

impl Erofs {
    /// Opens the EROFS image at `path`; `devices` are the extra devices
    /// (blob files) the image's device table names, in order.
    pub fn open(path: &Path, opts: &OpenOptions, devices: &[PathBuf]) -> Result<Erofs> {
        let probe_opts = OpenOptions {
            block_size: BlockSizeChoice::Fixed(4096),
            io_mode: opts.io_mode,
            cache_bytes: 1 << 20,
        };
        let probe = BlockDev::open(path, &probe_opts, 4096)?;
        let mut raw = [0u8; SUPER_SIZE];
        probe
            .read_exact(SUPER_OFFSET, &mut raw)
            .map_err(|e| match e {
                Error::Corrupt { .. } => Error::corrupt(
                    SUPER_OFFSET,
                    format!(
                        "{}: {} bytes is too small for an EROFS image",
                        path.display(),
                        probe.size()
                    ),
                ),
                other => other,
            })?;
        let sb = Superblock::parse(&raw)?;
        // The cache's blocks follow the image's, but never below what the
        // block layer or direct I/O can do.
        let default_bs = sb
            .block_size()
            .max(probe.store().dio_align())
            .clamp(MIN_BLOCK_SIZE, MAX_BLOCK_SIZE);
        drop(probe);
        let dev = BlockDev::open(path, opts, default_bs)?;
        let mut fs = Erofs {
            dev,
            sb,
            devices: Vec::new(),
            device_id_mask: 0,
            prefixes: Vec::new(),
            zcache: Mutex::new(Vec::new()),
            path: path.to_owned(),
        };
        fs.check_superblock()?;
        fs.open_devices(opts, devices)?;
        fs.prefixes = fs.load_prefixes()?;
        let root = fs.inode(fs.sb.root_nid)?;
        if root.kind != FileType::Directory {
            return Err(Error::corrupt(
                root.pos,
                format!("root nid {} is not a directory", root.nid),
            ));
        }
        Ok(fs)
    }

    /// The parsed superblock.
    pub fn superblock(&self) -> &Superblock {
        &self.sb
    }

    /// The image path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The primary device.
    pub fn block_dev(&self) -> &BlockDev {
        &self.dev
    }

    /// The device table slots (empty without extra devices).
    pub fn device_slots(&self) -> Vec<DeviceSlot> {
        self.devices.iter().map(|d| d.slot.clone()).collect()
    }

    fn check_superblock(&self) -> Result<()> {
        if self.sb.has_compat(superblock::COMPAT_SB_CHKSUM) {
            let mut block = vec![0u8; superblock::checksum_len(&self.sb)];
            self.meta(SUPER_OFFSET, &mut block)?;
            superblock::verify_checksum(&self.sb, &block)?;
        }
        if self.sb.has_incompat(superblock::INCOMPAT_COMPR_CFGS) {
            let algs = self.sb.available_algorithms();
            let mut pos = SUPER_OFFSET + self.sb.size();
            for alg in 0..16u8 {
                if algs & (1 << alg) == 0 {
                    continue;
                }
                if alg != superblock::ALG_LZ4 {
                    return Err(Error::Unsupported(format!(
                        "EROFS image uses {} compression",
                        superblock::algorithm_name(alg)
                    )));
                }
                pos = pos.div_ceil(4) * 4;
                let mut len = [0u8; 2];
                self.meta(pos, &mut len)?;
                let len = u64::from(u16::from_le_bytes(len));
                if len < 14 {
                    return Err(Error::corrupt(
                        pos,
                        format!("LZ4 configuration record of {len} bytes (expected 14)"),
                    ));
                }
                self.dev.check_range(pos + 2, len)?;
                pos += 2 + len;
            }
        }
        Ok(())
    }

    fn open_devices(&mut self, opts: &OpenOptions, paths: &[PathBuf]) -> Result<()> {
        // As the kernel does, the device count means nothing without the
        // device table feature.
        let n = if self.sb.has_incompat(superblock::INCOMPAT_DEVICE_TABLE) {
            usize::from(self.sb.extra_devices)
        } else {
            0
        };
        if n == 0 {
            if !paths.is_empty() {
                return Err(Error::Unsupported(format!(
                    "{}: {} extra device(s) given but the image has no device table",
                    self.path.display(),
                    paths.len()
                )));
            }
            return Ok(());
        }
        let base = u64::from(self.sb.devt_slotoff) * DEVT_SLOT_SIZE;
        let mut slots = Vec::with_capacity(n);
        for i in 0..n as u64 {
            let mut raw = [0u8; DEVT_SLOT_SIZE as usize];
            self.meta(base + i * DEVT_SLOT_SIZE, &mut raw)?;
            slots.push(DeviceSlot::parse(&raw));
        }
        self.device_id_mask = ((n + 1).next_power_of_two() - 1) as u16;
        let flat = paths.is_empty();
        if flat {
            if let Some(s) = slots.iter().find(|s| s.mapped_blkaddr == 0) {
                return Err(Error::Unsupported(format!(
                    "{}: the image keeps data on {n} extra device(s) (first: \"{}\"); \
                     pass each with -o device=PATH",
                    self.path.display(),
                    String::from_utf8_lossy(&s.tag)
                )));
            }
        } else if paths.len() != n {
            return Err(Error::Unsupported(format!(
                "{}: the image has {n} extra device(s) but {} were given",
                self.path.display(),
                paths.len()
            )));
        }
        let dev_opts = OpenOptions {
            block_size: BlockSizeChoice::Fixed(self.dev.block_size()),
            ..opts.clone()
        };
        for (i, slot) in slots.into_iter().enumerate() {
            let dev = if flat {
                None
            } else {
                Some(BlockDev::open(&paths[i], &dev_opts, self.dev.block_size())?)
            };
            self.devices.push(ExtraDevice { slot, dev });
        }
        Ok(())
    }

    /// Reads metadata bytes from the primary image.
    pub(crate) fn meta(&self, pos: u64, buf: &mut [u8]) -> Result<()> {
        self.dev.read_exact(pos, buf)
    }

    /// Parses inode `nid`.
    pub fn inode(&self, nid: u64) -> Result<Inode> {
        let pos = Inode::position(&self.sb, nid)
            .ok_or_else(|| Error::corrupt(0, format!("nid {nid} overflows the address space")))?;
        let mut raw = [0u8; inode::MAX_INODE_SIZE];
        self.dev.check_range(pos, 32).map_err(|_| {
            Error::corrupt(
                pos,
                format!(
                    "inode {nid} lies beyond the end of the {}-byte image",
                    self.dev.size()
                ),
            )
        })?;
        self.meta(pos, &mut raw[..32])?;
        if Inode::is_extended(&raw) {
            self.meta(pos + 32, &mut raw[32..])?;
        }
        Inode::parse(&self.sb, nid, pos, &raw)
    }

    fn attr(&self, inode: &Inode) -> Attr {
        let bs = u64::from(self.sb.block_size());
        let blocks = if inode.layout.is_compressed() {
            u64::from(inode.i_u) << (self.sb.blkszbits - 9)
        } else {
            (inode.size.div_ceil(bs) * bs) >> 9
        };
        Attr {
            ino: inode.nid,
            size: inode.size,
            blocks,
            kind: inode.kind,
            perm: inode.perm(),
            nlink: inode.nlink,
            uid: inode.uid,
            gid: inode.gid,
            rdev: inode.rdev(),
            atime: inode.mtime,
            mtime: inode.mtime,
            ctime: inode.mtime,
            blksize: self.sb.block_size(),
        }
    }

    /// Resolves (device id, byte position) to an opened device and position.
    fn resolve(&self, device_id: u16, pos: u64, at: u64) -> Result<(usize, u64)> {
        let bs_bits = self.sb.blkszbits;
        if device_id == 0 {
            // A block address may fall into an extra device's mapped range.
            let blk = pos >> bs_bits;
            for (i, d) in self.devices.iter().enumerate() {
                let start = u64::from(d.slot.mapped_blkaddr);
                if d.dev.is_some()
                    && start != 0
                    && blk >= start
                    && blk < start + u64::from(d.slot.blocks)
                {
                    return Ok((i + 1, pos - (start << bs_bits)));
                }
            }
            return Ok((0, pos));
        }
        let d = self
            .devices
            .get(usize::from(device_id) - 1)
            .ok_or_else(|| {
                Error::corrupt(
                    at,
                    format!("chunk names device {device_id} of {}", self.devices.len()),
                )
            })?;
        match d.dev {
            Some(_) => Ok((usize::from(device_id), pos)),
            None => Ok((0, pos + (u64::from(d.slot.mapped_blkaddr) << bs_bits))),
        }
    }

    fn device(&self, i: usize) -> &BlockDev {
        if i == 0 {
            &self.dev
        } else {
            self.devices[i - 1]
                .dev
                .as_ref()
                .expect("resolved to an opened device")
        }
    }

    /// Maps offset `ofs` (< size) of an uncompressed inode to the run holding
    /// it, extended over physically adjacent chunks up to `want_end`.
    fn map_flat(&self, inode: &Inode, ofs: u64, want_end: u64) -> Result<Run> {
        let bs = u64::from(self.sb.block_size());
        let blk_pos = |inode: &Inode| {
            u64::from(inode.i_u)
                .checked_mul(bs)
                .ok_or_else(|| Error::corrupt(inode.pos, "block address overflows"))
        };
        match inode.layout {
            Layout::FlatPlain => Ok(Run {
                la: 0,
                len: inode.size,
                phys: Phys::At(0, blk_pos(inode)?),
            }),
            Layout::FlatInline => {
                let tail = (inode.size.div_ceil(bs).saturating_sub(1)) * bs;
                if ofs < tail {
                    return Ok(Run {
                        la: 0,
                        len: tail,
                        phys: Phys::At(0, blk_pos(inode)?),
                    });
                }
                let pos = inode.trailer_pos();
                let len = inode.size - tail;
                if pos % bs + len > bs {
                    return Err(Error::corrupt(
                        pos,
                        format!(
                            "inode {}: {len}-byte inline tail crosses a block boundary",
                            inode.nid
                        ),
                    ));
                }
                Ok(Run {
                    la: tail,
                    len,
                    phys: Phys::At(0, pos),
                })
            }
            Layout::ChunkBased => {
                let fmt = ChunkFormat::of(inode, self.sb.blkszbits)?;
                let table_end = fmt.entry_pos(inode, fmt.count(inode.size));
                if table_end.is_none_or(|end| end > self.dev.size()) {
                    return Err(Error::corrupt(
                        inode.pos,
                        format!(
                            "inode {}: the chunk table for {} bytes runs past the image end",
                            inode.nid, inode.size
                        ),
                    ));
                }
                let csize = 1u64 << fmt.chunkbits;
                let first = ofs >> fmt.chunkbits;
                let (mut run, mut phys_end) = self.chunk_run(inode, &fmt, first)?;
                let mut n = first + 1;
                while run.la + run.len < want_end.min(inode.size) {
                    let (next, next_end) = self.chunk_run(inode, &fmt, n)?;
                    let adjacent = match (run.phys, next.phys) {
                        (Phys::Hole, Phys::Hole) => true,
                        (Phys::At(d, _), Phys::At(e, p)) => d == e && phys_end == p,
                        _ => false,
                    };
                    if !adjacent || run.len % csize != 0 {
                        break;
                    }
                    run.len += next.len;
                    phys_end = next_end;
                    n += 1;
                }
                Ok(run)
            }
            Layout::CompressedFull | Layout::CompressedCompact => {
                unreachable!("compressed inodes are read through zmap")
            }
        }
    }

    /// Chunk `n` as a run, and the physical position just past it.
    fn chunk_run(&self, inode: &Inode, fmt: &ChunkFormat, n: u64) -> Result<(Run, u64)> {
        let la = n << fmt.chunkbits;
        let len = (1u64 << fmt.chunkbits).min(inode.size - la);
        let pos = fmt
            .entry_pos(inode, n)
            .ok_or_else(|| Error::corrupt(inode.pos, "chunk table position overflows"))?;
        let mut raw = [0u8; 8];
        let raw = &mut raw[..fmt.entry_size() as usize];
        self.meta(pos, raw)?;
        let e = ChunkEntry::parse(raw, self.device_id_mask);
        if e.is_hole() {
            return Ok((
                Run {
                    la,
                    len,
                    phys: Phys::Hole,
                },
                0,
            ));
        }
        let bytes = u64::from(e.blkaddr) << self.sb.blkszbits;
        let (dev, p) = self.resolve(e.device_id, bytes, pos)?;
        Ok((
            Run {
                la,
                len,
                phys: Phys::At(dev, p),
            },
            p + len,
        ))
    }

    /// Reads `len` bytes at `pos` of device `dev`, all or an error.
    fn read_phys<'a>(
        &self,
        dev: usize,
        pos: u64,
        len: usize,
        scratch: &'a mut Scratch,
    ) -> Result<&'a [u8]> {
        let d = self.device(dev);
        let got = d.read(pos, len, scratch)?;
        if got.len() != len {
            return Err(Error::corrupt(
                pos,
                format!(
                    "{len} data bytes at {pos:#x} run past the end of {} ({} bytes)",
                    d.store().path().display(),
                    d.size()
                ),
            ));
        }
        Ok(got)
    }

    /// Reads file data of `inode` at `offset`, up to `size` bytes.
    pub fn read_inode<'a>(
        &self,
        inode: &Inode,
        offset: u64,
        size: u32,
        scratch: &'a mut Scratch,
    ) -> Result<&'a [u8]> {
        if offset >= inode.size || size == 0 {
            return Ok(&[]);
        }
        let end = inode.size.min(offset + u64::from(size));
        let total = (end - offset) as usize;
        if inode.layout.is_compressed() {
            let z = self.zinfo(inode)?;
            let (ext, data) = self.extent_data(inode, &z, offset)?;
            if ext.la + ext.llen >= end {
                let within = (offset - ext.la) as usize;
                return Ok(&scratch.hold(data)[within..within + total]);
            }
            let out = scratch.get(total);
            let mut pos = offset;
            let (mut ext, mut data) = (ext, data);
            loop {
                let from = (pos - ext.la) as usize;
                let n = ((ext.la + ext.llen).min(end) - pos) as usize;
                let at = (pos - offset) as usize;
                out[at..at + n].copy_from_slice(&data[from..from + n]);
                pos += n as u64;
                // Extents wholly inside the request decode straight into the
                // reply; only the one running past its end is kept for the
                // next request.
                while pos < end && self.cached_extent(inode.nid, pos).is_none() {
                    let next = self.map_extent(inode, &z, pos)?;
                    if next.la != pos || next.la + next.llen > end {
                        break;
                    }
                    let at = (pos - offset) as usize;
                    let span = &mut out[at..at + next.llen as usize];
                    if self.decode_extent(inode, &next, span).is_err() {
                        // A stream longer than its extent needs room beyond
                        // it: the cached path below has that room.
                        break;
                    }
                    pos += next.llen;
                }
                if pos >= end {
                    break;
                }
                (ext, data) = self.extent_data(inode, &z, pos)?;
                if ext.la > pos || ext.la + ext.llen <= pos {
                    return Err(Error::corrupt(
                        inode.pos,
                        format!("inode {}: extents do not cover offset {pos}", inode.nid),
                    ));
                }
            }
            return Ok(out);
        }
        let run = self.map_flat(inode, offset, end)?;
        if run.la + run.len >= end {
            let within = offset - run.la;
            return match run.phys {
                Phys::At(dev, p) => self.read_phys(dev, p + within, total, scratch),
                Phys::Hole => {
                    let out = scratch.get(total);
                    out.fill(0);
                    Ok(out)
                }
            };
        }
        let out = scratch.get(total);
        let mut pos = offset;
        let mut run = run;
        loop {
            let n = ((run.la + run.len).min(end) - pos) as usize;
            let at = (pos - offset) as usize;
            match run.phys {
                Phys::Hole => out[at..at + n].fill(0),
                Phys::At(dev, p) => with_scratch(&PIECE, |piece| -> Result<()> {
                    let got = self.read_phys(dev, p + (pos - run.la), n, piece)?;
                    out[at..at + n].copy_from_slice(got);
                    Ok(())
                })?,
            }
            pos += n as u64;
            if pos >= end {
                break;
            }
            run = self.map_flat(inode, pos, end)?;
            if run.la > pos || run.la + run.len <= pos {
                return Err(Error::corrupt(
                    inode.pos,
                    format!("inode {}: data runs do not cover offset {pos}", inode.nid),
                ));
            }
        }
        Ok(out)
    }

    /// Reads up to `len` bytes at `offset` of `inode` into a new vector.
    pub fn read_to_vec(&self, inode: &Inode, offset: u64, len: usize) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        let mut scratch = Scratch::new();
        let end = inode.size.min(offset.saturating_add(len as u64));
        let mut pos = offset;
        while pos < end {
            let want = (end - pos).min(1 << 20) as u32;
            let got = self.read_inode(inode, pos, want, &mut scratch)?;
            if got.is_empty() {
                break;
            }
            out.extend_from_slice(got);
            pos += got.len() as u64;
        }
        Ok(out)
    }

    /// The decompressed extent holding `ofs`, from the cache or decoded now.
    fn extent_data(&self, inode: &Inode, z: &ZInfo, ofs: u64) -> Result<(ZExtent, Arc<Vec<u8>>)> {
        if let Some(hit) = self.cached_extent(inode.nid, ofs) {
            return Ok(hit);
        }
        let ext = self.map_extent(inode, z, ofs)?;
        let mut data = vec![0u8; ext.llen as usize + (1usize << z.lclusterbits)];
        self.decode_extent(inode, &ext, &mut data)?;
        data.truncate(ext.llen as usize);
        let data = Arc::new(data);
        let mut cache = self.zcache.lock().unwrap_or_else(|e| e.into_inner());
        if cache.len() >= ZCACHE_ENTRIES {
            cache.remove(0);
        }
        cache.push((inode.nid, ext.la, data.clone()));
        Ok((ext, data))
    }

    /// The cached decompressed extent of `nid` holding `ofs`, if any.
    fn cached_extent(&self, nid: u64, ofs: u64) -> Option<(ZExtent, Arc<Vec<u8>>)> {
        let cache = self.zcache.lock().unwrap_or_else(|e| e.into_inner());
        cache
            .iter()
            .find(|(n, la, data)| *n == nid && *la <= ofs && ofs < *la + data.len() as u64)
            .map(|(_, la, data)| {
                // Only the fields the readers use matter for a cache hit.
                let ext = ZExtent {
                    la: *la,
                    llen: data.len() as u64,
                    pa: 0,
                    plen: 0,
                    inline: false,
                    format: zmap::ZFormat::Shifted,
                };
                (ext, data.clone())
            })
    }

    /// The extent holding `ofs`, checked to hold it.
    fn map_extent(&self, inode: &Inode, z: &ZInfo, ofs: u64) -> Result<ZExtent> {
        let ext = self.zmap(inode, z, ofs)?;
        if ext.llen == 0 || ofs >= ext.la + ext.llen || ofs < ext.la {
            return Err(Error::corrupt(
                inode.pos,
                format!("inode {}: no extent covers offset {ofs}", inode.nid),
            ));
        }
        Ok(ext)
    }

    /// Reads `ext`'s physical cluster and decodes it into `out`.
    fn decode_extent(&self, inode: &Inode, ext: &ZExtent, out: &mut [u8]) -> Result<()> {
        let zero_padding = self.sb.has_incompat(superblock::INCOMPAT_LZ4_0PADDING);
        let bs = u64::from(self.sb.block_size());
        if ext.inline {
            let mut src = vec![0u8; ext.plen as usize];
            self.meta(ext.pa, &mut src)?;
            return decompress::decompress_into(ext, &src, zero_padding, bs, out);
        }
        let (dev, p) = self.resolve(0, ext.pa, inode.pos)?;
        with_scratch(&PIECE, |piece| -> Result<()> {
            let src = self.read_phys(dev, p, ext.plen as usize, piece)?;
            decompress::decompress_into(ext, src, zero_padding, bs, out)
        })
    }

    /// Runs `f` on directory block `index` of `dir`.
    fn with_dir_block<R>(
        &self,
        dir: &Inode,
        index: u64,
        f: impl FnOnce(&DirBlock<'_>) -> Result<R>,
    ) -> Result<R> {
        let bs = u64::from(self.sb.block_size());
        let start = index * bs;
        let len = (dir.size - start).min(bs) as u32;
        with_scratch(&DIRBUF, |scratch| {
            let data = self.read_inode(dir, start, len, scratch)?;
            if data.len() != len as usize {
                return Err(Error::corrupt(
                    dir.pos,
                    format!("directory {} is short", dir.nid),
                ));
            }
            let block = DirBlock::new(data, self.dir_block_pos(dir, start))?;
            f(&block)
        })
    }

    /// Best-effort image position of a directory block, for messages (flat
    /// layouts map by arithmetic alone, so this costs no I/O).
    fn dir_block_pos(&self, dir: &Inode, start: u64) -> u64 {
        match dir.layout {
            Layout::FlatPlain | Layout::FlatInline => self
                .map_flat(dir, start, start + 1)
                .ok()
                .and_then(|r| match r.phys {
                    Phys::At(_, p) => Some(p + (start - r.la)),
                    Phys::Hole => None,
                })
                .unwrap_or(dir.pos),
            _ => dir.pos,
        }
    }

    fn dir_inode(&self, ino: Ino) -> Result<Inode> {
        let dir = self.inode(ino)?;
        if dir.kind != FileType::Directory {
            return Err(Error::NotDir);
        }
        Ok(dir)
    }

    /// Looks `name` up in `dir` by binary search over its sorted blocks.
    pub fn lookup_nid(&self, dir: &Inode, name: &[u8]) -> Result<Option<u64>> {
        let bs = u64::from(self.sb.block_size());
        let (mut lo, mut hi) = (0u64, dir.size.div_ceil(bs));
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let step = self.with_dir_block(dir, mid, |b| {
                let first = b.get(0).name;
                let last = b.get(b.len() - 1).name;
                Ok(if name < first {
                    Err(std::cmp::Ordering::Less)
                } else if name > last {
                    Err(std::cmp::Ordering::Greater)
                } else {
                    Ok(b.find(name).ok().map(|i| b.get(i).nid))
                })
            })?;
            match step {
                Ok(found) => return Ok(found),
                Err(std::cmp::Ordering::Less) => hi = mid,
                Err(_) => lo = mid + 1,
            }
        }
        Ok(None)
    }

    /// The kernel's statfs view.
    fn statfs_inner(&self) -> StatFs {
        let extra: u64 = self.devices.iter().map(|d| u64::from(d.slot.blocks)).sum();
        StatFs {
            blocks: u64::from(self.sb.blocks) + extra,
            bfree: 0,
            bavail: 0,
            files: u64::MAX,
            ffree: u64::MAX - self.sb.inos,
            bsize: self.sb.block_size(),
            frsize: self.sb.block_size(),
            namelen: NAME_MAX,
        }
    }
}

impl FileSystem for Erofs {
    fn root(&self) -> Ino {
        self.sb.root_nid
    }

    fn info(&self) -> FsInfo {
        FsInfo {
            fs_type: "erofs",
            block_size: self.sb.block_size(),
            name_max: NAME_MAX,
            read_only: true,
        }
    }

    fn statfs(&self) -> Result<StatFs> {
        Ok(self.statfs_inner())
    }

    fn getattr(&self, ino: Ino) -> Result<Attr> {
        Ok(self.attr(&self.inode(ino)?))
    }

    fn lookup(&self, parent: Ino, name: &OsStr) -> Result<Attr> {
        let dir = self.dir_inode(parent)?;
        let name = name.as_bytes();
        if name.len() > NAME_MAX as usize {
            return Err(Error::NameTooLong);
        }
        match self.lookup_nid(&dir, name)? {
            Some(nid) => self.getattr(nid),
            None => Err(Error::NotFound),
        }
    }

    fn readdir(
        &self,
        ino: Ino,
        offset: u64,
        sink: &mut dyn FnMut(DirEntry<'_>) -> bool,
    ) -> Result<()> {
        let dir = self.dir_inode(ino)?;
        let bs = u64::from(self.sb.block_size());
        let nblocks = dir.size.div_ceil(bs);
        let mut block = offset / bs;
        let mut first = ((offset % bs) as usize).div_ceil(DIRENT_SIZE);
        while block < nblocks {
            // Entries are handed over after the block is released, so a sink
            // that calls back into this file system cannot collide with it.
            let entries: Vec<(u64, u8, Vec<u8>, u64)> = self.with_dir_block(&dir, block, |b| {
                let mut v = Vec::with_capacity(b.len().saturating_sub(first));
                for i in first..b.len() {
                    let e = b.get(i);
                    let next = if i + 1 < b.len() {
                        block * bs + ((i + 1) * DIRENT_SIZE) as u64
                    } else {
                        (block + 1) * bs
                    };
                    v.push((e.nid, e.file_type, e.name.to_vec(), next));
                }
                Ok(v)
            })?;
            for (nid, ftype, name, next) in entries {
                if name == b"." || name == b".." {
                    continue;
                }
                let d = dirent::Dirent {
                    nid,
                    file_type: ftype,
                    name: &name,
                };
                let kind = match d.kind() {
                    Some(k) => k,
                    None => self.inode(nid)?.kind,
                };
                if sink(DirEntry {
                    ino: nid,
                    next,
                    kind,
                    name: OsStr::from_bytes(&name),
                }) {
                    return Ok(());
                }
            }
            block += 1;
            first = 0;
        }
        Ok(())
    }

    /// Hints the inodes of the next [`PREFETCH_DIR_BLOCKS`] directory blocks
    /// when a READDIRPLUS reaches the start of such a window: the server
    /// looks up every entry it lists, and the entries' nids in the
    /// directory blocks say where all those inodes are before any is read.
    /// The kernel's EROFS reads them one at a time as lookups come, waiting
    /// for the device each time.
    fn prefetch_dir(&self, ino: Ino, offset: u64) {
        let bs = u64::from(self.sb.block_size());
        let window = PREFETCH_DIR_BLOCKS * bs;
        if !offset.is_multiple_of(window)
            || self.dev.store().mode() != foliofs_block::IoMode::Buffered
        {
            return;
        }
        let Ok(dir) = self.dir_inode(ino) else { return };
        let first = offset / bs;
        let last = dir.size.div_ceil(bs).min(first + PREFETCH_DIR_BLOCKS);
        let mut at = Vec::new();
        for block in first..last {
            let more = self.with_dir_block(&dir, block, |b| {
                for pos in (0..b.len()).filter_map(|i| Inode::position(&self.sb, b.get(i).nid)) {
                    // An extended inode may run into the next block.
                    at.extend([pos, pos.saturating_add(inode::MAX_INODE_SIZE as u64 - 1)]);
                }
                Ok(())
            });
            if more.is_err() {
                break;
            }
        }
        self.dev.prefetch(at);
    }

    fn read<'a>(
        &self,
        ino: Ino,
        offset: u64,
        size: u32,
        scratch: &'a mut Scratch,
    ) -> Result<&'a [u8]> {
        let inode = self.inode(ino)?;
        match inode.kind {
            FileType::Directory => Err(Error::IsDir),
            FileType::RegularFile | FileType::Symlink => {
                self.read_inode(&inode, offset, size, scratch)
            }
            _ => Err(Error::Invalid),
        }
    }

    /// `SEEK_DATA` / `SEEK_HOLE`: chunk holes are holes, as the kernel's
    /// iomap reports them; every other layout is all data.
    fn lseek(&self, ino: Ino, offset: u64, whence: i32) -> Result<u64> {
        let inode = self.inode(ino)?;
        if offset >= inode.size {
            return Err(Error::NoData);
        }
        if whence != libc::SEEK_DATA && whence != libc::SEEK_HOLE {
            return Err(Error::Invalid);
        }
        if inode.layout != Layout::ChunkBased {
            return Ok(if whence == libc::SEEK_DATA {
                offset
            } else {
                inode.size
            });
        }
        let want_hole = whence == libc::SEEK_HOLE;
        let mut pos = offset;
        while pos < inode.size {
            let run = self.map_flat(&inode, pos, inode.size)?;
            if run.la > pos || run.la + run.len <= pos {
                return Err(Error::corrupt(
                    inode.pos,
                    format!("inode {}: no data run covers offset {pos}", inode.nid),
                ));
            }
            if (run.phys == Phys::Hole) == want_hole {
                return Ok(pos);
            }
            pos = run.la + run.len;
        }
        // Past the last data there is only the implicit hole at EOF.
        if want_hole {
            Ok(inode.size)
        } else {
            Err(Error::NoData)
        }
    }

    fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        let inode = self.inode(ino)?;
        if inode.kind != FileType::Symlink {
            return Err(Error::NotSymlink);
        }
        if inode.size > SYMLINK_MAX {
            return Err(Error::corrupt(
                inode.pos,
                format!("symlink {} is {} bytes long", inode.nid, inode.size),
            ));
        }
        let target = self.read_to_vec(&inode, 0, inode.size as usize)?;
        if target.len() as u64 != inode.size {
            return Err(Error::corrupt(
                inode.pos,
                format!("symlink {} is short", inode.nid),
            ));
        }
        Ok(target)
    }

    fn getxattr(&self, ino: Ino, name: &OsStr) -> Result<Vec<u8>> {
        let inode = self.inode(ino)?;
        let name = name.as_bytes();
        for e in self.xattrs(&inode)? {
            if e.name == name {
                return self.xattr_value(&e);
            }
        }
        Err(Error::NoXattr)
    }

    fn listxattr(&self, ino: Ino) -> Result<Vec<Vec<u8>>> {
        let inode = self.inode(ino)?;
        Ok(self.xattrs(&inode)?.into_iter().map(|e| e.name).collect())
    }
}
