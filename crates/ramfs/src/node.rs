//! Inodes: attributes, body and extended attributes, behind a per-inode lock.

use std::collections::BTreeMap;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use foliofs_vfs::{Attr, FileType, Ino, Rdev, Timespec};

use crate::backing::Backed;
use crate::data::FileData;
use crate::dir::Dir;

/// What an inode holds besides its attributes.
#[derive(Debug)]
pub(crate) enum Body {
    File(FileData),
    /// A regular file whose bytes are in a file of the passthrough pool.
    Backed(Backed),
    Dir(Dir),
    Symlink(Vec<u8>),
    /// Devices, fifos and sockets: nothing beyond `rdev`.
    Special,
}

/// Everything about an inode that changes, guarded by the inode's lock.
#[derive(Debug)]
pub(crate) struct State {
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: Rdev,
    pub atime: Timespec,
    pub mtime: Timespec,
    pub ctime: Timespec,
    pub body: Body,
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    /// References the kernel holds through lookups (dropped by `forget`).
    pub lookups: u64,
    /// Open handles.
    pub opens: u64,
    /// Open handles that may write (a subset of `opens`).
    pub writers: u64,
    /// Set once the inode is unlinked and closed: its data and its inode
    /// slot have gone back to the pool.
    pub released: bool,
    /// Grows with each change a supervised mount's ledger records (see
    /// `ledger/record.rs`).
    pub version: u64,
    /// The kernel's registration of a backed file's backing file, noted by
    /// the FUSE layer (0: none).
    pub backing: u32,
}

/// One inode. Its type never changes, so it lives outside the lock.
#[derive(Debug)]
pub(crate) struct Node {
    pub ino: Ino,
    pub kind: FileType,
    state: RwLock<State>,
}

impl Node {
    pub fn new(ino: Ino, kind: FileType, state: State) -> Self {
        Node {
            ino,
            kind,
            state: RwLock::new(state),
        }
    }

    /// A panic in another thread while it held the lock leaves the state as
    /// consistent as each single field update, so poisoning is not fatal.
    pub fn read(&self) -> RwLockReadGuard<'_, State> {
        self.state.read().unwrap_or_else(|e| e.into_inner())
    }

    pub fn write(&self) -> RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(|e| e.into_inner())
    }
}

/// Directory sizes as tmpfs reports them: a nominal 20 bytes per entry.
const DIRENT_SIZE: u64 = 20;

impl State {
    pub fn new(perm: u16, uid: u32, gid: u32, rdev: Rdev, body: Body) -> Self {
        let now = Timespec::now();
        let nlink = if matches!(body, Body::Dir(_)) { 2 } else { 1 };
        State {
            perm,
            nlink,
            uid,
            gid,
            rdev,
            atime: now,
            mtime: now,
            ctime: now,
            body,
            xattrs: BTreeMap::new(),
            lookups: 0,
            opens: 0,
            writers: 0,
            released: false,
            version: 0,
            backing: 0,
        }
    }

    pub fn attr(&self, ino: Ino, kind: FileType, block_size: u32) -> Attr {
        let (mut mtime, mut ctime) = (self.mtime, self.ctime);
        let (size, blocks) = match &self.body {
            Body::File(f) => (f.size, f.allocated() * u64::from(block_size) / 512),
            // Writes through the kernel move the backing file's times, not
            // ours; every change made here moves both (see `Backed`).
            Body::Backed(b) => match b.stat() {
                Ok(st) => {
                    mtime = mtime.max(st.mtime);
                    ctime = ctime.max(st.ctime);
                    let bs = u64::from(block_size);
                    (st.size, b.blocks(&st, bs) * bs / 512)
                }
                Err(e) => {
                    log::warn!("inode {ino}: the backing file cannot be read: {e}");
                    (0, 0)
                }
            },
            Body::Dir(d) => ((d.len() as u64 + 2) * DIRENT_SIZE, 0),
            Body::Symlink(t) => (t.len() as u64, 0),
            Body::Special => (0, 0),
        };
        Attr {
            ino,
            size,
            blocks,
            kind,
            perm: self.perm,
            nlink: self.nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: self.rdev,
            atime: self.atime,
            mtime,
            ctime,
            blksize: block_size,
        }
    }

    pub fn dir(&self) -> Option<&Dir> {
        match &self.body {
            Body::Dir(d) => Some(d),
            _ => None,
        }
    }

    pub fn dir_mut(&mut self) -> Option<&mut Dir> {
        match &mut self.body {
            Body::Dir(d) => Some(d),
            _ => None,
        }
    }

    pub fn file(&self) -> Option<&FileData> {
        match &self.body {
            Body::File(f) => Some(f),
            _ => None,
        }
    }

    /// Marks a modification of the contents.
    pub fn touch_mc(&mut self, now: Timespec) {
        self.mtime = now;
        self.ctime = now;
    }
}
