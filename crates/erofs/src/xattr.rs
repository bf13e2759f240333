//! Extended attributes: the in-inode body (a header, shared ids, then
//! entries), the shared area, name prefix indexes and long prefixes.

use foliofs_vfs::{Error, Result};

use zerocopy::little_endian::U32;
use zerocopy::{FromZeros, IntoBytes};

use crate::format::{
    erofs_xattr_entry, erofs_xattr_ibody_header, xattr_prefix, COMPAT_PLAIN_XATTR_PFX,
    COMPAT_SHARED_EA_IN_METABOX, XATTR_ENTRY_HEADER, XATTR_IBODY_HEADER, XATTR_LONG_PREFIX,
};
use crate::inode::Inode;
use crate::{Corrupt, Erofs};

/// Checks that the kernel's EROFS would look `name` up at all. Linux finds
/// a handler for a name before the file system reads anything: EROFS has
/// one for each prefix of [`xattr_prefix`] (`user.`, `trusted.`,
/// `security.`), taking names longer than the prefix, and one for each
/// POSIX ACL name, taking it whole. Any other name has none:
/// `EOPNOTSUPP`, where an image could hold it (the Lustre index, a long
/// prefix on an unknown base) or not. A bare prefix is no name: `EINVAL`.
pub fn check_name(name: &[u8]) -> Result<()> {
    for prefix in (0..XATTR_LONG_PREFIX).filter_map(xattr_prefix) {
        let whole = !prefix.ends_with(b".");
        if whole && name == prefix {
            return Ok(());
        }
        if !whole && name.starts_with(prefix) {
            return if name.len() > prefix.len() {
                Ok(())
            } else {
                Err(Error::Invalid)
            };
        }
    }
    Err(Error::OperationNotSupported)
}

/// A long xattr name prefix from the prefix table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LongPrefix {
    /// The built-in prefix it extends.
    pub base_index: u8,
    /// Bytes appended to the built-in prefix.
    pub infix: Vec<u8>,
}

/// One attribute: full name and where its value lies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XattrEntry {
    /// The full name (`user.foo`).
    pub name: Vec<u8>,
    /// Position of the value: in the image, or in the metabox inode's
    /// data when `in_metabox`.
    pub value_pos: u64,
    /// Length of the value.
    pub value_len: u16,
    /// The value is in the metabox.
    pub in_metabox: bool,
    /// The inode the attribute was read for.
    pub nid: u64,
}

impl Erofs {
    /// Loads the long-prefix table where the superblock says, as Linux
    /// 6.18 looks for it: in the image when it is marked plain, else in the
    /// metabox inode's data on a metabox image, else in the packed inode's
    /// data when there is one, else in the image.
    pub(crate) fn load_prefixes(&self) -> Result<Vec<LongPrefix>> {
        let count = self.sb.xattr_prefix_count;
        let mut out = Vec::with_capacity(usize::from(count));
        if count == 0 {
            return Ok(out);
        }
        let holder = if self.sb.has_compat(COMPAT_PLAIN_XATTR_PFX) {
            None
        } else if let Some(metabox) = &self.metabox {
            Some(metabox.clone())
        } else if self.sb.packed_nid != 0 {
            Some(self.inode(self.sb.packed_nid)?)
        } else {
            None
        };
        let mut pos = u64::from(self.sb.xattr_prefix_start) * 4;
        for i in 0..count {
            pos = pos.div_ceil(4) * 4;
            let mut len = [0u8; 2];
            self.prefix_bytes(holder.as_ref(), pos, &mut len)?;
            let len = usize::from(u16::from_le_bytes(len));
            // The kernel's limit: a base index byte and an infix no longer
            // than a name.
            if len == 0 || len > 256 {
                return Err(Error::corrupt(
                    pos,
                    Corrupt::XattrPrefixLength { index: i, len },
                ));
            }
            let mut body = vec![0u8; len];
            self.prefix_bytes(holder.as_ref(), pos + 2, &mut body)?;
            out.push(LongPrefix {
                base_index: body[0],
                infix: body[1..].to_vec(),
            });
            pos += 2 + len as u64;
        }
        Ok(out)
    }

    /// Reads prefix table bytes at `pos` of the image, or of `holder`'s
    /// data (the packed or the metabox inode).
    fn prefix_bytes(&self, holder: Option<&Inode>, pos: u64, buf: &mut [u8]) -> Result<()> {
        match holder {
            None => self.meta(pos, buf),
            Some(inode) => {
                let got = self.read_to_vec(inode, pos, buf.len())?;
                if got.len() != buf.len() {
                    return Err(Error::corrupt(pos, Corrupt::XattrPrefixOutOfPacked));
                }
                buf.copy_from_slice(&got);
                Ok(())
            }
        }
    }

    /// The full name for `index` + `suffix`, or `None` when the kernel would
    /// not show this attribute.
    fn full_name(&self, index: u8, suffix: &[u8]) -> Option<Vec<u8>> {
        if index & XATTR_LONG_PREFIX != 0 {
            let i = usize::from(index & !XATTR_LONG_PREFIX);
            // Like the kernel, an attribute naming a prefix that does not
            // exist, or one on an unknown base, is not shown.
            let p = self.prefixes.get(i)?;
            let base = xattr_prefix(p.base_index)?;
            let mut n = Vec::with_capacity(base.len() + p.infix.len() + suffix.len());
            n.extend_from_slice(base);
            n.extend_from_slice(&p.infix);
            n.extend_from_slice(suffix);
            return Some(n);
        }
        xattr_prefix(index).map(|base| {
            let mut n = base.to_vec();
            n.extend_from_slice(suffix);
            n
        })
    }

