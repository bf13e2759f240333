//! A real program's start-up from an image: the machine's own Python
//! interpreter and standard library, copied into an image as a container
//! would carry them, importing a fixed list of modules. The generated tree
//! of the startup section reads every file once; this reads what an
//! interpreter reads, in its order: many stats and lookups of names that
//! are not there, then a few hundred small files, each opened, probed and
//! read.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

use crate::counted::{measure, trip_notes, Plan, Prime, Step};
use crate::env::{have, run, BenchEnv};
use crate::images::build_images;
use crate::mount::How;
use crate::report::{Column, Section, Unit};
use crate::rows::progress;
use crate::smallfiles::python_stdlib;
use crate::timing::time_cmd;
use crate::Config;

/// The modules imported, widely used ones that load many others; a name
/// this Python does not have is skipped (and counted in the note).
pub(crate) const MODULES: &[&str] = &[
    "argparse",
    "asyncio",
    "csv",
    "dataclasses",
    "datetime",
    "decimal",
    "email.message",
    "email.parser",
    "hashlib",
    "http.client",
    "json",
    "logging",
    "pathlib",
    "re",
    "sqlite3",
    "subprocess",
    "tarfile",
    "tempfile",
    "typing",
    "unittest",
    "urllib.request",
    "xml.etree.ElementTree",
    "zipfile",
];

/// With `--quick`: a few of them, still the parser, network, database and
/// text modules most programs start with (about a third of the files).
pub(crate) const QUICK_MODULES: &[&str] =
    &["argparse", "email.parser", "http.client", "json", "sqlite3"];

/// The program `-c` runs: import each module, then say how many it found
/// and how many modules that loaded in all.
pub(crate) fn script(modules: &[&str]) -> String {
    let list = modules
        .iter()
        .map(|m| format!("'{m}'"))
        .collect::<Vec<_>>()
        .join(",");
    format!(
        "import sys\nn=0\nfor m in ({list}):\n    try:\n        __import__(m)\n        n+=1\n    except ImportError:\n        pass\nprint(n, len(sys.modules))\n"
    )
}

/// The newest Python whose standard library is `/usr/lib/python3.N` and
/// whose interpreter is `/usr/bin/python3.N`: the distribution's, which
/// nothing here built.
pub(crate) fn python() -> Result<(PathBuf, PathBuf), String> {
    let lib = python_stdlib()
        .ok_or("no Python standard library under /usr/lib (python3.N/os.py; Debian: apt-get install python3)")?;
    let name = lib.file_name().expect("a python3.N directory").to_owned();
    let exe = Path::new("/usr/bin").join(&name);
    if !super::env::is_executable(&exe) {
        return Err(format!(
            "{} has no interpreter {} beside it",
            lib.display(),
            exe.display()
        ));
    }
    Ok((exe, lib))
}

/// `DIR/bin/python3.N` and `DIR/lib/python3.N`: laid out so the interpreter
/// finds its library from where it runs (`sys.prefix` is `DIR`), with no
/// environment variable, which `-I` would ignore anyway.
pub(crate) fn lay_out(dir: &Path, exe: &Path, lib: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(dir.join("bin"))?;
    std::fs::create_dir_all(dir.join("lib"))?;
    let name = exe.file_name().context("an interpreter without a name")?;
    let to = dir.join("bin").join(name);
    std::fs::copy(exe, &to).with_context(|| format!("copying {}", exe.display()))?;
    run(Command::new("cp").arg("-a").arg(lib).arg(dir.join("lib")))?;
    Ok(Path::new("bin").join(name))
}

/// Gives every file under `dir` the modification time 0 and makes each
/// timestamp-checked compiled module (`.pyc`, PEP 552 flags 0) say its
/// source's time is 0. romfs stores no times and `mkfs.erofs -T0` writes
/// 0, so every image then shows the interpreter what its compiled files
/// expect, and it loads them as it does from the disk instead of compiling
/// every module again (and failing to write the result).
pub(crate) fn zero_times(dir: &Path) -> Result<()> {
    use std::io::{Read as _, Seek as _, SeekFrom, Write as _};
    for e in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let e = e?;
        let t = e.file_type()?;
        let p = e.path();
        if t.is_dir() {
            zero_times(&p)?;
        } else if t.is_file() {
            let mut f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&p)
                .with_context(|| format!("opening {}", p.display()))?;
            if p.extension().is_some_and(|x| x == "pyc") {
                let mut head = [0u8; 16];
                if f.read_exact(&mut head).is_ok() && head[4..8] == [0; 4] {
                    f.seek(SeekFrom::Start(8))?;
                    f.write_all(&[0; 4])?;
                }
            }
            f.set_modified(std::time::UNIX_EPOCH)
                .with_context(|| format!("setting the time of {}", p.display()))?;
        }
    }
    Ok(())
}

