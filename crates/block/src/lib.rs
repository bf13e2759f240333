//! Backing store and block cache for foliofs's image formats.
//!
//! [`Store`] reads an image file or block device, buffered or with
//! `O_DIRECT`, or an object in remote storage through its disk cache
//! ([`remote`]). [`BlockDev`] puts a block size on top, chosen per open as
//! the kernel's romfs chooses `sb_set_blocksize`: the unit of the block
//! cache and of small reads. A read inside one block is served from the
//! cached block without a copy; a read across blocks but shorter than
//! [`STREAM_READ`] reads the whole blocks it covers with one `pread` and
//! takes the partial blocks at its edges from the cache; a read of
//! [`STREAM_READ`] or more is one `pread` of exactly the range asked for,
//! neither rounded out to blocks nor cached, so a large sequential read
//! costs the same at any block size. File data in direct mode
//! ([`BlockDev::read_data`]) is read with `O_DIRECT`, rounded out only to
//! the store's alignment; metadata is read through the page cache in
//! either mode.
//!
//! [`OpenOptions`] says how an image is opened and [`ImageOptions`] adds
//! its extra devices; with [`remote::RemoteOptions`] they own the `-o` keys
//! that change how an image is read.

#![warn(missing_docs)]

mod cache;
mod error;
mod options;
pub mod remote;
mod store;

use std::sync::Arc;

pub use cache::{Block, BlockCache};
pub use error::Corrupt;
pub use options::{ImageOptions, OpenOptions};
pub use store::{IoMode, Store};

use foliofs_vfs::{Error, Result, Scratch};

/// Smallest block size: romfs's `ROMBSIZE`.
pub const MIN_BLOCK_SIZE: u32 = 1024;
/// Largest block size: a PMD-sized folio, as the ramfs seed allows.
pub const MAX_BLOCK_SIZE: u32 = 2 * 1024 * 1024;
/// Reads at least this long go straight to the store (see [`BlockDev::read`]).
pub const STREAM_READ: usize = 64 * 1024;

/// Prefetched blocks at most this many bytes apart are read as one range,
/// of at most `PREFETCH_MAX` bytes (so a chain of near neighbours cannot
/// pull in everything between them).
const PREFETCH_GAP: u64 = 32 * 1024;
const PREFETCH_MAX: u64 = 128 * 1024;
/// Default bytes of block cache per mount.
pub const DEFAULT_CACHE_BYTES: usize = 32 * 1024 * 1024;

/// How a mount picks its block size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum BlockSizeChoice {
    /// The format's own default (1 KiB for romfs, the image's for EROFS).
    #[default]
    Default,
    /// The seed patch's `largeblocks` rule: the largest power of two from the
    /// page size down to 1 KiB that divides the image size.
    LargeBlocks,
    /// An explicit size (a power of two, 1 KiB to 2 MiB).
    Fixed(u32),
}

impl BlockSizeChoice {
    /// The block size this choice gives for an image of `image_size` bytes;
    /// `default` is the format's own block size.
    pub fn resolve(self, image_size: u64, default: u32) -> Result<u32> {
        match self {
            BlockSizeChoice::Default => Ok(default),
            BlockSizeChoice::LargeBlocks => Ok(largeblocks(image_size, page_size())),
            BlockSizeChoice::Fixed(n) => {
                check_block_size(n)?;
                Ok(n)
            }
        }
    }
}

/// The `largeblocks` rule: from `page` down to 1 KiB, the first power of two
/// dividing `image_size`; 1 KiB when none does.
pub fn largeblocks(image_size: u64, page: u32) -> u32 {
    let mut bs = page.max(MIN_BLOCK_SIZE);
    while bs > MIN_BLOCK_SIZE {
        if image_size.is_multiple_of(u64::from(bs)) {
            break;
        }
        bs >>= 1;
    }
    bs
}

/// Refuses a block size that is not a power of two in [1 KiB, 2 MiB].
pub fn check_block_size(n: u32) -> Result<()> {
    if !n.is_power_of_two() || !(MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&n) {
        return Err(Error::Invalid);
    }
    Ok(())
}

/// The system page size.
pub fn page_size() -> u32 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 {
        n as u32
    } else {
        4096
    }
}

/// A store read in blocks of one size, with a cache of recently used blocks.
#[derive(Debug)]
pub struct BlockDev {
    store: Store,
    block_size: u32,
    shift: u32,
    /// Memory alignment of block buffers (and of I/O in direct mode).
    align: usize,
    cache: BlockCache,
}

impl BlockDev {
    /// Wraps `store` with blocks of `block_size` bytes (a power of two from
    /// 1 KiB to 2 MiB) and a cache of about `cache_bytes`.
    pub fn new(store: Store, block_size: u32, cache_bytes: usize) -> Result<BlockDev> {
        check_block_size(block_size)?;
        let blocks = (cache_bytes / block_size as usize).max(8);
        Ok(BlockDev {
            align: (store.dio_align() as usize).max(64),
            shift: block_size.trailing_zeros(),
            block_size,
            cache: BlockCache::new(blocks),
            store,
        })
    }

