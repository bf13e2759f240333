//! The store: each layer of the images foliofs has used, as an EROFS
//! image named by the digest of its uncompressed tar (its diff_id, so a
//! layer two images share is built and kept once), beside the directories
//! its tar only implied; and each image's layers merged into one image
//! named by its chain of diff_ids, whose devices are those layers. A
//! layer is built as its blob streams in, the blob's digest and the tar's
//! checked on the way; a file appears under its name only once complete
//! and checked, so a failed or interrupted build leaves nothing that
//! could be taken for a layer.

use std::collections::HashSet;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use foliofs_erofs::mkfs::{Builder, MergeLayer, Options};

use crate::digest::{Digest, Hashing};
use crate::layout::{Compression, Image, Layer};
use crate::OciError;

/// Where the blobs of an image's layers come from: a layout's files, or a
/// registry's answers. A blob is read once, as its layer is built; several
/// layers are built at once.
pub trait BlobSource: Sync {
    /// The blob of `layer`, from its start. The store checks what it
    /// reads against the layer's digest and size.
    fn open_blob(&self, layer: &Layer) -> Result<Box<dyn Read + '_>, OciError>;
}

/// A layer from the store, and whether it was built now.
type Built = Result<(MergeLayer, bool), OciError>;

/// Layers built at once (containerd downloads three at a time too).
const PARALLEL_LAYERS: usize = 3;

/// A content-addressed store of layer and merged images.
#[derive(Clone, Debug)]
pub struct Store {
    dir: PathBuf,
}

/// What preparing an image did.
#[derive(Clone, Debug, Default)]
pub struct Prepared {
    /// The merged image.
    pub image: PathBuf,
    /// Layers built now (the others were in the store).
    pub layers_built: usize,
    /// Whether the merged image was built now.
    pub merged_built: bool,
}

impl Store {
    /// The store of this user: `/var/lib/foliofs/store` for root, else
    /// `$XDG_CACHE_HOME/foliofs/store` (or `~/.cache/foliofs/store`);
    /// `None` when no home is known.
    pub fn default_dir(root: bool, env: &dyn Fn(&str) -> Option<String>) -> Option<PathBuf> {
        if root {
            return Some(PathBuf::from("/var/lib/foliofs/store"));
        }
        let cache = env("XDG_CACHE_HOME")
            .filter(|v| v.starts_with('/'))
            .map(PathBuf::from)
            .or_else(|| env("HOME").map(|h| Path::new(&h).join(".cache")))?;
        Some(cache.join("foliofs/store"))
    }

    /// The store at `dir`, made if missing.
    pub fn open(dir: &Path) -> Result<Store, OciError> {
        std::fs::create_dir_all(dir).map_err(|e| OciError::Io {
            what: format!("the store {}", dir.display()),
            source: e,
        })?;
        Ok(Store {
            dir: dir.to_owned(),
        })
    }

    /// Where the store is.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The layer image of diff_id `d`.
    pub fn layer_path(&self, d: &Digest) -> PathBuf {
        self.dir.join(format!("layer-{}.erofs", d.hex()))
    }

    fn implied_path(&self, d: &Digest) -> PathBuf {
        self.dir.join(format!("layer-{}.implied", d.hex()))
    }

    /// The image `image` merged, building whatever the store lacks of it
    /// from the blobs of `layout`.
    pub fn prepare(&self, layout: &dyn BlobSource, image: &Image) -> Result<Prepared, OciError> {
        if image.layers.is_empty() {
            return Err(OciError::Layout {
                dir: PathBuf::from(image.manifest.to_string()),
                why: "the image has no layers".into(),
            });
        }
        let _shared = self.lock_shared()?;
        let mut out = Prepared::default();
        let (layers, built) = self.layers(layout, image)?;
        out.layers_built = built;
        let chain: String = image
            .layers
            .iter()
            .map(|l| format!("{}\n", l.diff_id))
            .collect();
        let merged = self.dir.join(format!(
            "image-{}.erofs",
            Digest::of(chain.as_bytes()).hex()
        ));
        if !merged.exists() {
            Builder::build_merge(&layers, &merged, Options::default()).map_err(|e| {
                OciError::Build {
                    what: format!("merging {}", image.manifest),
                    source: e,
                }
            })?;
            out.merged_built = true;
        }
        out.image = merged;
        Ok(out)
    }

