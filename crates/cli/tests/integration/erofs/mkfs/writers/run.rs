//! One case: a writer's tar, its own extraction as the oracle, foliofs's
//! image of the tar (compressed as the case says, on standard input)
//! under the kernel, and mkfs.erofs 1.9.3's beside it; the matrix line
//! each case prints.

use std::fs;
use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use super::super::super::walk::{walk_mounted, KernelMount, Node, Tree};
use super::super::{comparable, erofs_utils, kernel_walk};
use super::programs::{GO_EXTRACTOR, GO_WRITER, PYTHON_WRITER};
use super::tree::{huge_tree, source_tree, Tmpfs};
use crate::common;

pub enum Writer {
    /// GNU tar with these options, `--numeric-owner` added.
    GnuTar(&'static [&'static str]),
    /// bsdtar with these options, `--numeric-owner` added.
    Bsdtar(&'static [&'static str]),
    /// Python's `tarfile` in this format (`pax`, `gnu`, `ustar`).
    Python(&'static str),
    /// `busybox tar -c`.
    Busybox,
    /// [`GO_WRITER`].
    Go,
}

#[derive(Clone, Copy)]
pub enum Compress {
    Plain,
    Gzip,
    Zstd,
}

pub struct Case {
    pub name: &'static str,
    pub writer: Writer,
    /// How the tar reaches foliofs's standard input.
    pub compress: Compress,
    /// containerd's flags (`--tar=f -Enoinline_data -b4096`); otherwise
    /// the defaults.
    pub containerd: bool,
    /// The format cannot hold all of the tree: the writer leaves out what
    /// it cannot store and exits non-zero for it.
    pub lossy: bool,
    /// Adds `./huge`, the file past 4 GiB (for writers that store holes).
    pub huge: bool,
    /// The writer stores xattrs and ACLs.
    pub xattrs: bool,
}

const CONTAINERD: [&str; 3] = ["--tar=f", "-Enoinline_data", "-b4096"];

/// What one test's cases share: the source tree and the extractions on a
/// tmpfs, tars and images on disk, and the results so far.
pub struct Matrix {
    fs: Tmpfs,
    disk: tempfile::TempDir,
    mkfs_erofs: Option<PathBuf>,
    /// The source tree's walk, and the huge tree's (empty unless a case
    /// adds it).
    src_walk: Tree,
    huge_walk: Tree,
    failures: Vec<String>,
}

impl Matrix {
    pub fn new(cases: &[Case]) -> Matrix {
        let fs = Tmpfs::new();
        source_tree(&fs.path().join("src"));
        let src_walk = walk_mounted(&fs.path().join("src"));
        let mut huge_walk = Tree::new();
        if cases.iter().any(|c| c.huge) {
            let huge = fs.path().join("huge-src");
            huge_tree(&huge);
            huge_walk = walk_mounted(&huge);
            huge_walk.remove(Path::new(""));
        }
        Matrix {
            src_walk,
            huge_walk,
            fs,
            disk: tempfile::tempdir().unwrap(),
            mkfs_erofs: erofs_utils(),
            failures: Vec::new(),
        }
    }

    /// Runs every case (each writer missing here skips its cases with
    /// one line), then fails if foliofs's image of any differed from the
    /// writer's extraction.
    pub fn run(mut self, cases: &[Case]) {
        for case in cases {
            self.case(case);
        }
        assert!(
            self.failures.is_empty(),
            "foliofs differs from the writers' own extractions in {} case(s):\n{}",
            self.failures.len(),
            self.failures.join("\n")
        );
    }

    fn case(&mut self, case: &Case) {
        let program = match case.writer {
            Writer::GnuTar(_) => "tar",
            Writer::Bsdtar(_) => "bsdtar",
            Writer::Python(_) => "python3",
            Writer::Busybox => "busybox",
            Writer::Go => "go",
        };
        if !common::have(&format!("writers: {}", case.name), &[program]) {
            return;
        }
        let tar = self.disk.path().join(format!("{}.tar", case.name));
        let (foliofs, mkfs_erofs) = match self.write(case, &tar) {
            Err(e) => (Err(format!("WRITER FAILED: {e}")), "not run".to_owned()),
            Ok(()) => match self.extract(case, &tar).and_then(|w| self.holds(case, w)) {
                Err(e) => (Err(format!("EXTRACTION FAILED: {e}")), "not run".to_owned()),
                Ok(want) => {
                    let ours = self.foliofs(case, &tar, &want);
                    let theirs = self.mkfs_erofs(case, &tar, &want);
                    (ours, theirs)
                }
            },
        };
        let _ = fs::remove_file(&tar);
        let line = format!(
            "writers: {}: foliofs {} ; mkfs.erofs 1.9.3 {mkfs_erofs}",
            case.name,
            match &foliofs {
                Ok(()) => "equal",
                Err(e) => e,
            }
        );
        eprintln!("{line}");
        if let Some(report) = std::env::var_os("FOLIOFS_WRITERS_REPORT") {
            let mut f = fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(report)
                .unwrap();
            writeln!(f, "{line}").unwrap();
        }
        if let Err(e) = foliofs {
            self.failures.push(format!("{}: {e}", case.name));
        }
    }

