//! Helpers shared by the integration tests: what a test needs from the
//! machine (and the skip note when it is missing), running the binary with
//! bounded waits, a mount guard that always unmounts, tree fixtures and
//! walks, and the kernel-romfs oracle.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

pub mod oracle;

/// The `foliofs` binary under test.
pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_foliofs"))
}

/// The workspace's top directory.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// The path, without the crate's name, of the function that declared the
/// item whose type name is `type_name` (how the macros below name a test).
pub fn fn_path(type_name: &str) -> &str {
    let path = type_name.strip_suffix("::here").unwrap_or(type_name);
    path.split_once("::").map_or(path, |(_, rest)| rest)
}

/// Why this machine cannot give a test everything in `needs`, if it
/// cannot. A need is one of
/// - `root`;
/// - `fuse`: `/dev/fuse`, and root (to mount as root; `user-fuse` is a
///   user's);
/// - `kernel-erofs`: the kernel's EROFS driver with file-backed mounts;
/// - `huge-pages`: 2 MiB transparent huge pages for ramfs blocks;
/// - `romfs-vm`: what the romfs oracle's VM runs with;
/// - `user-fuse`: mounting as the user [`TEST_USER`]: root (to become
///   them), the user, `/dev/fuse` open to everyone, `fusermount3` and
///   `setpriv`;
/// - else a program on PATH (or in ~/.cargo/bin).
pub fn missing(needs: &[&str]) -> Option<String> {
    needs.iter().find_map(|n| lacks(n))
}

fn lacks(need: &str) -> Option<String> {
    match need {
        "root" => (!is_root()).then(|| "root".to_owned()),
        "fuse" if !Path::new("/dev/fuse").exists() => Some("/dev/fuse".to_owned()),
        "fuse" => (!is_root()).then(|| "root (the test mounts as root)".to_owned()),
        "kernel-erofs" => kernel_erofs_missing(),
        "huge-pages" => huge_unusable().map(|why| format!("2 MiB transparent huge pages: {why}")),
        "user-fuse" => user_fuse_missing(),
        // Installed is not enough: a container may refuse ptrace.
        "strace" => lacks_program("strace").or_else(|| {
            let probe = try_run_timeout(
                Command::new("strace").args(["-f", "-qq", "-o", "/dev/null", "true"]),
                Duration::from_secs(10),
            );
            (!probe.is_ok_and(|o| o.status.success()))
                .then(|| "strace able to trace (ptrace is refused here)".to_owned())
        }),
        "romfs-vm" => oracle::NEEDS
            .iter()
            .find(|p| find_program(p).is_none())
            .map(|p| format!("{p} for the romfs oracle's VM (`bash scripts/setup` installs it)")),
        program => find_program(program)
            .is_none()
            .then(|| format!("{program} (`bash scripts/setup` installs it)")),
    }
}

/// The user the tests mount as (`bash scripts/setup` adds it).
pub const TEST_USER: &str = "tests";

fn user_fuse_missing() -> Option<String> {
    if !is_root() {
        return Some(format!("root (to run commands as user `{TEST_USER}`)"));
    }
    if user_ids(TEST_USER).is_none() {
        return Some(format!(
            "a user `{TEST_USER}` (`bash scripts/setup` adds it)"
        ));
    }
    match fs::metadata("/dev/fuse") {
        Err(_) => return Some("/dev/fuse".to_owned()),
        Ok(m) if m.permissions().mode() & 0o666 != 0o666 => {
            return Some(format!(
                "/dev/fuse mode 0666 for users (it is {:04o}; `bash scripts/setup` sets it)",
                m.permissions().mode() & 0o7777
            ))
        }
        Ok(_) => {}
    }
    ["fusermount3", "setpriv"]
        .into_iter()
        .find_map(lacks_program)
}

fn lacks_program(program: &str) -> Option<String> {
    find_program(program)
        .is_none()
        .then(|| format!("{program} (`bash scripts/setup` installs it)"))
}

/// A user's (uid, gid), if the system knows the name.
pub fn user_ids(user: &str) -> Option<(u32, u32)> {
    let u = nix::unistd::User::from_name(user).ok()??;
    Some((u.uid.as_raw(), u.gid.as_raw()))
}

