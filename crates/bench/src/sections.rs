//! The four benchmark sections, one per table of the kernel patches foliofs
//! grew from.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Result};
use foliofs_vfs::chain_line;
use foliofs_vfs::options::{format_size, OptionError};

use crate::env::{extra_dir, remove_extra_dir, user_read_ahead_kb};
use crate::env::{have, run, time_cmd, time_md5, time_read, time_write_zeros};
use crate::env::{BenchEnv, Cooling, How, MkfsErofs, Mounted};
use crate::report::{Column, Row, Section, Unit};
use crate::Config;
use foliofs_testkit::data;

/// Prints progress on one line of stderr.
pub fn progress(cfg: &Config, msg: &str) {
    if cfg.tty {
        eprint!("\r\x1b[K{msg}");
    } else {
        eprintln!("{msg}");
    }
}

/// What "cold" means in this run, where it is not root's dropped page
/// cache.
pub(crate) fn cold_note(env: &BenchEnv) -> Option<String> {
    if env.cooling() == Cooling::DropCaches {
        return None;
    }
    let l = env.take_leftover();
    if l.bytes == 0 {
        return None;
    }
    let mut note = if l.cached == 0 {
        "not running as root, so the page cache was not dropped (/proc/sys/vm/drop_caches needs root): each cold run instead wrote back and evicted the files it reads with posix_fadvise(POSIX_FADV_DONTNEED), and mincore(2) found none of their pages left; the disk's directories and inodes stay cached".to_owned()
    } else {
        // Of every byte the evictions were asked for, the share still cached.
        let pct = (l.cached as f64 * 100.0 / l.bytes.max(1) as f64).ceil();
        let warm = if l.cached >= l.bytes {
            "warm"
        } else {
            "partly warm"
        };
        format!(
            "not running as root, so the page cache was not dropped (/proc/sys/vm/drop_caches needs root), and posix_fadvise(POSIX_FADV_DONTNEED) left {pct:.0}% of the files the cold runs read cached (a work directory on tmpfs keeps them all: --workdir on a disk), so 'cold' figures are {warm}"
        )
    };
    if l.unchecked > 0 {
        note.push_str(&format!(
            "; {} MB in files that are not yours could not be checked",
            l.unchecked.div_ceil(1_000_000)
        ));
    }
    Some(note)
}

/// What the seq note says about each cold run.
fn cold_phrase(env: &BenchEnv) -> &'static str {
    match env.cooling() {
        Cooling::DropCaches => "each run drops the page cache first",
        Cooling::Evict => "each run first evicts the image from the page cache",
    }
}

/// What a user's foliofs mounts read ahead, for the sections that read
/// files through them.
pub(crate) fn read_ahead_note(env: &BenchEnv) -> Option<String> {
    if env.root {
        return None;
    }
    let kb = match user_read_ahead_kb() {
        Some(kb) => format!("{kb} KiB, "),
        None => String::new(),
    };
    Some(format!(
        "not running as root, so foliofs mounts read ahead {kb}the kernel's FUSE default: raising it to {} KiB, as root's mounts do, is writing /sys/class/bdi, which needs root, so large sequential reads may be slower than root's",
        foliofs_fuse::IMAGE_READ_AHEAD_KB
    ))
}

/// Why a row cannot run here, if it cannot.
pub(crate) fn unavailable(env: &BenchEnv, how: &How) -> Option<String> {
    match how {
        How::KernelFile { fstype, .. } if !env.root => Some(format!(
            "needs root: mounting the kernel's {fstype} (mount(2) of the image file)"
        )),
        How::KernelLoop { fstype } if !env.root => Some(format!(
            "needs root: a loop device to mount the kernel's {fstype} on"
        )),
        How::KernelMem { fstype, .. } if !env.root => {
            Some(format!("needs root: mounting a new kernel {fstype}"))
        }
        How::Squashfuse if !have("squashfuse") => Some("squashfuse is not installed".into()),
        How::Foliofs { .. } | How::Squashfuse if !Path::new("/dev/fuse").exists() => {
            Some("/dev/fuse is missing".into())
        }
        How::Foliofs {
            fstype: "ramfs",
            opts,
        } => ramfs_options_refused(opts),
        _ => None,
    }
}

