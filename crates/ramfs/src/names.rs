//! The name space: looking names up, listing directories, and making and
//! removing names (rename has a file of its own).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use foliofs_vfs::{Attr, Ctx, DirEntry, Error, FileType, Ino, Rdev, Result, Timespec};

use crate::dir::{Dir, Entry};
use crate::node::{Body, Node, State};
use crate::table::S_ISGID;
use crate::{RamFs, NAME_MAX};

/// Longest symbolic link target (the kernel's `PATH_MAX` less the NUL).
const SYMLINK_MAX: usize = 4095;
/// Most links one inode may have.
const LINK_MAX: u32 = u32::MAX - 1;
/// Entries handed to a `readdir` sink per lock hold.
const READDIR_BATCH: usize = 128;

/// What a new inode is made of.
struct NewNode {
    kind: FileType,
    perm: u16,
    rdev: Rdev,
    body: Body,
}

impl NewNode {
    fn plain(kind: FileType, perm: u16, body: Body) -> Self {
        NewNode {
            kind,
            perm,
            rdev: Rdev::default(),
            body,
        }
    }
}

/// Validates a name for a new directory entry.
pub(crate) fn check_name(name: &OsStr) -> Result<()> {
    let b = name.as_bytes();
    if b.len() > NAME_MAX as usize {
        return Err(Error::NameTooLong);
    }
    if b.is_empty() || b.contains(&b'/') || b.contains(&0) {
        return Err(Error::Invalid);
    }
    if b == b"." || b == b".." {
        return Err(Error::Exists);
    }
    Ok(())
}

impl RamFs {
    /// Makes a new inode named `name` in `parent`. The caller holds the
    /// name-space lock and has checked `name`.
    fn make_node(&self, parent: Ino, name: &OsStr, new: NewNode, ctx: &Ctx) -> Result<Arc<Node>> {
        let NewNode {
            kind,
            perm,
            rdev,
            body,
        } = new;
        let p = self.table.get(parent)?;
        let mut ps = p.write();
        if ps.nlink == 0 {
            return Err(Error::NotFound);
        }
        let (pgid, sgid_dir) = (ps.gid, ps.perm & S_ISGID != 0);
        let dir = ps.dir_mut().ok_or(Error::NotDir)?;
        if dir.get(name).is_some() {
            return Err(Error::Exists);
        }
        if !self.space.take_inode() {
            return Err(Error::NoSpace);
        }
        let ino = self.next_ino.fetch_add(1, Ordering::Relaxed);
        // A set-group-ID directory hands its group down, and its set-group-ID
        // bit to subdirectories (BSD group semantics).
        let mut perm = perm & 0o7777;
        let gid = if sgid_dir {
            if kind == FileType::Directory {
                perm |= S_ISGID;
            }
            pgid
        } else {
            ctx.gid
        };
        let body = match body {
            Body::Dir(_) => Body::Dir(Dir::new(parent)),
            b => b,
        };
        let mut st = State::new(perm, ctx.uid, gid, rdev, body);
        st.lookups = 1;
        let now = st.ctime;
        let node = Arc::new(Node::new(ino, kind, st));
        self.table.insert(node.clone());
        dir.insert(name, ino, kind);
        if kind == FileType::Directory {
            ps.nlink += 1;
        }
        ps.touch_mc(now);
        Ok(node)
    }

    fn make(&self, parent: Ino, name: &OsStr, new: NewNode, ctx: &Ctx) -> Result<Attr> {
        check_name(name)?;
        let _names = self.names();
        let node = self.make_node(parent, name, new, ctx)?;
        if self.logs() {
            let p = self.table.get(parent)?;
            self.log_names(node.ino, 0, &[node.clone(), p], &[(parent, name)]);
        }
        let st = node.read();
        Ok(self.attr_of(&node, &st))
    }

    /// The entry `name` of directory `parent`.
    pub(crate) fn entry(&self, parent: Ino, name: &OsStr) -> Result<Entry> {
        let p = self.table.get(parent)?;
        let ps = p.read();
        let dir = ps.dir().ok_or(Error::NotDir)?;
        dir.get(name).cloned().ok_or(Error::NotFound)
    }

    /// The `..` of directory `ino`.
    pub(crate) fn parent_of(&self, ino: Ino) -> Result<Ino> {
        let n = self.table.get(ino)?;
        let st = n.read();
        Ok(st.dir().ok_or(Error::NotDir)?.parent)
    }

