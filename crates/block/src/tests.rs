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
        let store = Store::open(f.path(), IoMode::Buffered).unwrap();
        let dev = BlockDev::new(store, bs, 1 << 20).unwrap();
        check_reads(&dev, &data);
        bs *= 4;
    }
}

#[test]
fn direct_reads_match_or_fall_back() {
    let (f, data) = image(2 * 1024 * 1024 + 4096);
    for bs in [4096, 65536, MAX_BLOCK_SIZE] {
        let store = Store::open(f.path(), IoMode::Direct).unwrap();
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
    let store = Store::open(f.path(), IoMode::Buffered).unwrap();
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
        Store::open(f.path(), IoMode::Buffered).unwrap(),
        1024,
        1 << 16,
    )
    .unwrap();
    let mut b = [0u8; 32];
    assert!(dev.read_exact(4090, &mut b).unwrap_err().is_corrupt());
    assert!(dev.check_range(u64::MAX - 3, 16).is_err());
}
