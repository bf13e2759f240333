//! Compressed file data: decoding extents, straight into a reply or into
//! the extent cache (`zcache`) for the readers that come back to them.

use std::sync::{Arc, Mutex};

use foliofs_vfs::{Error, Result, Scratch};

use crate::data::{with_scratch, PIECE};
use crate::decompress;
use crate::inode::Inode;
use crate::zcache::ExtentCache;
use crate::zmap::{self, ZExtent, ZInfo};
use crate::{Corrupt, Erofs};

/// Most compressed bytes read with one I/O for extents decoded straight
/// into a reply.
const RUN_BYTES: u64 = 2 << 20;

/// An extent with the device and offset its cluster starts at (`None`
/// for one inline in its inode's metadata).
type Located = (ZExtent, Option<(usize, u64)>);

/// The extent holding an offset, with its bytes unless they are a fragment
/// (read from the packed inode where they are needed, never copied whole:
/// a whole-file fragment is as long as the file).
pub(crate) enum Piece {
    Fragment(ZExtent),
    /// Nothing stored: zeros, never materialised (such an extent may be as
    /// long as the file).
    Zeros(ZExtent),
    Decoded(ZExtent, Arc<Vec<u8>>),
}

impl Piece {
    /// The extent, whatever holds its bytes.
    pub(crate) fn extent(&self) -> &ZExtent {
        match self {
            Piece::Fragment(ext) | Piece::Zeros(ext) | Piece::Decoded(ext, _) => ext,
        }
    }
}