    pub(crate) fn do_lookup(&self, parent: Ino, name: &OsStr) -> Result<Attr> {
        if name.len() > NAME_MAX as usize {
            return Err(Error::NameTooLong);
        }
        let ino = match name.as_bytes() {
            b"." => {
                self.parent_of(parent)?;
                parent
            }
            b".." => self.parent_of(parent)?,
            _ => self.entry(parent, name)?.ino,
        };
        let node = self.table.get(ino)?;
        let mut st = node.write();
        if st.nlink == 0 {
            return Err(Error::NotFound);
        }
        st.lookups += 1;
        Ok(self.attr_of(&node, &st))
    }

    pub(crate) fn do_readdir(
        &self,
        ino: Ino,
        offset: u64,
        sink: &mut dyn FnMut(DirEntry<'_>) -> bool,
    ) -> Result<()> {
        let node = self.table.get(ino)?;
        let mut offset = offset;
        loop {
            // Copy a batch out so the sink runs without the directory lock
            // (it may call back into the file system).
            let batch: Vec<(u64, Entry)> = {
                let st = node.read();
                let dir = st.dir().ok_or(Error::NotDir)?;
                dir.after(offset)
                    .take(READDIR_BATCH)
                    .map(|(c, e)| (c, e.clone()))
                    .collect()
            };
            let last = batch.len() < READDIR_BATCH;
            for (cookie, e) in &batch {
                let full = sink(DirEntry {
                    ino: e.ino,
                    next: *cookie,
                    kind: e.kind,
                    name: &e.name,
                });
                if full {
                    return Ok(());
                }
                offset = *cookie;
            }
            if last {
                return Ok(());
            }
        }
    }

    pub(crate) fn do_mknod(
        &self,
        parent: Ino,
        name: &OsStr,
        kind: FileType,
        perm: u16,
        rdev: u32,
        ctx: &Ctx,
    ) -> Result<Attr> {
        let (body, rdev) = match kind {
            // Nothing opens a node made by mknod at once: its descriptor
            // is closed here.
            FileType::RegularFile => (self.new_file_body()?.0, Rdev::default()),
            FileType::Fifo | FileType::Socket => (Body::Special, Rdev::default()),
            FileType::BlockDevice | FileType::CharDevice => {
                (Body::Special, Rdev::from_new_encoding(rdev))
            }
            FileType::Directory | FileType::Symlink => return Err(Error::Invalid),
        };
        let new = NewNode {
            kind,
            perm,
            rdev,
            body,
        };
        self.make(parent, name, new, ctx)
    }

    pub(crate) fn do_create(
        &self,
        parent: Ino,
        name: &OsStr,
        perm: u16,
        flags: i32,
        ctx: &Ctx,
    ) -> Result<(Attr, u64)> {
        check_name(name)?;
        let _names = self.names();
        let (node, existed) = match self.entry(parent, name) {
            Ok(e) => {
                if flags & libc::O_EXCL != 0 {
                    return Err(Error::Exists);
                }
                if e.kind == FileType::Directory {
                    return Err(Error::IsDir);
                }
                (self.table.get(e.ino)?, true)
            }
            Err(Error::NotFound) => {
                let (body, file) = self.new_file_body()?;
                let new = NewNode::plain(FileType::RegularFile, perm, body);
                let node = self.make_node(parent, name, new, ctx)?;
                if let Some(f) = file {
                    self.keep_fresh(node.ino, f);
                }
                (node, false)
            }
            Err(e) => return Err(e),
        };
        let mut st = node.write();
        if existed {
            // The reply counts as a lookup, as for a new inode.
            st.lookups += 1;
        }
        let before = crate::durable::blocks_in(&st, 0, u64::MAX);
        let fh = self.open_node(&mut st, flags);
        let attr = self.attr_of(&node, &st);
        if self.logs() {
            self.log(node.ino, fh, |tx| {
                tx.changed(&node, &mut st);
                if let Some(f) = st.file() {
                    tx.blocks(node.ino, &before, f, 0, u64::MAX);
                }
                if !existed {
                    if let Ok(p) = self.table.get(parent) {
                        let mut ps = p.write();
                        tx.changed(&p, &mut ps);
                        tx.name(parent, &ps, name);
                    }
                }
            });
        }
        Ok((attr, fh))
    }

    pub(crate) fn do_mkdir(&self, parent: Ino, name: &OsStr, perm: u16, ctx: &Ctx) -> Result<Attr> {
        let new = NewNode::plain(FileType::Directory, perm, Body::Dir(Dir::new(parent)));
        self.make(parent, name, new, ctx)
    }

    pub(crate) fn do_symlink(
        &self,
        parent: Ino,
        name: &OsStr,
        target: &[u8],
        ctx: &Ctx,
    ) -> Result<Attr> {
        if target.len() > SYMLINK_MAX {
            return Err(Error::NameTooLong);
        }
        if target.is_empty() {
            return Err(Error::NotFound);
        }
        // Targets are held to the byte limit like extended attributes.
        if !self.space.take_xattr(target.len() as u64) {
            return Err(Error::NoSpace);
        }
        let new = NewNode::plain(FileType::Symlink, 0o777, Body::Symlink(target.to_vec()));
        self.make(parent, name, new, ctx).inspect_err(|_| {
            self.space.give_xattr(target.len() as u64);
        })
    }

    pub(crate) fn do_unlink(&self, parent: Ino, name: &OsStr, _ctx: &Ctx) -> Result<()> {
        let _names = self.names();
        let p = self.table.get(parent)?;
        let mut ps = p.write();
        let dir = ps.dir_mut().ok_or(Error::NotDir)?;
        let e = dir.get(name).cloned().ok_or(Error::NotFound)?;
        if e.kind == FileType::Directory {
            return Err(Error::IsDir);
        }
        let child = self.table.get(e.ino)?;
        dir.remove(name);
        let now = Timespec::now();
        ps.touch_mc(now);
        drop(ps);
        let mut cs = child.write();
        cs.nlink = cs.nlink.saturating_sub(1);
        if cs.nlink > 0 {
            // One of several names went: its slot comes back now; the last
            // name's slot comes back with the inode.
            self.space.give_inode();
        }
        cs.ctime = now;
        self.settle(&child, &mut cs);
        drop(cs);
        self.log_names(0, 0, &[child, p], &[(parent, name)]);
        Ok(())
    }

    pub(crate) fn do_rmdir(&self, parent: Ino, name: &OsStr, _ctx: &Ctx) -> Result<()> {
        match name.as_bytes() {
            b"." => return Err(Error::Invalid),
            b".." => return Err(Error::NotEmpty),
            _ => {}
        }
        let _names = self.names();
        let p = self.table.get(parent)?;
        let mut ps = p.write();
        let dir = ps.dir_mut().ok_or(Error::NotDir)?;
        let e = dir.get(name).cloned().ok_or(Error::NotFound)?;
        if e.kind != FileType::Directory {
            return Err(Error::NotDir);
        }
        let child = self.table.get(e.ino)?;
        let mut cs = child.write();
        if !cs.dir().is_some_and(Dir::is_empty) {
            return Err(Error::NotEmpty);
        }
        dir.remove(name);
        let now = Timespec::now();
        ps.nlink -= 1;
        ps.touch_mc(now);
        drop(ps);
        cs.nlink = 0;
        cs.ctime = now;
        self.settle(&child, &mut cs);
        drop(cs);
        self.log_names(0, 0, &[child, p], &[(parent, name)]);
        Ok(())
    }

    pub(crate) fn do_link(
        &self,
        ino: Ino,
        newparent: Ino,
        newname: &OsStr,
        _ctx: &Ctx,
    ) -> Result<Attr> {
        check_name(newname)?;
        let _names = self.names();
        let node = self.table.get(ino)?;
        if node.kind == FileType::Directory {
            return Err(Error::NotPermitted);
        }
        let p = self.table.get(newparent)?;
        let mut ps = p.write();
        if ps.nlink == 0 {
            return Err(Error::NotFound);
        }
        let dir = ps.dir_mut().ok_or(Error::NotDir)?;
        if dir.get(newname).is_some() {
            return Err(Error::Exists);
        }
        let mut st = node.write();
        if st.nlink == 0 {
            return Err(Error::NotFound);
        }
        if st.nlink >= LINK_MAX {
            return Err(Error::TooManyLinks);
        }
        // Every name beyond an inode's first takes an inode slot, as in
        // tmpfs: otherwise links would be names without any bound.
        if !self.space.take_inode() {
            return Err(Error::NoSpace);
        }
        dir.insert(newname, ino, node.kind);
        let now = Timespec::now();
        ps.touch_mc(now);
        st.nlink += 1;
        st.ctime = now;
        st.lookups += 1;
        let attr = self.attr_of(&node, &st);
        drop(st);
        drop(ps);
        self.log_names(ino, 0, &[node, p], &[(newparent, newname)]);
        Ok(attr)
    }
}
