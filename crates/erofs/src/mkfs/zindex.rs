//! The lcluster indexes of a compressed file: where each block-sized
//! logical cluster (lcluster) of the file starts in which pcluster.
//!
//! Every lcluster gets an entry: a head (the first lcluster of an
//! extent, with the extent's offset in it) or a non-head (with its
//! distances back to its head and on to the next). Two layouts hold
//! them after the inode and its xattrs:
//! - full: 8 bytes an entry, each head with its pcluster's address;
//! - compact, what mkfs.erofs writes by default: packs of 2 entries in
//!   8 bytes or 16 in 32 bytes, each pack with one 32-bit base address
//!   from which a reader counts the pclusters before an entry. That
//!   only works because pclusters follow each other in the image.
//!
//! Non-head fields that do not fit are clamped as the kernel expects:
//! it walks on from where a shortened distance lands.

use zerocopy::IntoBytes;

use crate::format::{
    compact_lobits, compact_split, put_compact_base, put_compact_entry, z_erofs_lcluster_index,
    z_erofs_map_header, Algorithm, ADVISE_BIG_PCLUSTER_1, ADVISE_BIG_PCLUSTER_2,
    ADVISE_COMPACTED_2B, FULL_INDEX_START, LCLUSTER_HEAD1, LCLUSTER_NONHEAD, LCLUSTER_PLAIN,
    LI_D0_CBLKCNT,
};

use super::compress::Pcluster;

/// How a compressed file's indexes are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Shape {
    pub blkszbits: u8,
    /// Pclusters may be larger than a block.
    pub big: bool,
    pub algorithm: Algorithm,
    /// Compact packs rather than full entries.
    pub compact: bool,
}

/// One lcluster's entry.
#[derive(Clone, Copy)]
enum Entry {
    Head {
        raw: bool,
        /// The extent's offset in the lcluster.
        ofs: u16,
        /// The pcluster's blocks.
        blocks: u16,
    },
    NonHead {
        /// Lclusters back to the head.
        d0: u64,
        /// Lclusters on to the next head (or past the end).
        d1: u64,
        /// The head's pcluster's blocks.
        blocks: u16,
    },
}

fn entries(size: u64, extents: &[Pcluster], blkszbits: u8) -> Vec<Entry> {
    let n = size.div_ceil(1 << blkszbits);
    let mask = (1u64 << blkszbits) - 1;
    let mut out = Vec::with_capacity(n as usize);
    let (mut next, mut cur) = (0usize, 0usize);
    for j in 0..n {
        if next < extents.len() && extents[next].la >> blkszbits == j {
            let e = extents[next];
            out.push(Entry::Head {
                raw: e.raw,
                ofs: (e.la & mask) as u16,
                blocks: e.blocks,
            });
            cur = next;
            next += 1;
            debug_assert!(next == extents.len() || extents[next].la >> blkszbits > j);
            continue;
        }
        let ahead = extents.get(next).map_or(n, |e| e.la >> blkszbits);
        out.push(Entry::NonHead {
            d0: j - (extents[cur].la >> blkszbits),
            d1: ahead - j,
            blocks: extents[cur].blocks,
        });
    }
    out
}

fn head_type(raw: bool) -> u8 {
    if raw {
        LCLUSTER_PLAIN
    } else {
        LCLUSTER_HEAD1
    }
}

/// The map header: no inline data, the advise bits, the algorithm of
/// HEAD1 extents (HEAD2 unused), lclusters of one block.
fn header(s: &Shape) -> z_erofs_map_header {
    let mut advise = 0;
    if s.big {
        advise |= ADVISE_BIG_PCLUSTER_1;
        if s.compact {
            // The kernel wants both for compact indexes.
            advise |= ADVISE_BIG_PCLUSTER_2;
        }
    }
    if s.compact {
        advise |= ADVISE_COMPACTED_2B;
    }
    z_erofs_map_header {
        h_advise: advise.into(),
        h_algorithmtype: s.algorithm.number(),
        ..Default::default()
    }
}

/// Bytes of the map header, after which compact indexes start.
const HEADER_SIZE: u64 = size_of::<z_erofs_map_header>() as u64;
/// Bytes of a full index.
const FULL_INDEX_SIZE: u64 = size_of::<z_erofs_lcluster_index>() as u64;

/// How a compact index area splits into 4-byte entries before the first
/// 32-byte boundary, 2-byte entries (in packs of 16) and 4-byte ones
/// after, for `n` lclusters whose packs start `mpos` bytes (mod 32) from
/// a 32-byte boundary: the builder always asks for 2-byte entries.
fn split(n: u64, mpos: u64) -> (u64, u64, u64) {
    compact_split(n, mpos, true)
}

