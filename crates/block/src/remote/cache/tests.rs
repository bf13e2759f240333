use std::fs::{self, File};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::evict::scan;
use super::map::{entry_at, hex_digest, now_stamp, PENDING};
use super::sys::next_data;
use super::*;

/// Stores a chunk and commits it, as the committer does soon after.
fn put(c: &DiskCache, index: u64, data: &[u8]) {
    c.store(index, data);
    assert!(c.settle(Duration::from_secs(10)));
}

/// The chunks `c` holds.
fn held(c: &DiskCache) -> Vec<u64> {
    (0..c.obj.stamps.len() as u64)
        .filter(|&i| c.holds(i))
        .collect()
}

fn entry(c: &DiskCache, index: u64) -> u32 {
    c.obj.stamp_on_disk(index)
}

/// Whether `offset` of `file` lies in a hole.
fn hole(file: &File, offset: u64) -> bool {
    next_data(file, offset).is_none_or(|d| d > offset)
}

#[test]
fn chunks_round_trip_and_survive_reopen() {
    let root = tempfile::tempdir().unwrap();
    let c = DiskCache::open(root.path(), "obj", "v1", 4096, 5 * 4096, Some(1 << 20)).unwrap();
    let present = held(&c);
    assert!(present.is_empty());
    let data: Vec<u8> = (0..4096u32).map(|i| i as u8).collect();
    put(&c, 3, &data);
    // The last chunk is short.
    put(&c, 4, &data[..4096]);
    let mut out = [0u8; 10];
    assert!(c.read(3, 5, &mut out));
    assert_eq!(out[..], data[5..15]);
    assert!(!c.read(2, 0, &mut out));
    drop(c);
    let c = DiskCache::open(root.path(), "obj", "v1", 4096, 5 * 4096, Some(1 << 20)).unwrap();
    let present = held(&c);
    assert_eq!(present, vec![3, 4]);
    assert!(c.read(3, 4086, &mut out));
    assert_eq!(out[..], data[4086..]);
}

#[test]
fn a_stored_chunk_is_read_at_once_and_entered_only_when_durable() {
    let root = tempfile::tempdir().unwrap();
    let c = DiskCache::open(root.path(), "o", "v", 4096, 3 * 4096, None).unwrap();
    let data = vec![9u8; 4096];
    c.store(2, &data);
    assert_eq!(entry(&c, 2), 0, "entered before it is durable");
    let mut out = [0u8; 10];
    assert!(c.read(2, 40, &mut out));
    assert_eq!(out, [9; 10]);
    assert!(c.commit_next(Duration::ZERO));
    assert!(entry(&c, 2) > PENDING);
    assert!(!c.commit_next(Duration::ZERO));
    // A chunk stored twice before its commit is committed once.
    c.store(1, &[1; 4096]);
    c.store(1, &[2; 4096]);
    assert!(c.commit_next(Duration::ZERO));
    assert!(!c.commit_next(Duration::ZERO));
    assert!(c.read(1, 0, &mut out));
    assert_eq!(out, [2; 10]);
}

#[test]
fn what_a_crash_left_unentered_is_not_served_and_its_blocks_are_freed() {
    let root = tempfile::tempdir().unwrap();
    let c = DiskCache::open(root.path(), "o", "v", 64 << 10, 4 << 20, None).unwrap();
    put(&c, 0, &[1; 64 << 10]);
    let dir = c.obj.dir.clone();
    drop(c);
    // Written and never entered, as a crash before the commit leaves it.
    let data = fs::OpenOptions::new()
        .write(true)
        .open(dir.join("data"))
        .unwrap();
    data.write_all_at(&[7; 1 << 20], 2 << 20).unwrap();
    data.sync_all().unwrap();
    assert!(!hole(&data, 2 << 20));
    let c = DiskCache::open(root.path(), "o", "v", 64 << 10, 4 << 20, None).unwrap();
    let present = held(&c);
    assert_eq!(present, vec![0]);
    assert!(!c.read(32, 0, &mut [0; 4]));
    for off in (2 << 20..3 << 20).step_by(64 << 10) {
        assert!(hole(&data, off), "{off} still holds data");
    }
    assert!(!hole(&data, 0));
    let mut out = [0u8; 4];
    assert!(c.read(0, 100, &mut out));
    assert_eq!(out, [1; 4]);
}

