//! A fault campaign: the image is read from SeaweedFS through the test
//! kit's fault-injecting proxy, and each fault is switched on while 8
//! readers stream files they have not read before, then off. Under each,
//! every read returns the image's bytes or EIO, within the timeout; the
//! mount stays, its threads and memory stay bounded, and once the fault
//! is off every reader reads its whole file right again. The table
//! (fault, readers, outcome, time to heal) is printed to stderr.
//!
//! A body of the right length with flipped bytes is caught only by the
//! object's digest: S3 sends no checksum of a range (an ETag is the MD5
//! of a whole single-part object, `x-amz-checksum-*` cover whole objects
//! or parts, `Content-MD5` is checked on upload only), and the images
//! carry no checksums of their data. So the image is uploaded with the
//! digest `foliofs digest` made, mounted with `-o digest`, and that row
//! is held to the same rule as the others.

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use foliofs_testkit::proxy::{Fault, FaultProxy};

use super::{cache_dir, mount_url, start_weed, Creds, Images, BUCKET};
use crate::common::{self, TEST_USER};

const READERS: usize = 8;
/// Each reader's file: eight chunks of 64 KiB.
const FILE: usize = 512 << 10;
/// The mount's `timeout=`, in seconds.
const TIMEOUT: u64 = 3;
/// The longest one read may take: the timeout, and a read the kernel
/// splits in two requests.
const READ_BOUND: Duration = Duration::from_secs(2 * TIMEOUT + 2);

/// The faults, in order; the flipped bytes last, as what they leave in
/// the cache stays wrong.
fn faults() -> Vec<(&'static str, Fault)> {
    vec![
        ("delay 300 ms", Fault::Delay(Duration::from_millis(300))),
        ("stall mid-body", Fault::Stall),
        ("reset mid-body", Fault::Reset),
        ("short body", Fault::Short),
        ("wrong Content-Range", Fault::WrongRange),
        (
            "500 x 10",
            Fault::Burst {
                status: 500,
                count: 10,
            },
        ),
        (
            "503 burst (8 s)",
            Fault::Burst {
                status: 503,
                count: u64::MAX,
            },
        ),
        ("403 after 4 requests", Fault::ForbiddenAfter(4)),
        ("ETag changed", Fault::OtherEtag),
        ("flipped bytes", Fault::Flip),
    ]
}

/// What the readers of one phase saw.
#[derive(Default, Debug)]
struct Seen {
    ok: usize,
    eio: usize,
    wrong: usize,
    other: Vec<String>,
    slowest: Duration,
}

/// Reads `file` in 128 KiB reads, comparing each with `want`.
fn read_file(file: &Path, want: &[u8], seen: &mut Seen) {
    let t = Instant::now();
    let opened = fs::File::open(file);
    seen.slowest = seen.slowest.max(t.elapsed());
    let f = match opened {
        Ok(f) => f,
        // Its lookup needed metadata the fault kept away: every read of
        // it failed.
        Err(e) if e.raw_os_error() == Some(libc::EIO) => {
            seen.eio += want.len().div_ceil(128 << 10);
            return;
        }
        Err(e) => {
            seen.other.push(format!("open {}: {e}", file.display()));
            return;
        }
    };
    let mut buf = vec![0u8; 128 << 10];
    for at in (0..want.len()).step_by(buf.len()) {
        let n = buf.len().min(want.len() - at);
        let t = Instant::now();
        let r = f.read_exact_at(&mut buf[..n], at as u64);
        seen.slowest = seen.slowest.max(t.elapsed());
        match r {
            Ok(()) if buf[..n] == want[at..at + n] => seen.ok += 1,
            Ok(()) => seen.wrong += 1,
            Err(e) if e.raw_os_error() == Some(libc::EIO) => seen.eio += 1,
            Err(e) => seen.other.push(format!("{} at {at}: {e}", file.display())),
        }
    }
}

