//! What a test needs from the machine, and the skip note when it is
//! missing.

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::{find_program, is_root, oracle, try_run_timeout, user_ids, TEST_USER};

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
/// - `veritysetup`: cryptsetup's `veritysetup` (Debian's `cryptsetup-bin`),
///   the oracle for dm-verity trees;
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
        "veritysetup" => find_program("veritysetup")
            .is_none()
            .then(|| "veritysetup (cryptsetup-bin; `bash scripts/setup` installs it)".to_owned()),
        "romfs-vm" => oracle::NEEDS
            .iter()
            .find(|p| find_program(p).is_none())
            .map(|p| format!("{p} for the romfs oracle's VM (`bash scripts/setup` installs it)")),
        program => find_program(program)
            .is_none()
            .then(|| format!("{program} (`bash scripts/setup` installs it)")),
    }
}

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