/// Why a ramfs row's options cannot be had here (`huge=always` without
/// transparent huge pages), if so: `foliofs mount -t ramfs`'s own answer.
fn ramfs_options_refused(opts: &str) -> Option<String> {
    let items: Vec<(String, Option<String>)> = opts
        .split(',')
        .filter(|i| !i.is_empty())
        .map(|i| match i.split_once('=') {
            Some((k, v)) => (k.to_owned(), Some(v.to_owned())),
            None => (i.to_owned(), None),
        })
        .collect();
    let refused = foliofs_ramfs::Options::from_mount_options(&items).err()?;
    // A row's options are written here and are fine on their own; what is
    // left is why this machine cannot have them, which is the note.
    Some(match refused {
        OptionError::Conflict(why) => why,
        e => e.to_string(),
    })
}

/// Why a row has no image: a tool this machine lacks (the row is skipped)
/// or a build that went wrong (the row failed).
#[derive(Clone, Debug)]
pub(crate) struct NoImage {
    pub(crate) why: String,
    pub(crate) failed: bool,
}

impl NoImage {
    pub(crate) fn skip(why: impl Into<String>) -> NoImage {
        NoImage {
            why: why.into(),
            failed: false,
        }
    }

    pub(crate) fn failed(e: &anyhow::Error) -> NoImage {
        NoImage {
            why: chain_line(e.as_ref()),
            failed: true,
        }
    }
}

pub(crate) type Image = Result<PathBuf, NoImage>;

pub(crate) const NO_MKFS_EROFS: &str = "mkfs.erofs is not installed (erofs-utils)";

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

/// One row to measure: a label, how to mount, and which image.
struct Plan {
    label: String,
    kind: &'static str,
    how: How,
    image: Image,
    x: Option<u64>,
}

