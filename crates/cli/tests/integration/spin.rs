//! Polling for the next request (`spin=`): while requests come, a server
//! thread reads its `/dev/fuse` descriptor without sleeping (the descriptor
//! is non-blocking); once they stop it sleeps again and the server uses no
//! CPU. On by default for a ramfs, off for images.

use std::fs;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use foliofs_fuse::server::spin::cpu_stall_us;

use crate::common::{self, server_pid, user_command, Mount, TEST_USER};

/// Whether a `/dev/fuse` descriptor of process `pid` is non-blocking.
fn polling(pid: u32) -> bool {
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
        return false;
    };
    fds.flatten().any(|e| {
        let info = format!("/proc/{pid}/fdinfo/{}", e.file_name().to_string_lossy());
        fs::read_link(e.path()).is_ok_and(|t| t == Path::new("/dev/fuse"))
            && fs::read_to_string(info)
                .ok()
                .and_then(|t| {
                    t.lines()
                        .find_map(|l| l.strip_prefix("flags:"))
                        .and_then(|f| u32::from_str_radix(f.trim(), 8).ok())
                })
                .is_some_and(|f| f & libc::O_NONBLOCK as u32 != 0)
    })
}

/// What [`watch`] saw.
struct Seen {
    /// The server polled while requests came.
    polled: bool,
    /// It stopped within two seconds of the last request.
    stopped: bool,
    /// Its CPU time over the half second after that.
    idle_cpu: Duration,
    /// The machine's CPU pressure while requests came: the share of the
    /// time in which some task waited for a CPU.
    pressure: f64,
    /// The polling option `foliofs mounts` showed: `spin=US` or `nospin`.
    shown: String,
}

impl Seen {
    /// Whether the server polled, or was right not to: the machine was
    /// too busy (the server stops polling past `PRESSURE_LIMIT`, and other
    /// tests may share the machine).
    fn polled_or_busy(&self, what: &str) -> bool {
        if !self.polled && self.pressure > foliofs_fuse::server::spin::PRESSURE_LIMIT / 2.0 {
            eprintln!(
                "{what}: did not poll, with CPU pressure {:.2} (other work on the machine)",
                self.pressure
            );
            return true;
        }
        self.polled
    }
}

/// CPU time process `pid` has used so far (user and system).
fn cpu_time(pid: u32) -> Duration {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields from the state on (the third of stat(5)): utime and stime are
    // the 14th and 15th.
    let rest: Vec<&str> = stat.rsplit_once(") ").unwrap().1.split(' ').collect();
    let ticks: u64 = rest[11].parse::<u64>().unwrap() + rest[12].parse::<u64>().unwrap();
    // SAFETY: sysconf has no memory-safety preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    Duration::from_millis(ticks * 1000 / hz)
}

/// A shell, as `user` where given, that keeps asking the mount at `dir`
/// whether a file is a terminal (a FUSE ioctl the kernel never caches, so
/// each one is a request) for `secs` seconds.
fn requests(user: Option<&str>, dir: &Path, secs: u32) -> Child {
    // `test -t` fails on a file that is not a terminal: what matters is the
    // request, so only a file that cannot be read fails the loop.
    let script = r#"cat "$1/f" > /dev/null || exit 3; end=$(( $(date +%s) + $2 )); while [ "$(date +%s)" -lt "$end" ]; do for i in 1 2 3 4 5 6 7 8 9 10; do test -t 0 < "$1/f"; done; done; exit 0"#;
    let mut cmd = match user {
        Some(u) => user_command(u, "sh"),
        None => Command::new("sh"),
    };
    cmd.args(["-c", script, "sh"])
        .arg(dir)
        .arg(secs.to_string())
        .stdin(Stdio::null())
        .spawn()
        .unwrap()
}

