//! [`RomFs`]: a romfs image behind the [`FileSystem`] trait.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::num::NonZeroUsize;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, Mutex};

use foliofs_block::{BlockDev, OpenOptions};
use foliofs_vfs::{
    Attr, DirEntry, Error, FileSystem, FileType, FsInfo, Ino, Result, Scratch, StatFs,
};
use lru::LruCache;

use crate::dir::{Dir, DirEnt, LoopGuard};
use crate::header::{EntryType, Header};
use crate::inode::Inode;
use crate::superblock::{Superblock, CHECKSUM_SPAN, MAX_NAME};
use crate::Corrupt;

/// romfs's native block size (`ROMBSIZE`).
pub const ROMFS_BLOCK_SIZE: u32 = 1024;
/// Longest symlink target the kernel follows (`PATH_MAX` minus the NUL).
pub const MAX_SYMLINK: u32 = 4095;
/// Directories whose entry lists are kept.
const DIR_CACHE: usize = 1024;
/// Subdirectories whose chains one READDIRPLUS reads ahead, side by side.
const PREFETCH_DIRS: usize = 256;
/// Headers one READDIRPLUS reads ahead at most.
const PREFETCH_HEADERS: usize = 16 * 1024;
/// Bytes of a header [`Header::read`] may need: the fixed part and the
/// longest name with its NUL.
const HEADER_SPAN: u64 = crate::header::HEADER_SIZE + MAX_NAME as u64 + 1;

/// An open romfs image.
///
/// Every structure is checked as it is read: offsets against the image size,
/// chains of `next` and hard-link pointers for loops, names for length, and
/// `spec` for the types that require it to be zero. Damage comes back as
/// [`Error::Corrupt`] naming the offset; nothing panics or loops.
///
/// Inode numbers are header offsets (after following hard links), as the
/// Linux kernel numbers them.
pub struct RomFs {
    dev: BlockDev,
    sb: Superblock,
    root: Inode,
    dirs: Mutex<LruCache<u64, Arc<Dir>>>,
    /// The directory each directory was last looked up from, for "..".
    parents: Mutex<HashMap<u64, u64>>,
}

impl std::fmt::Debug for RomFs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RomFs")
            .field("path", &self.dev.store().path())
            .field("superblock", &self.sb)
            .field("block_size", &self.dev.block_size())
            .finish()
    }
}

impl RomFs {
    /// Opens the image (file or block device) at `path`. The block size is
    /// 1 KiB unless `opts.block_size` asks for `largeblocks` or a fixed size.
    /// Checks the magic, the superblock checksum, the declared size against
    /// the file and the root directory.
    pub fn open(path: &Path, opts: &OpenOptions) -> Result<RomFs> {
        Self::open_inner(path, opts, true)
    }

    /// Like [`RomFs::open`] but accepts a bad superblock checksum, so a
    /// checker can report it and carry on.
    pub fn open_unverified(path: &Path, opts: &OpenOptions) -> Result<RomFs> {
        Self::open_inner(path, opts, false)
    }

    /// Wraps an already open block device.
    pub fn from_block_dev(dev: BlockDev, verify_checksum: bool) -> Result<RomFs> {
        let head_len = dev.size().min(u64::from(CHECKSUM_SPAN)) as usize;
        let mut head = vec![0u8; head_len];
        dev.read_exact(0, &mut head)?;
        let sb = Superblock::parse(&head, dev.size(), verify_checksum)?;
        let root = resolve(&dev, &sb, sb.root_offset)?;
        if root.kind != FileType::Directory {
            return Err(Error::corrupt(
                sb.root_offset,
                Corrupt::RootNotDirectory {
                    offset: sb.root_offset,
                    kind: root.entry_type(),
                },
            ));
        }
        let mut parents = HashMap::new();
        parents.insert(root.ino, root.ino);
        Ok(RomFs {
            dev,
            sb,
            root,
            dirs: Mutex::new(LruCache::new(
                NonZeroUsize::new(DIR_CACHE).expect("non-zero"),
            )),
            parents: Mutex::new(parents),
        })
    }

    fn open_inner(path: &Path, opts: &OpenOptions, verify: bool) -> Result<RomFs> {
        let dev = BlockDev::open(path, opts, ROMFS_BLOCK_SIZE)?;
        Self::from_block_dev(dev, verify)
    }

