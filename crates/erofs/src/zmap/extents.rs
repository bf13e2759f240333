//! Compressed files mapped by extent records rather than logical-cluster
//! indexes: a full-layout inode whose map header has the EXTENTS advice
//! (mkfs.erofs writes them in 48-bit images).
//!
//! Records of 4 or 8 bytes describe one logical cluster each; records of 16
//! or 32 bytes carry their own logical start and are sorted by it. Each
//! record gives a byte address on the primary device and an encoded length
//! in bytes (so a cluster may start and end mid-block and has no zero
//! padding), its own format (stored, or an algorithm) and a partial flag
//! (dedupe). A record of length 0 maps nothing: those bytes read as zeros.
//! With FRAGMENT_PCLUSTER the last extent is the file's tail in the packed
//! inode.
//!
//! Lookups bisect or index the table and never walk more records than it
//! holds; the table itself is checked to lie inside the image before any is
//! read.

use std::num::NonZeroUsize;
use std::sync::Arc;

use foliofs_vfs::{Error, Result};
use lru::LruCache;

use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, FromZeros, IntoBytes};

use super::{ZExtent, ZFormat, ZInfo};
use crate::format::{
    z_erofs_extent, z_erofs_map_header, Algorithm, ADVISE_FRAGMENT_PCLUSTER,
    ADVISE_INTERLACED_PCLUSTER, MAX_DECODED, MAX_PCLUSTER, PLEN_FMT_SHIFT, PLEN_MASK, PLEN_PARTIAL,
};
use crate::inode::Inode;
use crate::{Corrupt, Erofs, Incompatible};

/// With 4-byte records an extent's address is the sum of the lengths
/// before it; the running sum is kept at every this many records, so a
/// lookup adds at most this many.
const SUM_STRIDE: u64 = 1024;
/// Inodes whose running sums are kept.
const SUM_CACHE_ENTRIES: NonZeroUsize = NonZeroUsize::new(8).unwrap();
/// Records read at once while summing or checking a table.
const RECORDS_PER_READ: u64 = 512;

/// The running sums of the recently used inodes with 4-byte records, by
/// nid: the sum before record `i * SUM_STRIDE` at `i`.
pub(crate) type RunningSums = LruCache<u64, Arc<Vec<u64>>>;

/// An empty cache of running sums.
pub(crate) fn running_sums() -> RunningSums {
    LruCache::new(SUM_CACHE_ENTRIES)
}

/// Where an inode's extent records are and how to read them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExtentMap {
    /// Bytes per record: 4, 8, 16 or 32.
    pub recsz: u64,
    /// Number of records.
    pub count: u64,
    /// Image position of the first record (with 4-byte records, the 8-byte
    /// address of the first cluster comes just before it).
    pub records: u64,
}

impl ExtentMap {
    /// Image position just past the table.
    pub fn end(&self) -> u64 {
        self.records + self.count * self.recsz
    }
}

/// One decoded record.
#[derive(Clone, Copy, Debug)]
struct Record {
    /// The raw length word (length, partial flag, format).
    plen: u32,
    /// Physical byte address (with 4-byte records, from the running sum).
    pa: u64,
    /// Logical start (16- and 32-byte records only).
    la: u64,
    /// Image position of the record, for error messages.
    pos: u64,
}

impl Erofs {
    /// The map of compressed `inode` whose header `h` at `header_pos` has
    /// the EXTENTS advice.
    pub(crate) fn ext_zinfo(
        &self,
        inode: &Inode,
        header_pos: u64,
        h: &z_erofs_map_header,
    ) -> Result<ZInfo> {
        let nid = inode.nid;
        let advise = h.h_advise.get();
        let recsz = 4u64 << ((advise >> 1) & 3);
        let bits = u32::from(self.sb.blkszbits);
        // Short records are one per logical cluster; long ones count
        // themselves, and their header has no cluster size.
        let (lclusterbits, count) = if recsz <= 8 {
            let lclusterbits = bits + u32::from(h.h_clusterbits & 15);
            (lclusterbits, inode.size.div_ceil(1u64 << lclusterbits))
        } else {
            (
                bits,
                u64::from(h.h_u.get()) | u64::from(h.h_extents_hi()) << 32,
            )
        };
        let header_end = header_pos + size_of::<z_erofs_map_header>() as u64;
        let mut records = header_end.div_ceil(recsz) * recsz;
        if recsz == 4 {
            records += 8;
        }
        let end = count
            .checked_mul(recsz)
            .and_then(|n| n.checked_add(records));
        if end.is_none_or(|end| end > self.meta_limit(inode)) {
            return Err(Error::corrupt(
                header_pos,
                Corrupt::ExtentRecordsOutOfImage {
                    nid,
                    count,
                    recsz: recsz as u8,
                },
            ));
        }
        Ok(ZInfo::extents(
            advise,
            lclusterbits,
            header_pos,
            ExtentMap {
                recsz,
                count,
                records,
            },
        ))
    }

