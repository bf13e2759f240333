//! Images in object storage: each test starts a SeaweedFS of its own on
//! loopback (`weed mini`, every port its own), puts images in it with a
//! SigV4 client, and mounts or reads them by `s3://` or `http://` URL. What
//! a remote mount shows is compared with a foliofs mount of the same image
//! as a local file; the cache, the failures and the user's mounts are
//! checked against the server's state and the mount's own counters.

mod cache;
mod faults;
mod mount;
mod user;

use std::ffi::OsString;
use std::fs;
use std::io::Write;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rusty_s3::{Bucket, Credentials, S3Action, UrlStyle};

use crate::common;

/// The key pair the server knows (the admin identity of its config).
pub const ACCESS_KEY: &str = "foliofs-test-key";
pub const SECRET_KEY: &str = "foliofs-test-secret";
/// A bucket that needs credentials.
pub const BUCKET: &str = "test";
/// A bucket anyone may read: objects in it are reachable by plain URL.
pub const PUBLIC: &str = "public";

/// How long the server may take to come up.
const START: Duration = Duration::from_secs(60);

/// The server's identities: the admin pair, and anonymous reads of
/// [`PUBLIC`] only.
fn s3_config() -> String {
    format!(
        r#"{{"identities":[
  {{"name":"admin","credentials":[{{"accessKey":"{ACCESS_KEY}","secretKey":"{SECRET_KEY}"}}],
    "actions":["Admin","Read","Write","List","Tagging"]}},
  {{"name":"anonymous","actions":["Read:{PUBLIC}"]}}
]}}"#
    )
}

/// Loopback ports for every listener of `weed mini`, found free now.
#[derive(Clone, Copy, Debug)]
struct Ports {
    master: u16,
    master_grpc: u16,
    volume: u16,
    volume_grpc: u16,
    filer: u16,
    filer_grpc: u16,
    s3: u16,
    s3_grpc: u16,
    /// Its gRPC port is this one plus 10000: the mini server's worker
    /// dials that, whatever `-admin.port.grpc` says.
    admin: u16,
}

impl Ports {
    fn pick() -> Ports {
        // Held together so no two are the same.
        let mut held: Vec<TcpListener> = Vec::new();
        let take = |held: &mut Vec<TcpListener>| {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            let p = l.local_addr().unwrap().port();
            held.push(l);
            p
        };
        let mut v = [0u16; 8];
        for p in &mut v {
            *p = take(&mut held);
        }
        let admin = loop {
            let p = take(&mut held);
            if p < 55536 && TcpListener::bind(("127.0.0.1", p + 10000)).is_ok() {
                break p;
            }
        };
        Ports {
            master: v[0],
            master_grpc: v[1],
            volume: v[2],
            volume_grpc: v[3],
            filer: v[4],
            filer_grpc: v[5],
            s3: v[6],
            s3_grpc: v[7],
            admin,
        }
    }

    fn all(&self) -> [u16; 10] {
        [
            self.master,
            self.master_grpc,
            self.volume,
            self.volume_grpc,
            self.filer,
            self.filer_grpc,
            self.s3,
            self.s3_grpc,
            self.admin,
            self.admin + 10000,
        ]
    }

    fn args(&self) -> Vec<String> {
        let mut a = vec![];
        for (flag, port) in [
            ("master.port", self.master),
            ("master.port.grpc", self.master_grpc),
            ("volume.port", self.volume),
            ("volume.port.grpc", self.volume_grpc),
            ("filer.port", self.filer),
            ("filer.port.grpc", self.filer_grpc),
            ("s3.port", self.s3),
            ("s3.port.grpc", self.s3_grpc),
            ("admin.port", self.admin),
            ("admin.port.grpc", self.admin + 10000),
        ] {
            a.push(format!("-{flag}={port}"));
        }
        a
    }
}

/// A SeaweedFS server of this test's own, killed when dropped (also when
/// the test panics, and with the test's thread if this process dies).
pub struct Weed {
    child: Option<Child>,
    ports: Ports,
    dir: tempfile::TempDir,
    agent: ureq::Agent,
}

