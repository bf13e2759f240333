//! `foliofs bench registry`: the image section's image, pushed into a
//! registry of this run's own (Debian's docker-registry on loopback), and
//! pulled to a root file system each way, each row from an empty store
//! and page cache: `foliofs mount docker://` (pulled, each layer built as
//! it streams in, merged, mounted) as root and as a user; `skopeo copy`
//! and mkfs.erofs per layer under the kernel's overlayfs (containerd's
//! EROFS snapshotter); `skopeo copy` and `umoci unpack` (the overlayfs
//! snapshotter); and `foliofs mount docker://` of the same image pushed
//! by `foliofs push` as native EROFS layers (with dm-verity), read lazily.
//! Then the time to the first byte of the container's first file, the
//! 1st run and a later run; and for the lazy rows, the bytes fetched
//! for what the 1st run read.

use std::cell::Cell;
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
use crate::timing::time_cmd;
use crate::Config;

/// Where the image is in the registry.
const REPO: &str = "bench/image";
/// Where its native EROFS image is.
const NATIVE_REPO: &str = "bench/native";

#[derive(Clone, Copy, PartialEq)]
enum Way {
    /// `foliofs mount docker://...`, from an empty store.
    Foliofs,
    /// `skopeo copy` to a layout, mkfs.erofs per layer, overlayfs.
    SkopeoMkfs,
    /// `skopeo copy` to a layout, `umoci unpack`.
    SkopeoUmoci,
    /// `foliofs mount docker://...` of the native EROFS image, lazy, from
    /// an empty store and disk cache.
    Lazy,
}

/// What a lazy row fetched and read (see [`Plan::traffic`]).
#[derive(Clone, Copy, Default)]
struct Traffic {
    mount: u64,
    start_fetched: u64,
    start_read: u64,
    start_requests: u64,
    run_fetched: u64,
    run_read: u64,
}

struct Plan {
    way: Way,
    who: Who,
    row: Row,
    /// Lazy rows, summed over rounds: bytes fetched by the mount, by the
    /// start-up and read by it, fetched by the end of the 1st run and read
    /// by it.
    traffic: Cell<Traffic>,
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
        columns: columns(false),
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
    section.columns = columns(made.python.is_some());
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
    let native = format!("docker://{}/{NATIVE_REPO}:{}", server.host(), layout::TAG);
    let pushed = env.fresh_dir("registry-push")?;
    run(Command::new(&env.exe)
        .env("FOLIOFS_STORE", &pushed)
        .args(["push", "--tls-verify=false", "--dm-verity"])
        .arg(format!("oci:{}:{}", made.layout.display(), layout::TAG))
        .arg(&native))?;
    std::fs::remove_dir_all(&pushed)?;
    crate::rows::interleaved(
        cfg,
        "registry",
        &mut plans,
        |p| &mut p.row,
        |plan| {
            let from = if plan.way == Way::Lazy {
                &native
            } else {
                &reference
            };
            round_of(env, &made, from, mkfs.as_deref(), plan)
        },
    );
    let rtt = round_trip(&server.host(), &made);
    drop(server);
    let plans_traffic: Vec<(String, Traffic)> = plans
        .iter()
        .filter(|p| p.way == Way::Lazy && p.row.note.is_none())
        .map(|p| (p.row.label.clone(), p.traffic.get()))
        .collect();
    let rows: Vec<Row> = plans.into_iter().map(|p| p.row).collect();
    section.reference = if rows[2].note.is_none() { 2 } else { 3 };
    section.pairs = [(0, 2), (0, 3), (1, 0), (4, 2), (4, 3), (5, 4)]
        .into_iter()
        .filter(|&(a, b)| a != section.reference || b != section.reference)
        .filter(|&(a, b)| rows[a].note.is_none() && rows[b].note.is_none())
        .collect();
    section.notes = notes(env, cfg, &made, &user, mkfs.as_deref());
    section.notes.extend(traffic_note(&plans_traffic, cfg));
    match rtt {
        Ok(ms) => section.notes.push(format!(
            "the registry's floor: one request for 64 KiB of a layer blob (a Range GET on one kept-open connection, the median of {RTT_TRIES}) takes {ms:.2} ms whatever its size up to 1 MiB, so a lazy start-up's requests, one after another as its program asks, cost that each"
        )),
        Err(e) => section.notes.push(format!("the registry's round trip was not measured: {e:#}")),
    }
    section.rows = rows;
    Ok(section)
}

