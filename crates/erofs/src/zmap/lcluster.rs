//! Logical-cluster indexes, full (8 bytes each) and compact (packs of 2-
//! or 4-byte entries with a shared base block), decoded one lcluster at a
//! time as the kernel's `zmap.c` decodes them; the walk over them is
//! `zmap`'s.

use foliofs_vfs::{Error, Result};

use super::ZInfo;
use zerocopy::{FromZeros, IntoBytes};

use crate::format::{
    compact_base, compact_entry, compact_lobits, compact_split, z_erofs_lcluster_index,
    z_erofs_map_header, ADVISE_BIG_PCLUSTER_1, ADVISE_BIG_PCLUSTER_2, ADVISE_COMPACTED_2B,
    FULL_INDEX_START, LCLUSTER_NONHEAD, LI_D0_CBLKCNT, LI_PARTIAL_REF,
};
use crate::inode::Inode;
use crate::{Corrupt, Erofs, Incompatible};

/// One decoded logical-cluster index.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Lcluster {
    pub(super) lcn: u64,
    pub(super) kind: u8,
    pub(super) clusterofs: u32,
    pub(super) pblk: u64,
    pub(super) delta: [u32; 2],
    pub(super) compressedblks: u32,
    /// Image position just past this index's pack (ztailpacking data follows
    /// the last pack).
    pub(super) nextpackoff: u64,
    /// Image position of the index, for error messages.
    pub(super) pos: u64,
    /// A head whose extent is a prefix of its cluster's output.
    pub(super) partial: bool,
}

impl Erofs {
    /// Decodes the index of logical cluster `lcn` of `inode` (with
    /// `lookahead`, a NONHEAD's distance to the next head too, which
    /// compact indexes only give by reading on).
    pub(super) fn load_lcluster(
        &self,
        inode: &Inode,
        z: &ZInfo,
        lcn: u64,
        lookahead: bool,
    ) -> Result<Lcluster> {
        if lcn >= z.total {
            return Err(Error::corrupt(
                z.header_pos,
                Corrupt::LclusterBeyondFile {
                    nid: inode.nid,
                    lcn,
                    total: z.total,
                },
            ));
        }
        if z.compact {
            self.load_compact(inode, z, lcn, lookahead)
        } else {
            self.load_full(inode, z, lcn)
        }
    }

    fn load_full(&self, inode: &Inode, z: &ZInfo, lcn: u64) -> Result<Lcluster> {
        let size = size_of::<z_erofs_lcluster_index>() as u64;
        let pos = z.header_pos + FULL_INDEX_START + lcn * size;
        let mut di = z_erofs_lcluster_index::new_zeroed();
        self.meta_of(inode, pos, di.as_mut_bytes())?;
        let nid = inode.nid;
        let bad = |kind: Corrupt| Error::corrupt(pos, kind);
        let advise = di.di_advise.get();
        let mut m = Lcluster {
            lcn,
            kind: (advise & 3) as u8,
            nextpackoff: pos + size,
            pos,
            partial: advise & LI_PARTIAL_REF != 0,
            ..Default::default()
        };
        if m.kind == LCLUSTER_NONHEAD {
            m.clusterofs = 1 << z.lclusterbits;
            let delta = di.delta();
            m.delta[0] = u32::from(delta[0]);
            if m.delta[0] & LI_D0_CBLKCNT != 0 {
                if z.advise & (ADVISE_BIG_PCLUSTER_1 | ADVISE_BIG_PCLUSTER_2) == 0 {
                    return Err(bad(Corrupt::BlockCountWithoutBigPcluster { nid, lcn }));
                }
                m.compressedblks = m.delta[0] & !LI_D0_CBLKCNT;
                m.delta[0] = 1;
            }
            m.delta[1] = u32::from(delta[1]);
        } else {
            m.clusterofs = u32::from(di.di_clusterofs.get());
            if m.clusterofs >= 1 << z.lclusterbits {
                return Err(bad(Corrupt::ClusterOffset {
                    nid,
                    lcn,
                    clusterofs: m.clusterofs,
                }));
            }
            m.pblk = u64::from(di.blkaddr());
        }
        Ok(m)
    }

