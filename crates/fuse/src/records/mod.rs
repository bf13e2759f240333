//! What each live foliofs server resolved for its mount (format, block size,
//! I/O mode, ...), kept in a file per mount id so `foliofs mounts` can show
//! it as a kernel file system's show_options would.
//!
//! Root keeps its records in `/run/foliofs`. A user cannot write there, so
//! a user's go to `$XDG_RUNTIME_DIR/foliofs` (the per-user runtime directory
//! a login session has), else `/run/user/UID/foliofs` where that exists,
//! else a `foliofs-UID` directory of the user's own (mode 0700) in the
//! temporary directory.
//!
//! Beside each record, the mount's request counts: counted by the server
//! ([`RequestCounts`]) and published for other processes ([`published`]),
//! read the same way and from the same directories as the records.

mod counts;
pub mod published;

pub use counts::{RequestCounts, EXTRA_NAMES};

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::MountInfo;

/// Root's records.
pub const ROOT_STATE_DIR: &str = "/run/foliofs";

/// One mount's record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountState {
    /// The kernel's id of the mount (`/proc/self/mountinfo`).
    pub mount_id: u64,
    /// The mount's process: the one serving it, or the supervisor that
    /// holds its connection (see [`crate::supervise::held`]).
    pub pid: u32,
    /// Under a supervisor: the process serving the mount now.
    pub server: Option<u32>,
    /// Under a supervisor: servers started after the first (a death, or
    /// an upgrade in place).
    pub restarts: u32,
    /// Under a supervisor: takeovers asked for whose new server did not
    /// come up (the old one served on).
    pub failed_takeovers: u32,
    /// The image (or `ramfs`) as the mount names it.
    pub source: String,
    /// Where it is mounted.
    pub mountpoint: PathBuf,
    /// Inner format: romfs, erofs, ramfs.
    pub format: String,
    /// Effective options of the format and the server (`blocksize=1K,buffered,...`).
    pub options: String,
}

fn uid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// The directories a user `owner`'s records may be in, most likely first.
/// `xdg` is that user's `$XDG_RUNTIME_DIR`, where known.
fn candidates(owner: u32, xdg: Option<PathBuf>) -> Vec<PathBuf> {
    let mut v = Vec::new();
    if owner == 0 {
        v.push(PathBuf::from(ROOT_STATE_DIR));
    }
    if let Some(x) = xdg.filter(|x| x.is_absolute()) {
        v.push(x.join("foliofs"));
    }
    v.push(
        Path::new("/run/user")
            .join(owner.to_string())
            .join("foliofs"),
    );
    v.push(std::env::temp_dir().join(format!("foliofs-{owner}")));
    v
}

/// Whether `dir` can hold this user's records: a real directory of ours
/// that nobody else may write (a user's may sit in a shared /tmp).
fn trusted(dir: &Path) -> bool {
    fs::symlink_metadata(dir).is_ok_and(|m| {
        m.is_dir() && m.uid() == uid() && (uid() == 0 || m.permissions().mode() & 0o022 == 0)
    })
}

/// This user's record directory, made if missing.
pub fn state_dir() -> io::Result<PathBuf> {
    let mut last = None;
    for dir in candidates(
        uid(),
        std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from),
    ) {
        // The per-user runtime directory is the session's to make.
        if dir.starts_with("/run/user") && !dir.parent().is_some_and(trusted) {
            continue;
        }
        match fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                last = Some(io::Error::new(e.kind(), format!("{}: {e}", dir.display())));
                continue;
            }
        }
        if trusted(&dir) {
            return Ok(dir);
        }
        last = Some(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{}: not a directory of uid {} closed to others",
                dir.display(),
                uid()
            ),
        ));
    }
    Err(last.unwrap_or_else(|| io::Error::other("no directory for mount records")))
}

/// This user's record directory if it exists (for reading).
pub fn own_dir() -> Option<PathBuf> {
    candidates(
        uid(),
        std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from),
    )
    .into_iter()
    .find(|d| trusted(d))
}

fn parse(mount_id: u64, text: &str) -> Option<MountState> {
    let kv: BTreeMap<&str, &str> = text.lines().filter_map(|l| l.split_once('=')).collect();
    Some(MountState {
        mount_id,
        pid: kv.get("pid")?.parse().ok()?,
        server: kv.get("server").and_then(|s| s.parse().ok()),
        restarts: kv.get("restarts").and_then(|s| s.parse().ok()).unwrap_or(0),
        failed_takeovers: kv
            .get("failed_takeovers")
            .and_then(|s| s.parse().ok())
            .unwrap_or(0),
        source: kv.get("source")?.to_string(),
        mountpoint: PathBuf::from(kv.get("mountpoint")?),
        format: kv.get("format")?.to_string(),
        options: kv.get("options")?.to_string(),
    })
}