fn columns(python: bool) -> Vec<Column> {
    let col = |key, label| Column {
        key,
        label,
        unit: Unit::Seconds,
    };
    let mut c = vec![col("pull", "pull"), col("byte", "first byte")];
    if python {
        c.push(col("start", "start-up"));
        c.push(col("started", "pull + start-up"));
    }
    c.extend([
        col("first", "1st run"),
        col("next", "later run"),
        col("total", "pull + 1st run"),
    ]);
    c
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
    let plan = |way, who: &Who, label: &str, kind| Plan {
        way,
        who: who.clone(),
        row: Row::new(label, kind),
        traffic: Cell::new(Traffic::default()),
    };
    let ordinary = user.clone().unwrap_or(Who::Me);
    let mut plans = vec![
        plan(
            Way::Foliofs,
            &Who::Me,
            "foliofs mount docker:// (pulled, built, merged, mounted), root",
            "foliofs",
        ),
        plan(
            Way::Foliofs,
            &ordinary,
            "foliofs mount docker://, as a user",
            "foliofs",
        ),
        plan(
            Way::SkopeoMkfs,
            &Who::Me,
            "skopeo copy, mkfs.erofs --tar=f per layer, kernel overlayfs over kernel erofs",
            "kernel",
        ),
        plan(
            Way::SkopeoUmoci,
            &Who::Me,
            "skopeo copy, umoci unpack into a directory (overlayfs snapshotter)",
            "baseline",
        ),
        plan(
            Way::Lazy,
            &Who::Me,
            "foliofs mount docker:// of the native EROFS image (dm-verity), lazy, root",
            "foliofs",
        ),
        plan(
            Way::Lazy,
            &ordinary,
            "foliofs mount docker:// of the native EROFS image, lazy, as a user",
            "foliofs",
        ),
    ];
    plans[0].row.note = (!env.root).then(|| "needs root: the user row is this one's".into());
    plans[1].row.note = user.as_ref().err().cloned();
    plans[4].row.note = (!env.root).then(|| "needs root: the user row is this one's".into());
    plans[5].row.note = user.as_ref().err().cloned();
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
    let cache = base.join("cache");
    let lazy = plan.way == Way::Lazy;
    let mut t = plan.traffic.get();
    if lazy {
        t.mount += allocated(&cache);
    }
    let byte = first_byte(env, &plan.who, &dir)?;
    let mut figures = Vec::new();
    if made.python.is_some() {
        // The container's start-up: its interpreter importing modules.
        let fetched = allocated(&cache);
        let read = lazy.then(|| crate::remote::remote_counts(&dir)).flatten();
        let requests = lazy
            .then(|| crate::remote::remote_counter(&dir, "requests"))
            .flatten();
        let script = crate::realstart::script(crate::realstart::MODULES);
        let start = time_cmd(&mut crate::image::lookups::step(
            &plan.who, "python", &dir, made, &script,
        ))?;
        if let (Some((_, r0)), Some((_, r1))) = (read, crate::remote::remote_counts(&dir)) {
            t.start_fetched += allocated(&cache) - fetched;
            t.start_read += r1 - r0;
        }
        if let (Some(q0), Some(q1)) = (requests, crate::remote::remote_counter(&dir, "requests")) {
            t.start_requests += q1 - q0;
        }
        figures.push(("start", start));
    }
    let first = read_tree(env, &plan.who, &dir)?;
    if lazy {
        t.run_fetched += allocated(&cache);
        t.run_read += made.bytes;
        plan.traffic.set(t);
    }
    let next = read_tree(env, &plan.who, &dir)?;
    drop(stack);
    std::fs::remove_dir_all(&base)?;
    figures.extend([
        ("pull", pulled),
        ("byte", pulled + byte),
        ("first", first),
        ("next", next),
        ("total", pulled + first),
    ]);
    if let Some(&(_, start)) = figures.iter().find(|(k, _)| *k == "start") {
        figures.push(("started", pulled + start));
    }
    Ok(figures)
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
        Way::Foliofs | Way::Lazy => {
            let mut extra = vec!["--tls-verify=false".to_owned()];
            if plan.way == Way::Lazy {
                let cache = base.join("cache");
                std::fs::create_dir(&cache)?;
                plan.who.own(&cache)?;
                extra.push("-o".into());
                extra.push(format!("cache={}", cache.display()));
            }
            let how = How::Image {
                store: store.to_owned(),
                who: plan.who.clone(),
                extra,
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
            "the image section's image ({LAYERS} gzipped layers, {} bytes; flattened, {} files, {} MB) pushed with skopeo into docker-registry on 127.0.0.1 (plain HTTP; --tls-verify=false, --src-tls-verify=false); each row from an empty store{}; pull = from the registry to a root file system: foliofs builds each layer as its blob streams in and merges them; skopeo copies the blobs into an OCI layout, then mkfs.erofs{} per layer behind `gzip -dc |` with containerd's flags, mounted and stacked under overlayfs, or umoci unpack; first byte = pull, then the first byte of the first file a walk meets; start-up = then, the image's Python (when this machine has one to lay out) run with -I -S importing the realstart section's modules from the image, the container's start; 1st run = then every file read, later run = again; {} rounds, rows interleaved; ratios are to the mkfs.erofs row",
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
        "the lazy rows: the image pushed once by `foliofs push --dm-verity` (raw layers, a chunk index of 1 MiB chunks each with its SHA-256, and a dm-verity tree) beside the tar image; pull = the mount: the manifest, then for each layer two requests side by side, one for its image's last 256 KiB, tree and index, one for its first 64 KiB, each checked, and the merged metadata built from the layers' metadata; then every 64 KiB piece a read needs is fetched (runs queued in order in one request of up to 1 MiB), each block checked by the tree, and kept in a disk cache of the row's own, empty at each round's start".into(),
    ]
}

/// The bytes the lazy rows fetched for the bytes their start-up and 1st
/// run read.
fn traffic_note(rows: &[(String, Traffic)], cfg: &Config) -> Option<String> {
    let mb = |b: u64| b as f64 / 1e6 / cfg.runs.max(1) as f64;
    let ratio = |f: u64, r: u64| if r == 0 { 0.0 } else { f as f64 / r as f64 };
    let each: Vec<String> = rows
        .iter()
        .filter(|(_, t)| t.run_read > 0)
        .map(|(label, t)| {
            let start = if t.start_read > 0 {
                format!(
                    "start-up {:.2} ({:.1} MB fetched for {:.1} MB read, in {:.0} requests), ",
                    ratio(t.start_fetched, t.start_read),
                    mb(t.start_fetched),
                    mb(t.start_read),
                    t.start_requests as f64 / cfg.runs.max(1) as f64
                )
            } else {
                String::new()
            };
            format!(
                "{label}: mount {:.1} MB fetched, {start}1st run {:.2} ({:.1} MB fetched by its end for {:.1} MB of files read)",
                mb(t.mount),
                ratio(t.run_fetched, t.run_read),
                mb(t.run_fetched),
                mb(t.run_read)
            )
        })
        .collect();
    (!each.is_empty()).then(|| {
        format!(
            "lazy rows, bytes fetched / bytes read, per run (fetched = the growth of the disk cache's allocated bytes, the chunk indexes and trees kept beside it included; the start-up's read = the bytes its server read from the layers, metadata and the kernel's read-ahead included; the 1st run's read = the files' bytes): {}",
            each.join("; ")
        )
    })
}

/// Bytes allocated to the files under `dir`.
fn allocated(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    let mut todo = vec![dir.to_owned()];
    while let Some(d) = todo.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => todo.push(e.path()),
                Ok(m) => total += m.blocks() * 512,
                Err(_) => {}
            }
        }
    }
    total
}

