//! Parses arbitrary bytes as a romfs image and walks everything reachable:
//! every directory listed, every name looked up, every file read whole,
//! every symlink read, plus the full checker. Must never panic or hang.
#![no_main]

use std::collections::HashSet;
use std::ffi::OsStr;
use std::path::PathBuf;
use std::sync::OnceLock;

use foliofs_block::{BlockSizeChoice, OpenOptions};
use foliofs_romfs::RomFs;
use foliofs_vfs::{FileSystem, FileType, Scratch};
use libfuzzer_sys::fuzz_target;

/// The image file each input is written to (tmpfs when available).
fn image_path() -> &'static PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        let dir = if std::path::Path::new("/dev/shm").is_dir() {
            PathBuf::from("/dev/shm")
        } else {
            std::env::temp_dir()
        };
        dir.join(format!("foliofs-fuzz-{}.img", std::process::id()))
    })
}

fn walk(fs: &RomFs) {
    let mut scratch = Scratch::new();
    let mut seen = HashSet::new();
    let mut stack = vec![fs.root()];
    seen.insert(fs.root());
    let _ = fs.statfs();
    while let Some(dir) = stack.pop() {
        // What a READDIRPLUS does first: reading ahead must survive damage too.
        fs.prefetch_dir(dir, 0);
        let mut entries = Vec::new();
        if fs
            .readdir(dir, 0, &mut |e| {
                entries.push((e.name.to_owned(), e.ino, e.next));
                false
            })
            .is_err()
        {
            continue;
        }
        // Resuming at every cookie must work too.
        if let Some(&(_, _, cookie)) = entries.first() {
            let _ = fs.readdir(dir, cookie, &mut |_| true);
        }
        let _ = fs.lookup(dir, OsStr::new(".."));
        for (name, ino, _) in entries {
            let _ = fs.lookup(dir, &name);
            let Ok(a) = fs.getattr(ino) else { continue };
            match a.kind {
                FileType::Directory => {
                    if seen.insert(ino) {
                        stack.push(ino);
                    }
                }
                FileType::RegularFile => {
                    let mut off = 0u64;
                    while let Ok(d) = fs.read(ino, off, 65536, &mut scratch) {
                        if d.is_empty() {
                            break;
                        }
                        off += d.len() as u64;
                    }
                    let _ = fs.read(ino, a.size.saturating_sub(3), 100, &mut scratch);
                }
                FileType::Symlink => {
                    let _ = fs.readlink(ino);
                }
                _ => {}
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let path = image_path();
    if std::fs::write(path, data).is_err() {
        return;
    }
    let opts = OpenOptions {
        block_size: if data.len() % 2 == 0 {
            BlockSizeChoice::Default
        } else {
            BlockSizeChoice::LargeBlocks
        },
        // Small, so eviction paths run too.
        cache_bytes: 64 * 1024,
        ..OpenOptions::default()
    };
    if let Ok(fs) = RomFs::open_unverified(path, &opts) {
        walk(&fs);
    }
    let _ = RomFs::open(path, &opts);
    if let Ok(report) = foliofs_romfs::check::check(path, &opts) {
        for d in &report.defects {
            // Every defect is damage of a kind romfs or the block layer
            // names, and shows without panicking.
            assert!(
                d.error.corruption::<foliofs_romfs::Corrupt>().is_some()
                    || d.error.corruption::<foliofs_block::Corrupt>().is_some(),
                "untyped defect: {d:?}"
            );
            let _ = d.to_string();
        }
    }
});
