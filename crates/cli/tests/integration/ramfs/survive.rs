//! A supervised ramfs outlives its server: a workload of every kind of
//! change (`survive_workload.py`: creates, writes at offsets, appends,
//! truncates, renames, links, xattrs, a descriptor held open, a shared
//! mapping, SQLite in WAL mode, archives extracted, git commits, an fcntl
//! lock) runs while its server is
//! killed with SIGKILL again and again, each time at a random moment. The
//! workload must see no error and, at the end, every file as its model of
//! acknowledged operations says (none lost, none applied twice), with
//! statfs's inode and block counts matching the tree. As root and as a
//! user.
//!
//! Kills per run: `FOLIOFS_CRASH_KILLS` (default 40 as root, 20 as a
//! user, about half a minute each); a campaign by hand sets it to
//! hundreds. Each prints how soon the workload went on after each kill.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{self, user_command, Mount, TEST_USER};

const WORKLOAD: &str = include_str!("survive_workload.py");

fn kills(default: u32) -> u32 {
    std::env::var("FOLIOFS_CRASH_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// CLOCK_MONOTONIC in seconds: the clock Python's `time.monotonic` reads.
fn monotonic() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid timespec for the call to fill.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

/// How soon after each kill the workload's next operation completed: the
/// first operation slower than 2 ms to end after the kill (and before the
/// next one). Kills that caught no operation waiting are left out.
fn resumes(kills: &[f64], slow: &[(f64, f64)]) -> Vec<f64> {
    let mut out = Vec::new();
    for (i, &k) in kills.iter().enumerate() {
        let next = kills.get(i + 1).copied().unwrap_or(f64::MAX);
        if let Some(end) = slow
            .iter()
            .filter(|(t0, t1)| *t1 > k && *t1 < next && *t0 < k + 1.0)
            .map(|&(_, t1)| t1)
            .reduce(f64::min)
        {
            out.push(end - k);
        }
    }
    out.sort_by(f64::total_cmp);
    out
}

fn python() -> &'static str {
    if Path::new("/usr/bin/python3").exists() {
        "/usr/bin/python3"
    } else {
        "python3"
    }
}

struct Workload {
    child: Child,
    dir: tempfile::TempDir,
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_workload(user: Option<&str>, mnt: &Path, seed: u64) -> Workload {
    let dir = match user {
        Some(u) => common::user_tempdir(u),
        None => tempfile::tempdir().unwrap(),
    };
    let script = dir.path().join("workload.py");
    std::fs::write(&script, WORKLOAD).unwrap();
    let mut cmd = match user {
        Some(u) => user_command(u, python()),
        None => Command::new(python()),
    };
    cmd.arg(&script)
        .arg(mnt)
        .arg(dir.path().join("stop"))
        .arg(dir.path().join("report.json"))
        .arg(seed.to_string())
        .stdin(Stdio::null());
    let child = cmd.spawn().unwrap();
    let ready = dir.path().join("READY");
    assert!(
        common::wait_until(Duration::from_secs(30), || ready.exists()),
        "the workload did not start"
    );
    Workload { child, dir }
}

/// How a campaign replaces the server.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// `kill -9`.
    Kill,
    /// `foliofs takeover` (an upgrade in place).
    Takeover,
}

/// Mounts a supervised ramfs (as `user` where given) with `opts`, runs the
/// workload on it and kills its server `n` times; asserts nothing was
/// lost or done twice.
fn campaign(user: Option<&str>, opts: &str, n: u32, seed: u64) {
    campaign_by(user, opts, n, seed, Stop::Kill)
}

fn campaign_by(user: Option<&str>, opts: &str, n: u32, seed: u64, how: Stop) {
    let m = match user {
        Some(u) => Mount::as_user(u, Path::new("none"), Some("ramfs"), opts),
        None => Mount::new(Path::new("none"), Some("ramfs"), opts),
    }
    .unwrap();
    let line = common::mounts_line_of(user, m.path());
    assert!(
        line.contains("supervised") && line.contains("survives=all"),
        "{line}"
    );
    // Where the kernel passes files through (root, by default), it does so
    // under supervision too.
    let passed = user.is_none() && !opts.contains("nopassthrough");
    assert!(
        line.contains(if passed {
            "data=passthrough"
        } else {
            "data=server"
        }),
        "{line}"
    );
    let mut w = start_workload(user, m.path(), seed);
    let mut rng = common::rng(seed);
    let mut kill_times = Vec::new();
    let started = Instant::now();
    for k in 1..=n {
        let pid = common::server_pid(user, m.path());
        // A moment at random in the server's life, once it has served
        // long enough to count as well (a server that dies younger is one
        // that keeps dying, and is given up).
        let wait = 550 + rand::Rng::gen_range(&mut rng, 0..300);
        std::thread::sleep(Duration::from_millis(wait));
        if let Ok(Some(st)) = w.child.try_wait() {
            panic!("the workload ended early ({st}) at kill {k}");
        }
        kill_times.push(monotonic());
        match how {
            Stop::Kill => nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            )
            .unwrap(),
            Stop::Takeover => {
                let mut cmd = match user {
                    Some(u) => user_command(u, common::bin()),
                    None => Command::new(common::bin()),
                };
                let out =
                    common::run_timeout(cmd.arg("takeover").arg(m.path()), Duration::from_secs(60));
                assert!(out.status.success(), "takeover {k}: {out:?}");
            }
        }
        assert!(
            common::wait_until(Duration::from_secs(30), || {
                let l = common::mounts_line_of(user, m.path());
                l.contains(&format!("restarts={k}")) && common::server_pid(user, m.path()) != pid
            }),
            "no server after kill {k}: {}",
            common::mounts_line_of(user, m.path())
        );
    }
    let took = started.elapsed();
    std::fs::write(w.dir.path().join("stop"), "").unwrap();
    let report = w.dir.path().join("report.json");
    assert!(
        common::wait_until(Duration::from_secs(120), || report.exists()
            && w.child.try_wait().ok().flatten().is_some()),
        "the workload did not finish"
    );
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    let errors = r["errors"].as_array().unwrap();
    let mismatches = r["mismatches"].as_array().unwrap();
    assert!(errors.is_empty(), "the workload failed: {errors:?}");
    assert!(mismatches.is_empty(), "the tree differs: {mismatches:?}");
    assert_eq!(r["lock_held"], true, "the fcntl lock did not survive");
    let slow: Vec<(f64, f64)> = r["slow"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p[0].as_f64().unwrap(), p[1].as_f64().unwrap()))
        .collect();
    let res = resumes(&kill_times, &slow);
    let ms = |q: f64| res[((res.len() - 1) as f64 * q) as usize] * 1e3;
    eprintln!(
        "campaign ({}, -o {opts}): {n} {} in {:.0} s, {} operations acknowledged, 0 lost, 0 twice, {} SQLite commits, {} archives extracted, {} git commits; the workload went on after {} of them (those that caught it waiting): median {:.1} ms, 90% {:.1} ms, most {:.1} ms",
        user.unwrap_or("root"),
        if how == Stop::Kill { "kills" } else { "takeovers" },
        took.as_secs_f64(),
        r["ops"],
        r["sqlite_rows"],
        r["counts"]["untar"],
        r["git_commits"],
        res.len(),
        if res.is_empty() { 0.0 } else { ms(0.5) },
        if res.is_empty() { 0.0 } else { ms(0.9) },
        if res.is_empty() { 0.0 } else { ms(1.0) },
    );
    let line = common::mounts_line_of(user, m.path());
    assert!(line.contains(&format!("restarts={n}")), "{line}");
    drop(w);
    drop(m);
}

