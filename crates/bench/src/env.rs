//! Mounting the file systems a benchmark compares, timing workloads, and
//! cleaning up whatever was made (also on Ctrl-C).

use std::fs::{self};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use anyhow::{bail, Context, Result};

use crate::evict::evict;

/// Mount points and directories to remove if the run is interrupted.
pub(crate) static LIVE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
static WORK: Mutex<Option<PathBuf>> = Mutex::new(None);
/// Directories made outside the work directory (in /dev/shm), removed with it.
static EXTRA: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Set once cleanup has begun: no mount may start after that.
pub(crate) static STOPPING: AtomicBool = AtomicBool::new(false);

/// Unmounts everything still mounted and removes the work directory; used
/// by the Ctrl-C handler and at the end of a run. Taking the mount list's
/// lock waits for a mount in progress, so none can slip past the cleanup.
pub fn emergency_cleanup() {
    crate::readahead::restore_all();
    restore_uring();
    let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    STOPPING.store(true, Ordering::SeqCst);
    for m in live.iter().rev() {
        let _ = detach(m).stderr(Stdio::null()).status();
    }
    live.clear();
    if let Some(w) = WORK.lock().ok().and_then(|w| w.clone()) {
        let _ = fs::remove_dir_all(w);
    }
    for d in EXTRA.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
        let _ = fs::remove_dir_all(d);
    }
}

/// The command that detaches `dir` even while busy: `umount -l` as root;
/// a user may only take their own FUSE mounts down, through fusermount3.
pub(crate) fn detach(dir: &Path) -> Command {
    // SAFETY: geteuid has no preconditions.
    let mut c = if unsafe { libc::geteuid() } == 0 {
        let mut c = Command::new("umount");
        c.arg("-l");
        c
    } else {
        let mut c = Command::new("fusermount3");
        c.args(["-u", "-z"]);
        c
    };
    c.arg(dir);
    c
}

/// A directory outside the work directory for this run, removed with it
/// (also on Ctrl-C).
pub fn extra_dir(parent: &Path) -> Result<PathBuf> {
    let d = parent.join(format!("foliofs-bench.{}", std::process::id()));
    fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
    EXTRA
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(d.clone());
    Ok(d)
}

/// Removes a directory [`extra_dir`] made.
pub fn remove_extra_dir(d: &Path) {
    let _ = fs::remove_dir_all(d);
    EXTRA
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|x| x != d);
}

/// What a run that is not root's cannot do, said once at its start.
pub const NOT_ROOT: &str = "foliofs bench: not running as root, so:
  kernel rows are skipped: mounting the kernel's erofs, squashfs, ramfs and tmpfs, and loop devices, need root
  cold runs evict the files they read with posix_fadvise(DONTNEED): dropping the page cache (/proc/sys/vm/drop_caches) needs root
  foliofs mounts keep the kernel's FUSE read-ahead: raising it (/sys/class/bdi) needs root";

/// How cold runs empty the page cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cooling {
    /// Root writes `/proc/sys/vm/drop_caches`: every clean page, directory
    /// entry and inode of the machine goes.
    DropCaches,
    /// A user cannot; what anyone may do is write back the files a run
    /// reads and drop their pages with `posix_fadvise(POSIX_FADV_DONTNEED)`,
    /// then check with mincore(2) that none stayed. The disk file system's
    /// directories and inodes stay cached.
    Evict,
}

/// What the evictions of a run left in the page cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Leftover {
    /// Bytes of the files evicted, summed over evictions.
    pub bytes: u64,
    /// Of those, bytes mincore still found cached (dirty pages, pages
    /// mapped elsewhere, or a tmpfs, whose pages are the files themselves).
    pub cached: u64,
    /// Of those, bytes of files mincore cannot see into (neither ours nor
    /// writable by us: it then reports only our own mappings).
    pub unchecked: u64,
}

/// The kernel's switch for FUSE over io_uring.
pub(crate) const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// What `enable_uring` said before this run switched it on, to put back.
static URING_WAS: Mutex<Option<String>> = Mutex::new(None);

/// Switches FUSE over io_uring on for the run (root), remembering what to
/// put back; false where the kernel has no switch or it cannot be written.
fn switch_uring_on() -> bool {
    let Ok(was) = fs::read_to_string(ENABLE_URING) else {
        return false;
    };
    let mut slot = URING_WAS.lock().unwrap_or_else(|e| e.into_inner());
    if fs::write(ENABLE_URING, "Y").is_err() {
        return false;
    }
    slot.get_or_insert(was.trim().to_owned());
    true
}