    /// The merged image of a native EROFS image whose layers are read
    /// lazily: its metadata built from the layers named by `sources`
    /// (sources the block layer opens, lowest first), each file pointing
    /// into its layer, kept as `lazy-<manifest>.erofs` with the sources
    /// beside it (`.erofs.devices`, one per line, read back by whatever
    /// opens the image), the layers opened as `open` says (the mount's
    /// disk cache and timeouts); built once, and true with it when built
    /// now.
    pub fn prepare_lazy(
        &self,
        manifest: &Digest,
        sources: &[String],
        open: &foliofs_block::OpenOptions,
    ) -> Result<(PathBuf, bool), OciError> {
        let _shared = self.lock_shared()?;
        let image = self.dir.join(format!("lazy-{}.erofs", manifest.hex()));
        let devices = lazy_devices(&image);
        let io = |what: &Path| {
            let what = what.display().to_string();
            move |e: std::io::Error| OciError::Io { what, source: e }
        };
        let listed: String = sources.iter().map(|s| format!("{s}\n")).collect();
        if image.exists() && std::fs::read_to_string(&devices).ok().as_deref() == Some(&listed) {
            return Ok((image, false));
        }
        let layers: Vec<MergeLayer> = sources.iter().map(|s| PathBuf::from(s).into()).collect();
        let tmp = tempfile::Builder::new()
            .prefix(&format!(".lazy-{}.", manifest.hex()))
            .tempfile_in(&self.dir)
            .map_err(io(&self.dir))?
            .into_temp_path();
        let opts = Options {
            layer_open: open.clone(),
            ..Options::default()
        };
        Builder::build_merge(&layers, &tmp, opts).map_err(|e| OciError::Build {
            what: format!("merging the layers of {manifest}"),
            source: e,
        })?;
        let dtmp = devices.with_extension("devices.tmp");
        std::fs::write(&dtmp, listed).map_err(io(&dtmp))?;
        std::fs::rename(&dtmp, &devices).map_err(io(&devices))?;
        tmp.persist(&image).map_err(|e| io(&image)(e.error))?;
        Ok((image, true))
    }

    /// The layers of `image`, lowest first, built into the store where
    /// missing, and how many were.
    pub fn layers(
        &self,
        layout: &dyn BlobSource,
        image: &Image,
    ) -> Result<(Vec<MergeLayer>, usize), OciError> {
        let n = image.layers.len();
        let next = AtomicUsize::new(0);
        let failed = AtomicBool::new(false);
        let done: Vec<Mutex<Option<Built>>> = (0..n).map(|_| Mutex::new(None)).collect();
        // A few layers at once: one's download waits on the network while
        // another's build has the CPU. Each build streams its blob, so
        // memory grows with the builds, not with the blobs.
        std::thread::scope(|s| {
            for _ in 0..PARALLEL_LAYERS.min(n) {
                s.spawn(|| loop {
                    if failed.load(Ordering::Relaxed) {
                        return;
                    }
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(l) = image.layers.get(i) else {
                        return;
                    };
                    let r = self.layer(layout, l, i);
                    if r.is_err() {
                        failed.store(true, Ordering::Relaxed);
                    }
                    *done[i].lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
                });
            }
        });
        let mut layers = Vec::with_capacity(n);
        let mut built = 0;
        for slot in done {
            match slot.into_inner().unwrap_or_else(|p| p.into_inner()) {
                Some(Ok((layer, new))) => {
                    built += usize::from(new);
                    layers.push(layer);
                }
                Some(Err(e)) => return Err(e),
                // Not started: a lower layer failed, and is returned.
                None => {}
            }
        }
        if layers.len() != n {
            return Err(OciError::Layout {
                dir: PathBuf::from(image.manifest.to_string()),
                why: "a layer was not built".into(),
            });
        }
        Ok((layers, built))
    }

    /// Layer `i` of an image from the store, built first if missing; true
    /// with it when built now.
    fn layer(
        &self,
        layout: &dyn BlobSource,
        l: &Layer,
        i: usize,
    ) -> Result<(MergeLayer, bool), OciError> {
        let path = self.layer_path(&l.diff_id);
        let implied_path = self.implied_path(&l.diff_id);
        if path.exists() {
            let implied = read_implied(&implied_path)?;
            return Ok((MergeLayer { path, implied }, false));
        }
        let implied = self.build_layer(layout, l, i, &path, &implied_path)?;
        Ok((MergeLayer { path, implied }, true))
    }

