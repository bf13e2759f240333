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
fn has_tar(mkfs: &Path) -> bool {
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
    let python = Path::new("/usr/lib/python3.11");
    let src: PathBuf = match (&cfg.tree, python.is_dir() && !cfg.quick) {
        (Some(t), _) => t.clone(),
        (None, true) => python.to_owned(),
        (None, false) => source_tree(env, cfg, "unpack", cfg.startup_files, cfg.startup_bytes)?.0,
    };
    progress(cfg, "[unpack] making the layer");
    let layer = env.dir.join("layer.tar.gz");
    timed_sh(
        "tar --sort=name --format=pax -C \"$SRC\" -cf - . | gzip > \"$LAYER\"",
        &[("SRC", &src), ("LAYER", &layer)],
    )?;
    let layer_size = std::fs::metadata(&layer)?.len();
    let gnu_time = have("/usr/bin/time").then(|| PathBuf::from("/usr/bin/time"));
    let mkfs = cfg.mkfs_erofs.clone().filter(|m| has_tar(m));
    let mut columns = vec![Column {
        key: "unpack",
        label: "unpack",
        unit: Unit::Seconds,
    }];
    columns.extend(crate::startup::run_columns());
    let mounts: [(&str, How); 3] = [
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
    ];
    let mut plans: Vec<(Way, Option<How>, Row)> = Vec::new();
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
            plans.push((way, Some(how.clone()), row));
        }
    }
    plans.push((
        Way::TarX,
        None,
        Row::new("tar x into a directory (overlayfs snapshotter)", "baseline"),
    ));
    // Compressed rows, one mount each: the build is what they compare.
    for alg in ALGS {
        for way in [Way::FoliofsZ(alg), Way::MkfsErofsZ(alg)] {
            let (name, group) = match way {
                Way::FoliofsZ(_) => ("foliofs mkfs erofs", "foliofs"),
                _ => ("mkfs.erofs --tar=f", "kernel"),
            };
            let mut row = Row::new(format!("{name} -z{alg}, kernel erofs buffered"), group);
            let lacks = mkfs.as_ref().and_then(|m| {
                crate::mkfs::MkfsErofs::probe(m).lacks(alg.split(',').next().unwrap_or(alg))
            });
            if matches!(way, Way::MkfsErofsZ(_)) && mkfs.is_none() {
                row.note = Some("needs a mkfs.erofs with --tar: --mkfs-erofs PATH".into());
            } else if let (Way::MkfsErofsZ(_), Some(why)) = (way, lacks) {
                row.note = Some(why);
            } else if !env.root {
                row.note = Some("the kernel's EROFS mounts need root".into());
            }
            plans.push((way, Some(mounts[0].1.clone()), row));
        }
    }
    let img = env.dir.join("unpacked.erofs");
    let dir = env.dir.join("unpacked");
    let rss = env.dir.join("rss");
    let mut peak: [Option<u64>; 3 + 2 * ALGS.len()] = [None; 3 + 2 * ALGS.len()];
    let mut sizes: [Option<u64>; 3 + 2 * ALGS.len()] = [None; 3 + 2 * ALGS.len()];
    for round in 0..cfg.runs {
        for (way, how, row) in plans.iter_mut() {
            if row.note.is_some() {
                continue;
            }
            progress(
                cfg,
                &format!("[unpack] round {}/{}: {}", round + 1, cfg.runs, row.label),
            );
            let _ = std::fs::remove_file(&img);
            let _ = std::fs::remove_dir_all(&dir);
            let _ = std::fs::remove_file(&rss);
            let timer = gnu_time.as_ref().map_or(String::new(), |t| {
                format!("{} -f %M -o \"$RSS\" ", t.display())
            });
            let script = match way {
                Way::Foliofs => format!("exec {timer}\"$EXE\" mkfs erofs -q --tar=f --aufs -Enoinline_data -b4096 -U {UUID} - \"$IMG\" < \"$LAYER\""),
                Way::MkfsErofs => format!("gzip -dc < \"$LAYER\" | {timer}\"$MKFS\" --tar=f --aufs --quiet -Enoinline_data -b4096 -U {UUID} \"$IMG\""),
                Way::TarX => format!("mkdir \"$DIR\" && {timer}tar -xzf \"$LAYER\" -C \"$DIR\""),
                Way::FoliofsZ(alg) => format!("exec {timer}\"$EXE\" mkfs erofs -q --tar=f -z{alg} -b4096 -U {UUID} - \"$IMG\" < \"$LAYER\""),
                Way::MkfsErofsZ(alg) => format!("gzip -dc < \"$LAYER\" | {timer}\"$MKFS\" --tar=f --quiet -z{alg} -b4096 -U {UUID} \"$IMG\""),
            };
            let mkfs_path = mkfs.clone().unwrap_or_default();
            let res = timed_sh(
                &script,
                &[
                    ("EXE", &env.exe),
                    ("IMG", &img),
                    ("LAYER", &layer),
                    ("MKFS", &mkfs_path),
                    ("DIR", &dir),
                    ("RSS", &rss),
                ],
            )
            .and_then(|unpack| {
                let k = way.slot();
                peak[k] = peak[k].max(rss_kib(&rss));
                if way.is_image() {
                    sizes[k] = std::fs::metadata(&img).ok().map(|m| m.len());
                }
                let (first, next) = match how {
                    Some(how) => {
                        let m = Mounted::new(env, how, &img, &env.fresh_dir("mnt")?)?;
                        (time_read_tree(&m.dir)?, time_read_tree(&m.dir)?)
                    }
                    None => (time_read_tree(&dir)?, time_read_tree(&dir)?),
                };
                Ok((unpack, first, next))
            });
            match res {
                Ok((u, f, n)) => {
                    for (k, v) in [("unpack", u), ("first", f), ("next", n)] {
                        row.runs.entry(k).or_default().push(v);
                    }
                }
                Err(e) => {
                    row.note = Some(format!("failed: {e:#}"));
                    row.failed = true;
                }
            }
        }
    }
    let _ = std::fs::remove_file(&img);
    let _ = std::fs::remove_dir_all(&dir);
    let rows: Vec<Row> = plans.into_iter().map(|p| p.2).collect();
    let reference = if rows[3].note.is_none() {
        3
    } else {
        rows.len() - 1
    };
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
    let kib = |v: Option<u64>| {
        v.map_or("not measured".to_owned(), |k| {
            format!("{:.1} MiB", k as f64 / 1024.0)
        })
    };
    let mb = |v: Option<u64>| v.map_or("none".to_owned(), |b| format!("{} bytes", b));
    let notes = vec![
        format!(
            "layer: tar --sort=name --format=pax | gzip of {} ({} bytes gzipped); each row unpacks it afresh into an uncompressed image with containerd's flags (--tar=f --aufs -Enoinline_data -b4096 -U UUID), foliofs reading the .tar.gz itself on stdin, mkfs.erofs{} behind `gzip -dc |` as containerd pipes it, or tar -xzf into a directory; no fsync by any; 1st run = every file read on a fresh mount of the result, later run = again on that mount; {} rounds, rows interleaved; ratios are to mkfs.erofs's buffered row",
            src.display(),
            layer_size,
            mkfs.as_ref().map_or(String::new(), |m| format!(" ({})", crate::mkfs::MkfsErofs::probe(m).describe())),
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
    ];
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
