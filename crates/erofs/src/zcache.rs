//! Decompressed extents kept for the readers that come back to them: a
//! sequential reader asks for the rest of an extent it made decode, and
//! every inode lookup on a metabox image reads the metabox inode's.

use std::num::NonZeroUsize;
use std::sync::Arc;

use lru::LruCache;

/// Extents of files kept (any size: an extent is at most
/// [`MAX_EXTENT`](crate::format::MAX_EXTENT) bytes).
const FILE_EXTENTS: usize = 32;
/// Extents of the metabox inode kept, and the most bytes they may hold
/// together.
const METABOX_EXTENTS: usize = 512;
const METABOX_BYTES: usize = 32 << 20;

/// Decoded extents by inode and logical start, the least recently used
/// dropped first once the cache holds its most extents or bytes.
#[derive(Debug)]
pub(crate) struct ExtentCache {
    /// (nid, logical start) to the extent's bytes.
    extents: LruCache<(u64, u64), Arc<Vec<u8>>>,
    /// Bytes of every extent held.
    bytes: usize,
    max_bytes: usize,
}

impl ExtentCache {
    /// A cache of at most `max_extents` extents and `max_bytes` bytes
    /// (but always the last extent put in, however large).
    pub(crate) fn new(max_extents: usize, max_bytes: usize) -> ExtentCache {
        ExtentCache {
            extents: LruCache::new(NonZeroUsize::new(max_extents).unwrap_or(NonZeroUsize::MIN)),
            bytes: 0,
            max_bytes,
        }
    }

    /// The cache for files' extents.
    pub(crate) fn for_files() -> ExtentCache {
        ExtentCache::new(FILE_EXTENTS, usize::MAX)
    }

    /// The metabox inode's own cache, so that reading files does not push
    /// out the extents every inode lookup needs.
    pub(crate) fn for_metabox() -> ExtentCache {
        ExtentCache::new(METABOX_EXTENTS, METABOX_BYTES)
    }

    /// The extent of inode `nid` holding byte `ofs` of its data, with its
    /// logical start; it becomes the most recently used.
    pub(crate) fn get(&mut self, nid: u64, ofs: u64) -> Option<(u64, Arc<Vec<u8>>)> {
        // Extents are found by a byte inside them, not by their start, so
        // the search is a walk; the caches are small enough for it.
        let key = self
            .extents
            .iter()
            .find(|((n, la), data)| *n == nid && *la <= ofs && ofs - la < data.len() as u64)
            .map(|(key, _)| *key)?;
        let data = self.extents.get(&key)?;
        Some((key.1, data.clone()))
    }

    /// Keeps `data`, the extent of `nid` starting at `la`, dropping the
    /// least recently used ones to make room.
    pub(crate) fn insert(&mut self, nid: u64, la: u64, data: Arc<Vec<u8>>) {
        // Two readers may have decoded the same extent side by side.
        if let Some(old) = self.extents.pop(&(nid, la)) {
            self.bytes -= old.len();
        }
        while self.extents.len() == self.extents.cap().get()
            || (!self.extents.is_empty() && self.bytes + data.len() > self.max_bytes)
        {
            let Some((_, old)) = self.extents.pop_lru() else {
                break;
            };
            self.bytes -= old.len();
        }
        self.bytes += data.len();
        self.extents.put((nid, la), data);
    }

    /// Extents held.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.extents.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn extent(len: usize) -> Arc<Vec<u8>> {
        Arc::new(vec![7; len])
    }

    #[test]
    fn finds_an_extent_by_any_byte_inside_it() {
        let mut c = ExtentCache::new(4, usize::MAX);
        c.insert(1, 100, extent(50));
        assert_eq!(c.get(1, 100).map(|(la, d)| (la, d.len())), Some((100, 50)));
        assert_eq!(c.get(1, 149).map(|(la, _)| la), Some(100));
        assert!(c.get(1, 150).is_none());
        assert!(c.get(1, 99).is_none());
        assert!(c.get(2, 120).is_none());
    }

    #[test]
    fn drops_the_least_recently_used_at_its_extent_limit() {
        let mut c = ExtentCache::new(2, usize::MAX);
        c.insert(1, 0, extent(10));
        c.insert(1, 10, extent(10));
        // A hit makes the first the most recently used.
        assert!(c.get(1, 5).is_some());
        c.insert(1, 20, extent(10));
        assert_eq!(c.len(), 2);
        assert!(c.get(1, 5).is_some());
        assert!(c.get(1, 15).is_none());
        assert!(c.get(1, 25).is_some());
    }

    #[test]
    fn keeps_to_its_byte_limit_but_always_keeps_the_last() {
        let mut c = ExtentCache::new(8, 100);
        c.insert(1, 0, extent(60));
        c.insert(1, 60, extent(30));
        c.insert(1, 90, extent(30));
        assert!(c.get(1, 0).is_none());
        assert_eq!((c.len(), c.bytes), (2, 60));
        c.insert(2, 0, extent(500));
        assert_eq!((c.len(), c.bytes), (1, 500));
        assert!(c.get(2, 499).is_some());
    }

    #[test]
    fn an_extent_put_twice_is_held_and_counted_once() {
        let mut c = ExtentCache::new(8, usize::MAX);
        c.insert(1, 0, extent(10));
        c.insert(1, 0, extent(10));
        assert_eq!((c.len(), c.bytes), (1, 10));
    }
}
