//! Extended attributes as the builder writes them: names split into a
//! built-in prefix index and a suffix, entries, the shared table (an
//! attribute on two or more inodes is stored once), and the in-inode name
//! filter the kernel consults before it reads any entry.

use std::collections::BTreeMap;

use xxhash_rust::xxh32::xxh32;

use zerocopy::IntoBytes;

use crate::format::{
    erofs_xattr_entry, erofs_xattr_ibody_header, xattr_prefix, XATTR_ENTRY_HEADER,
    XATTR_FILTER_BITS, XATTR_FILTER_SEED, XATTR_IBODY_HEADER, XATTR_NAME_MAX, XATTR_VALUE_MAX,
};

/// Most shared ids one inode's header counts (`h_shared_count` is a byte).
const SHARED_MAX: usize = 255;

/// The built-in prefix index of `name` and the rest of it, or `None` when
/// no built-in prefix fits (the kernel would show no such attribute).
pub(crate) fn split(name: &[u8]) -> Option<(u8, &[u8])> {
    (1..=6u8)
        .filter_map(|i| xattr_prefix(i).map(|p| (i, p)))
        .filter(|(_, p)| name.starts_with(p))
        .filter(|(_, p)| {
            // Whole names (the ACLs) match only whole; prefixes need a
            // suffix.
            if p.ends_with(b".") {
                name.len() > p.len()
            } else {
                name.len() == p.len()
            }
        })
        .max_by_key(|(_, p)| p.len())
        .map(|(i, p)| (i, &name[p.len()..]))
}

/// Checks that an attribute can be stored: a known prefix, a suffix and a
/// value within the entry's fields.
pub(crate) fn check(name: &[u8], value: &[u8]) -> Result<(), String> {
    let shown = String::from_utf8_lossy(name);
    let Some((_, suffix)) = split(name) else {
        return Err(format!(
            "xattr {shown:?}: no EROFS name prefix (user., trusted., security., \
             system.posix_acl_access/default) fits it"
        ));
    };
    if suffix.len() > XATTR_NAME_MAX {
        return Err(format!(
            "xattr {shown:?}: name past its prefix is {} bytes, at most {XATTR_NAME_MAX} fit",
            suffix.len()
        ));
    }
    if value.len() > XATTR_VALUE_MAX {
        return Err(format!(
            "xattr {shown:?}: value is {} bytes, at most {XATTR_VALUE_MAX} fit",
            value.len()
        ));
    }
    Ok(())
}

/// Bytes one entry takes, padded to 4.
pub(crate) fn entry_size(name: &[u8], value: &[u8]) -> usize {
    let (_, suffix) = split(name).expect("checked when the entry was read");
    (XATTR_ENTRY_HEADER + suffix.len() + value.len()).next_multiple_of(4)
}

fn put_entry(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    let (index, suffix) = split(name).expect("checked when the entry was read");
    let start = out.len();
    let e = erofs_xattr_entry {
        e_name_len: suffix.len() as u8,
        e_name_index: index,
        e_value_size: (value.len() as u16).into(),
    };
    out.extend_from_slice(e.as_bytes());
    out.extend_from_slice(suffix);
    out.extend_from_slice(value);
    out.resize(start + (out.len() - start).next_multiple_of(4), 0);
}

/// The in-inode body size if every attribute were inline: what a file's
/// tail is judged against while its data streams in, before sharing is
/// known (sharing only makes the body smaller).
pub(crate) fn inline_size(xattrs: &BTreeMap<Vec<u8>, Vec<u8>>) -> u64 {
    if xattrs.is_empty() {
        return 0;
    }
    XATTR_IBODY_HEADER
        + xattrs
            .iter()
            .map(|(n, v)| entry_size(n, v) as u64)
            .sum::<u64>()
}

/// The shared table: each (name, value) pair on two or more inodes, in
/// byte order, with its id (its offset in the table over 4).
pub(crate) struct Shared {
    ids: BTreeMap<(Vec<u8>, Vec<u8>), u32>,
    /// The table's bytes.
    pub bytes: Vec<u8>,
}

impl Shared {
    /// Builds the table from every inode's attributes.
    pub fn new<'a>(all: impl Iterator<Item = &'a BTreeMap<Vec<u8>, Vec<u8>>>) -> Shared {
        let mut count: BTreeMap<(&[u8], &[u8]), u32> = BTreeMap::new();
        for xattrs in all {
            for (n, v) in xattrs {
                *count.entry((n.as_slice(), v.as_slice())).or_default() += 1;
            }
        }
        let mut ids = BTreeMap::new();
        let mut bytes = Vec::new();
        for ((n, v), c) in count {
            if c >= 2 {
                ids.insert((n.to_vec(), v.to_vec()), (bytes.len() / 4) as u32);
                put_entry(&mut bytes, n, v);
            }
        }
        Shared { ids, bytes }
    }

    /// The in-inode body for `xattrs` (empty when there are none): the
    /// header with the name filter, the shared ids, then the inline
    /// entries; and whether the filter excludes any name.
    pub fn body(&self, xattrs: &BTreeMap<Vec<u8>, Vec<u8>>) -> (Vec<u8>, bool) {
        if xattrs.is_empty() {
            return (Vec::new(), false);
        }
        let mut present = 0u32;
        for n in xattrs.keys() {
            let (index, suffix) = split(n).expect("checked when the entry was read");
            let bit = xxh32(suffix, XATTR_FILTER_SEED.wrapping_add(u32::from(index)))
                & (XATTR_FILTER_BITS - 1);
            present |= 1 << bit;
        }
        let filter = !present;
        let shared: Vec<u32> = xattrs
            .iter()
            .filter_map(|(n, v)| self.ids.get(&(n.clone(), v.clone())).copied())
            .take(SHARED_MAX)
            .collect();
        let h = erofs_xattr_ibody_header {
            h_name_filter: filter.into(),
            h_shared_count: shared.len() as u8,
            ..Default::default()
        };
        let mut out = h.as_bytes().to_vec();
        for id in &shared {
            out.extend_from_slice(&id.to_le_bytes());
        }
        let mut taken = 0;
        for (n, v) in xattrs {
            if taken < shared.len() && self.ids.contains_key(&(n.clone(), v.clone())) {
                taken += 1;
                continue;
            }
            put_entry(&mut out, n, v);
        }
        (out, filter != 0)
    }
}

/// `i_xattr_icount` for a body of `size` bytes.
pub(crate) fn icount(size: usize) -> u16 {
    if size == 0 {
        0
    } else {
        ((size as u64 - XATTR_IBODY_HEADER) / 4 + 1) as u16
    }
}