impl Weed {
    /// Starts a server with buckets [`BUCKET`] and [`PUBLIC`] and waits until
    /// it takes objects. The caller has `require!`d `weed`.
    pub fn start() -> Weed {
        let dir = tempfile::Builder::new()
            .prefix("foliofs-weed.")
            .tempdir()
            .unwrap();
        fs::create_dir(dir.path().join("data")).unwrap();
        fs::write(dir.path().join("s3.json"), s3_config()).unwrap();
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(60)))
            .build()
            .into();
        let mut w = Weed {
            child: None,
            ports: Ports::pick(),
            dir,
            agent,
        };
        w.run();
        w
    }

    /// Starts the server process (again, on the same directory and ports)
    /// and waits until it serves.
    pub fn run(&mut self) {
        assert!(self.child.is_none(), "the server is running");
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("weed.log"))
            .unwrap();
        let mut cmd = Command::new(common::find_program("weed").expect("weed"));
        cmd.arg("mini")
            .arg(format!("-dir={}", self.dir.path().join("data").display()))
            .args([
                "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1",
                "-admin.ui=false",
                "-webdav=false",
                "-s3.port.iceberg=0",
                "-s3.port.lance=0",
                "-master.telemetry=false",
            ])
            .arg(format!("-bucket={BUCKET},{PUBLIC}"))
            .arg(format!(
                "-s3.config={}",
                self.dir.path().join("s3.json").display()
            ))
            .args(self.ports.args())
            .env_remove("AWS_ACCESS_KEY_ID")
            .env_remove("AWS_SECRET_ACCESS_KEY")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .current_dir(self.dir.path());
        // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches
        // no memory of this process.
        unsafe {
            // Gone with the test's thread even if this process is killed
            // before a drop can run.
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        self.child = Some(cmd.spawn().expect("cannot start weed"));
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                self.child = None;
                panic!("weed mini exited ({status}):\n{}", self.log());
            }
            // Both buckets exist once a write to each goes through.
            if self.try_put(BUCKET, ".probe", b"x").is_ok()
                && self.try_put(PUBLIC, ".probe", b"x").is_ok()
            {
                return;
            }
            if start.elapsed() > START {
                self.kill();
                panic!("weed mini did not serve within {START:?}:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Kills the server (SIGKILL) and waits for it; its data stays.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
            remove_sockets(&self.ports.all());
        }
    }

    /// The last lines of the server's log, for a failure message.
    pub fn log(&self) -> String {
        let text = fs::read_to_string(self.dir.path().join("weed.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    /// `http://127.0.0.1:PORT`, the S3 endpoint.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.ports.s3)
    }

    /// The mount options that reach this server: its endpoint, by path,
    /// over plain HTTP.
    pub fn options(&self) -> String {
        format!("endpoint={},path_style,insecure_http", self.endpoint())
    }

    /// A plain URL of an object in [`PUBLIC`].
    pub fn public_url(&self, key: &str) -> String {
        format!("{}/{PUBLIC}/{key}", self.endpoint())
    }

    fn bucket(&self, name: &str) -> Bucket {
        Bucket::new(
            self.endpoint().parse().unwrap(),
            UrlStyle::Path,
            name.to_owned(),
            "us-east-1".to_owned(),
        )
        .unwrap()
    }

    fn credentials() -> Credentials {
        Credentials::new(ACCESS_KEY, SECRET_KEY)
    }

    fn try_put(&self, bucket: &str, key: &str, data: &[u8]) -> Result<(), String> {
        let b = self.bucket(bucket);
        let creds = Self::credentials();
        let url = b
            .put_object(Some(&creds), key)
            .sign(Duration::from_secs(600));
        self.agent
            .put(url.as_str())
            .send(data)
            .map(drop)
            .map_err(|e| e.to_string())
    }

    /// Puts `data` as `bucket/key`, replacing what was there.
    pub fn put(&self, bucket: &str, key: &str, data: &[u8]) {
        self.try_put(bucket, key, data)
            .unwrap_or_else(|e| panic!("PUT {bucket}/{key}: {e}"));
    }

    /// Puts the file at `path` as `bucket/key`.
    pub fn put_file(&self, bucket: &str, key: &str, path: &Path) {
        self.put(bucket, key, &fs::read(path).unwrap());
    }
}

/// Removes the Unix sockets a killed `weed mini` leaves in /tmp, one per
/// listener, named after its port (`seaweedfs-filer-8888.sock`).
pub fn remove_sockets(ports: &[u16]) {
    let Ok(entries) = fs::read_dir("/tmp") else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("seaweedfs-")
            && ports.iter().any(|p| name.ends_with(&format!("-{p}.sock")))
        {
            let _ = fs::remove_file(e.path());
        }
    }
}

