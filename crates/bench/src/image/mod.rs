//! Image: a container image of many layers, from an OCI image layout on
//! disk, made into a root file system and started from: the EROFS seed's
//! table (unpack, 1st run, later runs) for a whole image. foliofs builds
//! each layer into its store, merges them and mounts the result (as root
//! and as a user); the kernel mounts the same merged image; containerd's
//! EROFS path builds each layer with mkfs.erofs and stacks the kernel's
//! mounts of them under overlayfs; `umoci unpack` applies every layer
//! into a directory, as the overlayfs snapshotter ends up. A single-layer
//! image of the same flattened tree is the row a merged image is held
//! against. A second table ([`lookups`]) measures a lookup-heavy start
//! on the merged image and on the overlay stack.

pub(crate) mod layout;
pub(crate) mod lookups;
pub(crate) mod who;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result};

use crate::env::{have, run, BenchEnv};
use crate::mount::{How, Mounted};
use crate::report::{Column, Row, Section, Unit};
use crate::Config;

pub(crate) use who::Who;

/// Layers in the image: past the 10 the issue of stack depth starts at,
/// and as many as a package-a-layer build makes.
pub(crate) const LAYERS: usize = 20;

#[derive(Clone, Copy, PartialEq, Debug)]
enum Way {
    /// `foliofs mount oci:...` (store empty), by root or a user.
    Oci,
    /// `foliofs mkfs erofs --merge`, then the kernel's EROFS mount.
    MergeKernel,
    /// mkfs.erofs per layer, the kernel's EROFS mounts and overlayfs.
    MkfsOverlay,
    /// `umoci unpack` into a directory.
    Umoci,
    /// One image of the flattened tree, mounted by foliofs.
    Flat,
}

struct Plan {
    way: Way,
    who: Who,
    row: Row,
}

/// The scratch paths a round reuses.
struct Paths {
    store: PathBuf,
    img: PathBuf,
    layers: PathBuf,
    bundle: PathBuf,
}

/// Mounts taken down in the reverse of their order (an overlay before
/// its layers).
pub(crate) struct Stack(pub(crate) Vec<Mounted>);

impl Drop for Stack {
    fn drop(&mut self) {
        while let Some(m) = self.0.pop() {
            drop(m);
        }
    }
}

