//! Seeded data: files and trees that are the same bytes on every machine
//! and every run, so a test's fixture or a bench's image can be made again
//! rather than stored.

use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::path::Path;

use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

/// The seeded generator: rand's `StdRng`, whose stream Cargo.lock pins.
pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// `n` bytes from `rng`.
pub fn random_bytes(rng: &mut impl RngCore, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    rng.fill_bytes(&mut v);
    v
}

fn create(path: &Path) -> io::Result<BufWriter<File>> {
    let f = File::create(path)
        .map_err(|e| io::Error::new(e.kind(), format!("creating {}: {e}", path.display())))?;
    Ok(BufWriter::with_capacity(1 << 20, f))
}

/// Writes `size` pseudo-random (incompressible) bytes to `path`,
/// streaming, so a large file costs no memory.
pub fn random_file(path: &Path, size: u64, seed: u64) -> io::Result<()> {
    let mut rng = rng(seed);
    let mut w = create(path)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut left = size;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        rng.fill_bytes(&mut buf[..n]);
        w.write_all(&buf[..n])?;
        left -= n as u64;
    }
    w.flush()
}

/// Writes `size` bytes to `path` that LZ4 halves: each 64 KiB is half
/// random, half one repeated byte.
pub fn compressible_file(path: &Path, size: u64, seed: u64) -> io::Result<()> {
    let mut rng = rng(seed);
    let mut w = create(path)?;
    let mut buf = vec![0u8; 64 << 10];
    let mut left = size;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        rng.fill_bytes(&mut buf[..n / 2]);
        let b = rng.next_u64() as u8;
        buf[n / 2..n].fill(b);
        w.write_all(&buf[..n])?;
        left -= n as u64;
    }
    w.flush()
}

/// What [`tree`] made, or [`measure_tree`] found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TreeStats {
    /// Files (anything but a directory).
    pub files: u64,
    /// Directories below the top.
    pub dirs: u64,
    /// Bytes of the files.
    pub bytes: u64,
}

/// A tree of about `files` files and `bytes` bytes: mostly small files
/// (source, config, scripts), some medium ones, a few large (libraries,
/// assets), spread over directories of 5 to 30 entries, as a root file
/// system or an application image has. Half of each file is random and half
/// repeats, so compressing formats get something to do.
pub fn tree(dir: &Path, files: u64, bytes: u64, seed: u64) -> io::Result<TreeStats> {
    let mut rng = rng(seed);
    // Size classes: (share of files in per-mille, min, max). Their mean
    // gives the scale factor that hits the byte target.
    const CLASSES: [(u64, u64, u64); 4] = [
        (700, 0, 16 << 10),
        (220, 16 << 10, 256 << 10),
        (70, 256 << 10, 2 << 20),
        (10, 2 << 20, 24 << 20),
    ];
    let mean: f64 = CLASSES
        .iter()
        .map(|&(share, lo, hi)| share as f64 / 1000.0 * (lo + hi) as f64 / 2.0)
        .sum();
    let scale = (bytes as f64 / files.max(1) as f64) / mean;
    let mut stats = TreeStats::default();
    let mut dirs = vec![dir.to_owned()];
    fs::create_dir_all(dir)?;
    let mut in_dir = 0u64;
    let mut dir_cap = 5 + rng.gen_range(0..26);
    let mut buf = vec![0u8; 1 << 20];
    for i in 0..files {
        if in_dir >= dir_cap {
            let parent = dirs[rng.gen_range(0..dirs.len())].clone();
            let d = parent.join(format!("d{:04}", stats.dirs));
            fs::create_dir(&d)?;
            stats.dirs += 1;
            dirs.push(d);
            in_dir = 0;
            dir_cap = 5 + rng.gen_range(0..26);
        }
        let pick = rng.gen_range(0..1000);
        let mut acc = 0;
        let mut size = 0u64;
        for &(share, lo, hi) in &CLASSES {
            acc += share;
            if pick < acc {
                size = (rng.gen_range(lo..=hi) as f64 * scale) as u64;
                break;
            }
        }
        let target = dirs
            .last()
            .expect("at least the root")
            .join(format!("f{i:05}.dat"));
        let mut w = BufWriter::new(File::create(&target)?);
        let mut left = size;
        while left > 0 {
            let n = left.min(buf.len() as u64) as usize;
            rng.fill_bytes(&mut buf[..n / 2]);
            buf[n / 2..n].fill((i % 251) as u8);
            w.write_all(&buf[..n])?;
            left -= n as u64;
        }
        w.flush()?;
        stats.files += 1;
        stats.bytes += size;
        in_dir += 1;
    }
    Ok(stats)
}

/// Counts files, directories and bytes of an existing tree.
pub fn measure_tree(dir: &Path) -> io::Result<TreeStats> {
    let mut s = TreeStats::default();
    let entries = fs::read_dir(dir)
        .map_err(|e| io::Error::new(e.kind(), format!("listing {}: {e}", dir.display())))?;
    for e in entries {
        let e = e?;
        let md = e.metadata()?;
        if md.is_dir() {
            s.dirs += 1;
            let sub = measure_tree(&e.path())?;
            s.files += sub.files;
            s.dirs += sub.dirs;
            s.bytes += sub.bytes;
        } else {
            s.files += 1;
            s.bytes += md.len();
        }
    }
    Ok(s)
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trees_are_deterministic_and_near_their_targets() {
        let t = tempfile::tempdir().unwrap();
        let a = tree(&t.path().join("a"), 400, 20 << 20, 7).unwrap();
        let b = tree(&t.path().join("b"), 400, 20 << 20, 7).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.files, 400);
        assert!(a.dirs >= 10, "{a:?}");
        // The size mix is random; the total lands within a factor of two.
        assert!(a.bytes > (10 << 20) && a.bytes < (40 << 20), "{a:?}");
        assert_eq!(measure_tree(&t.path().join("a")).unwrap().files, 400);
        let out = std::process::Command::new("diff")
            .arg("-r")
            .arg(t.path().join("a"))
            .arg(t.path().join("b"))
            .status()
            .unwrap();
        assert!(out.success());
    }

    #[test]
    fn random_files_differ_by_seed() {
        let t = tempfile::tempdir().unwrap();
        random_file(&t.path().join("x"), 5000, 1).unwrap();
        random_file(&t.path().join("y"), 5000, 2).unwrap();
        let x = fs::read(t.path().join("x")).unwrap();
        assert_eq!(x.len(), 5000);
        assert_ne!(x, fs::read(t.path().join("y")).unwrap());
    }
}
