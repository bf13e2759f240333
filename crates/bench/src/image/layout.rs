//! The image the section starts from: an OCI image layout on disk, its
//! layers made as a build makes them (a base, then each layer adding,
//! changing and deleting files), and the same tree flattened, for the
//! single-layer image the merged one is held against.

use std::fs;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};
use sha2::{Digest as _, Sha256};

use crate::env::{run, BenchEnv};
use crate::images::source_tree;
use crate::realstart::{lay_out, python, zero_times};
use crate::rows::progress;
use crate::Config;

/// The tag the image goes by in its layout.
pub(crate) const TAG: &str = "bench";

/// `foliofs` arguments that build a tar on stdin into an image as the
/// store builds a layer: overlayfs whiteouts, no data inline.
pub(crate) const LAYER_FLAGS: &[&str] = &[
    "mkfs",
    "erofs",
    "-q",
    "--tar=f",
    "--aufs",
    "-Enoinline_data",
];

/// What [`make`] made.
pub(crate) struct Made {
    /// The OCI image layout directory.
    pub(crate) layout: PathBuf,
    /// `oci:LAYOUT:TAG`.
    pub(crate) reference: String,
    /// Each layer's gzipped blob, lowest first.
    pub(crate) blobs: Vec<PathBuf>,
    /// Each layer's diff_id, as hex.
    pub(crate) diff_ids: Vec<String>,
    /// The flattened tree as one tar.gz.
    pub(crate) flat: PathBuf,
    /// The interpreter, relative to the root, when the machine has one.
    pub(crate) python: Option<PathBuf>,
    /// What the flattened tree holds.
    pub(crate) files: u64,
    pub(crate) bytes: u64,
    /// The layer blobs' sizes in all.
    pub(crate) blob_bytes: u64,
}