/// Puts `enable_uring` back as the run found it.
pub(crate) fn restore_uring() {
    if let Some(was) = URING_WAS.lock().unwrap_or_else(|e| e.into_inner()).take() {
        let _ = fs::write(ENABLE_URING, was);
    }
}

/// What `enable_uring` was before the run, if the run switched it on.
pub(crate) fn uring_was() -> Option<String> {
    URING_WAS.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Where a benchmark keeps its data, and what it may do.
pub struct BenchEnv {
    pub dir: PathBuf,
    pub root: bool,
    pub exe: PathBuf,
    /// FUSE over io_uring is on for this run (root switched it on): the
    /// io_uring rows run, and every other foliofs row asks for /dev/fuse.
    pub uring: bool,
    leftover: Mutex<Leftover>,
}

impl BenchEnv {
    pub fn new(parent: Option<&Path>) -> Result<BenchEnv> {
        let parent = parent
            .map(Path::to_owned)
            .unwrap_or_else(std::env::temp_dir);
        let dir = parent.join(format!("foliofs-bench.{}", std::process::id()));
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        *WORK.lock().unwrap_or_else(|e| e.into_inner()) = Some(dir.clone());
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        let uring = root && switch_uring_on();
        Ok(BenchEnv {
            dir,
            root,
            exe: std::env::current_exe().context("finding the foliofs binary")?,
            uring,
            leftover: Mutex::new(Leftover::default()),
        })
    }

    /// A fresh, empty directory under the work directory.
    pub fn subdir(&self, name: &str) -> Result<PathBuf> {
        let d = self.dir.join(name);
        if d.exists() {
            fs::remove_dir_all(&d)?;
        }
        fs::create_dir_all(&d)?;
        Ok(d)
    }

    /// A new, empty directory under the work directory, never reused, so a
    /// mount that failed to go away is never deleted through.
    pub fn fresh_dir(&self, prefix: &str) -> Result<PathBuf> {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let d = self
            .dir
            .join(format!("{prefix}{}", NEXT.fetch_add(1, Ordering::Relaxed)));
        fs::create_dir_all(&d)?;
        Ok(d)
    }

    /// Drops the page cache when running as root; false otherwise.
    pub fn drop_caches(&self) -> bool {
        if !self.root {
            return false;
        }
        // SAFETY: sync has no preconditions.
        unsafe { libc::sync() };
        fs::write("/proc/sys/vm/drop_caches", "3\n").is_ok()
    }

    /// How [`BenchEnv::cool`] empties the page cache here.
    pub fn cooling(&self) -> Cooling {
        if self.root {
            Cooling::DropCaches
        } else {
            Cooling::Evict
        }
    }

    /// Empties the page cache before a cold run that reads `path` (a file,
    /// or every file under a directory): all of it as root, only `path`'s
    /// otherwise.
    pub fn cool(&self, path: &Path) {
        match self.cooling() {
            Cooling::DropCaches => {
                self.drop_caches();
            }
            Cooling::Evict => {
                let l = evict(path);
                let mut all = self.leftover.lock().unwrap_or_else(|e| e.into_inner());
                all.bytes += l.bytes;
                all.cached += l.cached;
                all.unchecked += l.unchecked;
            }
        }
    }

    /// What the evictions since the last call left cached.
    pub fn take_leftover(&self) -> Leftover {
        std::mem::take(&mut *self.leftover.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl Drop for BenchEnv {
    fn drop(&mut self) {
        // Unmounts anything a failed step left behind before removing the
        // directories they sit on.
        emergency_cleanup();
        *WORK.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// Whether `prog` is on PATH.
pub fn have(prog: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| is_executable(&d.join(prog))))
}

/// Whether `f` is a file someone may execute.
pub fn is_executable(f: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    f.is_file() && fs::metadata(f).is_ok_and(|m| m.permissions().mode() & 0o111 != 0)
}

/// Runs a command to completion (bounded), failing with its stderr.
pub fn run(cmd: &mut Command) -> Result<()> {
    let desc = format!("{cmd:?}");
    let out = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .with_context(|| format!("starting {desc}"))?;
    if !out.status.success() {
        bail!(
            "{desc} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Removes everything in `dir`, keeping it.
pub(crate) fn empty_dir(dir: &Path) -> Result<()> {
    for e in fs::read_dir(dir)? {
        let p = e?.path();
        if p.is_dir() {
            fs::remove_dir_all(&p)?;
        } else {
            fs::remove_file(&p)?;
        }
    }
    Ok(())
}