    /// Maps byte `ofs` (< size) of `inode`, mapped by extent records `m`, to
    /// its whole extent.
    pub(crate) fn zmap_ext(
        &self,
        inode: &Inode,
        z: &ZInfo,
        m: &ExtentMap,
        ofs: u64,
    ) -> Result<ZExtent> {
        let nid = inode.nid;
        let (la, lend, rec, last) = if m.recsz <= 8 {
            let bits = z.lclusterbits;
            let k = ofs >> bits;
            let mut rec = self.ext_record(inode, m, k)?;
            if m.recsz == 4 {
                rec.pa = self.ext_running_pa(inode, m, k)?;
            }
            let la = k << bits;
            let lend = ((k + 1) << bits).min(inode.size);
            (la, lend, Some(rec), k + 1 >= m.count)
        } else {
            // The last record starting at or before `ofs`; the extent ends
            // where the next one starts, or at the end of the file.
            let (mut lo, mut hi) = (0u64, m.count);
            let mut found = None;
            let mut lend = inode.size;
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                let r = self.ext_record(inode, m, mid)?;
                if r.la > ofs {
                    hi = mid;
                    lend = r.la;
                } else {
                    lo = mid + 1;
                    found = Some(r);
                }
            }
            if lend > inode.size {
                return Err(Error::corrupt(
                    m.records + hi * m.recsz,
                    Corrupt::ExtentPastEnd {
                        nid,
                        lstart: lend,
                        size: inode.size,
                    },
                ));
            }
            // Before the first record nothing is mapped.
            let la = found.map_or(0, |r| r.la);
            (la, lend, found, lo >= m.count)
        };
        let zeros = ZExtent {
            la,
            llen: lend - la,
            pa: 0,
            plen: 0,
            inline: false,
            format: ZFormat::Zeros,
            partial: false,
        };
        let Some(rec) = rec else {
            return Ok(zeros);
        };
        if last && z.advise & ADVISE_FRAGMENT_PCLUSTER != 0 {
            // The tail in the packed inode: the raw length word is the
            // offset there, and the address field its high word.
            let mut offset = u64::from(rec.plen);
            if m.recsz > 4 {
                offset |= rec.pa << 32;
            }
            return Ok(ZExtent::fragment(inode, la, offset));
        }
        let plen = u64::from(rec.plen & PLEN_MASK);
        if plen == 0 {
            return Ok(zeros);
        }
        let at = rec.pos;
        let llen = lend - la;
        if plen > MAX_PCLUSTER {
            return Err(Error::corrupt(
                at,
                Corrupt::PclusterTooLarge { nid, bytes: plen },
            ));
        }
        let fmt = rec.plen >> PLEN_FMT_SHIFT;
        let format = if fmt == 0 {
            if llen > plen {
                return Err(Error::corrupt(
                    at,
                    Corrupt::PlainExtentOverrun { nid, llen, plen },
                ));
            }
            // Rotated storage needs whole blocks.
            let bs = u64::from(self.sb.block_size());
            if z.advise & ADVISE_INTERLACED_PCLUSTER != 0 && (rec.pa | plen) % bs == 0 {
                ZFormat::Interlaced
            } else {
                ZFormat::Shifted
            }
        } else {
            let alg = (fmt - 1) as u8;
            let Some(algorithm) = Algorithm::from_number(alg) else {
                return Err(Error::incompatible(Incompatible::ExtentAlgorithm {
                    nid,
                    algorithm: alg,
                }));
            };
            if self.sb.available_algorithms() & (1 << alg) == 0 {
                return Err(Error::corrupt(
                    at,
                    Corrupt::UnlistedAlgorithm {
                        nid,
                        algorithm: alg,
                    },
                ));
            }
            // The kernel decodes no more than this from one cluster; LZ4
            // cannot expand further than 255-fold either.
            if llen > MAX_DECODED as u64 {
                return Err(Error::corrupt(
                    at,
                    Corrupt::DecodedTooLong { nid, la, llen },
                ));
            }
            if algorithm == Algorithm::Lz4 && llen > plen * 255 + 64 {
                return Err(Error::corrupt(at, Corrupt::Lz4Ratio { nid, llen, plen }));
            }
            ZFormat::Compressed(algorithm)
        };
        Ok(ZExtent {
            la,
            llen,
            pa: rec.pa,
            plen,
            inline: false,
            format,
            partial: rec.plen & PLEN_PARTIAL != 0,
        })
    }

    /// Reads record `i` of `m` (`i < m.count`).
    fn ext_record(&self, inode: &Inode, m: &ExtentMap, i: u64) -> Result<Record> {
        // Shorter records are prefixes of the 32-byte one: the fields
        // they lack read as zeros.
        let mut rec = z_erofs_extent::new_zeroed();
        let pos = m.records + i * m.recsz;
        self.meta_of(inode, pos, &mut rec.as_mut_bytes()[..m.recsz as usize])?;
        Ok(Record {
            plen: rec.plen.get(),
            pa: rec.pstart(),
            la: rec.lstart(),
            pos,
        })
    }

    /// The address of cluster `k` of a 4-byte-record table: the first
    /// cluster's address plus the lengths of those before `k`.
    fn ext_running_pa(&self, inode: &Inode, m: &ExtentMap, k: u64) -> Result<u64> {
        let (from, sum) = if k >= SUM_STRIDE {
            let sums = self.ext_sums(inode, m)?;
            let c = k / SUM_STRIDE;
            (c * SUM_STRIDE, sums[c as usize])
        } else {
            let mut base = U64::new_zeroed();
            self.meta_of(inode, m.records - 8, base.as_mut_bytes())?;
            (0, base.get())
        };
        self.ext_add_lengths(inode, m, from, k, sum)
    }

    /// `sum` plus the lengths of records `from..to`.
    fn ext_add_lengths(
        &self,
        inode: &Inode,
        m: &ExtentMap,
        from: u64,
        to: u64,
        mut sum: u64,
    ) -> Result<u64> {
        let mut buf = vec![0u8; (RECORDS_PER_READ * 4) as usize];
        let mut i = from;
        while i < to {
            let n = (to - i).min(RECORDS_PER_READ);
            let chunk = &mut buf[..(n * 4) as usize];
            self.meta_of(inode, m.records + i * 4, chunk)?;
            let plens = <[U32]>::ref_from_bytes(chunk).expect("whole records");
            for plen in plens {
                let len = plen.get() & PLEN_MASK;
                sum = sum.checked_add(u64::from(len)).ok_or_else(|| {
                    Error::corrupt(m.records, Corrupt::BlockAddressOverflow { nid: inode.nid })
                })?;
            }
            i += n;
        }
        Ok(sum)
    }

    /// The running sums of `inode`'s 4-byte records, every [`SUM_STRIDE`]
    /// records, computed once per inode while it stays among the
    /// recently used.
    fn ext_sums(&self, inode: &Inode, m: &ExtentMap) -> Result<Arc<Vec<u64>>> {
        {
            let mut cache = self.ext_sums.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(sums) = cache.get(&inode.nid) {
                return Ok(sums.clone());
            }
        }
        let mut base = U64::new_zeroed();
        self.meta_of(inode, m.records - 8, base.as_mut_bytes())?;
        let mut sum = base.get();
        let mut sums = Vec::with_capacity((m.count / SUM_STRIDE + 1) as usize);
        let mut i = 0;
        while i < m.count {
            sums.push(sum);
            let to = (i + SUM_STRIDE).min(m.count);
            sum = self.ext_add_lengths(inode, m, i, to, sum)?;
            i = to;
        }
        let sums = Arc::new(sums);
        self.ext_sums
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .put(inode.nid, sums.clone());
        Ok(sums)
    }

    /// Checks that 16- and 32-byte records are in strictly increasing
    /// order of logical start and start inside the file (lookups bisect
    /// them and would otherwise miss extents). Shorter records have no
    /// order to check.
    pub(crate) fn check_ext_order(&self, inode: &Inode, m: &ExtentMap) -> Result<()> {
        if m.recsz <= 8 {
            return Ok(());
        }
        let mut prev: Option<u64> = None;
        for i in 0..m.count {
            let rec = self.ext_record(inode, m, i)?;
            let (la, at) = (rec.la, rec.pos);
            if prev.is_some_and(|p| la <= p) {
                return Err(Error::corrupt(
                    at,
                    Corrupt::ExtentOrder {
                        nid: inode.nid,
                        index: i,
                        lstart: la,
                    },
                ));
            }
            if la >= inode.size {
                return Err(Error::corrupt(
                    at,
                    Corrupt::ExtentPastEnd {
                        nid: inode.nid,
                        lstart: la,
                        size: inode.size,
                    },
                ));
            }
            prev = Some(la);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
