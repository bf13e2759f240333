//! `foliofs extract`: recreate an image's tree (or part of it) in a directory.

use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, bail, Context};
use foliofs_vfs::{Attr, FileSystem, FileType, Ino, Scratch, Timespec};
use indicatif::ProgressBar;
use nix::errno::Errno;
use nix::fcntl::{self, AtFlags, OFlag};
use nix::sys::resource::{self, Resource};
use nix::sys::stat::{self, FchmodatFlags, Mode, SFlag, UtimensatFlags};
use nix::sys::time::TimeSpec;
use nix::unistd::{self, Gid, Uid, UnlinkatFlags};

use crate::inspect::{list, resolve, CHUNK};
use crate::open::ImageArgs;
use crate::progress;

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
    extract(image.fs(), &args.dir, args.path.as_deref(), args.force)
}

/// Recreates `fs`'s tree (or `path` in it) in `dir`, as [`run`] does an
/// image's; `foliofs salvage` too, with a ramfs read back from its state.
pub(crate) fn extract(
    fs: Arc<dyn FileSystem>,
    dir: &Path,
    path: Option<&str>,
    force: bool,
) -> anyhow::Result<i32> {
    let path = path.unwrap_or(".").to_owned();
    let top = resolve(&*fs, &path)?;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    // One descriptor stays open per directory level being filled; allow as
    // many as the hard limit does, so deep trees extract.
    raise_fd_limit();
    let root_fd = open_dir_path(dir)?;
    let mut x = Extractor {
        fs: fs.clone(),
        force,
        root: unistd::geteuid().is_root(),
        set_times: fs.info().fs_type != "romfs",
        dir_shown: dir.to_owned(),
        first_path: HashMap::new(),
        dirs_done: HashSet::new(),
        scratch: Scratch::new(),
        errors: 0,
        bar: progress::counter(entries_done(0)),
        entries: 0,
    };
    if top.kind == FileType::Directory {
        x.tree(root_fd, top)?;
    } else {
        let name = path
            .rsplit('/')
            .find(|c| !c.is_empty())
            .ok_or_else(|| anyhow!("{path}: no file name"))?;
        let name = OsString::from(name);
        x.done_one();
        x.entry(root_fd.as_fd(), &PathBuf::new(), &name, top)?;
    }
    x.bar.finish_and_clear();
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
    /// Bytes written (its position) and entries done, on a terminal.
    bar: ProgressBar,
    entries: u64,
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
        self.say(rel, what);
        self.errors += 1;
    }

    /// One line on stderr, around the progress line rather than into it.
    fn say(&self, rel: &Path, what: impl std::fmt::Display) {
        let shown = self.dir_shown.join(rel);
        self.bar
            .suspend(|| eprintln!("foliofs: {}: {what}", shown.display()));
    }

    /// Counts an entry of the image as done (made, linked or refused).
    fn done_one(&mut self) {
        self.entries += 1;
        self.bar.set_message(entries_done(self.entries));
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
            self.done_one();
            let parent = top.fd.as_fd();
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
                    self.warn(&child_rel, crate::error_line(&e));
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
        if self.root {
            if let Err(e) = unistd::fchown(&d.fd, Some(uid(&d.attr)), Some(gid(&d.attr))) {
                self.warn(&d.rel, format!("chown: {}", io(e)));
            }
        }
        if let Err(e) = stat::fchmod(&d.fd, perm(&d.attr)) {
            self.warn(&d.rel, format!("chmod: {}", io(e)));
        }
        if self.set_times {
            let (atime, mtime) = times(&d.attr);
            if let Err(e) = stat::futimens(&d.fd, &atime, &mtime) {
                self.warn(&d.rel, format!("set times: {}", io(e)));
            }
        }
    }

    /// Creates (or, for an existing real directory, opens) directory `name`
    /// in `parent`, never following a symlink.
    fn make_dir(&mut self, parent: BorrowedFd, name: &OsStr) -> anyhow::Result<(OwnedFd, bool)> {
        let mut created = true;
        if let Err(e) = stat::mkdirat(parent, name, Mode::S_IRWXU) {
            created = false;
            if e != Errno::EEXIST {
                bail!("mkdir: {}", io(e));
            }
            if self.force && !is_dir_nofollow(parent, name) {
                unlink_nondir(parent, name)?;
                stat::mkdirat(parent, name, Mode::S_IRWXU)
                    .map_err(|e| anyhow!("mkdir: {}", io(e)))?;
                created = true;
            }
        }
        // O_NOFOLLOW refuses a symlink in its place.
        let fd = fcntl::openat(
            parent,
            name,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| {
            anyhow!(
                "exists and is not a directory ({}); not descending (use --force to replace it)",
                io(e)
            )
        })?;
        Ok((fd, created))
    }

    /// Extracts one non-directory entry (or, at the top, a directory) into
    /// `parent`. Failures of this entry are counted, not returned.
    fn entry(
        &mut self,
        parent: BorrowedFd,
        rel: &Path,
        name: &OsStr,
        a: Attr,
    ) -> anyhow::Result<()> {
        let shown = rel.join(name);
        if let Err(e) = check_name(name) {
            self.warn(&shown, e);
            return Ok(());
        }
        if a.kind == FileType::Directory {
            let fd = match self.make_dir(parent, name) {
                Ok((fd, _)) => fd,
                Err(e) => {
                    self.warn(&shown, crate::error_line(&e));
                    return Ok(());
                }
            };
            return self.tree(fd, a);
        }
        if let Some(first) = self.first_path.get(&a.ino).cloned() {
            if let Err(e) = self.hard_link(parent, name, &first) {
                self.warn(
                    &shown,
                    format!(
                        "hard link to {}: {}",
                        first.display(),
                        crate::error_line(&e)
                    ),
                );
            }
            return Ok(());
        }
        match self.create(parent, name, &a, &shown) {
            Ok(true) => {
                self.first_path.insert(a.ino, shown);
            }
            Ok(false) => {}
            Err(e) => self.warn(&shown, crate::error_line(&e)),
        }
        Ok(())
    }

    /// Makes room for `name` in `parent`: fails if it exists, unless
    /// `--force` and it is not a directory.
    fn clear(&self, parent: BorrowedFd, name: &OsStr) -> anyhow::Result<()> {
        if stat::fstatat(parent, name, AtFlags::AT_SYMLINK_NOFOLLOW).is_err() {
            return Ok(());
        }
        if !self.force {
            bail!("already exists; not overwriting (use --force)");
        }
        unlink_nondir(parent, name)
    }

    /// Creates a non-directory; returns whether something was created.
    fn create(
        &mut self,
        parent: BorrowedFd,
        name: &OsStr,
        a: &Attr,
        shown: &Path,
    ) -> anyhow::Result<bool> {
        self.clear(parent, name)?;
        match a.kind {
            FileType::RegularFile => {
                // O_EXCL|O_NOFOLLOW never opens something that is already
                // there.
                let fd = fcntl::openat(
                    parent,
                    name,
                    OFlag::O_WRONLY
                        | OFlag::O_CREAT
                        | OFlag::O_EXCL
                        | OFlag::O_NOFOLLOW
                        | OFlag::O_CLOEXEC,
                    Mode::S_IRUSR | Mode::S_IWUSR,
                )
                .map_err(|e| anyhow!("create: {}", io(e)))?;
                let file = std::fs::File::from(fd);
                self.write_data(&file, a, shown)?;
                self.set_attrs(Some(file.as_fd()), parent, name, a)?;
            }
            FileType::Symlink => {
                let target = self.fs.readlink(a.ino)?;
                if target.contains(&0) {
                    bail!("symlink target contains a NUL byte");
                }
                unistd::symlinkat(&target[..], parent, name)
                    .map_err(|e| anyhow!("symlink: {}", io(e)))?;
                self.set_attrs(None, parent, name, a)?;
            }
            FileType::BlockDevice | FileType::CharDevice if !self.root => {
                self.say(shown, "device node skipped (needs root)");
                return Ok(false);
            }
            FileType::BlockDevice | FileType::CharDevice | FileType::Fifo | FileType::Socket => {
                let kind = SFlag::from_bits_truncate(a.kind.mode_bits());
                stat::mknodat(parent, name, kind, perm(a), a.rdev.to_dev_t())
                    .map_err(|e| anyhow!("mknod: {}", io(e)))?;
                self.set_attrs(None, parent, name, a)?;
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
            self.bar.inc(data.len() as u64);
        }
        if off != a.size {
            bail!("read {off} bytes of {}", a.size);
        }
        Ok(())
    }

    /// Owner (when root), mode (not for symlinks) and times.
    fn set_attrs(
        &self,
        fd: Option<BorrowedFd>,
        parent: BorrowedFd,
        name: &OsStr,
        a: &Attr,
    ) -> anyhow::Result<()> {
        if self.root {
            // AT_SYMLINK_NOFOLLOW changes the link itself.
            unistd::fchownat(
                parent,
                name,
                Some(uid(a)),
                Some(gid(a)),
                AtFlags::AT_SYMLINK_NOFOLLOW,
            )
            .map_err(|e| anyhow!("chown: {}", io(e)))?;
        }
        if let Some(fd) = fd {
            stat::fchmod(fd, perm(a)).map_err(|e| anyhow!("chmod: {}", io(e)))?;
        } else if a.kind != FileType::Symlink {
            // The node was just made by us and is not a symlink, so
            // following symlinks does not come into it.
            stat::fchmodat(parent, name, perm(a), FchmodatFlags::FollowSymlink)
                .map_err(|e| anyhow!("chmod: {}", io(e)))?;
        }
        if self.set_times {
            let (atime, mtime) = times(a);
            stat::utimensat(
                parent,
                name,
                &atime,
                &mtime,
                UtimensatFlags::NoFollowSymlink,
            )
            .map_err(|e| anyhow!("set times: {}", io(e)))?;
        }
        Ok(())
    }

    /// Links `name` in `parent` to the already extracted `first` (relative
    /// to DIR), walking `first` one component at a time with `O_NOFOLLOW`.
    fn hard_link(&mut self, parent: BorrowedFd, name: &OsStr, first: &Path) -> anyhow::Result<()> {
        self.clear(parent, name)?;
        let dir = first.parent().unwrap_or(Path::new(""));
        let leaf = first.file_name().ok_or_else(|| anyhow!("no file name"))?;
        let mut cur = open_dir_path(&self.dir_shown)?;
        for comp in dir.components() {
            cur = fcntl::openat(
                &cur,
                comp.as_os_str(),
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| anyhow!("{}", io(e)))?;
        }
        // No AT_SYMLINK_FOLLOW: a symlink at the source is linked itself,
        // never followed.
        unistd::linkat(&cur, leaf, parent, name, AtFlags::empty())
            .map_err(|e| anyhow!("{}", io(e)))?;
        Ok(())
    }
}