/// `PROG` to be run as `user` (its uid, primary group and groups) with a
/// fresh environment, the way a login would set it (`setpriv --reset-env`:
/// no `XDG_RUNTIME_DIR`, `HOME` from the password file).
pub fn user_command(user: &str, prog: impl AsRef<OsStr>) -> Command {
    let (uid, gid) = user_ids(user).unwrap_or_else(|| panic!("no user {user}"));
    let mut c = Command::new("setpriv");
    c.arg(format!("--reuid={uid}"))
        .arg(format!("--regid={gid}"))
        .args(["--init-groups", "--reset-env", "--"])
        .arg(prog)
        .current_dir("/");
    c
}

/// Runs `PROG ARGS` as `user` (see [`user_command`]), killed after
/// `timeout`.
pub fn as_user<I, S>(user: &str, prog: impl AsRef<OsStr>, args: I, timeout: Duration) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    run_timeout(user_command(user, prog).args(args), timeout)
}

/// `sh -c SCRIPT sh ARGS...` as `user`, bounded by 120 s.
pub fn sh_as_user<S: AsRef<OsStr>>(user: &str, script: &str, args: &[S]) -> Output {
    as_user(
        user,
        "/bin/sh",
        [OsStr::new("-c"), OsStr::new(script), OsStr::new("sh")]
            .into_iter()
            .chain(args.iter().map(|a| a.as_ref())),
        Duration::from_secs(120),
    )
}

/// A new empty directory in the temporary directory, owned by `user`.
pub fn user_tempdir(user: &str) -> tempfile::TempDir {
    let (uid, gid) = user_ids(user).unwrap_or_else(|| panic!("no user {user}"));
    let tmp = tempfile::Builder::new()
        .prefix("foliofs-user.")
        .tempdir()
        .unwrap();
    std::os::unix::fs::chown(tmp.path(), Some(uid), Some(gid)).unwrap();
    tmp
}

/// Makes `dir` (a test's temporary directory) readable and searchable by
/// everyone, so a user can reach the fixtures in it.
pub fn open_to_all(dir: &Path) {
    fs::set_permissions(dir, fs::Permissions::from_mode(0o755)).unwrap();
}

