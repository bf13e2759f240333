//! rename(2), with `RENAME_NOREPLACE` and `RENAME_EXCHANGE`.

use std::ffi::OsStr;

use foliofs_vfs::{Ctx, Error, FileType, Ino, Result, Timespec};

use crate::dir::{Dir, Entry};
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
        let mv = Move {
            parent,
            name,
            newparent,
            newname,
            src,
            dst,
            exchange: flags & libc::RENAME_EXCHANGE != 0,
        };
        self.check_rename(&mv, flags & libc::RENAME_NOREPLACE != 0)?;
        let now = Timespec::now();
        if parent == newparent {
            self.move_within(&mv, now)?;
        } else {
            self.move_across(&mv, now)?;
        }
        self.account_moved(&mv, now)
    }

    /// Refuses what rename(2) refuses: exchanging with nothing, replacing
    /// under `RENAME_NOREPLACE`, a directory and a non-directory over each
    /// other, replacing a directory that is not empty, and a directory
    /// moved below itself.
    fn check_rename(&self, mv: &Move<'_>, noreplace: bool) -> Result<()> {
        let src_dir = mv.src_dir();
        match (&mv.dst, mv.exchange) {
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
        if mv.parent != mv.newparent {
            // A directory must not move below itself.
            if src_dir && self.is_ancestor(mv.src.ino, mv.newparent)? {
                return Err(Error::Invalid);
            }
            if let Some(d) = mv
                .dst
                .as_ref()
                .filter(|d| mv.exchange && d.kind == FileType::Directory)
            {
                if self.is_ancestor(d.ino, mv.parent)? {
                    return Err(Error::Invalid);
                }
            }
        }
        Ok(())
    }

    /// The names' move inside one directory.
    fn move_within(&self, mv: &Move<'_>, now: Timespec) -> Result<()> {
        let (src, dst) = (&mv.src, &mv.dst);
        let op = self.table.get(mv.parent)?;
        let mut ps = op.write();
        let dir = ps.dir_mut().ok_or(Error::NotDir)?;
        if let (true, Some(d)) = (mv.exchange, dst) {
            dir.replace(mv.name, d.ino, d.kind);
            dir.replace(mv.newname, src.ino, src.kind);
        } else {
            if dst.is_some() {
                dir.remove(mv.newname);
            }
            dir.remove(mv.name);
            dir.insert(mv.newname, src.ino, src.kind);
            if mv.dst_dir() {
                ps.nlink -= 1;
            }
        }
        ps.touch_mc(now);
        Ok(())
    }

    /// The names' move from one directory to another, with the parents'
    /// link counts for the directories that change parent.
    fn move_across(&self, mv: &Move<'_>, now: Timespec) -> Result<()> {
        let (src, dst) = (&mv.src, &mv.dst);
        let (src_dir, dst_dir) = (mv.src_dir(), mv.dst_dir());
        let op = self.table.get(mv.parent)?;
        let np = self.table.get(mv.newparent)?;
        let mut os = op.write();
        let mut ns = np.write();
        // A removed directory takes no new names: what moved in could
        // never be reached or freed again.
        if ns.nlink == 0 {
            return Err(Error::NotFound);
        }
        if let (true, Some(d)) = (mv.exchange, dst) {
            os.dir_mut()
                .ok_or(Error::NotDir)?
                .replace(mv.name, d.ino, d.kind);
            ns.dir_mut()
                .ok_or(Error::NotDir)?
                .replace(mv.newname, src.ino, src.kind);
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
                nd.remove(mv.newname);
            }
            nd.insert(mv.newname, src.ino, src.kind);
            os.dir_mut().ok_or(Error::NotDir)?.remove(mv.name);
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
        Ok(())
    }

    /// The moved inode(s): a new ctime, and for directories a new "..".
    /// A replaced inode loses the name: its inode slot comes back now while
    /// other names remain (every name beyond the first takes one), the
    /// inode itself once none does (`settle`).
    fn account_moved(&self, mv: &Move<'_>, now: Timespec) -> Result<()> {
        let moved = self.table.get(mv.src.ino)?;
        {
            let mut ms = moved.write();
            ms.ctime = now;
            if let Some(d) = ms.dir_mut() {
                d.parent = mv.newparent;
            }
        }
        if let Some(d) = &mv.dst {
            let other = self.table.get(d.ino)?;
            let mut st = other.write();
            st.ctime = now;
            if mv.exchange {
                if let Some(dd) = st.dir_mut() {
                    dd.parent = mv.parent;
                }
            } else {
                st.nlink = if mv.dst_dir() { 0 } else { st.nlink - 1 };
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
        if !self.logs() {
            return self.rename_locked(parent, name, newparent, newname, flags);
        }
        // Held here: a replaced inode leaves the table, and its image
        // (no link left) must still be logged.
        let moved: Vec<_> = [self.entry(parent, name), self.entry(newparent, newname)]
            .into_iter()
            .filter_map(|e| e.ok().map(|e| e.ino))
            .chain([parent, newparent])
            .filter_map(|ino| self.table.get(ino).ok())
            .collect();
        self.rename_locked(parent, name, newparent, newname, flags)?;
        self.log_names(0, 0, &moved, &[(parent, name), (newparent, newname)]);
        Ok(())
    }
}

/// One rename, its names looked up: `src` is `name` in `parent`, `dst`
/// what `newname` in `newparent` names now, if anything.
struct Move<'a> {
    parent: Ino,
    name: &'a OsStr,
    newparent: Ino,
    newname: &'a OsStr,
    src: Entry,
    dst: Option<Entry>,
    exchange: bool,
}

impl Move<'_> {
    fn src_dir(&self) -> bool {
        self.src.kind == FileType::Directory
    }

    fn dst_dir(&self) -> bool {
        self.dst
            .as_ref()
            .is_some_and(|d| d.kind == FileType::Directory)
    }
}
