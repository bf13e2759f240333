//! rename(2), with `RENAME_NOREPLACE` and `RENAME_EXCHANGE`.

use std::ffi::OsStr;

use foliofs_vfs::{Ctx, Error, FileType, Ino, Result, Timespec};

use crate::dir::Dir;
use crate::names::check_name;
use crate::{RamFs, NAME_MAX, ROOT_INO};

impl RamFs {
    /// True when `ancestor` is `ino` or one of its ancestors. The caller
    /// holds the name-space lock, so the parent chain cannot change.
    fn is_ancestor(&self, ancestor: Ino, mut ino: Ino) -> Result<bool> {
        loop {
            if ino == ancestor {
                return Ok(true);
            }
            if ino == ROOT_INO {
                return Ok(false);
            }
            ino = self.parent_of(ino)?;
        }
    }

    fn rename_locked(
        &self,
        parent: Ino,
        name: &OsStr,
        newparent: Ino,
        newname: &OsStr,
        flags: u32,
    ) -> Result<()> {
        let exchange = flags & libc::RENAME_EXCHANGE != 0;
        let noreplace = flags & libc::RENAME_NOREPLACE != 0;
        let src = self.entry(parent, name)?;
        let dst = match self.entry(newparent, newname) {
            Ok(e) => Some(e),
            Err(Error::NotFound) => None,
            Err(e) => return Err(e),
        };
        if let Some(d) = &dst {
            // Two names of one inode: rename does nothing, as POSIX says.
            if d.ino == src.ino {
                return Ok(());
            }
        }
        let src_dir = src.kind == FileType::Directory;
        match (&dst, exchange) {
            (None, true) => return Err(Error::NotFound),
            (Some(_), false) if noreplace => return Err(Error::Exists),
            (Some(d), false) => {
                let dst_dir = d.kind == FileType::Directory;
                if src_dir && !dst_dir {
                    return Err(Error::NotDir);
                }
                if !src_dir && dst_dir {
                    return Err(Error::IsDir);
                }
                if dst_dir {
                    let dn = self.table.get(d.ino)?;
                    if !dn.read().dir().is_some_and(Dir::is_empty) {
                        return Err(Error::NotEmpty);
                    }
                }
            }
            _ => {}
        }
        if parent != newparent {
            // A directory must not move below itself.
            if src_dir && self.is_ancestor(src.ino, newparent)? {
                return Err(Error::Invalid);
            }
            if let Some(d) = dst
                .as_ref()
                .filter(|d| exchange && d.kind == FileType::Directory)
            {
                if self.is_ancestor(d.ino, parent)? {
                    return Err(Error::Invalid);
                }
            }
        }

        let now = Timespec::now();
        let dst_dir = dst.as_ref().is_some_and(|d| d.kind == FileType::Directory);
        let op = self.table.get(parent)?;
        if parent == newparent {
            let mut ps = op.write();
            let dir = ps.dir_mut().ok_or(Error::NotDir)?;
            if let (true, Some(d)) = (exchange, &dst) {
                dir.replace(name, d.ino, d.kind);
                dir.replace(newname, src.ino, src.kind);
            } else {
                if dst.is_some() {
                    dir.remove(newname);
                }
                dir.remove(name);
                dir.insert(newname, src.ino, src.kind);
                if dst_dir {
                    ps.nlink -= 1;
                }
            }
            ps.touch_mc(now);
        } else {
            let np = self.table.get(newparent)?;
            let mut os = op.write();
            let mut ns = np.write();
            // A removed directory takes no new names: what moved in could
            // never be reached or freed again.
            if ns.nlink == 0 {
                return Err(Error::NotFound);
            }
            if let (true, Some(d)) = (exchange, &dst) {
                os.dir_mut()
                    .ok_or(Error::NotDir)?
                    .replace(name, d.ino, d.kind);
                ns.dir_mut()
                    .ok_or(Error::NotDir)?
                    .replace(newname, src.ino, src.kind);
                if src_dir {
                    os.nlink -= 1;
                    ns.nlink += 1;
                }
                if dst_dir {
                    ns.nlink -= 1;
                    os.nlink += 1;
                }
            } else {
                let nd = ns.dir_mut().ok_or(Error::NotDir)?;
                if dst.is_some() {
                    nd.remove(newname);
                }
                nd.insert(newname, src.ino, src.kind);
                os.dir_mut().ok_or(Error::NotDir)?.remove(name);
                if dst_dir {
                    ns.nlink -= 1;
                }
                if src_dir {
                    os.nlink -= 1;
                    ns.nlink += 1;
                }
            }
            os.touch_mc(now);
            ns.touch_mc(now);
        }

        // The moved inode(s): a new ctime, and for directories a new "..".
        let moved = self.table.get(src.ino)?;
        {
            let mut ms = moved.write();
            ms.ctime = now;
            if let Some(d) = ms.dir_mut() {
                d.parent = newparent;
            }
        }
        if let Some(d) = &dst {
            let other = self.table.get(d.ino)?;
            let mut st = other.write();
            st.ctime = now;
            if exchange {
                if let Some(dd) = st.dir_mut() {
                    dd.parent = parent;
                }
            } else {
                st.nlink = if dst_dir { 0 } else { st.nlink - 1 };
                if st.nlink > 0 {
                    self.space.give_inode();
                }
                self.settle(&other, &mut st);
            }
        }
        Ok(())
    }

    pub(crate) fn do_rename(
        &self,
        parent: Ino,
        name: &OsStr,
        newparent: Ino,
        newname: &OsStr,
        flags: u32,
        _ctx: &Ctx,
    ) -> Result<()> {
        let known = libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE;
        if flags & !known != 0 {
            return Err(Error::Invalid);
        }
        if flags == known {
            return Err(Error::Invalid);
        }
        if name.len() > NAME_MAX as usize {
            return Err(Error::NameTooLong);
        }
        check_name(newname).map_err(|e| match e {
            Error::Exists => Error::Invalid,
            e => e,
        })?;
        let _names = self.names();
        self.rename_locked(parent, name, newparent, newname, flags)
    }
}