    /// Opens `path` as `opts` say; `default_block_size` is the format's own
    /// (used when `opts.block_size` is [`BlockSizeChoice::Default`]).
    pub fn open(
        path: &std::path::Path,
        opts: &OpenOptions,
        default_block_size: u32,
    ) -> Result<BlockDev> {
        let store = Store::open(path, opts)?;
        let bs = opts.block_size.resolve(store.size(), default_block_size)?;
        BlockDev::new(store, bs, opts.cache_bytes)
    }

    /// The block size in bytes: a power of two from 1 KiB to 2 MiB.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// The image size in bytes.
    pub fn size(&self) -> u64 {
        self.store.size()
    }

    /// The store under the blocks (its path, I/O mode and direct-I/O
    /// alignment).
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Number of blocks, counting a partial last block (`f_blocks`).
    pub fn blocks(&self) -> u64 {
        self.size().div_ceil(u64::from(self.block_size))
    }

    /// Block `index` through the cache, read through the page cache in
    /// either I/O mode: blocks hold metadata. The last block of the image
    /// may be shorter than the block size.
    pub fn block(&self, index: u64) -> Result<Arc<Block>> {
        if let Some(b) = self.cache.get(index) {
            return Ok(b);
        }
        let start = index << self.shift;
        if start >= self.size() {
            return Err(self.beyond_end(start, 1));
        }
        let len = (self.size() - start).min(u64::from(self.block_size)) as usize;
        let mut block = self.cache.take_spare(len, self.align);
        let n = self.store.read_meta_at(block.io_buf(), start)?;
        block.set_len(n.min(len));
        Ok(self.cache.insert(index, block))
    }

    /// Starts reading, in the background, the uncached blocks holding the
    /// bytes at `offsets` (a hint: see [`Store::will_need`]). Blocks close together go out as one request of a bounded
    /// size: reading a few unneeded blocks costs less than another seek.
    pub fn prefetch(&self, offsets: impl IntoIterator<Item = u64>) {
        let mut blocks: Vec<u64> = offsets
            .into_iter()
            .filter(|&o| o < self.size())
            .map(|o| o >> self.shift)
            .collect();
        blocks.sort_unstable();
        blocks.dedup();
        blocks.retain(|&b| !self.cache.contains(b));
        let gap = (PREFETCH_GAP >> self.shift).max(1);
        let max = (PREFETCH_MAX >> self.shift).max(1);
        let mut i = 0;
        while i < blocks.len() {
            let first = blocks[i];
            let mut last = first;
            while i + 1 < blocks.len() && blocks[i + 1] - last <= gap && blocks[i + 1] - first < max
            {
                i += 1;
                last = blocks[i];
            }
            self.store
                .will_need(first << self.shift, (last + 1 - first) << self.shift);
            i += 1;
        }
    }

    /// Copies `buf.len()` bytes at `offset` into `buf`, through the cache.
    /// For small metadata reads; large ones should use [`BlockDev::read`].
    pub fn read_exact(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.check_range(offset, buf.len() as u64)?;
        let bs = u64::from(self.block_size);
        let mut done = 0usize;
        while done < buf.len() {
            let pos = offset + done as u64;
            let blk = self.block(pos >> self.shift)?;
            let within = (pos % bs) as usize;
            let data = blk.data();
            let n = (buf.len() - done).min(data.len().saturating_sub(within));
            if n == 0 {
                return Err(self.beyond_end(pos, 1));
            }
            buf[done..done + n].copy_from_slice(&data[within..within + n]);
            done += n;
        }
        Ok(())
    }