/// Mounts `source` with `opts` (as `user`), puts a file `f` in it where it
/// is a ramfs, and sends it requests for two seconds.
fn watch(user: Option<&str>, source: &Path, fstype: Option<&str>, opts: &str) -> Seen {
    let m = match user {
        Some(u) => Mount::as_user(u, source, fstype, opts),
        None => Mount::new(source, fstype, opts),
    }
    .unwrap();
    if fstype == Some("ramfs") {
        match user {
            Some(u) => {
                let out = common::sh_as_user(u, r#"echo hi > "$1/f""#, &[m.path()]);
                assert!(out.status.success(), "writing f: {out:?}");
            }
            None => fs::write(m.path().join("f"), b"hi\n").unwrap(),
        }
    }
    let pid = server_pid(user, m.path());
    let line = common::mounts_line_of(user, m.path());
    let shown = line
        .split([' ', ','])
        .find(|o| *o == "nospin" || o.starts_with("spin="))
        .unwrap_or_else(|| panic!("no polling option in {line}"))
        .to_owned();
    let mut child = requests(user, m.path(), 2);
    let stalled = cpu_stall_us();
    let start = Instant::now();
    let mut polled = false;
    while start.elapsed() < Duration::from_secs(2) && !polled {
        polled = polling(pid);
        std::thread::sleep(Duration::from_millis(2));
    }
    let pressure = match (stalled, cpu_stall_us()) {
        (Some(a), Some(b)) => b.saturating_sub(a) as f64 / start.elapsed().as_micros() as f64,
        _ => 0.0,
    };
    let status = wait(&mut child, Duration::from_secs(10));
    assert!(status.success(), "the request loop failed: {status}");
    let stopped = common::wait_until(Duration::from_secs(2), || !polling(pid));
    let before = cpu_time(pid);
    std::thread::sleep(Duration::from_millis(500));
    let idle_cpu = cpu_time(pid).saturating_sub(before);
    m.unmount().unwrap();
    Seen {
        polled,
        stopped,
        idle_cpu,
        pressure,
        shown,
    }
}

/// Waits for `child` up to `timeout`, killing it past that.
fn wait(child: &mut Child, timeout: Duration) -> std::process::ExitStatus {
    let end = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > end {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the request loop ran past {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether a ramfs polls by default is measured on the host at mount
/// (`spin::default_window`); asked to, it polls while requests come, and
/// stops once they stop.
#[test]
fn a_ramfs_polls_while_requests_come_and_sleeps_after() {
    for user in [None, Some(TEST_USER)] {
        let seen = watch(
            user,
            Path::new("none"),
            Some("ramfs"),
            "spin=1000,noio_uring",
        );
        let what = format!("{user:?}");
        assert_eq!(seen.shown, "spin=1000", "{what}");
        assert!(
            seen.polled_or_busy(&what),
            "{what}: did not poll while requests came"
        );
        assert!(
            seen.stopped,
            "{what}: still polling 2 s after the last request"
        );
        assert!(
            seen.idle_cpu < Duration::from_millis(100),
            "{what}: the idle server used {:?} of CPU in 0.5 s",
            seen.idle_cpu
        );
    }
}

#[test]
fn nospin_and_images_do_not_poll_unless_asked() {
    let tmp = tempfile::tempdir().unwrap();
    let img = common::one_file_romfs(tmp.path());
    let seen = watch(None, Path::new("none"), Some("ramfs"), "nospin");
    assert!(!seen.polled, "a ramfs with nospin polled");
    assert_eq!(seen.shown, "nospin");
    let seen = watch(None, &img, None, "");
    assert!(!seen.polled, "an image mount polled without spin=");
    assert_eq!(seen.shown, "nospin");
    let seen = watch(None, &img, None, "spin=500");
    assert_eq!(seen.shown, "spin=500");
    assert!(
        seen.polled_or_busy("spin=500"),
        "an image mount with spin=500 did not poll"
    );
    assert!(seen.stopped, "an image mount with spin=500 polled on");
    assert!(
        seen.idle_cpu < Duration::from_millis(100),
        "idle CPU {:?}",
        seen.idle_cpu
    );
}
