//! `foliofs extract`: recreate an image's tree (or part of it) in a directory.

use std::collections::{HashMap, HashSet};
use std::ffi::{CString, OsStr, OsString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, bail, Context};
use foliofs_vfs::{Attr, FileSystem, FileType, Ino, Scratch, Timespec};

use crate::inspect::{list, resolve, CHUNK};
use crate::open::ImageArgs;

#[derive(clap::Args, Debug)]
pub struct ExtractArgs {
    /// Replace existing files (never directories) of the same names.
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub image: ImageArgs,
    /// Directory to extract into (created if missing).
    pub dir: PathBuf,
    /// Path in the image to extract (default: everything).
    pub path: Option<String>,
}

/// `foliofs extract [--force] IMAGE DIR [PATH]`.
///
/// Everything is created relative to open directory descriptors with
/// `O_NOFOLLOW`, one name component at a time, so no name or symlink in the
/// image can lead a write outside DIR.
pub fn run(args: ExtractArgs) -> anyhow::Result<i32> {
    let image = args.image.open()?;
    let fs = image.fs();
    let path = args.path.clone().unwrap_or_else(|| ".".into());
    let top = resolve(&*fs, &path)?;
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("cannot create {}", args.dir.display()))?;
    // One descriptor stays open per directory level being filled; allow as
    // many as the hard limit does, so deep trees extract.
    raise_fd_limit();
    let root_fd = open_dir_path(&args.dir)?;
    let mut x = Extractor {
        fs: fs.clone(),
        force: args.force,
        root: geteuid_is_root(),
        set_times: fs.info().fs_type != "romfs",
        dir_shown: args.dir.clone(),
        first_path: HashMap::new(),
        dirs_done: HashSet::new(),
        scratch: Scratch::new(),
        errors: 0,
    };
    if top.kind == FileType::Directory {
        x.tree(root_fd, top)?;
    } else {
        let name = path
            .rsplit('/')
            .find(|c| !c.is_empty())
            .ok_or_else(|| anyhow!("{path}: no file name"))?;
        let name = OsString::from(name);
        x.entry(root_fd.as_raw_fd(), &PathBuf::new(), &name, top)?;
    }
    if x.errors > 0 {
        eprintln!("foliofs: extract: {} error(s)", x.errors);
        return Ok(1);
    }
    Ok(0)
}

struct Extractor {
    fs: Arc<dyn FileSystem>,
    force: bool,
    root: bool,
    set_times: bool,
    dir_shown: PathBuf,
    /// First extracted path (relative to DIR) of each non-directory inode:
    /// later names become hard links to it.
    first_path: HashMap<Ino, PathBuf>,
    dirs_done: HashSet<Ino>,
    scratch: Scratch,
    errors: u64,
}

/// A directory being filled, with the attributes to give it once done.
struct Pending {
    fd: OwnedFd,
    rel: PathBuf,
    attr: Attr,
    entries: std::vec::IntoIter<(OsString, Ino, FileType)>,
    /// Made by this extraction: only then (or with `--force`) does it take
    /// the image's mode, owner and times.
    created: bool,
}

impl Extractor {
    fn warn(&mut self, rel: &Path, what: impl std::fmt::Display) {
        eprintln!("foliofs: {}: {what}", self.dir_shown.join(rel).display());
        self.errors += 1;
    }

    /// Extracts the contents of directory `top` into `fd`.
    fn tree(&mut self, fd: OwnedFd, top: Attr) -> anyhow::Result<()> {
        self.dirs_done.insert(top.ino);
        let entries = list(&*self.fs, top.ino)?;
        let mut stack = vec![Pending {
            fd,
            rel: PathBuf::new(),
            attr: top,
            entries: entries.into_iter(),
            created: false,
        }];
        while let Some(top) = stack.last_mut() {
            let Some((name, ino, _)) = top.entries.next() else {
                let done = stack.pop().expect("non-empty");
                if !done.rel.as_os_str().is_empty() {
                    self.finish_dir(&done);
                }
                continue;
            };
            let parent = top.fd.as_raw_fd();
            let rel = top.rel.clone();
            let attr = match self.fs.getattr(ino) {
                Ok(a) => a,
                Err(e) => {
                    self.warn(&rel.join(&name), e);
                    continue;
                }
            };
            if attr.kind != FileType::Directory {
                self.entry(parent, &rel, &name, attr)?;
                continue;
            }
            let child_rel = rel.join(&name);
            if !self.dirs_done.insert(attr.ino) {
                self.warn(&child_rel, "directory already extracted elsewhere (a loop or linked directory in the image); skipped");
                continue;
            }
            if let Err(e) = check_name(&name) {
                self.warn(&child_rel, e);
                continue;
            }
            let (fd, created) = match self.make_dir(parent, &name) {
                Ok(made) => made,
                Err(e) => {
                    self.warn(&child_rel, format!("{e:#}"));
                    continue;
                }
            };
            let entries = match list(&*self.fs, attr.ino) {
                Ok(e) => e,
                Err(e) => {
                    self.warn(&child_rel, e);
                    Vec::new()
                }
            };
            stack.push(Pending {
                fd,
                rel: child_rel,
                attr,
                entries: entries.into_iter(),
                created,
            });
        }
        Ok(())
    }

