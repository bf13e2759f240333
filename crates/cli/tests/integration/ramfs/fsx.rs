//! fsx 0.3.2 on ramfs mounts: 100,000 operations each at block sizes 4K,
//! 64K and 2M (and 2M huge pages), 20,000 at every size between, and
//! 100,000 on the server's data path; mmap reads and writes included, 0
//! failures; and 60,000 with the server killed every 0.7 s. As root a ramfs passes its files through to the kernel where
//! it can (the default), so these run on that path there.

use crate::common;

use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{run_timeout, Mount};

/// Every operation fsx 0.3.2 knows, mmap reads and writes among them, on a
/// file up to 8 MiB (several blocks even at 2 MiB) with operations up to
/// 256 KiB at unaligned offsets.
const CONFIG: &str = r#"
flen = 8388608

[opsize]
max = 262144
min = 1
align = 1

[weights]
close_open = 1
read = 10
write = 10
mapread = 10
mapwrite = 10
invalidate = 1
truncate = 3
fsync = 1
fdatasync = 1
posix_fallocate = 2
punch_hole = 2
sendfile = 2
posix_fadvise = 1
copy_file_range = 2
"#;

const OPS: u32 = 100_000;

fn run_fsx(opts: &str, seed: u32) {
    run_fsx_ops(opts, seed, OPS)
}

fn run_fsx_ops(opts: &str, seed: u32, ops: u32) {
    run_fsx_killing(opts, seed, ops, false);
}

/// fsx on a ramfs of `opts`; with `kill`, its server killed (`kill -9`)
/// again and again while fsx runs, each restart taking over where the
/// dead one stopped. Returns the kills.
fn run_fsx_killing(opts: &str, seed: u32, ops: u32, kill: bool) -> u32 {
    let tool = common::cargo_tool("fsx");
    let m = Mount::new(Path::new("none"), Some("ramfs"), opts).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let killer = kill.then(|| {
        let (dir, stop) = (m.path().to_owned(), stop.clone());
        std::thread::spawn(move || {
            let mut kills = 0u32;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let pid = common::server_pid(None, &dir);
                // Past half a second: a server that served that long was
                // well, and is restarted at once however often.
                std::thread::sleep(Duration::from_millis(700));
                if stop.load(std::sync::atomic::Ordering::Relaxed) {
                    break;
                }
                nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                )
                .unwrap();
                kills += 1;
                assert!(
                    common::wait_until(Duration::from_secs(30), || common::mounts_line_of(
                        None, &dir
                    )
                    .contains(&format!("restarts={kills}"))),
                    "no server after kill {kills}"
                );
            }
            kills
        })
    });
    let artifacts = tempfile::tempdir().unwrap();
    let cfg = artifacts.path().join("fsx.toml");
    fs::write(&cfg, CONFIG).unwrap();
    let out = run_timeout(
        Command::new(tool)
            .arg("-N")
            .arg(ops.to_string())
            .arg("-S")
            .arg(seed.to_string())
            .arg("-f")
            .arg(&cfg)
            .arg("-P")
            .arg(artifacts.path())
            .arg(m.path().join("fsx.data")),
        Duration::from_secs(1200),
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let kills = killer.map_or(0, |k| k.join().unwrap());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let tail = |s: &str| {
        s.lines()
            .rev()
            .take(60)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert!(
        out.status.success(),
        "fsx with -o {opts} (seed {seed}) failed ({}):\n{}\n{}",
        out.status,
        tail(&stdout),
        tail(&stderr)
    );
    // fsx reports how far it got; make sure every operation ran.
    let all = format!("{stdout}{stderr}");
    assert!(
        !all.contains("Test file system does not support"),
        "fsx skipped an operation with -o {opts}:\n{}",
        tail(&all)
    );
    kills
}

#[test]
fn fsx_100k_ops_at_4k_blocks() {
    require!("fuse", "fsx");
    run_fsx("blocksize=4K", 4096);
}

#[test]
fn fsx_100k_ops_at_64k_blocks() {
    require!("fuse", "fsx");
    run_fsx("blocksize=64K", 65536);
}

#[test]
fn fsx_100k_ops_at_2m_blocks() {
    require!("fuse", "fsx");
    run_fsx("blocksize=2M", 2_097_152);
}

/// Huge-page blocks, where this machine has transparent huge pages (where it
/// has none, the mount is refused, which `ramfs::datapath` checks).
#[test]
fn fsx_100k_ops_at_2m_huge_blocks() {
    require!("fuse", "fsx", "huge-pages");
    run_fsx("blocksize=2M,huge=always", 2_097_153);
}

/// Every block size between, fewer operations each: each has its own
/// folio policy on the passthrough path.
#[test]
fn fsx_20k_ops_at_every_other_block_size() {
    require!("fuse", "fsx");
    for k in [8u32, 16, 32, 128, 256, 512, 1024] {
        run_fsx_ops(&format!("blocksize={k}K"), k * 1024 + 7, 20_000);
    }
}

/// The server's own data path, which a user's ramfs takes.
#[test]
fn fsx_100k_ops_on_the_servers_data_path() {
    require!("fuse", "fsx");
    run_fsx("blocksize=64K,nopassthrough", 65537);
}

/// fsx across restarts: its ramfs's server killed every 0.7 s while fsx
/// runs, passed through (root's default) and on the server's data path;
/// every operation fsx checks still reads back as it wrote.
#[test]
fn fsx_across_killed_servers() {
    require!("fuse", "fsx");
    for (opts, seed) in [("noio_uring", 77u32), ("nopassthrough,noio_uring", 78)] {
        let kills = run_fsx_killing(opts, seed, 60_000, true);
        assert!(kills >= 3, "-o {opts}: fsx ran past only {kills} kills");
        eprintln!("fsx across restarts (-o {opts}): 60,000 operations, {kills} kills, 0 failures");
    }
}
