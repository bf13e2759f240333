//! Image mounts outlive their servers: a server killed while readers
//! stream the image's files is replaced, the kernel resends what it was
//! working on, and every reader ends with the source's bytes, never an
//! error; `foliofs takeover` replaces a live server with one from the
//! binary on disk; a server that keeps dying is given up and the mount
//! taken down; what cannot be supervised is refused by name; and a mount
//! is listed in full once `foliofs mount` returns. As root and as a user.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::common::{self, sh_as_user, Mount, TEST_USER};

/// Files in the image, one reader each.
const READERS: usize = 16;
/// Each file's size: big enough that the readers are still reading when
/// the server is killed, the second time too.
const FILE_SIZE: u64 = 32 << 20;
/// How long a replacement may take to serve.
const RESTART: Duration = Duration::from_secs(30);

/// `n` random files `f0`.. of `size` bytes in a new directory `dir`, from
/// seeds `seed`, `seed + 1`, ...; each file's sha256.
fn random_files(dir: &Path, n: usize, size: u64, seed: u64) -> Vec<[u8; 32]> {
    fs::create_dir(dir).unwrap();
    (0..n)
        .map(|i| {
            let f = dir.join(format!("f{i}"));
            common::write_random_file(&f, size, seed + i as u64);
            Sha256::digest(fs::read(&f).unwrap()).into()
        })
        .collect()
}

/// An EROFS image of [`READERS`] random files (`f0`, `f1`, ...) of `size`
/// bytes, and each file's sha256.
fn image(size: u64) -> (tempfile::TempDir, PathBuf, Vec<[u8; 32]>) {
    let tmp = tempfile::Builder::new()
        .prefix("foliofs-supervise.")
        .tempdir()
        .unwrap();
    let src = tmp.path().join("src");
    let sums = random_files(&src, READERS, size, 100);
    let img = tmp.path().join("image.erofs");
    common::mkfs_erofs::<&str>(&[], &img, &src);
    common::open_to_all(tmp.path());
    (tmp, img, sums)
}

/// The mount's line in `foliofs mounts` as `user` (this process where
/// `None`) sees it.
fn mounts_line(user: Option<&str>, dir: &Path) -> String {
    let out = match user {
        Some(u) => common::as_user(u, common::bin(), ["mounts"], Duration::from_secs(30)),
        None => common::foliofs(["mounts"]),
    };
    let list = String::from_utf8_lossy(&out.stdout).into_owned();
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_owned());
    list.lines()
        .find(|l| l.split(' ').nth(1) == dir.to_str())
        .map(ToOwned::to_owned)
        .unwrap_or_default()
}

/// `key=` of the mount's line, if there.
fn field(line: &str, key: &str) -> Option<String> {
    line.split([' ', ','])
        .find_map(|o| o.strip_prefix(key)?.strip_prefix('='))
        .map(ToOwned::to_owned)
}

fn restarts(user: Option<&str>, dir: &Path) -> u32 {
    field(&mounts_line(user, dir), "restarts").map_or(0, |n| n.parse().unwrap())
}

/// Count `name` of the requests line `foliofs mounts --stats` (as `user`)
/// shows for the mount: an opcode, or `resent`.
fn requests(user: Option<&str>, dir: &Path, name: &str) -> u64 {
    let out = match user {
        Some(u) => common::as_user(
            u,
            common::bin(),
            ["mounts", "--stats"],
            Duration::from_secs(30),
        ),
        None => common::foliofs(["mounts", "--stats"]),
    };
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let dir = dir.canonicalize().unwrap();
    let mut lines = text.lines();
    lines.find(|l| l.split(' ').nth(1) == dir.to_str());
    let counts = lines.next().unwrap_or_default();
    field(counts, name).map_or(0, |n| n.parse().unwrap())
}

fn sigkill(pid: u32) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
}

/// The new server's `resent` count, once it has published it (within a
/// few intervals of its first requests); 0 when it took none.
fn resent_now(user: Option<&str>, dir: &Path) -> u64 {
    let mut n = 0;
    common::wait_until(Duration::from_secs(3), || {
        n = requests(user, dir, "resent");
        n > 0
    });
    n
}

