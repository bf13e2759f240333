//! After `scripts/install`, mount(8) mounts foliofs images as a system does:
//! `mount -T FSTAB MOUNTPOINT` and `mount -t fuse.foliofs` reach `foliofs`
//! through /sbin/mount.fuse.foliofs and mount.fuse3.
//!
//! mount(8) looks helpers up only in /sbin and runs them with PATH removed,
//! so the install has to land in the system's own directories. Each test
//! runs it in a private mount namespace whose /usr/local and /sbin are
//! overlays on a tmpfs: for every command run inside, the install is real,
//! while the machine's own directories are never written, and everything
//! installed goes away with the namespace.

use std::ffi::{OsStr, OsString};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::{run_timeout, try_run_timeout};

/// The longest any one command may take (an install copies the binary).
const STEP: Duration = Duration::from_secs(60);

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_foliofs")
}

fn install_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/install")
}

/// The manual pages the binary writes, by file name.
fn man_pages() -> Vec<String> {
    let dir = tempfile::tempdir().unwrap();
    crate::common::foliofs_ok([
        OsStr::new("man"),
        OsStr::new("--out-dir"),
        dir.path().as_os_str(),
    ]);
    let mut pages: Vec<String> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    pages.sort();
    assert!(pages.contains(&"foliofs.1".to_owned()), "{pages:?}");
    assert!(
        pages.contains(&"foliofs-mkfs-romfs.1".to_owned()),
        "{pages:?}"
    );
    pages
}

/// Where the install puts the bash, zsh and fish completions.
fn completion_files(prefix: &str) -> [String; 3] {
    [
        format!("{prefix}/share/bash-completion/completions/foliofs"),
        format!("{prefix}/share/zsh/site-functions/_foliofs"),
        format!("{prefix}/share/fish/vendor_completions.d/foliofs.fish"),
    ]
}

fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Why these tests cannot run here, if they cannot; `mounting`: the test
/// mounts through mount(8) and FUSE, not only installs.
fn unavailable(mounting: bool) -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root: installing into /sbin and mounting need root".into());
    }
    if mounting && !Path::new("/dev/fuse").exists() {
        return Some("/dev/fuse does not exist".into());
    }
    for tool in ["unshare", "nsenter", "mount", "umount"]
        .into_iter()
        .chain(mounting.then_some("mount.fuse3"))
    {
        if which(tool).is_none() {
            return Some(format!("{tool} is not installed"));
        }
    }
    None
}

/// One line of a mountinfo file: mount point, options, type, source and
/// the file system's own options.
#[derive(Debug)]
struct MountLine {
    target: PathBuf,
    options: String,
    fstype: String,
    source: String,
    super_options: String,
}

fn parse_mountinfo(text: &str) -> Vec<MountLine> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let sep = f.iter().position(|x| *x == "-")?;
            Some(MountLine {
                target: PathBuf::from(f.get(4)?.replace("\\040", " ")),
                options: f.get(5)?.to_string(),
                fstype: f.get(sep + 1)?.to_string(),
                source: f.get(sep + 2)?.replace("\\040", " "),
                super_options: f.get(sep + 3)?.to_string(),
            })
        })
        .collect()
}

/// A private mount namespace, held open by a `cat` reading a pipe from this
/// process: it ends when the test drops it (or dies), and its mounts with it.
struct Namespace {
    holder: Child,
    pid: u32,
}

