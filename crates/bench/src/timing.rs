//! The timed workloads: reads, writes, commands.

use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result};
use foliofs_testkit::mapping::Mapping;

use crate::env::run;

/// Reads `path` to the end with 1 MiB reads (what `dd bs=1M of=/dev/null`
/// does); returns seconds and bytes.
pub fn time_read(path: &Path) -> Result<(f64, u64)> {
    let mut buf = vec![0u8; 1 << 20];
    let start = Instant::now();
    let mut f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut total = 0u64;
    loop {
        let n = f
            .read(&mut buf)
            .with_context(|| format!("reading {} at {total}", path.display()))?;
        if n == 0 {
            break;
        }
        total += n as u64;
    }
    Ok((start.elapsed().as_secs_f64(), total))
}

/// Seconds `md5sum PATH` takes (the romfs seed's own workload).
pub fn time_md5(path: &Path) -> Result<f64> {
    let start = Instant::now();
    run(Command::new("md5sum").arg(path))?;
    Ok(start.elapsed().as_secs_f64())
}

/// Seconds a command takes, with its output discarded.
pub fn time_cmd(cmd: &mut Command) -> Result<f64> {
    let start = Instant::now();
    run(cmd)?;
    Ok(start.elapsed().as_secs_f64())
}

/// Writes `total` zero bytes to a new file in `bs`-byte writes (what
/// `dd if=/dev/zero bs=BS` does), closing it; returns seconds.
pub fn time_write_zeros(path: &Path, total: u64, bs: usize) -> Result<f64> {
    let buf = vec![0u8; bs];
    let start = Instant::now();
    let mut f = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut left = total;
    while left > 0 {
        let n = left.min(bs as u64) as usize;
        f.write_all(&buf[..n])
            .with_context(|| format!("writing {}", path.display()))?;
        left -= n as u64;
    }
    drop(f);
    Ok(start.elapsed().as_secs_f64())
}

/// Writes `total` zero bytes over an existing file from its start, in
/// `bs`-byte writes, without truncating it (`dd conv=notrunc`); returns
/// seconds.
pub fn time_rewrite(path: &Path, total: u64, bs: usize) -> Result<f64> {
    let buf = vec![0u8; bs];
    let start = Instant::now();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    let mut left = total;
    while left > 0 {
        let n = left.min(bs as u64) as usize;
        f.write_all(&buf[..n])
            .with_context(|| format!("rewriting {}", path.display()))?;
        left -= n as u64;
    }
    drop(f);
    Ok(start.elapsed().as_secs_f64())
}

/// Reads a whole file through a shared mapping, 2 MiB at a time into a
/// buffer (what a program reading a mapped file does); returns seconds.
pub fn time_mmap_read(path: &Path) -> Result<f64> {
    let f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let len = usize::try_from(f.metadata()?.len())?;
    if len == 0 {
        return Ok(0.0);
    }
    let mut buf = vec![0u8; 2 << 20];
    let start = Instant::now();
    let map = Mapping::read_only(&f, len).with_context(|| format!("mapping {}", path.display()))?;
    let mut at = 0;
    while at < len {
        let n = (len - at).min(buf.len());
        map.copy_out(at, &mut buf[..n]);
        at += n;
    }
    std::hint::black_box(&buf);
    // Unmapping is part of reading through a mapping.
    drop(map);
    Ok(start.elapsed().as_secs_f64())
}

/// Reads every regular file under `dir` (the container start-up set).
pub fn time_read_tree(dir: &Path) -> Result<f64> {
    let start = Instant::now();
    let mut buf = vec![0u8; 1 << 20];
    read_tree(dir, &mut buf)?;
    Ok(start.elapsed().as_secs_f64())
}

fn read_tree(dir: &Path, buf: &mut [u8]) -> Result<()> {
    for e in fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let e = e?;
        let t = e.file_type()?;
        if t.is_dir() {
            read_tree(&e.path(), buf)?;
        } else if t.is_file() {
            let mut f = File::open(e.path())?;
            while f.read(buf)? > 0 {}
        }
    }
    Ok(())
}

/// Seconds to read the first byte of the first regular file a walk of
/// `dir` meets (as [`time_read_tree`] walks it): how long a start waits
/// before its first file's data.
pub fn time_first_byte(dir: &Path) -> Result<f64> {
    fn first(dir: &Path) -> Result<Option<std::path::PathBuf>> {
        for e in fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
            let e = e?;
            let t = e.file_type()?;
            if t.is_file() {
                return Ok(Some(e.path()));
            }
            if t.is_dir() {
                if let Some(f) = first(&e.path())? {
                    return Ok(Some(f));
                }
            }
        }
        Ok(None)
    }
    let start = Instant::now();
    let f = first(dir)?.with_context(|| format!("no file under {}", dir.display()))?;
    let mut byte = [0u8; 1];
    File::open(&f)
        .and_then(|mut h| h.read(&mut byte))
        .with_context(|| format!("reading {}", f.display()))?;
    Ok(start.elapsed().as_secs_f64())
}
