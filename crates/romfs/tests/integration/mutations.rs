//! A deterministic, stable-toolchain cousin of the fuzz target: thousands of
//! damaged variants of a real image (bytes, words and pointers changed), each
//! opened, walked completely and checked. None may panic or loop; inputs the
//! fuzzer finds go in `REGRESSIONS` below.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::path::Path;

use foliofs_block::{BlockSizeChoice, OpenOptions};
use foliofs_romfs::{check, mkfs, Corrupt, RomFs};
use foliofs_vfs::{FileSystem, FileType, Scratch};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Inputs found by `scripts/fuzz` (none so far), as (name, bytes).
const REGRESSIONS: &[(&str, &[u8])] = &[];

/// Walks everything reachable; returns the number of entries seen.
fn walk(fs: &RomFs) -> usize {
    let mut scratch = Scratch::new();
    let mut seen = HashSet::from([fs.root()]);
    let mut stack = vec![fs.root()];
    let mut n = 0;
    while let Some(dir) = stack.pop() {
        // What a READDIRPLUS does first: reading ahead must survive damage too.
        fs.prefetch_dir(dir, 0, true);
        let mut entries = Vec::new();
        if fs
            .readdir(dir, 0, &mut |e| {
                entries.push((e.name.to_owned(), e.ino));
                false
            })
            .is_err()
        {
            continue;
        }
        let _ = fs.lookup(dir, OsStr::new(".."));
        for (name, ino) in entries {
            n += 1;
            let _ = fs.lookup(dir, &name);
            let Ok(a) = fs.getattr(ino) else { continue };
            match a.kind {
                FileType::Directory if seen.insert(ino) => stack.push(ino),
                FileType::RegularFile => {
                    let mut off = 0;
                    while let Ok(d) = fs.read(ino, off, 4096, &mut scratch) {
                        if d.is_empty() {
                            break;
                        }
                        off += d.len() as u64;
                    }
                }
                FileType::Symlink => {
                    let _ = fs.readlink(ino);
                }
                _ => {}
            }
        }
    }
    n
}

/// Returns whether the image opened at the default block size.
fn exercise(path: &Path, bytes: &[u8]) -> bool {
    std::fs::write(path, bytes).unwrap();
    let mut opened = false;
    for bs in [BlockSizeChoice::Default, BlockSizeChoice::LargeBlocks] {
        let opts = OpenOptions {
            block_size: bs,
            cache_bytes: 16 * 1024,
            ..OpenOptions::default()
        };
        if let Ok(fs) = RomFs::open_unverified(path, &opts) {
            opened |= bs == BlockSizeChoice::Default;
            walk(&fs);
        }
        if let Ok(report) = check::check(path, &opts) {
            for d in &report.defects {
                // Every defect is damage of a kind romfs or the block layer
                // names, and shows without panicking.
                assert!(
                    d.error.corruption::<Corrupt>().is_some()
                        || d.error.corruption::<foliofs_block::Corrupt>().is_some(),
                    "untyped defect: {d:?}"
                );
                assert!(!d.to_string().is_empty());
            }
        }
    }
    opened
}

#[test]
fn damaged_variants_of_a_real_image_never_panic_or_hang() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(src.join("d/e")).unwrap();
    std::fs::write(src.join("a"), b"hello\n").unwrap();
    std::fs::write(src.join("d/big"), vec![9u8; 3000]).unwrap();
    std::fs::hard_link(src.join("a"), src.join("d/e/hl")).unwrap();
    std::os::unix::fs::symlink("../a", src.join("d/sym")).unwrap();
    std::fs::write(src.join("d/e/z"), b"").unwrap();
    let img = t.path().join("img");
    mkfs::build(&src, &img, &mkfs::MkfsOptions::default(), &mut |_| {}).unwrap();
    let good = std::fs::read(&img).unwrap();
    let fs = RomFs::open(&img, &OpenOptions::default()).unwrap();
    assert_eq!(walk(&fs), 7, "the undamaged image walks fully");
    let end = fs.superblock().size as usize;
    drop(fs);

    // Thousands of rewrites: tmpfs when there is one.
    let shm = Path::new("/dev/shm");
    let scratch = if shm.is_dir() {
        tempfile::tempdir_in(shm).unwrap()
    } else {
        tempfile::tempdir().unwrap()
    };
    let work = scratch.path().join("work");
    let mut rng = StdRng::seed_from_u64(0x9e37_79b9_7f4a_7c15);
    let mut opened = 0;
    for _ in 0..3000 {
        let mut b = good.clone();
        for _ in 0..rng.gen_range(1..=4) {
            let at = rng.gen_range(16..end) & !3;
            let word = match rng.gen_range(0..5) {
                // A pointer to some header-aligned place, keeping type bits.
                0 => (rng.gen_range(0..end as u32 + 64) & !15) | (b[at + 3] as u32 & 15),
                // A small offset, type or size.
                1 => rng.gen_range(0..64),
                2 => u32::MAX - rng.gen_range(0..64),
                // A single flipped bit.
                3 => {
                    u32::from_be_bytes(b[at..at + 4].try_into().unwrap())
                        ^ (1 << rng.gen_range(0..32))
                }
                _ => rng.gen(),
            };
            b[at..at + 4].copy_from_slice(&word.to_be_bytes());
        }
        if rng.gen_range(0..8) == 0 {
            b.truncate(rng.gen_range(0..b.len()));
        }
        opened += usize::from(exercise(&work, &b));
    }
    // Most damage leaves the image openable, so the walk code really runs.
    assert!(opened > 1000, "only {opened} variants opened");
    for (name, bytes) in REGRESSIONS {
        eprintln!("regression {name}");
        exercise(&work, bytes);
    }
}