/// Kills the mount's server up to `kills` times while the readers'
/// `done()` bytes grow toward `total`: once an eighth is read, then each
/// time the replacement has served more, until the readers are done.
/// Returns the kills and the requests the replacements took as resent.
fn kill_servers(
    user: Option<&str>,
    dir: &Path,
    kills: u32,
    (done, total): (&dyn Fn() -> u64, u64),
) -> (u32, u64) {
    let (mut killed, mut resent) = (0, 0);
    for k in 1..=kills {
        let from = if k == 1 {
            total / 8
        } else {
            done() + (4 << 20)
        };
        assert!(
            common::wait_until(Duration::from_secs(120), || done() >= from.min(total)),
            "the readers stalled at {} of {total} bytes",
            done()
        );
        if done() >= total {
            break;
        }
        let pid = common::server_pid(user, dir);
        sigkill(pid);
        killed += 1;
        assert!(
            common::wait_until(RESTART, || restarts(user, dir) == k
                && field(&mounts_line(user, dir), "server")
                    .is_some_and(|s| s != "restarting" && s != pid.to_string())),
            "no new server after kill {k}: {}",
            mounts_line(user, dir)
        );
        resent += resent_now(user, dir);
    }
    (killed, resent)
}

type Readers = Vec<std::thread::JoinHandle<std::io::Result<[u8; 32]>>>;

/// A thread per file `f0`.. `f{n-1}` of `dir`, each reading it through and
/// returning its sha256; the bytes all have read so far.
fn start_readers(dir: &Path, n: usize) -> (Readers, Arc<AtomicU64>) {
    let progress = Arc::new(AtomicU64::new(0));
    let readers = (0..n)
        .map(|i| {
            let path = dir.join(format!("f{i}"));
            let progress = progress.clone();
            // Hashed once read: readers that only wait on the mount keep
            // its server busy, so each kill finds requests in flight.
            std::thread::spawn(move || -> std::io::Result<[u8; 32]> {
                let mut f = fs::File::open(&path)?;
                let mut data = Vec::new();
                let mut buf = vec![0u8; 128 << 10];
                loop {
                    let n = f.read(&mut buf)?;
                    if n == 0 {
                        return Ok(Sha256::digest(&data).into());
                    }
                    data.extend_from_slice(&buf[..n]);
                    progress.fetch_add(n as u64, Ordering::Relaxed);
                }
            })
        })
        .collect();
    (readers, progress)
}

/// 16 readers stream an EROFS image's files as root while its server is
/// killed (`kill -9`) up to three times: each reader ends with the file's
/// sha256, no read fails (`ENOTCONN` would) and none stalls (a request
/// the dead server had read and not answered would hang its reader, were
/// it not resent). Without pushing (every byte comes by READ), and with
/// (a killed server dies mid-push; its replacement pushes nothing). A
/// server reading a local image answers within microseconds, so a kill
/// finds requests in flight only by chance; the remote case below, whose
/// reads wait on the network, asserts that some were resent.
#[test]
fn readers_outlive_a_killed_server() {
    require!("fuse", "mkfs.erofs");
    let (_tmp, img, sums) = image(FILE_SIZE);
    for opts in ["noio_uring,nopush", "noio_uring"] {
        let m = Mount::new(&img, None, opts).unwrap();
        let line = mounts_line(None, m.path());
        assert!(line.contains("supervised"), "{line}");
        let (readers, progress) = start_readers(m.path(), READERS);
        let done = move || progress.load(Ordering::Relaxed);
        let total = READERS as u64 * FILE_SIZE;
        let (killed, _) = kill_servers(None, m.path(), 3, (&done, total));
        for (i, r) in readers.into_iter().enumerate() {
            let got = r
                .join()
                .unwrap()
                .unwrap_or_else(|e| panic!("-o {opts}: reader of f{i} failed: {e}"));
            assert!(
                got == sums[i],
                "-o {opts}: f{i} read back wrong after the kills"
            );
        }
        assert!(
            killed > 0,
            "-o {opts}: the readers were done before the first kill"
        );
        assert_eq!(restarts(None, m.path()), killed, "-o {opts}");
        m.unmount().unwrap();
    }
}

