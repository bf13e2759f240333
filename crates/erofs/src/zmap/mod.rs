//! Compressed files: the map header and the mapping from a file offset to
//! its compressed extent, over logical-cluster indexes (full and compact,
//! decoded in `lcluster.rs`) or extent records (`extents.rs`). Both are
//! children of this module, which holds what they share (the header,
//! [`ZInfo`], [`ZExtent`]), so neither imports a sibling.
//!
//! The walk follows the kernel's `zmap.c` rules so the same images map the
//! same way; every step that follows a stored distance moves strictly in one
//! direction and every index read is bounds-checked, so a hostile image
//! cannot make it loop.

use foliofs_vfs::{Error, Result};

use zerocopy::{FromZeros, IntoBytes};

use crate::format::{
    z_erofs_map_header, Algorithm, Layout, ADVISE_BIG_PCLUSTER_1, ADVISE_BIG_PCLUSTER_2,
    ADVISE_EXTENTS, ADVISE_FRAGMENT_PCLUSTER, ADVISE_INLINE_PCLUSTER, ADVISE_INTERLACED_PCLUSTER,
    INCOMPAT_COMPR_CFGS, LCLUSTER_HEAD1, LCLUSTER_HEAD2, LCLUSTER_NONHEAD, LCLUSTER_PLAIN,
    MAP_FRAGMENT_INODE, MAX_DECODED, MAX_EXTENT, MAX_PCLUSTER,
};
use crate::inode::Inode;
use crate::{Corrupt, Erofs, Incompatible};

mod extents;
mod lcluster;

pub use extents::ExtentMap;
pub(crate) use extents::{running_sums, RunningSums};
use lcluster::Lcluster;

/// Per-inode compression facts from the map header.
#[derive(Clone, Debug)]
pub struct ZInfo {
    /// `ADVISE_*` bits.
    pub advise: u16,
    /// Algorithms of HEAD1 and HEAD2 clusters.
    pub algorithms: [u8; 2],
    /// log2 of the logical cluster size.
    pub lclusterbits: u32,
    /// Size of the inline last cluster (0 = none).
    pub idata_size: u16,
    /// Image position of the map header.
    pub header_pos: u64,
    compact: bool,
    total: u64,
    /// For ztailpacking: the head logical cluster of the last extent and
    /// where its inline data sits.
    tail: Option<(u64, u64)>,
    /// The file's data from some extent on lives in the packed inode.
    pub fragment: Option<Fragment>,
    /// Extent records instead of lcluster indexes (`extents.rs`).
    pub extents: Option<ExtentMap>,
}

impl ZInfo {
    /// The map of an inode with extent records.
    pub(crate) fn extents(
        advise: u16,
        lclusterbits: u32,
        header_pos: u64,
        map: ExtentMap,
    ) -> ZInfo {
        ZInfo {
            advise,
            algorithms: [0; 2],
            lclusterbits,
            idata_size: 0,
            header_pos,
            compact: false,
            total: 0,
            tail: None,
            fragment: None,
            extents: Some(map),
        }
    }
}

/// Where a file's tail (or whole data) lies in the packed inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fragment {
    /// Head logical cluster of the extent kept in the fragment; 0 means
    /// the whole file.
    pub head_lcn: u64,
    /// Byte offset in the packed inode of the extent's first byte.
    pub offset: u64,
    /// Set by the map header alone, which then has no indexes after it.
    pub header_only: bool,
}

/// How an extent's bytes are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ZFormat {
    /// Uncompressed, starting at the physical cluster's first byte.
    Shifted,
    /// Uncompressed, rotated by the extent's offset within a block.
    Interlaced,
    /// Compressed with this algorithm.
    Compressed(Algorithm),
    /// Kept in the packed inode: `pa` is the byte offset there of the
    /// extent's first byte.
    Fragment,
    /// Not stored: the extent reads as zeros (an extent record of length 0).
    Zeros,
}

/// A decompressed extent and where its source lies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ZExtent {
    /// Logical start (of the whole extent, whatever offset was asked).
    pub la: u64,
    /// Decompressed length.
    pub llen: u64,
    /// Image position of the physical cluster.
    pub pa: u64,
    /// Length of the physical cluster.
    pub plen: u64,
    /// The physical cluster is inline in the metadata (ztailpacking).
    pub inline: bool,
    /// How the cluster stores the extent.
    pub format: ZFormat,
    /// The extent is a prefix of what the cluster decodes to (dedupe): the
    /// stream goes on past `llen` and is cut there.
    pub partial: bool,
}

