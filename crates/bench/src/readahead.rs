//! The disk's read-ahead, set for a section and put back after: a row that
//! reads the image file itself must read it as far ahead as foliofs's
//! mounts read theirs, or the ratio shows read-ahead, not FUSE.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{Context, Result};

/// Settings to put back if the run is interrupted: (sysfs file, value).
static SET: Mutex<Vec<(PathBuf, String)>> = Mutex::new(Vec::new());

/// The `read_ahead_kb` file of the disk holding `path`, if it is on a
/// block device: a partition's is its disk's queue.
pub(crate) fn disk_read_ahead_file(path: &Path) -> Option<PathBuf> {
    let dev = fs::metadata(path).ok()?.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let sys = fs::canonicalize(format!("/sys/dev/block/{major}:{minor}")).ok()?;
    let disk = if sys.join("partition").exists() {
        sys.parent()?.to_owned()
    } else {
        sys
    };
    let f = disk.join("queue/read_ahead_kb");
    f.exists().then_some(f)
}

/// The disk's read-ahead held at a value while this lives.
pub(crate) struct DiskReadAhead {
    file: PathBuf,
    was: String,
}

impl DiskReadAhead {
    /// Sets the read-ahead of the disk holding `path` to `kb` (root only),
    /// or says why it cannot be.
    pub(crate) fn set(path: &Path, kb: u32) -> Result<DiskReadAhead> {
        let file = disk_read_ahead_file(path)
            .with_context(|| format!("{} is not on a block device", path.display()))?;
        let was = fs::read_to_string(&file)
            .with_context(|| format!("reading {}", file.display()))?
            .trim()
            .to_owned();
        let mut set = SET.lock().unwrap_or_else(|e| e.into_inner());
        fs::write(&file, kb.to_string()).with_context(|| format!("writing {}", file.display()))?;
        set.push((file.clone(), was.clone()));
        Ok(DiskReadAhead { file, was })
    }

    /// What the disk read ahead before, in KiB.
    pub(crate) fn was(&self) -> &str {
        &self.was
    }
}

impl Drop for DiskReadAhead {
    fn drop(&mut self) {
        let _ = fs::write(&self.file, &self.was);
        SET.lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(f, _)| f != &self.file);
    }
}

/// Puts back every read-ahead still set (the Ctrl-C handler).
pub(crate) fn restore_all() {
    for (f, was) in SET
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .drain(..)
        .rev()
    {
        let _ = fs::write(f, was);
    }
}
