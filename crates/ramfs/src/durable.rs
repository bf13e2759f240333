//! A ramfs that outlives its server: its names and inodes in a ledger and
//! its data in an arena, both memfds a supervisor holds (see
//! `ledger/mod.rs` and `arena.rs`). What a server acknowledged is there
//! for the next one, which builds its inodes from the ledger
//! ([`RamFs::recover`]), answers the requests the kernel resends as the
//! dead one would have, and keeps the kernel's node ids and handles.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::sync::{Arc, RwLockReadGuard};

use foliofs_vfs::{request, FileType, Ino};

use crate::arena::Arena;
use crate::backing::Pool;
use crate::block::Block;
use crate::data::FileData;
use crate::dir::Dir;
use crate::ledger::replay::Model;
use crate::ledger::{Image, Ledger, LedgerError, Rec, Tx};
use crate::node::{Body, Node, State};
use crate::options::Options;
use crate::{RamFs, ROOT_INO};

/// Lookups a restarted server credits each inode with: the kernel's own
/// count died with the old server, so nothing is dropped on its forgets
/// (an inode with no name and no open handle still goes, with its data).
const HELD: u64 = u64::MAX / 2;

/// What a supervised ramfs lives in.
#[derive(Debug)]
pub struct StateFiles {
    /// The ledger.
    pub ledger: File,
    /// The data blocks (of files kept in the server).
    pub data: File,
    /// The tmpfs (a detached mount) its files live on when the kernel
    /// reads and writes them itself (passthrough).
    pub pool: Option<OwnedFd>,
}

impl StateFiles {
    /// Two new, empty memfds; with `backed`, a new tmpfs for the files
    /// too, shaped as `opts` say (see [`RamFs::new_backed`]; needs
    /// `CAP_SYS_ADMIN`).
    pub fn create(opts: &Options, backed: bool) -> std::io::Result<StateFiles> {
        let pool = if backed {
            let (limit, folios) = crate::fs::pool_shape(opts);
            Some(Pool::mount(limit, folios)?)
        } else {
            None
        };
        Ok(StateFiles {
            ledger: crate::ledger::memfd()?,
            data: crate::arena::memfd("foliofs-ramfs-data")?,
            pool,
        })
    }
}

impl StateFiles {
    /// Copies the state into directory `dir` (new, or empty): `ledger`,
    /// `data`, and `pool/` with the files of a ramfs that passed them
    /// through; only what holds data is written (the files are sparse).
    /// For [`RamFs::salvage`] when no server can serve it any more.
    pub fn save_to(&self, dir: &std::path::Path) -> std::io::Result<()> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)?;
        copy_sparse(&self.ledger, &File::create(dir.join("ledger"))?)?;
        copy_sparse(&self.data, &File::create(dir.join("data"))?)?;
        if let Some(root) = &self.pool {
            let to = dir.join("pool");
            std::fs::DirBuilder::new().mode(0o700).create(&to)?;
            for name in Pool::names(root)? {
                let fd = rustix::fs::openat(
                    root,
                    name.as_str(),
                    rustix::fs::OFlags::RDONLY
                        | rustix::fs::OFlags::CLOEXEC
                        | rustix::fs::OFlags::NOFOLLOW,
                    rustix::fs::Mode::empty(),
                )?;
                copy_sparse(&File::from(fd), &File::create(to.join(&name))?)?;
            }
        }
        Ok(())
    }

    /// The state [`StateFiles::save_to`] wrote into `dir`.
    pub fn open_saved(dir: &std::path::Path) -> std::io::Result<StateFiles> {
        let rw = |n: &str| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(dir.join(n))
        };
        let pool = dir.join("pool");
        let pool = if pool.is_dir() {
            Some(OwnedFd::from(File::open(&pool)?))
        } else {
            None
        };
        Ok(StateFiles {
            ledger: rw("ledger")?,
            data: rw("data")?,
            pool,
        })
    }
}

/// Copies `src` into `dst` extent by extent (holes stay holes).
fn copy_sparse(src: &File, dst: &File) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let len = src.metadata()?.len();
    let mut at = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    while at < len {
        let start = match rustix::fs::seek(src, rustix::fs::SeekFrom::Data(at)) {
            Ok(s) => s,
            Err(rustix::io::Errno::NXIO) => break,
            Err(e) => return Err(e.into()),
        };
        let end = rustix::fs::seek(src, rustix::fs::SeekFrom::Hole(start))?.min(len);
        let mut p = start;
        while p < end {
            let n = ((end - p) as usize).min(buf.len());
            src.read_exact_at(&mut buf[..n], p)?;
            dst.write_all_at(&buf[..n], p)?;
            p += n as u64;
        }
        at = end;
    }
    dst.set_len(len)
}