    fn finish_dir(&mut self, d: &Pending) {
        if !d.created && !self.force {
            // A directory that was already there keeps its own mode and
            // owner: an image must not loosen what the user set.
            return;
        }
        let fd = d.fd.as_raw_fd();
        if self.root {
            // SAFETY: fd is an open directory descriptor we own.
            if unsafe { libc::fchown(fd, d.attr.uid, d.attr.gid) } != 0 {
                let e = std::io::Error::last_os_error();
                self.warn(&d.rel, format!("chown: {e}"));
            }
        }
        // SAFETY: as above.
        if unsafe { libc::fchmod(fd, u32::from(d.attr.perm)) } != 0 {
            let e = std::io::Error::last_os_error();
            self.warn(&d.rel, format!("chmod: {e}"));
        }
        if self.set_times {
            let ts = times(&d.attr);
            // SAFETY: ts is a valid two-element array; fd is open.
            if unsafe { libc::futimens(fd, ts.as_ptr()) } != 0 {
                let e = std::io::Error::last_os_error();
                self.warn(&d.rel, format!("set times: {e}"));
            }
        }
    }

    /// Creates (or, for an existing real directory, opens) directory `name`
    /// in `parent`, never following a symlink.
    fn make_dir(&mut self, parent: RawFd, name: &OsStr) -> anyhow::Result<(OwnedFd, bool)> {
        let c = cstr(name);
        let mut created = true;
        // SAFETY: c is NUL-terminated; parent is an open directory.
        if unsafe { libc::mkdirat(parent, c.as_ptr(), 0o700) } != 0 {
            created = false;
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EEXIST) {
                return Err(anyhow!("mkdir: {e}"));
            }
            if self.force && !is_dir_nofollow(parent, &c) {
                unlink_nondir(parent, &c)?;
                // SAFETY: as above.
                if unsafe { libc::mkdirat(parent, c.as_ptr(), 0o700) } != 0 {
                    return Err(anyhow!("mkdir: {}", std::io::Error::last_os_error()));
                }
                created = true;
            }
        }
        // SAFETY: as above; O_NOFOLLOW refuses a symlink in its place.
        let fd = unsafe {
            libc::openat(
                parent,
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            return Err(anyhow!(
                "exists and is not a directory ({e}); not descending (use --force to replace it)"
            ));
        }
        // SAFETY: fd was just returned by openat and is owned by nobody else.
        Ok((unsafe { OwnedFd::from_raw_fd(fd) }, created))
    }

    /// Extracts one non-directory entry (or, at the top, a directory) into
    /// `parent`. Failures of this entry are counted, not returned.
    fn entry(&mut self, parent: RawFd, rel: &Path, name: &OsStr, a: Attr) -> anyhow::Result<()> {
        let shown = rel.join(name);
        if let Err(e) = check_name(name) {
            self.warn(&shown, e);
            return Ok(());
        }
        if a.kind == FileType::Directory {
            let fd = match self.make_dir(parent, name) {
                Ok((fd, _)) => fd,
                Err(e) => {
                    self.warn(&shown, format!("{e:#}"));
                    return Ok(());
                }
            };
            return self.tree(fd, a);
        }
        let c = cstr(name);
        if let Some(first) = self.first_path.get(&a.ino).cloned() {
            if let Err(e) = self.hard_link(parent, &c, &first) {
                self.warn(&shown, format!("hard link to {}: {e:#}", first.display()));
            }
            return Ok(());
        }
        match self.create(parent, &c, &a, &shown) {
            Ok(true) => {
                self.first_path.insert(a.ino, shown);
            }
            Ok(false) => {}
            Err(e) => self.warn(&shown, format!("{e:#}")),
        }
        Ok(())
    }

