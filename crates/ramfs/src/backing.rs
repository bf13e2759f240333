//! File data in the kernel's page cache: each regular file's bytes in a
//! file of its own on a tmpfs of this file system's own, which is mounted
//! nowhere (a detached mount, `fsmount(2)`), so no other process can reach
//! it. The FUSE layer hands such a file to the kernel (FUSE passthrough)
//! and the kernel then reads, writes and maps it without a request to the
//! server; the server still answers for its size, its times, truncation
//! and allocation from the same file.
//!
//! Why a tmpfs of our own rather than a memfd: its `size=` makes the
//! kernel refuse a write past the limit at `write(2)` (a memfd has no limit
//! but the memory cgroup, and a passthrough write never reaches the server
//! to be refused there), and its `huge=` picks large folios for this mount
//! alone, where a memfd's follow the machine-wide shmem setting.
//!
//! Why each file has a name there (rather than being an `O_TMPFILE` held by
//! a descriptor): a descriptor per stored file would cap the file count at
//! the server's `RLIMIT_NOFILE` (20,000 for root on some machines, and
//! raising it needs `CAP_SYS_RESOURCE`), far below what `nr_inodes=`
//! promises. A named file needs a descriptor only while it is in use: the
//! kernel holds its own reference to a registered one, and the server opens
//! it by name for the few operations it does itself (a new file's first
//! open takes the descriptor it was made with, and a few files are kept
//! made ahead, see `premade.rs`). The names go with the detached mount when
//! the server exits, so a crash leaves nothing behind.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use foliofs_vfs::Timespec;
use rustix::fs::{AtFlags, Mode, OFlags};
use rustix::mount::{FsMountFlags, FsOpenFlags, MountAttrFlags};

/// How the pool's tmpfs allocates folios (its `huge=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Folios {
    /// One page each (`huge=never`): the 4 KiB block size.
    Pages,
    /// As large as each write allows, up to a huge page, within the file's
    /// size (`huge=within_size`): the block sizes above a page.
    ByWrite,
    /// A huge page each wherever one fits (`huge=always`).
    Huge,
}

impl Folios {
    fn tmpfs_value(self) -> &'static str {
        match self {
            Folios::Pages => "never",
            Folios::ByWrite => "within_size",
            Folios::Huge => "always",
        }
    }
}

/// The tmpfs every backed file of one mount lives on.
#[derive(Debug)]
pub(crate) struct Pool {
    /// The detached mount's root, shared with every file's body (which
    /// removes its name when dropped).
    root: Arc<OwnedFd>,
    /// New files, made ahead.
    premade: premade::Premade,
}

impl Pool {
    /// Mounts a tmpfs of `limit` bytes (none: unlimited) where no path
    /// leads. Needs `CAP_SYS_ADMIN`.
    pub fn new(limit: Option<u64>, folios: Folios) -> io::Result<Pool> {
        Ok(Pool::on(Self::mount(limit, folios)?, 0))
    }

    /// The pool on `root`, a tmpfs [`Pool::mount`] made (a supervised
    /// mount's, held by its supervisor), its new files named from `first`.
    pub fn on(root: OwnedFd, first: u64) -> Pool {
        let root = Arc::new(root);
        Pool {
            premade: premade::Premade::new(root.clone(), first),
            root,
        }
    }

    /// The body of the file `name` an earlier server made on this pool.
    pub fn adopt(&self, name: &str) -> Backed {
        Backed {
            name: Arc::new(Name {
                root: self.root.clone(),
                name: name.to_owned(),
                used: AtomicBool::new(true),
            }),
        }
    }