/// The 8 readers of `files` at once.
fn read_all(files: &[(PathBuf, Vec<u8>)]) -> Seen {
    let parts: Vec<Seen> = std::thread::scope(|s| {
        let hs: Vec<_> = files
            .iter()
            .map(|(p, w)| {
                s.spawn(move || {
                    let mut seen = Seen::default();
                    read_file(p, w, &mut seen);
                    seen
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut all = Seen::default();
    for p in parts {
        all.ok += p.ok;
        all.eio += p.eio;
        all.wrong += p.wrong;
        all.other.extend(p.other);
        all.slowest = all.slowest.max(p.slowest);
    }
    all
}

/// `Threads` and `VmRSS` (KiB) of process `pid`.
fn threads_and_rss(pid: u32) -> (u64, u64) {
    let text = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("Threads:"), field("VmRSS:"))
}

fn campaign(user: Option<&str>) {
    let weed = start_weed();
    let proxy = FaultProxy::start(&weed.endpoint()).unwrap();
    let images = Images::new();
    let list = faults();
    // Each phase's readers have files of their own, apart from the others'.
    let src = images.path("campaign");
    let mut rng = common::rng(28);
    let mut phases = Vec::new();
    for (p, _) in list.iter().enumerate() {
        let dir = src.join(format!("p{p}"));
        fs::create_dir_all(&dir).unwrap();
        let mut files = Vec::new();
        for r in 0..READERS {
            let name = format!("p{p}/r{r}");
            let data = common::random_bytes(&mut rng, FILE);
            fs::write(src.join(&name), &data).unwrap();
            files.push((name, data));
        }
        phases.push(files);
    }
    let img = images.path("campaign.romfs");
    crate::romfs::util::genromfs(&src, &img, &[]);
    weed.put_file(BUCKET, "campaign.romfs", &img).unwrap();
    let digest = images.path("campaign.romfs.digest");
    common::foliofs_ok([
        "digest".as_ref(),
        img.as_os_str(),
        "-o".as_ref(),
        digest.as_os_str(),
    ]);
    weed.put_file(BUCKET, "campaign.romfs.digest", &digest)
        .unwrap();

    let home = user.map(common::user_tempdir);
    let cache = match &home {
        Some(h) => h.path().join("cache"),
        None => cache_dir(&images, "cache"),
    };
    // The readers are this process: the user's mount lets them in.
    let _conf = user.map(|_| common::FuseConf::set("user_allow_other\n"));
    let opts = format!(
        "{},cache={},chunk=64K,timeout={TIMEOUT},digest{}",
        proxy.mount_options(),
        cache.display(),
        if user.is_some() { ",allow_other" } else { "" }
    );
    let m = mount_url(
        user,
        &Creds::Env,
        &format!("s3://{BUCKET}/campaign.romfs"),
        &opts,
        &[],
    )
    .unwrap();
    let pid = common::server_pid(user, m.path());
    let (threads0, rss0) = threads_and_rss(pid);
    let who = user.unwrap_or("root");
    eprintln!("fault campaign ({who}): server {pid}, {threads0} threads, {rss0} KiB at start");
    eprintln!("| fault | readers | reads ok / EIO / wrong | slowest read | time to heal | server threads, RSS |");
    eprintln!("|---|---|---|---|---|---|");
    let mut failures = Vec::new();
    for (p, (name, fault)) in list.iter().enumerate() {
        let files: Vec<(PathBuf, Vec<u8>)> = phases[p]
            .iter()
            .map(|(n, d)| (m.path().join(n), d.clone()))
            .collect();
        let faulted_before = proxy.faulted();
        proxy.set(fault.clone());
        let under = read_all(&files);
        if *name == "503 burst (8 s)" {
            // Readers keep at it while the burst lasts.
            let until = Instant::now() + Duration::from_secs(8);
            while Instant::now() < until {
                let more = read_all(&files);
                assert_eq!(more.wrong, 0, "{name}: wrong bytes");
                std::thread::sleep(Duration::from_millis(200));
            }
        }
        let faulted = proxy.faulted() - faulted_before;
        proxy.set(Fault::None);
        let cleared = Instant::now();
        let mut healed = None;
        while cleared.elapsed() < Duration::from_secs(60) {
            let after = read_all(&files);
            if after.eio == 0 && after.other.is_empty() {
                if after.wrong == 0 {
                    healed = Some(cleared.elapsed());
                }
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let (threads, rss) = threads_and_rss(pid);
        let outcome = format!("{} / {} / {}", under.ok, under.eio, under.wrong);
        let heal = healed.map_or("never".to_owned(), |d| format!("{:.2} s", d.as_secs_f64()));
        eprintln!(
            "| {name} | {READERS} | {outcome} | {:.2} s | {heal} | {threads}, {} MiB |",
            under.slowest.as_secs_f64(),
            rss / 1024
        );
        assert!(faulted > 0, "{name}: the proxy injected nothing");
        assert!(common::is_mounted(m.path()), "{name}: the mount went away");
        assert!(under.other.is_empty(), "{name}: {:?}", under.other);
        assert!(
            under.slowest <= READ_BOUND,
            "{name}: a read took {:?}",
            under.slowest
        );
        // Fetch threads, committer and FUSE's: none left behind per fault.
        assert!(
            threads <= threads0 + 4,
            "{name}: {threads} threads, {threads0} at start"
        );
        assert!(
            rss < rss0 + (128 << 10),
            "{name}: {rss} KiB resident, {rss0} at start"
        );
        if *fault == Fault::Flip && user.is_none() {
            let s = super::remote_stats(m.path());
            if s["fetch_corrupt"] == 0 {
                failures.push(format!("{name}: no fetch counted corrupt: {s:?}"));
            }
        }
        if under.wrong > 0 {
            failures.push(format!("{name}: {} reads of wrong bytes", under.wrong));
        }
        if healed.is_none() {
            failures.push(format!("{name}: did not heal within 60 s"));
        }
    }
    m.unmount().unwrap();
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn every_fault_gives_right_bytes_or_eio_and_heals() {
    require!("fuse", "weed", "genromfs");
    campaign(None);
}

#[test]
fn every_fault_gives_right_bytes_or_eio_and_heals_for_a_user() {
    require!("user-fuse", "weed", "genromfs");
    campaign(Some(TEST_USER));
}
