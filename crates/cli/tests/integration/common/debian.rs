//! A Debian root as `debootstrap --variant=minbase` makes it, made once
//! per test process (it takes minutes) and shared by the tests that use
//! it; removed when the process exits.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use super::try_run_timeout;

/// The shared root (see [`debian_root`]), or `None` after one `skip:` line
/// naming the calling test. The caller has `require!`d `root` and
/// `debootstrap`.
#[macro_export]
macro_rules! debian_root {
    () => {{
        fn here() {}
        $crate::common::debian_root($crate::common::fn_path(std::any::type_name_of_val(&here)))
    }};
}

/// This machine's Debian release and the archive apt fetches it from, as
/// its own configuration names them.
pub fn debian_archive() -> Option<(String, String)> {
    let release = fs::read_to_string("/etc/os-release").ok()?;
    let codename = release
        .lines()
        .find_map(|l| l.strip_prefix("VERSION_CODENAME="))?
        .trim_matches('"')
        .to_owned();
    let mut texts: Vec<String> = fs::read_to_string("/etc/apt/sources.list")
        .into_iter()
        .collect();
    if let Ok(dir) = fs::read_dir("/etc/apt/sources.list.d") {
        let mut names: Vec<_> = dir.flatten().map(|e| e.path()).collect();
        names.sort();
        texts.extend(names.iter().filter_map(|p| fs::read_to_string(p).ok()));
    }
    for text in &texts {
        // One-line form: deb [opts] URI SUITE COMPONENTS...
        for l in text.lines() {
            let w: Vec<&str> = l
                .split_whitespace()
                .filter(|w| !w.starts_with('['))
                .collect();
            if w.len() >= 3 && w[0] == "deb" && w[2] == codename {
                return Some((codename.clone(), w[1].to_owned()));
            }
        }
        // deb822 form: stanzas of URIs and Suites.
        for stanza in text.split("\n\n") {
            let field = |k: &str| {
                stanza
                    .lines()
                    .find_map(|l| l.strip_prefix(k))
                    .map(str::trim)
            };
            if field("Types:").is_some_and(|t| t.split_whitespace().any(|t| t == "deb"))
                && field("Suites:").is_some_and(|s| s.split_whitespace().any(|s| s == codename))
            {
                if let Some(uri) = field("URIs:").and_then(|u| u.split_whitespace().next()) {
                    return Some((codename.clone(), uri.to_owned()));
                }
            }
        }
    }
    None
}

/// The root, or why there is none: `Err(None)` when apt's sources name
/// no archive for this release, `Err(Some(why))` when debootstrap failed.
type Made = Result<PathBuf, Option<String>>;

static ROOT: OnceLock<Made> = OnceLock::new();

/// The path of a Debian root that `debootstrap --variant=minbase` made of
/// this machine's release from the archive apt's sources name (see
/// [`debian_archive`]): made by the first caller in this process (the
/// others wait for it), removed when the process exits. Shared, so never
/// to be changed: a test that changes it works on its own copy
/// (`cp -a ROOT/. COPY`). `None`, after one `skip:` line naming `what`,
/// when apt's sources name no archive; a failed debootstrap panics with
/// its last line, in every caller.
pub fn debian_root(what: &str) -> Option<&'static Path> {
    match ROOT.get_or_init(debootstrap) {
        Ok(p) => Some(p),
        Err(None) => {
            let _ = writeln!(
                std::io::stderr().lock(),
                "skip: {what}: needs a Debian archive in apt's sources to debootstrap from"
            );
            None
        }
        Err(Some(why)) => panic!("{why}"),
    }
}

fn debootstrap() -> Made {
    let (release, archive) = debian_archive().ok_or(None)?;
    let dir = tempfile::Builder::new()
        .prefix("foliofs-debootstrap.")
        .tempdir()
        .map_err(|e| Some(format!("a directory for debootstrap: {e}")))?
        .keep();
    // SAFETY: registers a plain function to run at exit; it only reads
    // ROOT, which is set (below) before the process can exit normally.
    unsafe { libc::atexit(remove_root) };
    let root = dir.join("root");
    // A failure is kept, not panicked on here: the next caller would
    // otherwise try again, for as long again.
    let failed = match try_run_timeout(
        Command::new("debootstrap")
            .args(["--variant=minbase", &release])
            .arg(&root)
            .arg(&archive),
        Duration::from_secs(900),
    ) {
        Ok(out) if out.status.success() => return Ok(root),
        Ok(out) => String::from_utf8_lossy(&out.stdout)
            .lines()
            .chain(String::from_utf8_lossy(&out.stderr).lines())
            .last()
            .unwrap_or_default()
            .to_owned(),
        Err(why) => why,
    };
    let _ = fs::remove_dir_all(&dir);
    Err(Some(format!(
        "debootstrap {release} from {archive}: {failed}"
    )))
}

/// At exit: the shared root's directory, gone.
extern "C" fn remove_root() {
    if let Some(Ok(root)) = ROOT.get() {
        if let Some(dir) = root.parent() {
            let _ = fs::remove_dir_all(dir);
        }
    }
}