impl RamFs {
    /// The ramfs in state files saved by [`StateFiles::save_to`] (its
    /// block size as its ledger says, no limits), to copy its files out.
    pub fn salvage(files: StateFiles) -> Result<RamFs, LedgerError> {
        let bs = Ledger::block_size_of(&files.ledger)?;
        let mut opts = Options::default();
        opts.set("blocksize", Some(&bs.to_string()))
            .map_err(|e| LedgerError::Foreign(e.to_string()))?;
        opts.set("size", Some("0"))
            .map_err(|e| LedgerError::Foreign(e.to_string()))?;
        opts.set("nr_inodes", Some("0"))
            .map_err(|e| LedgerError::Foreign(e.to_string()))?;
        Self::recover(&opts, files)
    }

    /// A new, empty ramfs whose state lives in `files` (fresh memfds).
    pub fn supervised(opts: &Options, files: StateFiles) -> Result<RamFs, LedgerError> {
        let arena = Arena::new(files.data, u64::from(opts.block_size), opts.huge)?;
        let ledger = Ledger::create(files.ledger, opts.block_size)?;
        let mut fs = Self::build(opts, files.pool.map(|root| Pool::on(root, 0)));
        fs.space.set_arena(arena);
        fs.ledger = Some(ledger);
        fs.rewrite_ledger()?;
        Ok(fs)
    }

    /// The ramfs an earlier server left in `files`: every inode, name,
    /// xattr and block its ledger holds, checked as a whole first.
    pub fn recover(opts: &Options, files: StateFiles) -> Result<RamFs, LedgerError> {
        let bs = u64::from(opts.block_size);
        let arena = Arena::new(files.data, bs, opts.huge)?;
        let (ledger, bytes, region) = Ledger::open(files.ledger, opts.block_size)?;
        let model = Model::read(&bytes, region)?;
        drop(bytes);
        let pool = match files.pool {
            Some(root) => Some(recover_pool(root, &model)?),
            None => None,
        };
        let mut fs = Self::build_empty(opts, pool);
        fs.space.set_arena(arena.clone());
        let (mut blocks, mut slots, mut bytes_held) = (0u64, 0u64, 0u64);
        let mut used = HashSet::new();
        let Model {
            inodes,
            mut names,
            mut xattrs,
            blocks: mut maps,
            next_ino,
            done,
        } = model;
        for (ino, img) in inodes {
            let body = match img.kind {
                FileType::Directory => {
                    let mut d = Dir::new(img.parent);
                    let mut entries: Vec<_> =
                        names.remove(&ino).unwrap_or_default().into_iter().collect();
                    entries.sort_by_key(|(_, (cookie, ..))| *cookie);
                    for (name, (cookie, child, kind)) in entries {
                        d.put(OsStr::from_bytes(&name), cookie, child, kind);
                    }
                    Body::Dir(d)
                }
                FileType::RegularFile if !img.target.is_empty() => {
                    let name = String::from_utf8_lossy(&img.target);
                    match &fs.pool {
                        Some(p) => Body::Backed(p.adopt(&name)),
                        None => {
                            return Err(LedgerError::Foreign(format!(
                            "inode {ino} lives in file {name} of a tmpfs this mount was not handed"
                        )))
                        }
                    }
                }
                FileType::RegularFile => {
                    let mut f = FileData::default();
                    f.size = img.size;
                    for (idx, k) in maps.remove(&ino).unwrap_or_default() {
                        let b = Block::adopt(&arena, k).ok_or_else(|| LedgerError::Damaged {
                            region,
                            offset: 0,
                            what: format!("block {k} of the data file cannot be mapped"),
                        })?;
                        f.adopt(idx, b);
                        used.insert(k);
                        blocks += 1;
                    }
                    Body::File(f)
                }
                FileType::Symlink => {
                    bytes_held += img.target.len() as u64;
                    Body::Symlink(img.target.clone())
                }
                _ => Body::Special,
            };
            let x = xattrs.remove(&ino).unwrap_or_default();
            bytes_held += x
                .iter()
                .map(|(k, v)| (k.len() + v.len()) as u64)
                .sum::<u64>();
            slots += if img.kind == FileType::Directory {
                1
            } else {
                u64::from(img.nlink.max(1))
            };
            let mut st = State::new(img.perm, img.uid, img.gid, img.rdev, body);
            st.nlink = img.nlink;
            st.atime = img.atime;
            st.mtime = img.mtime;
            st.ctime = img.ctime;
            st.opens = img.opens;
            st.writers = img.writers;
            st.version = img.version;
            st.backing = img.backing;
            st.xattrs = x;
            st.lookups = if ino == ROOT_INO { 1 } else { HELD };
            fs.table.insert(Arc::new(Node::new(ino, img.kind, st)));
        }
        fs.space.restore(blocks, slots, bytes_held);
        arena.settle_free(&used);
        fs.next_ino.store(
            next_ino.max(ROOT_INO + 1),
            std::sync::atomic::Ordering::Relaxed,
        );
        *fs.done.get_mut().unwrap() = done.iter().map(|&(r, i, f)| (r, (i, f))).collect();
        fs.ledger = Some(ledger);
        // A fresh start for the log: what was replayed, written once.
        fs.rewrite_ledger()?;
        Ok(fs)
    }