/// Round trips measured.
const RTT_TRIES: usize = 50;

/// The median milliseconds of a Range GET of 64 KiB of the image's first
/// layer blob, on one HTTP/1.1 connection kept open (what a client that
/// pools its connections pays per request).
fn round_trip(host: &str, made: &Made) -> Result<f64> {
    use std::io::{BufRead, BufReader, Read, Write};
    let blob = made
        .blobs
        .first()
        .and_then(|b| b.file_name())
        .context("no layer blob")?
        .to_string_lossy()
        .into_owned();
    let stream = std::net::TcpStream::connect(host)?;
    stream.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
    stream.set_nodelay(true)?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut writer = stream;
    let mut times = Vec::with_capacity(RTT_TRIES);
    for i in 0..RTT_TRIES {
        let at = (i as u64 % 8) << 16;
        let start = Instant::now();
        write!(
            writer,
            "GET /v2/{REPO}/blobs/sha256:{blob} HTTP/1.1\r\nHost: {host}\r\nRange: bytes={at}-{}\r\n\r\n",
            at + 65535
        )?;
        let mut len = None;
        let mut status = String::new();
        reader.read_line(&mut status)?;
        if !status.contains(" 206 ") {
            bail!("the registry answered {}", status.trim());
        }
        loop {
            let mut line = String::new();
            reader.read_line(&mut line)?;
            if line.trim().is_empty() {
                break;
            }
            if let Some((k, v)) = line.split_once(':') {
                if k.eq_ignore_ascii_case("content-length") {
                    len = v.trim().parse::<u64>().ok();
                }
            }
        }
        let len = len.context("no Content-Length")?;
        std::io::copy(&mut (&mut reader).take(len), &mut std::io::sink())?;
        times.push(start.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}