    /// The volume name from the superblock (without its NUL).
    pub fn volume_name(&self) -> &[u8] {
        &self.sb.volume_name
    }

    /// The parsed superblock.
    pub fn superblock(&self) -> &Superblock {
        &self.sb
    }

    /// The block device the image is read through.
    pub fn block_dev(&self) -> &BlockDev {
        &self.dev
    }

    /// The root directory's inode.
    pub fn root_inode(&self) -> Inode {
        self.root
    }

    /// The checked header at `offset` (not following hard links).
    pub fn header(&self, offset: u64) -> Result<Header> {
        Header::read(&self.dev, offset, self.sb.root_offset)
    }

    /// The inode the header at `offset` names, following hard links.
    pub fn resolve(&self, offset: u64) -> Result<Inode> {
        resolve(&self.dev, &self.sb, offset)
    }

    /// The inode numbered `ino`.
    pub fn inode(&self, ino: Ino) -> Result<Inode> {
        if ino == self.root.ino {
            return Ok(self.root);
        }
        self.resolve(ino)
    }

    /// The visible entries of directory `ino` (cached).
    pub fn dir(&self, ino: Ino) -> Result<Arc<Dir>> {
        if let Some(d) = lock(&self.dirs).get(&ino) {
            return Ok(d.clone());
        }
        let inode = self.inode(ino)?;
        if inode.kind != FileType::Directory {
            return Err(Error::NotDir);
        }
        let d = Arc::new(self.read_dir(&inode)?);
        lock(&self.dirs).put(ino, d.clone());
        Ok(d)
    }

    fn read_dir(&self, dir: &Inode) -> Result<Dir> {
        let mut walk = DirWalk::new(dir);
        while walk.next != 0 {
            walk.step(self)?;
        }
        Ok(walk.finish())
    }

    /// Reads the entry chains of `dir`'s subdirectories side by side: each
    /// round asks the kernel for the next header of every chain at once,
    /// then parses them. A chain is a list whose next link is only known
    /// once its header is read, so one chain is read one device round trip
    /// at a time; many chains in step share each round trip. Subdirectories
    /// of finished chains join in the next round (breadth first), up to
    /// [`PREFETCH_DIRS`] directories and [`PREFETCH_HEADERS`] headers in
    /// all, which bounds the wait of the listing that asked.
    fn read_subdirs(&self, dir: &Dir) {
        let mut started = HashSet::new();
        let mut walks: Vec<DirWalk> = Vec::new();
        let mut steps = 0usize;
        self.start_walks(dir, &mut started, &mut walks);
        while !walks.is_empty() {
            self.dev.prefetch(
                walks
                    .iter()
                    .flat_map(|w| [w.next, w.next + HEADER_SPAN - 1]),
            );
            let mut joining = Vec::new();
            let mut i = 0;
            while i < walks.len() {
                if steps == PREFETCH_HEADERS {
                    // Out of budget: unfinished chains are read when listed.
                    return;
                }
                steps += 1;
                // A damaged chain is dropped here; the directory's own
                // readdir reads it again and reports the damage.
                match walks[i].step(self) {
                    Ok(()) if walks[i].next != 0 => i += 1,
                    Ok(()) => {
                        let d = walks.swap_remove(i).finish_into(self);
                        self.start_walks(&d, &mut started, &mut joining);
                    }
                    Err(_) => {
                        walks.swap_remove(i);
                    }
                }
            }
            walks.append(&mut joining);
        }
    }

    /// Starts walks of `dir`'s subdirectories that are neither cached nor
    /// started already (a damaged image can link one directory from many
    /// places), within the [`PREFETCH_DIRS`] budget. An empty directory is
    /// cached at once.
    fn start_walks(&self, dir: &Dir, started: &mut HashSet<u64>, walks: &mut Vec<DirWalk>) {
        let subdirs: Vec<u64> = dir
            .entries()
            .iter()
            .filter(|e| e.kind == FileType::Directory)
            .map(|e| e.ino)
            .collect();
        let todo: Vec<u64> = {
            let cached = lock(&self.dirs);
            subdirs
                .into_iter()
                .filter(|ino| !cached.contains(ino))
                .collect()
        };
        for ino in todo {
            if started.len() == PREFETCH_DIRS {
                return;
            }
            if !started.insert(ino) {
                continue;
            }
            // Outside the lock: an inode may need a read.
            let Ok(inode) = self.inode(ino) else { continue };
            if inode.kind != FileType::Directory {
                continue;
            }
            let walk = DirWalk::new(&inode);
            if walk.next == 0 {
                walk.finish_into(self);
            } else {
                walks.push(walk);
            }
        }
    }