impl Namespace {
    /// A new namespace in which /usr/local and /sbin are overlays whose
    /// upper layers live on a tmpfs mounted at `scratch`, and in which no
    /// foliofs is installed yet. `Err` says why it could not be set up.
    fn new(scratch: &Path) -> Result<Namespace, String> {
        let holder = Command::new(which("unshare").unwrap())
            .args(["--mount", "--propagation", "private", "--", "cat"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start unshare: {e}"))?;
        let mut ns = Namespace {
            pid: holder.id(),
            holder,
        };
        let ours = fs::read_link("/proc/self/ns/mnt").unwrap();
        let start = Instant::now();
        loop {
            if let Ok(Some(status)) = ns.holder.try_wait() {
                return Err(format!("unshare --mount failed ({status})"));
            }
            let theirs = fs::read_link(format!("/proc/{}/ns/mnt", ns.pid));
            if theirs.is_ok_and(|t| t != ours) {
                break;
            }
            if start.elapsed() > Duration::from_secs(10) {
                return Err("unshare --mount did not enter a new namespace".into());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        ns.setup(scratch)?;
        Ok(ns)
    }

    fn setup(&self, scratch: &Path) -> Result<(), String> {
        let scratch_s = scratch.to_str().unwrap();
        self.check("mount", &["-t", "tmpfs", "foliofs-fstab-test", scratch_s])?;
        // /sbin is /usr/sbin on merged-/usr systems; overlay the real directory.
        let sbin = fs::canonicalize("/sbin").unwrap();
        for (i, dir) in [Path::new("/usr/local"), &sbin].into_iter().enumerate() {
            let upper = scratch.join(format!("{i}/upper"));
            let work = scratch.join(format!("{i}/work"));
            self.check(
                "mkdir",
                &[OsStr::new("-p"), upper.as_os_str(), work.as_os_str()],
            )?;
            let opts = format!(
                "lowerdir={},upperdir={},workdir={}",
                dir.display(),
                upper.display(),
                work.display()
            );
            self.check(
                "mount",
                &[
                    "-t",
                    "overlay",
                    "overlay",
                    "-o",
                    &opts,
                    dir.to_str().unwrap(),
                ],
            )?;
        }
        // Start from a machine without foliofs, whatever this one has: a
        // removal inside an overlay only hides the file in this namespace.
        // (Run inside it: through /proc/PID/root an absolute symlink would
        // lead back to this namespace's files.)
        self.check(
            "sh",
            &[
                "-c",
                "rm -f /usr/local/bin/foliofs /usr/local/sbin/foliofs /sbin/mount.fuse.foliofs \
                 /usr/local/bin/mkfs.erofs \
                 /usr/local/share/man/man1/foliofs*.1 \
                 /usr/local/share/bash-completion/completions/foliofs \
                 /usr/local/share/zsh/site-functions/_foliofs \
                 /usr/local/share/fish/vendor_completions.d/foliofs.fish",
            ],
        )?;
        Ok(())
    }

    /// `path` as this namespace sees it, reachable from outside it (for
    /// paths without symlinks: an absolute one would lead back out).
    fn path(&self, path: &Path) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root", self.pid)).join(path.strip_prefix("/").unwrap())
    }

    /// Runs `prog ARGS` inside the namespace.
    fn run<S: AsRef<OsStr>>(&self, prog: &str, args: &[S]) -> Result<Output, String> {
        self.run_env(prog, args, &[])
    }

    /// [`Namespace::run`] with `env` added to the environment.
    fn run_env<S: AsRef<OsStr>>(
        &self,
        prog: &str,
        args: &[S],
        env: &[(&str, &str)],
    ) -> Result<Output, String> {
        let mut cmd = Command::new(which("nsenter").unwrap());
        cmd.envs(env.iter().copied());
        cmd.arg(format!("--target={}", self.pid))
            .arg("--mount")
            .arg("--")
            .arg(prog)
            .args(args);
        try_run_timeout(&mut cmd, STEP)
    }

    /// Like [`Namespace::run`], but an error unless it exits 0; returns
    /// stdout and stderr together.
    fn check<S: AsRef<OsStr>>(&self, prog: &str, args: &[S]) -> Result<String, String> {
        let out = self.run(prog, args)?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if !out.status.success() {
            let args: Vec<OsString> = args.iter().map(|a| a.as_ref().to_owned()).collect();
            return Err(format!("{prog} {args:?} failed ({}):\n{text}", out.status));
        }
        Ok(text)
    }

    fn ok<S: AsRef<OsStr>>(&self, prog: &str, args: &[S]) -> String {
        self.check(prog, args).unwrap_or_else(|e| panic!("{e}"))
    }

    fn mounts(&self) -> Vec<MountLine> {
        parse_mountinfo(&fs::read_to_string(format!("/proc/{}/mountinfo", self.pid)).unwrap())
    }

    /// The topmost mount at `dir` in this namespace, if any.
    fn mount_at(&self, dir: &Path) -> Option<MountLine> {
        self.mounts().into_iter().rev().find(|m| m.target == dir)
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        // A FUSE server still serving inside would keep the namespace alive.
        for m in self.mounts() {
            if m.fstype.starts_with("fuse.foliofs") {
                let t = m.target.as_os_str();
                if self.check("umount", &[t]).is_err() {
                    let _ = self.check("umount", &[OsStr::new("-l"), t]);
                }
            }
        }
        drop(self.holder.stdin.take());
        let start = Instant::now();
        while matches!(self.holder.try_wait(), Ok(None)) {
            if start.elapsed() > Duration::from_secs(5) {
                let _ = self.holder.kill();
                let _ = self.holder.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// A romfs image of a small tree, a mount point, and a namespace to
/// install into. Fields drop in order: the namespace (and its mounts) first.
struct Setup {
    ns: Namespace,
    src: PathBuf,
    image: PathBuf,
    mnt: PathBuf,
    /// `dir`, canonical.
    base: PathBuf,
    _dir: tempfile::TempDir,
}

const FILES: &[(&str, usize)] = &[
    ("hello.txt", 13),
    ("data.bin", 300_000),
    ("sub/deep.txt", 4097),
];

impl Setup {
    fn new() -> Option<Setup> {
        Setup::with(true)
    }

    /// A setup for a test that installs but mounts nothing.
    fn install_only() -> Option<Setup> {
        Setup::with(false)
    }

    fn with(mounting: bool) -> Option<Setup> {
        if let Some(why) = unavailable(mounting) {
            eprintln!("SKIP: {why}");
            return None;
        }
        let dir = tempfile::Builder::new()
            .prefix("foliofs-fstab.")
            .tempdir()
            .unwrap();
        // Canonical, so it matches mountinfo and is safe under /proc/PID/root.
        let base = dir.path().canonicalize().unwrap();
        let src = base.join("src");
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for (name, len) in FILES {
            let p = src.join(name);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            let bytes: Vec<u8> = (0..*len)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed as u8
                })
                .collect();
            fs::write(&p, bytes).unwrap();
        }
        let image = base.join("tree.romfs");
        let out = run_timeout(
            Command::new(bin())
                .args(["mkfs", "romfs"])
                .arg(&src)
                .arg(&image),
            STEP,
        );
        assert!(
            out.status.success(),
            "foliofs mkfs romfs: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mnt = base.join("mnt");
        let scratch = base.join("ns");
        fs::create_dir(&mnt).unwrap();
        fs::create_dir(&scratch).unwrap();
        let ns = match Namespace::new(&scratch) {
            Ok(ns) => ns,
            Err(why) => {
                eprintln!("SKIP: cannot set up a private mount namespace: {why}");
                return None;
            }
        };
        Some(Setup {
            ns,
            src,
            image,
            mnt,
            base,
            _dir: dir,
        })
    }

    /// Runs `scripts/install ARGS` inside the namespace; returns its output.
    fn install(&self, args: &[&str]) -> String {
        let mut all = vec![install_script().into_os_string()];
        all.extend(args.iter().map(OsString::from));
        self.ns.ok("bash", &all)
    }

    /// Checks that the mount point holds the image, read-only, with every
    /// file as in the source tree, and that `super_opts` are in effect.
    fn check_mounted(&self, super_opts: &[&str]) {
        let m = self.ns.mount_at(&self.mnt).unwrap_or_else(|| {
            panic!(
                "{} is not a mount point; mounts: {:#?}",
                self.mnt.display(),
                self.ns.mounts()
            )
        });
        assert_eq!(m.fstype, "fuse.foliofs", "{m:?}");
        assert_eq!(Path::new(&m.source), self.image, "{m:?}");
        assert!(m.options.split(',').any(|o| o == "ro"), "{m:?}");
        for o in super_opts {
            assert!(m.super_options.split(',').any(|s| s == *o), "{o}: {m:?}");
        }
        let root = self.ns.path(&self.mnt);
        let mut names: Vec<String> = fs::read_dir(&root)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["data.bin", "hello.txt", "sub"]);
        for (name, _) in FILES {
            let got = fs::read(root.join(name)).unwrap();
            let want = fs::read(self.src.join(name)).unwrap();
            assert!(got == want, "{name} differs from the source");
        }
    }

    /// mount(8)'s arguments to mount the image read-only with `-t fuse.foliofs`.
    fn mount_t(&self) -> [&OsStr; 6] {
        [
            OsStr::new("-t"),
            OsStr::new("fuse.foliofs"),
            self.image.as_os_str(),
            self.mnt.as_os_str(),
            OsStr::new("-o"),
            OsStr::new("ro"),
        ]
    }

    fn unmount(&self) {
        self.ns.ok("umount", &[&self.mnt]);
        assert!(
            self.ns.mount_at(&self.mnt).is_none(),
            "{} is still mounted after umount",
            self.mnt.display()
        );
    }
}

/// The documented install (`/usr/local`), then an fstab line and
/// `mount -t fuse.foliofs`.
#[test]
fn fstab_and_mount_t_after_install() {
    let Some(s) = Setup::new() else { return };

    let out = s.install(&["--binary", bin()]);
    assert!(out.contains("installed /usr/local/bin/foliofs"), "{out}");
    assert!(out.contains("installed /sbin/mount.fuse.foliofs"), "{out}");
    let pages = man_pages();
    for f in pages
        .iter()
        .map(|p| format!("/usr/local/share/man/man1/{p}"))
        .chain(completion_files("/usr/local"))
    {
        assert!(out.contains(&format!("installed {f}")), "{f}:\n{out}");
    }
    let again = s.install(&["--binary", bin()]);
    assert!(
        !again.contains("installed")
            && !again.contains("removed")
            && again.matches("is up to date").count() == 2 + pages.len() + 3,
        "a second install changed something:\n{again}"
    );
    // Where Debian's man looks, and a completion bash takes.
    if which("man").is_some() {
        for (page, file) in [
            ("foliofs", "foliofs.1"),
            ("foliofs-mount", "foliofs-mount.1"),
        ] {
            // Debian's /usr/local/man is a link to share/man.
            let found = s.ns.ok("man", &["-w", page]);
            let found = s.ns.ok("readlink", &["-f", found.trim()]);
            assert_eq!(
                found.trim(),
                format!("/usr/local/share/man/man1/{file}"),
                "man -w {page}"
            );
        }
    } else {
        eprintln!("skip: fstab_and_mount_t_after_install: man -w (man-db is not installed)");
    }
    let complete = s.ns.ok(
        "bash",
        &[
            "-c",
            "source /usr/local/share/bash-completion/completions/foliofs && complete -p foliofs",
        ],
    );
    assert!(complete.contains("foliofs"), "{complete}");

    // Options mount.fuse3 keeps to itself (nofail) or passes on (allow_other).
    let fstab = s.base.join("fstab");
    fs::write(
        &fstab,
        format!(
            "# foliofs fstab test\n{}  {}  fuse.foliofs  ro,largeblocks,allow_other,nofail  0 0\n",
            s.image.display(),
            s.mnt.display()
        ),
    )
    .unwrap();
    s.ns.ok(
        "mount",
        &[OsStr::new("-T"), fstab.as_os_str(), s.mnt.as_os_str()],
    );
    s.check_mounted(&["allow_other"]);
    s.unmount();

    s.ns.ok("mount", &s.mount_t());
    s.check_mounted(&[]);
    s.unmount();
}

/// A prefix on no shell's default PATH works through the helper alone, and
/// `--uninstall` takes both files away again.
#[test]
fn mount_t_with_another_prefix_then_uninstall() {
    let Some(s) = Setup::new() else { return };
    let prefix = s.base.join("prefix");
    let prefix = prefix.to_str().unwrap();

    let out = s.install(&["--prefix", prefix, "--binary", bin()]);
    assert!(
        out.contains(&format!("installed {prefix}/bin/foliofs")),
        "{out}"
    );
    let mount_t = s.mount_t();
    s.ns.ok("mount", &mount_t);
    s.check_mounted(&[]);
    s.unmount();

    let out = s.install(&["--uninstall", "--prefix", prefix]);
    assert!(
        out.contains(&format!("removed {prefix}/bin/foliofs")),
        "{out}"
    );
    assert!(out.contains("removed /sbin/mount.fuse.foliofs"), "{out}");
    for f in man_pages()
        .iter()
        .map(|p| format!("{prefix}/share/man/man1/{p}"))
        .chain(completion_files(prefix))
    {
        assert!(out.contains(&format!("removed {f}")), "{f}:\n{out}");
        assert!(!s.ns.path(Path::new(&f)).exists(), "{f} is still there");
    }
    let gone =
        s.ns.run("test", &["!", "-e", "/sbin/mount.fuse.foliofs"])
            .unwrap();
    assert!(gone.status.success(), "the helper is still there");
    let failed = s.ns.run("mount", &mount_t).unwrap();
    assert!(
        !failed.status.success(),
        "mount -t fuse.foliofs worked with foliofs uninstalled"
    );
    assert!(s.ns.mount_at(&s.mnt).is_none());
}

/// `--mkfs-erofs`, and only it, links PREFIX/bin/mkfs.erofs to foliofs,
/// which then answers as mkfs.erofs; again it is up to date. A
/// mkfs.erofs that is not its link (a program of its own, or a link to
/// another) stops the install before anything is written and is left
/// alone by `--uninstall`, which removes only its own link.
#[test]
fn mkfs_erofs_link_on_request_and_never_over_anothers() {
    let Some(s) = Setup::install_only() else {
        return;
    };
    let link = Path::new("/usr/local/bin/mkfs.erofs");

    let out = s.install(&["--binary", bin()]);
    assert!(!out.contains("mkfs.erofs"), "{out}");
    assert!(
        fs::symlink_metadata(s.ns.path(link)).is_err(),
        "mkfs.erofs installed unasked"
    );

    let out = s.install(&["--binary", bin(), "--mkfs-erofs"]);
    assert!(
        out.contains("installed /usr/local/bin/mkfs.erofs (a link to foliofs)"),
        "{out}"
    );
    assert_eq!(
        fs::read_link(s.ns.path(link)).unwrap(),
        Path::new("foliofs")
    );
    let help = s.ns.ok("/usr/local/bin/mkfs.erofs", &["--help"]);
    assert!(
        help.contains("--tar=") && help.contains("mkfs.erofs [OPTIONS] <IMAGE> [SOURCE]"),
        "{help}"
    );
    let again = s.install(&["--binary", bin(), "--mkfs-erofs"]);
    assert!(
        again.contains("/usr/local/bin/mkfs.erofs is up to date")
            && !again.contains("installed")
            && !again.contains("removed"),
        "a second install changed something:\n{again}"
    );

    // Someone else's mkfs.erofs under another prefix: a program, then a
    // link to another program.
    let prefix = s.base.join("prefix");
    let other = prefix.join("bin/mkfs.erofs");
    fs::create_dir_all(other.parent().unwrap()).unwrap();
    let prefix = prefix.to_str().unwrap();
    for foreign in ["program", "link"] {
        let _ = fs::remove_file(&other);
        if foreign == "program" {
            fs::write(&other, b"#!/bin/sh\necho erofs-utils\n").unwrap();
        } else {
            std::os::unix::fs::symlink("/bin/true", &other).unwrap();
        }
        let out =
            s.ns.run(
                "bash",
                &[
                    install_script().as_os_str(),
                    OsStr::new("--prefix"),
                    OsStr::new(prefix),
                    OsStr::new("--binary"),
                    OsStr::new(bin()),
                    OsStr::new("--mkfs-erofs"),
                ],
            )
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{foreign}: installed over another's");
        assert!(
            err.contains(&format!(
                "{prefix}/bin/mkfs.erofs exists and is not a link to foliofs"
            )),
            "{foreign}: {err}"
        );
        assert!(
            !Path::new(prefix).join("bin/foliofs").exists(),
            "{foreign}: foliofs installed after all"
        );
        let out = s.install(&["--uninstall", "--prefix", prefix]);
        assert!(out.contains("left alone"), "{foreign}: {out}");
        assert!(fs::symlink_metadata(&other).is_ok(), "{foreign}: removed");
    }
    assert_eq!(fs::read_link(&other).unwrap(), Path::new("/bin/true"));

    let out = s.install(&["--uninstall"]);
    assert!(out.contains("removed /usr/local/bin/mkfs.erofs"), "{out}");
    assert!(fs::symlink_metadata(s.ns.path(link)).is_err());
}

/// A `user` line in /etc/fstab lets the user `tests` mount the image with
/// a plain `mount MOUNTPOINT` (mount(8), the helper, mount.fuse3, foliofs,
/// fusermount3), read it, and take it down with `foliofs umount`.
#[test]
fn a_user_fstab_line_mounts_as_the_user() {
    require!("user-fuse");
    let Some(s) = Setup::new() else { return };
    let (uid, gid) = crate::common::user_ids(crate::common::TEST_USER).unwrap();
    // The user reaches the image through the test's directory and mounts
    // on a directory of their own.
    fs::set_permissions(&s.base, fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::chown(&s.mnt, Some(uid), Some(gid)).unwrap();
    s.install(&["--binary", bin()]);
    let fstab = s.base.join("fstab");
    fs::write(
        &fstab,
        format!(
            "{}  {}  fuse.foliofs  user,noauto,ro,largeblocks  0 0\n",
            s.image.display(),
            s.mnt.display()
        ),
    )
    .unwrap();
    // Only this namespace's /etc/fstab changes.
    s.ns.ok(
        "mount",
        &[
            OsStr::new("--bind"),
            fstab.as_os_str(),
            OsStr::new("/etc/fstab"),
        ],
    );
    let as_user = |prog: &str, args: &[&OsStr]| {
        let mut all: Vec<OsString> = vec![
            format!("--reuid={uid}").into(),
            format!("--regid={gid}").into(),
            "--init-groups".into(),
            "--reset-env".into(),
            "--".into(),
            prog.into(),
        ];
        all.extend(args.iter().map(|a| a.to_os_string()));
        let out = s.ns.run("setpriv", &all).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            out.status.success(),
            "{prog} {args:?} as the user failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    };
    as_user("mount", &[s.mnt.as_os_str()]);
    let m = s.ns.mount_at(&s.mnt).expect("not mounted");
    assert_eq!(m.fstype, "fuse.foliofs", "{m:?}");
    assert!(
        m.super_options.contains(&format!("user_id={uid},")),
        "{m:?}"
    );
    for flag in ["ro", "nosuid", "nodev"] {
        assert!(m.options.split(',').any(|o| o == flag), "{flag}: {m:?}");
    }
    for (name, _) in FILES {
        let got = as_user("cat", &[s.mnt.join(name).as_os_str()]);
        let want = fs::read(s.src.join(name)).unwrap();
        assert!(got == want, "{name} differs");
    }
    as_user(bin(), &[OsStr::new("umount"), s.mnt.as_os_str()]);
    assert!(s.ns.mount_at(&s.mnt).is_none(), "still mounted");
}

/// An image in S3 from an fstab line and from `mount -t fuse.foliofs`:
/// mount(8) and mount.fuse3 hand the URL to foliofs as they found it, with
/// the endpoint and cache options, and the credentials come from the
/// environment mount(8) was started with.
#[test]
fn an_s3_image_from_fstab_and_mount_t() {
    require!("weed");
    let Some(s) = Setup::new() else { return };
    let weed = crate::remote::start_weed();
    weed.put_file(crate::remote::BUCKET, "tree.romfs", &s.image)
        .unwrap();
    s.install(&["--binary", bin()]);
    let url = format!("s3://{}/tree.romfs", crate::remote::BUCKET);
    let cache = s.base.join("cache");
    let opts = format!("ro,{},cache={}", weed.mount_options(), cache.display());
    let env = [
        ("AWS_ACCESS_KEY_ID", crate::remote::ACCESS_KEY),
        ("AWS_SECRET_ACCESS_KEY", crate::remote::SECRET_KEY),
    ];
    let check = |how: &str| {
        let m =
            s.ns.mount_at(&s.mnt)
                .unwrap_or_else(|| panic!("{how}: not mounted"));
        assert_eq!(m.fstype, "fuse.foliofs", "{m:?}");
        assert_eq!(m.source, url, "{m:?}");
        let root = s.ns.path(&s.mnt);
        for (name, _) in FILES {
            let got = fs::read(root.join(name)).unwrap();
            assert!(
                got == fs::read(s.src.join(name)).unwrap(),
                "{how}: {name} differs"
            );
        }
        s.unmount();
    };

    let fstab = s.base.join("fstab");
    fs::write(
        &fstab,
        format!(
            "{url}  {}  fuse.foliofs  {opts},nofail  0 0\n",
            s.mnt.display()
        ),
    )
    .unwrap();
    let out =
        s.ns.run_env(
            "mount",
            &[OsStr::new("-T"), fstab.as_os_str(), s.mnt.as_os_str()],
            &env,
        )
        .unwrap();
    assert!(
        out.status.success(),
        "mount -T: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    check("fstab");

    let out =
        s.ns.run_env(
            "mount",
            &[
                OsStr::new("-t"),
                OsStr::new("fuse.foliofs"),
                OsStr::new(&url),
                s.mnt.as_os_str(),
                OsStr::new("-o"),
                OsStr::new(&opts),
            ],
            &env,
        )
        .unwrap();
    assert!(
        out.status.success(),
        "mount -t: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    check("mount -t");
    assert!(cache.exists(), "nothing cached");
}
