//! A user's cold cache: the files a run reads are written back and
//! evicted with `posix_fadvise`, and `mincore` checks what stayed.

use std::fs::{self, File};
use std::path::Path;

use foliofs_testkit::mapping::Mapping;

use crate::env::Leftover;

/// Evicts every regular file at or under `path` from the page cache (see
/// [`Cooling::Evict`]); symbolic links are not followed.
pub fn evict(path: &Path) -> Leftover {
    let mut l = Leftover::default();
    let Ok(md) = fs::symlink_metadata(path) else {
        return l;
    };
    if md.is_dir() {
        if let Ok(entries) = fs::read_dir(path) {
            for e in entries.flatten() {
                let sub = evict(&e.path());
                l.bytes += sub.bytes;
                l.cached += sub.cached;
                l.unchecked += sub.unchecked;
            }
        }
    } else if md.is_file() {
        l.bytes = md.len();
        match evict_file(path, md.len()) {
            Ok(Some(cached)) => l.cached = cached,
            Ok(None) => l.unchecked = md.len(),
            // Not evicted: count all of it as cached.
            Err(_) => l.cached = md.len(),
        }
    }
    l
}

/// Writes `path` back and drops its pages; returns the bytes still cached,
/// or `None` where mincore cannot tell.
fn evict_file(path: &Path, len: u64) -> std::io::Result<Option<u64>> {
    use nix::fcntl::{posix_fadvise, PosixFadviseAdvice};
    let f = File::open(path)?;
    // DONTNEED skips dirty pages; a file just written still has some.
    f.sync_data()?;
    posix_fadvise(&f, 0, 0, PosixFadviseAdvice::POSIX_FADV_DONTNEED)?;
    // Since Linux 5.0 mincore tells about the page cache only to those who
    // own the file or may write it; for others it sees only its own mapping.
    let mine = fs::metadata(path).is_ok_and(|m| {
        use std::os::unix::fs::MetadataExt;
        // SAFETY: geteuid has no preconditions.
        m.uid() == unsafe { libc::geteuid() }
    });
    if !mine && nix::unistd::access(path, nix::unistd::AccessFlags::W_OK).is_err() {
        return Ok(None);
    }
    cached_bytes(&f, len).map(Some)
}

/// Bytes of the first `len` of `f` in the page cache, by mincore(2).
fn cached_bytes(f: &File, len: u64) -> std::io::Result<u64> {
    let Ok(len) = usize::try_from(len) else {
        return Err(std::io::Error::other("file too large to map"));
    };
    if len == 0 {
        return Ok(0);
    }
    let page = foliofs_block::page_size() as usize;
    // Nothing reads through the mapping: mincore only looks at the page
    // cache behind it.
    let vec = Mapping::read_only(f, len)?.resident()?;
    let pages = vec.iter().filter(|&&b| b & 1 != 0).count();
    Ok(((pages * page).min(len)) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eviction_empties_a_disk_files_cache_and_says_what_stayed() {
        let is_tmpfs = |p: &Path| {
            nix::sys::statfs::statfs(p)
                .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC)
        };
        let dir = std::env::temp_dir().join(format!("foliofs-evict.{}", std::process::id()));
        fs::create_dir_all(dir.join("sub")).unwrap();
        // Written, so dirty: eviction has to write them back first.
        fs::write(dir.join("a"), vec![7u8; 1 << 20]).unwrap();
        fs::write(dir.join("sub/b"), vec![8u8; 300_000]).unwrap();
        fs::write(dir.join("empty"), b"").unwrap();
        let f = File::open(dir.join("a")).unwrap();
        assert_eq!(cached_bytes(&f, 1 << 20).unwrap(), 1 << 20);
        let l = evict(&dir);
        assert_eq!(l.bytes, (1 << 20) + 300_000);
        assert_eq!(l.unchecked, 0);
        if is_tmpfs(&dir) {
            // A tmpfs's pages are its files: nothing leaves.
            assert_eq!(l.cached, l.bytes);
        } else {
            assert_eq!(l.cached, 0, "{l:?}");
            assert_eq!(cached_bytes(&f, 1 << 20).unwrap(), 0);
        }
        fs::remove_dir_all(&dir).unwrap();
    }
}
