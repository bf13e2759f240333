//! Reads arbitrary bytes as a tar, twice: with the tar reader alone (every
//! entry, every byte of data), and as `mkfs erofs` does, building an image
//! from it with containerd's rules. An image that gets built must pass the
//! full checker: a builder that writes a corrupt image from some tar is a
//! finding, as are panics, hangs and memory that the input could not back.
//!
//! The last byte picks the build's options (bit 0: `--aufs`, bit 1:
//! `--tar=i`) and whether header checksums are made right first (bit 2):
//! a tar's reader stops at its end-of-archive blocks, so a byte past them
//! changes the options without changing the tar. Most mutations of a
//! header break its checksum, so without the repair little gets past it.
#![no_main]

use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use foliofs_block::OpenOptions;
use foliofs_erofs::mkfs::{tar, Builder, Options};
use foliofs_erofs::Erofs;
use libfuzzer_sys::fuzz_target;

/// Entries read before the reader is judged done with (a tar of only
/// headers holds one per 512 bytes, so inputs of fuzzing size stay under).
const MAX_ENTRIES: usize = 10_000;

const PREFIX: &str = "foliofs-fuzz-tar-";

/// A directory for this process's image and tar (tmpfs when available),
/// made once. libFuzzer ends a process without running destructors, so
/// the directories of processes no longer alive are removed here instead.
fn work_dir() -> &'static Path {
    static D: OnceLock<PathBuf> = OnceLock::new();
    D.get_or_init(|| {
        let base = if Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        if let Ok(rd) = std::fs::read_dir(&base) {
            for e in rd.flatten() {
                let name = e.file_name();
                let Some(pid) = name.to_str().and_then(|n| n.strip_prefix(PREFIX)) else {
                    continue;
                };
                if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        let d = base.join(format!("{PREFIX}{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("a work directory");
        d
    })
}

fn read_all(data: &[u8]) {
    let mut r = tar::Reader::new(data);
    for _ in 0..MAX_ENTRIES {
        match r.next_entry() {
            Ok(Some(e)) => {
                let got = io::copy(&mut r.data(), &mut io::sink());
                // The stored bytes are the data the stream holds, never more.
                if let Ok(n) = got {
                    assert!(n <= e.stored, "{n} bytes read of {} stored", e.stored);
                    if let Some(map) = &e.sparse {
                        assert!(map.iter().all(|f| f.0 + f.1 <= e.size));
                    }
                }
            }
            Ok(None) | Err(_) => return,
        }
    }
}

fn build(data: &[u8]) {
    let dir = work_dir();
    let image = dir.join("image");
    let tar_path = dir.join("tar");
    let _ = std::fs::remove_file(&image);
    let mode = data.last().copied().unwrap_or(0);
    let opts = Options {
        aufs: mode & 1 != 0,
        tar_index: mode & 2 != 0,
        blkszbits: if mode & 2 != 0 { 9 } else { 12 },
        workers: 1,
        ..Options::default()
    };
    let devices = if opts.tar_index {
        // The image's extra device is the tar itself.
        if std::fs::write(&tar_path, data).is_err() {
            return;
        }
        vec![tar_path]
    } else {
        Vec::new()
    };
    let src: Box<dyn Read> = Box::new(io::Cursor::new(data.to_vec()));
    if Builder::build_tar(src, &image, opts).is_err() {
        assert!(!image.exists(), "a failed build left an image");
        return;
    }
    let fs = match Erofs::open(&image, &OpenOptions::default(), &devices) {
        Ok(fs) => fs,
        Err(e) => panic!("a built image does not open: {e}"),
    };
    let report = fs.fsck();
    assert!(report.is_clean(), "a built image is not clean: {report:?}");
}

/// Gives every 512-byte block with a USTAR or GNU magic a right checksum.
fn repair_checksums(data: &mut [u8]) {
    for b in data.chunks_exact_mut(512) {
        if &b[257..262] == b"ustar" {
            b[148..156].fill(b' ');
            let sum: u32 = b.iter().map(|&c| u32::from(c)).sum();
            b[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut data = data.to_vec();
    if data.last().is_some_and(|m| m & 4 != 0) {
        repair_checksums(&mut data);
    }
    read_all(&data);
    build(&data);
});
