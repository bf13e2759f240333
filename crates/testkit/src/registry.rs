//! A registry of the caller's own: Debian's `docker-registry` (the CNCF
//! distribution server) on loopback, on a port found free for it, its
//! storage in a temporary directory, killed when dropped (and with the
//! thread that started it, should the process die before a drop can run).

use std::fs;
use std::io;
use std::net::{TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long the server may take to start.
const START: Duration = Duration::from_secs(30);

/// What the server is started with.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// The `auth:` section of its configuration, one line of YAML's flow
    /// style (`auth: {htpasswd: {...}}`), or empty for none.
    pub auth: String,
    /// Where to make its directory (the temporary directory when `None`).
    pub parent: Option<PathBuf>,
}

/// A running `docker-registry`.
pub struct Registry {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
}

impl Registry {
    /// Starts a registry and waits until it takes connections. A port is
    /// free when picked and taken by the server a moment later, so a
    /// server that exits at once is tried again on another.
    pub fn start(options: &Options) -> io::Result<Registry> {
        let program = crate::find_program("docker-registry")
            .ok_or_else(|| io::Error::other("docker-registry is not installed"))?;
        let mut b = tempfile::Builder::new();
        b.prefix("foliofs-registry.");
        let mut dir = match &options.parent {
            Some(p) => b.tempdir_in(p)?,
            None => b.tempdir()?,
        };
        let mut last = String::new();
        for _ in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
            let config = dir.path().join("config.yml");
            fs::write(
                &config,
                format!(
                    "version: 0.1\nlog: {{level: error}}\n\
                     storage: {{filesystem: {{rootdirectory: {}}}, delete: {{enabled: true}}}}\n\
                     http: {{addr: 127.0.0.1:{port}}}\n{}\n",
                    dir.path().join("data").display(),
                    options.auth
                ),
            )?;
            let log = fs::File::create(dir.path().join("log"))?;
            let mut cmd = Command::new(&program);
            cmd.arg("serve")
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .process_group(0);
            // SAFETY: prctl(PR_SET_PDEATHSIG) is async-signal-safe and
            // touches no memory of this process.
            unsafe {
                cmd.pre_exec(|| {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    Ok(())
                });
            }
            let mut r = Registry {
                child: Some(cmd.spawn()?),
                port,
                dir,
            };
            let start = Instant::now();
            while start.elapsed() < START && !r.exited() {
                if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    return Ok(r);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            r.kill();
            last = fs::read_to_string(r.dir.path().join("log")).unwrap_or_default();
            let next = tempfile::Builder::new()
                .prefix("foliofs-registry.")
                .tempdir_in(r.dir.path().parent().unwrap_or(Path::new("/tmp")))?;
            dir = std::mem::replace(&mut r.dir, next);
        }
        Err(io::Error::other(format!(
            "docker-registry did not start in 5 tries: {}",
            last.trim()
        )))
    }

    fn exited(&mut self) -> bool {
        self.child
            .as_mut()
            .is_none_or(|c| c.try_wait().ok().flatten().is_some())
    }

    /// `127.0.0.1:PORT`.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Its directory (its configuration, log and storage under `data/`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The file the blob `digest` (`sha256:HEX`) is stored in.
    pub fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
        self.dir
            .path()
            .join("data/docker/registry/v2/blobs/sha256")
            .join(hex.get(..2).unwrap_or(""))
            .join(hex)
            .join("data")
    }

    /// Kills the registry (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        self.kill();
    }
}
