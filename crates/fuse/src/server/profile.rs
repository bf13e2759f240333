//! Start-up profiles: which inodes a run touched and which ranges of them it
//! read, in the order it first touched them (`record=FILE`), replayed on a
//! later mount of the same image (`prefetch=FILE`): its data is read ahead
//! in that order and pushed into the kernel as soon as the kernel holds
//! each inode (see [`super::push`]).
//!
//! The file is text, one inode a line:
//!
//! ```text
//! foliofs-profile 1
//! image size=1048576 hash=0123456789abcdef
//! 1234 0+12288
//! 88 0+1048576 2097152+65536
//! 9000
//! ```
//!
//! An inode is the format's own number (an EROFS nid, a romfs header
//! offset), stable for one image; a range is `OFFSET+LENGTH` in bytes; an
//! inode without ranges was looked up and not read. The `image` line keys
//! the profile to the image it was recorded on (see [`ImageKey`]): a
//! profile of another image would push another file's bytes.

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use foliofs_vfs::{FileSystem, Ino, Scratch};

const MAGIC: &str = "foliofs-profile 1";

/// Most inodes one profile holds (a recording stops adding past it).
const MAX_INODES: usize = 1 << 20;
/// Most ranges kept per inode; past it, a new range is merged into the
/// last one.
const MAX_RANGES: usize = 64;
/// Most bytes of profile data read ahead and not yet pushed.
const STASH_MAX: u64 = 32 << 20;
/// The unit of reading ahead (and of a store, see [`super::push`]).
const CHUNK: u64 = 1 << 20;
/// How much of each end of the image the key hashes.
const KEY_SPAN: u64 = 64 << 10;

/// Why a profile cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// The file cannot be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The profile's path.
        path: PathBuf,
        /// The failure.
        #[source]
        source: io::Error,
    },
    /// The file is not a profile this version reads.
    #[error("{path}: not a foliofs start-up profile ({why})")]
    Malformed {
        /// The profile's path.
        path: PathBuf,
        /// What is wrong, with the line number.
        why: String,
    },
    /// The profile was recorded on another image.
    #[error("{path}: recorded on another image ({found}; this one is {want})")]
    OtherImage {
        /// The profile's path.
        path: PathBuf,
        /// The key the profile holds.
        found: ImageKey,
        /// The key of the image being mounted.
        want: ImageKey,
    },
}

/// What identifies an image: its size and a hash of its first and last
/// 64 KiB, which hold the superblock (with an EROFS image's build time and
/// UUID, a romfs image's checksum) and the end of its data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageKey {
    /// The image's size in bytes.
    pub size: u64,
    /// FNV-1a (64-bit) of the size and the two spans.
    pub hash: u64,
}

impl fmt::Display for ImageKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "size={} hash={:016x}", self.size, self.hash)
    }
}

fn fnv1a(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

impl ImageKey {
    /// The key of the image file or device at `path`.
    pub fn of_image(path: &Path) -> io::Result<ImageKey> {
        let mut f = File::open(path)?;
        let size = f.seek(SeekFrom::End(0))?;
        ImageKey::of_reader(size, &mut |buf, start| {
            f.seek(SeekFrom::Start(start))?;
            f.read_exact(buf)
        })
    }

    /// The key of an image of `size` bytes that `read(buf, offset)` fills
    /// `buf` from (an image in object storage is read through its store).
    pub fn of_reader(
        size: u64,
        read: &mut dyn FnMut(&mut [u8], u64) -> io::Result<()>,
    ) -> io::Result<ImageKey> {
        let mut h = fnv1a(0xcbf2_9ce4_8422_2325, &size.to_le_bytes());
        let mut buf = vec![0u8; KEY_SPAN.min(size) as usize];
        for start in [0, size - buf.len() as u64] {
            read(&mut buf, start)?;
            h = fnv1a(h, &buf);
        }
        Ok(ImageKey { size, hash: h })
    }

    fn parse(line: &str) -> Option<ImageKey> {
        let rest = line.strip_prefix("image ")?;
        let mut size = None;
        let mut hash = None;
        for item in rest.split_whitespace() {
            match item.split_once('=')? {
                ("size", v) => size = v.parse().ok(),
                ("hash", v) => hash = u64::from_str_radix(v, 16).ok(),
                _ => return None,
            }
        }
        Some(ImageKey {
            size: size?,
            hash: hash?,
        })
    }
}

/// A recorded profile: inodes in first-touch order, each with the ranges
/// read of it (sorted, merged).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Profile {
    order: Vec<Ino>,
    ranges: HashMap<Ino, Vec<(u64, u64)>>,
}