impl ZExtent {
    /// The tail of `inode` from `la` on, kept at `offset` of the packed
    /// inode.
    pub(crate) fn fragment(inode: &Inode, la: u64, offset: u64) -> ZExtent {
        ZExtent {
            la,
            llen: inode.size - la,
            pa: offset,
            plen: inode.size - la,
            inline: false,
            format: ZFormat::Fragment,
            partial: false,
        }
    }
}

impl Erofs {
    /// Reads the map header of compressed `inode`.
    pub(crate) fn zinfo(&self, inode: &Inode) -> Result<ZInfo> {
        let header_pos = inode.trailer_pos().div_ceil(8) * 8;
        let mut h = z_erofs_map_header::new_zeroed();
        self.meta_of(inode, header_pos, h.as_mut_bytes())?;
        let nid = inode.nid;
        let bad = |kind: Corrupt| Error::corrupt(header_pos, kind);
        let word = h.word();
        let advise = h.h_advise.get();
        let whole_fragment = word & MAP_FRAGMENT_INODE != 0;
        let uses_fragment = whole_fragment || advise & ADVISE_FRAGMENT_PCLUSTER != 0;
        // Fragments live in the packed inode: one of its own would make
        // reading it read itself.
        if uses_fragment && self.sb.packed_nid == nid {
            return Err(bad(Corrupt::PackedInodeFragment { nid }));
        }
        if whole_fragment {
            // Nothing else in the header means anything, and no indexes
            // follow.
            return Ok(ZInfo {
                advise: 0,
                algorithms: [0; 2],
                lclusterbits: u32::from(self.sb.blkszbits),
                idata_size: 0,
                header_pos,
                compact: false,
                total: 0,
                tail: None,
                fragment: Some(Fragment {
                    head_lcn: 0,
                    offset: word & !MAP_FRAGMENT_INODE,
                    header_only: true,
                }),
                extents: None,
            });
        }
        if inode.layout == Layout::CompressedFull && advise & ADVISE_EXTENTS != 0 {
            return self.ext_zinfo(inode, header_pos, &h);
        }
        let algorithms = [h.h_algorithmtype & 15, h.h_algorithmtype >> 4];
        let lclusterbits = u32::from(self.sb.blkszbits) + u32::from(h.h_clusterbits & 15);
        let compact = inode.layout == Layout::CompressedCompact;
        let big = advise & (ADVISE_BIG_PCLUSTER_1 | ADVISE_BIG_PCLUSTER_2) != 0;
        if big && !self.sb.has_incompat(INCOMPAT_COMPR_CFGS) {
            return Err(bad(Corrupt::BigPclusterWithoutFeature { nid }));
        }
        if compact && (advise & ADVISE_BIG_PCLUSTER_1 == 0) != (advise & ADVISE_BIG_PCLUSTER_2 == 0)
        {
            return Err(bad(Corrupt::CompactBigPclusterFlags { nid }));
        }
        // Logical clusters above the largest physical cluster the kernel
        // takes (1 MiB) would let one index claim buffers of gigabytes.
        if lclusterbits > 20 {
            return Err(bad(Corrupt::LclusterTooLarge { nid, lclusterbits }));
        }
        if compact && lclusterbits > 14 {
            return Err(bad(Corrupt::CompactLclusterTooLarge { nid, lclusterbits }));
        }
        // The first word holds the fragment offset when there is a
        // fragment, so a fragment rules out an inline tail.
        let idata_size = if advise & ADVISE_INLINE_PCLUSTER != 0 && !uses_fragment {
            h.h_idata_size()
        } else {
            0
        };
        let total = inode.size.div_ceil(1u64 << lclusterbits);
        // Every lcluster has an index of at least two bytes in the image: a
        // size the indexes cannot back is damage, found before any walk.
        let min_index = if compact { 2 } else { 8 };
        let need = total
            .checked_mul(min_index)
            .and_then(|n| n.checked_add(header_pos + size_of::<z_erofs_map_header>() as u64));
        if need.is_none_or(|end| end > self.meta_limit(inode)) {
            return Err(bad(Corrupt::IndexesOutOfImage {
                nid,
                size: inode.size,
                indexes: total,
            }));
        }
        let mut z = ZInfo {
            advise,
            algorithms,
            lclusterbits,
            idata_size,
            header_pos,
            compact,
            total,
            tail: None,
            fragment: None,
            extents: None,
        };
        if uses_fragment && inode.size > 0 {
            // The extent holding the last byte is the fragment; full
            // indexes keep the offset's high word in that head's block
            // address.
            let last = (inode.size - 1) >> lclusterbits;
            let m = self.load_lcluster(inode, &z, last, false)?;
            let head = self.lookback_from(inode, &z, m, inode.size - 1)?;
            let mut offset = u64::from(h.h_u.get());
            if !compact {
                offset |= head.pblk << 32;
            }
            z.fragment = Some(Fragment {
                head_lcn: head.lcn,
                offset,
                header_only: false,
            });
        }
        if idata_size != 0 && inode.size > 0 {
            // The inline tail sits right after the index pack holding the
            // last logical cluster.
            let last = (inode.size - 1) >> lclusterbits;
            let m = self.load_lcluster(inode, &z, last, false)?;
            let inline_pos = m.nextpackoff;
            let head = self.lookback_from(inode, &z, m, inode.size - 1)?;
            z.tail = Some((head.lcn, inline_pos));
        }
        Ok(z)
    }

