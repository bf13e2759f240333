//! The metabox (INCOMPAT_METABOX, mkfs.erofs `-m`): inodes whose nid has
//! bit 63 set keep all their metadata (the inode, inline xattrs, inline
//! tail, chunk table, compression map and inline cluster) in the metabox
//! inode's data, at `(nid & !bit 63) * 32`; their data blocks stay on the
//! devices. The metabox inode itself is an ordinary (usually compressed)
//! inode of the image, so its decoded extents are kept in a cache of their
//! own, out of reach of file reads that would push them out.
//!
//! Every metadata read of an inode goes through [`Erofs::meta_of`], which
//! picks the image or the metabox by the inode. Positions of metadata in
//! the metabox (an inode's `pos`, and the offsets its damage is reported
//! at) are offsets in the metabox inode's data.
//!
//! Inode numbers follow the kernel's: on a metabox image `st_ino` is the
//! nid with bit 63 moved to bit 31 and bits 31..62 moved up by one, a
//! bijection [`Erofs::ino_of`] and [`Erofs::nid_of`] convert both ways.

use std::cell::RefCell;

use foliofs_vfs::{Error, FileType, Ino, Result, Scratch};

use crate::data::with_scratch;
use crate::format::{INCOMPAT_METABOX, INODE_COMPACT_SIZE, MAX_INODE_SIZE, NID_METABOX};
use crate::inode::Inode;
use crate::{Corrupt, Erofs};

thread_local! {
    /// Buffer for metadata read out of the metabox.
    static METABUF: RefCell<Scratch> = RefCell::new(Scratch::new());
}

/// The kernel's inode number for `nid` on a metabox image.
pub fn nid_to_ino(nid: u64) -> u64 {
    ((nid << 1) & 0xFFFF_FFFF_0000_0000) | (nid & 0x7FFF_FFFF) | ((nid >> 63) << 31)
}

/// The nid whose inode number on a metabox image is `ino`.
pub fn ino_to_nid(ino: u64) -> u64 {
    ((ino >> 1) & 0x7FFF_FFFF_8000_0000) | (ino & 0x7FFF_FFFF) | (((ino >> 31) & 1) << 63)
}

impl Erofs {
    /// Opens the metabox inode (on images with one): an inode of the image
    /// itself (the superblock refuses a metabox nid inside the metabox),
    /// holding data.
    pub(crate) fn open_metabox(&self) -> Result<Option<Inode>> {
        if !self.sb.has_incompat(INCOMPAT_METABOX) {
            return Ok(None);
        }
        let nid = self.sb.metabox_nid;
        let inode = self.inode(nid)?;
        if inode.kind != FileType::RegularFile {
            return Err(Error::corrupt(
                inode.pos,
                Corrupt::MetaboxNotRegular { nid },
            ));
        }
        Ok(Some(inode))
    }

    /// The inode number the kernel reports for `nid`.
    pub fn ino_of(&self, nid: u64) -> Ino {
        if self.metabox.is_some() {
            nid_to_ino(nid)
        } else {
            nid
        }
    }

    /// The nid of inode number `ino` (the inverse of [`Erofs::ino_of`]).
    pub fn nid_of(&self, ino: Ino) -> u64 {
        if self.metabox.is_some() {
            ino_to_nid(ino)
        } else {
            ino
        }
    }

    /// Reads `buf.len()` bytes at `pos` of the metabox inode's data, all or
    /// an error (`nid` is the inode whose metadata is read, for messages).
    pub(crate) fn metabox_bytes(&self, nid: u64, pos: u64, buf: &mut [u8]) -> Result<()> {
        let Some(metabox) = &self.metabox else {
            return Err(Error::corrupt(0, Corrupt::NoMetabox { nid }));
        };
        let len = buf.len() as u64;
        let outside = || {
            Error::corrupt(
                pos,
                Corrupt::OutOfMetabox {
                    nid,
                    pos,
                    len,
                    size: metabox.size,
                },
            )
        };
        if pos.checked_add(len).is_none_or(|end| end > metabox.size) {
            return Err(outside());
        }
        let mut done = 0usize;
        with_scratch(&METABUF, |scratch| -> Result<()> {
            while done < buf.len() {
                let want = (buf.len() - done).min(1 << 20) as u32;
                let got = self.read_inode(metabox, pos + done as u64, want, scratch)?;
                if got.is_empty() {
                    return Err(outside());
                }
                buf[done..done + got.len()].copy_from_slice(got);
                done += got.len();
            }
            Ok(())
        })
    }

    /// Reads metadata of `inode` at `pos`: from the metabox when the inode
    /// is in it, else from the image.
    pub(crate) fn meta_of(&self, inode: &Inode, pos: u64, buf: &mut [u8]) -> Result<()> {
        if inode.in_metabox {
            self.metabox_bytes(inode.nid, pos, buf)
        } else {
            self.meta(pos, buf)
        }
    }

    /// Bytes of the space `inode`'s metadata positions are in: the metabox
    /// inode's data or the image.
    pub(crate) fn meta_limit(&self, inode: &Inode) -> u64 {
        match (&self.metabox, inode.in_metabox) {
            (Some(m), true) => m.size,
            _ => self.dev.size(),
        }
    }

    /// Reads inode `nid`, which has the metabox bit, from the metabox.
    pub(crate) fn metabox_inode(&self, nid: u64) -> Result<Inode> {
        let Some(metabox) = &self.metabox else {
            return Err(Error::corrupt(0, Corrupt::NoMetabox { nid }));
        };
        let pos = (nid & !NID_METABOX)
            .checked_mul(INODE_COMPACT_SIZE as u64)
            .ok_or_else(|| Error::corrupt(0, Corrupt::NidOverflow { nid }))?;
        if pos
            .checked_add(INODE_COMPACT_SIZE as u64)
            .is_none_or(|end| end > metabox.size)
        {
            return Err(Error::corrupt(
                pos,
                Corrupt::InodeOutOfMetabox {
                    nid,
                    size: metabox.size,
                },
            ));
        }
        let mut raw = [0u8; MAX_INODE_SIZE];
        let compact = INODE_COMPACT_SIZE;
        self.metabox_bytes(nid, pos, &mut raw[..compact])?;
        if Inode::is_extended(&raw) {
            self.metabox_bytes(nid, pos + compact as u64, &mut raw[compact..])?;
        }
        Inode::parse(&self.sb, nid, pos, &raw)
    }
}

#[cfg(test)]
mod tests;