impl Profile {
    /// Reads the profile at `path`, refusing one recorded on an image
    /// other than `key`.
    pub fn load(path: &Path, key: ImageKey) -> Result<Profile, ProfileError> {
        let text = std::fs::read_to_string(path).map_err(|source| ProfileError::Io {
            path: path.to_owned(),
            source,
        })?;
        let bad = |n: usize, why: &str| ProfileError::Malformed {
            path: path.to_owned(),
            why: format!("line {n}: {why}"),
        };
        let mut lines = text.lines();
        if lines.next() != Some(MAGIC) {
            return Err(bad(1, "no `foliofs-profile 1` header"));
        }
        let found = lines
            .next()
            .and_then(ImageKey::parse)
            .ok_or_else(|| bad(2, "no `image size=N hash=H` line"))?;
        if found != key {
            return Err(ProfileError::OtherImage {
                path: path.to_owned(),
                found,
                want: key,
            });
        }
        let mut p = Profile::default();
        for (i, line) in lines.enumerate() {
            let n = i + 3;
            let mut items = line.split_whitespace();
            let Some(ino) = items.next() else { continue };
            let ino: Ino = ino.parse().map_err(|_| bad(n, "bad inode number"))?;
            if p.ranges.contains_key(&ino) || p.order.len() >= MAX_INODES {
                continue;
            }
            let mut r = Vec::new();
            for item in items.take(MAX_RANGES) {
                let (o, l) = item
                    .split_once('+')
                    .and_then(|(o, l)| Some((o.parse::<u64>().ok()?, l.parse::<u64>().ok()?)))
                    .filter(|&(o, l)| o.checked_add(l).is_some())
                    .ok_or_else(|| bad(n, "bad range (OFFSET+LENGTH)"))?;
                if l > 0 {
                    add_range(&mut r, o, l);
                }
            }
            p.order.push(ino);
            p.ranges.insert(ino, r);
        }
        Ok(p)
    }

    /// Writes the profile for the image `key` to `path` (through a
    /// temporary file beside it, so a reader never sees half of one).
    pub fn save(&self, path: &Path, key: ImageKey) -> Result<(), ProfileError> {
        let io = |source| ProfileError::Io {
            path: path.to_owned(),
            source,
        };
        let mut text = format!("{MAGIC}\nimage {key}\n");
        for ino in &self.order {
            text.push_str(&ino.to_string());
            for (o, l) in self.ranges.get(ino).into_iter().flatten() {
                text.push_str(&format!(" {o}+{l}"));
            }
            text.push('\n');
        }
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        let mut f = File::create(&tmp).map_err(io)?;
        f.write_all(text.as_bytes()).map_err(io)?;
        drop(f);
        std::fs::rename(&tmp, path).map_err(io)
    }

    /// Whether `ino` was read (so it is pushed whatever its size).
    pub fn contains(&self, ino: Ino) -> bool {
        self.ranges.get(&ino).is_some_and(|r| !r.is_empty())
    }

    /// The ranges read of `ino`, if any.
    pub fn ranges(&self, ino: Ino) -> Option<&[(u64, u64)]> {
        self.ranges
            .get(&ino)
            .filter(|r| !r.is_empty())
            .map(Vec::as_slice)
    }

    /// Inodes in first-touch order.
    pub fn inodes(&self) -> &[Ino] {
        &self.order
    }

    /// Bytes of all ranges.
    pub fn bytes(&self) -> u64 {
        self.ranges.values().flatten().map(|&(_, l)| l).sum()
    }

