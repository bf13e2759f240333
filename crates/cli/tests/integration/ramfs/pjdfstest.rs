//! The whole pjdfstest 0.2.2 suite on a ramfs mount: 0 failures, on root's
//! mount and on one the user `tests` made (whose server then runs without
//! any privilege: ownership, modes and device nodes are its own records).
//!
//! pjdfstest switches to the users of its `dummy_auth` list, so the mount
//! needs `allow_other` and a user `tests` must exist (`.ci/run` installs the
//! tool and adds the user).

use crate::common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{run_timeout, FuseConf, Mount, TEST_USER};

const CONFIG: &str = r#"
[features]
posix_fallocate = {}
utime_now = {}
utimensat = {}
rename_ctime = {}

[settings]
naptime = 0.02
allow_remount = false

[dummy_auth]
entries = [["nobody", "nogroup"], ["tests", "tests"]]
"#;

fn run_suite(opts: &str) {
    run_suite_on(
        Mount::new(Path::new("none"), Some("ramfs"), opts).unwrap(),
        opts,
    );
}

fn run_suite_on(m: Mount, opts: &str) {
    let tool = common::cargo_tool("pjdfstest");
    let has_user = Command::new("id")
        .arg("tests")
        .output()
        .unwrap()
        .status
        .success();
    assert!(
        has_user,
        "pjdfstest needs a user `tests`: useradd -M -r -s /usr/sbin/nologin tests (.ci/run does)"
    );
    let work = m.path().join("pjd");
    fs::create_dir(&work).unwrap();
    fs::set_permissions(&work, fs::Permissions::from_mode(0o755)).unwrap();
    let cfg = tempfile::NamedTempFile::new().unwrap();
    fs::write(cfg.path(), CONFIG).unwrap();
    let out = run_timeout(
        Command::new(tool)
            .arg("-c")
            .arg(cfg.path())
            .arg("-p")
            .arg(&work),
        Duration::from_secs(900),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let summary = stdout
        .lines()
        .find(|l| l.starts_with("Summary:"))
        .unwrap_or_else(|| {
            panic!(
                "no summary from pjdfstest ({}):\n{stdout}\n{stderr}",
                out.status
            )
        });
    eprintln!("pjdfstest -o {opts}: {summary}");
    let failed: Vec<&str> = stdout
        .lines()
        .filter(|l| l.trim_end().ends_with("FAILED"))
        .collect();
    assert!(
        out.status.success() && summary.starts_with("Summary: 0 failed") && failed.is_empty(),
        "pjdfstest on ramfs -o {opts}: {summary}\n{}\n--- full output ---\n{stdout}\n{stderr}",
        failed.join("\n")
    );
    // The suite ran for real: most of its tests passed, none were lost.
    let passed: u32 = summary
        .split(", ")
        .find_map(|p| p.strip_suffix(" passed"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    assert!(passed >= 380, "only {passed} tests passed: {summary}");
}

#[test]
fn pjdfstest_suite_passes_at_default_block_size() {
    require!("fuse", "pjdfstest");
    run_suite("allow_other");
}

#[test]
fn pjdfstest_suite_passes_at_2m_blocks() {
    require!("fuse", "pjdfstest");
    run_suite("allow_other,blocksize=2M");
}

#[test]
fn pjdfstest_suite_passes_on_a_users_mount() {
    require!("user-fuse", "pjdfstest");
    // A user's allow_other needs user_allow_other.
    let _conf = FuseConf::set("user_allow_other\n");
    let m = Mount::as_user(TEST_USER, Path::new("none"), Some("ramfs"), "allow_other").unwrap();
    run_suite_on(m, "allow_other (mounted by the user)");
}