pub fn image(env: &BenchEnv, cfg: &Config) -> Result<Vec<Section>> {
    let made = layout::make(env, cfg, LAYERS)?;
    let user = Who::ordinary(env);
    let mkfs = cfg.mkfs_erofs.clone().filter(|m| crate::unpack::has_tar(m));
    let mut plans = plans(env, &user, mkfs.as_deref());
    run_rounds(env, cfg, &made, mkfs.as_deref(), &mut plans);
    let rows: Vec<Row> = plans.into_iter().map(|p| p.row).collect();
    let reference = if rows[3].note.is_none() { 3 } else { 2 };
    let pairs = [(2, 3), (0, 3), (0, 5), (1, 0)]
        .into_iter()
        .filter(|&(a, b)| a != b && rows[a].note.is_none() && rows[b].note.is_none())
        .collect();
    let notes = notes(cfg, &made, &user, mkfs.as_deref());
    let start = Section {
        name: "image",
        title: format!(
            "image: an OCI image of {LAYERS} layers made into a root file system (unpack), then started from"
        ),
        columns: columns(),
        rows,
        reference,
        pairs,
        notes,
    };
    let lookups = lookups::lookups(env, cfg, &made, &user)?;
    Ok(vec![start, lookups])
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

/// The rows in their order; one that cannot run here says why.
fn plans(env: &BenchEnv, user: &Result<Who, String>, mkfs: Option<&Path>) -> Vec<Plan> {
    let plan = |way, who: Who, label: &str, kind| Plan {
        way,
        who,
        row: Row::new(label, kind),
    };
    let mut plans = vec![
        plan(
            Way::Oci,
            Who::Me,
            "foliofs mount oci: (layers built, merged, mounted), root",
            "foliofs",
        ),
        plan(
            Way::Oci,
            user.clone().unwrap_or(Who::Me),
            "foliofs mount oci:, as a user",
            "foliofs",
        ),
        plan(
            Way::MergeKernel,
            Who::Me,
            "foliofs mkfs erofs --merge, kernel erofs -o device=",
            "kernel",
        ),
        plan(
            Way::MkfsOverlay,
            Who::Me,
            "mkfs.erofs --tar=f per layer, kernel overlayfs over kernel erofs",
            "kernel",
        ),
        plan(
            Way::Umoci,
            Who::Me,
            "umoci unpack into a directory (overlayfs snapshotter)",
            "baseline",
        ),
        plan(
            Way::Flat,
            Who::Me,
            "one image of the flattened tree, foliofs mount",
            "foliofs",
        ),
    ];
    for p in &mut plans {
        p.row.note = match p.way {
            Way::Oci if p.row.label.ends_with("root") && !env.root => {
                Some("needs root: the user row is this one's".into())
            }
            Way::Oci if p.row.label.ends_with("user") => user.as_ref().err().cloned(),
            Way::MergeKernel | Way::MkfsOverlay if !env.root => {
                Some("needs root: mounting the kernel's erofs".into())
            }
            Way::MkfsOverlay if mkfs.is_none() => Some(
                "needs a mkfs.erofs with --tar (erofs-utils 1.6 or later; Debian's 1.5 has none): --mkfs-erofs PATH"
                    .into(),
            ),
            Way::Umoci if !have("umoci") => Some("umoci is not installed".into()),
            _ => None,
        };
    }
    plans
}

/// Every runnable row once per round, interleaved, each from an empty
/// store and no image.
fn run_rounds(
    env: &BenchEnv,
    cfg: &Config,
    made: &layout::Made,
    mkfs: Option<&Path>,
    plans: &mut [Plan],
) {
    crate::rows::interleaved(
        cfg,
        "image",
        plans,
        |p| &mut p.row,
        |plan| {
            let (u, f, n) = round_of(env, made, mkfs, plan)?;
            Ok(vec![("unpack", u), ("first", f), ("next", n)])
        },
    );
}

/// One row's round: the unpack's seconds, then every file read on what
/// it made, twice.
fn round_of(
    env: &BenchEnv,
    made: &layout::Made,
    mkfs: Option<&Path>,
    plan: &Plan,
) -> Result<(f64, f64, f64)> {
    let base = env.fresh_dir("image-round")?;
    let paths = Paths {
        store: base.join("store"),
        img: base.join("image.erofs"),
        layers: base.join("layers"),
        bundle: base.join("bundle"),
    };
    std::fs::create_dir(&paths.store)?;
    plan.who.own(&paths.store)?;
    let mnt = env.fresh_dir("mnt")?;
    plan.who.own(&mnt)?;
    let start = Instant::now();
    let (mounts, dir) = unpack(env, made, mkfs, plan, &paths, &mnt)?;
    let unpack = start.elapsed().as_secs_f64();
    let first = who::read_tree(env, &plan.who, &dir)?;
    let next = who::read_tree(env, &plan.who, &dir)?;
    drop(mounts);
    std::fs::remove_dir_all(&base)?;
    Ok((unpack, first, next))
}

/// Makes `plan`'s root file system: the mounts to hold and the directory
/// to start from.
fn unpack(
    env: &BenchEnv,
    made: &layout::Made,
    mkfs: Option<&Path>,
    plan: &Plan,
    p: &Paths,
    mnt: &Path,
) -> Result<(Stack, PathBuf)> {
    let mut stack = Stack(Vec::new());
    match plan.way {
        Way::Oci => {
            let how = How::Image {
                store: p.store.clone(),
                who: plan.who.clone(),
                extra: Vec::new(),
            };
            stack
                .0
                .push(Mounted::new(env, &how, Path::new(&made.reference), mnt)?);
        }
        Way::MergeKernel => {
            run(Command::new(&env.exe)
                .env("FOLIOFS_STORE", &p.store)
                .args(["mkfs", "erofs", "-q", "--merge", &made.reference])
                .arg(&p.img))?;
            let devices = store_layers(&p.store, made);
            stack.0.push(Mounted::new(
                env,
                &How::KernelFile {
                    fstype: "erofs",
                    opts: device_opts(&devices),
                },
                &p.img,
                mnt,
            )?);
        }
        Way::MkfsOverlay => {
            let mkfs = mkfs.context("no mkfs.erofs")?;
            mkfs_overlay(env, mkfs, &made.blobs, &p.layers, mnt, &mut stack)?;
        }
        Way::Umoci => {
            let mut c = Command::new("umoci");
            c.arg("unpack");
            if !env.root {
                c.arg("--rootless");
            }
            run(c
                .arg("--image")
                .arg(format!("{}:{}", made.layout.display(), layout::TAG))
                .arg(&p.bundle))?;
            return Ok((stack, p.bundle.join("rootfs")));
        }
        Way::Flat => {
            layout::build_flat(env, made, &p.img)?;
            let how = How::Foliofs {
                fstype: "erofs",
                opts: String::new(),
            };
            stack.0.push(Mounted::new(env, &how, &p.img, mnt)?);
        }
    }
    Ok((stack, mnt.to_owned()))
}

/// containerd's EROFS snapshotter's way: each gzipped layer `blobs`
/// (lowest first) built by mkfs.erofs into `dir` with its differ's flags,
/// each image mounted by the kernel, and overlayfs over them at `mnt`;
/// the mounts go on `stack`.
pub(crate) fn mkfs_overlay(
    env: &BenchEnv,
    mkfs: &Path,
    blobs: &[PathBuf],
    dir: &Path,
    mnt: &Path,
    stack: &mut Stack,
) -> Result<()> {
    std::fs::create_dir(dir)?;
    let mut lower = Vec::new();
    for (i, blob) in blobs.iter().enumerate() {
        let img = dir.join(format!("{i}.erofs"));
        let uuid = format!("6f1a2b3c-4d5e-8f60-9a1b-{:012x}", i + 1);
        run(Command::new("sh")
            .args([
                "-c",
                "gzip -dc < \"$1\" | \"$2\" --tar=f --aufs --quiet -Enoinline_data -b4096 -U \"$3\" \"$4\"",
                "sh",
            ])
            .arg(blob)
            .arg(mkfs)
            .arg(&uuid)
            .arg(&img))?;
        let at = dir.join(format!("{i}.mnt"));
        let how = How::KernelFile {
            fstype: "erofs",
            opts: String::new(),
        };
        stack.0.push(Mounted::new(env, &how, &img, &at)?);
        lower.push(at);
    }
    stack.0.push(overlay(env, &lower, mnt)?);
    Ok(())
}

/// The kernel's overlayfs of `lower` (lowest first) at `mnt`, stacked as
/// containerd stacks a snapshot's parents: the top layer first.
pub(crate) fn overlay(env: &BenchEnv, lower: &[PathBuf], mnt: &Path) -> Result<Mounted> {
    let dirs: Vec<String> = lower
        .iter()
        .rev()
        .map(|d| d.display().to_string())
        .collect();
    let how = How::KernelMem {
        fstype: "overlay",
        opts: format!("lowerdir={}", dirs.join(":")),
    };
    Mounted::new(env, &how, Path::new("overlay"), mnt)
}

/// The store's layer images of `made`, lowest first.
fn store_layers(store: &Path, made: &layout::Made) -> Vec<PathBuf> {
    made.diff_ids
        .iter()
        .map(|d| store.join(format!("layer-{d}.erofs")))
        .collect()
}

fn device_opts(devices: &[PathBuf]) -> String {
    devices
        .iter()
        .map(|d| format!("device={}", d.display()))
        .collect::<Vec<_>>()
        .join(",")
}

fn notes(
    cfg: &Config,
    made: &layout::Made,
    user: &Result<Who, String>,
    mkfs: Option<&Path>,
) -> Vec<String> {
    vec![
        format!(
            "image: an OCI layout of {LAYERS} gzipped layers ({} bytes): the machine's Python under usr/ ({}), then the start-up tree dealt out a file per layer in turn, each layer also adding to the library's directory, rewriting etc/generation and deleting a file the one below added; flattened, {} files, {} MB",
            made.blob_bytes,
            if made.python.is_some() { "interpreter and standard library" } else { "none on this machine" },
            made.files,
            made.bytes / 1_000_000
        ),
        format!(
            "unpack = from the layout on disk to a root file system, each row from an empty store: foliofs's rows build each layer as its store does ({}, on one core) and merge them by reference; mkfs.erofs{} gets each layer behind `gzip -dc |` with containerd's flags (--tar=f --aufs -Enoinline_data -b4096 -U UUID), and the row then mounts each image (file-backed) and overlayfs over them; 1st run = every file read on the fresh result, later run = again; {} rounds, rows interleaved; ratios are to the overlay row",
            layout::LAYER_FLAGS[3..].join(" "),
            mkfs.map_or(String::new(), |m| format!(" ({})", crate::mkfs::MkfsErofs::probe(m).describe())),
            cfg.runs
        ),
        match user {
            Ok(w) => format!("the user row mounts and reads as {}, with its own store; every row reads with the bench's reader as a process of its own", w.describe()),
            Err(why) => format!("no user row: {why}"),
        },
    ]
}
