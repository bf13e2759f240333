//! What each live foliofs server resolved for its mount (format, block size,
//! I/O mode, ...), kept in `/run/foliofs/<mount id>` so `foliofs mounts` can
//! show it as a kernel file system's show_options would.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// Where the state files live.
pub const STATE_DIR: &str = "/run/foliofs";

/// One mount's record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountState {
    pub mount_id: u64,
    pub pid: u32,
    pub source: String,
    pub mountpoint: PathBuf,
    /// Inner format: romfs, erofs, ramfs.
    pub format: String,
    /// Effective options of the format and the server (`blocksize=1K,buffered,...`).
    pub options: String,
}

fn path_of(mount_id: u64) -> PathBuf {
    Path::new(STATE_DIR).join(mount_id.to_string())
}

impl MountState {
    /// Writes the record (atomically: a reader never sees half of it).
    pub fn save(&self) -> io::Result<()> {
        fs::create_dir_all(STATE_DIR)?;
        let text = format!(
            "pid={}\nsource={}\nmountpoint={}\nformat={}\noptions={}\n",
            self.pid,
            self.source,
            self.mountpoint.display(),
            self.format,
            self.options
        );
        let tmp = Path::new(STATE_DIR).join(format!(".{}.tmp", self.mount_id));
        fs::write(&tmp, text)?;
        fs::rename(tmp, path_of(self.mount_id))
    }

    /// The record of mount `mount_id`, if there is a readable one.
    pub fn load(mount_id: u64) -> Option<MountState> {
        let text = fs::read_to_string(path_of(mount_id)).ok()?;
        let kv: BTreeMap<&str, &str> = text.lines().filter_map(|l| l.split_once('=')).collect();
        Some(MountState {
            mount_id,
            pid: kv.get("pid")?.parse().ok()?,
            source: kv.get("source")?.to_string(),
            mountpoint: PathBuf::from(kv.get("mountpoint")?),
            format: kv.get("format")?.to_string(),
            options: kv.get("options")?.to_string(),
        })
    }

    /// Removes the record of mount `mount_id`, if this process's.
    pub fn remove(mount_id: u64, pid: u32) {
        if Self::load(mount_id).is_some_and(|s| s.pid == pid) {
            let _ = fs::remove_file(path_of(mount_id));
        }
    }

    /// Removes records whose mount is gone (`live` = ids of live foliofs mounts).
    pub fn prune(live: &[u64]) {
        let Ok(dir) = fs::read_dir(STATE_DIR) else {
            return;
        };
        for e in dir.flatten() {
            let name = e.file_name();
            if let Some(id) = name.to_str().and_then(|n| n.parse::<u64>().ok()) {
                if !live.contains(&id) {
                    let _ = fs::remove_file(e.path());
                }
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