/// What a tree holds, as `user` (or this process, for `None`) sees it with
/// the system's own tools: every path with its type, each regular file's
/// SHA-256, each symlink's target and each device's numbers. Two trees
/// with the same listing hold the same things.
pub fn listing(user: Option<&str>, dir: &Path) -> String {
    const SCRIPT: &str = r#"cd "$1" || exit 1
export LC_ALL=C
find . -printf '%y %P
' | sort
find . -type f -print0 | sort -z | xargs -0r sha256sum
find . -type l -printf '%P -> %l
' | sort
find . \( -type c -o -type b \) -exec stat -c '%n %t:%T' {} + | sort"#;
    let out = match user {
        Some(u) => sh_as_user(u, SCRIPT, &[dir]),
        None => run_timeout(
            Command::new("/bin/sh").args(["-c", SCRIPT, "sh"]).arg(dir),
            Duration::from_secs(120),
        ),
    };
    assert!(
        out.status.success(),
        "listing {} as {user:?}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Tests that change /etc/fuse.conf take this first, through [`FuseConf`].
static FUSE_CONF_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// /etc/fuse.conf set to a test's text, put back as it was when dropped
/// (also when the test panics); one test at a time holds it.
pub struct FuseConf {
    before: Option<Vec<u8>>,
    _lock: std::sync::MutexGuard<'static, ()>,
}

impl FuseConf {
    pub fn set(text: &str) -> FuseConf {
        let lock = FUSE_CONF_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let g = FuseConf {
            before: fs::read("/etc/fuse.conf").ok(),
            _lock: lock,
        };
        fs::write("/etc/fuse.conf", text).unwrap();
        g
    }
}

impl Drop for FuseConf {
    fn drop(&mut self) {
        match &self.before {
            Some(b) => {
                let _ = fs::write("/etc/fuse.conf", b);
            }
            None => {
                let _ = fs::remove_file("/etc/fuse.conf");
            }
        }
    }
}

/// Whether this process has root's user id.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn kernel_erofs_missing() -> Option<String> {
    let listed = || {
        fs::read_to_string("/proc/filesystems").is_ok_and(|t| {
            t.lines()
                .any(|l| l.split_whitespace().last() == Some("erofs"))
        })
    };
    if !listed() {
        let _ = Command::new("modprobe")
            .args(["-q", "erofs"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    if !listed() {
        return Some("the kernel's EROFS driver".to_owned());
    }
    // Mounting an image file itself, without a loop device, came in 6.12.
    let release = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut v = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let version = (v.next().unwrap_or(0), v.next().unwrap_or(0));
    (version < (6, 12)).then(|| {
        format!(
            "Linux 6.12 or later for file-backed EROFS mounts (this is {})",
            release.trim()
        )
    })
}

/// True when the machine has everything in `needs`; otherwise prints
/// `skip: WHAT: needs ...` to stderr and returns false. Written to the
/// process's stderr itself, past the test harness's capture, so a passing
/// run still says what it did not test.
pub fn have(what: &str, needs: &[&str]) -> bool {
    match missing(needs) {
        Some(why) => {
            let _ = writeln!(std::io::stderr().lock(), "skip: {what}: needs {why}");
            false
        }
        None => true,
    }
}

/// Whether the machine has every need listed (see [`missing`]); when not,
/// prints one `skip:` line naming the calling function and the need.
#[macro_export]
macro_rules! have {
    ($($need:expr),+ $(,)?) => {{
        fn here() {}
        $crate::common::have(
            $crate::common::fn_path(std::any::type_name_of_val(&here)),
            &[$($need),+],
        )
    }};
}

/// Returns from the test, with one `skip:` line on stderr, unless the
/// machine has every need listed (see [`missing`]).
#[macro_export]
macro_rules! require {
    ($($need:expr),+ $(,)?) => {
        if !$crate::have!($($need),+) {
            return;
        }
    };
}

/// Runs `cmd` to completion, killing it after `timeout`; panics if it
/// cannot start or does not finish in time.
pub fn run_timeout(cmd: &mut Command, timeout: Duration) -> Output {
    try_run_timeout(cmd, timeout).unwrap_or_else(|e| panic!("{e}"))
}

/// Like [`run_timeout`], but says why in an `Err` instead of panicking, for
/// callers that turn a failure into a skip or clean up first.
pub fn try_run_timeout(cmd: &mut Command, timeout: Duration) -> Result<Output, String> {
    let desc = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start {desc}: {e}"))?;
    // Drain pipes on threads so a chatty child cannot block on a full pipe.
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let to = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = out.read_to_end(&mut v);
        v
    });
    let te = std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = err.read_to_end(&mut v);
        v
    });
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child
            .try_wait()
            .map_err(|e| format!("waiting for {desc}: {e}"))?
        {
            break s;
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{desc} did not finish within {timeout:?}"));
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Ok(Output {
        status,
        stdout: to.join().unwrap(),
        stderr: te.join().unwrap(),
    })
}

/// Runs `foliofs ARGS` with a 120 s bound.
pub fn foliofs<I, S>(args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    run_timeout(Command::new(bin()).args(args), Duration::from_secs(120))
}

/// Like [`foliofs`], but panics with its stderr unless it exits 0; returns stdout.
pub fn foliofs_ok<I, S>(args: I) -> Vec<u8>
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let args: Vec<_> = args.into_iter().map(|a| a.as_ref().to_owned()).collect();
    let out = foliofs(&args);
    assert!(
        out.status.success(),
        "foliofs {:?} failed ({}): {}",
        args,
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

/// Mount points listed in /proc/self/mountinfo, unescaped (read by the
/// library's own parser).
pub fn mount_points() -> Vec<PathBuf> {
    foliofs_fuse::mount_table()
        .unwrap_or_default()
        .into_iter()
        .map(|m| m.mountpoint)
        .collect()
}

/// True if `dir` is a mount point now.
pub fn is_mounted(dir: &Path) -> bool {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_owned());
    mount_points().iter().any(|p| p == &dir)
}

/// The environment variable that runs every mount of the tests over a
/// transport by name: `io_uring` (the second pass of `scripts/test`, with
/// `enable_uring` on) or `dev`. A mount that cannot have it fails, so the
/// pass cannot quietly fall back.
pub const TRANSPORT_ENV: &str = "FOLIOFS_TEST_TRANSPORT";

/// `opts` with the transport [`TRANSPORT_ENV`] names, unless they name
/// one themselves.
pub fn with_transport(opts: &str) -> String {
    let named = opts
        .split(',')
        .any(|o| o == "io_uring" || o == "noio_uring");
    let wanted = match std::env::var(TRANSPORT_ENV).as_deref() {
        Ok("io_uring") => Some("io_uring"),
        Ok("dev") => Some("noio_uring"),
        _ => None,
    };
    match wanted {
        Some(w) if !named => [opts, w]
            .iter()
            .filter(|s| !s.is_empty())
            .copied()
            .collect::<Vec<_>>()
            .join(","),
        _ => opts.to_owned(),
    }
}

/// A live foliofs mount that is unmounted when dropped, even if the test
/// panicked.
pub struct Mount {
    dir: PathBuf,
    /// The user who mounted it (and unmounts it); `None` for this process.
    user: Option<String>,
    _tmp: Option<tempfile::TempDir>,
}

impl Mount {
    /// `foliofs mount [-t TYPE] [-o OPTS] SOURCE <new temp dir>`; returns once
    /// the command returned and the mount is live, or the command's stderr.
    pub fn new(source: &Path, fstype: Option<&str>, opts: &str) -> Result<Mount, String> {
        let tmp = tempfile::Builder::new()
            .prefix("foliofs-mnt.")
            .tempdir()
            .unwrap();
        let dir = tmp.path().to_owned();
        let mut m = Self::at(source, &dir, fstype, opts)?;
        m._tmp = Some(tmp);
        Ok(m)
    }

    /// As [`Mount::new`], run as `user` on a new directory of theirs;
    /// dropping it unmounts as that user (then as root, as a last resort).
    pub fn as_user(
        user: &str,
        source: &Path,
        fstype: Option<&str>,
        opts: &str,
    ) -> Result<Mount, String> {
        let tmp = user_tempdir(user);
        let dir = tmp.path().to_owned();
        let mut m = Self::at_as(Some(user), source, &dir, fstype, opts)?;
        m._tmp = Some(tmp);
        Ok(m)
    }

    /// As [`Mount::new`], on an existing directory.
    pub fn at(
        source: &Path,
        dir: &Path,
        fstype: Option<&str>,
        opts: &str,
    ) -> Result<Mount, String> {
        Self::at_as(None, source, dir, fstype, opts)
    }

    /// As [`Mount::at`], run as `user` where given.
    pub fn at_as(
        user: Option<&str>,
        source: &Path,
        dir: &Path,
        fstype: Option<&str>,
        opts: &str,
    ) -> Result<Mount, String> {
        let mut cmd = match user {
            Some(u) => user_command(u, bin()),
            None => Command::new(bin()),
        };
        cmd.arg("mount");
        if let Some(t) = fstype {
            cmd.args(["-t", t]);
        }
        let opts = with_transport(opts);
        if !opts.is_empty() {
            cmd.args(["-o", &opts]);
        }
        cmd.arg(source).arg(dir);
        Self::by_command(user, &mut cmd, dir)
    }

    /// Runs `cmd`, a `foliofs mount` (or a wrapper of it) of `dir` as
    /// `user` where given (who unmounts it again), and takes the mount if
    /// it is live; otherwise its stderr, never leaving a mount behind.
    pub fn by_command(user: Option<&str>, cmd: &mut Command, dir: &Path) -> Result<Mount, String> {
        Self::by_command_output(user, cmd, dir).map(|(m, _)| m)
    }

    /// As [`Mount::by_command`], with what the command printed.
    pub fn by_command_output(
        user: Option<&str>,
        cmd: &mut Command,
        dir: &Path,
    ) -> Result<(Mount, Output), String> {
        let out = run_timeout(cmd, Duration::from_secs(60));
        if !out.status.success() {
            if is_mounted(dir) {
                // Never leave a mount behind, whatever the command said.
                force_unmount(dir);
                return Err(format!(
                    "mount failed but left {} mounted: {}",
                    dir.display(),
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        if !is_mounted(dir) {
            return Err(format!(
                "foliofs mount returned success but {} is not a mount point",
                dir.display()
            ));
        }
        let m = Mount {
            dir: dir.to_owned(),
            user: user.map(ToOwned::to_owned),
            _tmp: None,
        };
        Ok((m, out))
    }

    /// Keeps `tmp` (the mount point's directory) until the mount is gone.
    pub fn keeping(mut self, tmp: tempfile::TempDir) -> Mount {
        self._tmp = Some(tmp);
        self
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Unmounts now with `foliofs umount` (as the user who mounted),
    /// reporting failure.
    pub fn unmount(mut self) -> Result<(), String> {
        let r = unmount_with_foliofs(&self.dir, self.user.as_deref());
        force_unmount(&self.dir);
        self.dir = PathBuf::new();
        r
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if self.dir.as_os_str().is_empty() {
            return;
        }
        let _ = unmount_with_foliofs(&self.dir, self.user.as_deref());
        force_unmount(&self.dir);
    }
}

fn unmount_with_foliofs(dir: &Path, user: Option<&str>) -> Result<(), String> {
    if !is_mounted(dir) {
        return Ok(());
    }
    let mut cmd = match user {
        Some(u) => user_command(u, bin()),
        None => Command::new(bin()),
    };
    let out = run_timeout(cmd.arg("umount").arg(dir), Duration::from_secs(30));
    if out.status.success() && !is_mounted(dir) {
        Ok(())
    } else {
        Err(format!(
            "foliofs umount {}: {} {}",
            dir.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Last resort: lazy unmounts, bounded in time, until `dir` is no mount point.
pub fn force_unmount(dir: &Path) {
    for attempt in 0..3 {
        if !is_mounted(dir) {
            return;
        }
        let (prog, args): (&str, &[&str]) = if attempt == 0 {
            ("fusermount3", &["-u", "-z"])
        } else {
            ("umount", &["-l"])
        };
        let _ = Command::new(prog)
            .args(args)
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// Tests that count on the kernel keeping what was put in its caches
/// (pages pushed by a server) hold this shared; whatever drops the caches
/// of the whole machine holds it alone, so one test's drop cannot empty
/// another's pages halfway through.
static PAGE_CACHE: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// Shared hold on the kernel's caches (see [`PAGE_CACHE`]).
pub fn keeping_caches() -> std::sync::RwLockReadGuard<'static, ()> {
    PAGE_CACHE.read().unwrap_or_else(|e| e.into_inner())
}

/// Sole hold on the kernel's caches, for a test whose child drops them
/// (the bench); it must not call [`drop_caches`] while holding it.
pub fn dropping_caches() -> std::sync::RwLockWriteGuard<'static, ()> {
    PAGE_CACHE.write().unwrap_or_else(|e| e.into_inner())
}

/// Drops the page cache (root only); returns false when it could not.
pub fn drop_caches() -> bool {
    let _ = Command::new("sync").status();
    let _alone = dropping_caches();
    fs::write("/proc/sys/vm/drop_caches", "3\n").is_ok()
}

pub use foliofs_testkit::data::{random_bytes, rng};
pub use foliofs_testkit::find_program;

/// Writes a file of `size` pseudo-random bytes (seeded), streaming, so large
/// files cost no memory.
pub fn write_random_file(path: &Path, size: u64, seed: u64) {
    foliofs_testkit::data::random_file(path, size, seed).unwrap();
}

/// Makes a device node, fifo or socket with `mknod(2)` (needs root for devices).
pub fn mknod(path: &Path, mode: u32, major: u32, minor: u32) -> std::io::Result<()> {
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: `c` is a valid NUL-terminated path for the duration of the call.
    let rc = unsafe { libc::mknod(c.as_ptr(), mode, libc::makedev(major, minor)) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// A tree holding every entry type romfs and EROFS can store: regular files
/// of awkward sizes (empty, around 16 bytes and block boundaries), nested and
/// empty directories, symlinks (relative, absolute, dangling), a hard link,
/// block and char devices, a fifo, a socket, exec bits, odd and 127-byte names.
pub fn every_type_tree(dir: &Path) {
    let mut rng = rng(42);
    fs::create_dir_all(dir).unwrap();
    for (name, size) in [
        ("empty", 0u64),
        ("one", 1),
        ("fifteen", 15),
        ("sixteen", 16),
        ("seventeen", 17),
        ("k1023", 1023),
        ("k1024", 1024),
        ("k1025", 1025),
        ("p4095", 4095),
        ("p4096", 4096),
        ("p4097", 4097),
        ("big", 3 * 1024 * 1024 + 77),
    ] {
        fs::write(dir.join(name), random_bytes(&mut rng, size as usize)).unwrap();
    }
    let exe = dir.join("run.sh");
    fs::write(&exe, b"#!/bin/sh\necho hi\n").unwrap();
    fs::set_permissions(&exe, fs::Permissions::from_mode(0o755)).unwrap();
    fs::create_dir_all(dir.join("empty-dir")).unwrap();
    let mut deep = dir.join("deep");
    for i in 0..12 {
        deep = deep.join(format!("level{i}"));
    }
    fs::create_dir_all(&deep).unwrap();
    fs::write(deep.join("bottom.txt"), b"the bottom\n").unwrap();
    let long = "L".repeat(120) + "-name12";
    assert_eq!(long.len(), 127);
    fs::write(dir.join(&long), b"long name\n").unwrap();
    fs::write(dir.join("sp ace & 'quote' \u{e9}t\u{e9}"), b"odd\n").unwrap();
    fs::write(dir.join(".hidden"), b"dot file\n").unwrap();
    std::os::unix::fs::symlink("one", dir.join("link-rel")).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", dir.join("link-abs")).unwrap();
    std::os::unix::fs::symlink("no/such/target", dir.join("link-dangling")).unwrap();
    std::os::unix::fs::symlink("deep/level0", dir.join("link-dir")).unwrap();
    fs::hard_link(dir.join("k1025"), dir.join("hardlink-to-k1025")).unwrap();
    fs::create_dir_all(dir.join("dev")).unwrap();
    mknod(&dir.join("dev/null"), libc::S_IFCHR | 0o666, 1, 3).unwrap();
    mknod(&dir.join("dev/sda1"), libc::S_IFBLK | 0o660, 8, 1).unwrap();
    mknod(&dir.join("dev/fifo"), libc::S_IFIFO | 0o644, 0, 0).unwrap();
    let sock = dir.join("dev/socket");
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    assert!(fs::symlink_metadata(&sock).unwrap().file_type().is_socket());
}

/// One entry of a walked tree.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub kind: &'static str,
    /// Full st_mode.
    pub mode: u32,
    pub ino: u64,
    pub nlink: u64,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    /// sha256 of a regular file's content.
    pub sha256: Option<String>,
    pub target: Option<Vec<u8>>,
    pub rdev: Option<(u32, u32)>,
}

/// Walks `root` without following symlinks; keys are paths relative to
/// `root` ("" is the root itself).
pub fn walk(root: &Path) -> BTreeMap<PathBuf, Entry> {
    let mut out = BTreeMap::new();
    walk_into(root, Path::new(""), &mut out);
    out
}

fn walk_into(root: &Path, rel: &Path, out: &mut BTreeMap<PathBuf, Entry>) {
    let path = root.join(rel);
    let md =
        fs::symlink_metadata(&path).unwrap_or_else(|e| panic!("lstat {}: {e}", path.display()));
    let ft = md.file_type();
    let kind =
        foliofs_vfs::FileType::from_std(ft).map_or("unknown", foliofs_vfs::FileType::short_name);
    let mut e = Entry {
        kind,
        mode: md.mode(),
        ino: md.ino(),
        nlink: md.nlink(),
        uid: md.uid(),
        gid: md.gid(),
        size: md.size(),
        sha256: None,
        target: None,
        rdev: None,
    };
    if ft.is_file() {
        let mut h = Sha256::new();
        let mut f =
            fs::File::open(&path).unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = f
                .read(&mut buf)
                .unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
        }
        e.sha256 = Some(format!("{:x}", h.finalize()));
    } else if ft.is_symlink() {
        e.target = Some(
            fs::read_link(&path)
                .unwrap()
                .into_os_string()
                .into_vec_bytes(),
        );
    } else if ft.is_char_device() || ft.is_block_device() {
        e.rdev = Some((libc::major(md.rdev()), libc::minor(md.rdev())));
    }
    out.insert(rel.to_owned(), e);
    if ft.is_dir() {
        let mut names: Vec<_> = fs::read_dir(&path)
            .unwrap_or_else(|e| panic!("readdir {}: {e}", path.display()))
            .map(|d| d.unwrap().file_name())
            .collect();
        names.sort();
        for n in names {
            walk_into(root, &rel.join(n), out);
        }
    }
}

trait IntoVecBytes {
    fn into_vec_bytes(self) -> Vec<u8>;
}

impl IntoVecBytes for std::ffi::OsString {
    fn into_vec_bytes(self) -> Vec<u8> {
        use std::os::unix::ffi::OsStringExt;
        self.into_vec()
    }
}

/// Which fields [`assert_same_tree`] compares besides path and type.
#[derive(Clone, Copy, Debug, Default)]
pub struct Fields {
    /// Permission bits (st_mode & 0o7777).
    pub perm: bool,
    /// Only the owner-exec bit (romfs keeps nothing else).
    pub exec: bool,
    pub owner: bool,
    pub nlink: bool,
    pub ino: bool,
}

/// Asserts two walks hold the same paths with the same type, size, content,
/// symlink target and rdev (and the `fields` asked for); lists every difference.
pub fn assert_same_tree(
    expected: &BTreeMap<PathBuf, Entry>,
    actual: &BTreeMap<PathBuf, Entry>,
    fields: Fields,
) {
    let mut diffs = Vec::new();
    for (p, e) in expected {
        let Some(a) = actual.get(p) else {
            diffs.push(format!("missing: {}", p.display()));
            continue;
        };
        let mut d = Vec::new();
        if e.kind != a.kind {
            d.push(format!("type {} != {}", e.kind, a.kind));
        }
        if (e.kind == "reg" || e.kind == "lnk") && e.size != a.size {
            d.push(format!("size {} != {}", e.size, a.size));
        }
        if e.sha256 != a.sha256 {
            d.push("content differs".into());
        }
        if e.target != a.target {
            d.push(format!("target {:?} != {:?}", e.target, a.target));
        }
        if e.rdev != a.rdev {
            d.push(format!("rdev {:?} != {:?}", e.rdev, a.rdev));
        }
        if fields.perm && e.mode & 0o7777 != a.mode & 0o7777 {
            d.push(format!("mode {:o} != {:o}", e.mode, a.mode));
        }
        if fields.exec && e.kind == "reg" && e.mode & 0o100 != a.mode & 0o100 {
            d.push(format!("exec bit {:o} != {:o}", e.mode, a.mode));
        }
        if fields.owner && (e.uid, e.gid) != (a.uid, a.gid) {
            d.push(format!("owner {}:{} != {}:{}", e.uid, e.gid, a.uid, a.gid));
        }
        if fields.nlink && e.nlink != a.nlink {
            d.push(format!("nlink {} != {}", e.nlink, a.nlink));
        }
        if fields.ino && e.ino != a.ino {
            d.push(format!("ino {} != {}", e.ino, a.ino));
        }
        if !d.is_empty() {
            diffs.push(format!("{}: {}", p.display(), d.join(", ")));
        }
    }
    for p in actual.keys() {
        if !expected.contains_key(p) {
            diffs.push(format!("unexpected: {}", p.display()));
        }
    }
    assert!(
        diffs.is_empty(),
        "{} difference(s):\n{}",
        diffs.len(),
        diffs.join("\n")
    );
}

/// The mount at `dir`'s line of `foliofs mounts` run by `user` (this
/// process where `None`).
pub fn mounts_line_of(user: Option<&str>, dir: &Path) -> String {
    let out = match user {
        Some(u) => as_user(u, bin(), ["mounts"], Duration::from_secs(30)),
        None => foliofs(["mounts"]),
    };
    let list = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "foliofs mounts failed ({}):\n{list}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_owned());
    let dir = dir.to_str().unwrap();
    list.lines()
        .find(|l| l.split(' ').nth(1) == Some(dir))
        .unwrap_or_else(|| panic!("{dir} is not in foliofs mounts:\n{list}"))
        .to_owned()
}

fn pid_field(line: &str, key: &str) -> Option<u32> {
    line.split([' ', ','])
        .find_map(|o| o.strip_prefix(key)?.strip_prefix('='))
        .and_then(|p| p.trim().parse().ok())
}

/// The pid of the mount at `dir`'s process (`pid=`): its server, or the
/// supervisor that holds its connection, whose signals unmount.
pub fn mount_pid(user: Option<&str>, dir: &Path) -> u32 {
    let line = mounts_line_of(user, dir);
    pid_field(&line, "pid").unwrap_or_else(|| panic!("no pid in {line}"))
}

/// The pid of the process serving the mount at `dir` (`server=` under a
/// supervisor, else `pid=`), as `foliofs mounts` run by `user` (this
/// process where `None`) lists it.
pub fn server_pid(user: Option<&str>, dir: &Path) -> u32 {
    let line = mounts_line_of(user, dir);
    pid_field(&line, "server")
        .or_else(|| pid_field(&line, "pid"))
        .unwrap_or_else(|| panic!("no pid in {line}"))
}

/// Waits until `cond` holds, up to `timeout`; returns whether it did.
pub fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    cond()
}

/// Builds the romfs image `img` of the tree `src` with the project's own
/// builder and its defaults (no outside tool needed).
pub fn build_romfs(src: &Path, img: &Path) {
    foliofs_romfs::mkfs::build(
        src,
        img,
        &foliofs_romfs::mkfs::MkfsOptions::default(),
        &mut |_| {},
    )
    .unwrap_or_else(|e| panic!("building {}: {e}", img.display()));
}

/// A romfs image `f.romfs` in `dir` of a tree `src` holding one file, `f`:
/// for tests about a mount rather than its contents.
pub fn one_file_romfs(dir: &Path) -> PathBuf {
    let src = dir.join("src");
    fs::create_dir(&src).unwrap();
    fs::write(src.join("f"), b"hi\n").unwrap();
    let img = dir.join("f.romfs");
    build_romfs(&src, &img);
    img
}

/// Builds `img` from `src` with `mkfs.erofs --quiet ARGS` (bounded),
/// panicking with its stderr if it fails.
pub fn mkfs_erofs<S: AsRef<OsStr>>(args: &[S], img: &Path, src: &Path) {
    let out = run_timeout(
        Command::new("mkfs.erofs")
            .arg("--quiet")
            .args(args)
            .arg(img)
            .arg(src),
        Duration::from_secs(600),
    );
    assert!(
        out.status.success(),
        "mkfs.erofs {:?}: {}",
        args.iter().map(|a| a.as_ref()).collect::<Vec<_>>(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A tool installed with `cargo install` (pjdfstest, fsx); the test has
/// `require!`d it.
pub fn cargo_tool(name: &str) -> PathBuf {
    find_program(name).unwrap_or_else(|| panic!("{name} is not installed"))
}

/// Why a ramfs `blocksize=2M,huge=always` mount cannot be had on this
/// machine, if it cannot (the mount's own check).
pub fn huge_unusable() -> Option<String> {
    let mut o = foliofs_ramfs::Options::default();
    o.set("blocksize", Some("2M")).unwrap();
    o.set("huge", Some("always")).unwrap();
    o.check().err()
}