    fn write(&self, case: &Case, tar: &Path) -> Result<(), String> {
        let src = self.fs.path().join("src");
        let huge = self.fs.path().join("huge-src");
        let mut cmd;
        match case.writer {
            Writer::GnuTar(args) | Writer::Bsdtar(args) => {
                let gnu = matches!(case.writer, Writer::GnuTar(_));
                cmd = Command::new(if gnu { "tar" } else { "bsdtar" });
                cmd.args(["-c", "--numeric-owner"]).args(args);
                cmd.arg("-f").arg(tar).arg("-C").arg(&src).arg(".");
                if case.huge {
                    cmd.arg("-C").arg(&huge).arg("./huge");
                }
            }
            Writer::Python(format) => {
                cmd = Command::new("python3");
                cmd.args(["-c", PYTHON_WRITER, format]).arg(&src).arg(tar);
            }
            Writer::Busybox => {
                cmd = Command::new("busybox");
                cmd.args(["tar", "-cf"])
                    .arg(tar)
                    .arg("-C")
                    .arg(&src)
                    .arg(".");
            }
            Writer::Go => {
                cmd = self.go("write.go", GO_WRITER);
                cmd.arg(&src).arg(tar);
            }
        }
        let out = common::run_timeout(&mut cmd, Duration::from_secs(300));
        if out.status.success() || (case.lossy && tar.exists()) {
            Ok(())
        } else {
            Err(format!("{}: {}", out.status, first_lines(&out.stderr)))
        }
    }

