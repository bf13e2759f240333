//! The store's catalogue: a record per name an image was prepared under
//! (`ref-<sha256 of the name>.json`), saying which manifest, config and
//! layers that name came to and when, so that the store's images can be
//! listed, and removed when no name uses them any more. A record is
//! written whole beside the store's files and renamed into place; every
//! record is read within a bound and checked before anything is done with
//! it, and the files a record names are derived from its digests, never
//! taken from its text, so a damaged record can name nothing outside the
//! store's own patterns. A lock file (`.lock`) keeps removals apart from
//! builds: preparing holds it shared, removing holds it exclusive.

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::digest::Digest;
use crate::layout::Image;
use crate::store::{Prepared, Store};
use crate::OciError;

/// Largest record read: a record of the most layers a merged image can
/// have is a few tens of KiB.
pub const MAX_RECORD: u64 = 256 << 10;
/// The version of the record format written.
pub const RECORD_VERSION: u32 = 1;
/// The store's lock file.
pub const LOCK_FILE: &str = ".lock";
/// How old a temporary file must be before a prune takes it as left
/// behind: builds hold the lock that a prune waits for, but a foliofs
/// from before the lock does not.
pub const STALE_TEMP: Duration = Duration::from_secs(10 * 60);

/// What the store keeps of an image prepared under a name.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Record {
    /// The format's version ([`RECORD_VERSION`]).
    pub version: u32,
    /// The reference the image was prepared from, as given (made
    /// absolute for a layout): `oci:/srv/images/app:1.0`.
    pub name: String,
    /// The manifest's digest: the image's id.
    pub manifest: String,
    /// The config's digest.
    pub config: String,
    /// The layers' diff_ids, lowest first.
    pub diff_ids: Vec<String>,
    /// The merged image's file in the store.
    pub image: String,
    /// When the image was prepared under this name (seconds since the
    /// epoch, UTC).
    pub prepared: u64,
    /// The merged image's size in bytes then.
    pub image_size: u64,
    /// Each layer image's size in bytes then, lowest first.
    pub layer_sizes: Vec<u64>,
}

/// A record read and checked: the files it names are its digests'.
#[derive(Clone, Debug)]
pub struct Entry {
    /// The record's file name (`ref-<hex>.json`).
    pub file: String,
    /// The record.
    pub record: Record,
    /// Its manifest digest, parsed.
    pub manifest: Digest,
    /// Its diff_ids, parsed.
    pub diff_ids: Vec<Digest>,
}

impl Entry {
    /// The store's files this record keeps: its merged image, its layer
    /// images and their implied directories.
    pub fn files(&self) -> Vec<String> {
        let mut v = vec![merged_name(&self.diff_ids)];
        for d in &self.diff_ids {
            v.push(format!("layer-{}.erofs", d.hex()));
            v.push(format!("layer-{}.implied", d.hex()));
        }
        v
    }
}

/// A record that could not be read or does not hold together.
#[derive(Clone, Debug, Serialize)]
pub struct Damaged {
    /// The record's file name.
    pub file: String,
    /// What is wrong with it.
    pub why: String,
}

/// The store's records.
#[derive(Clone, Debug, Default)]
pub struct Catalog {
    /// The good ones, by name.
    pub entries: Vec<Entry>,
    /// The others, each skipped.
    pub damaged: Vec<Damaged>,
}

/// One image as `foliofs images` lists it.
#[derive(Clone, Debug, Serialize)]
pub struct Listed {
    /// The name it was prepared under.
    pub name: String,
    /// Its manifest digest.
    pub id: String,
    /// Its config digest.
    pub config: String,
    /// How many layers it has.
    pub layers: usize,
    /// Its merged image's file.
    pub image: String,
    /// Bytes on disk now of its merged image and its layer images.
    pub size: u64,
    /// When it was prepared under this name (seconds since the epoch).
    pub prepared: u64,
    /// The record's file.
    pub record: String,
}

