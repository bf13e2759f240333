use super::*;
use std::io::Write;

fn pattern(n: usize) -> Vec<u8> {
    // Not periodic at any power of two, so a misplaced block shows.
    (0..n).map(|i| ((i * 7 + i / 251) % 253) as u8).collect()
}

fn image(n: usize) -> (tempfile::NamedTempFile, Vec<u8>) {
    let data = pattern(n);
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(&data).unwrap();
    f.flush().unwrap();
    (f, data)
}

#[test]
fn largeblocks_rule_matches_the_seed() {
    assert_eq!(largeblocks(1024, 4096), 1024);
    assert_eq!(largeblocks(2048, 4096), 2048);
    assert_eq!(largeblocks(3 * 4096, 4096), 4096);
    assert_eq!(largeblocks(5 * 1024, 4096), 1024);
    assert_eq!(largeblocks(6 * 1024, 4096), 2048);
    assert_eq!(largeblocks(1000, 4096), 1024);
    assert_eq!(largeblocks(1 << 20, 65536), 65536);
}

#[test]
fn block_sizes_are_checked() {
    for ok in [1024, 4096, 65536, 2 << 20] {
        assert!(check_block_size(ok).is_ok());
    }
    for bad in [0, 512, 1000, 3072, 4 << 20] {
        assert!(check_block_size(bad).is_err());
    }
}

fn direct() -> OpenOptions {
    OpenOptions {
        io_mode: IoMode::Direct,
        ..OpenOptions::default()
    }
}

fn check_reads(dev: &BlockDev, data: &[u8]) {
    let mut scratch = Scratch::new();
    let size = data.len() as u64;
    let bs = dev.block_size() as u64;
    let mut offsets = vec![
        0,
        1,
        15,
        16,
        bs - 1,
        bs,
        bs + 1,
        3 * bs + 17,
        size - 1,
        size,
    ];
    offsets.retain(|&o| o <= size);
    for &off in &offsets {
        for len in [
            0usize,
            1,
            16,
            1000,
            bs as usize,
            bs as usize + 3,
            3 * bs as usize + 5,
            1 << 20,
        ] {
            let got = dev.read(off, len, &mut scratch).unwrap();
            let end = (off + len as u64).min(size) as usize;
            assert_eq!(got, &data[off as usize..end], "bs {bs} off {off} len {len}");
            let got = dev.read_data(off, len, &mut scratch).unwrap();
            assert_eq!(
                got,
                &data[off as usize..end],
                "data: bs {bs} off {off} len {len}"
            );
            let mut out = vec![0u8; len];
            let n = dev.read_data_into(off, &mut out, &mut scratch).unwrap();
            assert_eq!(
                &out[..n],
                &data[off as usize..end],
                "into: bs {bs} off {off} len {len}"
            );
            if off + len as u64 <= size {
                let mut buf = vec![0u8; len];
                dev.read_exact(off, &mut buf).unwrap();
                assert_eq!(&buf[..], &data[off as usize..end]);
            }
        }
    }
}

#[test]
fn reads_match_the_file_at_every_block_size() {
    // Not a multiple of any block size: the last block is partial.
    let (f, data) = image(3 * 1024 * 1024 + 1536);
    let mut bs = MIN_BLOCK_SIZE;
    while bs <= MAX_BLOCK_SIZE {
        let store = Store::open(f.path(), &OpenOptions::default()).unwrap();
        let dev = BlockDev::new(store, bs, 1 << 20).unwrap();
        check_reads(&dev, &data);
        bs *= 4;
    }
}

#[test]
fn direct_reads_match_or_fall_back() {
    let (f, data) = image(2 * 1024 * 1024 + 4096);
    // Blocks are metadata, read through the page cache: any size will do.
    for bs in [MIN_BLOCK_SIZE, 4096, 65536, MAX_BLOCK_SIZE] {
        let store = Store::open(f.path(), &direct()).unwrap();
        if let Some(why) = store.direct_fallback() {
            eprintln!("O_DIRECT refused here ({why}); checking the buffered fallback");
        }
        let dev = BlockDev::new(store, bs, 1 << 20).unwrap();
        check_reads(&dev, &data);
    }
}

#[test]
fn reads_past_a_truncation_fail_cleanly() {
    let (f, _) = image(64 * 1024);
    let store = Store::open(f.path(), &OpenOptions::default()).unwrap();
    let dev = BlockDev::new(store, 4096, 1 << 20).unwrap();
    f.as_file().set_len(8192).unwrap();
    let mut scratch = Scratch::new();
    assert!(dev.read(0, 4096, &mut scratch).is_ok());
    let err = dev.read(16384, 40000, &mut scratch).unwrap_err();
    assert_eq!(err.errno(), libc::EIO, "{err}");
    let mut b = [0u8; 16];
    assert!(dev.read_exact(60000, &mut b).is_err());
}

