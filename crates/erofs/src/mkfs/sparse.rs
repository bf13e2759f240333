//! Sparse files (from a sparse tar entry or a source file with holes):
//! stored chunk-based where whole chunks are holes, the chunk size chosen
//! to write the fewest bytes, and refused where a made-up map would make
//! the image many times the file's data.

use std::io::Read;

use super::tree::{Body, Meta, NodeId};
use super::{data, tar, BuildError, Builder, EntryError};
use crate::format::{CHUNK_FORMAT_BLKBITS_MASK, NULL_ADDR};

impl Builder {
    /// Adds a sparse file of `size` bytes whose data fragments (`map`, in
    /// order) `r` yields one after another. Where whole chunks are holes
    /// the file is stored chunk-based with those chunks left out (the
    /// chunk size is the one that writes the fewest bytes, the index
    /// counted); where no chunk would be a hole it is an ordinary file
    /// with its holes written as zeros.
    pub(crate) fn add_sparse(
        &mut self,
        comps: &[&[u8]],
        meta: Meta,
        r: &mut dyn Read,
        map: &[(u64, u64)],
        size: u64,
        what: &dyn Fn() -> String,
    ) -> Result<NodeId, EntryError> {
        let blkszbits = self.opts.blkszbits;
        let layout = sparse_layout(map, size, blkszbits);
        let stored: u128 = map.iter().map(|f| u128::from(f.1)).sum();
        if layout.written > SPARSE_GROWTH * stored + SPARSE_SLACK {
            return Err(EntryError::Bad(format!(
                "a sparse file of {size} bytes whose {stored} bytes of data in {} fragments \
                 would take {} bytes of the image: more than {SPARSE_GROWTH} times its data \
                 and {} MiB (EROFS leaves out whole chunks only, at most {MAX_CHUNKS} a file)",
                map.len(),
                layout.written,
                SPARSE_SLACK >> 20
            )));
        }
        let Some(bits) = layout.bits else {
            let mut full = tar::sparse::Expand::new(r, map, size);
            return self.add_file(comps, meta, &mut full, size, what);
        };
        Self::check_names(comps).map_err(EntryError::Bad)?;
        let meta = self.meta(meta).map_err(EntryError::Bad)?;
        let count = size.div_ceil(1 << bits);
        let mut addrs: Vec<u32> = Vec::with_capacity(count as usize);
        let mut full = tar::sparse::Expand::new(r, map, size);
        let mut frag = 0usize;
        for k in 0..count {
            let start = k << bits;
            let end = (start + (1 << bits)).min(size);
            while frag < map.len() && map[frag].0 + map[frag].1 <= start {
                frag += 1;
            }
            let has_data = map[frag..]
                .iter()
                .take_while(|f| f.0 < end)
                .any(|f| f.1 > 0);
            if !has_data {
                addrs.push(NULL_ADDR);
                full.skip(end - start)
                    .map_err(|e| EntryError::Build(BuildError::io(what())(e)))?;
                continue;
            }
            let limit = u64::from(u32::MAX) << blkszbits;
            if (self.w.next_block << blkszbits) + (end - start) > limit {
                return Err(EntryError::Bad(format!(
                    "{size} bytes do not fit an image of 2^32 {}-byte blocks",
                    1u64 << blkszbits
                )));
            }
            let d = self
                .w
                .file(&mut (&mut full).take(end - start), end - start, None, what)
                .map_err(EntryError::Build)?;
            addrs.push(d.blkaddr as u32);
            self.data_bytes += end - start;
        }
        let off = self
            .w
            .spill_chunks(&addrs)
            .map_err(|e| EntryError::Build(BuildError::io("writing the spill file")(e)))?;
        let d = data::FileData {
            chunks: Some((bits, off, count as u32)),
            ..data::FileData::placed_later(size)
        };
        self.tree
            .insert(comps, meta, Body::File(d))
            .map_err(EntryError::Bad)
    }
}

/// How a sparse file is stored: in chunks of `1 << bits` bytes with the
/// holes left out, or (`bits` `None`) as an ordinary file, its holes
/// written as zeros; and the bytes of data that writes.
struct SparseLayout {
    bits: Option<u8>,
    written: u128,
}

/// The layout to store a sparse file with: the chunk size that writes the
/// fewest bytes, counting 4 bytes of index a chunk and whole chunks
/// wherever a fragment touches one (ties to the larger chunk); an
/// ordinary file when that leaves no chunk a hole, since chunks then gain
/// nothing.
fn sparse_layout(map: &[(u64, u64)], size: u64, blkszbits: u8) -> SparseLayout {
    let plain = SparseLayout {
        bits: None,
        written: u128::from(size),
    };
    if size == 0 {
        return plain;
    }
    let top = blkszbits + CHUNK_FORMAT_BLKBITS_MASK as u8;
    let mut best: Option<(u128, u8, bool, u128)> = None;
    for bits in (blkszbits..=top.min(63)).rev() {
        let count = size.div_ceil(1 << bits);
        if count > MAX_CHUNKS {
            continue;
        }
        let (mut with_data, mut written) = (0u64, 0u128);
        let mut last: Option<u64> = None;
        for &(off, len) in map.iter().filter(|f| f.1 > 0) {
            let (first, end) = (off >> bits, (off + len - 1) >> bits);
            let from = first.max(last.map_or(0, |l| l + 1));
            if from <= end {
                let n = end - from + 1;
                with_data += n;
                written += u128::from(n) << bits;
                if end == count - 1 {
                    // The file's last chunk is written only to its end.
                    let tail = (size - (end << bits)).next_multiple_of(1 << blkszbits);
                    written -= (1u128 << bits) - u128::from(tail);
                }
            }
            last = Some(last.map_or(end, |l| l.max(end)));
        }
        let cost = u128::from(count) * 4 + written;
        if best.is_none_or(|b| cost < b.0) {
            best = Some((cost, bits, with_data < count, written));
        }
    }
    match best {
        Some((_, bits, true, written)) => SparseLayout {
            bits: Some(bits),
            written,
        },
        _ => plain,
    }
}

/// Most chunks a sparse file is cut into: its block map (4 bytes a chunk)
/// is kept whole while the file is written, and sits after its inode.
const MAX_CHUNKS: u64 = 1 << 22;

/// A sparse file may take at most this many times its data, plus
/// [`SPARSE_SLACK`], of the image. Files from a file system have data in
/// whole blocks and take about their data; only a map made up (one byte
/// of data every few terabytes) takes more, and a 3 KiB tar must not
/// write gigabytes of zeros.
const SPARSE_GROWTH: u128 = 16;
/// See [`SPARSE_GROWTH`].
const SPARSE_SLACK: u128 = 64 << 20;
