//! `foliofs bench registry`: the image section's image, pushed into a
//! registry of this run's own (Debian's docker-registry on loopback), and
//! pulled to a root file system each way, each row from an empty store
//! and page cache: `foliofs mount docker://` (pulled, each layer built as
//! it streams in, merged, mounted) as root and as a user; `skopeo copy`
//! and mkfs.erofs per layer under the kernel's overlayfs (containerd's
//! EROFS snapshotter); `skopeo copy` and `umoci unpack` (the overlayfs
//! snapshotter). Then the time to the first byte of the container's
//! first file, the 1st run and a later run.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use foliofs_testkit::registry::{Options, Registry};

use crate::env::{have, run, BenchEnv};
use crate::image::layout::{self, Made};
use crate::image::who::{first_byte, read_tree, Who};
use crate::image::{mkfs_overlay, Stack, LAYERS};
use crate::mount::{How, Mounted};
use crate::report::{Column, Row, Section, Unit};
use crate::rows::progress;
use crate::Config;

/// Where the image is in the registry.
const REPO: &str = "bench/image";

#[derive(Clone, Copy, PartialEq)]
enum Way {
    /// `foliofs mount docker://...`, from an empty store.
    Foliofs,
    /// `skopeo copy` to a layout, mkfs.erofs per layer, overlayfs.
    SkopeoMkfs,
    /// `skopeo copy` to a layout, `umoci unpack`.
    SkopeoUmoci,
}

struct Plan {
    way: Way,
    who: Who,
    row: Row,
}

pub fn registry(env: &BenchEnv, cfg: &Config) -> Result<Section> {
    let mkfs = cfg.mkfs_erofs.clone().filter(|m| crate::unpack::has_tar(m));
    let user = Who::ordinary(env);
    let mut plans = plans(env, &user, mkfs.as_deref());
    let mut section = Section {
        name: "registry",
        title: format!(
            "registry: an OCI image of {LAYERS} layers pulled from a registry on loopback to a root file system, then started from"
        ),
        columns: columns(),
        rows: Vec::new(),
        reference: 2,
        pairs: Vec::new(),
        notes: Vec::new(),
    };
    if let Some(why) = missing() {
        eprintln!("skip: bench registry: needs {why}");
        for p in &mut plans {
            p.row.note = Some(why.to_owned());
        }
        section.rows = plans.into_iter().map(|p| p.row).collect();
        return Ok(section);
    }
    let made = layout::make(env, cfg, LAYERS)?;
    progress(cfg, "[registry] starting a registry and pushing the image");
    let server = Registry::start(&Options {
        auth: String::new(),
        parent: Some(env.dir.clone()),
    })
    .context("starting docker-registry")?;
    let reference = format!("docker://{}/{REPO}:{}", server.host(), layout::TAG);
    run(Command::new("skopeo")
        .args(["copy", "--quiet", "--dest-tls-verify=false"])
        .arg(format!("oci:{}:{}", made.layout.display(), layout::TAG))
        .arg(&reference))?;
    crate::rows::interleaved(
        cfg,
        "registry",
        &mut plans,
        |p| &mut p.row,
        |plan| round_of(env, &made, &reference, mkfs.as_deref(), plan),
    );
    drop(server);
    let rows: Vec<Row> = plans.into_iter().map(|p| p.row).collect();
    section.reference = if rows[2].note.is_none() { 2 } else { 3 };
    section.pairs = [(0, 2), (0, 3), (1, 0)]
        .into_iter()
        .filter(|&(a, b)| a != section.reference || b != section.reference)
        .filter(|&(a, b)| rows[a].note.is_none() && rows[b].note.is_none())
        .collect();
    section.notes = notes(env, cfg, &made, &user, mkfs.as_deref());
    section.rows = rows;
    Ok(section)
}

fn columns() -> Vec<Column> {
    let col = |key, label| Column {
        key,
        label,
        unit: Unit::Seconds,
    };
    vec![
        col("pull", "pull"),
        col("byte", "first byte"),
        col("first", "1st run"),
        col("next", "later run"),
        col("total", "pull + 1st run"),
    ]
}

/// What this host lacks to run the section, if anything.
fn missing() -> Option<&'static str> {
    if !have("docker-registry") {
        Some("docker-registry is not installed (Debian: docker-registry)")
    } else if !have("skopeo") {
        Some("skopeo is not installed")
    } else if !Path::new("/dev/fuse").exists() {
        Some("/dev/fuse is missing")
    } else {
        None
    }
}

fn plans(env: &BenchEnv, user: &Result<Who, String>, mkfs: Option<&Path>) -> Vec<Plan> {
    let mut plans = vec![
        Plan {
            way: Way::Foliofs,
            who: Who::Me,
            row: Row::new(
                "foliofs mount docker:// (pulled, built, merged, mounted), root",
                "foliofs",
            ),
        },
        Plan {
            way: Way::Foliofs,
            who: user.clone().unwrap_or(Who::Me),
            row: Row::new("foliofs mount docker://, as a user", "foliofs"),
        },
        Plan {
            way: Way::SkopeoMkfs,
            who: Who::Me,
            row: Row::new(
                "skopeo copy, mkfs.erofs --tar=f per layer, kernel overlayfs over kernel erofs",
                "kernel",
            ),
        },
        Plan {
            way: Way::SkopeoUmoci,
            who: Who::Me,
            row: Row::new(
                "skopeo copy, umoci unpack into a directory (overlayfs snapshotter)",
                "baseline",
            ),
        },
    ];
    plans[0].row.note = (!env.root).then(|| "needs root: the user row is this one's".into());
    plans[1].row.note = user.as_ref().err().cloned();
    plans[2].row.note = if !env.root {
        Some("needs root: mounting the kernel's erofs".into())
    } else if mkfs.is_none() {
        Some("needs a mkfs.erofs with --tar (erofs-utils 1.6 or later; Debian's 1.5 has none): --mkfs-erofs PATH".into())
    } else {
        None
    };
    if !have("umoci") {
        plans[3].row.note = Some("umoci is not installed".into());
    }
    plans
}

