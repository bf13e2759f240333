//! Parses arbitrary bytes as an EROFS image and walks everything reachable:
//! every directory listed (and resumed at a cookie), every name looked up,
//! every file read whole and at its tail, every symlink and xattr read, the
//! extent map, plus the full checker. Must never panic, hang or allocate
//! beyond what the input could back.
#![no_main]

use std::collections::HashSet;
use std::ffi::OsStr;
use std::path::PathBuf;
use std::sync::OnceLock;

use foliofs_block::{BlockSizeChoice, OpenOptions};
use foliofs_erofs::Erofs;
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
        dir.join(format!("foliofs-fuzz-erofs-{}.img", std::process::id()))
    })
}

fn walk(fs: &Erofs) {
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
        if let Some(&(_, _, cookie)) = entries.first() {
            let _ = fs.readdir(dir, cookie, &mut |_| true);
        }
        let _ = fs.lookup(dir, OsStr::new(".."));
        let _ = fs.lookup(dir, OsStr::new("no-such-name"));
        for (name, ino, _) in entries {
            let _ = fs.lookup(dir, &name);
            let Ok(a) = fs.getattr(ino) else { continue };
            if let Ok(names) = fs.listxattr(ino) {
                for n in names {
                    let _ = fs.getxattr(ino, OsStr::from_bytes_compat(&n));
                }
            }
            if let Ok(inode) = fs.inode(fs.nid_of(ino)) {
                let _ = fs.index_range(&inode);
                if a.size < 1 << 24 {
                    let _ = fs.extents(&inode);
                }
            }
            match a.kind {
                FileType::Directory => {
                    if seen.insert(ino) {
                        stack.push(ino);
                    }
                }
                FileType::RegularFile => {
                    let mut off = 0u64;
                    // Bounded: a damaged size may claim terabytes of holes.
                    while off < 1 << 24 {
                        match fs.read(ino, off, 65536, &mut scratch) {
                            Ok(d) if !d.is_empty() => off += d.len() as u64,
                            _ => break,
                        }
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

/// `OsStr::from_bytes` without importing the extension trait at every use.
trait FromBytesCompat {
    fn from_bytes_compat(b: &[u8]) -> &OsStr;
}

impl FromBytesCompat for OsStr {
    fn from_bytes_compat(b: &[u8]) -> &OsStr {
        use std::os::unix::ffi::OsStrExt;
        OsStr::from_bytes(b)
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
            // A cache block size unlike the image's exercises the metadata
            // layer's block-size independence.
            BlockSizeChoice::Fixed(1024)
        },
        cache_bytes: 64 * 1024,
        ..OpenOptions::default()
    };
    if let Ok(fs) = Erofs::open(path, &opts, &[]) {
        walk(&fs);
        for d in &fs.fsck().errors {
            // Every defect is of a kind EROFS or the block layer names (or
            // an I/O error), and shows without panicking.
            let e = &d.error;
            assert!(
                e.corruption::<foliofs_erofs::Corrupt>().is_some()
                    || e.corruption::<foliofs_block::Corrupt>().is_some()
                    || e.incompatibility::<foliofs_erofs::Incompatible>().is_some()
                    || matches!(e, foliofs_vfs::Error::Io { .. }),
                "untyped defect: {d:?}"
            );
            let _ = d.to_string();
        }
    }
});