    /// Looks up a `/`-separated path from the root, without following
    /// symlinks. An empty path or "/" is the root.
    pub fn find(&self, path: &str) -> Result<Inode> {
        let mut cur = self.root;
        for comp in path.split('/').filter(|c| !c.is_empty() && *c != ".") {
            let attr = self.lookup(cur.ino, OsStr::new(comp))?;
            cur = self.inode(attr.ino)?;
        }
        Ok(cur)
    }

    fn parent_of(&self, dir: Ino) -> Result<Ino> {
        if let Some(&p) = lock(&self.parents).get(&dir) {
            return Ok(p);
        }
        // Not reached by lookup: the image's own ".." entry is the best guess.
        match self.dir(dir)?.dotdot {
            Some(off) => {
                let p = self.resolve(off)?;
                Ok(if p.kind == FileType::Directory {
                    p.ino
                } else {
                    self.root.ino
                })
            }
            None => Ok(self.root.ino),
        }
    }
}

/// A directory's entry chain part way read.
struct DirWalk {
    ino: u64,
    /// The next header to read (0 at the end of the chain).
    next: u64,
    entries: Vec<DirEnt>,
    dotdot: Option<u64>,
    guard: LoopGuard,
}

impl DirWalk {
    fn new(dir: &Inode) -> DirWalk {
        DirWalk {
            ino: dir.ino,
            next: dir.first_entry(),
            entries: Vec::new(),
            dotdot: None,
            guard: LoopGuard::default(),
        }
    }

    /// Reads the header at `next` and moves on to the one after it.
    fn step(&mut self, fs: &RomFs) -> Result<()> {
        let off = self.next;
        if !self.guard.visit(off) {
            return Err(Error::corrupt(
                off,
                Corrupt::ChainLoop {
                    dir: self.ino,
                    offset: off,
                },
            ));
        }
        let h = fs.header(off)?;
        let name = h.name();
        match name {
            b"." => {}
            b".." => {
                if h.kind == EntryType::HardLink {
                    self.dotdot = Some(h.spec_offset());
                }
            }
            _ => {
                check_entry_name(&h)?;
                let target = if h.kind == EntryType::HardLink {
                    fs.resolve(h.offset)?
                } else {
                    Inode::from_header(&h)
                };
                self.entries.push(DirEnt {
                    name: name.into(),
                    header: h.offset,
                    ino: target.ino,
                    kind: target.kind,
                });
            }
        }
        self.next = h.next;
        Ok(())
    }

    fn finish(self) -> Dir {
        Dir::new(self.entries, self.dotdot)
    }

    /// Finishes the walk and caches the directory it read.
    fn finish_into(self, fs: &RomFs) -> Arc<Dir> {
        let ino = self.ino;
        let d = Arc::new(self.finish());
        lock(&fs.dirs).put(ino, d.clone());
        d
    }
}

/// Follows hard links from the header at `offset` to the entry they name.
fn resolve(dev: &BlockDev, sb: &Superblock, offset: u64) -> Result<Inode> {
    let mut guard = LoopGuard::default();
    let mut off = offset;
    loop {
        if !guard.visit(off) {
            return Err(Error::corrupt(
                off,
                Corrupt::LinkLoop {
                    link: offset,
                    through: off,
                },
            ));
        }
        let h = Header::read(dev, off, sb.root_offset)?;
        if h.kind != EntryType::HardLink {
            return Ok(Inode::from_header(&h));
        }
        off = h.spec_offset();
    }
}

