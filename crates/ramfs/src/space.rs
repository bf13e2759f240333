//! Block and inode accounting against the `size=` and `nr_inodes=` limits.

use std::sync::atomic::{AtomicU64, Ordering};

use std::sync::Arc;

use crate::arena::Arena;
use crate::block::Block;
use crate::budget::{Budget, Charge, INODE_CHARGE};

/// Counters shared by every inode of one mount. Taking space is a single
/// atomic update, so writers to different files never contend on a lock.
#[derive(Debug)]
pub(crate) struct Space {
    max_blocks: u64,
    used_blocks: AtomicU64,
    max_inodes: u64,
    used_inodes: AtomicU64,
    /// Bytes of extended attribute names and values, held to the same byte
    /// limit as data so that no number of inodes can make them unbounded.
    max_xattr: u64,
    used_xattr: AtomicU64,
    /// What one block costs in memory, bookkeeping included.
    block_charge: u64,
    /// The server's memory limits, which can be tighter than `size=`.
    budget: Budget,
    /// Where blocks come from on a supervised mount (see `arena.rs`);
    /// `None`: this process's memory.
    arena: Option<Arc<Arena>>,
}

fn take(counter: &AtomicU64, n: u64, max: u64) -> bool {
    counter
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
            u.checked_add(n).filter(|&v| v <= max)
        })
        .is_ok()
}

impl Space {
    /// Limits in bytes (rounded up to whole blocks) and inodes; `None` is unlimited.
    pub fn new(block_size: u64, max_bytes: Option<u64>, max_inodes: Option<u64>) -> Self {
        Space {
            max_xattr: max_bytes.unwrap_or(u64::MAX),
            used_xattr: AtomicU64::new(0),
            max_blocks: max_bytes.map_or(u64::MAX, |b| b.div_ceil(block_size)),
            used_blocks: AtomicU64::new(0),
            max_inodes: max_inodes.unwrap_or(u64::MAX),
            used_inodes: AtomicU64::new(0),
            block_charge: crate::block::charge(block_size as usize),
            budget: Budget::new(),
            arena: None,
        }
    }

    /// Takes blocks from `arena` from now on.
    pub fn set_arena(&mut self, arena: Arc<Arena>) {
        self.arena = Some(arena);
    }

    /// The memory of a new block of `bs` bytes (counted by the caller
    /// with [`Space::take_blocks`]).
    pub fn new_block(&self, bs: usize) -> Option<Block> {
        match &self.arena {
            Some(a) => Block::in_arena(a),
            None => Block::new(bs),
        }
    }

    /// Counts blocks, inodes and bytes a restarted server found in use,
    /// whatever the limits (they held when each was taken).
    pub fn restore(&self, blocks: u64, inodes: u64, xattr: u64) {
        self.used_blocks.fetch_add(blocks, Ordering::AcqRel);
        self.used_inodes.fetch_add(inodes, Ordering::AcqRel);
        self.used_xattr.fetch_add(xattr, Ordering::AcqRel);
    }

    /// Takes `n` blocks, within `size=` and the memory limits.
    pub fn take_blocks(&self, n: u64) -> bool {
        if n == 0 {
            return true;
        }
        if !take(&self.used_blocks, n, self.max_blocks) {
            return false;
        }
        if !self
            .budget
            .take(n.saturating_mul(self.block_charge), Charge::Memory)
        {
            self.used_blocks.fetch_sub(n, Ordering::AcqRel);
            return false;
        }
        true
    }

    pub fn give_blocks(&self, n: u64) {
        if n > 0 {
            self.used_blocks.fetch_sub(n, Ordering::AcqRel);
            self.budget.freed();
        }
    }

    pub fn take_inode(&self) -> bool {
        if !take(&self.used_inodes, 1, self.max_inodes) {
            return false;
        }
        if !self.budget.take(INODE_CHARGE, Charge::Memory) {
            self.used_inodes.fetch_sub(1, Ordering::AcqRel);
            return false;
        }
        true
    }

    /// Takes `n` bytes of memory for the ledger of a supervised mount
    /// (freed by its rewrites, which the next reading of the limits sees).
    pub fn take_ledger(&self, n: u64) -> bool {
        self.budget.take(n, Charge::Memory)
    }

    pub fn give_inode(&self) {
        self.used_inodes.fetch_sub(1, Ordering::AcqRel);
        self.budget.freed();
    }

    pub fn take_xattr(&self, n: u64) -> bool {
        if n == 0 {
            return true;
        }
        if !take(&self.used_xattr, n, self.max_xattr) {
            return false;
        }
        // Names and values are heap allocations of their own: their bytes
        // and an allocator header each.
        if !self.budget.take(n + 64, Charge::Memory) {
            self.used_xattr.fetch_sub(n, Ordering::AcqRel);
            return false;
        }
        true
    }

    pub fn give_xattr(&self, n: u64) {
        if n > 0 {
            self.used_xattr.fetch_sub(n, Ordering::AcqRel);
            self.budget.freed();
        }
    }

    /// Takes `n` bytes of pool pages the server itself fills (a backed
    /// file written or allocated through the server, not passed through).
    pub fn take_page_cache(&self, n: u64) -> bool {
        self.budget.take(n, Charge::PageCache)
    }

    pub fn used_xattr(&self) -> u64 {
        self.used_xattr.load(Ordering::Acquire)
    }

    pub fn used_blocks(&self) -> u64 {
        self.used_blocks.load(Ordering::Acquire)
    }

    pub fn used_inodes(&self) -> u64 {
        self.used_inodes.load(Ordering::Acquire)
    }

    pub fn max_blocks(&self) -> u64 {
        self.max_blocks
    }

    pub fn max_inodes(&self) -> u64 {
        self.max_inodes
    }
}