/// Makes the layout in `env`'s work directory: `layers` layers, the
/// first the machine's Python (interpreter and standard library, under
/// `usr/`) and the rest the start-up tree dealt out file by file, so
/// that every directory of it is in many layers, as a distribution's
/// directories are in an image built a package at a time. Each layer
/// after the first also drops a file into the library's directory,
/// rewrites `etc/generation`, and (from the third) deletes a file the
/// layer below added.
pub(crate) fn make(env: &BenchEnv, cfg: &Config, layers: usize) -> Result<Made> {
    assert!(layers >= 2, "a base and a layer at least");
    let (src, _) = source_tree(env, cfg, "image-src", cfg.startup_files, cfg.startup_bytes)?;
    progress(cfg, &format!("[image] making {layers} layers"));
    let work = env.subdir("image-layers")?;
    let dirs: Vec<PathBuf> = (1..=layers).map(|i| work.join(i.to_string())).collect();
    for d in &dirs {
        fs::create_dir_all(d.join("etc"))?;
    }
    let python = match python() {
        Ok((exe, lib)) => {
            let usr = dirs[0].join("usr");
            let rel = lay_out(&usr, &exe, &lib)?;
            zero_times(&usr)?;
            Some((Path::new("usr").join(rel), lib))
        }
        Err(_) => None,
    };
    let lib_dir = match &python {
        Some((_, lib)) => Path::new("usr/lib").join(lib.file_name().context("a library name")?),
        None => PathBuf::from("usr/lib"),
    };
    let files = files_under(&src)?;
    let mut added: Vec<Vec<PathBuf>> = vec![Vec::new(); layers];
    for (k, rel) in files.iter().enumerate() {
        let i = 1 + k % (layers - 1);
        let to = dirs[i].join("app").join(rel);
        fs::create_dir_all(to.parent().context("a file in a directory")?)?;
        // A link, not a copy: tar reads the same bytes, and nothing here
        // writes to a file it linked.
        fs::hard_link(src.join(rel), &to).with_context(|| format!("linking {}", to.display()))?;
        added[i].push(Path::new("app").join(rel));
    }
    for (i, d) in dirs.iter().enumerate() {
        fs::write(d.join("etc/generation"), format!("{}\n", i + 1))?;
        if i == 0 {
            continue;
        }
        let lib = d.join(&lib_dir);
        fs::create_dir_all(&lib)?;
        fs::write(lib.join(format!("layer-{}.txt", i + 1)), b"installed\n")?;
        // A whiteout of a file the layer below added.
        if i >= 2 {
            if let Some(gone) = added[i - 1].first() {
                let name = gone.file_name().context("a file name")?.to_string_lossy();
                let wh = d
                    .join(gone.parent().unwrap_or(Path::new("")))
                    .join(format!(".wh.{name}"));
                fs::create_dir_all(wh.parent().context("a parent")?)?;
                fs::write(&wh, b"")?;
            }
        }
    }
    let flat = flatten(env, &dirs)?;
    let stats = foliofs_testkit::data::measure_tree(&flat)?;
    progress(cfg, "[image] writing the image layout");
    let layout = env.subdir("image-layout")?;
    let blobs_dir = layout.join("blobs/sha256");
    fs::create_dir_all(&blobs_dir)?;
    let mut blobs = Vec::new();
    let mut diff_ids = Vec::new();
    let mut descs = Vec::new();
    let mut blob_bytes = 0;
    for d in &dirs {
        let (blob, diff_id, size) = layer_blob(d, &work.join("layer.tar.gz"), &blobs_dir)?;
        blob_bytes += size;
        descs.push(serde_json::json!({
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "digest": format!("sha256:{}", file_name(&blob)),
            "size": size,
        }));
        blobs.push(blob);
        diff_ids.push(diff_id);
    }
    let flat_gz = env.dir.join("image-flat.tar.gz");
    tar_gz(&flat, &flat_gz)?;
    let config = serde_json::json!({
        "architecture": oci_arch(),
        "os": "linux",
        "config": {},
        "rootfs": {
            "type": "layers",
            "diff_ids": diff_ids.iter().map(|d| format!("sha256:{d}")).collect::<Vec<_>>(),
        },
    });
    let config = put_blob(&blobs_dir, &serde_json::to_vec(&config)?)?;
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": format!("sha256:{}", config.0),
            "size": config.1,
        },
        "layers": descs,
    });
    let manifest = put_blob(&blobs_dir, &serde_json::to_vec(&manifest)?)?;
    let index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": format!("sha256:{}", manifest.0),
            "size": manifest.1,
            "annotations": {"org.opencontainers.image.ref.name": TAG},
        }],
    });
    fs::write(layout.join("index.json"), serde_json::to_vec(&index)?)?;
    fs::write(
        layout.join("oci-layout"),
        br#"{"imageLayoutVersion":"1.0.0"}"#,
    )?;
    // Only the layout and the flattened tar stay: the section starts
    // from what a pull leaves on disk.
    fs::remove_dir_all(&work)?;
    fs::remove_dir_all(&flat)?;
    Ok(Made {
        reference: format!("oci:{}:{TAG}", layout.display()),
        layout,
        blobs,
        diff_ids,
        flat: flat_gz,
        python: python.map(|(rel, _)| rel),
        files: stats.files,
        bytes: stats.bytes,
        blob_bytes,
    })
}