/// The store's images, as `foliofs images --json` writes them.
#[derive(Clone, Debug, Serialize)]
pub struct Listing {
    /// The store.
    pub store: String,
    /// Its images, by name.
    pub images: Vec<Listed>,
    /// Bytes on disk of every file the images keep, each counted once
    /// (a layer several images share, a merged image several names do).
    pub total_size: u64,
    /// Records skipped as damaged.
    pub damaged: Vec<Damaged>,
}

impl Listing {
    /// The listing as JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

/// A lock on the store, held until dropped.
#[derive(Debug)]
pub struct StoreLock {
    _lock: Option<nix::fcntl::Flock<File>>,
}

/// The file name of the merged image of layers `diff_ids` (as
/// [`Store::prepare`] names it: the digest of the chain of diff_ids).
pub fn merged_name(diff_ids: &[Digest]) -> String {
    let chain: String = diff_ids.iter().map(|d| format!("{d}\n")).collect();
    format!("image-{}.erofs", Digest::of(chain.as_bytes()).hex())
}

/// The record file of `name`.
pub fn record_file(name: &str) -> String {
    format!("ref-{}.json", Digest::of(name.as_bytes()).hex())
}

/// The name a record of the layout at `dir` keeps: `oci:` and the
/// layout's absolute path (its links resolved where it exists), then the
/// tag if one was given.
pub fn oci_name(dir: &Path, tag: Option<&str>) -> String {
    let abs = std::fs::canonicalize(dir)
        .or_else(|_| std::path::absolute(dir))
        .unwrap_or_else(|_| dir.to_owned());
    match tag {
        Some(t) => format!("oci:{}:{t}", abs.display()),
        None => format!("oci:{}", abs.display()),
    }
}

/// Whether `name` is `PREFIX<64 lower-case hex>SUFFIX`; the hex if so.
fn hex_between<'a>(name: &'a str, prefix: &str, suffix: &str) -> Option<&'a str> {
    let hex = name.strip_prefix(prefix)?.strip_suffix(suffix)?;
    (hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))).then_some(hex)
}

/// Whether `name` is a record's file name.
pub fn is_record_file(name: &str) -> bool {
    hex_between(name, "ref-", ".json").is_some()
}

/// Whether `name` is one of the files the store keeps for images (a layer
/// image, its implied directories, a merged image).
fn is_kept_file(name: &str) -> bool {
    hex_between(name, "layer-", ".erofs").is_some()
        || hex_between(name, "layer-", ".implied").is_some()
        || hex_between(name, "image-", ".erofs").is_some()
}