    /// Builds layer `i` into `path` as its blob streams in, checking the
    /// blob's digest and size and the tar's digest on the way.
    fn build_layer(
        &self,
        layout: &dyn BlobSource,
        l: &Layer,
        i: usize,
        path: &Path,
        implied_path: &Path,
    ) -> Result<HashSet<Vec<u8>>, OciError> {
        let what = format!("layer {} ({})", i + 1, l.digest);
        let blob = layout.open_blob(l).map_err(|e| OciError::Io {
            what: what.clone(),
            source: std::io::Error::other(e),
        })?;
        let tmp = tempfile::Builder::new()
            .prefix(".layer.")
            .suffix(".erofs")
            .tempfile_in(&self.dir)
            .map_err(|e| OciError::Io {
                what: format!("the store {}", self.dir.display()),
                source: e,
            })?
            .into_temp_path();
        let mut packed = Hashing::new(BufReader::with_capacity(1 << 20, blob));
        let (summary, diff) =
            {
                let inner: Box<dyn Read + '_> = match l.compression {
                    Compression::None => Box::new(&mut packed),
                    Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(&mut packed)),
                    Compression::Zstd => {
                        Box::new(zstd::stream::read::Decoder::new(&mut packed).map_err(|e| {
                            OciError::Io {
                                what: what.clone(),
                                source: e,
                            }
                        })?)
                    }
                };
                let mut plain = Hashing::new(inner);
                let summary = Builder::build_tar(&mut plain, &tmp, layer_options(&l.diff_id))
                    .map_err(|e| OciError::Build {
                        what: what.clone(),
                        source: e,
                    })?;
                let (diff, _) = plain.finish().map_err(|e| OciError::Io {
                    what: format!("{what}: decompressing"),
                    source: e,
                })?;
                (summary, diff)
            };
        let (got, bytes) = packed.finish().map_err(|e| OciError::Io {
            what: what.clone(),
            source: e,
        })?;
        if got != l.digest || bytes != l.size {
            return Err(OciError::Mismatch {
                what: format!(
                    "{what}: the blob ({bytes} bytes; the manifest says {})",
                    l.size
                ),
                want: l.digest.clone(),
                got,
            });
        }
        if diff != l.diff_id {
            return Err(OciError::Mismatch {
                what: format!("{what}: its tar (the config's diff_id)"),
                want: l.diff_id.clone(),
                got: diff,
            });
        }
        // The implied directories first: a layer image in the store
        // always has them beside it.
        let list: Vec<u8> = summary
            .implied_dirs
            .iter()
            .flat_map(|p| p.iter().copied().chain([0]))
            .collect();
        let io = |what: &Path| {
            let what = what.display().to_string();
            move |e: std::io::Error| OciError::Io { what, source: e }
        };
        let itmp = implied_path.with_extension("implied.tmp");
        std::fs::write(&itmp, &list).map_err(io(&itmp))?;
        std::fs::rename(&itmp, implied_path).map_err(io(implied_path))?;
        tmp.persist(path).map_err(|e| io(path)(e.error))?;
        Ok(summary.implied_dirs.into_iter().collect())
    }
}

/// Where the sources of a lazily read image's layers are listed: its
/// name with `.devices` added.
pub fn lazy_devices(image: &Path) -> PathBuf {
    let mut p = image.as_os_str().to_owned();
    p.push(".devices");
    PathBuf::from(p)
}

/// How a layer is built: as containerd builds one for its EROFS
/// snapshotter (whiteouts made overlayfs's, no data inline, so that a
/// merge points at every byte), with a UUID made from its diff_id, so the
/// same layer gets the same UUID wherever it is built.
fn layer_options(diff_id: &Digest) -> Options {
    let hex = diff_id.hex();
    let mut uuid = [0u8; 16];
    for (i, b) in uuid.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap_or(0);
    }
    // An RFC 9562 version 8 (vendor-defined) UUID.
    uuid[6] = (uuid[6] & 0x0f) | 0x80;
    uuid[8] = (uuid[8] & 0x3f) | 0x80;
    Options {
        inline_data: false,
        aufs: true,
        uuid: Some(uuid),
        ..Options::default()
    }
}

/// The implied directories recorded beside a layer image (none when the
/// record is missing: every directory then counts as listed).
fn read_implied(path: &Path) -> Result<HashSet<Vec<u8>>, OciError> {
    match std::fs::read(path) {
        // Each path ends with a NUL (the root is the empty one).
        Ok(v) => Ok(v
            .split_inclusive(|&b| b == 0)
            .map(|e| e.strip_suffix(&[0]).unwrap_or(e).to_vec())
            .collect()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(HashSet::new()),
        Err(e) => Err(OciError::Io {
            what: path.display().to_string(),
            source: e,
        }),
    }
}