    /// The names of every file on the pool mounted at `root`.
    pub fn names(root: &OwnedFd) -> io::Result<Vec<String>> {
        let dir = rustix::fs::openat(
            root,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let mut out = Vec::new();
        for e in rustix::fs::Dir::read_from(&dir)? {
            let e = e?;
            let n = e.file_name().to_string_lossy().into_owned();
            if n != "." && n != ".." {
                out.push(n);
            }
        }
        Ok(out)
    }

    /// Removes file `name` of the pool at `root` (one no inode holds:
    /// what a dead server made ahead, or had not removed yet).
    pub fn remove(root: &OwnedFd, name: &str) -> io::Result<()> {
        Ok(rustix::fs::unlinkat(root, name, AtFlags::empty())?)
    }

    /// Makes an empty file `name` on the pool at `root`.
    pub fn make(root: &OwnedFd, name: &str) -> io::Result<()> {
        rustix::fs::openat(
            root,
            name,
            OFlags::CREATE | OFlags::RDWR | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::from_raw_mode(0o600),
        )?;
        Ok(())
    }

    /// A tmpfs for a pool, mounted nowhere (see [`Pool::new`]).
    pub fn mount(limit: Option<u64>, folios: Folios) -> io::Result<OwnedFd> {
        let ctx = rustix::mount::fsopen("tmpfs", FsOpenFlags::FSOPEN_CLOEXEC)?;
        let set = |k: &str, v: &str| {
            rustix::mount::fsconfig_set_string(ctx.as_fd(), k, v).map_err(|e| {
                io::Error::new(io::Error::from(e).kind(), format!("tmpfs {k}={v}: {e}"))
            })
        };
        // 0 is tmpfs's "no limit", as it is ramfs's.
        set("size", &limit.unwrap_or(0).to_string())?;
        // ramfs counts its own inodes; the tmpfs only holds file bodies.
        set("nr_inodes", "0")?;
        set("huge", folios.tmpfs_value())?;
        set("mode", "0700")?;
        rustix::mount::fsconfig_create(ctx.as_fd())?;
        // No atime: the file's access time is ramfs's, which reads do not
        // change (as before); nothing here is run or a device.
        let root = rustix::mount::fsmount(
            ctx.as_fd(),
            FsMountFlags::FSMOUNT_CLOEXEC,
            MountAttrFlags::MOUNT_ATTR_NOATIME
                | MountAttrFlags::MOUNT_ATTR_NOSUID
                | MountAttrFlags::MOUNT_ATTR_NODEV
                | MountAttrFlags::MOUNT_ATTR_NOEXEC,
        )?;
        Ok(root)
    }

    /// A new empty file on the pool, removed when its last body is
    /// dropped (and gone once the kernel's descriptors of it close too),
    /// and a descriptor of it open for reading and writing. The body keeps
    /// no descriptor (see the module's note); the one returned is for the
    /// caller to hand on ([`Backed::hand_out`]) or close.
    pub fn create(&self) -> io::Result<(Backed, File)> {
        let (name, file) = self.premade.take()?;
        let body = Backed {
            name: Arc::new(Name {
                root: self.root.clone(),
                name,
                used: AtomicBool::new(false),
            }),
        };
        Ok((body, file))
    }

    /// Bytes the pool's files hold and the pool's limit (0: none).
    pub fn usage(&self) -> io::Result<(u64, u64)> {
        let st = rustix::fs::fstatvfs(&self.root)?;
        let used = st.f_blocks.saturating_sub(st.f_bfree) * st.f_frsize;
        Ok((used, st.f_blocks * st.f_frsize))
    }
}

/// What the backing file says of itself.
pub(crate) struct Stat {
    pub size: u64,
    /// Bytes of memory it holds.
    pub allocated: u64,
    pub mtime: Timespec,
    pub ctime: Timespec,
}

/// A backing file's name on the pool; dropping the last one removes it.
#[derive(Debug)]
struct Name {
    root: Arc<OwnedFd>,
    name: String,
    /// Whether the file has been opened since it was made empty. Until
    /// then nothing can have written to it (no path leads to the pool), so
    /// its size is 0 without asking: a create's reply needs no `stat`.
    used: AtomicBool,
}

impl Drop for Name {
    fn drop(&mut self) {
        // The kernel's open files of it (passthrough) keep its pages until
        // they close, as an unlinked file's do.
        if let Err(e) = rustix::fs::unlinkat(&*self.root, self.name.as_str(), AtFlags::empty()) {
            log::warn!("ramfs: cannot remove backing file {}: {e}", self.name);
        }
    }
}

/// One regular file's bytes.
#[derive(Debug, Clone)]
pub(crate) struct Backed {
    name: Arc<Name>,
}

impl Backed {
    /// Its name on the pool.
    pub fn name(&self) -> &str {
        &self.name.name
    }

    /// The file opened for reading and writing: for the FUSE layer to
    /// register with the kernel, and for what the server does itself.
    /// Held only while in use (see the module's note).
    pub fn open(&self) -> io::Result<File> {
        self.name.used.store(true, Ordering::Relaxed);
        let fd = rustix::fs::openat(
            &*self.name.root,
            self.name.name.as_str(),
            OFlags::RDWR | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::empty(),
        )?;
        Ok(File::from(fd))
    }

    /// `file`, a descriptor of this body from [`Pool::create`], to be
    /// given to someone who may write through it.
    pub fn hand_out(&self, file: File) -> File {
        self.name.used.store(true, Ordering::Relaxed);
        file
    }