    /// Reads `len` bytes at `offset` (clipped at the image end) and returns
    /// them as a slice into `scratch`. A read inside one block is served from
    /// the cached block without copying; a longer one reads all the blocks it
    /// covers whole with one I/O and takes its partial edge blocks from the
    /// cache.
    ///
    /// Reads of [`STREAM_READ`] bytes or more skip the blocks altogether and
    /// read the range asked for with one I/O: rounding a large request out to
    /// large blocks, or copying whole cached edge blocks, would move up to
    /// twice the block size more than the request for nothing, and would
    /// read a block twice when two threads miss it at once.
    ///
    /// This reads through the page cache in either I/O mode: it is for
    /// metadata and directories. File data goes through
    /// [`BlockDev::read_data`].
    pub fn read<'a>(&self, offset: u64, len: usize, scratch: &'a mut Scratch) -> Result<&'a [u8]> {
        let size = self.size();
        if offset >= size || len == 0 {
            return Ok(&[]);
        }
        let len = (len as u64).min(size - offset) as usize;
        if len >= STREAM_READ {
            return self.read_span(offset, len, scratch, false);
        }
        let end = offset + len as u64;
        let bs = u64::from(self.block_size);
        let first = offset >> self.shift;
        let last = (end - 1) >> self.shift;
        if first == last {
            let blk = self.block(first)?;
            let within = (offset - (first << self.shift)) as usize;
            if blk.data().len() < within + len {
                return Err(self.beyond_end(offset, len as u64));
            }
            return Ok(&scratch.hold(blk)[within..within + len]);
        }
        let base = first << self.shift;
        let span = ((last + 1) << self.shift).min(size) - base;
        let buf = scratch.aligned(span as usize, self.align);
        // Edge blocks the request only partly covers come from the cache: a
        // sequential reader's next request starts in the same block.
        let head_partial = !offset.is_multiple_of(bs);
        let tail_partial = !end.is_multiple_of(bs) && end < size;
        let full_first = first + u64::from(head_partial);
        let full_last = last - u64::from(tail_partial);
        // Only the bytes the request covers are copied: with large blocks a
        // whole edge block would be most of the work.
        if head_partial {
            let blk = self.block(first)?;
            let from = (offset - base) as usize;
            let n = blk.data().len().min(bs as usize);
            if n < from {
                return Err(self.beyond_end(offset, len as u64));
            }
            buf[from..n].copy_from_slice(&blk.data()[from..n]);
        }
        if tail_partial {
            let blk = self.block(last)?;
            let at = ((last - first) << self.shift) as usize;
            let n = (end - (last << self.shift)) as usize;
            if blk.data().len() < n {
                return Err(self.beyond_end(last << self.shift, n as u64));
            }
            buf[at..at + n].copy_from_slice(&blk.data()[..n]);
        }
        if full_first <= full_last {
            let at = ((full_first - first) << self.shift) as usize;
            let to = (((full_last + 1) << self.shift).min(size) - base) as usize;
            let want = to - at;
            let got = self
                .store
                .read_meta_at(&mut buf[at..to], base + at as u64)?;
            if got < want {
                return Err(self.beyond_end(base + (at + got) as u64, 1));
            }
        }
        let within = (offset - base) as usize;
        Ok(&buf[within..within + len])
    }

    /// Reads `len` bytes of file data at `offset` (clipped at the image
    /// end), as [`BlockDev::read`] does when buffered. In direct mode the
    /// range is read with `O_DIRECT`, rounded out only to its alignment,
    /// and never enters a cache, as the kernel's file-backed EROFS reads
    /// data with `directio` (and metadata through the page cache).
    pub fn read_data<'a>(
        &self,
        offset: u64,
        len: usize,
        scratch: &'a mut Scratch,
    ) -> Result<&'a [u8]> {
        if self.store.mode() != IoMode::Direct {
            return self.read(offset, len, scratch);
        }
        let size = self.size();
        if offset >= size || len == 0 {
            return Ok(&[]);
        }
        let len = (len as u64).min(size - offset) as usize;
        self.read_span(offset, len, scratch, true)
    }

    /// Reads file data at `offset` into `out`, as [`BlockDev::read_data`]
    /// would return it, and returns how many bytes there were (fewer only
    /// at the image end). A buffered store reads straight into `out`, with
    /// no copy out of a cache; direct I/O needs aligned buffers, so there
    /// the bytes pass through `scratch`.
    pub fn read_data_into(
        &self,
        offset: u64,
        out: &mut [u8],
        scratch: &mut Scratch,
    ) -> Result<usize> {
        if self.store.mode() == IoMode::Direct {
            let got = self.read_data(offset, out.len(), scratch)?;
            out[..got.len()].copy_from_slice(got);
            return Ok(got.len());
        }
        let n = (out.len() as u64).min(self.size().saturating_sub(offset)) as usize;
        if n == 0 {
            return Ok(0);
        }
        let got = self.store.read_at(&mut out[..n], offset)?;
        if got < n {
            return Err(self.beyond_end(offset + got as u64, 1));
        }
        Ok(n)
    }

    /// One read of `[offset, offset + len)` (inside the image), rounded
    /// out to the direct-I/O alignment when `data` asks for the data
    /// handle (`O_DIRECT` in direct mode), past the cached blocks.
    fn read_span<'a>(
        &self,
        offset: u64,
        len: usize,
        scratch: &'a mut Scratch,
        data: bool,
    ) -> Result<&'a [u8]> {
        let a = if data {
            u64::from(self.store.dio_align())
        } else {
            1
        };
        let start = offset / a * a;
        let stop = (offset + len as u64).div_ceil(a) * a;
        let buf = scratch.aligned((stop - start) as usize, self.align);
        let got = if data {
            self.store.read_at(buf, start)?
        } else {
            self.store.read_meta_at(buf, start)?
        };
        let need = (offset - start) as usize + len;
        if got < need {
            return Err(self.beyond_end(start + got as u64, 1));
        }
        Ok(&buf[need - len..need])
    }

    /// Fails unless `[offset, offset+len)` lies inside the image.
    pub fn check_range(&self, offset: u64, len: u64) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.size() => Ok(()),
            _ => Err(self.beyond_end(offset, len)),
        }
    }

    fn beyond_end(&self, offset: u64, len: u64) -> Error {
        Error::corrupt(
            offset,
            Corrupt::ReadPastEnd {
                offset,
                len,
                size: self.size(),
            },
        )
    }
}

#[cfg(test)]
mod tests;