    fn touch(&mut self, ino: Ino) -> Option<&mut Vec<(u64, u64)>> {
        if !self.ranges.contains_key(&ino) {
            if self.order.len() >= MAX_INODES {
                return None;
            }
            self.order.push(ino);
        }
        Some(self.ranges.entry(ino).or_default())
    }
}

/// Adds `[off, off + len)` to sorted, disjoint `ranges`, merging what it
/// touches; past [`MAX_RANGES`] the last range grows to cover it.
fn add_range(ranges: &mut Vec<(u64, u64)>, off: u64, len: u64) {
    let end = off.saturating_add(len);
    let mut start = off;
    let mut stop = end;
    // Every range overlapping or adjacent to the new one folds into it.
    ranges.retain(|&(o, l)| {
        let e = o + l;
        if e < start || o > stop {
            true
        } else {
            start = start.min(o);
            stop = stop.max(e);
            false
        }
    });
    let at = ranges.partition_point(|&(o, _)| o < start);
    ranges.insert(at, (start, stop - start));
    if ranges.len() > MAX_RANGES {
        let (o, _) = ranges[MAX_RANGES - 1];
        let last_end = ranges.iter().map(|&(o, l)| o + l).max().unwrap_or(stop);
        ranges.truncate(MAX_RANGES - 1);
        ranges.push((o, last_end - o));
    }
}

/// Records what a mount touches, for `record=FILE`; written at unmount.
#[derive(Debug)]
pub(crate) struct Recorder {
    path: PathBuf,
    key: ImageKey,
    profile: Mutex<Profile>,
}