fn check_entry_name(h: &Header) -> Result<()> {
    let name = h.name();
    if name.is_empty() {
        return Err(Error::corrupt(
            h.offset + 16,
            Corrupt::EmptyName { offset: h.offset },
        ));
    }
    if name.contains(&b'/') {
        return Err(Error::corrupt(
            h.offset + 16,
            Corrupt::NameWithSlash {
                offset: h.offset,
                name: h.name_lossy(),
            },
        ));
    }
    Ok(())
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl FileSystem for RomFs {
    fn root(&self) -> Ino {
        self.root.ino
    }

    fn info(&self) -> FsInfo {
        FsInfo {
            fs_type: "romfs",
            block_size: self.dev.block_size(),
            name_max: MAX_NAME as u32,
            read_only: true,
        }
    }

    fn statfs(&self) -> Result<StatFs> {
        let bs = self.dev.block_size();
        Ok(StatFs {
            blocks: self.dev.blocks(),
            bfree: 0,
            bavail: 0,
            files: 0,
            ffree: 0,
            bsize: bs,
            frsize: bs,
            namelen: MAX_NAME as u32,
        })
    }

    fn getattr(&self, ino: Ino) -> Result<Attr> {
        Ok(self.inode(ino)?.attr(self.dev.block_size()))
    }

    fn lookup(&self, parent: Ino, name: &OsStr) -> Result<Attr> {
        let name = name.as_bytes();
        // The kernel refuses names longer than its 128-byte compare buffer.
        if name.len() > MAX_NAME + 1 {
            return Err(Error::NameTooLong);
        }
        let target = match name {
            b"." => {
                let d = self.inode(parent)?;
                if d.kind != FileType::Directory {
                    return Err(Error::NotDir);
                }
                d
            }
            b".." => {
                if self.inode(parent)?.kind != FileType::Directory {
                    return Err(Error::NotDir);
                }
                self.inode(self.parent_of(parent)?)?
            }
            _ => {
                let dir = self.dir(parent)?;
                let e = dir.find(name).ok_or(Error::NotFound)?;
                let inode = self.inode(e.ino)?;
                if inode.kind == FileType::Directory {
                    lock(&self.parents).insert(inode.ino, parent);
                }
                inode
            }
        };
        Ok(target.attr(self.dev.block_size()))
    }

    fn readdir(
        &self,
        ino: Ino,
        offset: u64,
        sink: &mut dyn FnMut(DirEntry<'_>) -> bool,
    ) -> Result<()> {
        let dir = self.dir(ino)?;
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        for (i, e) in dir.entries().iter().enumerate().skip(start) {
            let full = sink(DirEntry {
                ino: e.ino,
                next: i as u64 + 1,
                kind: e.kind,
                name: e.name_os(),
            });
            if full {
                break;
            }
        }
        Ok(())
    }

    /// At a READDIRPLUS from the start of a directory, reads and caches its
    /// subdirectories' entry chains, side by side (see
    /// `RomFs::read_subdirs`): a walker such as `find` lists them next.
    /// This directory's own entries need nothing more, since a header holds
    /// all of an entry's attributes. Headers are read through the page
    /// cache in either I/O mode, where the kernel can have many reads in
    /// flight for one thread.
    fn prefetch_dir(&self, ino: Ino, offset: u64, _every: bool) {
        if offset != 0 {
            return;
        }
        if let Ok(dir) = self.dir(ino) {
            self.read_subdirs(&dir);
        }
    }

    fn read<'a>(
        &self,
        ino: Ino,
        offset: u64,
        size: u32,
        scratch: &'a mut Scratch,
    ) -> Result<&'a [u8]> {
        let inode = self.inode(ino)?;
        match inode.kind {
            FileType::RegularFile => {}
            FileType::Directory => return Err(Error::IsDir),
            _ => return Err(Error::Invalid),
        }
        let fsize = u64::from(inode.size);
        if offset >= fsize || size == 0 {
            return Ok(&[]);
        }
        let len = (fsize - offset).min(u64::from(size)) as usize;
        let data = self
            .dev
            .read_data(inode.data_offset + offset, len, scratch)?;
        if data.len() < len {
            return Err(Error::corrupt(
                inode.data_offset + offset + data.len() as u64,
                Corrupt::DataEndsEarly { offset: ino },
            ));
        }
        Ok(data)
    }

    fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        let inode = self.inode(ino)?;
        if inode.kind != FileType::Symlink {
            return Err(Error::NotSymlink);
        }
        if inode.size > MAX_SYMLINK {
            return Err(Error::corrupt(
                ino + 8,
                Corrupt::SymlinkTooLong {
                    offset: ino,
                    len: inode.size,
                },
            ));
        }
        let mut buf = vec![0u8; inode.size as usize];
        self.dev.read_exact(inode.data_offset, &mut buf)?;
        Ok(buf)
    }
}