    /// Makes room for `name` in `parent`: fails if it exists, unless
    /// `--force` and it is not a directory.
    fn clear(&self, parent: RawFd, c: &CString) -> anyhow::Result<()> {
        let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
        // SAFETY: c is NUL-terminated, st is writable; AT_SYMLINK_NOFOLLOW.
        let rc = unsafe {
            libc::fstatat(
                parent,
                c.as_ptr(),
                st.as_mut_ptr(),
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        if rc != 0 {
            return Ok(());
        }
        if !self.force {
            bail!("already exists; not overwriting (use --force)");
        }
        unlink_nondir(parent, c)
    }

    /// Creates a non-directory; returns whether something was created.
    fn create(
        &mut self,
        parent: RawFd,
        c: &CString,
        a: &Attr,
        shown: &Path,
    ) -> anyhow::Result<bool> {
        self.clear(parent, c)?;
        match a.kind {
            FileType::RegularFile => {
                // SAFETY: c is NUL-terminated; O_EXCL|O_NOFOLLOW never opens
                // something that is already there.
                let fd = unsafe {
                    libc::openat(
                        parent,
                        c.as_ptr(),
                        libc::O_WRONLY
                            | libc::O_CREAT
                            | libc::O_EXCL
                            | libc::O_NOFOLLOW
                            | libc::O_CLOEXEC,
                        0o600,
                    )
                };
                if fd < 0 {
                    bail!("create: {}", std::io::Error::last_os_error());
                }
                // SAFETY: fd was just returned by openat.
                let file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
                self.write_data(&file, a, shown)?;
                self.set_attrs(Some(file.as_raw_fd()), parent, c, a)?;
            }
            FileType::Symlink => {
                let target = CString::new(self.fs.readlink(a.ino)?)
                    .map_err(|_| anyhow!("symlink target contains a NUL byte"))?;
                // SAFETY: both strings are NUL-terminated; parent is open.
                if unsafe { libc::symlinkat(target.as_ptr(), parent, c.as_ptr()) } != 0 {
                    bail!("symlink: {}", std::io::Error::last_os_error());
                }
                self.set_attrs(None, parent, c, a)?;
            }
            FileType::BlockDevice | FileType::CharDevice if !self.root => {
                eprintln!(
                    "foliofs: {}: device node skipped (needs root)",
                    self.dir_shown.join(shown).display()
                );
                return Ok(false);
            }
            FileType::BlockDevice | FileType::CharDevice | FileType::Fifo | FileType::Socket => {
                let mode = a.kind.mode_bits() | u32::from(a.perm);
                // SAFETY: c is NUL-terminated; parent is open.
                if unsafe { libc::mknodat(parent, c.as_ptr(), mode, a.rdev.to_dev_t()) } != 0 {
                    bail!("mknod: {}", std::io::Error::last_os_error());
                }
                self.set_attrs(None, parent, c, a)?;
            }
            FileType::Directory => unreachable!("directories are made by make_dir"),
        }
        Ok(true)
    }

    fn write_data(&mut self, file: &std::fs::File, a: &Attr, shown: &Path) -> anyhow::Result<()> {
        use std::os::unix::fs::FileExt;
        let mut off = 0u64;
        loop {
            let data = self
                .fs
                .read(a.ino, off, CHUNK, &mut self.scratch)
                .with_context(|| format!("read at {off}"))?;
            if data.is_empty() {
                break;
            }
            file.write_all_at(data, off)
                .with_context(|| format!("write {}", shown.display()))?;
            off += data.len() as u64;
        }
        if off != a.size {
            bail!("read {off} bytes of {}", a.size);
        }
        Ok(())
    }

    /// Owner (when root), mode (not for symlinks) and times.
    fn set_attrs(
        &self,
        fd: Option<RawFd>,
        parent: RawFd,
        c: &CString,
        a: &Attr,
    ) -> anyhow::Result<()> {
        if self.root {
            // SAFETY: c is NUL-terminated; AT_SYMLINK_NOFOLLOW changes the
            // link itself.
            if unsafe {
                libc::fchownat(parent, c.as_ptr(), a.uid, a.gid, libc::AT_SYMLINK_NOFOLLOW)
            } != 0
            {
                bail!("chown: {}", std::io::Error::last_os_error());
            }
        }
        if let Some(fd) = fd {
            // SAFETY: fd is an open file we own.
            if unsafe { libc::fchmod(fd, u32::from(a.perm)) } != 0 {
                bail!("chmod: {}", std::io::Error::last_os_error());
            }
        } else if a.kind != FileType::Symlink {
            // SAFETY: c is NUL-terminated; the node was just made by us and
            // is not a symlink, so fchmodat does not follow one.
            if unsafe { libc::fchmodat(parent, c.as_ptr(), u32::from(a.perm), 0) } != 0 {
                bail!("chmod: {}", std::io::Error::last_os_error());
            }
        }
        if self.set_times {
            let ts = times(a);
            // SAFETY: ts is a two-element array; AT_SYMLINK_NOFOLLOW.
            if unsafe {
                libc::utimensat(parent, c.as_ptr(), ts.as_ptr(), libc::AT_SYMLINK_NOFOLLOW)
            } != 0
            {
                bail!("set times: {}", std::io::Error::last_os_error());
            }
        }
        Ok(())
    }

    /// Links `name` in `parent` to the already extracted `first` (relative
    /// to DIR), walking `first` one component at a time with `O_NOFOLLOW`.
    fn hard_link(&mut self, parent: RawFd, c: &CString, first: &Path) -> anyhow::Result<()> {
        self.clear(parent, c)?;
        let dir = first.parent().unwrap_or(Path::new(""));
        let leaf = cstr(first.file_name().ok_or_else(|| anyhow!("no file name"))?);
        let top = open_dir_path(&self.dir_shown)?;
        let mut cur = top;
        for comp in dir.components() {
            let cc = cstr(comp.as_os_str());
            // SAFETY: cc is NUL-terminated; cur is an open directory.
            let fd = unsafe {
                libc::openat(
                    cur.as_raw_fd(),
                    cc.as_ptr(),
                    libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                )
            };
            if fd < 0 {
                bail!("{}", std::io::Error::last_os_error());
            }
            // SAFETY: fd was just returned by openat.
            cur = unsafe { OwnedFd::from_raw_fd(fd) };
        }
        // SAFETY: both names are NUL-terminated; flags 0 do not follow a
        // symlink at the source.
        if unsafe { libc::linkat(cur.as_raw_fd(), leaf.as_ptr(), parent, c.as_ptr(), 0) } != 0 {
            bail!("{}", std::io::Error::last_os_error());
        }
        Ok(())
    }
}

/// Refuses names that are not one plain path component.
fn check_name(name: &OsStr) -> Result<(), String> {
    let b = name.as_bytes();
    if b.is_empty() || b == b"." || b == b".." || b.contains(&b'/') || b.contains(&0) {
        return Err(format!("unsafe name {name:?} in the image; skipped"));
    }
    Ok(())
}

fn cstr(name: &OsStr) -> CString {
    CString::new(name.as_bytes()).unwrap_or_else(|_| CString::new("\u{fffd}").expect("no NUL"))
}

fn open_dir_path(p: &Path) -> anyhow::Result<OwnedFd> {
    let c = cstr(p.as_os_str());
    // SAFETY: c is NUL-terminated.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        bail!("{}: {}", p.display(), std::io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by open.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn is_dir_nofollow(parent: RawFd, c: &CString) -> bool {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: c is NUL-terminated, st is writable.
    let rc = unsafe {
        libc::fstatat(
            parent,
            c.as_ptr(),
            st.as_mut_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    // SAFETY: fstatat filled st when it returned 0.
    rc == 0 && unsafe { st.assume_init() }.st_mode & libc::S_IFMT == libc::S_IFDIR
}

fn unlink_nondir(parent: RawFd, c: &CString) -> anyhow::Result<()> {
    if is_dir_nofollow(parent, c) {
        bail!("exists as a directory; not replacing it with a non-directory");
    }
    // SAFETY: c is NUL-terminated; flag 0 never removes a directory.
    if unsafe { libc::unlinkat(parent, c.as_ptr(), 0) } != 0 {
        bail!("remove existing: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

fn times(a: &Attr) -> [libc::timespec; 2] {
    let t = |t: Timespec| libc::timespec {
        tv_sec: t.sec as libc::time_t,
        tv_nsec: i64::from(t.nsec) as libc::c_long,
    };
    [t(a.atime), t(a.mtime)]
}

fn raise_fd_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: lim is a valid, writable rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 && lim.rlim_cur < lim.rlim_max
    {
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: lim is a valid rlimit; raising the soft limit up to the
        // hard one needs no privilege.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
    }
}

fn geteuid_is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}
