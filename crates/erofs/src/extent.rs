//! Where a file's bytes live: the data extents of an inode and the on-disk
//! tables (chunk table, compression indexes) that map them, as `dump.erofs
//! -e` shows them.

use foliofs_vfs::Result;

use crate::chunk::ChunkFormat;
use crate::data::Phys;
use crate::format::{z_erofs_lcluster_index, FULL_INDEX_START};
use crate::inode::{Inode, Layout};
use crate::zmap::ZFormat;
use crate::Erofs;

/// One extent of a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    /// Logical start in the file.
    pub logical: u64,
    /// Length in the file.
    pub length: u64,
    /// Device (0 = the image, n = extra device n) and byte position; `None`
    /// for a hole (zeros) or a fragment.
    pub physical: Option<(usize, u64)>,
    /// Bytes stored on disk for this extent.
    pub physical_len: u64,
    /// Compressed, with any of the image's algorithms (as opposed to
    /// stored as is, zeros or a fragment).
    pub compressed: bool,
    /// Stored inline in the metadata, after the inode.
    pub inline: bool,
    /// Kept in the packed inode, from this byte offset of its data on.
    pub fragment: Option<u64>,
}

impl Erofs {
    /// Every data extent of `inode`, in file order.
    pub fn extents(&self, inode: &Inode) -> Result<Vec<Extent>> {
        let mut out = Vec::new();
        let mut pos = 0u64;
        if inode.layout.is_compressed() {
            let z = self.zinfo(inode)?;
            while pos < inode.size {
                let e = self.zmap(inode, &z, pos)?;
                if e.llen == 0 || e.la > pos {
                    return Err(foliofs_vfs::Error::corrupt(
                        inode.pos,
                        crate::Corrupt::NoExtent {
                            nid: inode.nid,
                            offset: pos,
                        },
                    ));
                }
                let fragment = (e.format == ZFormat::Fragment).then_some(e.pa);
                let stored = fragment.is_none() && e.format != ZFormat::Zeros;
                // An inline cluster of an inode in the metabox is on no
                // device.
                let on_device = stored && !(e.inline && inode.in_metabox);
                out.push(Extent {
                    logical: e.la,
                    length: e.llen,
                    physical: on_device.then_some((0, e.pa)),
                    physical_len: if stored { e.plen } else { 0 },
                    compressed: matches!(e.format, ZFormat::Compressed(_)),
                    inline: e.inline,
                    fragment,
                });
                pos = e.la + e.llen;
            }
            return Ok(out);
        }
        while pos < inode.size {
            let r = self.map_flat(inode, pos, pos + 1)?;
            // An inline tail in the metabox has no place on a device.
            let physical = match r.phys {
                Phys::Hole | Phys::Metabox(_) => None,
                Phys::At(d, p) => Some((d, p)),
                Phys::Tail(p) => Some((0, p)),
            };
            let inline = matches!(r.phys, Phys::Metabox(_) | Phys::Tail(_));
            out.push(Extent {
                logical: r.la,
                length: r.len,
                physical,
                physical_len: if r.phys == Phys::Hole { 0 } else { r.len },
                compressed: false,
                inline,
                fragment: None,
            });
            pos = r.la + r.len;
        }
        Ok(out)
    }

    /// The range holding `inode`'s chunk table or compression indexes (map
    /// header included), if it has one: in the image, or in the metabox
    /// inode's data for an inode kept there.
    pub fn index_range(&self, inode: &Inode) -> Result<Option<(u64, u64)>> {
        Ok(match inode.layout {
            Layout::ChunkBased => {
                let fmt = ChunkFormat::of(inode, self.sb.blkszbits)?;
                fmt.entry_pos(inode, 0)
                    .map(|start| (start, fmt.count(inode.size) * fmt.entry_size()))
            }
            Layout::CompressedFull | Layout::CompressedCompact => {
                let z = self.zinfo(inode)?;
                if z.fragment.is_some_and(|f| f.header_only) {
                    return Ok(Some((z.header_pos, 8)));
                }
                if let Some(m) = &z.extents {
                    return Ok(Some((z.header_pos, m.end() - z.header_pos)));
                }
                let lclusters = inode.size.div_ceil(1u64 << z.lclusterbits);
                let len = if inode.layout == Layout::CompressedFull {
                    FULL_INDEX_START + size_of::<z_erofs_lcluster_index>() as u64 * lclusters
                } else {
                    // Compact indexes take 2 to 4 bytes per lcluster plus
                    // pack bases; 4 bytes each is an upper bound.
                    8 + 4 * lclusters + 32
                };
                Some((z.header_pos, len))
            }
            _ => None,
        })
    }
}
