//! Unpack: a container layer (a tar.gz this section makes of Python's
//! library, or of the start-up tree) turned into something to start from,
//! as containerd's snapshotters do it: `foliofs mkfs erofs`, `mkfs.erofs
//! --tar=f` with the EROFS differ's flags, or `tar x` into a directory (the
//! overlayfs snapshotter). Each row unpacks afresh, then reads every file
//! on a fresh mount of the result (1st run) and again (later run), so the
//! cost a builder leaves behind (dirty pages a direct-I/O mount must flush
//! first) lands where containerd would pay it. Rows are measured in
//! interleaved rounds; image sizes and each builder's peak RSS go in the
//! notes.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};

use crate::env::{have, BenchEnv};
use crate::images::source_tree;
use crate::mount::{How, Mounted};
use crate::report::{Column, Row, Section, Unit};
use crate::rows::progress;
use crate::timing::time_read_tree;
use crate::Config;

/// The UUID containerd would derive from the layer's digest; any fixed one
/// does here.
const UUID: &str = "6f1a2b3c-4d5e-8f60-9a1b-2c3d4e5f6a7b";

#[derive(Clone, Copy, PartialEq)]
enum Way {
    Foliofs,
    MkfsErofs,
    TarX,
    /// Compressed (`-z ALG`), to compare the two builders' speed and
    /// size at the same options.
    FoliofsZ(&'static str),
    MkfsErofsZ(&'static str),
}

/// The compressors the compressed rows use, as `-z` takes them. Zstd's
/// level is given: mkfs.erofs 1.9.3 given none compresses at level -1,
/// though it documents 3, so the two builders would do different work.
const ALGS: [&str; 3] = ["lz4", "lz4hc", "zstd,level=3"];

impl Way {
    /// Index into the per-builder peak RSS and size tables.
    fn slot(self) -> usize {
        match self {
            Way::Foliofs => 0,
            Way::MkfsErofs => 1,
            Way::TarX => 2,
            Way::FoliofsZ(a) => 3 + 2 * ALGS.iter().position(|&x| x == a).unwrap_or(0),
            Way::MkfsErofsZ(a) => 4 + 2 * ALGS.iter().position(|&x| x == a).unwrap_or(0),
        }
    }

    fn is_image(self) -> bool {
        self != Way::TarX
    }
}

/// Runs a shell script with `vars`, returning its seconds.
fn timed_sh(script: &str, vars: &[(&str, &Path)]) -> Result<f64> {
    let mut c = Command::new("sh");
    c.arg("-c").arg(script);
    for (k, v) in vars {
        c.env(k, v);
    }
    let start = Instant::now();
    let out = c.output().context("running sh")?;
    let secs = start.elapsed().as_secs_f64();
    if !out.status.success() {
        bail!("{}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(secs)
}

/// The peak RSS in KiB GNU time wrote to `f`, if it did.
fn rss_kib(f: &Path) -> Option<u64> {
    std::fs::read_to_string(f)
        .ok()?
        .trim()
        .lines()
        .last()?
        .parse()
        .ok()
}

/// Whether this mkfs.erofs reads tar streams (1.6 and later; Debian's 1.5
/// does not).
pub(crate) fn has_tar(mkfs: &Path) -> bool {
    Command::new(mkfs)
        .arg("--help")
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout).contains("--tar")
                || String::from_utf8_lossy(&o.stderr).contains("--tar")
        })
        .unwrap_or(false)
}

pub fn unpack(env: &BenchEnv, cfg: &Config) -> Result<Section> {
    let src = layer_source(env, cfg)?;
    progress(cfg, "[unpack] making the layer");
    let layer = env.dir.join("layer.tar.gz");
    timed_sh(
        "tar --sort=name --format=pax -C \"$SRC\" -cf - . | gzip > \"$LAYER\"",
        &[("SRC", &src), ("LAYER", &layer)],
    )?;
    let layer_size = std::fs::metadata(&layer)?.len();
    let mkfs = cfg.mkfs_erofs.clone().filter(|m| has_tar(m));
    let columns = columns();
    let mut plans = plans(env, mkfs.as_deref());
    let built = run_rounds(env, cfg, &layer, mkfs.as_deref(), &mut plans);
    let rows: Vec<Row> = plans.into_iter().map(|p| p.row).collect();
    let (reference, pairs) = reference_and_pairs(&rows);
    let notes = notes(cfg, &src, layer_size, mkfs.as_deref(), &built);
    Ok(Section {
        name: "unpack",
        title: "unpack: a layer tar.gz made into an EROFS image (foliofs, mkfs.erofs) or a directory, then started from".into(),
        columns,
        rows,
        reference,
        pairs,
        notes,
    })
}

/// The tree the layer is made of: `--tree`, else Python's library, else
/// (quick, or no Python) the start-up tree.
fn layer_source(env: &BenchEnv, cfg: &Config) -> Result<PathBuf> {
    let python = Path::new("/usr/lib/python3.11");
    Ok(match (&cfg.tree, python.is_dir() && !cfg.quick) {
        (Some(t), _) => t.clone(),
        (None, true) => python.to_owned(),
        (None, false) => source_tree(env, cfg, "unpack", cfg.startup_files, cfg.startup_bytes)?.0,
    })
}

fn columns() -> Vec<Column> {
    let mut columns = vec![Column {
        key: "unpack",
        label: "unpack",
        unit: Unit::Seconds,
    }];
    columns.extend(crate::startup::run_columns());
    columns
}

/// One row to measure: how its layer is unpacked and, for an image, how
/// it is mounted.
struct Plan {
    way: Way,
    how: Option<How>,
    row: Row,
}

/// The kernel mounts each uncompressed image is started from.
fn mounts() -> [(&'static str, How); 3] {
    [
        (
            "buffered",
            How::KernelFile {
                fstype: "erofs",
                opts: String::new(),
            },
        ),
        (
            "directio",
            How::KernelFile {
                fstype: "erofs",
                opts: "directio".into(),
            },
        ),
        ("loop", How::KernelLoop { fstype: "erofs" }),
    ]
}

/// The rows in their order: each builder on each mount, `tar x`, then the
/// compressed pairs. A row that cannot run here carries why in its note.
fn plans(env: &BenchEnv, mkfs: Option<&Path>) -> Vec<Plan> {
    let mounts = mounts();
    let mut plans: Vec<Plan> = Vec::new();
    for (way, name) in [
        (Way::Foliofs, "foliofs mkfs erofs"),
        (Way::MkfsErofs, "mkfs.erofs --tar=f"),
    ] {
        for (m, how) in &mounts {
            let mut row = Row::new(
                format!("{name}, kernel erofs {m}"),
                if way == Way::Foliofs {
                    "foliofs"
                } else {
                    "kernel"
                },
            );
            if way == Way::MkfsErofs && mkfs.is_none() {
                row.note = Some("needs a mkfs.erofs with --tar (erofs-utils 1.6 or later; Debian's 1.5 has none): --mkfs-erofs PATH".into());
            } else if !env.root {
                row.note = Some("the kernel's EROFS mounts need root".into());
            }
            plans.push(Plan {
                way,
                how: Some(how.clone()),
                row,
            });
        }
    }
    plans.push(Plan {
        way: Way::TarX,
        how: None,
        row: Row::new("tar x into a directory (overlayfs snapshotter)", "baseline"),
    });
    // Compressed rows, one mount each: the build is what they compare.
    for alg in ALGS {
        for way in [Way::FoliofsZ(alg), Way::MkfsErofsZ(alg)] {
            let (name, group) = match way {
                Way::FoliofsZ(_) => ("foliofs mkfs erofs", "foliofs"),
                _ => ("mkfs.erofs --tar=f", "kernel"),
            };
            let mut row = Row::new(format!("{name} -z{alg}, kernel erofs buffered"), group);
            let lacks = mkfs.and_then(|m| {
                crate::mkfs::MkfsErofs::probe(m).lacks(alg.split(',').next().unwrap_or(alg))
            });
            if matches!(way, Way::MkfsErofsZ(_)) && mkfs.is_none() {
                row.note = Some("needs a mkfs.erofs with --tar: --mkfs-erofs PATH".into());
            } else if let (Way::MkfsErofsZ(_), Some(why)) = (way, lacks) {
                row.note = Some(why);
            } else if !env.root {
                row.note = Some("the kernel's EROFS mounts need root".into());
            }
            plans.push(Plan {
                way,
                how: Some(mounts[0].1.clone()),
                row,
            });
        }
    }
    plans
}

/// What the builders left besides their times, indexed by [`Way::slot`].
struct Built {
    /// Each builder's peak RSS in KiB, the highest over the rounds.
    peak: [Option<u64>; 3 + 2 * ALGS.len()],
    /// Each image's size in bytes, from its last round.
    sizes: [Option<u64>; 3 + 2 * ALGS.len()],
}

/// The scratch paths every row reuses, and the layer they unpack.
struct Paths<'a> {
    layer: &'a Path,
    img: PathBuf,
    dir: PathBuf,
    rss: PathBuf,
}

/// Every runnable row once per round, interleaved, each from a clean
/// slate; a row that fails keeps why in its note and runs no more.
fn run_rounds(
    env: &BenchEnv,
    cfg: &Config,
    layer: &Path,
    mkfs: Option<&Path>,
    plans: &mut [Plan],
) -> Built {
    let paths = Paths {
        layer,
        img: env.dir.join("unpacked.erofs"),
        dir: env.dir.join("unpacked"),
        rss: env.dir.join("rss"),
    };
    let gnu_time = have("/usr/bin/time").then(|| PathBuf::from("/usr/bin/time"));
    let mut built = Built {
        peak: [None; 3 + 2 * ALGS.len()],
        sizes: [None; 3 + 2 * ALGS.len()],
    };
    crate::rows::interleaved(
        cfg,
        "unpack",
        plans,
        |p| &mut p.row,
        |plan| {
            let _ = std::fs::remove_file(&paths.img);
            let _ = std::fs::remove_dir_all(&paths.dir);
            let _ = std::fs::remove_file(&paths.rss);
            let timer = gnu_time.as_ref().map_or(String::new(), |t| {
                format!("{} -f %M -o \"$RSS\" ", t.display())
            });
            let script = script(plan.way, &timer);
            let (u, f, n) = unpack_and_read(env, &paths, mkfs, plan, &script, &mut built)?;
            Ok(vec![("unpack", u), ("first", f), ("next", n)])
        },
    );
    let _ = std::fs::remove_file(&paths.img);
    let _ = std::fs::remove_dir_all(&paths.dir);
    built
}

/// The shell line that unpacks the layer `way`'s way, behind `timer`.
fn script(way: Way, timer: &str) -> String {
    match way {
        Way::Foliofs => format!("exec {timer}\"$EXE\" mkfs erofs -q --tar=f --aufs -Enoinline_data -b4096 -U {UUID} - \"$IMG\" < \"$LAYER\""),
        Way::MkfsErofs => format!("gzip -dc < \"$LAYER\" | {timer}\"$MKFS\" --tar=f --aufs --quiet -Enoinline_data -b4096 -U {UUID} \"$IMG\""),
        Way::TarX => format!("mkdir \"$DIR\" && {timer}tar -xzf \"$LAYER\" -C \"$DIR\""),
        Way::FoliofsZ(alg) => format!("exec {timer}\"$EXE\" mkfs erofs -q --tar=f -z{alg} -b4096 -U {UUID} - \"$IMG\" < \"$LAYER\""),
        Way::MkfsErofsZ(alg) => format!("gzip -dc < \"$LAYER\" | {timer}\"$MKFS\" --tar=f --quiet -z{alg} -b4096 -U {UUID} \"$IMG\""),
    }
}

/// One row's round: the unpack's seconds, then every file read on a fresh
/// mount of the result (or the directory) twice.
fn unpack_and_read(
    env: &BenchEnv,
    paths: &Paths,
    mkfs: Option<&Path>,
    plan: &Plan,
    script: &str,
    built: &mut Built,
) -> Result<(f64, f64, f64)> {
    let mkfs_path = mkfs.map(Path::to_owned).unwrap_or_default();
    let unpack = timed_sh(
        script,
        &[
            ("EXE", &env.exe),
            ("IMG", &paths.img),
            ("LAYER", paths.layer),
            ("MKFS", &mkfs_path),
            ("DIR", &paths.dir),
            ("RSS", &paths.rss),
        ],
    )?;
    let k = plan.way.slot();
    built.peak[k] = built.peak[k].max(rss_kib(&paths.rss));
    if plan.way.is_image() {
        built.sizes[k] = std::fs::metadata(&paths.img).ok().map(|m| m.len());
    }
    let (first, next) = match &plan.how {
        Some(how) => {
            let m = Mounted::new(env, how, &paths.img, &env.fresh_dir("mnt")?)?;
            (time_read_tree(&m.dir)?, time_read_tree(&m.dir)?)
        }
        None => (time_read_tree(&paths.dir)?, time_read_tree(&paths.dir)?),
    };
    Ok((unpack, first, next))
}

/// mkfs.erofs's buffered row is the reference when it ran, else `tar x`;
/// each foliofs row pairs with mkfs.erofs's same row.
fn reference_and_pairs(rows: &[Row]) -> (usize, Vec<(usize, usize)>) {
    // `tar x` is the row after the builders' six, before the compressed
    // pairs.
    let reference = if rows[3].note.is_none() { 3 } else { 6 };
    let mut pairs: Vec<(usize, usize)> = (0..3)
        .filter(|&i| rows[i + 3].note.is_none())
        .map(|i| (i, i + 3))
        .collect();
    // The compressed rows pair each foliofs row with mkfs.erofs's after it.
    for i in (7..rows.len()).step_by(2) {
        if rows[i + 1].note.is_none() {
            pairs.push((i, i + 1));
        }
    }
    (reference, pairs)
}

fn notes(
    cfg: &Config,
    src: &Path,
    layer_size: u64,
    mkfs: Option<&Path>,
    built: &Built,
) -> Vec<String> {
    let Built { peak, sizes } = built;
    let kib = |v: Option<u64>| {
        v.map_or("not measured".to_owned(), |k| {
            format!("{:.1} MiB", k as f64 / 1024.0)
        })
    };
    let mb = |v: Option<u64>| v.map_or("none".to_owned(), |b| format!("{} bytes", b));
    vec![
        format!(
            "layer: tar --sort=name --format=pax | gzip of {} ({} bytes gzipped); each row unpacks it afresh into an uncompressed image with containerd's flags (--tar=f --aufs -Enoinline_data -b4096 -U UUID), foliofs reading the .tar.gz itself on stdin, mkfs.erofs{} behind `gzip -dc |` as containerd pipes it, or tar -xzf into a directory; no fsync by any; 1st run = every file read on a fresh mount of the result, later run = again on that mount; {} rounds, rows interleaved; ratios are to mkfs.erofs's buffered row",
            src.display(),
            layer_size,
            mkfs.map_or(String::new(), |m| format!(" ({})", crate::mkfs::MkfsErofs::probe(m).describe())),
            cfg.runs
        ),
        format!(
            "compressed rows (-zlz4, -zlz4hc, -zzstd,level=3; --tar=f -b4096 -U UUID, no --aufs, default pcluster, inline data allowed): image sizes {}; peak RSS {}; threads: foliofs its default --workers, mkfs.erofs its default --workers ({} CPUs here), both compressing on every CPU",
            ALGS.iter()
                .enumerate()
                .map(|(i, a)| format!("{a}: foliofs {}, mkfs.erofs {}", mb(sizes[3 + 2 * i]), mb(sizes[4 + 2 * i])))
                .collect::<Vec<_>>()
                .join("; "),
            ALGS.iter()
                .enumerate()
                .map(|(i, a)| format!("{a}: foliofs {}, mkfs.erofs {}", kib(peak[3 + 2 * i]), kib(peak[4 + 2 * i])))
                .collect::<Vec<_>>()
                .join("; "),
            std::thread::available_parallelism().map_or(1, |n| n.get())
        ),
        format!(
            "image sizes: foliofs {}, mkfs.erofs {}; peak RSS (GNU time, the builder alone): foliofs {}, mkfs.erofs {}, tar x {}; threads: foliofs 1 (reading, inflating and writing in one), mkfs.erofs its default --workers ({} CPUs here, idle without compression), tar 1 plus gzip",
            mb(sizes[0]),
            mb(sizes[1]),
            kib(peak[0]),
            kib(peak[1]),
            kib(peak[2]),
            std::thread::available_parallelism().map_or(1, |n| n.get())
        ),
    ]
}