    /// Whether this ramfs keeps a ledger (it outlives its server).
    pub fn is_supervised(&self) -> bool {
        self.ledger.is_some()
    }

    /// Bytes of the ledger's active region (for `foliofs mounts`).
    pub fn ledger_bytes(&self) -> Option<usize> {
        self.ledger.as_ref().map(Ledger::len)
    }

    /// Whether this mount keeps a ledger (cheap: for the hot paths to skip
    /// what only a ledger needs).
    pub(crate) fn logs(&self) -> bool {
        self.ledger.is_some()
    }

    /// Logs a namespace change (the name-space lock held): the images of
    /// `inodes` and what `names` (directory, name) are now.
    pub(crate) fn log_names(
        &self,
        made: Ino,
        fh: u64,
        inodes: &[Arc<Node>],
        names: &[(Ino, &OsStr)],
    ) {
        if !self.logs() {
            return;
        }
        self.log(made, fh, |tx| {
            for n in inodes {
                let mut st = n.write();
                tx.changed(n, &mut st);
            }
            for &(parent, name) in names {
                if let Ok(p) = self.table.get(parent) {
                    tx.name(parent, &p.read(), name);
                }
            }
        });
    }

    /// Held by every call that changes something, so a rewrite of the
    /// ledger sees no change half made.
    pub(crate) fn changing(&self) -> Option<RwLockReadGuard<'_, ()>> {
        self.ledger
            .as_ref()
            .map(|_| self.quiet.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Before a change: room in the ledger for what it will log, within
    /// the memory limits (false: refuse the change with `ENOSPC`).
    pub(crate) fn ledger_room(&self) -> bool {
        self.ledger
            .as_ref()
            .is_none_or(|l| l.headroom(|n| self.space.take_ledger(n)))
    }

    /// After a change: rewrites the ledger once it has grown enough (and
    /// the memory limits leave room for the new copy).
    pub(crate) fn changed(&self) {
        if self.ledger.as_ref().is_some_and(Ledger::wants_rewrite)
            && self
                .space
                .take_ledger(self.ledger.as_ref().map_or(0, |l| l.len() as u64 / 4))
        {
            let _all = self.quiet.write().unwrap_or_else(|e| e.into_inner());
            if self.ledger.as_ref().is_some_and(Ledger::wants_rewrite) {
                if let Err(e) = self.rewrite_ledger() {
                    log::error!("ramfs: rewriting the state file: {e}");
                }
            }
        }
    }

    /// Notes the kernel's registration of `ino`'s backing file (see
    /// `FileSystem::note_backing`).
    pub(crate) fn do_note_backing(&self, ino: Ino, id: Option<u32>) {
        if !self.logs() {
            return;
        }
        let Ok(node) = self.table.get(ino) else {
            return;
        };
        let mut st = node.write();
        st.backing = id.unwrap_or(0);
        self.log(ino, 0, |tx| tx.changed(&node, &mut st));
    }

    /// The registrations an earlier server noted, with each inode's open
    /// handles.
    pub(crate) fn do_backings(&self) -> Vec<(Ino, u32, u64)> {
        let mut out = Vec::new();
        if self.logs() {
            self.table.for_each(|n| {
                let st = n.read();
                if st.backing != 0 && st.opens > 0 {
                    out.push((n.ino, st.backing, st.opens));
                }
            });
        }
        out
    }

    /// What the request being answered did, when it is a resent copy of
    /// one an earlier server carried out: the inode it made or changed,
    /// the handle it opened.
    pub(crate) fn already_done(&self) -> Option<(Ino, u64)> {
        self.ledger.as_ref()?;
        let cur = request::current();
        if !cur.resent {
            return None;
        }
        let done = self.done.lock().unwrap_or_else(|e| e.into_inner());
        done.get(&cur.id).copied()
    }
}

/// The largest transaction buffer a thread keeps for its next change (a
/// truncate of a huge file writes a large one, rarely).
const TX_BUF_KEPT: usize = 64 << 10;

thread_local! {
    /// The buffer this thread's next transaction is written into.
    static TX_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    /// Whether this thread's last change was answered from the ledger.
    static REPLAYED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Records whether the change this thread just made was replayed.
pub(crate) fn set_replayed(on: bool) {
    REPLAYED.with(|r| r.set(on));
}

/// Whether the change this thread just made was replayed.
pub(crate) fn replayed() -> bool {
    REPLAYED.with(std::cell::Cell::get)
}

impl RamFs {
    /// Appends what `f` writes, with the record that the request being
    /// answered is done (having made or changed `ino`, opened `fh`).
    /// Called with the locks that order this change still held.
    pub(crate) fn log(&self, ino: Ino, fh: u64, f: impl FnOnce(&mut Tx)) {
        let Some(l) = &self.ledger else { return };
        // The thread's buffer, kept between changes: a transaction's bytes
        // otherwise cost a few reallocations each.
        let mut tx = Tx {
            buf: TX_BUF.with(|b| std::mem::take(&mut *b.borrow_mut())),
        };
        tx.buf.clear();
        f(&mut tx);
        let cur = request::current();
        if cur.id != 0 {
            tx.put(&Rec::Done {
                request: cur.id,
                ino,
                fh,
            });
        }
        if let Err(e) = l.append(&tx) {
            // The change stands here; only a restart would not see it.
            log::error!("ramfs: the state file cannot grow: {e}");
        }
        if tx.buf.capacity() <= TX_BUF_KEPT {
            TX_BUF.with(|b| *b.borrow_mut() = tx.buf);
        }
    }

    /// Writes everything as it is now into the ledger's other region and
    /// makes that the active one. Every change is held back meanwhile.
    pub(crate) fn rewrite_ledger(&self) -> std::io::Result<()> {
        let Some(l) = &self.ledger else { return Ok(()) };
        l.rewrite(|emit| {
            let mut tx = Tx::default();
            tx.put(&Rec::NextIno(
                self.next_ino.load(std::sync::atomic::Ordering::Relaxed),
            ));
            let mut failed = None;
            self.table.for_each(|node| {
                if failed.is_some() {
                    return;
                }
                let st = node.read();
                if st.released {
                    return;
                }
                tx.put(&image(node, &st));
                if let Some(d) = st.dir() {
                    for (cookie, e) in d.after(0) {
                        tx.put(&Rec::Name {
                            parent: node.ino,
                            name: e.name.as_bytes().to_vec(),
                            cookie,
                            ino: e.ino,
                            kind: e.kind,
                        });
                    }
                }
                for (k, v) in &st.xattrs {
                    tx.put(&Rec::Xattr {
                        ino: node.ino,
                        name: k.clone(),
                        value: Some(v.clone()),
                    });
                }
                if let Some(f) = st.file() {
                    for (idx, k) in f.arena_blocks(0, u64::MAX) {
                        tx.put(&Rec::Map {
                            ino: node.ino,
                            idx,
                            k,
                        });
                    }
                }
                // Written a megabyte at a time: the snapshot is never
                // whole in memory.
                if tx.buf.len() > 1 << 20 {
                    if let Err(e) = emit(&tx) {
                        failed = Some(e);
                    }
                    tx = Tx::default();
                }
            });
            if let Some(e) = failed {
                return Err(e);
            }
            for (&request, &(ino, fh)) in self.done.lock().unwrap_or_else(|e| e.into_inner()).iter()
            {
                tx.put(&Rec::Done { request, ino, fh });
            }
            emit(&tx)
        })
    }
}

/// The pool of files an earlier server left on `root`: the files no
/// inode holds (made ahead, or of inodes gone) removed, new ones named
/// after every name there.
fn recover_pool(root: OwnedFd, model: &Model) -> Result<Pool, LedgerError> {
    let held: HashSet<&[u8]> = model
        .inodes
        .values()
        .filter(|i| i.kind == FileType::RegularFile && !i.target.is_empty())
        .map(|i| i.target.as_slice())
        .collect();
    let names = Pool::names(&root)?;
    let next = names
        .iter()
        .filter_map(|n| u64::from_str_radix(n, 16).ok())
        .max()
        .map_or(0, |m| m + 1);
    for n in &names {
        if !held.contains(n.as_bytes()) {
            if let Err(e) = Pool::remove(&root, n) {
                log::warn!("ramfs: cannot remove file {n} no inode holds: {e}");
            }
        }
    }
    // A file removed by the server that died while it removed its last
    // name (the unlink that removed it comes again, resent): empty
    // until then.
    let present: HashSet<&[u8]> = names.iter().map(|n| n.as_bytes()).collect();
    for n in held.iter().filter(|n| !present.contains(*n)) {
        let n = String::from_utf8_lossy(n);
        log::warn!("ramfs: file {n} is gone from the pool; it is empty now");
        Pool::make(&root, &n)?;
    }
    Ok(Pool::on(root, next))
}

/// An inode's image as its state is now.
pub(crate) fn image(node: &Node, st: &State) -> Rec {
    Rec::Inode(Image {
        ino: node.ino,
        version: st.version,
        kind: node.kind,
        perm: st.perm,
        nlink: st.nlink,
        uid: st.uid,
        gid: st.gid,
        rdev: st.rdev,
        atime: st.atime,
        mtime: st.mtime,
        ctime: st.ctime,
        size: st.file().map_or(0, |f| f.size),
        opens: st.opens,
        writers: st.writers,
        parent: st.dir().map_or(0, |d| d.parent),
        // A symbolic link's target; a backed file's name on the pool.
        target: match &st.body {
            Body::Symlink(t) => t.clone(),
            Body::Backed(b) => b.name().as_bytes().to_vec(),
            _ => Vec::new(),
        },
        backing: st.backing,
    })
}

impl Tx {
    /// The image of an inode just changed (its version moves on).
    pub(crate) fn changed(&mut self, node: &Node, st: &mut State) {
        st.version += 1;
        self.put(&image(node, st));
    }

    /// What entry `name` of directory `parent` (whose state is `ps`) is.
    pub(crate) fn name(&mut self, parent: Ino, ps: &State, name: &OsStr) {
        let entry = ps.dir().and_then(|d| Some((d.cookie(name)?, d.get(name)?)));
        self.put(&match entry {
            Some((cookie, e)) => Rec::Name {
                parent,
                name: name.as_bytes().to_vec(),
                cookie,
                ino: e.ino,
                kind: e.kind,
            },
            None => Rec::NoName {
                parent,
                name: name.as_bytes().to_vec(),
            },
        });
    }

    /// How file `ino`'s blocks in `from..to` changed: `before` is what
    /// [`blocks_in`] said before the change, `f` the file after.
    pub(crate) fn blocks(
        &mut self,
        ino: Ino,
        before: &[(u64, u64)],
        f: &FileData,
        from: u64,
        to: u64,
    ) {
        let after: HashMap<u64, u64> = f.arena_blocks(from, to).collect();
        for &(idx, _) in before {
            if !after.contains_key(&idx) {
                self.put(&Rec::Unmap { ino, idx });
            }
        }
        let before: HashMap<u64, u64> = before.iter().copied().collect();
        for (&idx, &k) in &after {
            if before.get(&idx) != Some(&k) {
                self.put(&Rec::Map { ino, idx, k });
            }
        }
    }
}

/// File `st`'s blocks in `from..to` (nothing for a file that is not a
/// supervised mount's), for [`Tx::blocks`].
pub(crate) fn blocks_in(st: &State, from: u64, to: u64) -> Vec<(u64, u64)> {
    st.file()
        .map(|f| f.arena_blocks(from, to).collect())
        .unwrap_or_default()
}

/// The map of requests carried out (from the ledger) a restarted server
/// answers resent copies from.
pub(crate) type DoneMap = HashMap<u64, (Ino, u64)>;

#[cfg(test)]
mod tests;