impl Erofs {
    /// Reads `offset..end` of compressed `inode` (`end` within its size and
    /// past `offset`), for [`Erofs::read_inode`].
    pub(crate) fn read_compressed<'a>(
        &self,
        inode: &Inode,
        offset: u64,
        end: u64,
        scratch: &'a mut Scratch,
    ) -> Result<&'a [u8]> {
        let total = (end - offset) as usize;
        let z = self.zinfo(inode)?;
        let piece = match self.extent_data(inode, &z, offset)? {
            // A fragment runs to the end of the file.
            Piece::Fragment(ext) => return self.read_fragment(inode, &ext, offset, total, scratch),
            Piece::Decoded(ext, data) if ext.la + ext.llen >= end => {
                let within = (offset - ext.la) as usize;
                return Ok(&scratch.hold(data)[within..within + total]);
            }
            other => other,
        };
        let out = scratch.get(total);
        let mut pos = offset;
        let mut piece = piece;
        loop {
            let at = (pos - offset) as usize;
            match piece {
                Piece::Fragment(ext) => {
                    self.fragment_into(inode, &ext, pos, &mut out[at..])?;
                    break;
                }
                Piece::Zeros(ext) => {
                    let n = ((ext.la + ext.llen).min(end) - pos) as usize;
                    out[at..at + n].fill(0);
                    pos += n as u64;
                }
                Piece::Decoded(ext, data) => {
                    let from = (pos - ext.la) as usize;
                    let n = ((ext.la + ext.llen).min(end) - pos) as usize;
                    out[at..at + n].copy_from_slice(&data[from..from + n]);
                    pos += n as u64;
                }
            }
            // Extents wholly inside the request decode straight into the
            // reply; only the one running past its end is kept for the
            // next request.
            while pos < end && self.cached_extent(inode.nid, pos).is_none() {
                let run = self.direct_run(inode, &z, pos, end)?;
                if run.is_empty() {
                    break;
                }
                let at = (pos - offset) as usize;
                let done = self.decode_run(inode, &run, &mut out[at..])?;
                pos += done;
                if done < run.iter().map(|(ext, _)| ext.llen).sum() {
                    // A stream longer than its extent needs room beyond
                    // it: the cached path below has that room.
                    break;
                }
            }
            if pos >= end {
                break;
            }
            piece = self.extent_data(inode, &z, pos)?;
            let ext = piece.extent();
            if ext.la > pos || ext.la + ext.llen <= pos {
                return Err(Error::corrupt(
                    inode.pos,
                    Corrupt::NoExtent {
                        nid: inode.nid,
                        offset: pos,
                    },
                ));
            }
        }
        Ok(out)
    }

    /// The extents from `pos` on that lie wholly before `end` and decode
    /// straight into a reply, as long as their clusters follow each other
    /// on one device (with where each starts there); empty if the first
    /// does not qualify.
    fn direct_run(&self, inode: &Inode, z: &ZInfo, mut pos: u64, end: u64) -> Result<Vec<Located>> {
        let mut run: Vec<Located> = Vec::new();
        let mut bytes = 0u64;
        while pos < end && bytes < RUN_BYTES {
            let next = self.map_extent(inode, z, pos)?;
            if next.la != pos
                || next.la + next.llen > end
                || next.partial
                || matches!(next.format, zmap::ZFormat::Fragment | zmap::ZFormat::Zeros)
            {
                break;
            }
            let at = if next.inline {
                None
            } else {
                Some(self.resolve(0, next.pa, inode.pos)?)
            };
            if let Some((prev, prev_at)) = run.last() {
                let follows = match (prev_at, at) {
                    (Some((d0, p0)), Some((d1, p1))) => *d0 == d1 && p0 + prev.plen == p1,
                    _ => false,
                };
                if !follows {
                    break;
                }
            }
            pos += next.llen;
            bytes += next.plen;
            let inline = at.is_none();
            run.push((next, at));
            if inline {
                break;
            }
        }
        Ok(run)
    }

    /// Decodes `run` (from [`Erofs::direct_run`]) into the front of `out`,
    /// its clusters read with one I/O: through the block cache, every small
    /// cluster cost a miss, a freshly allocated cached block and an
    /// eviction. Returns how many bytes it decoded, which falls short of
    /// the run where an extent did not decode in place.
    fn decode_run(&self, inode: &Inode, run: &[Located], out: &mut [u8]) -> Result<u64> {
        let (ext, at) = &run[0];
        let Some((dev, p)) = *at else {
            let span = &mut out[..ext.llen as usize];
            return Ok(match self.decode_extent(inode, ext, span) {
                Ok(()) => ext.llen,
                Err(_) => 0,
            });
        };
        let len: u64 = run.iter().map(|(ext, _)| ext.plen).sum();
        let codec = self.codec();
        with_scratch(&PIECE, |piece| -> Result<u64> {
            let src = self.read_phys_data(dev, p, len as usize, piece)?;
            let mut done = 0u64;
            let mut from = 0usize;
            for (ext, _) in run {
                let cluster = &src[from..from + ext.plen as usize];
                let span = &mut out[done as usize..(done + ext.llen) as usize];
                if decompress::decompress_into(ext, cluster, &codec, span, false).is_err() {
                    break;
                }
                from += ext.plen as usize;
                done += ext.llen;
            }
            Ok(done)
        })
    }

    /// The extent holding `ofs`: decompressed (from the cache or decoded
    /// now), or a fragment.
    pub(crate) fn extent_data(&self, inode: &Inode, z: &ZInfo, ofs: u64) -> Result<Piece> {
        if let Some((ext, data)) = self.cached_extent(inode.nid, ofs) {
            return Ok(Piece::Decoded(ext, data));
        }
        let ext = self.map_extent(inode, z, ofs)?;
        match ext.format {
            zmap::ZFormat::Fragment => return Ok(Piece::Fragment(ext)),
            zmap::ZFormat::Zeros => return Ok(Piece::Zeros(ext)),
            _ => {}
        }
        // A stream may run past its extent by up to a logical cluster in
        // legacy images; a partial reference (dedupe) decodes only the
        // prefix it keeps of its cluster's output, and extent records give
        // every stream's exact length.
        let room = if ext.partial || z.extents.is_some() {
            ext.llen as usize
        } else {
            ext.llen as usize + (1usize << z.lclusterbits)
        };
        let mut data = vec![0u8; room];
        self.decode_extent(inode, &ext, &mut data)?;
        data.truncate(ext.llen as usize);
        let data = Arc::new(data);
        self.cache_for(inode.nid)
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(inode.nid, ext.la, data.clone());
        Ok(Piece::Decoded(ext, data))
    }

    /// The cache `nid`'s extents go to: the metabox inode's own, or the
    /// files'.
    fn cache_for(&self, nid: u64) -> &Mutex<ExtentCache> {
        if self.metabox.as_ref().is_some_and(|m| m.nid == nid) {
            &self.mcache
        } else {
            &self.zcache
        }
    }

    /// The cached decompressed extent of `nid` holding `ofs`, if any.
    fn cached_extent(&self, nid: u64, ofs: u64) -> Option<(ZExtent, Arc<Vec<u8>>)> {
        let (la, data) = self
            .cache_for(nid)
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(nid, ofs)?;
        // Only the fields the readers use matter for a cache hit.
        let ext = ZExtent {
            la,
            llen: data.len() as u64,
            pa: 0,
            plen: 0,
            inline: false,
            format: zmap::ZFormat::Shifted,
            partial: false,
        };
        Some((ext, data))
    }

    /// The extent holding `ofs`, checked to hold it.
    fn map_extent(&self, inode: &Inode, z: &ZInfo, ofs: u64) -> Result<ZExtent> {
        let ext = self.zmap(inode, z, ofs)?;
        if ext.llen == 0 || ofs >= ext.la + ext.llen || ofs < ext.la {
            return Err(Error::corrupt(
                inode.pos,
                Corrupt::NoExtent {
                    nid: inode.nid,
                    offset: ofs,
                },
            ));
        }
        Ok(ext)
    }

    /// Reads `ext`'s physical cluster and decodes it into `out`.
    fn decode_extent(&self, inode: &Inode, ext: &ZExtent, out: &mut [u8]) -> Result<()> {
        let codec = self.codec();
        if ext.inline {
            let mut src = vec![0u8; ext.plen as usize];
            self.meta_of(inode, ext.pa, &mut src)?;
            return decompress::decompress_into(ext, &src, &codec, out, ext.partial);
        }
        let (dev, p) = self.resolve(0, ext.pa, inode.pos)?;
        with_scratch(&PIECE, |piece| -> Result<()> {
            let src = self.read_phys_data(dev, p, ext.plen as usize, piece)?;
            decompress::decompress_into(ext, src, &codec, out, ext.partial)
        })
    }
}
