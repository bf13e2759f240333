//! The romfs seed's tests 1 and 2: one large file read cold.

use std::path::Path;

use anyhow::{bail, Result};
use foliofs_testkit::data;
use foliofs_vfs::chain_line;

use crate::env::BenchEnv;
use crate::images::{build_images, compressed_image, read_plans, COMPRESSED};
use crate::mkfs::MkfsErofs;
use crate::mount::How;
use crate::readahead::{disk_read_ahead_file, DiskReadAhead};
use crate::report::{Column, Section, Unit};
use crate::rows::{
    cold_note, cold_phrase, measure_rows, progress, read_ahead_note, NoImage, Plan, NO_MKFS_EROFS,
};
use crate::timing::{time_md5, time_read};
use crate::Config;

/// The romfs seed's tests 1 and 2: one large file, read cold through each
/// file system and compared with reading the image itself.
pub fn seq(env: &BenchEnv, cfg: &Config) -> Result<Section> {
    let src = env.subdir("seq-src")?;
    progress(
        cfg,
        &format!("[seq] writing a {} MiB file", cfg.seq_size >> 20),
    );
    data::random_file(&src.join("file"), cfg.seq_size, 0x5e9)?;
    let images = build_images(env, &src, cfg);
    let columns = vec![
        Column {
            key: "dd",
            label: "read (dd bs=1M)",
            unit: Unit::Seconds,
        },
        Column {
            key: "md5",
            label: "md5sum",
            unit: Unit::Seconds,
        },
    ];
    // Test 1 reads the image file itself: a directory holding a hard link
    // to it, so the same workloads run on it as on every mount.
    let plain = env.subdir("seq-image")?;
    let image = images.romfs.clone().and_then(|img| {
        std::fs::hard_link(&img, plain.join("file"))
            .map_err(|e| NoImage::failed(&anyhow::anyhow!("linking the image: {e}")))?;
        Ok(plain.clone())
    });
    let mut plans = vec![Plan {
        label: "image file itself (test 1)".into(),
        kind: "baseline",
        how: How::Plain,
        image,
        x: None,
    }];
    let sizes = [
        ("1K", "blocksize=1K"),
        ("largeblocks", "largeblocks"),
        ("64K", "blocksize=64K"),
        ("1M", "blocksize=1M"),
        ("2M", "blocksize=2M"),
    ];
    plans.extend(read_plans(&images, &sizes, true));
    // The same size of data, compressible, in an image per algorithm:
    // foliofs's decompression beside the kernel's, of the same image.
    let mkfs = cfg.mkfs_erofs.as_deref().map(MkfsErofs::probe);
    let zsrc = match &mkfs {
        Some(_) => {
            let dir = env.subdir("seq-z-src")?;
            data::compressible_file(&dir.join("file"), cfg.seq_size, 0x124)?;
            Ok(dir)
        }
        None => Err(NoImage::skip(NO_MKFS_EROFS)),
    };
    // What FUSE costs a large read, round by round: foliofs's buffered
    // rows against the image file itself.
    let mut pairs: Vec<(usize, usize)> = [
        "foliofs romfs largeblocks",
        "foliofs erofs",
        "foliofs erofs, io_uring",
    ]
    .iter()
    .filter_map(|l| plans.iter().position(|p| p.label == *l))
    .map(|i| (i, 0))
    .collect();
    for (label, alg) in COMPRESSED {
        let image = zsrc.clone().and_then(|src| {
            let mkfs = mkfs.as_ref().expect("a source only with mkfs.erofs");
            compressed_image(env, cfg, mkfs, &src, label, alg)
        });
        pairs.push((plans.len(), plans.len() + 1));
        plans.push(Plan {
            label: format!("foliofs erofs {label}"),
            kind: "foliofs",
            how: How::Foliofs {
                fstype: "erofs",
                opts: String::new(),
            },
            image: image.clone(),
            x: None,
        });
        plans.push(Plan {
            label: format!("kernel erofs {label}, file-backed"),
            kind: "kernel",
            how: How::KernelFile {
                fstype: "erofs",
                opts: String::new(),
            },
            image,
            x: None,
        });
    }
    let size = cfg.seq_size;
    let dd = |mnt: &Path| -> Result<f64> {
        let f = mnt.join("file");
        let (t, n) = time_read(&f)?;
        // The image holds the file and its header; a mount shows the file.
        if n < size {
            bail!("read {n} bytes of {}, expected {size}", f.display());
        }
        Ok(t)
    };
    let md5 = |mnt: &Path| time_md5(&mnt.join("file"));
    // The reference reads the image file through the disk's read-ahead,
    // foliofs through its mount's (4 MiB) on top of the disk's: held at the
    // mounts' for every row, reading the image file itself is the limit a
    // FUSE server can reach, not a reader left at the disk's default.
    let kb = foliofs_fuse::IMAGE_READ_AHEAD_KB;
    let held = if env.root {
        Some(DiskReadAhead::set(&env.dir, kb))
    } else {
        None
    };
    let rows = measure_rows(env, cfg, "seq", &plans, true, &[("dd", &dd), ("md5", &md5)]);
    let read_ahead = match &held {
        Some(Ok(h)) => format!(
            "every row read the disk with a read-ahead of {kb} KiB, what foliofs's image mounts read ahead theirs (the disk's own, {} KiB, was put back after), so the image file itself is read as far ahead as a mount reads",
            h.was()
        ),
        Some(Err(e)) => format!(
            "the disk's read-ahead could not be held at the mounts' {kb} KiB ({}), so the image file itself was read with the disk's own: the ratios show read-ahead as well as FUSE",
            chain_line(e.as_ref())
        ),
        None => format!(
            "the disk read ahead {} KiB (a user cannot change it, nor raise the mounts' to {kb} KiB as root does)",
            disk_read_ahead_file(&env.dir)
                .and_then(|f| std::fs::read_to_string(f).ok())
                .map_or_else(|| "an unknown number of".to_owned(), |s| s.trim().to_owned())
        ),
    };
    drop(held);
    let mut notes = vec![format!(
        "one {} MiB random file (the lz4, lzma, deflate and zstd rows: as much data that compresses to half, in images by {}); {}; ratios are to reading the image file",
        cfg.seq_size >> 20,
        mkfs.as_ref().map_or("mkfs.erofs".into(), MkfsErofs::describe),
        cold_phrase(env),
    )];
    notes.push(read_ahead);
    notes.extend(cold_note(env));
    notes.extend(crate::rows::uring_note(env));
    notes.extend(read_ahead_note(env));
    Ok(Section {
        name: "seq",
        title: "seq: one large file, cold (romfs tests 1 and 2)".into(),
        columns,
        rows,
        reference: 0,
        pairs,
        notes,
    })
}