    /// Reads xattr bytes at `pos` of the image, or of the metabox when
    /// `in_metabox` (`nid` names the inode they belong to, for messages).
    fn xattr_bytes(&self, nid: u64, in_metabox: bool, pos: u64, buf: &mut [u8]) -> Result<()> {
        if in_metabox {
            self.metabox_bytes(nid, pos, buf)
        } else {
            self.meta(pos, buf)
        }
    }

    /// Reads the entry at `pos` (in the metabox when `in_metabox`); returns
    /// it (if visible) and its aligned size.
    fn xattr_entry(
        &self,
        nid: u64,
        in_metabox: bool,
        pos: u64,
    ) -> Result<(Option<XattrEntry>, u64)> {
        let mut h = erofs_xattr_entry::new_zeroed();
        self.xattr_bytes(nid, in_metabox, pos, h.as_mut_bytes())?;
        let name_len = usize::from(h.e_name_len);
        let value_len = h.e_value_size.get();
        let head = XATTR_ENTRY_HEADER as u64;
        let mut suffix = vec![0u8; name_len];
        self.xattr_bytes(nid, in_metabox, pos + head, &mut suffix)?;
        let size = (head + name_len as u64 + u64::from(value_len)).div_ceil(4) * 4;
        let entry = self
            .full_name(h.e_name_index, &suffix)
            .map(|name| XattrEntry {
                name,
                value_pos: pos + head + name_len as u64,
                value_len,
                in_metabox,
                nid,
            });
        Ok((entry, size))
    }

    /// Every attribute of `inode`, in the kernel's order: those inline in
    /// the inode first, then the shared ones. A name kept both ways is the
    /// inline one's, as the kernel looks it up in the same order.
    pub fn xattrs(&self, inode: &Inode) -> Result<Vec<XattrEntry>> {
        let mut out = Vec::new();
        if inode.xattr_icount == 0 {
            return Ok(out);
        }
        let body = inode.pos + inode.inode_size();
        let total = inode.xattr_size();
        let mut h = erofs_xattr_ibody_header::new_zeroed();
        self.meta_of(inode, body, h.as_mut_bytes())?;
        let shared = u64::from(h.h_shared_count);
        if XATTR_IBODY_HEADER + 4 * shared > total {
            return Err(Error::corrupt(
                body,
                Corrupt::SharedXattrOverrun {
                    nid: inode.nid,
                    shared,
                    size: total,
                },
            ));
        }
        let mut pos = body + XATTR_IBODY_HEADER + 4 * shared;
        let end = body + total;
        while pos < end {
            let (e, size) = self.xattr_entry(inode.nid, inode.in_metabox, pos)?;
            if pos + size > end {
                return Err(Error::corrupt(
                    pos,
                    Corrupt::XattrOverrun { nid: inode.nid },
                ));
            }
            out.extend(e);
            pos += size;
        }
        // Shared xattrs are in the image, or in the metabox when the
        // superblock says so.
        let shared_base = u64::from(self.sb.xattr_blkaddr) << self.sb.blkszbits;
        let shared_in_metabox =
            self.metabox.is_some() && self.sb.has_compat(COMPAT_SHARED_EA_IN_METABOX);
        for k in 0..shared {
            let mut id = U32::new_zeroed();
            self.meta_of(inode, body + XATTR_IBODY_HEADER + 4 * k, id.as_mut_bytes())?;
            let pos = shared_base + 4 * u64::from(id.get());
            let (e, _) = self.xattr_entry(inode.nid, shared_in_metabox, pos)?;
            out.extend(e);
        }
        Ok(out)
    }

    /// The value of `entry`.
    pub fn xattr_value(&self, entry: &XattrEntry) -> Result<Vec<u8>> {
        let mut v = vec![0u8; usize::from(entry.value_len)];
        self.xattr_bytes(entry.nid, entry.in_metabox, entry.value_pos, &mut v)?;
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked_as_the_kernel_finds_their_handler() {
        for ok in [
            &b"user.a"[..],
            b"trusted.overlay.opaque",
            b"security.selinux",
            b"system.posix_acl_access",
            b"system.posix_acl_default",
        ] {
            assert!(check_name(ok).is_ok(), "{:?}", String::from_utf8_lossy(ok));
        }
        for bare in [&b"user."[..], b"trusted.", b"security."] {
            assert!(matches!(check_name(bare), Err(Error::Invalid)));
        }
        for none in [
            &b"system.foo"[..],
            b"system.posix_acl_accessX",
            b"system.",
            b"lustre.lov",
            b"foo",
            b"user",
            b"",
        ] {
            assert!(
                matches!(check_name(none), Err(Error::OperationNotSupported)),
                "{:?}",
                String::from_utf8_lossy(none)
            );
        }
    }
}