fn load_from(dir: &Path, mount_id: u64) -> Option<MountState> {
    parse(
        mount_id,
        &fs::read_to_string(dir.join(mount_id.to_string())).ok()?,
    )
}

/// The directories mount `m`'s records may be in: this user's, then its
/// owner's (where this user may read them).
pub fn dirs_for(m: &MountInfo) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = own_dir().into_iter().collect();
    if let Some(owner) = m.user_id().filter(|&o| o != uid()) {
        dirs.extend(candidates(owner, None));
    }
    dirs
}

impl MountState {
    /// The record of a mount just made, served by `pid`, before any
    /// server has been restarted.
    pub fn new(info: &MountInfo, pid: u32, format: &str, options: String) -> Self {
        MountState {
            mount_id: info.mount_id,
            pid,
            server: None,
            restarts: 0,
            failed_takeovers: 0,
            source: info.source.clone(),
            mountpoint: info.mountpoint.clone(),
            format: format.to_owned(),
            options,
        }
    }

    /// Writes the record (atomically: a reader never sees half of it).
    pub fn save(&self) -> io::Result<()> {
        let dir = state_dir()?;
        let mut text = format!("pid={}\n", self.pid);
        if let Some(s) = self.server {
            text.push_str(&format!(
                "server={s}\nrestarts={}\nfailed_takeovers={}\n",
                self.restarts, self.failed_takeovers
            ));
        }
        text.push_str(&format!(
            "source={}\nmountpoint={}\nformat={}\noptions={}\n",
            self.source,
            self.mountpoint.display(),
            self.format,
            self.options
        ));
        let tmp = dir.join(format!(".{}.tmp", self.mount_id));
        fs::write(&tmp, text)?;
        fs::rename(tmp, dir.join(self.mount_id.to_string()))
    }

    /// The record of mount `m`, from this user's directory or its owner's
    /// (where this user may read it), if one names the same mount point.
    pub fn find(m: &MountInfo) -> Option<MountState> {
        dirs_for(m)
            .iter()
            .filter_map(|d| load_from(d, m.mount_id))
            .find(|s| s.mountpoint == m.mountpoint)
    }

    /// Removes this user's record of mount `mount_id`, if this process's.
    pub fn remove(mount_id: u64, pid: u32) {
        let Some(dir) = own_dir() else { return };
        if load_from(&dir, mount_id).is_some_and(|s| s.pid == pid) {
            let _ = fs::remove_file(dir.join(mount_id.to_string()));
        }
    }

    /// Removes this user's records whose mount is gone (`live` = ids of the
    /// foliofs mounts this namespace sees) and whose server has exited: a
    /// live server may be serving a mount in another mount namespace.
    pub fn prune(live: &[u64]) {
        let Some(dir) = own_dir() else { return };
        let Ok(entries) = fs::read_dir(&dir) else {
            return;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            let Some(id) = name.to_str().and_then(|n| n.parse::<u64>().ok()) else {
                continue;
            };
            if live.contains(&id) {
                continue;
            }
            if load_from(&dir, id).is_none_or(|s| !process_alive(s.pid)) {
                let _ = fs::remove_file(e.path());
            }
        }
    }
}

/// True while process `pid` exists (and is not a zombie).
pub fn process_alive(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z')),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_users_records_never_go_to_run_foliofs() {
        let c = candidates(1000, Some(PathBuf::from("/run/user/1000")));
        assert!(!c.contains(&PathBuf::from(ROOT_STATE_DIR)));
        assert_eq!(c[0], PathBuf::from("/run/user/1000/foliofs"));
        assert!(c.last().unwrap().ends_with(Path::new("foliofs-1000")));
        assert_eq!(candidates(0, None)[0], PathBuf::from(ROOT_STATE_DIR));
        // A relative XDG_RUNTIME_DIR is ignored, as the spec says.
        assert!(!candidates(5, Some(PathBuf::from("rel")))
            .iter()
            .any(|d| d.starts_with("rel")));
    }

    #[test]
    fn records_parse() {
        let s = parse(
            7,
            "pid=42\nsource=/i\nmountpoint=/m\nformat=romfs\noptions=a=b,c\n",
        )
        .unwrap();
        assert_eq!(
            (s.pid, s.format.as_str(), s.options.as_str()),
            (42, "romfs", "a=b,c")
        );
        assert!(parse(7, "pid=x\n").is_none());
        let s = parse(
            7,
            "pid=42\nserver=43\nrestarts=2\nsource=/i\nmountpoint=/m\nformat=erofs\noptions=\n",
        )
        .unwrap();
        assert_eq!((s.server, s.restarts), (Some(43), 2));
    }
}