/// Bytes of a compressed file's indexes, header included, for a file of
/// `size` bytes whose inode and xattrs take `head` bytes (the area starts
/// at the next multiple of 8).
pub(crate) fn len(size: u64, head: u64, s: &Shape) -> u64 {
    let n = size.div_ceil(1 << s.blkszbits);
    if !s.compact {
        // The header, 8 reserved bytes, 8 an entry.
        return FULL_INDEX_START + FULL_INDEX_SIZE * n;
    }
    let (ini, two, tail) = split(n, head.next_multiple_of(8) + HEADER_SIZE);
    HEADER_SIZE + 4 * ini + 2 * two + 4 * (tail + tail % 2)
}

/// The indexes of a compressed file of `size` bytes whose pclusters
/// start at block `blkaddr`, one after another; `head` as for [`len`].
pub(crate) fn encode(
    size: u64,
    blkaddr: u64,
    extents: &[Pcluster],
    head: u64,
    s: &Shape,
) -> Vec<u8> {
    let es = entries(size, extents, s.blkszbits);
    let mut out = Vec::with_capacity(len(size, head, s) as usize);
    out.extend_from_slice(header(s).as_bytes());
    if s.compact {
        compact(
            &mut out,
            &es,
            blkaddr,
            head.next_multiple_of(8) + HEADER_SIZE,
            s,
        );
    } else {
        out.resize(FULL_INDEX_START as usize, 0);
        full(&mut out, &es, blkaddr, s.big);
    }
    debug_assert_eq!(out.len() as u64, len(size, head, s));
    out
}

fn full(out: &mut Vec<u8>, es: &[Entry], blkaddr: u64, big: bool) {
    let mut pblk = blkaddr;
    for e in es {
        match *e {
            Entry::Head { raw, ofs, blocks } => {
                let di = z_erofs_lcluster_index {
                    di_advise: u16::from(head_type(raw)).into(),
                    di_clusterofs: ofs.into(),
                    di_u: (pblk as u32).into(),
                };
                out.extend_from_slice(di.as_bytes());
                pblk += u64::from(blocks);
            }
            Entry::NonHead { d0, d1, blocks } => {
                let delta0 = if d0 == 1 && big {
                    u32::from(blocks) | LI_D0_CBLKCNT
                } else {
                    // A distance that would read as a block count is
                    // shortened: the lookback goes on from where it lands.
                    d0.min(u64::from(LI_D0_CBLKCNT) - 1) as u32
                };
                let delta1 = d1.min(u64::from(u16::MAX)) as u16;
                let di = z_erofs_lcluster_index {
                    di_advise: u16::from(LCLUSTER_NONHEAD).into(),
                    di_clusterofs: 0.into(),
                    di_u: z_erofs_lcluster_index::di_u_delta([delta0 as u16, delta1]),
                };
                out.extend_from_slice(di.as_bytes());
            }
        }
    }
}

