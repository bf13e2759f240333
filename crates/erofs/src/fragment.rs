//! The packed inode and the fragments kept in it: files (or their tails)
//! whose bytes are a range of the packed inode's data.
//!
//! A fragment is read through the packed inode's own read path, so a
//! compressed packed inode's decoded extents are cached once for every
//! file that shares them.

use std::cell::RefCell;

use foliofs_vfs::{Error, FileType, Result, Scratch};

use crate::data::with_scratch;
use crate::inode::Inode;
use crate::zmap::{ZExtent, ZFormat};
use crate::{Corrupt, Erofs};

thread_local! {
    /// Buffer for a fragment copied into a larger reply.
    static FRAGBUF: RefCell<Scratch> = RefCell::new(Scratch::new());
}

impl Erofs {
    /// The packed inode, for `user`, whose data is in a fragment.
    pub(crate) fn packed_inode(&self, user: &Inode) -> Result<Inode> {
        let nid = self.sb.packed_nid;
        if nid == 0 {
            return Err(Error::corrupt(
                user.pos,
                Corrupt::NoPackedInode { nid: user.nid },
            ));
        }
        let packed = self.inode(nid)?;
        if packed.kind != FileType::RegularFile {
            return Err(Error::corrupt(
                packed.pos,
                Corrupt::PackedNotRegular { nid },
            ));
        }
        Ok(packed)
    }

    /// Checks that fragment extent `ext` of `inode` lies inside the packed
    /// inode, which it returns.
    pub(crate) fn fragment_source(&self, inode: &Inode, ext: &ZExtent) -> Result<Inode> {
        debug_assert_eq!(ext.format, ZFormat::Fragment);
        let packed = self.packed_inode(inode)?;
        if ext.pa.checked_add(ext.llen).is_none_or(|e| e > packed.size) {
            return Err(out_of_packed(inode, ext, &packed));
        }
        Ok(packed)
    }

    /// Reads `len` bytes at file offset `pos` (inside fragment extent
    /// `ext`) of `inode`.
    pub(crate) fn read_fragment<'a>(
        &self,
        inode: &Inode,
        ext: &ZExtent,
        pos: u64,
        len: usize,
        scratch: &'a mut Scratch,
    ) -> Result<&'a [u8]> {
        let packed = self.fragment_source(inode, ext)?;
        let start = ext.pa + (pos - ext.la);
        let got = self.read_inode(&packed, start, len as u32, scratch)?;
        if got.len() != len {
            return Err(out_of_packed(inode, ext, &packed));
        }
        Ok(got)
    }

    /// As [`Erofs::read_fragment`], into `out` (`out.len()` bytes).
    pub(crate) fn fragment_into(
        &self,
        inode: &Inode,
        ext: &ZExtent,
        pos: u64,
        out: &mut [u8],
    ) -> Result<()> {
        with_scratch(&FRAGBUF, |s| {
            let got = self.read_fragment(inode, ext, pos, out.len(), s)?;
            out.copy_from_slice(got);
            Ok(())
        })
    }
}

/// `ext` of `inode` runs past the end of the packed inode.
fn out_of_packed(inode: &Inode, ext: &ZExtent, packed: &Inode) -> Error {
    Error::corrupt(
        inode.pos,
        Corrupt::FragmentOutOfPacked {
            nid: inode.nid,
            offset: ext.pa,
            len: ext.llen,
            packed_size: packed.size,
        },
    )
}