#[test]
fn another_layout_or_version_is_removed() {
    let root = tempfile::tempdir().unwrap();
    let object = root.path().join(hex_digest("o"));
    // A file per chunk, as layout 2 kept them.
    let old = object.join(hex_digest("v\n4096\n2"));
    fs::create_dir_all(&old).unwrap();
    fs::write(old.join("0"), [1u8; 64]).unwrap();
    let c = DiskCache::open(root.path(), "o", "v", 4096, 64, None).unwrap();
    let present = held(&c);
    assert!(present.is_empty());
    assert!(!old.exists());
    assert!(!c.read(0, 0, &mut [0; 4]));
    put(&c, 0, &[1; 64]);
    let c2 = DiskCache::open(root.path(), "o", "v2", 4096, 64, None).unwrap();
    let present = held(&c2);
    assert!(present.is_empty());
    assert!(!c.obj.dir.exists());
    assert!(!c2.read(0, 0, &mut [0; 10]));
    // Another chunk size is another version too.
    let c3 = DiskCache::open(root.path(), "o", "v2", 8192, 64, None).unwrap();
    assert_ne!(c3.obj.dir, c2.obj.dir);
}

#[test]
fn damaged_files_are_not_served() {
    let root = tempfile::tempdir().unwrap();
    let c = DiskCache::open(root.path(), "o", "v", 4096, 3 * 4096, None).unwrap();
    for i in 0..3 {
        put(&c, i, &[7; 4096]);
    }
    let dir = c.obj.dir.clone();
    // Data cut short after this process found it: not served, and
    // forgotten.
    let data = fs::OpenOptions::new()
        .write(true)
        .open(dir.join("data"))
        .unwrap();
    data.set_len(2 * 4096 + 100).unwrap();
    assert!(!c.read(2, 0, &mut [0; 4096]));
    assert_eq!(entry(&c, 2), 0);
    assert!(c.read(1, 0, &mut [0; 4096]));
    drop(c);
    // Cut again while closed: the next open drops what it lost.
    data.set_len(4096 + 1).unwrap();
    let c = DiskCache::open(root.path(), "o", "v", 4096, 3 * 4096, None).unwrap();
    let present = held(&c);
    assert_eq!(present, vec![0]);
    assert!(!c.read(1, 0, &mut [0; 4]));
    drop(c);
    // A damaged map starts the version afresh.
    fs::write(dir.join("map"), b"foliofsC garbage").unwrap();
    let c = DiskCache::open(root.path(), "o", "v", 4096, 3 * 4096, None).unwrap();
    let present = held(&c);
    assert!(present.is_empty());
    assert!(!c.read(0, 0, &mut [0; 4]));
}

/// Opens `name`, 16 chunks of 4 KiB, with no limit to speak of until
/// [`fit_ten`].
fn small(root: &Path, name: &str) -> DiskCache {
    DiskCache::open(root, name, "v", 4096, 16 * 4096, Some(1 << 30)).unwrap()
}

/// Sets chunk `index`'s last use to `secs` after 1000 s before now.
fn used_at(c: &DiskCache, index: u64, secs: u32) {
    let t = now_stamp() - 1000 + secs;
    c.obj.stamps[index as usize].store(t, Ordering::Relaxed);
    c.obj
        .map
        .write_all_at(&t.to_le_bytes(), entry_at(index))
        .unwrap();
}

/// [`small`] with chunks `0..n` of ones, chunk i last used i seconds
/// after the start.
fn filled(root: &Path, name: &str, n: u64) -> DiskCache {
    let c = small(root, name);
    for i in 0..n {
        put(&c, i, &[1; 4096]);
        used_at(&c, i, i as u32);
    }
    c
}

