//! Extended attributes, held in the inode and counted against `size=`.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use foliofs_vfs::{Ctx, Error, Ino, Result, Timespec};

use crate::node::{Node, State};
use crate::RamFs;

/// Longest extended attribute name and value, as the kernel limits them.
const XATTR_NAME_MAX: usize = 255;
const XATTR_SIZE_MAX: usize = 65536;
/// Bytes of names and values one inode's extended attributes may hold.
const XATTR_TOTAL_MAX: usize = 1 << 20;
/// Namespaces a user may store extended attributes in.
const XATTR_PREFIXES: [&[u8]; 3] = [b"user.", b"trusted.", b"security."];

fn check_xattr_name(name: &OsStr) -> Result<()> {
    let b = name.as_bytes();
    if b.len() > XATTR_NAME_MAX {
        return Err(Error::Range);
    }
    match XATTR_PREFIXES.iter().find(|p| b.starts_with(p)) {
        Some(p) if b.len() > p.len() => Ok(()),
        Some(_) => Err(Error::Invalid),
        None => Err(Error::OperationNotSupported),
    }
}

impl RamFs {
    pub(crate) fn do_getxattr(&self, ino: Ino, name: &OsStr) -> Result<Vec<u8>> {
        check_xattr_name(name)?;
        let node = self.table.get(ino)?;
        let st = node.read();
        st.xattrs
            .get(name.as_bytes())
            .cloned()
            .ok_or(Error::NoSuchXattr)
    }

    pub(crate) fn do_listxattr(&self, ino: Ino) -> Result<Vec<Vec<u8>>> {
        let node = self.table.get(ino)?;
        let st = node.read();
        Ok(st.xattrs.keys().cloned().collect())
    }

    pub(crate) fn do_setxattr(
        &self,
        ino: Ino,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _ctx: &Ctx,
    ) -> Result<()> {
        check_xattr_name(name)?;
        if value.len() > XATTR_SIZE_MAX {
            return Err(Error::Errno(libc::E2BIG));
        }
        let node = self.table.get(ino)?;
        let mut st = node.write();
        let key = name.as_bytes();
        let old = st.xattrs.get(key).map(|v| key.len() + v.len());
        match old {
            Some(_) if flags & libc::XATTR_CREATE != 0 => return Err(Error::Exists),
            None if flags & libc::XATTR_REPLACE != 0 => return Err(Error::NoSuchXattr),
            _ => {}
        }
        let total: usize = st.xattrs.iter().map(|(k, v)| k.len() + v.len()).sum();
        let old = old.unwrap_or(0);
        let new = key.len() + value.len();
        if total - old + new > XATTR_TOTAL_MAX {
            return Err(Error::NoSpace);
        }
        if new > old {
            if !self.space.take_xattr((new - old) as u64) {
                return Err(Error::NoSpace);
            }
        } else {
            self.space.give_xattr((old - new) as u64);
        }
        st.xattrs.insert(key.to_vec(), value.to_vec());
        st.ctime = Timespec::now();
        self.log_xattr(&node, &mut st, key, Some(value));
        Ok(())
    }

    /// Logs that `node`'s xattr `key` is now `value` (`None`: removed).
    fn log_xattr(&self, node: &Node, st: &mut State, key: &[u8], value: Option<&[u8]>) {
        if self.logs() {
            self.log(node.ino, 0, |tx| {
                tx.changed(node, st);
                tx.put(&crate::ledger::Rec::Xattr {
                    ino: node.ino,
                    name: key.to_vec(),
                    value: value.map(<[u8]>::to_vec),
                });
            });
        }
    }

    pub(crate) fn do_removexattr(&self, ino: Ino, name: &OsStr, _ctx: &Ctx) -> Result<()> {
        check_xattr_name(name)?;
        let node = self.table.get(ino)?;
        let mut st = node.write();
        let key = name.as_bytes();
        let value = st.xattrs.remove(key).ok_or(Error::NoSuchXattr)?;
        self.space.give_xattr((key.len() + value.len()) as u64);
        st.ctime = Timespec::now();
        self.log_xattr(&node, &mut st, key, None);
        Ok(())
    }
}