/// romfs, and an EROFS image in object storage: readers streaming four
/// files see their reads complete right through a killed server.
#[test]
fn romfs_and_remote_images_outlive_a_killed_server() {
    require!("fuse", "genromfs", "weed");
    const FILES: usize = 4;
    let tmp = tempfile::Builder::new()
        .prefix("foliofs-supervise.")
        .tempdir()
        .unwrap();
    let src = tmp.path().join("src");
    let sums = random_files(&src, FILES, FILE_SIZE, 200);
    let romfs = tmp.path().join("image.romfs");
    crate::romfs::util::genromfs(&src, &romfs, &[]);
    let erofs = tmp.path().join("image.erofs");
    common::mkfs_erofs::<&str>(&[], &erofs, &src);
    let weed = crate::remote::start_weed();
    weed.put_file(crate::remote::BUCKET, "image.erofs", &erofs)
        .unwrap();
    let url = format!("s3://{}/image.erofs", crate::remote::BUCKET);
    let cache = tmp.path().join("cache");
    let remote_opts = format!(
        "{},cache={},noio_uring,nopush",
        weed.mount_options(),
        cache.display()
    );
    for what in ["romfs", "remote"] {
        let m = match what {
            "romfs" => Mount::new(&romfs, None, "noio_uring,nopush").unwrap(),
            _ => {
                crate::remote::mount_url(None, &crate::remote::Creds::Env, &url, &remote_opts, &[])
                    .unwrap()
            }
        };
        let (readers, progress) = start_readers(m.path(), FILES);
        let done = move || progress.load(Ordering::Relaxed);
        let (killed, resent) = kill_servers(None, m.path(), 1, (&done, FILES as u64 * FILE_SIZE));
        assert_eq!(killed, 1, "{what}: the readers were done before the kill");
        // Reads from object storage keep the server's threads waiting on
        // the network, so its death leaves requests read and unanswered:
        // the replacement must have taken them as resent.
        assert!(
            what != "remote" || resent > 0,
            "{what}: no request was resent: the server died with nothing in flight"
        );
        for (i, r) in readers.into_iter().enumerate() {
            let got = r
                .join()
                .unwrap()
                .unwrap_or_else(|e| panic!("{what}: reader of f{i} failed: {e}"));
            assert!(
                got == sums[i],
                "{what}: f{i} read back wrong after the kill"
            );
        }
        assert_eq!(restarts(None, m.path()), 1, "{what}");
        m.unmount().unwrap();
    }
}