fn committed(root: &Path) -> u64 {
    scan(root).0.iter().map(|f| f.size).sum()
}

/// Evicts for `c` of eleven chunks under a limit that keeps nine beside
/// what the maps, the sums and the sparse files' own blocks take of the
/// disk now (whatever the file system); returns `c`'s chunks that went.
fn evict_to_nine(root: &Path, c: &mut DiskCache) -> Vec<u64> {
    let overhead = scan(root).1 - committed(root);
    // Over the limit with eleven, and nine beside the overhead are
    // within 90% of it, ten are not.
    c.limit = ((9 * 4096 + overhead) * 10).div_ceil(9) + 512;
    let before = held(c);
    c.evict();
    c.limit = 1 << 30;
    let after = held(c);
    let gone: Vec<u64> = before.into_iter().filter(|i| !after.contains(i)).collect();
    assert_eq!(committed(root), 9 * 4096);
    gone
}

#[test]
fn the_limit_evicts_least_recently_used_across_objects() {
    let root = tempfile::tempdir().unwrap();
    let mut a = small(root.path(), "a");
    let b = small(root.path(), "b");
    for i in 0..5 {
        put(&a, i, &[i as u8; 4096]);
        put(&b, i, &[i as u8; 4096]);
        // Chunk i was last used i seconds after the start; a's before b's.
        used_at(&a, i, 2 * i as u32);
        used_at(&b, i, 2 * i as u32 + 1);
    }
    // a's chunk 0 is used now: it is the most recent.
    used_at(&a, 0, 1000);
    put(&a, 9, &[9; 4096]);
    // 11 chunks, 9 stay: b's 0 and a's 1 were the oldest.
    assert_eq!(evict_to_nine(root.path(), &mut a), vec![1]);
    assert!(!a.read(1, 0, &mut [0; 1]) && !b.read(0, 0, &mut [0; 1]));
    assert!(a.read(0, 0, &mut [0; 1]) && b.read(1, 0, &mut [0; 1]) && a.read(9, 0, &mut [0; 1]));
    // Their blocks went too.
    assert!(hole(&a.obj.data, 4096) && hole(&b.obj.data, 0));
    assert!(!hole(&a.obj.data, 0) && !hole(&b.obj.data, 4096));
}

#[test]
fn an_object_another_process_has_open_is_freed_under_it_and_read_again() {
    let root = tempfile::tempdir().unwrap();
    let _a = filled(root.path(), "a", 6);
    // A second open of the same files: to the locks, another process.
    let other = DiskCache::open(root.path(), "a", "v", 4096, 16 * 4096, Some(1 << 30)).unwrap();
    let present = held(&other);
    assert_eq!(present.len(), 6);
    let mut b = small(root.path(), "b");
    for i in 0..5 {
        put(&b, i, &[2; 4096]);
        used_at(&b, i, 100 + i as u32);
    }
    // a's chunks are the oldest, in use elsewhere or not.
    assert_eq!(evict_to_nine(root.path(), &mut b), vec![]);
    assert!(hole(&other.obj.data, 0) && hole(&other.obj.data, 4096));
    // The other process still thinks it holds them: its read finds the
    // hole, and takes it for a miss, not for damage.
    assert!(other.holds(0));
    assert_eq!(other.lookup(0, 0, &mut [0; 4096]), Found::Miss);
    assert!(!other.holds(0));
    let mut out = [0u8; 4096];
    assert_eq!(other.lookup(2, 0, &mut out), Found::Hit);
    assert_eq!(out, [1; 4096]);
    put(&other, 0, &[1; 4096]);
    assert_eq!(other.lookup(0, 0, &mut out), Found::Hit);
    assert_eq!(out, [1; 4096]);
}