#[test]
fn ranges_beyond_the_end_are_corrupt() {
    let (f, _) = image(4096);
    let dev = BlockDev::new(
        Store::open(f.path(), &OpenOptions::default()).unwrap(),
        1024,
        1 << 16,
    )
    .unwrap();
    let mut b = [0u8; 32];
    let e = dev.read_exact(4090, &mut b).unwrap_err();
    assert!(matches!(
        e.corruption::<Corrupt>(),
        Some(Corrupt::ReadPastEnd { size: 4096, .. })
    ));
    let e = dev.check_range(u64::MAX - 3, 16).unwrap_err();
    assert_eq!(
        e.corruption::<Corrupt>(),
        Some(&Corrupt::ReadPastEnd {
            offset: u64::MAX - 3,
            len: 16,
            size: 4096
        })
    );
}

/// Pages of `f` resident in the page cache, one flag per page.
fn resident(f: &std::fs::File, len: usize) -> Vec<bool> {
    foliofs_testkit::folios::resident(f, len).unwrap()
}

/// A file of `len` bytes on a disk (not in a tmpfs /tmp, whose pages
/// cannot be dropped) with none of its pages cached; `None` where the file
/// system keeps them.
fn uncached_file(len: usize) -> Option<(tempfile::NamedTempFile, Vec<u8>)> {
    use std::os::unix::io::AsRawFd;
    let target = concat!(env!("CARGO_MANIFEST_DIR"), "/../../target");
    let dir = std::path::Path::new(target);
    let data = pattern(len);
    let mut f = if dir.is_dir() {
        tempfile::NamedTempFile::new_in(dir).unwrap()
    } else {
        tempfile::NamedTempFile::new().unwrap()
    };
    f.write_all(&data).unwrap();
    f.as_file().sync_all().unwrap();
    // SAFETY: posix_fadvise reads only its integer arguments.
    unsafe { libc::posix_fadvise(f.as_file().as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if resident(f.as_file(), len).iter().any(|&r| r) {
        eprintln!("skipped: this file system keeps pages after POSIX_FADV_DONTNEED");
        return None;
    }
    Some((f, data))
}

#[test]
fn prefetch_fills_the_page_cache_with_the_blocks_asked_for() {
    let len = 4 << 20;
    let Some((f, data)) = uncached_file(len) else {
        return;
    };
    let dev = BlockDev::open(f.path(), &OpenOptions::default(), 4096).unwrap();
    // Two blocks close together, one far away; nothing else.
    dev.prefetch([4096 + 10, 3 * 4096, (3 << 20) + 5]);
    let page = page_size() as usize;
    // Blocks 1 and 3 merge into one range with block 2 between them.
    let wanted = [4096..4 * 4096, 0x300000..0x300000 + 4096];
    let want = |i: usize| {
        wanted
            .iter()
            .any(|r| r.start < (i + 1) * page && i * page < r.end)
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let r = resident(f.as_file(), len);
        if (0..r.len()).filter(|&i| want(i)).all(|i| r[i]) {
            // Far-off pages were not read (the kernel may read a little
            // around a request, never megabytes).
            assert!(!r[(2 << 20) / page], "a page between the ranges was read");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "prefetched pages never arrived"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    check_reads(&dev, &data);
}

#[test]
fn prefetch_past_the_end_does_nothing() {
    let (f, data) = image(1 << 20);
    for opts in [direct(), OpenOptions::default()] {
        let dev = BlockDev::open(f.path(), &opts, 4096).unwrap();
        dev.prefetch([1 << 20, 1 << 30, u64::MAX]);
        check_reads(&dev, &data);
    }
}

/// With `directio`, file data bypasses the page cache while metadata (the
/// cached blocks, and their read-ahead) goes through it, as on the
/// kernel's file-backed EROFS.
#[test]
fn direct_mode_reads_data_past_the_page_cache_and_metadata_through_it() {
    let len = 4 << 20;
    let Some((f, data)) = uncached_file(len) else {
        return;
    };
    let dev = BlockDev::open(f.path(), &direct(), 4096).unwrap();
    if let Some(why) = dev.store().direct_fallback() {
        eprintln!("skipped: O_DIRECT refused here ({why})");
        return;
    }
    let page = page_size() as usize;
    let mut scratch = Scratch::new();
    // Data: small, unaligned, and large reads.
    for (off, n) in [(1 << 20, 100), ((2 << 20) + 5, 10_000), (3 << 20, 1 << 20)] {
        let got = dev.read_data(off as u64, n, &mut scratch).unwrap();
        assert_eq!(got, &data[off..off + n]);
        let mut out = vec![0u8; n];
        dev.read_data_into(off as u64, &mut out, &mut scratch)
            .unwrap();
        assert_eq!(out, &data[off..off + n]);
    }
    // Metadata: one block read, one prefetched.
    let mut buf = [0u8; 64];
    dev.read_exact(4096 + 7, &mut buf).unwrap();
    assert_eq!(buf, data[4096 + 7..4096 + 71]);
    dev.prefetch([5 * 4096]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let r = resident(f.as_file(), len);
        // Data was read at 1 MiB and beyond, metadata below.
        let data_pages: Vec<usize> = (0..r.len())
            .filter(|&i| r[i] && i >= (1 << 20) / page)
            .collect();
        assert!(data_pages.is_empty(), "data pages cached: {data_pages:?}");
        if r[1] && r[5] {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "metadata pages never arrived"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}