    /// From the lcluster `m` holding offset `ofs`, finds the head of the
    /// extent holding `ofs` (the kernel's lookback).
    fn lookback_from(&self, inode: &Inode, z: &ZInfo, m: Lcluster, ofs: u64) -> Result<Lcluster> {
        let endoff = (ofs & ((1u64 << z.lclusterbits) - 1)) as u32;
        let mut distance = match m.kind {
            LCLUSTER_PLAIN | LCLUSTER_HEAD1 | LCLUSTER_HEAD2 => {
                if endoff >= m.clusterofs {
                    return Ok(m);
                }
                if m.lcn == 0 {
                    return Err(Error::corrupt(
                        m.pos,
                        Corrupt::FirstLclusterMidCluster { nid: inode.nid },
                    ));
                }
                1
            }
            _ => m.delta[0],
        };
        let mut cur = m;
        loop {
            if distance == 0 || u64::from(distance) > cur.lcn {
                return Err(Error::corrupt(
                    cur.pos,
                    Corrupt::LookbackDistance {
                        nid: inode.nid,
                        lcn: cur.lcn,
                        distance,
                    },
                ));
            }
            let prev = self.load_lcluster(inode, z, cur.lcn - u64::from(distance), false)?;
            // A CBLKCNT seen on the way belongs to the head found here.
            let blks = cur.compressedblks;
            cur = prev;
            match cur.kind {
                LCLUSTER_NONHEAD => distance = cur.delta[0],
                _ => {
                    if cur.compressedblks == 0 && distance == 1 {
                        cur.compressedblks = blks;
                    }
                    return Ok(cur);
                }
            }
        }
    }

    /// Maps byte `ofs` (< size) of compressed `inode` to its whole extent.
    pub(crate) fn zmap(&self, inode: &Inode, z: &ZInfo, ofs: u64) -> Result<ZExtent> {
        let fragment = |la: u64, offset: u64| ZExtent::fragment(inode, la, offset);
        if let Some(m) = &z.extents {
            return self.zmap_ext(inode, z, m, ofs);
        }
        if let Some(f) = z.fragment.filter(|f| f.head_lcn == 0) {
            return Ok(fragment(0, f.offset));
        }
        let bits = z.lclusterbits;
        let first = self.load_lcluster(inode, z, ofs >> bits, false)?;
        let head = self.lookback_from(inode, z, first, ofs)?;
        let la = (head.lcn << bits) | u64::from(head.clusterofs);
        if let Some(f) = z.fragment.filter(|f| f.head_lcn == head.lcn) {
            if la >= inode.size {
                return Err(Error::corrupt(
                    head.pos,
                    Corrupt::EmptyExtent { nid: inode.nid, la },
                ));
            }
            return Ok(fragment(la, f.offset));
        }
        let tail_inline = matches!(z.tail, Some((lcn, _)) if lcn == head.lcn);
        let (pa, plen, inline) = if tail_inline {
            let pos = z.tail.map(|t| t.1).unwrap_or(0);
            let bs = u64::from(self.sb.block_size());
            if pos % bs + u64::from(z.idata_size) > bs {
                return Err(Error::corrupt(
                    pos,
                    Corrupt::CompressedTailCrossesBlock { nid: inode.nid },
                ));
            }
            (pos, u64::from(z.idata_size), true)
        } else {
            let blks = self.compressed_blocks(inode, z, &head)?;
            let pa = head
                .pblk
                .checked_mul(u64::from(self.sb.block_size()))
                .ok_or_else(|| {
                    Error::corrupt(head.pos, Corrupt::BlockAddressOverflow { nid: inode.nid })
                })?;
            (pa, blks, false)
        };
        let llen = self.extent_len(inode, z, &head, la)?;
        let format = if head.kind == LCLUSTER_PLAIN {
            if llen > plen {
                return Err(Error::corrupt(
                    head.pos,
                    Corrupt::PlainExtentOverrun {
                        nid: inode.nid,
                        llen,
                        plen,
                    },
                ));
            }
            if z.advise & ADVISE_INTERLACED_PCLUSTER != 0 {
                ZFormat::Interlaced
            } else {
                ZFormat::Shifted
            }
        } else {
            let alg = if head.kind == LCLUSTER_HEAD2 {
                z.algorithms[1]
            } else {
                z.algorithms[0]
            };
            if self.sb.available_algorithms() & (1 << alg) == 0 {
                return Err(Error::corrupt(
                    head.pos,
                    Corrupt::UnlistedAlgorithm {
                        nid: inode.nid,
                        algorithm: alg,
                    },
                ));
            }
            let Some(algorithm) = Algorithm::from_number(alg) else {
                return Err(Error::incompatible(Incompatible::ExtentAlgorithm {
                    nid: inode.nid,
                    algorithm: alg,
                }));
            };
            if algorithm == Algorithm::Lz4 {
                // LZ4 expands at most 255-fold: an extent longer than its
                // cluster could ever decode to is damage, and refusing it
                // keeps every buffer within what the image backs.
                if llen > plen * 255 + 64 {
                    return Err(Error::corrupt(
                        head.pos,
                        Corrupt::Lz4Ratio {
                            nid: inode.nid,
                            llen,
                            plen,
                        },
                    ));
                }
            } else if llen > MAX_DECODED as u64 {
                // The other algorithms expand much further; the kernel's
                // limit on one cluster's output bounds them instead.
                return Err(Error::corrupt(
                    head.pos,
                    Corrupt::DecodedTooLong {
                        nid: inode.nid,
                        la,
                        llen,
                    },
                ));
            }
            ZFormat::Compressed(algorithm)
        };
        Ok(ZExtent {
            la,
            llen,
            pa,
            plen,
            inline,
            format,
            partial: head.partial,
        })
    }