fn read_plans(images: &Images, romfs_sizes: &[(&str, &str)], with_direct: bool) -> Vec<Plan> {
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

/// A timed workload on a mounted file system: a column key and a function
/// of the mount point giving seconds (or, for throughput columns, GB/s).
type Workload<'a> = (&'static str, &'a dyn Fn(&Path) -> Result<f64>);

/// Measures every plan with every workload, `cfg.runs` rounds. A round
/// visits every plan once, so drift in the machine (a noisy disk, other
/// load) spreads over all rows instead of landing on one. Cold workloads get
/// a fresh mount and a dropped page cache every time, so neither the
/// kernel's caches nor a FUSE server's own block cache carry over from one
/// measurement to the next.
fn measure_rows(
    env: &BenchEnv,
    cfg: &Config,
    section: &str,
    plans: &[Plan],
    cold: bool,
    workloads: &[Workload<'_>],
) -> Vec<Row> {
    let mut rows: Vec<Row> = plans
        .iter()
        .map(|p| {
            let mut row = Row::new(p.label.clone(), p.kind);
            row.x = p.x;
            if let Some(why) = unavailable(env, &p.how) {
                row.note = Some(why);
            } else if let Err(no) = &p.image {
                row.note = Some(format!("no image: {}", no.why));
                row.failed = no.failed;
            }
            row
        })
        .collect();
    for i in 0..cfg.runs {
        for (plan, row) in plans.iter().zip(rows.iter_mut()) {
            let Ok(image) = &plan.image else { continue };
            if row.note.is_some() {
                continue;
            }
            progress(
                cfg,
                &format!("[{section}] round {}/{}: {}", i + 1, cfg.runs, plan.label),
            );
            let result = (|| -> Result<()> {
                let mount = || Mounted::new(env, &plan.how, image, &env.fresh_dir("mnt")?);
                let warm = if cold { None } else { Some(mount()?) };
                for (key, work) in workloads {
                    let v = match &warm {
                        Some(m) => work(&m.dir)?,
                        None => {
                            let m = mount()?;
                            env.cool(image);
                            work(&m.dir)?
                        }
                    };
                    push(row, key, v);
                }
                Ok(())
            })();
            if let Err(e) = result {
                row.note = Some(chain_line(e.as_ref()));
                row.failed = true;
            }
        }
    }
    rows
}

fn push(row: &mut Row, key: &'static str, v: f64) {
    row.runs.entry(key).or_default().push(v);
}

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
    let mut pairs = Vec::new();
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
    let rows = measure_rows(env, cfg, "seq", &plans, true, &[("dd", &dd), ("md5", &md5)]);
    let mut notes = vec![format!(
        "one {} MiB random file (the lz4, lzma, deflate and zstd rows: as much data that compresses to half, in images by {}); {}; ratios are to reading the image file",
        cfg.seq_size >> 20,
        mkfs.as_ref().map_or("mkfs.erofs".into(), MkfsErofs::describe),
        cold_phrase(env),
    )];
    notes.extend(cold_note(env));
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

/// The compressed seq rows: label, and the algorithm as mkfs.erofs's `-z`
/// names it (LZ4 at its high-compression setting, as images are made).
const COMPRESSED: [(&str, &str); 4] = [
    ("lz4", "lz4hc"),
    ("lzma", "lzma"),
    ("deflate", "deflate"),
    ("zstd", "zstd"),
];

/// An image of `src` compressed with `alg` at mkfs.erofs's default level
/// and cluster size, or why there is none.
fn compressed_image(
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

/// The romfs seed's test 3: list and stat a whole tree, cold.
pub fn tree(env: &BenchEnv, cfg: &Config) -> Result<Section> {
    let (src, stats) = source_tree(env, cfg, "tree", cfg.tree_files, cfg.tree_bytes)?;
    let images = build_images(env, &src, cfg);
    let columns = vec![
        Column {
            key: "find",
            label: "find MNT",
            unit: Unit::Seconds,
        },
        Column {
            key: "find_ls",
            label: "find MNT -ls",
            unit: Unit::Seconds,
        },
    ];
    let plans = read_plans(
        &images,
        &[("1K", "blocksize=1K"), ("largeblocks", "largeblocks")],
        false,
    );
    let reference = plans
        .iter()
        .position(|p| p.label == "kernel erofs, file-backed")
        .unwrap_or(0);
    let find = |mnt: &Path| time_cmd(Command::new("find").arg(mnt));
    let find_ls = |mnt: &Path| time_cmd(Command::new("find").arg(mnt).arg("-ls"));
    let rows = measure_rows(
        env,
        cfg,
        "tree",
        &plans,
        true,
        &[("find", &find), ("find_ls", &find_ls)],
    );
    let mut notes = vec![format!(
        "{} files in {} directories, {} MB; ratios are to the kernel's file-backed EROFS mount{}",
        stats.files,
        stats.dirs,
        stats.bytes / 1_000_000,
        if env.root {
            ""
        } else {
            " (none here: it needs root)"
        }
    )];
    notes.extend(cold_note(env));
    Ok(Section {
        name: "tree",
        title: "tree: list and stat a whole tree, cold (romfs test 3)".into(),
        columns,
        rows,
        reference,
        pairs: Vec::new(),
        notes,
    })
}

/// The ramfs seed's table: `dd bs=2M` writes at every block size.
pub fn ramfs(env: &BenchEnv, cfg: &Config) -> Result<Section> {
    // Two columns, because where the memory comes from matters as much as
    // the file system: a first write into a fresh mount takes pages the
    // machine may not have backed yet (in a VM whose balloon reports free
    // pages, every such page costs the hypervisor a fault), while a rewrite
    // after `rm` reuses what the first write freed. The seed's table is
    // the second case on bare metal.
    let columns = vec![
        Column {
            key: "write",
            label: "1st write (dd bs=2M)",
            unit: Unit::GBps,
        },
        Column {
            key: "rewrite",
            label: "rewrite after rm",
            unit: Unit::GBps,
        },
    ];
    let mut plans = Vec::new();
    let mut bs = 4096u64;
    while bs <= 2 << 20 {
        plans.push(Plan {
            label: format!("foliofs ramfs blocksize={}", format_size(bs)),
            kind: "foliofs",
            how: How::Foliofs {
                fstype: "ramfs",
                opts: format!("blocksize={bs}"),
            },
            image: Ok(PathBuf::from("none")),
            x: Some(bs),
        });
        bs *= 2;
    }
    // 2 MiB blocks as huge pages, beside the kernel's tmpfs huge=always.
    plans.push(Plan {
        label: "foliofs ramfs blocksize=2M,huge=always".into(),
        kind: "foliofs",
        how: How::Foliofs {
            fstype: "ramfs",
            opts: "blocksize=2M,huge=always".into(),
        },
        image: Ok(PathBuf::from("none")),
        x: None,
    });
    // The kernel's writeback cache trades ENOSPC at write(2) for batching;
    // show what it buys at the largest block size.
    plans.push(Plan {
        label: "foliofs ramfs blocksize=2M,writeback".into(),
        kind: "foliofs",
        how: How::Foliofs {
            fstype: "ramfs",
            opts: "blocksize=2M,writeback".into(),
        },
        image: Ok(PathBuf::from("none")),
        x: None,
    });
    let reference = plans.len();
    for (label, fstype, opts) in [
        ("kernel ramfs", "ramfs", ""),
        ("kernel tmpfs", "tmpfs", ""),
        ("kernel tmpfs huge=always", "tmpfs", "huge=always"),
    ] {
        plans.push(Plan {
            label: label.into(),
            kind: "kernel",
            how: How::KernelMem {
                fstype,
                opts: opts.into(),
            },
            image: Ok(PathBuf::from("none")),
            x: None,
        });
    }
    let total = cfg.ramfs_bytes;
    // A user can mount neither, but has the machine's /dev/shm, a tmpfs
    // already mounted: the kernel's in-memory file system beside foliofs's.
    // Its options are the machine's, not a fresh mount's defaults.
    let shm = (!env.root).then(|| {
        let dir = shm_dir(total);
        plans.push(Plan {
            label: "kernel tmpfs at /dev/shm".into(),
            kind: "kernel",
            how: How::Plain,
            image: dir.as_ref().map(|(d, _)| d.clone()).map_err(Clone::clone),
            x: None,
        });
        (plans.len() - 1, dir)
    });
    let write = |mnt: &Path| -> Result<f64> {
        let f = mnt.join("f");
        let t = time_write_zeros(&f, total, 2 << 20)?;
        std::fs::remove_file(&f)?;
        Ok(total as f64 / 1e9 / t)
    };
    // Both columns run the same workload; they differ because
    // `measure_rows` runs a row's workloads in turn on one warm mount, so
    // the second finds the memory the first freed.
    let rows = measure_rows(
        env,
        cfg,
        "ramfs",
        &plans,
        false,
        &[("write", &write), ("rewrite", &write)],
    );
    let (reference, ref_name) = match &shm {
        None => (reference, "the kernel's ramfs".to_owned()),
        Some((i, dir)) => {
            let opts = match dir {
                Ok((d, opts)) => {
                    remove_extra_dir(d);
                    format!(" ({opts})")
                }
                Err(_) => String::new(),
            };
            (
                *i,
                format!("the kernel's tmpfs at /dev/shm{opts}, already mounted: mounting a new ramfs or tmpfs needs root"),
            )
        }
    };
    Ok(Section {
        name: "ramfs",
        title: "ramfs: sequential writes by block size (ramfs blocksize= table)".into(),
        columns,
        rows,
        reference,
        pairs: Vec::new(),
        notes: vec![format!(
            "{} MiB written from /dev/zero-like buffers in 2 MiB writes per run, then removed and written again on the same mount; ratios are to {ref_name}",
            total >> 20
        ), "the 1st write also measures how fast the machine hands out memory it has not used lately (in a VM, often a hypervisor fault per page), which depends on what ran before; the rewrite is the file systems' own speed".into()],
    })
}

/// A directory of this run in /dev/shm, with the tmpfs's options, if
/// /dev/shm is a tmpfs with room for `bytes`.
fn shm_dir(bytes: u64) -> Result<(PathBuf, String), NoImage> {
    let shm = Path::new("/dev/shm")
        .canonicalize()
        .map_err(|e| NoImage::skip(format!("/dev/shm: {e}")))?;
    match foliofs_fuse::find_mount(&shm).ok().flatten() {
        Some(m) if m.fs_type == "tmpfs" => {
            let st = nix::sys::statvfs::statvfs(&shm)
                .map_err(|e| NoImage::skip(format!("/dev/shm: {e}")))?;
            let free = st.blocks_available() as u64 * st.fragment_size() as u64;
            if free < bytes + bytes / 8 {
                return Err(NoImage::skip(format!(
                    "/dev/shm has {} free, the run writes {}",
                    format_size(free),
                    format_size(bytes)
                )));
            }
            let dir = extra_dir(&shm).map_err(|e| NoImage::skip(chain_line(e.as_ref())))?;
            Ok((dir, m.super_options))
        }
        Some(m) => Err(NoImage::skip(format!(
            "/dev/shm is a {}, not a tmpfs",
            m.fs_type
        ))),
        None => Err(NoImage::skip("/dev/shm is not a mount of its own")),
    }
}