    fn load_compact(
        &self,
        inode: &Inode,
        z: &ZInfo,
        lcn: u64,
        lookahead: bool,
    ) -> Result<Lcluster> {
        let ebase = z.header_pos + size_of::<z_erofs_map_header>() as u64;
        let two_byte = z.advise & ADVISE_COMPACTED_2B != 0;
        let (initial_4b, compacted_2b, _) = compact_split(z.total, ebase, two_byte);
        let mut pos = ebase;
        let mut shift = 2u32;
        let mut rel = lcn;
        if rel >= initial_4b {
            pos += initial_4b * 4;
            rel -= initial_4b;
            if rel < compacted_2b {
                shift = 1;
            } else {
                pos += compacted_2b * 2;
                rel -= compacted_2b;
            }
        }
        pos += rel << shift;
        let vcnt: u32 = if shift == 2 {
            2
        } else if z.lclusterbits <= 12 {
            16
        } else {
            return Err(Error::incompatible(Incompatible::CompactIndexes2B {
                nid: inode.nid,
                lclusterbits: z.lclusterbits,
            }));
        };
        let pack_len = u64::from(vcnt) << shift;
        let pack_pos = pos / pack_len * pack_len;
        let mut pack = [0u8; 32];
        self.meta_of(inode, pack_pos, &mut pack[..pack_len as usize])?;
        let nid = inode.nid;
        let bad = |kind: Corrupt| Error::corrupt(pos, kind);
        let pack = &pack[..pack_len as usize];
        let lobits = compact_lobits(z.lclusterbits);
        let i = ((pos - pack_pos) >> shift) as i64;
        let big = z.advise & ADVISE_BIG_PCLUSTER_1 != 0;
        let decode = |idx: i64| compact_entry(pack, vcnt as usize, lobits, idx as usize);
        let mut m = Lcluster {
            lcn,
            nextpackoff: pack_pos + pack_len,
            pos,
            ..Default::default()
        };
        let (lo, kind) = decode(i);
        m.kind = kind;
        if kind == LCLUSTER_NONHEAD {
            m.clusterofs = 1 << z.lclusterbits;
            if lookahead {
                let mut d1 = 0u32;
                let mut j = i;
                let mut last_lo = 0;
                let mut ended = false;
                while j < i64::from(vcnt) {
                    let (l, t) = decode(j);
                    last_lo = l;
                    if t != LCLUSTER_NONHEAD {
                        ended = true;
                        break;
                    }
                    d1 += 1;
                    j += 1;
                }
                if !ended && last_lo & LI_D0_CBLKCNT == 0 {
                    d1 += last_lo.saturating_sub(1);
                }
                m.delta[1] = d1;
            }
            if lo & LI_D0_CBLKCNT != 0 {
                if !big {
                    return Err(bad(Corrupt::BlockCountWithoutBigPcluster { nid, lcn }));
                }
                m.compressedblks = lo & !LI_D0_CBLKCNT;
                m.delta[0] = 1;
                return Ok(m);
            } else if i + 1 != i64::from(vcnt) {
                m.delta[0] = lo;
                return Ok(m);
            }
            // The last entry of a pack stores delta[1]; delta[0] comes from
            // the entry before it.
            let (plo, ptype) = decode(i - 1);
            let plo = if ptype != LCLUSTER_NONHEAD {
                0
            } else if plo & LI_D0_CBLKCNT != 0 {
                1
            } else {
                plo
            };
            m.delta[0] = plo + 1;
            return Ok(m);
        }
        m.clusterofs = lo;
        let mut nblk: i64;
        let mut j = i;
        if !big {
            nblk = 1;
            while j > 0 {
                j -= 1;
                let (l, t) = decode(j);
                if t == LCLUSTER_NONHEAD {
                    j -= i64::from(l);
                }
                if j >= 0 {
                    nblk += 1;
                }
            }
        } else {
            nblk = 0;
            while j > 0 {
                j -= 1;
                let (l, t) = decode(j);
                if t == LCLUSTER_NONHEAD {
                    if l & LI_D0_CBLKCNT != 0 {
                        j -= 1;
                        nblk += i64::from(l & !LI_D0_CBLKCNT);
                        continue;
                    }
                    if l <= 1 {
                        return Err(bad(Corrupt::PlainDeltaInBigPack { nid, lcn }));
                    }
                    j -= i64::from(l) - 2;
                    continue;
                }
                nblk += 1;
            }
        }
        let base = compact_base(pack);
        m.pblk = (i64::from(base) + nblk) as u64;
        Ok(m)
    }
}
