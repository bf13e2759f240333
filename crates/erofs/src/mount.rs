//! Opening an image: the superblock's checks, the extra devices of the
//! device table, and what `statfs` reports about them.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use foliofs_block::{
    BlockDev, BlockSizeChoice, OpenOptions, Store, MAX_BLOCK_SIZE, MIN_BLOCK_SIZE,
};
use foliofs_vfs::{Error, FileType, Result, StatFs};

use crate::decompress::CompressionConfigs;
use crate::format::{
    COMPAT_SB_CHKSUM, DEVT_SLOT_SIZE, INCOMPAT_48BIT, INCOMPAT_DEVICE_TABLE, NAME_LEN_MAX,
    SUPER_OFFSET, SUPER_SIZE, SUPER_SIZE_EXT,
};
use crate::inode::Inode;
use crate::superblock::{self, DeviceSlot, Superblock};
use crate::xattr::LongPrefix;
use crate::zcache::ExtentCache;
use crate::zmap::{self, RunningSums};
use crate::{Corrupt, Incompatible};

/// An extra device: its table slot and, unless it lives inside the primary
/// image (a flat layout), the opened device.
#[derive(Debug)]
pub(crate) struct ExtraDevice {
    pub(crate) slot: DeviceSlot,
    pub(crate) dev: Option<BlockDev>,
}

/// An open EROFS image.
#[derive(Debug)]
pub struct Erofs {
    pub(crate) dev: BlockDev,
    pub(crate) sb: Superblock,
    pub(crate) devices: Vec<ExtraDevice>,
    pub(crate) device_id_mask: u16,
    pub(crate) prefixes: Vec<LongPrefix>,
    /// Each listed compression algorithm's configuration record.
    pub(crate) configs: CompressionConfigs,
    /// Recently decompressed extents of files.
    pub(crate) zcache: Mutex<ExtentCache>,
    /// Running sums of recently used 4-byte extent record tables.
    pub(crate) ext_sums: Mutex<RunningSums>,
    /// The metabox inode, on images whose inodes may live in it.
    pub(crate) metabox: Option<Inode>,
    /// Recently decompressed extents of the metabox inode, apart from the
    /// files' so that reading files does not push inodes out.
    pub(crate) mcache: Mutex<ExtentCache>,
    pub(crate) path: PathBuf,
}

impl Erofs {
    /// Opens the EROFS image at `path`; `devices` are the extra devices
    /// (blob files) the image's device table names, in order.
    pub fn open(path: &Path, opts: &OpenOptions, devices: &[PathBuf]) -> Result<Erofs> {
        // One store for the superblock and everything after: an image in
        // a registry or a bucket costs requests (and threads) to open.
        let store = Store::open(path, opts)?;
        let sb = read_superblock(path, &store)?;
        // The cache's blocks follow the image's, but never below what the
        // block layer can do.
        let default_bs = sb.block_size().clamp(MIN_BLOCK_SIZE, MAX_BLOCK_SIZE);
        let bs = opts.block_size.resolve(store.size(), default_bs)?;
        let dev = BlockDev::new(store, bs, opts.cache_bytes)?;
        let mut fs = Erofs {
            dev,
            sb,
            devices: Vec::new(),
            device_id_mask: 0,
            prefixes: Vec::new(),
            configs: CompressionConfigs::default(),
            zcache: Mutex::new(ExtentCache::for_files()),
            ext_sums: Mutex::new(zmap::running_sums()),
            metabox: None,
            mcache: Mutex::new(ExtentCache::for_metabox()),
            path: path.to_owned(),
        };
        fs.check_superblock()?;
        fs.open_devices(opts, devices)?;
        fs.metabox = fs.open_metabox()?;
        fs.prefixes = fs.load_prefixes()?;
        let root = fs.inode(fs.sb.root_nid)?;
        if root.kind != FileType::Directory {
            return Err(Error::corrupt(
                root.pos,
                Corrupt::RootNotDirectory { nid: root.nid },
            ));
        }
        Ok(fs)
    }