#[test]
fn without_hole_punching_whole_objects_are_evicted() {
    let root = tempfile::tempdir().unwrap();
    let a = filled(root.path(), "a", 6);
    let mut b = small(root.path(), "b");
    // As the probe finds it where `fallocate` says EOPNOTSUPP.
    b.obj.refuse_punching();
    for i in 0..5 {
        put(&b, i, &[2; 4096]);
        used_at(&b, i, 100 + i as u32);
    }
    let overhead = scan(root.path()).1 - committed(root.path());
    b.limit = 10 * 4096 + overhead;
    b.evict();
    // a's chunks were the oldest: all of a went, and b stays whole.
    assert!(held(&a).is_empty(), "{:?}", held(&a));
    assert_eq!(held(&b), (0..5).collect::<Vec<_>>());
    assert_eq!(a.obj.data.metadata().unwrap().len(), 16 * 4096);
    assert_eq!(next_data(&a.obj.data, 0), None);
    assert!(scan(root.path()).1 <= b.limit);
    assert_eq!(a.lookup(3, 0, &mut [0; 4]), Found::Miss);
    // Over the limit again with b the oldest: b goes whole, itself.
    put(&a, 0, &[1; 4096]);
    for i in 1..8 {
        put(&a, i, &[1; 4096]);
        used_at(&a, i, 500);
    }
    used_at(&a, 0, 500);
    b.evict();
    assert!(held(&b).is_empty(), "{:?}", held(&b));
    assert_eq!(held(&a).len(), 8);
    let mut out = [0u8; 4];
    assert_eq!(a.lookup(7, 0, &mut out), Found::Hit);
    assert_eq!(out, [1; 4]);
}

#[test]
fn an_object_no_process_has_open_is_freed_by_another() {
    let root = tempfile::tempdir().unwrap();
    let a = filled(root.path(), "a", 8);
    drop(a);
    let mut b = small(root.path(), "b");
    for i in 0..3 {
        put(&b, i, &[2; 4096]);
    }
    assert_eq!(evict_to_nine(root.path(), &mut b), vec![]);
    for i in 0..3 {
        assert!(b.read(i, 0, &mut [0; 1]));
    }
    let a = DiskCache::open(root.path(), "a", "v", 4096, 16 * 4096, Some(1 << 30)).unwrap();
    let present = held(&a);
    assert_eq!(present, (2..8).collect::<Vec<_>>());
}

#[test]
fn an_object_whose_data_went_is_removed_by_an_eviction() {
    let root = tempfile::tempdir().unwrap();
    let a = filled(root.path(), "a", 8);
    let dir = a.obj.dir.clone();
    drop(a);
    fs::remove_file(dir.join("data")).unwrap();
    let mut b = small(root.path(), "b");
    put(&b, 0, &[2; 4096]);
    // The disk holds less than a's map says: its entries must not count
    // for more than what they free.
    b.limit = 4096;
    b.evict();
    assert!(!dir.exists());
    assert!(b.read(0, 0, &mut [0; 1]));
}

#[test]
fn default_dirs() {
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |k: &str| pairs.iter().find(|p| p.0 == k).map(|p| p.1.to_string())
    };
    assert_eq!(
        default_dir(&env(&[("XDG_CACHE_HOME", "/x"), ("HOME", "/h")]), false),
        Some(PathBuf::from("/x/foliofs"))
    );
    assert_eq!(
        default_dir(&env(&[("XDG_CACHE_HOME", "rel"), ("HOME", "/h")]), false),
        Some(PathBuf::from("/h/.cache/foliofs"))
    );
    assert_eq!(default_dir(&env(&[]), false), None);
    assert_eq!(
        default_dir(&env(&[("HOME", "/h")]), true),
        Some(PathBuf::from("/var/cache/foliofs"))
    );
}

/// Bytes that differ from piece to piece, so that a piece read from the
/// wrong place would show.
fn patterned(n: usize, seed: u32) -> Vec<u8> {
    (0..n as u32)
        .map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed) >> 13) as u8)
        .collect()
}