fn entries_done(n: u64) -> String {
    match n {
        1 => "1 entry".to_owned(),
        n => format!("{n} entries"),
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

/// An errno as the standard library shows it ("File exists (os error 17)").
fn io(e: Errno) -> std::io::Error {
    e.into()
}

fn open_dir_path(p: &Path) -> anyhow::Result<OwnedFd> {
    fcntl::open(
        p,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| anyhow!("{}: {}", p.display(), io(e)))
}

fn is_dir_nofollow(parent: BorrowedFd, name: &OsStr) -> bool {
    stat::fstatat(parent, name, AtFlags::AT_SYMLINK_NOFOLLOW)
        .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR)
}

fn unlink_nondir(parent: BorrowedFd, name: &OsStr) -> anyhow::Result<()> {
    if is_dir_nofollow(parent, name) {
        bail!("exists as a directory; not replacing it with a non-directory");
    }
    // NoRemoveDir never removes a directory.
    unistd::unlinkat(parent, name, UnlinkatFlags::NoRemoveDir)
        .map_err(|e| anyhow!("remove existing: {}", io(e)))
}

fn perm(a: &Attr) -> Mode {
    Mode::from_bits_truncate(u32::from(a.perm))
}

fn uid(a: &Attr) -> Uid {
    Uid::from_raw(a.uid)
}

fn gid(a: &Attr) -> Gid {
    Gid::from_raw(a.gid)
}

/// Access and modification times.
fn times(a: &Attr) -> (TimeSpec, TimeSpec) {
    let t = |t: Timespec| TimeSpec::new(t.sec, i64::from(t.nsec));
    (t(a.atime), t(a.mtime))
}

fn raise_fd_limit() {
    if let Ok((cur, max)) = resource::getrlimit(Resource::RLIMIT_NOFILE) {
        if cur < max {
            // Raising the soft limit up to the hard one needs no privilege.
            let _ = resource::setrlimit(Resource::RLIMIT_NOFILE, max, max);
        }
    }
}