impl Drop for Weed {
    fn drop(&mut self) {
        self.kill();
    }
}

/// How the foliofs process finds its credentials.
#[derive(Clone, Debug)]
pub enum Creds {
    /// `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY`.
    Env,
    /// The given pair, through the same variables.
    Pair(&'static str, &'static str),
    /// `$HOME/.aws/credentials` of this home (and no `AWS_*` variables).
    Home(PathBuf),
    /// None at all: anonymous requests.
    Anonymous,
}

impl Creds {
    /// `NAME=VALUE` pairs for the foliofs process's environment.
    pub fn vars(&self) -> Vec<(String, OsString)> {
        let pair = |k: &str, s: &str| {
            vec![
                ("AWS_ACCESS_KEY_ID".to_owned(), OsString::from(k)),
                ("AWS_SECRET_ACCESS_KEY".to_owned(), OsString::from(s)),
            ]
        };
        match self {
            Creds::Env => pair(ACCESS_KEY, SECRET_KEY),
            Creds::Pair(k, s) => pair(k, s),
            Creds::Home(h) => vec![("HOME".to_owned(), h.clone().into_os_string())],
            Creds::Anonymous => vec![],
        }
    }

    /// A command running `foliofs ARGS` as `user` (or this process) with
    /// these credentials, and none from this process's environment.
    pub fn foliofs(&self, user: Option<&str>, extra_env: &[(&str, &Path)]) -> Command {
        let mut vars = self.vars();
        for (k, v) in extra_env {
            vars.push(((*k).to_owned(), v.as_os_str().to_owned()));
        }
        match user {
            // setpriv --reset-env clears the environment: `env` sets it
            // again inside.
            Some(u) => {
                let mut c = common::user_command(u, "/usr/bin/env");
                for (k, v) in &vars {
                    let mut kv = OsString::from(format!("{k}="));
                    kv.push(v);
                    c.arg(kv);
                }
                c.arg(common::bin());
                c
            }
            None => {
                let mut c = Command::new(common::bin());
                for k in [
                    "AWS_ACCESS_KEY_ID",
                    "AWS_SECRET_ACCESS_KEY",
                    "AWS_SESSION_TOKEN",
                    "AWS_PROFILE",
                    "AWS_SHARED_CREDENTIALS_FILE",
                    "AWS_CONFIG_FILE",
                    "AWS_REGION",
                    "AWS_DEFAULT_REGION",
                ] {
                    c.env_remove(k);
                }
                c.envs(vars);
                c
            }
        }
    }
}

/// `foliofs ARGS` with `creds`, bounded; (exit success, stdout, stderr).
pub fn foliofs_with(creds: &Creds, args: &[&str]) -> (bool, String, String) {
    let out = common::run_timeout(
        creds.foliofs(None, &[]).args(args),
        Duration::from_secs(120),
    );
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `foliofs mount -o OPTS URL <new dir>` with `creds`, as `user` where
/// given; extra environment in `env`.
pub fn mount_url(
    user: Option<&str>,
    creds: &Creds,
    url: &str,
    opts: &str,
    env: &[(&str, &Path)],
) -> Result<common::Mount, String> {
    let tmp = match user {
        Some(u) => common::user_tempdir(u),
        None => tempfile::Builder::new()
            .prefix("foliofs-mnt.")
            .tempdir()
            .unwrap(),
    };
    let mut cmd = creds.foliofs(user, env);
    cmd.arg("mount");
    if !opts.is_empty() {
        cmd.args(["-o", opts]);
    }
    cmd.arg(url).arg(tmp.path());
    common::Mount::by_command(user, &mut cmd, tmp.path()).map(|m| m.keeping(tmp))
}

/// The remote counters `foliofs mounts --stats` shows for the mount at
/// `dir`, once two reads agree (the server publishes them every 100 ms).
pub fn remote_stats(dir: &Path) -> std::collections::BTreeMap<String, u64> {
    let read = || {
        let out = common::foliofs_ok(["mounts", "--stats"]);
        let text = String::from_utf8(out).unwrap();
        let dir = dir.canonicalize().unwrap();
        let mut lines = text.lines();
        while let Some(l) = lines.next() {
            if l.split(' ').nth(1) == Some(dir.to_str().unwrap()) {
                for l in lines.by_ref() {
                    if let Some(r) = l.trim().strip_prefix("remote: ") {
                        return r
                            .split(' ')
                            .filter_map(|kv| kv.split_once('='))
                            .map(|(k, v)| (k.to_owned(), v.parse().unwrap()))
                            .collect();
                    }
                    if !l.starts_with(' ') {
                        break;
                    }
                }
            }
        }
        panic!("no remote counters for {} in:\n{text}", dir.display());
    };
    let mut last = read();
    for _ in 0..20 {
        std::thread::sleep(Duration::from_millis(250));
        let now = read();
        if now == last {
            return now;
        }
        last = now;
    }
    last
}

/// Bytes the files under `dir` take on the disk, all levels.
pub fn du(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut n = 0;
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    for e in entries.flatten() {
        let md = e.metadata().unwrap();
        if md.is_dir() {
            n += du(&e.path());
        } else {
            // What the disk holds: a cached object is a sparse file.
            n += md.blocks() * 512;
        }
    }
    n
}

pub fn file_count(dir: &Path) -> usize {
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| {
            if e.file_type().unwrap().is_dir() {
                file_count(&e.path())
            } else {
                1
            }
        })
        .sum()
}