#[test]
fn a_root_ramfs_survives_its_server_killed_under_a_workload() {
    require!("fuse");
    campaign(None, "noio_uring", kills(40), 1);
}

#[test]
fn a_root_ramfs_on_the_server_path_survives_its_server_killed() {
    require!("fuse");
    campaign(None, "nopassthrough,noio_uring", kills(20), 3);
}

/// An upgrade in place under the same workload: `foliofs takeover` stops
/// the running server and starts the binary on disk on the same state.
#[test]
fn a_ramfs_is_taken_over_under_a_workload() {
    require!("fuse");
    campaign_by(None, "noio_uring", kills(40) / 4, 4, Stop::Takeover);
}

#[test]
fn a_users_ramfs_is_taken_over_under_a_workload() {
    require!("user-fuse");
    campaign_by(
        Some(TEST_USER),
        "noio_uring",
        kills(20) / 4,
        5,
        Stop::Takeover,
    );
}

#[test]
fn a_users_ramfs_survives_its_server_killed_under_a_workload() {
    require!("user-fuse");
    campaign(Some(TEST_USER), "noio_uring", kills(20), 2);
}

/// The tree the salvage tests write, as `user` where given.
const TREE: &str = r#"set -e
cd "$1"
mkdir -p a/b/c empty-dir
head -c 3000000 /dev/urandom > a/big
printf hello > a/b/small
ln -s ../small a/b/c/link
ln a/big a/hard
: > empty
i=1
while [ $i -le 40 ]; do head -c $((i * 997)) /dev/urandom > a/b/c/f$i; i=$((i + 1)); done
chmod 600 a/b/c/f7
"#;

