//! The images a read section compares, built from one source tree, and
//! the rows that read them.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Result;
use foliofs_testkit::data;

use crate::env::{have, run, BenchEnv};
use crate::mkfs::MkfsErofs;
use crate::mount::How;
use crate::rows::{progress, Image, NoImage, Plan, NO_MKFS_EROFS};
use crate::Config;

/// The images a read section compares, built from one source tree.
pub(crate) struct Images {
    pub(crate) romfs: Image,
    pub(crate) erofs: Image,
    pub(crate) squashfs: Image,
}

pub(crate) fn build_images(env: &BenchEnv, src: &Path, cfg: &Config) -> Images {
    progress(cfg, "building images");
    let romfs = env.dir.join("image.romfs");
    let romfs = run(Command::new(&env.exe)
        .args(["mkfs", "romfs"])
        .arg(src)
        .arg(&romfs))
    .map(|_| romfs)
    .map_err(|e| NoImage::failed(&e));
    let erofs = match &cfg.mkfs_erofs {
        Some(mkfs) => {
            let img = env.dir.join("image.erofs");
            run(Command::new(mkfs)
                .arg("--quiet")
                .arg("-T0")
                .arg(&img)
                .arg(src))
            .map(|_| img)
            .map_err(|e| NoImage::failed(&e))
        }
        None => Err(NoImage::skip(NO_MKFS_EROFS)),
    };
    let squashfs = if have("mksquashfs") {
        let img = env.dir.join("image.squashfs");
        run(Command::new("mksquashfs").arg(src).arg(&img).args([
            "-noappend",
            "-noI",
            "-noD",
            "-noF",
            "-noX",
            "-quiet",
            "-no-progress",
        ]))
        .map(|_| img)
        .map_err(|e| NoImage::failed(&e))
    } else {
        Err(NoImage::skip(
            "mksquashfs is not installed (squashfs-tools)",
        ))
    };
    Images {
        romfs,
        erofs,
        squashfs,
    }
}

pub(crate) fn read_plans(
    images: &Images,
    romfs_sizes: &[(&str, &str)],
    with_direct: bool,
) -> Vec<Plan> {
    let mut plans = Vec::new();
    let mut modes = vec![("", "")];
    if with_direct {
        modes.push((" directio", "directio"));
    }
    for (mode_label, mode_opt) in &modes {
        for (label, opt) in romfs_sizes {
            let opts = [*opt, *mode_opt]
                .iter()
                .filter(|s| !s.is_empty())
                .copied()
                .collect::<Vec<_>>()
                .join(",");
            plans.push(Plan {
                label: format!("foliofs romfs {label}{mode_label}"),
                kind: "foliofs",
                how: How::Foliofs {
                    fstype: "romfs",
                    opts,
                },
                image: images.romfs.clone(),
                x: None,
            });
        }
        plans.push(Plan {
            label: format!("foliofs erofs{mode_label}"),
            kind: "foliofs",
            how: How::Foliofs {
                fstype: "erofs",
                opts: mode_opt.to_string(),
            },
            image: images.erofs.clone(),
            x: None,
        });
    }
    // The same EROFS mount over FUSE's io_uring, where the run has it.
    plans.push(Plan {
        label: "foliofs erofs, io_uring".into(),
        kind: "foliofs",
        how: How::Foliofs {
            fstype: "erofs",
            opts: "io_uring".into(),
        },
        image: images.erofs.clone(),
        x: None,
    });
    plans.push(Plan {
        label: "kernel erofs, file-backed".into(),
        kind: "kernel",
        how: How::KernelFile {
            fstype: "erofs",
            opts: String::new(),
        },
        image: images.erofs.clone(),
        x: None,
    });
    if with_direct {
        plans.push(Plan {
            label: "kernel erofs, file-backed directio".into(),
            kind: "kernel",
            how: How::KernelFile {
                fstype: "erofs",
                opts: "directio".into(),
            },
            image: images.erofs.clone(),
            x: None,
        });
    }
    plans.push(Plan {
        label: "kernel erofs, loop".into(),
        kind: "kernel",
        how: How::KernelLoop { fstype: "erofs" },
        image: images.erofs.clone(),
        x: None,
    });
    plans.push(Plan {
        label: "kernel squashfs (uncompressed), loop".into(),
        kind: "kernel",
        how: How::KernelLoop { fstype: "squashfs" },
        image: images.squashfs.clone(),
        x: None,
    });
    plans.push(Plan {
        label: "squashfuse".into(),
        kind: "fuse-peer",
        how: How::Squashfuse,
        image: images.squashfs.clone(),
        x: None,
    });
    plans
}

/// The compressed seq rows: label, and the algorithm as mkfs.erofs's `-z`
/// names it (LZ4 at its high-compression setting, as images are made).
pub(crate) const COMPRESSED: [(&str, &str); 4] = [
    ("lz4", "lz4hc"),
    ("lzma", "lzma"),
    ("deflate", "deflate"),
    ("zstd", "zstd"),
];

/// An image of `src` compressed with `alg` at mkfs.erofs's default level
/// and cluster size, or why there is none.
pub(crate) fn compressed_image(
    env: &BenchEnv,
    cfg: &Config,
    mkfs: &MkfsErofs,
    src: &Path,
    label: &str,
    alg: &str,
) -> Image {
    if let Some(why) = mkfs.lacks(alg) {
        return Err(NoImage::skip(why));
    }
    progress(cfg, &format!("[seq] building the {label} image"));
    let img = env.dir.join(format!("image-{label}.erofs"));
    run(Command::new(&mkfs.path)
        .args(["--quiet", "-T0"])
        .arg(format!("-z{alg}"))
        .arg(&img)
        .arg(src))
    .map(|_| img)
    .map_err(|e| NoImage::failed(&e))
}

/// Source tree for `tree` and `startup`: the user's, or one made here.
pub(crate) fn source_tree(
    env: &BenchEnv,
    cfg: &Config,
    name: &str,
    files: u64,
    bytes: u64,
) -> Result<(PathBuf, data::TreeStats)> {
    if let Some(t) = &cfg.tree {
        return Ok((t.clone(), data::measure_tree(t)?));
    }
    let dir = env.subdir(name)?;
    progress(cfg, &format!("[{name}] making {files} files"));
    let stats = data::tree(&dir, files, bytes, 0x7ee)?;
    Ok((dir, stats))
}