/// Runs the import script with the interpreter at `exe`; returns what it
/// printed.
fn imports(exe: &Path, script: &str) -> Result<String> {
    let out = Command::new(exe)
        .args(["-I", "-S", "-c", script])
        .current_dir("/")
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("starting {}", exe.display()))?;
    if !out.status.success() {
        bail!(
            "{} failed ({}): {}",
            exe.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// A real program's start-up, 1st run on a fresh mount of an image in the
/// page cache and warm runs after it, on every reader of the image.
pub fn realstart(env: &BenchEnv, cfg: &Config) -> Result<Section> {
    let columns = vec![
        Column {
            key: "first",
            label: "1st run",
            unit: Unit::Seconds,
        },
        Column {
            key: "warm",
            label: "warm run",
            unit: Unit::Seconds,
        },
    ];
    let title =
        "realstart: Python importing modules from an image (1st run on a fresh mount, then warm)";
    let mut notes = Vec::new();
    let found = python().and_then(|(exe, lib)| {
        if !have("cp") {
            return Err("cp is not installed".into());
        }
        Ok((exe, lib))
    });
    let (exe, lib) = match found {
        Ok(f) => f,
        Err(why) => {
            notes.push(format!("skipped: {why}"));
            return Ok(Section {
                name: "realstart",
                title: title.into(),
                columns,
                rows: Vec::new(),
                reference: 0,
                pairs: Vec::new(),
                notes,
            });
        }
    };
    progress(cfg, &format!("[realstart] copying {}", lib.display()));
    let src = env.subdir("realstart-src")?;
    let rel = lay_out(&src, &exe, &lib)?;
    zero_times(&src)?;
    let modules = if cfg.quick { QUICK_MODULES } else { MODULES };
    let script = script(modules);
    let printed = imports(&src.join(&rel), &script)?;
    let images = build_images(env, &src, cfg);
    let erofs = images.erofs.clone();
    let foliofs = |label: &str, fstype: &'static str, opts: &str, image| Plan {
        label: label.into(),
        kind: "foliofs",
        how: How::Foliofs {
            fstype,
            opts: opts.into(),
        },
        image,
    };
    let plans = vec![
        foliofs("foliofs erofs", "erofs", "", erofs.clone()),
        foliofs("foliofs erofs directio", "erofs", "directio", erofs.clone()),
        foliofs("foliofs romfs", "romfs", "", images.romfs.clone()),
        foliofs(
            "foliofs erofs, io_uring",
            "erofs",
            "io_uring",
            erofs.clone(),
        ),
        Plan {
            label: "kernel erofs, file-backed".into(),
            kind: "kernel",
            how: How::KernelFile {
                fstype: "erofs",
                opts: String::new(),
            },
            image: erofs.clone(),
        },
        Plan {
            label: "kernel erofs, loop".into(),
            kind: "kernel",
            how: How::KernelLoop { fstype: "erofs" },
            image: erofs,
        },
        Plan {
            label: "kernel squashfs (uncompressed), loop".into(),
            kind: "kernel",
            how: How::KernelLoop { fstype: "squashfs" },
            image: images.squashfs.clone(),
        },
        Plan {
            label: "squashfuse".into(),
            kind: "fuse-peer",
            how: How::Squashfuse,
            image: images.squashfs,
        },
        Plan {
            label: "plain directory (page-cached)".into(),
            kind: "baseline",
            how: How::Plain,
            image: Ok(src.clone()),
        },
    ];
    let reference = plans
        .iter()
        .position(|p| p.kind == "kernel")
        .expect("a kernel row");
    let start = |mnt: &Path| -> Result<f64> {
        time_cmd(
            Command::new(mnt.join(&rel))
                .args(["-I", "-S", "-c", &script])
                .current_dir("/"),
        )
    };
    let steps = [
        Step {
            key: "first",
            fresh: true,
            run: &start,
        },
        Step {
            key: "warm",
            fresh: false,
            run: &start,
        },
    ];
    let (rows, trips, _) = measure(env, cfg, "realstart", &plans, &steps, Prime::Warm);
    let pairs = (0..rows.len())
        .filter(|&i| i != reference)
        .map(|i| (i, reference))
        .collect();
    let (found, loaded) = printed.split_once(' ').unwrap_or((&printed, "?"));
    let files = foliofs_testkit::data::measure_tree(&src)?;
    notes.push(format!(
        "{} -I -S importing {found} of {} modules ({}), which loads {loaded} modules; the image holds the interpreter and {} ({} files, {} MB); 1st run = a fresh mount of an image already in the page cache (as right after unpacking or fetching it; the shared libraries the interpreter and its extension modules link come from the machine, as the host's page cache has them), warm = the same command again; ratios are to the kernel's file-backed EROFS mount{}",
        exe.display(),
        modules.len(),
        modules.join(" "),
        lib.display(),
        files.files,
        files.bytes / 1_000_000,
        if env.root { "" } else { " (none here: it needs root)" }
    ));
    notes.extend(trip_notes(&trips, None));
    notes.extend(crate::rows::uring_note(env));
    Ok(Section {
        name: "realstart",
        title: title.into(),
        columns,
        rows,
        reference,
        pairs,
        notes,
    })
}