/// A ramfs whose servers keep dying is given up: the mount ends, the
/// supervisor saves its state and says where, and `foliofs salvage`
/// recreates every file from it, as they were before.
fn given_up_and_salvaged(user: Option<&str>) {
    let saved = match user {
        Some(u) => common::user_tempdir(u),
        None => tempfile::tempdir().unwrap(),
    };
    let mnt = match user {
        Some(u) => common::user_tempdir(u),
        None => tempfile::tempdir().unwrap(),
    };
    let mut cmd = match user {
        Some(u) => user_command(u, "env"),
        None => Command::new("env"),
    };
    cmd.arg(format!("FOLIOFS_SALVAGE_DIR={}", saved.path().display()))
        .arg(common::bin())
        .args(["mount", "-t", "ramfs", "-o", "noio_uring", "none"])
        .arg(mnt.path());
    let m = Mount::by_command(user, &mut cmd, mnt.path()).unwrap();
    let out = match user {
        Some(u) => common::sh_as_user(u, TREE, &[m.path()]),
        None => common::run_timeout(
            Command::new("/bin/sh")
                .args(["-c", TREE, "sh"])
                .arg(m.path()),
            Duration::from_secs(60),
        ),
    };
    assert!(out.status.success(), "{out:?}");
    let before = common::listing(user, m.path());
    let line = common::mounts_line_of(user, m.path());
    let supervisor = common::mount_pid(user, m.path());
    // Each server killed as soon as it serves: one that keeps dying.
    for k in 1..=5u32 {
        let pid = common::server_pid(user, m.path());
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        if k < 5 {
            assert!(
                common::wait_until(Duration::from_secs(30), || {
                    common::mounts_line_of(user, m.path()).contains(&format!("restarts={k}"))
                        && common::server_pid(user, m.path()) != pid
                }),
                "no server after kill {k}: {line}"
            );
        }
    }
    assert!(
        common::wait_until(Duration::from_secs(30), || !common::is_mounted(m.path())
            && !Path::new(&format!("/proc/{supervisor}")).exists()),
        "the mount or its supervisor is still there after five quick deaths"
    );
    drop(m);
    let kept: Vec<_> = std::fs::read_dir(saved.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(kept.len(), 1, "one saved state expected: {kept:?}");
    let to = match user {
        Some(u) => common::user_tempdir(u),
        None => tempfile::tempdir().unwrap(),
    };
    let dest = to.path().join("out");
    let mut salvage = match user {
        Some(u) => user_command(u, common::bin()),
        None => Command::new(common::bin()),
    };
    let out = common::run_timeout(
        salvage.arg("salvage").arg(&kept[0]).arg(&dest),
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "salvage: {out:?}");
    assert_eq!(
        common::listing(user, &dest),
        before,
        "the salvaged tree differs"
    );
}

#[test]
fn a_ramfs_given_up_is_salvaged() {
    require!("fuse");
    given_up_and_salvaged(None);
}

#[test]
fn a_users_ramfs_given_up_is_salvaged() {
    require!("user-fuse");
    given_up_and_salvaged(Some(TEST_USER));
}
