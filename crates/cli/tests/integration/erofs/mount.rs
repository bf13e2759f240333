//! A foliofs mount of EROFS images under concurrent random reads: every
//! `pread` from eight threads at random offsets and lengths returns exactly
//! the source file's bytes, for compressed, chunked and plain layouts.

use crate::common;

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use rand::Rng;

/// About 6 MiB that LZ4 compresses to roughly half: words, then noise.
fn content() -> Vec<u8> {
    let mut rng = common::rng(99);
    let mut v = Vec::with_capacity(6 << 20);
    while v.len() < 4 << 20 {
        let w = ["foliofs ", "erofs ", "cluster ", "extent ", "lz4 "][rng.gen_range(0..5) as usize];
        v.extend_from_slice(w.as_bytes());
        v.push(b'a' + rng.gen_range(0..26) as u8);
    }
    v.extend(common::random_bytes(&mut rng, 2 << 20));
    v
}

pub fn random_reads(file: &Path, want: Arc<Vec<u8>>) {
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let want = want.clone();
            let file = file.to_owned();
            std::thread::spawn(move || {
                let f = fs::File::open(&file).unwrap();
                let mut rng = common::rng(1000 + t);
                let mut buf = vec![0u8; 600_000];
                for _ in 0..150 {
                    let off = rng.gen_range(0..want.len() + 1000);
                    let len = 1 + rng.gen_range(0..buf.len());
                    let n = f.read_at(&mut buf[..len], off as u64).unwrap();
                    let expect = &want[off.min(want.len())..(off + len).min(want.len())];
                    assert_eq!(n, expect.len(), "short read at {off}+{len}");
                    assert!(buf[..n] == *expect, "wrong bytes at {off}+{len}");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

#[test]
fn concurrent_random_reads_return_the_source_bytes() {
    require!("fuse", "mkfs.erofs");
    let tmp = tempfile::Builder::new()
        .prefix("foliofs-erofs-mnt.")
        .tempdir()
        .unwrap();
    let src = tmp.path().join("src");
    fs::create_dir_all(&src).unwrap();
    let data = Arc::new(content());
    fs::write(src.join("file"), &*data).unwrap();
    for (name, args) in [
        ("plain", vec![]),
        ("lz4", vec!["-zlz4hc", "-C65536", "-Eztailpacking"]),
        ("lz4-legacy", vec!["-zlz4", "-Elegacy-compress"]),
        ("chunked", vec!["--chunksize=65536"]),
    ] {
        let img = tmp.path().join(format!("{name}.erofs"));
        common::mkfs_erofs(&args, &img, &src);
        for opts in ["", "directio"] {
            let m = common::Mount::new(&img, None, opts)
                .unwrap_or_else(|e| panic!("{name} -o {opts:?}: {e}"));
            random_reads(&m.path().join("file"), data.clone());
            m.unmount().unwrap();
        }
    }
}