    /// The superblock and device table of the image at `path`, read
    /// without opening its devices: what must be found before the image
    /// can be opened.
    pub fn device_table(path: &Path, opts: &OpenOptions) -> Result<(Superblock, Vec<DeviceSlot>)> {
        let probe_opts = probe_options(opts);
        let store = Store::open(path, &probe_opts)?;
        let sb = read_superblock(path, &store)?;
        if !sb.has_incompat(INCOMPAT_DEVICE_TABLE) {
            return Ok((sb, Vec::new()));
        }
        let probe = BlockDev::new(store, 4096, probe_opts.cache_bytes)?;
        let base = u64::from(sb.devt_slotoff) * DEVT_SLOT_SIZE;
        let mut slots = Vec::with_capacity(usize::from(sb.extra_devices));
        for i in 0..u64::from(sb.extra_devices) {
            let mut raw = [0u8; DEVT_SLOT_SIZE as usize];
            probe.read_exact(base + i * DEVT_SLOT_SIZE, &mut raw)?;
            slots.push(DeviceSlot::parse(&raw, sb.has_incompat(INCOMPAT_48BIT)));
        }
        Ok((sb, slots))
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

    pub(crate) fn check_superblock(&mut self) -> Result<()> {
        if self.sb.has_compat(COMPAT_SB_CHKSUM) {
            let mut block = vec![0u8; superblock::checksum_len(&self.sb)];
            self.meta(SUPER_OFFSET, &mut block)?;
            superblock::verify_checksum(&self.sb, &block)?;
        }
        self.configs =
            CompressionConfigs::load(&self.sb, |pos, buf| self.dev.read_exact(pos, buf))?;
        Ok(())
    }

    /// The configuration of each compression algorithm the image lists.
    pub fn compression_configs(&self) -> &CompressionConfigs {
        &self.configs
    }

    pub(crate) fn open_devices(&mut self, opts: &OpenOptions, paths: &[PathBuf]) -> Result<()> {
        // As the kernel does, the device count means nothing without the
        // device table feature.
        let n = if self.sb.has_incompat(INCOMPAT_DEVICE_TABLE) {
            usize::from(self.sb.extra_devices)
        } else {
            0
        };
        if n == 0 {
            if !paths.is_empty() {
                return Err(Error::incompatible(Incompatible::DevicesWithoutTable {
                    path: self.path.clone(),
                    given: paths.len(),
                }));
            }
            return Ok(());
        }
        let base = u64::from(self.sb.devt_slotoff) * DEVT_SLOT_SIZE;
        let mut slots = Vec::with_capacity(n);
        for i in 0..n as u64 {
            let mut raw = [0u8; DEVT_SLOT_SIZE as usize];
            self.meta(base + i * DEVT_SLOT_SIZE, &mut raw)?;
            slots.push(DeviceSlot::parse(
                &raw,
                self.sb.has_incompat(INCOMPAT_48BIT),
            ));
        }
        self.device_id_mask = ((n + 1).next_power_of_two() - 1) as u16;
        let flat = paths.is_empty();
        if flat {
            if let Some(s) = slots.iter().find(|s| s.mapped_blkaddr == 0) {
                return Err(Error::incompatible(Incompatible::DevicesNeeded {
                    path: self.path.clone(),
                    count: n,
                    first: String::from_utf8_lossy(&s.tag).into_owned(),
                }));
            }
        } else if paths.len() != n {
            return Err(Error::incompatible(Incompatible::DeviceCount {
                path: self.path.clone(),
                count: n,
                given: paths.len(),
            }));
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

    /// The kernel's statfs view.
    pub(crate) fn statfs_inner(&self) -> StatFs {
        let extra: u64 = self
            .devices
            .iter()
            .fold(0u64, |n, d| n.saturating_add(d.slot.blocks));
        StatFs {
            blocks: self.sb.blocks.saturating_add(extra),
            bfree: 0,
            bavail: 0,
            files: u64::MAX,
            ffree: u64::MAX - self.sb.inos,
            bsize: self.sb.block_size(),
            frsize: self.sb.block_size(),
            namelen: NAME_LEN_MAX as u32,
        }
    }
}

/// How the superblock is read before the image's block size is known:
/// one 4 KiB block, through a small cache, as `opts` reach the image.
fn probe_options(opts: &OpenOptions) -> OpenOptions {
    OpenOptions {
        block_size: BlockSizeChoice::Fixed(4096),
        io_mode: opts.io_mode,
        cache_bytes: 1 << 20,
        remote: opts.remote.clone(),
    }
}

/// Reads and parses the superblock of the image at `path` from `store`.
fn read_superblock(path: &Path, store: &Store) -> Result<Superblock> {
    let read = |raw: &mut [u8]| -> Result<()> {
        if store.read_meta_at(raw, SUPER_OFFSET)? < raw.len() {
            return Err(Error::corrupt(
                SUPER_OFFSET,
                Corrupt::ImageTooSmall {
                    path: path.to_owned(),
                    size: store.size(),
                },
            ));
        }
        Ok(())
    };
    let mut raw = [0u8; SUPER_SIZE_EXT];
    read(&mut raw[..SUPER_SIZE])?;
    // The extension slots (the metabox nid) follow the fixed part.
    let size = Superblock::read_size(&raw);
    read(&mut raw[..size])?;
    Superblock::parse(&raw[..size])
}