/// Compact packs. Each entry is `lo` (the head's offset, or a non-head's
/// distance) in the low `lobits` bits and its type in the 2 above, at
/// `encodebits` a step; a pack's last 4 bytes are its base address.
///
/// A reader finds a head's pcluster by counting back through its pack:
/// - one-block pclusters: base + 1 + the heads before it in the pack, so
///   the base is the first pcluster's address less one, plus every head
///   in earlier packs;
/// - big pclusters: base + the blocks of the pclusters that end (at
///   their block-count entry, the first non-head after the head, or at
///   the head itself for a pcluster of one lcluster, which is one block)
///   before it in the pack; so the base adds those that end in earlier
///   packs.
///
/// A pack's last non-head holds its distance on (`d1`), not back: the
/// reader takes the distance back from the entry before it.
fn compact(out: &mut Vec<u8>, es: &[Entry], blkaddr: u64, mpos: u64, s: &Shape) {
    let n = es.len() as u64;
    let (ini, two, tail) = split(n, mpos);
    let lobits = compact_lobits(u32::from(s.blkszbits));
    let lo_max = (1u64 << lobits) - 1;
    // Heads (one-block) or ending pclusters' blocks (big) before each
    // entry.
    let mut counted = 0u64;
    let mut at = 0usize;
    let mut runs = Vec::new();
    if ini > 0 {
        runs.push((ini as usize, 2usize));
    }
    for _ in 0..two / 16 {
        runs.push((16, 16));
    }
    if tail > 0 {
        runs.push(((tail + tail % 2) as usize, 2));
    }
    for (count, vcnt) in runs {
        for first in (at..at + count).step_by(vcnt) {
            let bytes = if vcnt == 2 { 8 } else { 32 };
            let base = if s.big {
                blkaddr + counted
            } else {
                (blkaddr + counted).wrapping_sub(1)
            };
            let mut pack = vec![0u8; bytes];
            for i in 0..vcnt {
                let Some(&e) = es.get(first + i) else {
                    // Padding after the last lcluster: PLAIN, offset 0.
                    continue;
                };
                let (t, lo) = match e {
                    Entry::Head { raw, ofs, blocks } => {
                        let ends_here =
                            !matches!(es.get(first + i + 1), Some(Entry::NonHead { d0: 1, .. }));
                        if !s.big {
                            counted += 1;
                        } else if ends_here {
                            debug_assert_eq!(blocks, 1);
                            counted += 1;
                        }
                        (head_type(raw), u64::from(ofs))
                    }
                    Entry::NonHead { d0, d1, blocks } => {
                        let lo = if s.big && d0 == 1 {
                            counted += u64::from(blocks);
                            u64::from(blocks) | u64::from(LI_D0_CBLKCNT)
                        } else if i + 1 == vcnt {
                            d1.min(u64::from(LI_D0_CBLKCNT) - 1)
                        } else {
                            d0.min(u64::from(LI_D0_CBLKCNT) - 1)
                        };
                        (LCLUSTER_NONHEAD, lo)
                    }
                };
                debug_assert!(lo <= lo_max);
                put_compact_entry(&mut pack, vcnt, lobits, i, lo as u32, t);
            }
            put_compact_base(&mut pack, base as u32);
            out.extend_from_slice(&pack);
        }
        at += count;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(blkszbits: u8, big: bool) -> Shape {
        Shape {
            blkszbits,
            big,
            algorithm: Algorithm::Lz4,
            compact: true,
        }
    }

    fn ext(la: u64, blocks: u16, raw: bool) -> Pcluster {
        Pcluster { la, blocks, raw }
    }

    /// The packs after the 8-byte header, as hex words.
    fn packs(got: &[u8]) -> Vec<String> {
        got[8..]
            .chunks(4)
            .map(|c| c.iter().map(|b| format!("{b:02x}")).collect())
            .collect()
    }

    #[test]
    fn one_block_pclusters_at_4k_in_4_byte_packs() {
        // Five lclusters after a compact inode (packs from byte 40, so 6
        // initial 4-byte entries, more than there are: all 4-byte).
        let es = [
            ext(0, 1, false),
            ext(4096 + 1000, 1, false),
            ext(2 * 4096 + 3808, 1, false),
            ext(4 * 4096 + 3996, 1, true),
        ];
        let size = 4 * 4096 + 4000;
        let got = encode(size, 1000, &es, 32, &shape(12, false));
        assert_eq!(&got[..8], &[0, 0, 0, 0, 1, 0, 0, 0]);
        assert_eq!(got.len() as u64, len(size, 32, &shape(12, false)));
        // Each pack's base is the address before its first head; a
        // pack's last non-head holds its distance on.
        assert_eq!(
            packs(&got),
            ["0010e813", "e7030000", "e01e0120", "e9030000", "9c0f0000", "ea030000"]
        );
    }

    #[test]
    fn one_block_pclusters_at_512_bytes_in_2_byte_packs() {
        // 40 lclusters, a one-block pcluster every 4: 6 initial 4-byte
        // entries, 32 in two 2-byte packs, 2 in a last 4-byte pack.
        let es: Vec<Pcluster> = (0..10).map(|k| ext(k * 4 * 512, 1, false)).collect();
        let size = 40 * 512;
        let s = shape(9, false);
        let got = encode(size, 100, &es, 32, &s);
        assert_eq!(got.len() as u64, 8 + 24 + 64 + 8);
        let run = [
            "02e00008", "00058002", "e0000800", "058002e0", "00080005", "8002e000", "08000d80",
        ];
        let mut want: Vec<&str> = vec![
            "00100320", "63000000", "02200120", "64000000", "00100320", "64000000",
        ];
        want.extend(run);
        want.push("65000000");
        want.extend(run);
        want.extend(["69000000", "02200120", "6d000000"]);
        assert_eq!(packs(&got), want);
    }

    #[test]
    fn big_pclusters_count_blocks_from_their_first_non_head() {
        // A: lclusters 0-4 in 3 blocks; B: lclusters 5-6 in 1 block.
        let es = [ext(0, 3, false), ext(5 * 4096, 1, false)];
        let size = 7 * 4096;
        let s = shape(12, true);
        let got = encode(size, 1000, &es, 32, &s);
        assert_eq!(&got[..8], &[0, 0, 0, 0, 7, 0, 0, 0]);
        assert_eq!(
            packs(&got),
            [
                "00100328", "e8030000", "02200220", "eb030000", "04200010", "eb030000", "01280000",
                "eb030000"
            ]
        );
    }

    #[test]
    fn the_2_byte_run_starts_at_a_32_byte_boundary_whatever_the_xattrs() {
        // Packs from byte 40, 56, 64 and 72 (inode and xattrs of 32, 48,
        // 56 and 64 bytes): 6, 2, 0 and 6 initial entries.
        for (head, ini) in [(32u64, 6u64), (44, 2), (56, 0), (64, 6)] {
            let mpos = head.next_multiple_of(8) + 8;
            let (i, two, tail) = split(100, mpos);
            assert_eq!(i, ini, "{head}");
            assert_eq!((mpos + 4 * i) % 32, 0, "{head}");
            assert_eq!(i + two + tail, 100);
            assert_eq!(two % 16, 0);
            assert!(tail < 16);
        }
        // Fewer lclusters than the initial run: all 4-byte.
        assert_eq!(split(3, 40), (0, 0, 3));
    }
}
