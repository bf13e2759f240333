//! The on-disk format of one object's version of the cache.
//!
//! `ROOT/<object>/<version>/` holds two files, where `<object>` hashes the
//! URL without its query string and `<version>` hashes the object's ETag
//! (or Last-Modified), the chunk size and this layout. `data` is a sparse
//! file as long as the object, each chunk at its own offset; `map` is a
//! header and then one 32-bit entry per chunk: 0 while the cache does not
//! hold the chunk, else when it was last used (seconds since 1970);
//! `sums` is a sparse file of one crc32c (little-endian) per [`PIECE`] of
//! `data`, written with the chunk and made durable before its entry.
//!
//! Sums are per piece, not per chunk, so that a read checks what it
//! returns without reading the rest of its chunk: a 128 KiB read of a
//! 4 MiB chunk would otherwise read and sum 32 times what it asked for.
//! They live beside the map, not in it, because every eviction reads
//! every map whole.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use sha2::Digest;

/// The layout, part of each version directory's name: 1 and 2 were a
/// file per chunk (1 with a checksummed header, 2 synced and renamed), 3
/// the sparse file without sums.
pub(super) const LAYOUT: u32 = 4;
/// Bytes of `data` per sum: the page, so that an unaligned read reads at
/// most two pages more than it asked for.
pub(super) const PIECE: u64 = 4096;
const MAGIC: &[u8; 8] = b"foliofsC";
/// The map's header: magic, object size, chunk size, layout.
pub(super) const HEADER: u64 = 24;
/// An entry held in memory only: written to `data`, not yet durable.
/// Never on the disk, so a stamp above it is a committed chunk.
pub(super) const PENDING: u32 = 1;

/// Where chunk `index`'s entry lies in the map.
pub(super) fn entry_at(index: u64) -> u64 {
    HEADER + 4 * index
}

/// The object's directory under `root`, and its version's inside it.
pub(super) fn dirs(root: &Path, identity: &str, version: &str, chunk: u32) -> (PathBuf, PathBuf) {
    let object = root.join(hex_digest(identity));
    let dir = object.join(hex_digest(&format!("{version}\n{chunk}\n{LAYOUT}")));
    (object, dir)
}

pub(super) fn hex_digest(text: &str) -> String {
    let d = sha2::Sha256::digest(text.as_bytes());
    d[..16].iter().map(|b| format!("{b:02x}")).collect()
}

/// Now as an entry: never 0 or [`PENDING`], which mean something else.
pub(super) fn now_stamp() -> u32 {
    let secs = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    u32::try_from(secs).unwrap_or(u32::MAX).max(PENDING + 1)
}

/// The map's header for an object of `size` bytes in chunks of `chunk`.
pub(super) fn header(size: u64, chunk: u64) -> [u8; HEADER as usize] {
    let mut h = [0u8; HEADER as usize];
    h[..8].copy_from_slice(MAGIC);
    h[8..16].copy_from_slice(&size.to_le_bytes());
    h[16..20].copy_from_slice(&(chunk as u32).to_le_bytes());
    h[20..24].copy_from_slice(&LAYOUT.to_le_bytes());
    h
}

/// A map's object size, chunk size and entries, when it is whole.
pub(super) fn parse_map(bytes: &[u8]) -> Option<(u64, u64, Vec<u32>)> {
    let h = bytes.get(..HEADER as usize)?;
    if &h[..8] != MAGIC || h[20..24] != LAYOUT.to_le_bytes() {
        return None;
    }
    let size = u64::from_le_bytes(h[8..16].try_into().ok()?);
    let chunk = u64::from(u32::from_le_bytes(h[16..20].try_into().ok()?));
    let entries = &bytes[HEADER as usize..];
    if chunk == 0 || entries.len() as u64 != size.div_ceil(chunk) * 4 {
        return None;
    }
    let stamps = entries
        .chunks_exact(4)
        .map(|e| u32::from_le_bytes(e.try_into().unwrap()))
        .collect();
    Some((size, chunk, stamps))
}

/// Where the sum of the piece holding `offset` of the object lies in
/// `sums`.
pub(super) fn sum_at(offset: u64) -> u64 {
    offset / PIECE * 4
}

/// The bytes of `sums` for `bytes`, which start at a piece boundary: one
/// crc32c per piece, the last piece possibly short.
pub(super) fn piece_sums(bytes: &[u8]) -> Vec<u8> {
    bytes
        .chunks(PIECE as usize)
        .flat_map(|p| crc32c::crc32c(p).to_le_bytes())
        .collect()
}

/// Bytes of chunk `index`: the last one may be short.
pub(super) fn chunk_len(size: u64, chunk: u64, index: u64) -> u64 {
    chunk.min(size - index * chunk)
}

/// Sorted chunk indexes as half-open runs of consecutive ones.
pub(super) fn runs(indexes: &[u64]) -> Vec<(u64, u64)> {
    let mut sorted = indexes.to_vec();
    sorted.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for i in sorted {
        match out.last_mut() {
            Some((_, end)) if *end == i => *end = i + 1,
            Some((_, end)) if *end > i => {}
            _ => out.push((i, i + 1)),
        }
    }
    out
}