    pub fn stat(&self) -> io::Result<Stat> {
        if !self.name.used.load(Ordering::Relaxed) {
            // Times older than any the node can have, so the node's win
            // (see `State::attr`).
            let never = Timespec {
                sec: i64::MIN,
                nsec: 0,
            };
            return Ok(Stat {
                size: 0,
                allocated: 0,
                mtime: never,
                ctime: never,
            });
        }
        let st = rustix::fs::statat(
            &*self.name.root,
            self.name.name.as_str(),
            AtFlags::SYMLINK_NOFOLLOW,
        )?;
        Ok(Stat {
            size: st.st_size as u64,
            allocated: st.st_blocks as u64 * 512,
            mtime: Timespec {
                sec: st.st_mtime,
                nsec: st.st_mtime_nsec as u32,
            },
            ctime: Timespec {
                sec: st.st_ctime,
                nsec: st.st_ctime_nsec as u32,
            },
        })
    }

    /// Blocks of `bs` bytes the file takes, as the server path counts
    /// them: every block holding a byte of data, and no fewer than its
    /// memory fills. The kernel allocates pages (or larger folios), so a
    /// sparse file is walked by its data extents.
    pub fn blocks(&self, st: &Stat, bs: u64) -> u64 {
        let by_memory = st.allocated.div_ceil(bs);
        if st.allocated >= st.size {
            return by_memory;
        }
        let Ok(file) = self.open() else {
            return by_memory;
        };
        let mut touched = 0u64;
        // Blocks before this one are counted (a block two extents share
        // counts once).
        let mut counted_to = 0u64;
        let mut at = 0u64;
        while at < st.size {
            let Ok(start) = seek(&file, at, libc::SEEK_DATA) else {
                break;
            };
            let end = seek(&file, start, libc::SEEK_HOLE).unwrap_or(st.size);
            if end <= start {
                break;
            }
            let first = (start / bs).max(counted_to);
            let past = end.div_ceil(bs);
            touched += past.saturating_sub(first);
            counted_to = counted_to.max(past);
            at = end;
        }
        touched.max(by_memory)
    }

    /// Fills `buf` from `offset`; returns the bytes read (short at the end).
    pub fn read_into(&self, offset: u64, buf: &mut [u8]) -> io::Result<usize> {
        let file = self.open()?;
        let mut done = 0;
        while done < buf.len() {
            match file.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }

    /// Writes `data` at `offset`; returns the bytes stored, short where the
    /// pool is full after some were (the error when none were).
    pub fn write(&self, offset: u64, data: &[u8]) -> io::Result<usize> {
        let file = self.open()?;
        let mut done = 0;
        while done < data.len() {
            match file.write_at(&data[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if done > 0 => {
                    log::debug!("backing write stopped after {done} bytes: {e}");
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }

    pub fn truncate(&self, size: u64) -> io::Result<()> {
        self.open()?.set_len(size)
    }

    /// `fallocate(2)` of the backing file with the same mode.
    pub fn fallocate(&self, mode: i32, offset: u64, len: u64) -> io::Result<()> {
        let mode = rustix::fs::FallocateFlags::from_bits_retain(mode as u32);
        rustix::fs::fallocate(self.open()?.as_fd(), mode, offset, len)?;
        Ok(())
    }

    /// `lseek(2)` with `SEEK_DATA` or `SEEK_HOLE`.
    pub fn seek(&self, offset: u64, whence: i32) -> io::Result<u64> {
        seek(&self.open()?, offset, whence)
    }

    /// Sets the modification time, so the backing file's own time, which writes through the
    /// kernel move, stays the one to read.
    pub fn set_mtime(&self, t: Timespec) -> io::Result<()> {
        let ts = rustix::fs::Timestamps {
            last_access: rustix::fs::Timespec {
                tv_sec: 0,
                tv_nsec: rustix::fs::UTIME_OMIT,
            },
            last_modification: rustix::fs::Timespec {
                tv_sec: t.sec,
                tv_nsec: i64::from(t.nsec),
            },
        };
        Ok(rustix::fs::utimensat(
            &*self.name.root,
            self.name.name.as_str(),
            &ts,
            AtFlags::SYMLINK_NOFOLLOW,
        )?)
    }
}

fn seek(file: &File, offset: u64, whence: i32) -> io::Result<u64> {
    let to = match whence {
        libc::SEEK_DATA => rustix::fs::SeekFrom::Data(offset),
        libc::SEEK_HOLE => rustix::fs::SeekFrom::Hole(offset),
        _ => return Err(io::Error::from_raw_os_error(libc::EINVAL)),
    };
    Ok(rustix::fs::seek(file.as_fd(), to)?)
}

mod premade;

#[cfg(test)]
mod tests;
