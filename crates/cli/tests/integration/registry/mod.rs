//! Images pulled from a registry: Debian's docker-registry (the CNCF
//! distribution server) of each test's own on loopback, the umoci images
//! of [`crate::image`] pushed into it with skopeo, then pulled and
//! mounted as `docker://` references and compared with `umoci unpack` of
//! the same layout; with htpasswd basic auth, an index of platforms, a
//! blob damaged in the registry's storage, a connection broken off mid
//! blob (a fault proxy in front) and a registry killed mid-pull; and with
//! token auth, the tokens from a token service of the tests' own
//! ([`token`]), expiring mid-pull too.

use std::fs;
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use crate::common;

mod pull;
mod token;
mod token_auth;

/// How long a registry has to start listening.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// A docker-registry serving plain HTTP on a free loopback port, its
/// storage in a directory of its own; killed when dropped (a failed test
/// too).
pub struct Registry {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
}

impl Registry {
    /// Starts one, with htpasswd basic auth for `user`:`pass` when given.
    pub fn start(basic: Option<(&str, &str)>) -> Registry {
        let dir = tempfile::Builder::new()
            .prefix("foliofs-registry.")
            .tempdir()
            .unwrap();
        let auth = match basic {
            Some((user, pass)) => {
                let out = common::run_timeout(
                    Command::new("htpasswd").args(["-Bbn", user, pass]),
                    Duration::from_secs(30),
                );
                assert!(
                    out.status.success(),
                    "{}",
                    String::from_utf8_lossy(&out.stderr)
                );
                let file = dir.path().join("htpasswd");
                fs::write(&file, &out.stdout).unwrap();
                format!(
                    "auth: {{htpasswd: {{realm: foliofs-test, path: {}}}}}\n",
                    file.display()
                )
            }
            None => String::new(),
        };
        Registry::start_with(dir, auth)
    }

    /// Starts one that takes the bearer tokens of `tokens`.
    pub fn with_tokens(tokens: &token::TokenServer) -> Registry {
        let dir = tempfile::Builder::new()
            .prefix("foliofs-registry.")
            .tempdir()
            .unwrap();
        let auth = format!(
            "auth: {{token: {{realm: \"{}\", service: {}, issuer: {}, rootcertbundle: {}}}}}\n",
            tokens.realm(),
            token::SERVICE,
            token::ISSUER,
            tokens.cert().display()
        );
        Registry::start_with(dir, auth)
    }

    /// Starts one in `dir` with the `auth:` section `auth` of its config.
    fn start_with(mut dir: tempfile::TempDir, auth: String) -> Registry {
        // The port is free when asked for; another process may take it
        // before the registry does, so a registry that exits is tried
        // again on another.
        for _ in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let config = dir.path().join("config.yml");
            fs::write(
                &config,
                format!(
                    "version: 0.1\nlog: {{level: error}}\n\
                     storage: {{filesystem: {{rootdirectory: {}}}, delete: {{enabled: true}}}}\n\
                     http: {{addr: 127.0.0.1:{port}}}\n{auth}",
                    dir.path().join("data").display()
                ),
            )
            .unwrap();
            let log = fs::File::create(dir.path().join("log")).unwrap();
            let child = Command::new("docker-registry")
                .arg("serve")
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .unwrap();
            let mut r = Registry {
                child: Some(child),
                port,
                dir,
            };
            let up = common::wait_until(START_TIMEOUT, || {
                r.exited() || TcpStream::connect(("127.0.0.1", port)).is_ok()
            });
            if up && !r.exited() {
                return r;
            }
            r.kill();
            let log = fs::read_to_string(r.dir.path().join("log")).unwrap_or_default();
            eprintln!("docker-registry on port {port} did not start: {log}");
            dir = std::mem::replace(&mut r.dir, tempfile::tempdir().unwrap());
        }
        panic!("docker-registry did not start in 5 tries");
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

    /// `http://127.0.0.1:PORT`, for a proxy in front.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.host())
    }

    /// The file a blob is stored in.
    pub fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap();
        self.dir
            .path()
            .join("data/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
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

/// `skopeo copy` of the layout `layout`'s image `tag` into `dest`
/// (`docker://HOST/REPO:TAG`), with `extra` options.
pub fn push(layout: &Path, tag: &str, dest: &str, extra: &[&str]) {
    let out = common::run_timeout(
        Command::new("skopeo")
            .args(["copy", "--quiet", "--dest-tls-verify=false"])
            .args(extra)
            .arg(format!("oci:{}:{tag}", layout.display()))
            .arg(dest),
        Duration::from_secs(300),
    );
    assert!(
        out.status.success(),
        "skopeo copy to {dest}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A `foliofs` command with the store at `store`, and no auth file but
/// the one `auth_file` names (none of the machine's own).
pub fn foliofs(store: &Path, auth_file: Option<&Path>) -> Command {
    let mut cmd = Command::new(common::bin());
    cmd.env(crate::image::STORE_ENV, store)
        .env("HOME", store)
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("REGISTRY_AUTH_FILE");
    if let Some(f) = auth_file {
        cmd.env("REGISTRY_AUTH_FILE", f);
    }
    cmd
}

/// `foliofs pull --tls-verify=false REFERENCE` (bounded).
pub fn pull(store: &Path, auth_file: Option<&Path>, reference: &str, extra: &[&str]) -> Output {
    common::run_timeout(
        foliofs(store, auth_file)
            .args(["pull", "--tls-verify=false"])
            .args(extra)
            .arg(reference),
        Duration::from_secs(300),
    )
}

/// An auth file with basic credentials for `host`.
pub fn auth_file(path: &Path, host: &str, user: &str, pass: &str) {
    use base64::Engine as _;
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"));
    let mut f = fs::File::create(path).unwrap();
    writeln!(f, r#"{{"auths": {{"{host}": {{"auth": "{auth}"}}}}}}"#).unwrap();
}

/// The files in `store` whose names hold `hex`, and any temporary file.
pub fn store_traces(store: &Path, hex: &str) -> Vec<String> {
    let Ok(rd) = fs::read_dir(store) else {
        return Vec::new();
    };
    rd.flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        // The store's lock file is the store's, not a build's trace.
        .filter(|n| n != ".lock" && (n.contains(hex) || n.starts_with('.')))
        .collect()
}