impl Recorder {
    pub(crate) fn new(path: PathBuf, key: ImageKey) -> Recorder {
        Recorder {
            path,
            key,
            profile: Mutex::new(Profile::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Profile> {
        self.profile.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The kernel looked `ino` up.
    pub(crate) fn lookup(&self, ino: Ino) {
        self.lock().touch(ino);
    }

    /// The kernel read `len` bytes of `ino` at `off` (what was returned).
    pub(crate) fn read(&self, ino: Ino, off: u64, len: u64) {
        if len == 0 {
            return;
        }
        if let Some(r) = self.lock().touch(ino) {
            add_range(r, off, len);
        }
    }

    /// Writes the profile; failures are logged (the mount is going away).
    pub(crate) fn save(&self) {
        let p = self.lock();
        match p.save(&self.path, self.key) {
            Ok(()) => log::info!(
                "recorded {} inodes, {} bytes to {}",
                p.order.len(),
                p.bytes(),
                self.path.display()
            ),
            Err(e) => log::warn!("cannot write the start-up profile: {e}"),
        }
    }
}

/// Reads a profile's data ahead in its order, into a bounded stash the
/// pusher takes from (see [`super::push`]).
pub(crate) struct Preload {
    profile: Arc<Profile>,
    /// Next inode of `profile.order`, and the next offset in its ranges.
    next: usize,
    range: usize,
    off: Option<u64>,
    stash: HashMap<(Ino, u64), Vec<u8>>,
    stashed: u64,
    /// Inodes already pushed: reading them ahead is wasted.
    gone: std::collections::HashSet<Ino>,
}

impl Preload {
    pub(crate) fn new(profile: Arc<Profile>) -> Preload {
        Preload {
            profile,
            next: 0,
            range: 0,
            off: None,
            stash: HashMap::new(),
            stashed: 0,
            gone: Default::default(),
        }
    }

    /// Whether all is read ahead (or the stash is full).
    pub(crate) fn finished(&self) -> bool {
        self.next >= self.profile.order.len() || self.stashed >= STASH_MAX
    }

    /// Reads the next chunk of the profile (an inode without ranges: its
    /// attributes, which warms its metadata).
    pub(crate) fn step(&mut self, fs: &dyn FileSystem, scratch: &mut Scratch) {
        let Some(&ino) = self.profile.order.get(self.next) else {
            return;
        };
        let ranges = self.profile.ranges(ino).unwrap_or(&[]);
        if self.gone.contains(&ino) || self.range >= ranges.len() {
            if ranges.is_empty() {
                let _ = fs.getattr(ino);
            }
            self.next += 1;
            self.range = 0;
            self.off = None;
            return;
        }
        let (start, len) = ranges[self.range];
        let off = self.off.unwrap_or(start);
        let want = (start + len - off).min(CHUNK);
        let data = match fs.read(ino, off, want as u32, scratch) {
            Ok(d) if !d.is_empty() => d,
            Ok(_) => &[][..],
            Err(e) => {
                log::debug!("prefetch of inode {ino} at {off}: {e}");
                &[][..]
            }
        };
        let n = data.len() as u64;
        if n > 0 {
            self.stashed += n;
            self.stash.insert((ino, off), data.to_vec());
        }
        if n == 0 || off + n >= start + len {
            self.range += 1;
            self.off = None;
        } else {
            self.off = Some(off + n);
        }
    }

    /// The chunk of `ino` read ahead at `off`, if it is all of `want` or
    /// reaches the end of the file.
    pub(crate) fn take(&mut self, ino: Ino, off: u64, want: u64) -> Option<Vec<u8>> {
        let d = self.stash.remove(&(ino, off))?;
        self.stashed -= d.len() as u64;
        (d.len() as u64 <= want).then_some(d)
    }

    /// `ino` is pushed: drop what is left of it and read no more of it.
    pub(crate) fn forget(&mut self, ino: Ino) {
        self.gone.insert(ino);
        let stashed = &mut self.stashed;
        self.stash.retain(|&(i, _), d| {
            if i == ino {
                *stashed -= d.len() as u64;
                false
            } else {
                true
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_merge_and_stay_sorted() {
        let mut r = Vec::new();
        add_range(&mut r, 100, 50);
        add_range(&mut r, 0, 10);
        add_range(&mut r, 150, 10);
        assert_eq!(r, [(0, 10), (100, 60)]);
        add_range(&mut r, 5, 100);
        assert_eq!(r, [(0, 160)]);
        let mut r = Vec::new();
        for i in 0..200 {
            add_range(&mut r, i * 100, 10);
        }
        assert_eq!(r.len(), MAX_RANGES);
        assert_eq!(r.last().map(|&(o, l)| o + l), Some(199 * 100 + 10));
    }

    #[test]
    fn a_profile_survives_a_round_trip_and_keys_to_its_image() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p");
        let key = ImageKey {
            size: 4096,
            hash: 7,
        };
        let mut p = Profile::default();
        add_range(p.touch(12).unwrap(), 0, 4096);
        p.touch(5);
        add_range(p.touch(12).unwrap(), 8192, 100);
        add_range(p.touch(3).unwrap(), 0, 1);
        p.save(&path, key).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            text,
            "foliofs-profile 1\nimage size=4096 hash=0000000000000007\n12 0+4096 8192+100\n5\n3 0+1\n"
        );
        let q = Profile::load(&path, key).unwrap();
        assert_eq!(q, p);
        assert_eq!(q.inodes(), [12, 5, 3]);
        assert!(q.contains(3) && !q.contains(5) && !q.contains(4));
        let other = ImageKey {
            size: 4096,
            hash: 8,
        };
        assert!(matches!(
            Profile::load(&path, other),
            Err(ProfileError::OtherImage { .. })
        ));
        std::fs::write(&path, "foliofs-profile 1\nimage size=4096 hash=7\n1 x+2\n").unwrap();
        let e = Profile::load(&path, key).unwrap_err().to_string();
        assert!(e.contains("line 3"), "{e}");
        std::fs::write(&path, "hello\n").unwrap();
        assert!(matches!(
            Profile::load(&path, key),
            Err(ProfileError::Malformed { .. })
        ));
    }

    #[test]
    fn image_keys_change_with_the_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        std::fs::write(&a, vec![1u8; 200_000]).unwrap();
        let k1 = ImageKey::of_image(&a).unwrap();
        assert_eq!(k1.size, 200_000);
        assert_eq!(k1, ImageKey::of_image(&a).unwrap());
        let mut v = vec![1u8; 200_000];
        v[1024] = 2;
        std::fs::write(&a, &v).unwrap();
        assert_ne!(ImageKey::of_image(&a).unwrap(), k1);
        std::fs::write(&a, b"").unwrap();
        assert_eq!(ImageKey::of_image(&a).unwrap().size, 0);
    }
}
