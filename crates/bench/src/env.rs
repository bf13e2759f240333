//! Mounting the file systems a benchmark compares, timing workloads, and
//! cleaning up whatever was made (also on Ctrl-C).

use std::ffi::CString;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use anyhow::{bail, Context, Result};

/// Mount points and directories to remove if the run is interrupted.
static LIVE: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
static WORK: Mutex<Option<PathBuf>> = Mutex::new(None);
/// Directories made outside the work directory (in /dev/shm), removed with it.
static EXTRA: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

/// Set once cleanup has begun: no mount may start after that.
static STOPPING: AtomicBool = AtomicBool::new(false);

/// Unmounts everything still mounted and removes the work directory; used
/// by the Ctrl-C handler and at the end of a run. Taking the mount list's
/// lock waits for a mount in progress, so none can slip past the cleanup.
pub fn emergency_cleanup() {
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
fn detach(dir: &Path) -> Command {
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

/// Where a benchmark keeps its data, and what it may do.
pub struct BenchEnv {
    pub dir: PathBuf,
    pub root: bool,
    pub exe: PathBuf,
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
        Ok(BenchEnv {
            dir,
            root,
            exe: std::env::current_exe().context("finding the foliofs binary")?,
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

/// Evicts every regular file at or under `path` from the page cache (see
/// [`Cooling::Evict`]); symbolic links are not followed.
pub fn evict(path: &Path) -> Leftover {
    let mut l = Leftover::default();
    let Ok(md) = fs::symlink_metadata(path) else {
        return l;
    };
    if md.is_dir() {
        if let Ok(entries) = fs::read_dir(path) {
            for e in entries.flatten() {
                let sub = evict(&e.path());
                l.bytes += sub.bytes;
                l.cached += sub.cached;
                l.unchecked += sub.unchecked;
            }
        }
    } else if md.is_file() {
        l.bytes = md.len();
        match evict_file(path, md.len()) {
            Ok(Some(cached)) => l.cached = cached,
            Ok(None) => l.unchecked = md.len(),
            // Not evicted: count all of it as cached.
            Err(_) => l.cached = md.len(),
        }
    }
    l
}

/// Writes `path` back and drops its pages; returns the bytes still cached,
/// or `None` where mincore cannot tell.
fn evict_file(path: &Path, len: u64) -> std::io::Result<Option<u64>> {
    use nix::fcntl::{posix_fadvise, PosixFadviseAdvice};
    let f = File::open(path)?;
    // DONTNEED skips dirty pages; a file just written still has some.
    f.sync_data()?;
    posix_fadvise(&f, 0, 0, PosixFadviseAdvice::POSIX_FADV_DONTNEED)?;
    // Since Linux 5.0 mincore tells about the page cache only to those who
    // own the file or may write it; for others it sees only its own mapping.
    let mine = fs::metadata(path).is_ok_and(|m| {
        use std::os::unix::fs::MetadataExt;
        // SAFETY: geteuid has no preconditions.
        m.uid() == unsafe { libc::geteuid() }
    });
    if !mine && nix::unistd::access(path, nix::unistd::AccessFlags::W_OK).is_err() {
        return Ok(None);
    }
    cached_bytes(&f, len).map(Some)
}

/// Bytes of the first `len` of `f` in the page cache, by mincore(2).
fn cached_bytes(f: &File, len: u64) -> std::io::Result<u64> {
    let Ok(len) = usize::try_from(len) else {
        return Err(std::io::Error::other("file too large to map"));
    };
    if len == 0 {
        return Ok(0);
    }
    let page = foliofs_block::page_size() as usize;
    let mut vec = vec![0u8; len.div_ceil(page)];
    // SAFETY: a new read-only shared mapping of a file held open; nothing
    // reads through it (mincore only looks at the page cache behind it) and
    // it is unmapped below.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    if addr == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `addr..addr + len` is the mapping made above, and `vec` has a
    // byte for each of its pages.
    let rc = unsafe { libc::mincore(addr, len, vec.as_mut_ptr()) };
    let err = std::io::Error::last_os_error();
    // SAFETY: the mapping made above, which nothing else refers to.
    unsafe { libc::munmap(addr, len) };
    if rc != 0 {
        return Err(err);
    }
    let pages = vec.iter().filter(|&&b| b & 1 != 0).count();
    Ok(((pages * page).min(len)) as u64)
}

/// The read-ahead of a user's first read-only foliofs mount, in KiB.
static USER_READ_AHEAD_KB: AtomicU32 = AtomicU32::new(0);

/// The read-ahead the kernel gave a user's read-only foliofs mount (root
/// raises it; a user cannot), once one was mounted.
pub fn user_read_ahead_kb() -> Option<u32> {
    match USER_READ_AHEAD_KB.load(Ordering::Relaxed) {
        0 => None,
        kb => Some(kb),
    }
}

/// The read-ahead of the mount at `dir`, from its bdi.
fn read_ahead_kb(dir: &Path) -> Option<u32> {
    let m = foliofs_fuse::find_mount(dir).ok()??;
    fs::read_to_string(format!(
        "/sys/class/bdi/{}:{}/read_ahead_kb",
        m.major, m.minor
    ))
    .ok()?
    .trim()
    .parse()
    .ok()
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

/// How a mount is made.
#[derive(Clone, Debug)]
pub enum How {
    /// `foliofs mount -t TYPE -o OPTS`.
    Foliofs { fstype: &'static str, opts: String },
    /// The kernel, mount(2) with the image file itself as the source.
    KernelFile { fstype: &'static str, opts: String },
    /// The kernel, through a loop device.
    KernelLoop { fstype: &'static str },
    /// squashfuse.
    Squashfuse,
    /// The kernel's in-memory file systems (source "none").
    KernelMem { fstype: &'static str, opts: String },
    /// No mount: the source is a directory used as it is.
    Plain,
}

/// A live mount, unmounted on drop.
pub struct Mounted {
    pub dir: PathBuf,
    how: How,
    exe: PathBuf,
}

impl Mounted {
    pub fn new(env: &BenchEnv, how: &How, source: &Path, dir: &Path) -> Result<Mounted> {
        Self::with_env(env, how, source, dir, &[])
    }

    /// [`Mounted::new`], with `vars` added to a foliofs server's
    /// environment (a remote image's credentials).
    pub fn with_env(
        env: &BenchEnv,
        how: &How,
        source: &Path,
        dir: &Path,
        vars: &[(&str, &str)],
    ) -> Result<Mounted> {
        if let How::Plain = how {
            return Ok(Mounted {
                dir: source.to_owned(),
                how: how.clone(),
                exe: env.exe.clone(),
            });
        }
        fs::create_dir_all(dir)?;
        // Held while mounting: the Ctrl-C handler waits for this mount and
        // then finds it in the list.
        let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
        if STOPPING.load(Ordering::SeqCst) {
            bail!("interrupted");
        }
        match how {
            How::Foliofs { fstype, opts } => {
                let mut c = Command::new(&env.exe);
                c.envs(vars.iter().copied());
                c.args(["mount", "-t", fstype]);
                if !opts.is_empty() {
                    c.args(["-o", opts]);
                }
                run(c.arg(source).arg(dir))?;
                if !env.root && *fstype != "ramfs" && user_read_ahead_kb().is_none() {
                    if let Some(kb) = read_ahead_kb(dir) {
                        USER_READ_AHEAD_KB.store(kb, Ordering::Relaxed);
                    }
                }
            }
            How::KernelFile { fstype, opts } | How::KernelMem { fstype, opts } => {
                sys_mount(source, dir, fstype, opts)?
            }
            How::KernelLoop { fstype } => {
                run(Command::new("mount")
                    .args(["-t", fstype, "-o", "loop,ro"])
                    .arg(source)
                    .arg(dir))?;
            }
            How::Squashfuse => run(Command::new("squashfuse").arg(source).arg(dir))?,
            How::Plain => unreachable!("handled above"),
        }
        live.push(dir.to_owned());
        Ok(Mounted {
            dir: dir.to_owned(),
            how: how.clone(),
            exe: env.exe.clone(),
        })
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let How::Plain = self.how {
            return;
        }
        let ok = match self.how {
            How::Foliofs { .. } => {
                run(Command::new(&self.exe).arg("umount").arg(&self.dir)).is_ok()
            }
            How::Squashfuse => run(Command::new("fusermount3").arg("-u").arg(&self.dir)).is_ok(),
            _ => run(Command::new("umount").arg(&self.dir)).is_ok(),
        };
        if !ok {
            let _ = run(&mut detach(&self.dir));
        }
        LIVE.lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|d| d != &self.dir);
    }
}

fn cstr(p: &[u8]) -> Result<CString> {
    CString::new(p).context("a path with a NUL byte")
}

/// mount(2) directly: util-linux would put a loop device under a regular file.
fn sys_mount(source: &Path, dir: &Path, fstype: &str, opts: &str) -> Result<()> {
    let src = cstr(source.as_os_str().as_bytes())?;
    let tgt = cstr(dir.as_os_str().as_bytes())?;
    let ty = cstr(fstype.as_bytes())?;
    let data = cstr(opts.as_bytes())?;
    let flags = if fstype == "erofs" || fstype == "squashfs" {
        libc::MS_RDONLY
    } else {
        0
    };
    // SAFETY: every pointer is a valid NUL-terminated string that outlives the call.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            tgt.as_ptr(),
            ty.as_ptr(),
            flags,
            data.as_ptr().cast(),
        )
    };
    if rc != 0 {
        bail!(
            "mount -t {fstype} -o {opts:?} {} {}: {}",
            source.display(),
            dir.display(),
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

/// Reads `path` to the end with 1 MiB reads (what `dd bs=1M of=/dev/null`
/// does); returns seconds and bytes.
pub fn time_read(path: &Path) -> Result<(f64, u64)> {
    let mut buf = vec![0u8; 1 << 20];
    let start = Instant::now();
    let mut f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut total = 0u64;
    loop {
        let n = f
            .read(&mut buf)
            .with_context(|| format!("reading {} at {total}", path.display()))?;
        if n == 0 {
            break;
        }
        total += n as u64;
    }
    Ok((start.elapsed().as_secs_f64(), total))
}

/// Seconds `md5sum PATH` takes (the romfs seed's own workload).
pub fn time_md5(path: &Path) -> Result<f64> {
    let start = Instant::now();
    run(Command::new("md5sum").arg(path))?;
    Ok(start.elapsed().as_secs_f64())
}

/// Seconds a command takes, with its output discarded.
pub fn time_cmd(cmd: &mut Command) -> Result<f64> {
    let start = Instant::now();
    run(cmd)?;
    Ok(start.elapsed().as_secs_f64())
}

/// Writes `total` zero bytes to a new file in `bs`-byte writes (what
/// `dd if=/dev/zero bs=BS` does), closing it; returns seconds.
pub fn time_write_zeros(path: &Path, total: u64, bs: usize) -> Result<f64> {
    let buf = vec![0u8; bs];
    let start = Instant::now();
    let mut f = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut left = total;
    while left > 0 {
        let n = left.min(bs as u64) as usize;
        f.write_all(&buf[..n])
            .with_context(|| format!("writing {}", path.display()))?;
        left -= n as u64;
    }
    drop(f);
    Ok(start.elapsed().as_secs_f64())
}

/// Reads every regular file under `dir` (the container start-up set).
pub fn time_read_tree(dir: &Path) -> Result<f64> {
    let start = Instant::now();
    let mut buf = vec![0u8; 1 << 20];
    read_tree(dir, &mut buf)?;
    Ok(start.elapsed().as_secs_f64())
}

fn read_tree(dir: &Path, buf: &mut [u8]) -> Result<()> {
    for e in fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let e = e?;
        let t = e.file_type()?;
        if t.is_dir() {
            read_tree(&e.path(), buf)?;
        } else if t.is_file() {
            let mut f = File::open(e.path())?;
            while f.read(buf)? > 0 {}
        }
    }
    Ok(())
}

/// The mkfs.erofs a run builds its EROFS images with, and what it says it
/// can compress with.
#[derive(Clone, Debug)]
pub struct MkfsErofs {
    pub path: PathBuf,
    /// Its version as it prints it ("1.9.3"), if it does.
    pub version: Option<String>,
    /// The compressors it lists; `None` if it lists none we can read, in
    /// which case an image is simply tried.
    pub compressors: Option<Vec<String>>,
}

impl MkfsErofs {
    /// Asks `path` for its version and compressors. erofs-utils 1.6 and
    /// later print both for `-V`; older ones refuse `-V` but print their
    /// version on stdout and the compressors at the end of their usage.
    pub fn probe(path: &Path) -> MkfsErofs {
        let mut text = String::new();
        for flag in ["-V", "--help"] {
            if let Ok(out) = Command::new(path).arg(flag).stdin(Stdio::null()).output() {
                text.push_str(&String::from_utf8_lossy(&out.stdout));
                text.push('\n');
                text.push_str(&String::from_utf8_lossy(&out.stderr));
                text.push('\n');
            }
            if parse_compressors(&text).is_some() {
                break;
            }
        }
        MkfsErofs {
            path: path.to_owned(),
            version: parse_version(&text),
            compressors: parse_compressors(&text),
        }
    }

    /// Why this mkfs.erofs cannot make `alg` images, if it says so.
    pub fn lacks(&self, alg: &str) -> Option<String> {
        let list = self.compressors.as_ref()?;
        if list.iter().any(|c| c == alg) {
            return None;
        }
        Some(format!(
            "{} makes no {alg} images: needs a mkfs.erofs that lists {alg} in `-V` (erofs-utils 1.9.3 does; --mkfs-erofs PATH)",
            self.describe(),
        ))
    }

    /// "mkfs.erofs 1.5" or "/path/mkfs.erofs 1.9.3", as notes name it.
    pub fn describe(&self) -> String {
        let name = if self.path.components().count() > 1 {
            self.path.display().to_string()
        } else {
            "mkfs.erofs".to_owned()
        };
        match &self.version {
            Some(v) => format!("{name} {v}"),
            None => name,
        }
    }
}

/// The version on the first line naming mkfs.erofs: its last word, when
/// that starts with a digit.
fn parse_version(text: &str) -> Option<String> {
    text.lines()
        .filter(|l| l.contains("mkfs.erofs") && !l.contains("sage"))
        .find_map(|l| {
            let w = l.split_whitespace().last()?;
            w.starts_with(|c: char| c.is_ascii_digit())
                .then(|| w.to_owned())
        })
}

/// The names on a line such as "available compressors: lz4, lz4hc, zstd"
/// (other lines of a usage text mention compressors too, but not a list).
fn parse_compressors(text: &str) -> Option<Vec<String>> {
    text.lines()
        .filter(|l| l.to_ascii_lowercase().contains("compressors"))
        .find_map(|l| {
            let (_, names) = l.rsplit_once(':')?;
            let list: Vec<String> = names
                .split([',', ' '])
                .filter(|n| !n.is_empty())
                .map(str::to_owned)
                .collect();
            let word = |n: &String| n.chars().all(|c| c.is_ascii_alphanumeric());
            (!list.is_empty() && list.iter().all(word)).then_some(list)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eviction_empties_a_disk_files_cache_and_says_what_stayed() {
        let is_tmpfs = |p: &Path| {
            nix::sys::statfs::statfs(p)
                .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC)
        };
        let dir = std::env::temp_dir().join(format!("foliofs-evict.{}", std::process::id()));
        fs::create_dir_all(dir.join("sub")).unwrap();
        // Written, so dirty: eviction has to write them back first.
        fs::write(dir.join("a"), vec![7u8; 1 << 20]).unwrap();
        fs::write(dir.join("sub/b"), vec![8u8; 300_000]).unwrap();
        fs::write(dir.join("empty"), b"").unwrap();
        let f = File::open(dir.join("a")).unwrap();
        assert_eq!(cached_bytes(&f, 1 << 20).unwrap(), 1 << 20);
        let l = evict(&dir);
        assert_eq!(l.bytes, (1 << 20) + 300_000);
        assert_eq!(l.unchecked, 0);
        if is_tmpfs(&dir) {
            // A tmpfs's pages are its files: nothing leaves.
            assert_eq!(l.cached, l.bytes);
        } else {
            assert_eq!(l.cached, 0, "{l:?}");
            assert_eq!(cached_bytes(&f, 1 << 20).unwrap(), 0);
        }
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn compressors_and_versions_of_old_and_new_mkfs() {
        // erofs-utils 1.9.3's `-V`.
        let new = "mkfs.erofs (erofs-utils) 1.9.3\navailable compressors: lz4, lz4hc, lzma, deflate, libdeflate, zstd\n";
        assert_eq!(parse_version(new).as_deref(), Some("1.9.3"));
        assert_eq!(
            parse_compressors(new).unwrap(),
            ["lz4", "lz4hc", "lzma", "deflate", "libdeflate", "zstd"]
        );
        // 1.5 refuses `-V`: its version on stdout, its usage on stderr.
        let old = "mkfs.erofs 1.5\n\nmkfs.erofs: invalid option -- 'V'\nusage: [options] FILE DIRECTORY\n -zX[,Y]               X=compressor (Y=compression level, optional)\n\nAvailable compressors are: lz4hc, lz4\n";
        assert_eq!(parse_version(old).as_deref(), Some("1.5"));
        assert_eq!(parse_compressors(old).unwrap(), ["lz4hc", "lz4"]);
        assert_eq!(parse_compressors("mkfs.erofs 1.0\n"), None);
        let help = " -zX[,level=Y]   alternative compressors can be separated by colons(:)\n";
        assert_eq!(parse_compressors(help), None);
        let m = MkfsErofs {
            path: "mkfs.erofs".into(),
            version: Some("1.5".into()),
            compressors: parse_compressors(old),
        };
        assert_eq!(m.lacks("lz4hc"), None);
        let why = m.lacks("zstd").unwrap();
        assert!(
            why.starts_with("mkfs.erofs 1.5 makes no zstd images"),
            "{why}"
        );
        let unknown = MkfsErofs {
            compressors: None,
            ..m
        };
        assert_eq!(unknown.lacks("zstd"), None);
    }
}
