//! The small-file workloads, each timed on whatever file system holds
//! its directory.

use std::fs::{self, File};
use std::io::Write;
use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result};

/// Entries (files, directories, links) under `dir`, `dir` itself left out.
pub(super) fn count_entries(dir: &Path) -> Result<u64> {
    let mut n = 0;
    for e in fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let e = e?;
        n += 1;
        if e.file_type()?.is_dir() {
            n += count_entries(&e.path())?;
        }
    }
    Ok(n)
}

/// `n` files of 100 bytes in a new directory `dir` (open, write, close
/// each, as a build or a mail spool does); returns seconds.
pub(super) fn create_files(dir: &Path, n: u64) -> Result<f64> {
    fs::create_dir(dir).with_context(|| format!("creating {}", dir.display()))?;
    let buf = [b'x'; 100];
    let start = Instant::now();
    for i in 0..n {
        let p = dir.join(format!("f{i}"));
        let mut f = File::create(&p).with_context(|| format!("creating {}", p.display()))?;
        f.write_all(&buf)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(start.elapsed().as_secs_f64())
}

/// Unlinks every other file [`create_files`] made; returns seconds.
pub(super) fn unlink_half(dir: &Path, n: u64) -> Result<f64> {
    let start = Instant::now();
    for i in (0..n).step_by(2) {
        let p = dir.join(format!("f{i}"));
        fs::remove_file(&p).with_context(|| format!("removing {}", p.display()))?;
    }
    Ok(start.elapsed().as_secs_f64())
}

/// Writes of one byte to one place in a new write-only file in `dir`;
/// returns microseconds per write. On a foliofs ramfs each is one WRITE
/// request and its reply with next to no work between: the cost of a
/// round trip, which bounds from below what a FUSE file system can do.
pub(super) fn one_byte_writes(dir: &Path, n: u64) -> Result<f64> {
    use std::os::unix::fs::FileExt;
    let p = dir.join("trip");
    let f = File::create(&p).with_context(|| format!("creating {}", p.display()))?;
    let write = || {
        f.write_at(b"x", 0)
            .with_context(|| format!("writing {}", p.display()))
    };
    // The first write allocates the file's block.
    for _ in 0..10 {
        write()?;
    }
    let start = Instant::now();
    for _ in 0..n {
        write()?;
    }
    Ok(start.elapsed().as_secs_f64() * 1e6 / n as f64)
}

/// `getxattr(2)`s of a name no file has, on one open file in `dir`;
/// returns microseconds per call. FUSE caches no extended attribute, so on
/// foliofs each is one GETXATTR request and its reply on every data path
/// (where a passed-through ramfs answers a write in the kernel, the
/// 1-byte write is no round trip any more): the cost of one round trip.
pub(super) fn missing_xattr_reads(dir: &Path, n: u64) -> Result<f64> {
    use std::os::fd::AsRawFd;
    let p = dir.join("probe");
    let f = File::create(&p).with_context(|| format!("creating {}", p.display()))?;
    let name = c"user.foliofs.bench.missing";
    let get = || {
        // SAFETY: a valid descriptor, a NUL-terminated name, and a zero-sized
        // buffer (the call only says how long the value is, or that there
        // is none).
        let r = unsafe { libc::fgetxattr(f.as_raw_fd(), name.as_ptr(), std::ptr::null_mut(), 0) };
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::ENODATA | libc::EOPNOTSUPP) if r < 0 => Ok(()),
            _ if r >= 0 => anyhow::bail!(
                "{} has {name:?}, which the probe expects absent",
                p.display()
            ),
            _ => Err(e).with_context(|| format!("getxattr of {}", p.display())),
        }
    };
    for _ in 0..10 {
        get()?;
    }
    let start = Instant::now();
    for _ in 0..n {
        get()?;
    }
    Ok(start.elapsed().as_secs_f64() * 1e6 / n as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_xattr_reads_time_each_call() {
        let d = tempfile::tempdir().unwrap();
        let us = missing_xattr_reads(d.path(), 100).unwrap();
        assert!(us > 0.0 && us.is_finite());
    }

    #[test]
    fn one_byte_writes_time_each_write() {
        let d = tempfile::tempdir().unwrap();
        let us = one_byte_writes(d.path(), 100).unwrap();
        assert!(us > 0.0 && us.is_finite());
        assert_eq!(fs::read(d.path().join("trip")).unwrap(), b"x");
    }

    #[test]
    fn small_files_are_made_and_half_removed() {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("s");
        create_files(&dir, 10).unwrap();
        unlink_half(&dir, 10).unwrap();
        assert_eq!(count_entries(&dir).unwrap(), 5);
        assert_eq!(fs::metadata(dir.join("f1")).unwrap().len(), 100);
    }
}
