//! A writable in-memory file system whose file data lives in blocks of a
//! chosen size (4 KiB to 2 MiB), served through the [`FileSystem`] trait.
//!
//! [`RamFs`] keeps every inode in a sharded table and guards each inode with
//! its own lock, so reads and writes of different files never wait for each
//! other and reads of one file run in parallel. Changes to the name space
//! (create, link, unlink, rename, ...) are serialised by one mutex, which no
//! read or write ever takes: that keeps rename's multi-inode updates simple
//! and deadlock-free without slowing the data path.
//!
//! Permission checks are the kernel's (the FUSE mount uses
//! `default_permissions`); this crate keeps the POSIX bookkeeping: link
//! counts, timestamps, set-group-ID inheritance, the clearing of set-user-ID
//! bits on chown, and the `size=` / `nr_inodes=` limits.
//!
//! ```
//! use foliofs_ramfs::{Options, RamFs};
//! use foliofs_vfs::{Ctx, FileSystem, Scratch};
//!
//! let mut opts = Options::default();
//! opts.set("blocksize", Some("64K")).unwrap();
//! let fs = RamFs::new(&opts);
//! let ctx = Ctx::default();
//! let (attr, fh) = fs.create(fs.root(), "hello".as_ref(), 0o644, libc::O_RDWR, &ctx).unwrap();
//! fs.write(attr.ino, fh, 0, b"hi there", 0).unwrap();
//! let mut scratch = Scratch::new();
//! assert_eq!(fs.read(attr.ino, 3, 100, &mut scratch).unwrap(), b"there");
//! fs.release(attr.ino, fh).unwrap();
//! ```

mod block;
mod data;
mod dir;
mod node;
mod options;
mod space;
#[cfg(test)]
mod tests;

pub use options::{
    total_ram, Options, SizeLimit, DEFAULT_BLOCK_SIZE, DEFAULT_MODE, MAX_BLOCK_SIZE, MIN_BLOCK_SIZE,
};

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use foliofs_vfs::{
    Attr, Ctx, DirEntry, Error, FileSystem, FileType, FsInfo, Ino, Rdev, Result, Scratch, SetAttr,
    StatFs, TimeSet, Timespec,
};

use data::{FileData, MAX_FILE_SIZE};
use dir::{Dir, Entry};
use node::{Body, Node, State};
use space::Space;

/// The root directory's inode number.
pub const ROOT_INO: Ino = 1;
/// Longest name a directory entry may have.
pub const NAME_MAX: u32 = 255;
/// Longest symbolic link target (the kernel's `PATH_MAX` less the NUL).
const SYMLINK_MAX: usize = 4095;
/// Longest extended attribute name and value, as the kernel limits them.
const XATTR_NAME_MAX: usize = 255;
const XATTR_SIZE_MAX: usize = 65536;
/// Bytes of names and values one inode's extended attributes may hold.
const XATTR_TOTAL_MAX: usize = 1 << 20;
/// Most links one inode may have.
const LINK_MAX: u32 = u32::MAX - 1;
/// Namespaces a user may store extended attributes in.
const XATTR_PREFIXES: [&[u8]; 3] = [b"user.", b"trusted.", b"security."];
/// Entries handed to a `readdir` sink per lock hold.
const READDIR_BATCH: usize = 128;

const S_ISUID: u16 = 0o4000;
const S_ISGID: u16 = 0o2000;
const S_IXGRP: u16 = 0o0010;

const SHARDS: usize = 64;

/// Inode table split in shards so that looking an inode up does not contend
/// with creating one elsewhere.
struct Table {
    shards: Box<[Shard]>,
}

type Shard = RwLock<HashMap<Ino, Arc<Node>>>;

impl Table {
    fn new() -> Self {
        Table {
            shards: (0..SHARDS).map(|_| RwLock::new(HashMap::new())).collect(),
        }
    }

    fn shard(&self, ino: Ino) -> &Shard {
        &self.shards[(ino % SHARDS as u64) as usize]
    }