/// Builds the flattened tree into `img`, as the store builds a layer.
pub(crate) fn build_flat(env: &BenchEnv, made: &Made, img: &Path) -> Result<()> {
    let out = Command::new(&env.exe)
        .args(LAYER_FLAGS)
        .arg("-")
        .arg(img)
        .stdin(fs::File::open(&made.flat)?)
        .output()
        .context("starting foliofs mkfs erofs")?;
    if !out.status.success() {
        bail!(
            "foliofs mkfs erofs of {} failed ({}): {}",
            made.flat.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Every regular file under `dir`, relative to it, in name order.
fn files_under(dir: &Path) -> Result<Vec<PathBuf>> {
    fn walk(root: &Path, rel: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
        let mut names: Vec<_> = fs::read_dir(root.join(rel))
            .with_context(|| format!("listing {}", root.join(rel).display()))?
            .collect::<Result<_, _>>()?;
        names.sort_by_key(|e| e.file_name());
        for e in names {
            let r = rel.join(e.file_name());
            let t = e.file_type()?;
            if t.is_dir() {
                walk(root, &r, out)?;
            } else if t.is_file() {
                out.push(r);
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(dir, Path::new(""), &mut out)?;
    Ok(out)
}

/// The layers applied in order into one directory, as a runtime's
/// overlay shows them: each copied over the last (by hard link), its
/// whiteouts then taking away what they name.
fn flatten(env: &BenchEnv, dirs: &[PathBuf]) -> Result<PathBuf> {
    let flat = env.subdir("image-flat")?;
    for d in dirs {
        let mut from = d.as_os_str().to_owned();
        from.push("/.");
        run(Command::new("cp")
            .args(["-al", "--remove-destination"])
            .arg(from)
            .arg(&flat))?;
        apply_whiteouts(&flat)?;
    }
    Ok(flat)
}

fn apply_whiteouts(dir: &Path) -> Result<()> {
    for e in fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name();
        let name = name.to_string_lossy();
        if let Some(hidden) = name.strip_prefix(".wh.") {
            fs::remove_file(e.path())?;
            let target = dir.join(hidden);
            if target.is_dir() {
                fs::remove_dir_all(&target)?;
            } else {
                fs::remove_file(&target)
                    .with_context(|| format!("whiteout of {}", target.display()))?;
            }
        } else if e.file_type()?.is_dir() {
            apply_whiteouts(&e.path())?;
        }
    }
    Ok(())
}

/// `dir` as a gzipped tar, as image builders write a layer: names sorted,
/// owned by root, no access or change times.
fn tar_gz(dir: &Path, out: &Path) -> Result<()> {
    let status = Command::new("sh")
        .args([
            "-c",
            "tar --sort=name --format=pax --pax-option=delete=atime,delete=ctime \
             --owner=0 --group=0 --numeric-owner -C \"$1\" -cf - . | gzip -n > \"$2\"",
            "sh",
        ])
        .arg(dir)
        .arg(out)
        .status()
        .context("running tar | gzip")?;
    if !status.success() {
        bail!("tar | gzip of {} failed ({status})", dir.display());
    }
    Ok(())
}

/// One layer's blob in `blobs`: its gzipped tar under its digest; also its
/// diff_id (the digest of the tar itself) and the blob's size.
fn layer_blob(dir: &Path, scratch: &Path, blobs: &Path) -> Result<(PathBuf, String, u64)> {
    tar_gz(dir, scratch)?;
    let mut diff = Sha256::new();
    let mut gz = flate2::read::GzDecoder::new(fs::File::open(scratch)?);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = gz.read(&mut buf)?;
        if n == 0 {
            break;
        }
        diff.update(&buf[..n]);
    }
    let digest = sha256_file(scratch)?;
    let blob = blobs.join(&digest);
    fs::rename(scratch, &blob)?;
    let size = fs::metadata(&blob)?.len();
    Ok((blob, hex(&diff.finalize()), size))
}

fn sha256_file(p: &Path) -> Result<String> {
    let mut h = Sha256::new();
    let mut f = fs::File::open(p)?;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex(&h.finalize()))
}

/// `bytes` as a blob; its digest's hex and size.
fn put_blob(blobs: &Path, bytes: &[u8]) -> Result<(String, u64)> {
    let d = hex(&Sha256::digest(bytes));
    fs::write(blobs.join(&d), bytes)?;
    Ok((d, bytes.len() as u64))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// This machine's architecture as OCI names it.
fn oci_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        a => a,
    }
}