/// The same for a user's mount, the user's readers and the user killing
/// their own server; then the user takes the mount over with a new server
/// while the readers read again. Without pushing, so the server's READ
/// count is how far the readers are.
#[test]
fn a_users_readers_outlive_a_killed_server_and_a_takeover() {
    require!("user-fuse", "mkfs.erofs");
    let (_tmp, img, sums) = image(FILE_SIZE);
    let m = Mount::as_user(TEST_USER, &img, None, "noio_uring,nopush").unwrap();
    let want: String = sums
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let hex: String = s.iter().map(|b| format!("{b:02x}")).collect();
            format!("{hex}  f{i}\n")
        })
        .collect();
    let script =
        r#"cd "$1" && for f in f*; do (sha256sum "$f" > "$2/$f.sum" 2> "$2/$f.err") & done; wait"#;
    for round in ["kill", "takeover"] {
        let out_dir = common::user_tempdir(TEST_USER);
        // The readers' progress, as the READs the server answered.
        let reads = || requests(Some(TEST_USER), m.path(), "read");
        let base = reads();
        let mnt = m.path().to_owned();
        let od = out_dir.path().to_owned();
        let readers = std::thread::spawn(move || sh_as_user(TEST_USER, script, &[&mnt, &od]));
        // Reads are of up to 1 MiB: a quarter of the data read is a
        // quarter of the reads.
        let quarter = READERS as u64 * FILE_SIZE / (1 << 20) / 4;
        assert!(
            common::wait_until(Duration::from_secs(120), || reads() >= base + quarter),
            "the readers did not start"
        );
        let before = restarts(Some(TEST_USER), m.path());
        match round {
            "kill" => {
                let pid = common::server_pid(Some(TEST_USER), m.path());
                let out = common::as_user(
                    TEST_USER,
                    "kill",
                    ["-9", &pid.to_string()],
                    Duration::from_secs(10),
                );
                assert!(out.status.success(), "the user could not kill: {out:?}");
            }
            _ => {
                let out = common::as_user(
                    TEST_USER,
                    common::bin(),
                    [std::ffi::OsStr::new("takeover"), m.path().as_os_str()],
                    Duration::from_secs(90),
                );
                let text = String::from_utf8_lossy(&out.stdout);
                assert!(
                    out.status.success() && text.contains("took over"),
                    "takeover: {text}{}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
        let out = readers.join().unwrap();
        assert!(out.status.success(), "{round}: the readers failed: {out:?}");
        let mut got = String::new();
        let mut errors = String::new();
        for i in 0..READERS {
            got.push_str(&fs::read_to_string(out_dir.path().join(format!("f{i}.sum"))).unwrap());
            errors.push_str(&fs::read_to_string(out_dir.path().join(format!("f{i}.err"))).unwrap());
        }
        assert!(errors.is_empty(), "{round}: {errors}");
        assert_eq!(got, want, "{round}: a file read back wrong");
        assert_eq!(restarts(Some(TEST_USER), m.path()), before + 1, "{round}");
        // The next round reads through a cold cache.
        drop_mount_cache(TEST_USER, m.path());
    }
    m.unmount().unwrap();
}

/// Drops the kernel's cached pages of the mount's files (`dd
/// iflag=nocache`, as the user whose mount it is: root may not enter
/// it), so the next reads go to the server again.
fn drop_mount_cache(user: &str, dir: &Path) {
    let out = sh_as_user(
        user,
        r#"cd "$1" && for f in f*; do dd if="$f" iflag=nocache count=0 status=none || exit 1; done"#,
        &[dir],
    );
    assert!(out.status.success(), "dropping the cache: {out:?}");
}

/// An upgrade in place: the binary the mount was made with is replaced on
/// disk, and `foliofs takeover` starts the new one while readers read; the
/// old server retires and the new one runs the new file.
#[test]
fn takeover_runs_the_binary_on_disk_now() {
    require!("fuse", "mkfs.erofs");
    let (tmp, img, sums) = image(4 << 20);
    let exe = tmp.path().join("foliofs");
    copy_binary(&exe);
    let dir = tmp.path().join("mnt");
    fs::create_dir(&dir).unwrap();
    let m = Mount::by_command(
        None,
        std::process::Command::new(&exe)
            .args(["mount", "-o", "noio_uring"])
            .arg(&img)
            .arg(&dir),
        &dir,
    )
    .unwrap();
    let old = common::server_pid(None, &dir);
    // A new build lands where the old one was (as a package upgrade
    // renames it in).
    let staged = tmp.path().join("foliofs.new");
    copy_binary(&staged);
    fs::rename(&staged, &exe).unwrap();
    let exe_of = |pid: u32| fs::read_link(format!("/proc/{pid}/exe")).unwrap();
    assert!(exe_of(old).to_string_lossy().ends_with("(deleted)"));
    let reader = {
        let f = dir.join("f0");
        std::thread::spawn(move || fs::read(f))
    };
    let out = common::run_timeout(
        std::process::Command::new(&exe).arg("takeover").arg(&dir),
        Duration::from_secs(90),
    );
    assert!(
        out.status.success(),
        "takeover: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let new = common::server_pid(None, &dir);
    assert_ne!(new, old);
    assert_eq!(
        exe_of(new),
        exe,
        "the new server does not run the new binary"
    );
    assert!(
        common::wait_until(RESTART, || !Path::new(&format!("/proc/{old}")).exists()),
        "the old server did not retire"
    );
    let data = reader.join().unwrap().unwrap();
    assert!(<[u8; 32]>::from(Sha256::digest(&data)) == sums[0]);
    for (i, sum) in sums.iter().enumerate() {
        let data = fs::read(dir.join(format!("f{i}"))).unwrap();
        assert!(<[u8; 32]>::from(Sha256::digest(&data)) == *sum, "f{i}");
    }
    m.unmount().unwrap();
}

/// Copies the binary under test to `to` by `cp`, not by a writable
/// descriptor of this process: a child that another test forks meanwhile
/// would inherit it until its exec, and running the copy would then fail
/// with ETXTBSY.
fn copy_binary(to: &Path) {
    let out = common::run_timeout(
        std::process::Command::new("cp").arg(common::bin()).arg(to),
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "cp: {out:?}");
}

/// A server that dies again and again is given up: after five deaths
/// within a minute the mount is taken down and the supervisor exits,
/// with the reason in its log.
#[test]
fn a_server_that_keeps_dying_is_given_up() {
    require!("fuse", "mkfs.erofs");
    let (_tmp, img, _) = image(1 << 20);
    let m = Mount::new(&img, None, "noio_uring").unwrap();
    let line = mounts_line(None, m.path());
    let supervisor: u32 = field(&line, "pid").unwrap().parse().unwrap();
    let id = fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .find(|l| l.split(' ').nth(4) == m.path().canonicalize().unwrap().to_str())
        .and_then(|l| l.split(' ').next().map(ToOwned::to_owned))
        .unwrap();
    for k in 1..=5u32 {
        let pid = common::server_pid(None, m.path());
        sigkill(pid);
        if k < 5 {
            assert!(
                common::wait_until(RESTART, || restarts(None, m.path()) == k
                    && common::server_pid(None, m.path()) != pid),
                "no server after kill {k}: {}",
                mounts_line(None, m.path())
            );
        }
    }
    assert!(
        common::wait_until(RESTART, || !common::is_mounted(m.path())),
        "the mount is still there after five deaths"
    );
    assert!(
        common::wait_until(RESTART, || !Path::new(&format!("/proc/{supervisor}"))
            .exists()),
        "the supervisor did not exit"
    );
    let log = fs::read_to_string(Path::new("/run/foliofs/log").join(&id)).unwrap();
    assert!(
        log.contains("died 5 times") && log.contains("SIGKILL"),
        "the log does not say why:\n{log}"
    );
    drop(m);
}

/// What cannot be supervised says why: io_uring (whose rings the kernel
/// does not resend from), for an image as for a ramfs;
/// `nosupervise` mounts an image with its server alone, whose death is
/// the mount's.
#[test]
fn what_cannot_be_supervised_is_refused() {
    require!("fuse", "mkfs.erofs");
    let e = Mount::new(Path::new("none"), Some("ramfs"), "supervise,io_uring")
        .err()
        .unwrap();
    assert!(e.contains("exclude each other"), "{e}");
    let (_tmp, img, _) = image(1 << 20);
    let e = Mount::new(&img, None, "supervise,io_uring").err().unwrap();
    assert!(e.contains("exclude each other"), "{e}");
    let m = Mount::new(&img, None, "nosupervise,noio_uring").unwrap();
    let line = mounts_line(None, m.path());
    assert!(
        !line.contains("supervised") && field(&line, "server").is_none(),
        "{line}"
    );
    drop(m);
}

/// `foliofs mount` returns once the mount serves, and the mount is then
/// listed with its format and processes: a script that mounts and then
/// asks `foliofs mounts` never finds it `unknown`. The supervisor records
/// the mount with a `rename(2)`; strace holds each of those for 300 ms, so
/// a record written after readiness is reported is certain to be missed.
/// As root only: a traced fusermount3 loses its set-user-id, so a user's
/// mount cannot be made under strace (the supervisor is the same code).
#[test]
fn a_mount_is_listed_in_full_once_mount_returns() {
    require!("fuse", "strace");
    let tmp = tempfile::tempdir().unwrap();
    let img = common::one_file_romfs(tmp.path());
    let dir = tmp.path().join("m");
    fs::create_dir(&dir).unwrap();
    let err = tmp.path().join("mount.err");
    // strace -D leaves the traced command as the child waited for; its
    // own output goes nowhere, or the wait would last until it ends.
    let mut cmd = std::process::Command::new("sh");
    cmd.arg("-c")
        .arg(
            r#"exec strace -D -f -qq -o /dev/null -e trace=rename \
                -e inject=rename:delay_enter=300000 \
                "$0" mount -o "$1" "$2" "$3" >/dev/null 2>"$4""#,
        )
        .arg(common::bin())
        .arg("supervise")
        .arg(&img)
        .arg(&dir)
        .arg(&err);
    let m = Mount::by_command(None, &mut cmd, &dir)
        .unwrap_or_else(|e| panic!("{e}\n{}", fs::read_to_string(&err).unwrap_or_default()));
    let line = mounts_line(None, m.path());
    assert!(line.split(' ').nth(2) == Some("romfs"), "{line}");
    assert!(
        field(&line, "pid").is_some() && field(&line, "server").is_some(),
        "{line}"
    );
    drop(m);
}
