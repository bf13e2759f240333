//! Images pulled from a registry: Debian's docker-registry (the CNCF
//! distribution server) of each test's own on loopback, the umoci images
//! of [`crate::image`] pushed into it with skopeo, then pulled and
//! mounted as `docker://` references and compared with `umoci unpack` of
//! the same layout; with htpasswd basic auth, an index of platforms, a
//! blob damaged in the registry's storage, a connection broken off mid
//! blob (a fault proxy in front) and a registry killed mid-pull; and with
//! token auth, the tokens from a token service of the tests' own
//! ([`token`]), expiring mid-pull too; and `foliofs push` of native EROFS
//! images, checked with skopeo, the kernel and veritysetup
//! ([`push_erofs`]).

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use crate::common;

mod lazy;
mod pull;
mod push_erofs;
mod token;
mod token_auth;

/// A docker-registry serving plain HTTP on a free loopback port, its
/// storage in a directory of its own (testkit's); killed when dropped (a
/// failed test too).
pub struct Registry {
    inner: foliofs_testkit::registry::Registry,
    /// What its config names (an htpasswd file), kept while it runs.
    _aux: tempfile::TempDir,
}

impl Registry {
    /// Starts one, with htpasswd basic auth for `user`:`pass` when given.
    pub fn start(basic: Option<(&str, &str)>) -> Registry {
        let aux = tempfile::Builder::new()
            .prefix("foliofs-registry-auth.")
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
                let file = aux.path().join("htpasswd");
                fs::write(&file, &out.stdout).unwrap();
                format!(
                    "auth: {{htpasswd: {{realm: foliofs-test, path: {}}}}}",
                    file.display()
                )
            }
            None => String::new(),
        };
        Registry::start_with(aux, auth)
    }

    /// Starts one that takes the bearer tokens of `tokens`.
    pub fn with_tokens(tokens: &token::TokenServer) -> Registry {
        let aux = tempfile::Builder::new()
            .prefix("foliofs-registry-auth.")
            .tempdir()
            .unwrap();
        let auth = format!(
            "auth: {{token: {{realm: \"{}\", service: {}, issuer: {}, rootcertbundle: {}}}}}",
            tokens.realm(),
            token::SERVICE,
            token::ISSUER,
            tokens.cert().display()
        );
        Registry::start_with(aux, auth)
    }

    /// Starts one with the `auth:` section `auth` of its config.
    fn start_with(aux: tempfile::TempDir, auth: String) -> Registry {
        let inner =
            foliofs_testkit::registry::Registry::start(&foliofs_testkit::registry::Options {
                auth,
                parent: None,
            })
            .unwrap_or_else(|e| panic!("{e}"));
        Registry { inner, _aux: aux }
    }

    /// `127.0.0.1:PORT`.
    pub fn host(&self) -> String {
        self.inner.host()
    }

    /// `http://127.0.0.1:PORT`, for a proxy in front.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.host())
    }

    /// The file a blob is stored in.
    pub fn blob_file(&self, digest: &str) -> PathBuf {
        self.inner.blob_file(digest)
    }

    /// Kills the registry (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        self.inner.kill();
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