/// One row's round, from an empty store and (as root) page cache.
fn round_of(
    env: &BenchEnv,
    made: &Made,
    reference: &str,
    mkfs: Option<&Path>,
    plan: &Plan,
) -> Result<Vec<(&'static str, f64)>> {
    let base = env.fresh_dir("registry-round")?;
    let store = base.join("store");
    std::fs::create_dir(&store)?;
    plan.who.own(&store)?;
    let mnt = env.fresh_dir("mnt")?;
    plan.who.own(&mnt)?;
    env.drop_caches();
    let start = Instant::now();
    let (stack, dir) = pull(env, made, reference, mkfs, plan, &base, &store, &mnt)?;
    let pulled = start.elapsed().as_secs_f64();
    let byte = first_byte(env, &plan.who, &dir)?;
    let first = read_tree(env, &plan.who, &dir)?;
    let next = read_tree(env, &plan.who, &dir)?;
    drop(stack);
    std::fs::remove_dir_all(&base)?;
    Ok(vec![
        ("pull", pulled),
        ("byte", pulled + byte),
        ("first", first),
        ("next", next),
        ("total", pulled + first),
    ])
}

/// `plan`'s root file system from the registry: the mounts to hold and
/// the directory to start from.
#[allow(clippy::too_many_arguments)]
fn pull(
    env: &BenchEnv,
    made: &Made,
    reference: &str,
    mkfs: Option<&Path>,
    plan: &Plan,
    base: &Path,
    store: &Path,
    mnt: &Path,
) -> Result<(Stack, PathBuf)> {
    let mut stack = Stack(Vec::new());
    let copied = base.join("layout");
    let skopeo = || {
        run(Command::new("skopeo")
            .args(["copy", "--quiet", "--src-tls-verify=false"])
            .arg(reference)
            .arg(format!("oci:{}:{}", copied.display(), layout::TAG)))
    };
    match plan.way {
        Way::Foliofs => {
            let how = How::Image {
                store: store.to_owned(),
                who: plan.who.clone(),
                extra: vec!["--tls-verify=false".into()],
            };
            stack
                .0
                .push(Mounted::new(env, &how, Path::new(reference), mnt)?);
        }
        Way::SkopeoMkfs => {
            skopeo()?;
            // skopeo keeps each blob as the registry has it, under its
            // digest: the layout's own layers, lowest first.
            let blobs: Vec<PathBuf> = made
                .blobs
                .iter()
                .map(|b| {
                    copied
                        .join("blobs/sha256")
                        .join(b.file_name().unwrap_or_default())
                })
                .collect();
            if let Some(b) = blobs.iter().find(|b| !b.is_file()) {
                bail!("skopeo copy left no blob {}", b.display());
            }
            let mkfs = mkfs.context("no mkfs.erofs")?;
            mkfs_overlay(env, mkfs, &blobs, &base.join("layers"), mnt, &mut stack)?;
        }
        Way::SkopeoUmoci => {
            skopeo()?;
            let bundle = base.join("bundle");
            let mut c = Command::new("umoci");
            c.arg("unpack");
            if !env.root {
                c.arg("--rootless");
            }
            run(c
                .arg("--image")
                .arg(format!("{}:{}", copied.display(), layout::TAG))
                .arg(&bundle))?;
            return Ok((stack, bundle.join("rootfs")));
        }
    }
    Ok((stack, mnt.to_owned()))
}

fn notes(
    env: &BenchEnv,
    cfg: &Config,
    made: &Made,
    user: &Result<Who, String>,
    mkfs: Option<&Path>,
) -> Vec<String> {
    vec![
        format!(
            "the image section's image ({LAYERS} gzipped layers, {} bytes; flattened, {} files, {} MB) pushed with skopeo into docker-registry on 127.0.0.1 (plain HTTP; --tls-verify=false, --src-tls-verify=false); each row from an empty store{}; pull = from the registry to a root file system: foliofs builds each layer as its blob streams in and merges them; skopeo copies the blobs into an OCI layout, then mkfs.erofs{} per layer behind `gzip -dc |` with containerd's flags, mounted and stacked under overlayfs, or umoci unpack; first byte = pull, then the first byte of the first file a walk meets; 1st run = every file read, later run = again; {} rounds, rows interleaved; ratios are to the mkfs.erofs row",
            made.blob_bytes,
            made.files,
            made.bytes / 1_000_000,
            if env.root { " and page cache (dropped before each)" } else { " (the page cache is not dropped: not root)" },
            mkfs.map_or(String::new(), |m| format!(" ({})", crate::mkfs::MkfsErofs::probe(m).describe())),
            cfg.runs
        ),
        match user {
            Ok(w) => format!("the user row mounts and reads as {}, with its own store", w.describe()),
            Err(why) => format!("no user row: {why}"),
        },
        "no lazy row yet: a native EROFS image in the registry is not mounted lazily by this build".into(),
    ]
}
