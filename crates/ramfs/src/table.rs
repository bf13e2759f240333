//! The inode table, and what needs nothing but an inode: its attributes,
//! `forget`, and giving its memory back once nothing refers to it.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use foliofs_vfs::{Attr, Ctx, Error, FileType, Ino, Result, SetAttr, TimeSet, Timespec};

use crate::data::MAX_FILE_SIZE;
use crate::node::{Body, Node, State};
use crate::{RamFs, ROOT_INO};

const S_ISUID: u16 = 0o4000;
pub(crate) const S_ISGID: u16 = 0o2000;
const S_IXGRP: u16 = 0o0010;

const SHARDS: usize = 64;

/// Inode table split in shards so that looking an inode up does not contend
/// with creating one elsewhere.
pub(crate) struct Table {
    shards: Box<[Shard]>,
}

type Shard = RwLock<HashMap<Ino, Arc<Node>>>;

impl Table {
    pub fn new() -> Self {
        Table {
            shards: (0..SHARDS).map(|_| RwLock::new(HashMap::new())).collect(),
        }
    }

    fn shard(&self, ino: Ino) -> &Shard {
        &self.shards[(ino % SHARDS as u64) as usize]
    }

    pub fn get(&self, ino: Ino) -> Result<Arc<Node>> {
        let shard = self.shard(ino).read().unwrap_or_else(|e| e.into_inner());
        shard.get(&ino).cloned().ok_or(Error::NotFound)
    }

    pub fn insert(&self, node: Arc<Node>) {
        let mut shard = self
            .shard(node.ino)
            .write()
            .unwrap_or_else(|e| e.into_inner());
        shard.insert(node.ino, node);
    }

    /// Inodes held: those with a name or an open handle, and those the
    /// kernel still holds a lookup on.
    pub fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.read().unwrap_or_else(|e| e.into_inner()).len())
            .sum()
    }

    /// Calls `f` with every inode (shard by shard: inodes made meanwhile
    /// may or may not be seen).
    pub fn for_each(&self, mut f: impl FnMut(&Node)) {
        for shard in self.shards.iter() {
            let nodes: Vec<Arc<Node>> = shard
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .values()
                .cloned()
                .collect();
            for n in nodes {
                f(&n);
            }
        }
    }

    pub fn remove(&self, ino: Ino) {
        let mut shard = self.shard(ino).write().unwrap_or_else(|e| e.into_inner());
        shard.remove(&ino);
    }
}

fn resolve(t: TimeSet, now: Timespec) -> Timespec {
    match t {
        TimeSet::Now => now,
        TimeSet::At(t) => t,
    }
}

impl RamFs {
    /// Gives an inode's memory back once nothing can reach its data any more
    /// (no names, no open handles), and drops it from the table once the
    /// kernel has forgotten it too.
    pub(crate) fn settle(&self, node: &Node, st: &mut State) {
        if st.nlink == 0 && st.opens == 0 && !st.released {
            st.released = true;
            match &mut st.body {
                Body::File(f) => f.clear(&self.space),
                // The memory goes back once the kernel's descriptors of it
                // close too (the last release came before this).
                Body::Backed(_) => st.body = Body::Special,
                Body::Symlink(t) => self.space.give_xattr(t.len() as u64),
                _ => {}
            }
            let held: usize = st.xattrs.iter().map(|(k, v)| k.len() + v.len()).sum();
            self.space.give_xattr(held as u64);
            st.xattrs.clear();
            self.space.give_inode();
        }
        if st.released && st.lookups == 0 {
            self.table.remove(node.ino);
        }
    }

    pub(crate) fn do_getattr(&self, ino: Ino) -> Result<Attr> {
        let node = self.table.get(ino)?;
        let st = node.read();
        Ok(self.attr_of(&node, &st))
    }

    pub(crate) fn do_forget(&self, ino: Ino, nlookup: u64) {
        if ino == ROOT_INO {
            return;
        }
        if let Ok(node) = self.table.get(ino) {
            let mut st = node.write();
            st.lookups = st.lookups.saturating_sub(nlookup);
            self.settle(&node, &mut st);
        }
    }

    pub(crate) fn do_setattr(&self, ino: Ino, set: &SetAttr, _ctx: &Ctx) -> Result<Attr> {
        let node = self.table.get(ino)?;
        let mut st = node.write();
        let now = Timespec::now();
        let cut_from = set.size.map(|s| s.div_ceil(self.bs()));
        let before = match cut_from {
            Some(from) if self.logs() => crate::durable::blocks_in(&st, from, u64::MAX),
            _ => Vec::new(),
        };
        if let Some(size) = set.size {
            if size > MAX_FILE_SIZE {
                return Err(Error::TooBig);
            }
            let bs = self.bs();
            match &mut st.body {
                Body::File(f) => f.truncate(size, bs, &self.space),
                Body::Backed(b) => b.truncate(size).map_err(crate::file::io_error)?,
                _ if node.kind == FileType::Directory => return Err(Error::IsDir),
                _ => return Err(Error::Invalid),
            }
            st.touch_mc(now);
        }
        if let Some(mode) = set.mode {
            st.perm = (mode & 0o7777) as u16;
        }
        if set.uid.is_some() || set.gid.is_some() {
            if let Some(uid) = set.uid {
                st.uid = uid;
            }
            if let Some(gid) = set.gid {
                st.gid = gid;
            }
            // chown drops set-user-ID, and set-group-ID where it means
            // "execute as group" (with group execute), on anything but a
            // directory, unless this very call sets the mode.
            if set.mode.is_none() && node.kind != FileType::Directory {
                st.perm &= !S_ISUID;
                if st.perm & S_IXGRP != 0 {
                    st.perm &= !S_ISGID;
                }
            }
        }
        if let Some(t) = set.atime {
            st.atime = resolve(t, now);
        }
        if let Some(t) = set.mtime {
            st.mtime = resolve(t, now);
            // The backing file's time is read beside ours and the later
            // wins: an older time set here must hold there too.
            if let Body::Backed(b) = &st.body {
                b.set_mtime(st.mtime).map_err(crate::file::io_error)?;
            }
        }
        st.ctime = set.ctime.unwrap_or(now);
        if self.logs() {
            self.log(ino, 0, |tx| {
                tx.changed(&node, &mut st);
                if let (Some(from), Some(f)) = (cut_from, st.file()) {
                    tx.blocks(ino, &before, f, from, u64::MAX);
                }
            });
        }
        Ok(self.attr_of(&node, &st))
    }

    pub(crate) fn do_kill_suid(&self, ino: Ino) -> Result<()> {
        let node = self.table.get(ino)?;
        let mut st = node.write();
        let before = st.perm;
        st.perm &= !S_ISUID;
        if st.perm & S_IXGRP != 0 {
            st.perm &= !S_ISGID;
        }
        let caps = st.xattrs.remove(b"security.capability".as_slice());
        if let Some(v) = &caps {
            self.space
                .give_xattr((b"security.capability".len() + v.len()) as u64);
        }
        if st.perm != before || caps.is_some() {
            st.ctime = Timespec::now();
            if self.logs() {
                self.log(ino, 0, |tx| {
                    tx.changed(&node, &mut st);
                    tx.put(&crate::ledger::Rec::Xattr {
                        ino,
                        name: b"security.capability".to_vec(),
                        value: None,
                    });
                });
            }
        }
        Ok(())
    }
}