/// A tree of every entry type, a few hundred small files and a larger
/// half-compressible file: what the images here hold.
pub fn source_tree(dir: &Path) {
    common::every_type_tree(dir);
    let many = dir.join("many");
    fs::create_dir(&many).unwrap();
    let mut rng = common::rng(7);
    for i in 0..300 {
        let n = (i * 37) % 5000;
        fs::write(
            many.join(format!("f{i:03}")),
            common::random_bytes(&mut rng, n),
        )
        .unwrap();
    }
    let mut f = std::io::BufWriter::new(fs::File::create(dir.join("mixed")).unwrap());
    for i in 0..200_000u32 {
        writeln!(f, "line {i} of a file that compresses well").unwrap();
    }
    f.write_all(&common::random_bytes(&mut rng, 2 << 20))
        .unwrap();
    f.flush().unwrap();
}

/// A test's images and their source: made in a temporary directory.
pub struct Images {
    pub tmp: tempfile::TempDir,
    pub src: PathBuf,
}

impl Images {
    pub fn new() -> Images {
        let tmp = tempfile::Builder::new()
            .prefix("foliofs-remote.")
            .tempdir()
            .unwrap();
        common::open_to_all(tmp.path());
        let src = tmp.path().join("src");
        source_tree(&src);
        Images { tmp, src }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.tmp.path().join(name)
    }

    /// A genromfs image of the source.
    pub fn romfs(&self) -> PathBuf {
        let img = self.path("tree.romfs");
        if !img.exists() {
            crate::romfs::util::genromfs(&self.src, &img, &[]);
        }
        img
    }

    /// An LZ4 EROFS image of the source.
    pub fn erofs_lz4(&self) -> PathBuf {
        let img = self.path("tree-lz4.erofs");
        if !img.exists() {
            common::mkfs_erofs(&["-zlz4hc", "-C65536"], &img, &self.src);
        }
        img
    }

    /// A chunked EROFS image whose file data is in a blob: (image, blob).
    pub fn erofs_chunked(&self) -> (PathBuf, PathBuf) {
        let img = self.path("tree-chunked.erofs");
        let blob = self.path("tree-chunked.blob");
        if !img.exists() {
            common::mkfs_erofs(
                &[
                    "--chunksize=65536".to_owned(),
                    format!("--blobdev={}", blob.display()),
                ],
                &img,
                &self.src,
            );
        }
        (img, blob)
    }
}

/// A cache directory for one test.
pub fn cache_dir(images: &Images, name: &str) -> PathBuf {
    let d = images.path(name);
    fs::create_dir_all(&d).unwrap();
    d
}

/// Asserts no process output says it panicked.
pub fn assert_no_panic(what: &str, text: &str) {
    assert!(!text.contains("panicked"), "{what}: a panic:\n{text}");
}

/// The lines of `text` that are not empty.
pub fn lines(text: &str) -> Vec<&str> {
    text.lines().filter(|l| !l.trim().is_empty()).collect()
}
