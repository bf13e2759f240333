//! ramfs under memory pressure: a server whose memory limit (a memory
//! cgroup's, `ulimit -v`) is below `size=` refuses writes past it with
//! ENOSPC at `write(2)`, lives, keeps every byte it acknowledged, and its
//! mount goes on working. Writes are `dd`'s own, of several sizes, from a
//! random file whose prefix is the truth each file is checked against.

use crate::common;

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use sha2::{Digest, Sha256};

use common::{run_timeout, sh_as_user, Mount, TEST_USER};

const MIB: u64 = 1 << 20;
/// The random file writes are copied from: larger than any limit here.
const SOURCE_SIZE: u64 = 512 * MIB;

/// `sh -c SCRIPT sh ARGS` as `user`, or as this process, bounded.
fn sh(user: Option<&str>, script: &str, args: &[&str]) -> Output {
    match user {
        Some(u) => sh_as_user(u, script, args),
        None => run_timeout(
            Command::new("/bin/sh")
                .args(["-c", script, "sh"])
                .args(args)
                .current_dir("/"),
            Duration::from_secs(120),
        ),
    }
}

/// The sha256 of the first `n` bytes of `path`.
fn sha_of_prefix(path: &Path, n: u64) -> String {
    let mut h = Sha256::new();
    let mut f = File::open(path).unwrap().take(n);
    std::io::copy(&mut f, &mut h).unwrap();
    format!("{:x}", h.finalize())
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

/// A memory cgroup of its own under this process's, v1 or v2, removed
/// when dropped (what is still in it goes back to the parent first).
struct Cgroup {
    dir: PathBuf,
    v2: bool,
}

impl Cgroup {
    /// A child cgroup limited to `limit` bytes, or why there cannot be one.
    fn new(limit: u64) -> Result<Cgroup, String> {
        let own = std::fs::read_to_string("/proc/self/cgroup").map_err(|e| e.to_string())?;
        let v1 = own.lines().find_map(|l| {
            let mut it = l.splitn(3, ':');
            let (_, ctrls, path) = (it.next()?, it.next()?, it.next()?);
            ctrls
                .split(',')
                .any(|c| c == "memory")
                .then(|| path.to_owned())
        });
        let (base, v2, file) = match v1 {
            Some(p) => (
                PathBuf::from("/sys/fs/cgroup/memory").join(p.trim_start_matches('/')),
                false,
                "memory.limit_in_bytes",
            ),
            None => {
                let p = own
                    .lines()
                    .find_map(|l| l.strip_prefix("0::"))
                    .ok_or("no memory cgroup")?;
                (
                    PathBuf::from("/sys/fs/cgroup").join(p.trim_start_matches('/')),
                    true,
                    "memory.max",
                )
            }
        };
        if !base.is_dir() {
            return Err(format!("{} is not mounted here", base.display()));
        }
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = base.join(format!("foliofs-pressure.{}.{n}", std::process::id()));
        std::fs::create_dir(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
        let cg = Cgroup { dir, v2 };
        std::fs::write(cg.dir.join(file), limit.to_string()).map_err(|e| {
            format!(
                "{}: {e} (v2 needs the memory controller delegated to this subtree)",
                cg.dir.join(file).display()
            )
        })?;
        Ok(cg)
    }

    fn limit_file(&self) -> &'static str {
        if self.v2 {
            "memory.max"
        } else {
            "memory.limit_in_bytes"
        }
    }

    /// Times its OOM killer killed something in it.
    fn oom_kills(&self) -> u64 {
        let file = if self.v2 {
            "memory.events"
        } else {
            "memory.oom_control"
        };
        let text = std::fs::read_to_string(self.dir.join(file)).unwrap();
        text.lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .map(|v| v.trim().parse().unwrap())
            .unwrap_or_else(|| panic!("no oom_kill in {file}: {text}"))
    }

    /// The most it ever used.
    fn peak(&self) -> Option<u64> {
        let file = if self.v2 {
            "memory.peak"
        } else {
            "memory.max_usage_in_bytes"
        };
        std::fs::read_to_string(self.dir.join(file))
            .ok()?
            .trim()
            .parse()
            .ok()
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let parent = self.dir.parent().unwrap().join("cgroup.procs");
        let gone = common::wait_until(Duration::from_secs(10), || {
            let procs = std::fs::read_to_string(self.dir.join("cgroup.procs")).unwrap_or_default();
            for pid in procs.split_whitespace() {
                let _ = std::fs::write(&parent, pid);
            }
            std::fs::remove_dir(&self.dir).is_ok() || !self.dir.exists()
        });
        if !gone {
            eprintln!("warning: could not remove {}", self.dir.display());
        }
    }
}

/// What one `dd` into the mount did.
struct Fill {
    bytes: u64,
    stderr: String,
}

/// Copies `src` into `file` with `dd bs=BS` until it stops.
fn fill(user: Option<&str>, src: &Path, file: &Path, bs: &str) -> Fill {
    let out = sh(
        user,
        r#"dd if="$1" of="$2" bs="$3" 2>&1 >/dev/null"#,
        &[src.to_str().unwrap(), file.to_str().unwrap(), bs],
    );
    let stderr = String::from_utf8_lossy(&out.stdout).into_owned();
    let bytes = stderr
        .lines()
        .find_map(|l| l.split_once(" bytes")?.0.trim().parse().ok())
        .unwrap_or_else(|| panic!("no byte count from dd: {stderr}"));
    Fill { bytes, stderr }
}

fn sha_in_mount(user: Option<&str>, file: &Path) -> String {
    let out = sh(user, r#"sha256sum "$1""#, &[file.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "sha256sum {}: {}",
        file.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    text.split(' ').next().unwrap().to_owned()
}

/// Mounts a ramfs of `opts` with `size=1G` through `prefix` (the shell
/// that puts the server under its limit), checks the warning names
/// `limit_name` and `limit_value`, then fills it with writes of 1M, 64K
/// and 4K, each until ENOSPC: at least `min_bytes` and at most `limit`
/// acknowledged, the server alive, the bytes read back right, the file
/// deleted; then a last write and read on the same mount.
#[allow(clippy::too_many_arguments)]
fn fill_past_the_limit(
    user: Option<&str>,
    prefix: &str,
    opts: &str,
    limit: u64,
    limit_name: &str,
    limit_value: &str,
    after_each: &dyn Fn(u32),
) {
    let tmp = match user {
        Some(u) => common::user_tempdir(u),
        None => tempfile::tempdir().unwrap(),
    };
    let src = tmp.path().join("source");
    common::write_random_file(&src, SOURCE_SIZE, 28);
    if let Some((uid, gid)) = user.and_then(common::user_ids) {
        std::os::unix::fs::chown(&src, Some(uid), Some(gid)).unwrap();
    }
    let dir = tmp.path().join("mnt");
    std::fs::create_dir(&dir).unwrap();
    if let Some((uid, gid)) = user.and_then(common::user_ids) {
        std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).unwrap();
    }
    let script = format!(r#"{prefix} && exec "$1" mount -t ramfs -o "$2" none "$3""#);
    let bin = common::bin();
    let opts = if opts.is_empty() {
        "size=1G".to_owned()
    } else {
        format!("size=1G,{opts}")
    };
    let args = [bin.to_str().unwrap(), &opts, dir.to_str().unwrap()];
    let mut cmd = match user {
        Some(u) => common::user_command(u, "/bin/sh"),
        None => Command::new("/bin/sh"),
    };
    cmd.args(["-c", &script, "sh"]).args(args);
    let (mount, out) = Mount::by_command_output(user, &mut cmd, &dir)
        .unwrap_or_else(|e| panic!("mounting under `{prefix}`: {e}"));
    let warning = String::from_utf8_lossy(&out.stderr);
    assert!(
        warning.contains("size=1G is above this server's memory limit")
            && warning.contains(&format!("{limit_name} is {limit_value}"))
            && warning.contains("ENOSPC"),
        "the mount names the limit below size= ({limit_name} {limit_value}): {warning:?}"
    );
    assert_eq!(
        warning.trim_end().lines().count(),
        1,
        "one line: {warning:?}"
    );
    let pid = common::server_pid(user, &dir);
    let min_bytes = limit / 2;
    for bs in ["1M", "64K", "4K"] {
        let file = dir.join(format!("f.{bs}"));
        let f = fill(user, &src, &file, bs);
        assert!(
            f.stderr.contains("No space left on device"),
            "bs={bs}: the write past the limit fails with ENOSPC: {}",
            f.stderr
        );
        assert!(alive(pid), "bs={bs}: the server {pid} lives");
        assert!(
            (min_bytes..limit).contains(&f.bytes),
            "bs={bs}: {} MiB acknowledged under a limit of {} MiB",
            f.bytes / MIB,
            limit / MIB
        );
        assert_eq!(
            sha_in_mount(user, &file),
            sha_of_prefix(&src, f.bytes),
            "bs={bs}: the {} bytes acknowledged read back",
            f.bytes
        );
        // Allocating is held to the same limit.
        let fa = dir.join(format!("fa.{bs}"));
        let out = sh(
            user,
            r#"fallocate -l 64M "$1" 2>&1"#,
            &[fa.to_str().unwrap()],
        );
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            !out.status.success() && said.contains("No space left on device"),
            "bs={bs}: fallocate past the limit fails with ENOSPC: {said}"
        );
        after_each(pid);
        let _ = sh(user, r#"rm -f "$1""#, &[fa.to_str().unwrap()]);
        let rm = sh(user, r#"rm "$1""#, &[file.to_str().unwrap()]);
        assert!(
            rm.status.success(),
            "rm: {}",
            String::from_utf8_lossy(&rm.stderr)
        );
    }
    // Deleting gave the memory back: the mount takes new data.
    let again = dir.join("again");
    let out = sh(
        user,
        r#"dd if="$1" of="$2" bs=1M count=16 2>&1"#,
        &[src.to_str().unwrap(), again.to_str().unwrap()],
    );
    assert!(
        out.status.success(),
        "write after delete: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(sha_in_mount(user, &again), sha_of_prefix(&src, 16 * MIB));
    assert!(alive(pid), "the server {pid} lives");
    mount.unmount().unwrap();
}

#[test]
fn a_cgroup_limit_below_size_fails_writes_with_enospc_and_no_oom_kill() {
    require!("fuse", "dd", "sha256sum", "fallocate");
    let limit = 256 * MIB;
    let cg = match Cgroup::new(limit) {
        Ok(c) => c,
        Err(why) => {
            eprintln!("skipped: a memory cgroup of the test's own: {why}");
            return;
        }
    };
    let procs = cg.dir.join("cgroup.procs");
    let prefix = format!("echo $$ > {}", procs.display());
    let name = cg.dir.join(cg.limit_file()).display().to_string();
    let check = |_pid: u32| {
        assert_eq!(cg.oom_kills(), 0, "no OOM kill in {}", cg.dir.display());
        // Actual use stays under the limit with room to spare.
        if let Some(peak) = cg.peak() {
            assert!(
                peak + 8 * MIB <= limit,
                "the cgroup peaked at {} MiB of {} MiB",
                peak / MIB,
                limit / MIB
            );
        }
    };
    fill_past_the_limit(None, &prefix, "nopassthrough", limit, &name, "256M", &check);
    check(0);
}

/// `ulimit -v` in KiB for a ramfs server: its own start-up mappings and
/// about 350 MiB of data.
const ULIMIT_KIB: u64 = 450_000;

/// The server's address space never came near its limit: mappings it
/// could not make would have been its own working memory's.
fn address_space_kept_under_the_limit(pid: u32) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let peak_kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmPeak:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmPeak: {status}"));
    assert!(
        peak_kib + 8 * 1024 <= ULIMIT_KIB,
        "the server's address space peaked at {peak_kib} KiB of {ULIMIT_KIB} KiB"
    );
}

#[test]
fn ulimit_v_below_size_fails_writes_with_enospc() {
    require!("fuse", "dd", "sha256sum", "fallocate");
    fill_past_the_limit(
        None,
        &format!("ulimit -v {ULIMIT_KIB}"),
        "nopassthrough",
        ULIMIT_KIB * 1024,
        "RLIMIT_AS (ulimit -v)",
        &format!("{ULIMIT_KIB}K"),
        &address_space_kept_under_the_limit,
    );
}

#[test]
fn a_users_ulimit_v_below_size_fails_writes_with_enospc() {
    require!("user-fuse", "dd", "sha256sum", "fallocate");
    fill_past_the_limit(
        Some(TEST_USER),
        &format!("ulimit -v {ULIMIT_KIB}"),
        "",
        ULIMIT_KIB * 1024,
        "RLIMIT_AS (ulimit -v)",
        &format!("{ULIMIT_KIB}K"),
        &address_space_kept_under_the_limit,
    );
}

/// With passthrough the kernel writes file data into the pool's tmpfs in
/// the writer's name: the pages are charged to the writing program's
/// memory cgroup, as a tmpfs write is, and never to the server's, whose
/// limit therefore holds none of it. A writer over its own limit meets
/// its own cgroup's OOM killer, as on tmpfs; the server and the mount
/// carry on.
#[test]
fn passthrough_data_is_charged_to_the_writer_not_the_server() {
    require!("fuse", "dd", "sha256sum");
    let limit = 128 * MIB;
    let (server_cg, writer_cg) = match (Cgroup::new(limit), Cgroup::new(64 * MIB)) {
        (Ok(s), Ok(w)) => (s, w),
        (Err(why), _) | (_, Err(why)) => {
            eprintln!("skipped: a memory cgroup of the test's own: {why}");
            return;
        }
    };
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("source");
    common::write_random_file(&src, 256 * MIB, 29);
    let dir = tmp.path().join("mnt");
    std::fs::create_dir(&dir).unwrap();
    let procs = server_cg.dir.join("cgroup.procs");
    let mut cmd = Command::new("/bin/sh");
    cmd.args([
        "-c",
        r#"echo $$ > "$1" && exec "$2" mount -t ramfs -o size=1G,passthrough none "$3""#,
        "sh",
        procs.to_str().unwrap(),
        common::bin().to_str().unwrap(),
        dir.to_str().unwrap(),
    ]);
    let (mount, out) = match Mount::by_command_output(None, &mut cmd, &dir) {
        Ok(m) => m,
        Err(why) => {
            eprintln!("skipped: no passthrough ramfs here: {why}");
            return;
        }
    };
    let warning = String::from_utf8_lossy(&out.stderr);
    assert!(
        warning.contains("size=1G is above this server's memory limit")
            && warning.contains("charged to the writing program's memory cgroup"),
        "{warning:?}"
    );
    let pid = common::server_pid(None, &dir);
    // Twice the server's limit, written by this process, outside it.
    let file = dir.join("big");
    let f = fill(None, &src, &file, "1M");
    assert_eq!(f.bytes, 256 * MIB, "every byte is taken: {}", f.stderr);
    assert_eq!(sha_in_mount(None, &file), sha_of_prefix(&src, f.bytes));
    let used: u64 = std::fs::read_to_string(server_cg.dir.join(if server_cg.v2 {
        "memory.current"
    } else {
        "memory.usage_in_bytes"
    }))
    .unwrap()
    .trim()
    .parse()
    .unwrap();
    assert!(
        used < 64 * MIB,
        "the server's cgroup holds {} MiB of the 256 MiB written",
        used / MIB
    );
    assert_eq!(server_cg.oom_kills(), 0);
    // A writer over its own limit: its cgroup's OOM killer takes it.
    let wprocs = writer_cg.dir.join("cgroup.procs");
    let w = sh(
        None,
        r#"echo $$ > "$1" && exec dd if="$2" of="$3" bs=1M count=128"#,
        &[
            wprocs.to_str().unwrap(),
            src.to_str().unwrap(),
            dir.join("w").to_str().unwrap(),
        ],
    );
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        (w.status.signal(), writer_cg.oom_kills()),
        (Some(libc::SIGKILL), 1),
        "the writer meets its own cgroup's limit: {w:?}"
    );
    assert!(alive(pid), "the server {pid} lives");
    assert_eq!(server_cg.oom_kills(), 0);
    let rm = sh(
        None,
        r#"rm "$1" "$2""#,
        &[file.to_str().unwrap(), dir.join("w").to_str().unwrap()],
    );
    assert!(rm.status.success(), "{rm:?}");
    let again = dir.join("again");
    let out = sh(
        None,
        r#"dd if="$1" of="$2" bs=1M count=16 2>&1"#,
        &[src.to_str().unwrap(), again.to_str().unwrap()],
    );
    assert!(out.status.success(), "{out:?}");
    assert_eq!(sha_in_mount(None, &again), sha_of_prefix(&src, 16 * MIB));
    mount.unmount().unwrap();
}