    /// Size in bytes of the physical cluster headed by `head`: one block,
    /// unless its kind may span several (HEAD1 with BIG_PCLUSTER_1; HEAD2
    /// and uncompressed heads with BIG_PCLUSTER_2), as the kernel sizes it.
    fn compressed_blocks(&self, inode: &Inode, z: &ZInfo, head: &Lcluster) -> Result<u64> {
        let big = match head.kind {
            LCLUSTER_HEAD1 => z.advise & ADVISE_BIG_PCLUSTER_1 != 0,
            _ => z.advise & ADVISE_BIG_PCLUSTER_2 != 0,
        };
        if !big {
            return Ok(u64::from(self.sb.block_size()));
        }
        let mut blks = head.compressedblks;
        if blks == 0 {
            let next = head.lcn + 1;
            if next >= z.total {
                blks = 1;
            } else {
                let m = self.load_lcluster(inode, z, next, false)?;
                match m.kind {
                    LCLUSTER_NONHEAD => {
                        if m.delta[0] != 1 || m.compressedblks == 0 {
                            return Err(Error::corrupt(
                                m.pos,
                                Corrupt::MissingBlockCount {
                                    nid: inode.nid,
                                    lcn: head.lcn,
                                },
                            ));
                        }
                        blks = m.compressedblks;
                    }
                    _ => blks = 1,
                }
            }
        }
        let bytes = u64::from(blks) << self.sb.blkszbits;
        if bytes > MAX_PCLUSTER {
            return Err(Error::corrupt(
                head.pos,
                Corrupt::PclusterTooLarge {
                    nid: inode.nid,
                    bytes,
                },
            ));
        }
        Ok(bytes)
    }

    /// Decompressed length of the extent starting at `la` with head `head`:
    /// up to the next head lcluster, or the end of the file.
    fn extent_len(&self, inode: &Inode, z: &ZInfo, head: &Lcluster, la: u64) -> Result<u64> {
        let bits = z.lclusterbits;
        let mut lcn = head.lcn;
        let limit = (la + MAX_EXTENT) >> bits;
        loop {
            if lcn << bits >= inode.size {
                return Ok(inode.size - la);
            }
            if lcn > limit + 1 {
                return Err(Error::corrupt(
                    head.pos,
                    Corrupt::ExtentTooLong { nid: inode.nid, la },
                ));
            }
            let m = self.load_lcluster(inode, z, lcn, true)?;
            let step = if m.kind == LCLUSTER_NONHEAD {
                m.delta[1].max(1)
            } else if lcn != head.lcn {
                let end = (lcn << bits) + u64::from(m.clusterofs);
                if end <= la {
                    return Err(Error::corrupt(
                        m.pos,
                        Corrupt::EmptyExtent { nid: inode.nid, la },
                    ));
                }
                return Ok((end - la).min(inode.size - la));
            } else {
                1
            };
            lcn += u64::from(step);
        }
    }
}
