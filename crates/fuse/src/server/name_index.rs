//! Lookups in a large image directory answered from an index of its names.
//!
//! A walker that lists a large directory whole before it stats each entry
//! (`find -ls`, `ls -l` of one large directory) sends a LOOKUP per entry
//! (the listing went out lean, see `lean.rs`), and each would search the
//! directory again (in a large EROFS directory, a binary search over its
//! blocks). Once [`INDEX_AFTER`] lookups in one directory of an image have
//! gone to the format, the directory is listed once into an index of its
//! names, and its later lookups are answered from that.

use std::collections::HashMap;
use std::sync::Mutex;

use foliofs_vfs::Ino;

/// Directories whose lookups are counted at most; past that the counts
/// start again.
const COUNTED: usize = 4096;

/// Bytes of names kept in indexes at most; past it every index is
/// dropped, and lookups go to the format again.
const NAME_BYTES: usize = 32 << 20;

/// Lookups in one directory of an image answered by the format before
/// the directory is indexed.
pub(super) const INDEX_AFTER: u32 = 64;

/// The indexes of one mount's image directories looked up often.
#[derive(Debug, Default)]
pub(super) struct NameIndex {
    names: Mutex<Names>,
}

/// Lookups counted per directory, the indexes built, and the bytes of
/// their names.
#[derive(Debug, Default)]
struct Names {
    lookups: HashMap<Ino, u32>,
    indexes: HashMap<Ino, HashMap<Box<[u8]>, Ino>>,
    bytes: usize,
}

/// What an index says of a name.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Indexed {
    /// The directory has no index.
    Unknown,
    /// The name is not in the directory.
    Missing,
    /// The name is this inode.
    Found(Ino),
}

impl NameIndex {
    /// What the index of `dir`, if it has one, says of `name`.
    pub(super) fn indexed(&self, dir: Ino, name: &[u8]) -> Indexed {
        let n = self.names.lock().unwrap_or_else(|e| e.into_inner());
        match n.indexes.get(&dir) {
            None => Indexed::Unknown,
            Some(index) => index
                .get(name)
                .map_or(Indexed::Missing, |&i| Indexed::Found(i)),
        }
    }

    /// A lookup in `dir` went to the format; true when `dir` should now
    /// be indexed (once: the count starts again).
    pub(super) fn looked_up_in_format(&self, dir: Ino) -> bool {
        let mut n = self.names.lock().unwrap_or_else(|e| e.into_inner());
        if n.lookups.len() >= COUNTED && !n.lookups.contains_key(&dir) {
            n.lookups.clear();
        }
        let count = n.lookups.entry(dir).or_default();
        *count += 1;
        if *count < INDEX_AFTER {
            return false;
        }
        n.lookups.remove(&dir);
        true
    }

    /// Keeps the index of `dir`: every name it holds, with its inode.
    pub(super) fn index(&self, dir: Ino, names: Vec<(Box<[u8]>, Ino)>) {
        let bytes: usize = names.iter().map(|(name, _)| name.len()).sum();
        let mut n = self.names.lock().unwrap_or_else(|e| e.into_inner());
        if bytes > NAME_BYTES {
            return;
        }
        if n.bytes + bytes > NAME_BYTES {
            n.indexes.clear();
            n.bytes = 0;
        }
        n.bytes += bytes;
        if let Some(old) = n.indexes.insert(dir, names.into_iter().collect()) {
            n.bytes -= old.keys().map(|k| k.len()).sum::<usize>();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_looked_up_often_is_indexed_within_the_bound() {
        let l = NameIndex::default();
        assert_eq!(l.indexed(5, b"a"), Indexed::Unknown);
        for _ in 1..INDEX_AFTER {
            assert!(!l.looked_up_in_format(5));
        }
        assert!(!l.looked_up_in_format(6));
        assert!(l.looked_up_in_format(5));
        l.index(5, vec![(b"a"[..].into(), 10), (b"b"[..].into(), 11)]);
        assert_eq!(l.indexed(5, b"a"), Indexed::Found(10));
        assert_eq!(l.indexed(5, b"c"), Indexed::Missing);
        assert_eq!(l.indexed(6, b"a"), Indexed::Unknown);
        let name: Box<[u8]> = vec![b'x'; 255].into();
        for d in 0..(2 * NAME_BYTES / 255 / 1000) as u64 {
            l.index(100 + d, (0..1000).map(|i| (name.clone(), i)).collect());
        }
        assert!(l.names.lock().unwrap().bytes <= NAME_BYTES);
    }
}