#[test]
fn every_read_is_checked_and_damage_of_the_same_length_is_dropped() {
    let root = tempfile::tempdir().unwrap();
    let chunk = 64u64 << 10;
    // The last chunk and its last piece are short.
    let size = 3 * chunk - 1000;
    let c = DiskCache::open(root.path(), "o", "v", chunk as u32, size, None).unwrap();
    let whole = patterned(size as usize, 5);
    for i in 0..3 {
        let from = (i * chunk) as usize;
        put(
            &c,
            i,
            &whole[from..(from + chunk as usize).min(size as usize)],
        );
    }
    // Aligned, unaligned at either end or both, inside one piece, the
    // whole chunk, and up to the object's end.
    for (index, within, len) in [
        (0u64, 0usize, 4096usize),
        (0, 100, 5000),
        (1, 4096, 8192),
        (1, 4000, 100),
        (1, 0, chunk as usize),
        (2, 1, (chunk - 1001) as usize),
        (2, 60000, (chunk - 60000 - 1000) as usize),
    ] {
        let mut out = vec![0u8; len];
        assert_eq!(c.lookup(index, within, &mut out), Found::Hit);
        let at = (index * chunk) as usize + within;
        assert!(out == whole[at..at + len], "{index} {within} {len}");
    }
    let data = fs::OpenOptions::new()
        .write(true)
        .open(c.obj.dir.join("data"))
        .unwrap();
    let flip = |offset: u64| {
        let mut b = [0u8; 1];
        c.obj.data.read_exact_at(&mut b, offset).unwrap();
        data.write_all_at(&[b[0] ^ 0x10], offset).unwrap();
    };
    // In a piece read straight into the caller's buffer.
    flip(chunk + 20000);
    let mut out = vec![0u8; 16384];
    assert_eq!(c.lookup(1, 16384, &mut out), Found::Damaged);
    assert_eq!(entry(&c, 1), 0);
    assert!(!c.holds(1));
    assert_eq!(c.lookup(1, 0, &mut out), Found::Miss);
    // In an edge piece, read in part; and in the short last piece.
    flip(10);
    assert_eq!(c.lookup(0, 8, &mut [0; 4]), Found::Damaged);
    flip(size - 1);
    assert_eq!(
        c.lookup(2, (chunk - 1001) as usize, &mut [0; 1]),
        Found::Damaged
    );
    // Stored again, served again.
    put(&c, 1, &whole[chunk as usize..2 * chunk as usize]);
    let mut out = vec![0u8; chunk as usize];
    assert_eq!(c.lookup(1, 0, &mut out), Found::Hit);
    assert!(out == whole[chunk as usize..2 * chunk as usize]);
    // Damaged sums are damage too.
    let sums = fs::OpenOptions::new()
        .write(true)
        .open(c.obj.dir.join("sums"))
        .unwrap();
    sums.write_all_at(&[0xff; 4], super::map::sum_at(chunk + 4096))
        .unwrap();
    assert_eq!(c.lookup(1, 4096, &mut [0; 8]), Found::Damaged);
}

#[test]
fn a_cache_of_the_layout_without_sums_is_rebuilt_not_misread() {
    let root = tempfile::tempdir().unwrap();
    let object = root.path().join(hex_digest("o"));
    // Layout 3: the same map format, no sums; chunk 0 entered.
    let old = object.join(hex_digest("v\n4096\n3"));
    fs::create_dir_all(&old).unwrap();
    let mut map = b"foliofsC".to_vec();
    map.extend(8192u64.to_le_bytes());
    map.extend(4096u32.to_le_bytes());
    map.extend(3u32.to_le_bytes());
    map.extend(now_stamp().to_le_bytes());
    map.extend(0u32.to_le_bytes());
    fs::write(old.join("map"), map).unwrap();
    fs::write(old.join("data"), [6u8; 8192]).unwrap();
    let c = DiskCache::open(root.path(), "o", "v", 4096, 8192, None).unwrap();
    assert!(held(&c).is_empty());
    assert!(!old.exists());
    assert_eq!(c.lookup(0, 0, &mut [0; 4]), Found::Miss);
    put(&c, 0, &[5; 4096]);
    let mut out = [0u8; 4];
    assert_eq!(c.lookup(0, 0, &mut out), Found::Hit);
    assert_eq!(out, [5; 4]);
}