/// Whether `name` is a file the store writes on the way to one of its
/// own: a layer (`.layer.*`), a merged image (`.image-<hex>.erofs.*`), a
/// layer's implied directories (`layer-<hex>.implied.tmp`) or a record
/// (`.ref.*`).
fn is_temp_file(name: &str) -> bool {
    name.starts_with(".layer.")
        || name.starts_with(".ref.")
        || name
            .strip_prefix(".image-")
            .and_then(|r| r.get(..70))
            .is_some_and(|r| hex_between(&format!("image-{r}"), "image-", ".erofs").is_some())
        || hex_between(name, "layer-", ".implied.tmp").is_some()
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The file's length, 0 when it is missing.
fn size_of(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

impl Store {
    fn io(&self, what: impl std::fmt::Display) -> impl FnOnce(std::io::Error) -> OciError {
        let what = format!("the store {}: {what}", self.dir().display());
        move |e| OciError::Io { what, source: e }
    }

    fn lock(&self, arg: nix::fcntl::FlockArg) -> Result<Option<StoreLock>, OciError> {
        let path = self.dir().join(LOCK_FILE);
        let shared = matches!(arg, nix::fcntl::FlockArg::LockShared);
        let mut file = match OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
        {
            Ok(f) => f,
            // A store this user may only read (another's, shared): its
            // images are read, never built or removed, so a shared lock
            // is taken where the lock file can be read and none needed
            // where there is none.
            Err(e)
                if shared
                    && matches!(
                        e.kind(),
                        std::io::ErrorKind::PermissionDenied
                            | std::io::ErrorKind::ReadOnlyFilesystem
                    ) =>
            {
                match File::open(&path) {
                    Ok(f) => f,
                    Err(_) => return Ok(Some(StoreLock { _lock: None })),
                }
            }
            Err(e) => return Err(self.io(LOCK_FILE)(e)),
        };
        loop {
            match nix::fcntl::Flock::lock(file, arg) {
                Ok(l) => return Ok(Some(StoreLock { _lock: Some(l) })),
                Err((f, nix::errno::Errno::EINTR)) => file = f,
                Err((_, nix::errno::Errno::EWOULDBLOCK)) => return Ok(None),
                Err((_, e)) => return Err(self.io(LOCK_FILE)(e.into())),
            }
        }
    }

    /// The store's lock, shared: held while an image is prepared, so that
    /// no removal takes what the build is about to use.
    pub fn lock_shared(&self) -> Result<StoreLock, OciError> {
        self.lock(nix::fcntl::FlockArg::LockShared)?
            .ok_or_else(|| self.io(LOCK_FILE)(std::io::ErrorKind::WouldBlock.into()))
    }

    /// The store's lock, exclusive, for removing; `waiting` is called
    /// once if another process holds it first.
    pub fn lock_exclusive(&self, waiting: &dyn Fn()) -> Result<StoreLock, OciError> {
        if let Some(l) = self.lock(nix::fcntl::FlockArg::LockExclusiveNonblock)? {
            return Ok(l);
        }
        waiting();
        self.lock(nix::fcntl::FlockArg::LockExclusive)?
            .ok_or_else(|| self.io(LOCK_FILE)(std::io::ErrorKind::WouldBlock.into()))
    }

    /// Records that `image`, prepared as `prepared`, is what `name` names
    /// now, replacing what it named before. A record that says so already
    /// is left as it is (its time is the first preparation's).
    pub fn record(
        &self,
        name: &str,
        image: &Image,
        prepared: &Prepared,
    ) -> Result<Record, OciError> {
        let layer_sizes = image
            .layers
            .iter()
            .map(|l| size_of(&self.layer_path(&l.diff_id)))
            .collect();
        let record = Record {
            version: RECORD_VERSION,
            name: name.to_owned(),
            manifest: image.manifest.to_string(),
            config: image.config.to_string(),
            diff_ids: image.layers.iter().map(|l| l.diff_id.to_string()).collect(),
            image: prepared
                .image
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            prepared: now(),
            image_size: size_of(&prepared.image),
            layer_sizes,
        };
        // Held while the record is written, and the files checked under
        // it: a prune between the preparing and this took them.
        let _shared = self.lock_shared()?;
        let missing: Vec<String> = std::iter::once(record.image.clone())
            .chain(
                image
                    .layers
                    .iter()
                    .map(|l| format!("layer-{}.erofs", l.diff_id.hex())),
            )
            .filter(|f| !self.dir().join(f).exists())
            .collect();
        if !missing.is_empty() {
            return Err(self.io(format!(
                "{name}: {} removed as it was prepared (run it again)",
                missing.join(", ")
            ))(std::io::ErrorKind::NotFound.into()));
        }
        let file = record_file(name);
        if let Ok(old) = self.read_record(&file) {
            let same = Record {
                prepared: old.record.prepared,
                ..record.clone()
            };
            if old.record == same {
                return Ok(old.record);
            }
        }
        // Checked as it will be read, so that nothing is written that
        // would be taken for damage.
        let text = serde_json::to_vec_pretty(&record).map_err(|e| OciError::Json {
            what: file.clone(),
            why: e.to_string(),
        })?;
        check(&file, &record).map_err(|why| OciError::Json {
            what: file.clone(),
            why,
        })?;
        let mut tmp = tempfile::Builder::new()
            .prefix(".ref.")
            .tempfile_in(self.dir())
            .map_err(self.io("a new record"))?;
        // Readable as the store's other files are (a temporary file is
        // the owner's alone).
        tmp.as_file()
            .set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .and_then(|()| tmp.write_all(&text))
            .and_then(|()| tmp.as_file().sync_all())
            .map_err(self.io(&file))?;
        tmp.persist(self.dir().join(&file))
            .map_err(|e| self.io(&file)(e.error))?;
        Ok(record)
    }

    /// The record in the file `file`, read within [`MAX_RECORD`] and
    /// checked; why not otherwise.
    fn read_record(&self, file: &str) -> Result<Entry, String> {
        let f = File::open(self.dir().join(file)).map_err(|e| e.to_string())?;
        let mut raw = Vec::new();
        f.take(MAX_RECORD + 1)
            .read_to_end(&mut raw)
            .map_err(|e| e.to_string())?;
        if raw.len() as u64 > MAX_RECORD {
            return Err(format!("over {MAX_RECORD} bytes"));
        }
        let record: Record =
            serde_json::from_slice(&raw).map_err(|e| format!("not a record: {e}"))?;
        check(file, &record)?;
        Ok(Entry {
            file: file.to_owned(),
            manifest: Digest::parse(&record.manifest).map_err(|e| e.to_string())?,
            diff_ids: record
                .diff_ids
                .iter()
                .map(|d| Digest::parse(d).map_err(|e| e.to_string()))
                .collect::<Result<_, _>>()?,
            record,
        })
    }

    /// Every record in the store, the damaged ones apart.
    pub fn catalog(&self) -> Result<Catalog, OciError> {
        let mut files = Vec::new();
        for e in std::fs::read_dir(self.dir()).map_err(self.io("listing"))? {
            let e = e.map_err(self.io("listing"))?;
            let name = e.file_name().to_string_lossy().into_owned();
            if is_record_file(&name) {
                files.push(name);
            }
        }
        let mut out = Catalog::default();
        for file in files {
            match self.read_record(&file) {
                Ok(entry) => out.entries.push(entry),
                Err(why) => out.damaged.push(Damaged { file, why }),
            }
        }
        out.entries
            .sort_by(|a, b| a.record.name.cmp(&b.record.name));
        out.damaged.sort_by(|a, b| a.file.cmp(&b.file));
        Ok(out)
    }

    /// The store's images, with their sizes on disk now.
    pub fn listing(&self) -> Result<Listing, OciError> {
        let catalog = self.catalog()?;
        let mut all = BTreeSet::new();
        let mut images = Vec::with_capacity(catalog.entries.len());
        for e in &catalog.entries {
            let files = e.files();
            let size = files.iter().map(|f| size_of(&self.dir().join(f))).sum();
            all.extend(files);
            images.push(Listed {
                name: e.record.name.clone(),
                id: e.record.manifest.clone(),
                config: e.record.config.clone(),
                layers: e.diff_ids.len(),
                image: e.record.image.clone(),
                size,
                prepared: e.record.prepared,
                record: e.file.clone(),
            });
        }
        Ok(Listing {
            store: self.dir().display().to_string(),
            images,
            total_size: all.iter().map(|f| size_of(&self.dir().join(f))).sum(),
            damaged: catalog.damaged,
        })
    }

    /// Removes the records `files` (record file names), then whatever
    /// they kept that no remaining record keeps; with `prune`, every
    /// merged and layer image no remaining record keeps, and temporary
    /// files older than [`STALE_TEMP`]. Only under
    /// [`Store::lock_exclusive`], with `files` found in a [`Catalog`] read
    /// under it. The names of the files removed, in order.
    pub fn remove(&self, files: &[String], prune: bool) -> Result<Vec<String>, OciError> {
        let catalog = self.catalog()?;
        let gone: BTreeSet<&str> = files.iter().map(String::as_str).collect();
        let mut keep = BTreeSet::new();
        let mut candidates = BTreeSet::new();
        for e in &catalog.entries {
            if gone.contains(e.file.as_str()) {
                candidates.extend(e.files());
            } else {
                keep.extend(e.files());
            }
        }
        let mut temps = Vec::new();
        if prune {
            for e in std::fs::read_dir(self.dir()).map_err(self.io("listing"))? {
                let e = e.map_err(self.io("listing"))?;
                let name = e.file_name().to_string_lossy().into_owned();
                if is_kept_file(&name) {
                    candidates.insert(name);
                } else if is_temp_file(&name) {
                    let old = e
                        .metadata()
                        .and_then(|m| m.modified())
                        .ok()
                        .and_then(|t| t.elapsed().ok())
                        .is_some_and(|age| age >= STALE_TEMP);
                    if old {
                        temps.push(name);
                    }
                }
            }
        }
        let mut removed = Vec::new();
        let mut unlink = |name: &str| -> Result<(), OciError> {
            match std::fs::remove_file(self.dir().join(name)) {
                Ok(()) => {
                    removed.push(name.to_owned());
                    Ok(())
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(self.io(name)(e)),
            }
        };
        // The records first: a removal cut short leaves files no record
        // keeps, which the next prune takes, never a record without its
        // files.
        for f in &gone {
            unlink(f)?;
        }
        // Merged images before their layers, for the same reason.
        let (merged, layers): (Vec<&String>, Vec<&String>) = candidates
            .iter()
            .filter(|f| !keep.contains(*f))
            .partition(|f| f.starts_with("image-"));
        for f in merged.into_iter().chain(layers) {
            unlink(f)?;
        }
        for f in &temps {
            unlink(f)?;
        }
        Ok(removed)
    }
}

/// Whether `record`, read from `file`, holds together: its name is the
/// one the file is for, its digests are digests, its merged image is the
/// one its layers make and it has a size for each layer.
fn check(file: &str, record: &Record) -> Result<(), String> {
    if record.version != RECORD_VERSION {
        return Err(format!(
            "record version {}; {RECORD_VERSION} is read",
            record.version
        ));
    }
    if record_file(&record.name) != file {
        return Err(format!(
            "names {:?}, whose record is another file",
            record.name.chars().take(200).collect::<String>()
        ));
    }
    Digest::parse(&record.manifest).map_err(|e| format!("manifest: {e}"))?;
    Digest::parse(&record.config).map_err(|e| format!("config: {e}"))?;
    let diff_ids = record
        .diff_ids
        .iter()
        .map(|d| Digest::parse(d).map_err(|e| format!("diff_ids: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    if diff_ids.is_empty() {
        return Err("no layers".into());
    }
    if record.image != merged_name(&diff_ids) {
        return Err(format!(
            "image {:?} is not the one its layers make",
            record.image.chars().take(200).collect::<String>()
        ));
    }
    if record.layer_sizes.len() != diff_ids.len() {
        return Err(format!(
            "{} layer sizes for {} layers",
            record.layer_sizes.len(),
            diff_ids.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temporary_and_kept_files_are_told_apart() {
        let h = "a".repeat(64);
        assert!(is_kept_file(&format!("layer-{h}.erofs")));
        assert!(is_kept_file(&format!("layer-{h}.implied")));
        assert!(is_kept_file(&format!("image-{h}.erofs")));
        assert!(!is_kept_file(&format!("ref-{h}.json")));
        assert!(!is_kept_file("image-x.erofs"));
        assert!(!is_kept_file(LOCK_FILE));
        assert!(is_temp_file(".layer.Ab12Cd.erofs"));
        assert!(is_temp_file(&format!(".image-{h}.erofs.XyZ123")));
        assert!(is_temp_file(&format!("layer-{h}.implied.tmp")));
        assert!(is_temp_file(".ref.Q1w2E3"));
        assert!(!is_temp_file(LOCK_FILE));
        assert!(!is_temp_file(".image-mine"));
        assert!(!is_temp_file("notes.txt"));
    }
}
