//! A sharded LRU cache of blocks, with recycled buffers.

use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex};

use foliofs_vfs::AlignedBuf;
use lru::LruCache;

const SHARDS: usize = 8;
const MAX_SPARES: usize = 8;

/// One cached block: an aligned window of `O_DIRECT`'s alignment, of which
/// the first `len` bytes hold data.
#[derive(Debug)]
pub struct Block {
    buf: AlignedBuf,
    len: usize,
}

impl Block {
    fn new(cap: usize, align: usize) -> Block {
        Block {
            buf: AlignedBuf::new(cap, align),
            len: cap,
        }
    }

    /// The block's bytes (shorter than the block size only at the image end).
    pub fn data(&self) -> &[u8] {
        &self.buf.as_slice()[..self.len]
    }

    pub(crate) fn io_buf(&mut self) -> &mut [u8] {
        self.buf.as_mut_slice()
    }

    pub(crate) fn set_len(&mut self, len: usize) {
        self.len = len.min(self.buf.len());
    }
}

impl AsRef<[u8]> for Block {
    fn as_ref(&self) -> &[u8] {
        self.data()
    }
}

/// Recently used blocks by index, bounded in count.
#[derive(Debug)]
pub struct BlockCache {
    shards: Vec<Mutex<LruCache<u64, Arc<Block>>>>,
    spares: Mutex<Vec<Block>>,
}

impl BlockCache {
    /// A cache holding at most about `blocks` blocks.
    pub fn new(blocks: usize) -> BlockCache {
        let per = NonZeroUsize::new(blocks.div_ceil(SHARDS).max(1)).expect("non-zero");
        BlockCache {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(LruCache::new(per)))
                .collect(),
            spares: Mutex::new(Vec::new()),
        }
    }

    fn shard(&self, index: u64) -> &Mutex<LruCache<u64, Arc<Block>>> {
        // Neighbouring blocks land in different shards so sequential readers
        // on several threads do not queue on one lock.
        &self.shards[(index % SHARDS as u64) as usize]
    }

    /// Block `index` (the offset divided by the block size), if cached;
    /// counts as a use for the LRU order.
    pub fn get(&self, index: u64) -> Option<Arc<Block>> {
        let mut s = self.shard(index).lock().unwrap_or_else(|e| e.into_inner());
        s.get(&index).cloned()
    }

    /// Whether block `index` is cached (without counting as a use).
    pub fn contains(&self, index: u64) -> bool {
        let s = self.shard(index).lock().unwrap_or_else(|e| e.into_inner());
        s.contains(&index)
    }

    /// An empty block of `cap` bytes aligned to `align`, reusing an evicted
    /// buffer when one fits (no allocation per block on a sequential read).
    pub(crate) fn take_spare(&self, cap: usize, align: usize) -> Block {
        let mut spares = self.spares.lock().unwrap_or_else(|e| e.into_inner());
        while let Some(mut b) = spares.pop() {
            if b.buf.refit(cap, align) {
                b.len = cap;
                return b;
            }
        }
        drop(spares);
        Block::new(cap, align)
    }

    pub(crate) fn insert(&self, index: u64, block: Block) -> Arc<Block> {
        let block = Arc::new(block);
        let evicted = {
            let mut s = self.shard(index).lock().unwrap_or_else(|e| e.into_inner());
            s.push(index, block.clone())
        };
        if let Some((_, old)) = evicted {
            if let Ok(b) = Arc::try_unwrap(old) {
                let mut spares = self.spares.lock().unwrap_or_else(|e| e.into_inner());
                if spares.len() < MAX_SPARES {
                    spares.push(b);
                }
            }
        }
        block
    }

    /// Drops every cached block.
    pub fn clear(&self) {
        for s in &self.shards {
            s.lock().unwrap_or_else(|e| e.into_inner()).clear();
        }
    }
}