    fn get(&self, ino: Ino) -> Result<Arc<Node>> {
        let shard = self.shard(ino).read().unwrap_or_else(|e| e.into_inner());
        shard.get(&ino).cloned().ok_or(Error::NotFound)
    }

    fn insert(&self, node: Arc<Node>) {
        let mut shard = self
            .shard(node.ino)
            .write()
            .unwrap_or_else(|e| e.into_inner());
        shard.insert(node.ino, node);
    }

    fn remove(&self, ino: Ino) {
        let mut shard = self.shard(ino).write().unwrap_or_else(|e| e.into_inner());
        shard.remove(&ino);
    }
}

/// A writable in-memory file system.
pub struct RamFs {
    opts: Options,
    block_size: u32,
    table: Table,
    next_ino: AtomicU64,
    next_fh: AtomicU64,
    space: Space,
    /// Serialises changes to the name space (never taken by reads or writes).
    names: Mutex<()>,
}

impl std::fmt::Debug for RamFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RamFs")
            .field("opts", &self.opts)
            .field("used_blocks", &self.space.used_blocks())
            .field("used_inodes", &self.space.used_inodes())
            .finish()
    }
}

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
fn check_name(name: &OsStr) -> Result<()> {
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

fn check_xattr_name(name: &OsStr) -> Result<()> {
    let b = name.as_bytes();
    if b.len() > XATTR_NAME_MAX {
        return Err(Error::Range);
    }
    match XATTR_PREFIXES.iter().find(|p| b.starts_with(p)) {
        Some(p) if b.len() > p.len() => Ok(()),
        Some(_) => Err(Error::Invalid),
        None => Err(Error::NotSupported),
    }
}

fn resolve(t: TimeSet, now: Timespec) -> Timespec {
    match t {
        TimeSet::Now => now,
        TimeSet::At(t) => t,
    }
}

impl RamFs {
    /// An empty file system with these options, its limits resolved against
    /// this machine's memory.
    pub fn new(opts: &Options) -> Self {
        let ram = total_ram();
        let bs = u64::from(opts.block_size);
        // `size=0` lifts the limit, but memory still bounds what can be
        // stored: cap it there so no single call can promise more blocks
        // than the machine has.
        let max_bytes = opts.size_limit(ram).unwrap_or(ram);
        block::set_pool_limit(max_bytes);
        block::set_huge(opts.huge);
        let space = Space::new(bs, Some(max_bytes), opts.inode_limit(ram));
        let fs = RamFs {
            opts: opts.clone(),
            block_size: opts.block_size,
            table: Table::new(),
            next_ino: AtomicU64::new(ROOT_INO + 1),
            next_fh: AtomicU64::new(1),
            space,
            names: Mutex::new(()),
        };
        // The root takes an inode slot like any other; a limit of 0 inodes is
        // "unlimited", so this always succeeds.
        let _ = fs.space.take_inode();
        let mut st = State::new(
            (opts.mode & 0o7777) as u16,
            opts.uid,
            opts.gid,
            Rdev::default(),
            Body::Dir(Dir::new(ROOT_INO)),
        );
        st.lookups = 1;
        fs.table
            .insert(Arc::new(Node::new(ROOT_INO, FileType::Directory, st)));
        fs
    }

    /// The options this file system was made with.
    pub fn options(&self) -> &Options {
        &self.opts
    }

    fn names(&self) -> MutexGuard<'_, ()> {
        self.names.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn bs(&self) -> u64 {
        u64::from(self.block_size)
    }

    fn attr_of(&self, node: &Node, st: &State) -> Attr {
        st.attr(node.ino, node.kind, self.block_size)
    }

    /// Gives an inode's memory back once nothing can reach its data any more
    /// (no names, no open handles), and drops it from the table once the
    /// kernel has forgotten it too.
    fn settle(&self, node: &Node, st: &mut State) {
        if st.nlink == 0 && st.opens == 0 && !st.released {
            st.released = true;
            match &mut st.body {
                Body::File(f) => f.clear(&self.space),
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
        let st = node.read();
        Ok(self.attr_of(&node, &st))
    }

    /// The entry `name` of directory `parent`.
    fn entry(&self, parent: Ino, name: &OsStr) -> Result<Entry> {
        let p = self.table.get(parent)?;
        let ps = p.read();
        let dir = ps.dir().ok_or(Error::NotDir)?;
        dir.get(name).cloned().ok_or(Error::NotFound)
    }

    fn open_node(&self, st: &mut State, flags: i32) -> u64 {
        if flags & libc::O_TRUNC != 0 && flags & libc::O_ACCMODE != libc::O_RDONLY {
            if let Some(f) = st.file_mut() {
                f.truncate(0, u64::from(self.block_size), &self.space);
                st.touch_mc(Timespec::now());
            }
        }
        st.opens += 1;
        // The low bit of a handle says whether it may write, so `release`
        // can keep `writers` right without a table of handles.
        let writable = flags & libc::O_ACCMODE != libc::O_RDONLY;
        if writable {
            st.writers += 1;
        }
        (self.next_fh.fetch_add(1, Ordering::Relaxed) << 1) | u64::from(writable)
    }

    /// Blocks and inodes in use (for tests and `statfs`).
    pub fn usage(&self) -> (u64, u64) {
        (self.space.used_blocks(), self.space.used_inodes())
    }

    /// Bytes of extended attribute names and values held.
    pub fn xattr_bytes(&self) -> u64 {
        self.space.used_xattr()
    }

    /// The `..` of directory `ino`.
    fn parent_of(&self, ino: Ino) -> Result<Ino> {
        let n = self.table.get(ino)?;
        let st = n.read();
        Ok(st.dir().ok_or(Error::NotDir)?.parent)
    }

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
}

impl FileSystem for RamFs {
    fn root(&self) -> Ino {
        ROOT_INO
    }

    fn info(&self) -> FsInfo {
        FsInfo {
            fs_type: "ramfs",
            block_size: self.block_size,
            name_max: NAME_MAX,
            read_only: false,
        }
    }

    fn statfs(&self) -> Result<StatFs> {
        let blocks = self.space.max_blocks();
        // "Unlimited" inodes still need a figure: one per page of memory.
        let files = match self.space.max_inodes() {
            u64::MAX => total_ram() / 4096,
            n => n,
        };
        let used_b = self.space.used_blocks();
        let used_i = self.space.used_inodes();
        let bfree = blocks.saturating_sub(used_b);
        Ok(StatFs {
            blocks,
            bfree,
            bavail: bfree,
            files,
            ffree: files.saturating_sub(used_i),
            bsize: self.block_size,
            frsize: self.block_size,
            namelen: NAME_MAX,
        })
    }

    fn getattr(&self, ino: Ino) -> Result<Attr> {
        let node = self.table.get(ino)?;
        let st = node.read();
        Ok(self.attr_of(&node, &st))
    }

    fn lookup(&self, parent: Ino, name: &OsStr) -> Result<Attr> {
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

    fn forget(&self, ino: Ino, nlookup: u64) {
        if ino == ROOT_INO {
            return;
        }
        if let Ok(node) = self.table.get(ino) {
            let mut st = node.write();
            st.lookups = st.lookups.saturating_sub(nlookup);
            self.settle(&node, &mut st);
        }
    }

    fn readdir(
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

    fn read<'a>(
        &self,
        ino: Ino,
        offset: u64,
        size: u32,
        scratch: &'a mut Scratch,
    ) -> Result<&'a [u8]> {
        let node = self.table.get(ino)?;
        let st = node.read();
        let file = match (&st.body, node.kind) {
            (Body::File(f), _) => f,
            (_, FileType::Directory) => return Err(Error::IsDir),
            _ => return Err(Error::Invalid),
        };
        if offset >= file.size {
            return Ok(&[]);
        }
        let n = u64::from(size).min(file.size - offset) as usize;
        let buf = scratch.get(n);
        file.read_into(offset, buf, self.bs());
        Ok(buf)
    }

    fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        let node = self.table.get(ino)?;
        let st = node.read();
        match &st.body {
            Body::Symlink(t) => Ok(t.clone()),
            _ => Err(Error::NotSymlink),
        }
    }

    fn getxattr(&self, ino: Ino, name: &OsStr) -> Result<Vec<u8>> {
        check_xattr_name(name)?;
        let node = self.table.get(ino)?;
        let st = node.read();
        st.xattrs
            .get(name.as_bytes())
            .cloned()
            .ok_or(Error::NoXattr)
    }

    fn listxattr(&self, ino: Ino) -> Result<Vec<Vec<u8>>> {
        let node = self.table.get(ino)?;
        let st = node.read();
        Ok(st.xattrs.keys().cloned().collect())
    }

    fn open(&self, ino: Ino, flags: i32) -> Result<u64> {
        let node = self.table.get(ino)?;
        let mut st = node.write();
        Ok(self.open_node(&mut st, flags))
    }

    fn release(&self, ino: Ino, fh: u64) -> Result<()> {
        let node = self.table.get(ino)?;
        let mut st = node.write();
        st.opens = st.opens.saturating_sub(1);
        if fh & 1 == 1 {
            st.writers = st.writers.saturating_sub(1);
        }
        self.settle(&node, &mut st);
        Ok(())
    }

    fn setattr(&self, ino: Ino, set: &SetAttr, _ctx: &Ctx) -> Result<Attr> {
        let node = self.table.get(ino)?;
        let mut st = node.write();
        let now = Timespec::now();
        if let Some(size) = set.size {
            if size > MAX_FILE_SIZE {
                return Err(Error::TooBig);
            }
            let bs = self.bs();
            match st.file_mut() {
                Some(f) => f.truncate(size, bs, &self.space),
                None if node.kind == FileType::Directory => return Err(Error::IsDir),
                None => return Err(Error::Invalid),
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
        }
        st.ctime = set.ctime.unwrap_or(now);
        Ok(self.attr_of(&node, &st))
    }

    fn mknod(
        &self,
        parent: Ino,
        name: &OsStr,
        kind: FileType,
        perm: u16,
        rdev: u32,
        ctx: &Ctx,
    ) -> Result<Attr> {
        let (body, rdev) = match kind {
            FileType::RegularFile => (Body::File(FileData::default()), Rdev::default()),
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

    fn create(
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
                let body = Body::File(FileData::default());
                let new = NewNode::plain(FileType::RegularFile, perm, body);
                let node = self.make_node(parent, name, new, ctx)?;
                (node, false)
            }
            Err(e) => return Err(e),
        };
        let mut st = node.write();
        if existed {
            // The reply counts as a lookup, as for a new inode.
            st.lookups += 1;
        }
        let fh = self.open_node(&mut st, flags);
        Ok((self.attr_of(&node, &st), fh))
    }

    fn mkdir(&self, parent: Ino, name: &OsStr, perm: u16, ctx: &Ctx) -> Result<Attr> {
        let new = NewNode::plain(FileType::Directory, perm, Body::Dir(Dir::new(parent)));
        self.make(parent, name, new, ctx)
    }

    fn symlink(&self, parent: Ino, name: &OsStr, target: &[u8], ctx: &Ctx) -> Result<Attr> {
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

    fn unlink(&self, parent: Ino, name: &OsStr, _ctx: &Ctx) -> Result<()> {
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
        Ok(())
    }

    fn rmdir(&self, parent: Ino, name: &OsStr, _ctx: &Ctx) -> Result<()> {
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
        Ok(())
    }

    fn rename(
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

    fn link(&self, ino: Ino, newparent: Ino, newname: &OsStr, _ctx: &Ctx) -> Result<Attr> {
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
        Ok(self.attr_of(&node, &st))
    }

    fn kill_suid(&self, ino: Ino) -> Result<()> {
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
        }
        Ok(())
    }

    fn write(&self, ino: Ino, _fh: u64, offset: u64, data: &[u8], _flags: i32) -> Result<u32> {
        // The kernel resolves O_APPEND to an offset (its view of the size is
        // exact: every change goes through it), and with the writeback cache
        // it writes whole pages back through whichever handle it has, so the
        // offset is always the one to honour.
        let node = self.table.get(ino)?;
        if offset
            .checked_add(data.len() as u64)
            .is_none_or(|e| e > MAX_FILE_SIZE)
        {
            return Err(Error::TooBig);
        }
        let mut st = node.write();
        let bs = self.bs();
        let file = match st.file_mut() {
            Some(f) => f,
            None if node.kind == FileType::Directory => return Err(Error::IsDir),
            None => return Err(Error::Invalid),
        };
        let n = file.write(offset, data, bs, &self.space);
        if n == 0 && !data.is_empty() {
            return Err(Error::NoSpace);
        }
        if n > 0 {
            st.touch_mc(Timespec::now());
        }
        Ok(n as u32)
    }

    fn fallocate(&self, ino: Ino, offset: u64, length: u64, mode: i32) -> Result<()> {
        let node = self.table.get(ino)?;
        let end = offset
            .checked_add(length)
            .filter(|&e| e <= MAX_FILE_SIZE)
            .ok_or(Error::TooBig)?;
        if length == 0 {
            return Err(Error::Invalid);
        }
        let mut st = node.write();
        let bs = self.bs();
        let file = match st.file_mut() {
            Some(f) => f,
            None if node.kind == FileType::Directory => return Err(Error::IsDir),
            None => return Err(Error::Errno(libc::ENODEV)),
        };
        let keep = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let rest = mode & !libc::FALLOC_FL_KEEP_SIZE;
        match rest {
            0 => {
                if !file.allocate(offset..end, bs, &self.space) {
                    return Err(Error::NoSpace);
                }
            }
            // Past the end there is only zeros, but blocks kept there by
            // fallocate(KEEP_SIZE) are freed too.
            libc::FALLOC_FL_PUNCH_HOLE if keep => file.punch(offset..end, bs, &self.space),
            libc::FALLOC_FL_ZERO_RANGE => {
                if !file.zero_range(offset..end, bs, &self.space) {
                    return Err(Error::NoSpace);
                }
            }
            _ => return Err(Error::NotSupported),
        }
        if !keep && end > file.size {
            file.size = end;
        }
        st.touch_mc(Timespec::now());
        Ok(())
    }

    fn lseek(&self, ino: Ino, offset: u64, whence: i32) -> Result<u64> {
        let node = self.table.get(ino)?;
        let st = node.read();
        let file = st.file().ok_or(Error::Invalid)?;
        if offset >= file.size {
            return Err(Error::NoData);
        }
        // While a handle that may write is open, a cache above this file
        // system can hold data not written here yet (the kernel's FUSE
        // writeback cache does not write back before asking), so a hole seen
        // here may be data there. Reporting no holes is always correct.
        if st.writers > 0 {
            return match whence {
                libc::SEEK_DATA => Ok(offset),
                libc::SEEK_HOLE => Ok(file.size),
                _ => Err(Error::Invalid),
            };
        }
        match whence {
            libc::SEEK_DATA => file.next_data(offset, self.bs()).ok_or(Error::NoData),
            libc::SEEK_HOLE => Ok(file.next_hole(offset, self.bs())),
            _ => Err(Error::Invalid),
        }
    }

    fn setxattr(&self, ino: Ino, name: &OsStr, value: &[u8], flags: i32, _ctx: &Ctx) -> Result<()> {
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
            None if flags & libc::XATTR_REPLACE != 0 => return Err(Error::NoXattr),
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
        Ok(())
    }

    fn removexattr(&self, ino: Ino, name: &OsStr, _ctx: &Ctx) -> Result<()> {
        check_xattr_name(name)?;
        let node = self.table.get(ino)?;
        let mut st = node.write();
        let key = name.as_bytes();
        let value = st.xattrs.remove(key).ok_or(Error::NoXattr)?;
        self.space.give_xattr((key.len() + value.len()) as u64);
        st.ctime = Timespec::now();
        Ok(())
    }
}
