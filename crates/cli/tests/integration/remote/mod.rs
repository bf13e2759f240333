//! Images in object storage: each test starts a SeaweedFS of its own on
//! loopback (`weed mini`, every port its own), puts images in it with a
//! SigV4 client, and mounts or reads them by `s3://` or `http://` URL. What
//! a remote mount shows is compared with a foliofs mount of the same image
//! as a local file; the cache, the failures and the user's mounts are
//! checked against the server's state and the mount's own counters.

mod cache;
mod campaign;
mod digest;
mod faults;
mod mount;
mod user;
mod verify;

use std::ffi::OsString;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common;

pub use foliofs_testkit::weed::{Weed, ACCESS_KEY, SECRET_KEY};

/// A bucket that needs credentials.
pub const BUCKET: &str = "test";
/// A bucket anyone may read: objects in it are reachable by plain URL.
pub const PUBLIC: &str = "public";

/// Starts a server of this test's own with buckets [`BUCKET`] and
/// [`PUBLIC`]; the caller has `require!`d `weed`.
pub fn start_weed() -> Weed {
    Weed::start(foliofs_testkit::weed::Options {
        public: Some(PUBLIC.to_owned()),
        ..foliofs_testkit::weed::Options::buckets(&[BUCKET, PUBLIC])
    })
    .unwrap_or_else(|e| panic!("{e}"))
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