    /// `go run NAME` of `program`, written to the test's directory: one
    /// file outside any module, built offline with a cache of the test's
    /// own.
    fn go(&self, name: &str, program: &str) -> Command {
        let dir = self.disk.path().join("go");
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join(name), program).unwrap();
        let mut cmd = Command::new("go");
        cmd.current_dir(&dir)
            .args(["run", name])
            .env("GO111MODULE", "off")
            .env("GOPROXY", "off")
            .env("CGO_ENABLED", "0")
            .env("HOME", &dir)
            .env("GOPATH", dir.join("path"))
            .env("GOCACHE", dir.join("cache"));
        cmd
    }

    /// The writer's own extraction of `tar`, walked: bsdtar's of its
    /// tars (GNU tar ignores `LIBARCHIVE.xattr.*`), Go's of the Go
    /// program's, GNU tar's of the rest.
    fn extract(&self, case: &Case, tar: &Path) -> Result<Tree, String> {
        let x = self.fs.path().join("x");
        let _ = fs::remove_dir_all(&x);
        fs::create_dir(&x).unwrap();
        let bsd = matches!(case.writer, Writer::Bsdtar(_));
        let out = if matches!(case.writer, Writer::Go) {
            let mut cmd = self.go("extract.go", GO_EXTRACTOR);
            common::run_timeout(cmd.arg(tar).arg(&x), Duration::from_secs(300))
        } else {
            extract_with(bsd, tar, &x, &[])
        };
        if !out.status.success() {
            return Err(first_lines(&out.stderr));
        }
        let mut want = comparable(walk_mounted(&x), None);
        fs::remove_dir_all(&x).unwrap();
        if bsd {
            // Two times bsdtar's extraction cannot give, taken from GNU
            // tar's extraction of the same tar:
            // - bsdtar restores the mode and owner of the directory it
            //   extracts into from the `./` entry, but not its mtime;
            // - libarchive writes a time before 1970 with a fraction as
            //   the seconds, then `.` and the fraction (-999999.75 as
            //   "-1000000.25") and reads its own back; Go's archive/tar
            //   and GNU tar read the record as the number it spells,
            //   which is how foliofs reads it (the README's tar rules).
            let gnu = self.fs.path().join("gnu");
            let _ = fs::remove_dir_all(&gnu);
            fs::create_dir(&gnu).unwrap();
            let out = extract_with(false, tar, &gnu, &[]);
            if !out.status.success() {
                return Err(format!("GNU tar: {}", first_lines(&out.stderr)));
            }
            let walked = walk_mounted(&gnu);
            fs::remove_dir_all(&gnu).unwrap();
            for (path, n) in want.iter_mut() {
                let fractional_past = n.mtime.0 < 0 && n.mtime.1 != 0;
                if path.as_os_str().is_empty() || fractional_past {
                    n.mtime = walked[path].mtime;
                }
            }
        }
        Ok(want)
    }

    /// `want` if it holds what the case's writer stores, so that a
    /// writer's options that stopped storing something fail here rather
    /// than leave nothing to compare: every path of the source unless
    /// the format is lossy, and the xattrs and ACLs where it keeps them.
    fn holds(&self, case: &Case, want: Tree) -> Result<Tree, String> {
        if !case.lossy {
            let huge = case.huge.then_some(&self.huge_walk).into_iter().flatten();
            if let Some(p) = self
                .src_walk
                .keys()
                .chain(huge.map(|(p, _)| p))
                .find(|p| !want.contains_key(*p))
            {
                return Err(format!("the extraction lacks /{}", p.display()));
            }
        }
        if case.xattrs {
            for (path, name) in [
                ("xattrs/binary", "user.nul-and-newline"),
                ("xattrs/binary", "trusted.binary"),
                ("xattrs/capability", "security.capability"),
                ("acl/file", "system.posix_acl_access"),
                ("acl/dir", "system.posix_acl_default"),
            ] {
                let held = want
                    .get(Path::new(path))
                    .and_then(|n| n.xattrs.get(name.as_bytes()));
                if held != self.src_walk[Path::new(path)].xattrs.get(name.as_bytes()) {
                    return Err(format!(
                        "the extraction lacks /{path}'s {name} as the source has it"
                    ));
                }
            }
        }
        Ok(want)
    }

    /// The tar (compressed as the case says) on foliofs's standard input,
    /// its image checked by [`kernel_walk`] and walked against `want`.
    fn foliofs(&self, case: &Case, tar: &Path, want: &Tree) -> Result<(), String> {
        let input = match case.compress {
            Compress::Plain => tar.to_owned(),
            Compress::Gzip => super::super::compressed(tar, "gzip"),
            Compress::Zstd => super::super::compressed(tar, "zstd"),
        };
        let img = self.disk.path().join("foliofs.img");
        let flags: &[&str] = if case.containerd { &CONTAINERD } else { &[] };
        let out = stdin_from(
            Command::new("sh")
                .arg("-c")
                .arg(r#"exec "$0" mkfs erofs -q "$@" - "$IMG" < "$T""#)
                .arg(common::bin())
                .args(flags),
            &img,
            &input,
        );
        if input != tar {
            fs::remove_file(&input).unwrap();
        }
        let result = if out.status.success() {
            match catch_unwind(AssertUnwindSafe(|| kernel_walk(&img))) {
                Err(p) => Err(format!("BROKEN: {}", panic_text(&p))),
                Ok(got) => match differences(want, &comparable(got, None)) {
                    None => Ok(()),
                    Some(d) => Err(format!("DIFFERS({d})")),
                },
            }
        } else {
            Err(format!("REFUSED: {}", first_lines(&out.stderr)))
        };
        let _ = fs::remove_file(&img);
        result
    }

    /// mkfs.erofs 1.9.3 on the plain tar with the same flags (`--tar=f`
    /// always: it reads a directory otherwise), as the column to report.
    fn mkfs_erofs(&self, case: &Case, tar: &Path, want: &Tree) -> String {
        let Some(bin) = &self.mkfs_erofs else {
            return "not built".to_owned();
        };
        let img = self.disk.path().join("mkfs-erofs.img");
        let flags: &[&str] = if case.containerd {
            &CONTAINERD
        } else {
            &["--tar=f"]
        };
        let out = stdin_from(
            Command::new("sh")
                .arg("-c")
                .arg(r#"exec "$0" --quiet "$@" "$IMG" < "$T""#)
                .arg(bin.join("mkfs.erofs"))
                .args(flags),
            &img,
            tar,
        );
        let result = if !out.status.success() {
            format!("REFUSED: {}", first_lines(&out.stderr))
        } else {
            let walked = catch_unwind(AssertUnwindSafe(|| {
                walk_mounted(KernelMount::new(&img, "").path())
            }));
            match walked {
                Err(p) => format!("BROKEN: {}", panic_text(&p)),
                Ok(got) => match differences(want, &comparable(got, None)) {
                    None => "equal".to_owned(),
                    Some(d) => format!("DIFFERS: {d}"),
                },
            }
        };
        let _ = fs::remove_file(&img);
        result
    }
}

fn extract_with(bsd: bool, tar: &Path, dir: &Path, members: &[&str]) -> Output {
    let mut cmd = if bsd {
        let mut c = Command::new("bsdtar");
        c.args(["-xp", "--xattrs", "--acls", "--numeric-owner"]);
        c
    } else {
        let mut c = Command::new("tar");
        c.args([
            "-xp",
            "--xattrs",
            "--xattrs-include=*",
            "--acls",
            "--numeric-owner",
        ]);
        c
    };
    cmd.arg("-f").arg(tar).arg("-C").arg(dir).args(members);
    common::run_timeout(&mut cmd, Duration::from_secs(300))
}

/// `sh -c SCRIPT` (from `cmd`) with `$IMG` the image and `$T` the file
/// on its standard input (the test harness's runner gives none).
fn stdin_from(cmd: &mut Command, img: &Path, input: &Path) -> Output {
    common::run_timeout(
        cmd.env("IMG", img).env("T", input),
        Duration::from_secs(600),
    )
}

/// A tool's complaint on one line: its first three lines, joined.
fn first_lines(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let mut s = lines
        .iter()
        .take(3)
        .copied()
        .collect::<Vec<_>>()
        .join(" / ");
    if lines.len() > 3 {
        s += &format!(" / (+{} lines)", lines.len() - 3);
    }
    s
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    let text = p
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_default();
    text.lines().take(3).collect::<Vec<_>>().join(" / ")
}

/// `None` when `got` walks as `want`; otherwise how many paths differ
/// and the first one's first differing field.
fn differences(want: &Tree, got: &Tree) -> Option<String> {
    let mut first = None;
    let mut n = 0;
    let paths: std::collections::BTreeSet<&PathBuf> = want.keys().chain(got.keys()).collect();
    for p in paths {
        let d = match (want.get(p), got.get(p)) {
            (Some(w), Some(g)) => field_difference(w, g),
            (Some(_), None) => Some("missing".to_owned()),
            (None, Some(g)) => Some(format!("unexpected {}", g.kind)),
            (None, None) => None,
        };
        if let Some(d) = d {
            n += 1;
            first.get_or_insert_with(|| format!("/{}: {d}", p.display()));
        }
    }
    first.map(|f| {
        let f: String = f.chars().take(240).collect();
        if n > 1 {
            format!("{f}; {} more path(s)", n - 1)
        } else {
            f
        }
    })
}

fn field_difference(w: &Node, g: &Node) -> Option<String> {
    macro_rules! field {
        ($f:ident, $fmt:literal) => {
            if w.$f != g.$f {
                return Some(format!(
                    concat!(stringify!($f), " ", $fmt, " (extraction) vs ", $fmt),
                    w.$f, g.$f
                ));
            }
        };
    }
    field!(kind, "{}");
    field!(mode, "{:o}");
    field!(uid, "{}");
    field!(gid, "{}");
    field!(size, "{}");
    field!(mtime, "{:?}");
    field!(nlink, "{}");
    field!(rdev, "{:?}");
    if w.target != g.target {
        return Some("symlink target".to_owned());
    }
    if w.xattrs != g.xattrs {
        let names: std::collections::BTreeSet<&Vec<u8>> =
            w.xattrs.keys().chain(g.xattrs.keys()).collect();
        for name in names {
            let (a, b) = (w.xattrs.get(name), g.xattrs.get(name));
            if a != b {
                let len = |v: Option<&Vec<u8>>| {
                    v.map_or("absent".to_owned(), |v| format!("{} bytes", v.len()))
                };
                let (a, b) = match (len(a), len(b)) {
                    (a, b) if a == b => (format!("{a} of other values"), b),
                    ab => ab,
                };
                return Some(format!(
                    "xattr {}: {a} (extraction) vs {b}",
                    String::from_utf8_lossy(name),
                ));
            }
        }
    }
    if w.sha256 != g.sha256 {
        return Some("data".to_owned());
    }
    (w.ino != g.ino).then(|| "inode".to_owned())
}
