//! Native EROFS images for a registry (erofs-image-spec): each layer
//! image of the store made into an `application/vnd.erofs` blob (or
//! `+zstd`, one zstd frame per chunk) with its chunk index embedded at
//! its end and, when asked, its dm-verity tree between image and index;
//! a config with `erofs` in `os.features`; a manifest of those layers;
//! and an index listing the layout's own tar manifest first and the
//! EROFS one after it, so that a client that does not know EROFS finds
//! its image as before (spec §6).
//!
//! What the spec leaves open, and what this does:
//! - chunks are a fixed size ([`DEFAULT_CHUNK`] unless asked), cut from
//!   offset 0 of the image data, the last one shorter; every entry has a
//!   SHA-256 checksum (`HashAlgo` 1, `HashSize` 32);
//! - the `+zstd` index frame starts 4-byte aligned (a SHOULD) by a
//!   padding skippable frame before it when needed; by §3.4.2's length
//!   rule that padding belongs to the last chunk's on-blob bytes, so its
//!   checksum covers the padding too (zstd decoders skip it);
//! - with dm-verity the EROFS image is zero-padded to a 4096-byte block
//!   (`hash_offset` must be a multiple of it), the tree is veritysetup's
//!   format 1 with its superblock and a salt derived from the data (see
//!   [`crate::verity`]), and the chunk index covers image and tree;
//! - roles: below the top every layer is `overlay-lower` (whiteouts are
//!   only meaningful above such a layer, §3.6), the top one has none; a
//!   single layer has none;
//! - `rootfs.diff_ids` is always written (a SHOULD) beside the
//!   `org.erofs.uncompressed-digest` of `+zstd` layers; raw layers do
//!   not carry that annotation (it would equal their digest);
//! - `org.erofs.chunk-index.mediaType` is written although it is the
//!   default, and `.range` always with its end.

use std::collections::BTreeMap;
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};
use sha2::{Digest as _, Sha256};

use crate::chunk_index::{self, ChunkIndex, Compression, Entry};
use crate::digest::Digest;
use crate::layout::{read_bounded, Image, Layout, MAX_JSON, OCI_INDEX, OCI_MANIFEST};
use crate::verity;
use crate::OciError;

/// A raw EROFS layer.
pub const EROFS: &str = "application/vnd.erofs";
/// A zstd-compressed EROFS layer.
pub const EROFS_ZSTD: &str = "application/vnd.erofs+zstd";
/// An OCI image config.
pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
/// The chunk size unless asked (Appendix A's example).
pub const DEFAULT_CHUNK: u64 = 1 << 20;
/// Largest chunk size: a chunk is held whole (and its frame) while it is
/// written.
pub const MAX_CHUNK: u64 = 64 << 20;
/// zstd's own default level.
const ZSTD_LEVEL: i32 = 3;

/// How layer blobs are made.
#[derive(Clone, Copy, Debug)]
pub struct LayerOptions {
    /// `application/vnd.erofs+zstd` rather than raw.
    pub zstd: bool,
    /// A dm-verity tree after the image.
    pub verity: bool,
    /// The chunk size: a multiple of 4096 up to [`MAX_CHUNK`].
    pub chunk_size: u64,
}

impl Default for LayerOptions {
    fn default() -> Self {
        LayerOptions {
            zstd: false,
            verity: false,
            chunk_size: DEFAULT_CHUNK,
        }
    }
}

/// A layer blob made, in its file.
#[derive(Clone, Debug)]
pub struct LayerBlob {
    /// Its file.
    pub path: PathBuf,
    /// Its digest.
    pub digest: Digest,
    /// Its size.
    pub size: u64,
    /// Its DiffID (spec §5.2): the blob's digest for a raw layer, the
    /// decompressed data's for `+zstd`.
    pub diff_id: Digest,
    /// [`EROFS`] or [`EROFS_ZSTD`].
    pub media_type: &'static str,
    /// Its descriptor's annotations (a role is added by [`publish`]).
    pub annotations: BTreeMap<String, String>,
}

/// The EROFS image `image` (a store layer) as a layer blob in `dir`,
/// named by its digest.
pub fn layer_blob(image: &Path, dir: &Path, o: &LayerOptions) -> Result<LayerBlob, OciError> {
    if o.chunk_size == 0 || !o.chunk_size.is_multiple_of(verity::BLOCK) || o.chunk_size > MAX_CHUNK
    {
        return Err(OciError::Json {
            what: format!("chunk size {}", o.chunk_size),
            why: format!("a multiple of 4096 up to {MAX_CHUNK} is taken"),
        });
    }
    let err = |what: &str| {
        let what = format!("{}: {what}", image.display());
        move |e: io::Error| OciError::Io {
            what: what.clone(),
            source: e,
        }
    };
    let size = std::fs::metadata(image).map_err(err("reading"))?.len();
    let padded = size.div_ceil(verity::BLOCK) * verity::BLOCK;
    // The image (zero-padded to a block with dm-verity), as read afresh.
    let image_data = |len: u64| -> io::Result<Box<dyn Read>> {
        let f = std::fs::File::open(image)?;
        Ok(Box::new(
            io::BufReader::with_capacity(1 << 20, f.take(size))
                .chain(io::repeat(0).take(len - size)),
        ))
    };
    let mut annotations = BTreeMap::new();
    let (mut data, data_len): (Box<dyn Read>, u64) = if o.verity {
        let mut salt = Sha256::new();
        io::copy(&mut image_data(padded).map_err(err("reading"))?, &mut salt)
            .map_err(err("reading"))?;
        let v = verity::build(
            &mut image_data(padded).map_err(err("reading"))?,
            padded / verity::BLOCK,
            salt.finalize().into(),
        )
        .map_err(err("hashing for dm-verity"))?;
        let root: String = v.root.iter().map(|b| format!("{b:02x}")).collect();
        annotations.insert("org.erofs.dmverity.hash_offset".into(), padded.to_string());
        annotations.insert(
            "org.erofs.dmverity.root_digest".into(),
            format!("sha256:{root}"),
        );
        annotations.insert(
            "org.erofs.dmverity.block_size".into(),
            verity::BLOCK.to_string(),
        );
        let len = padded + v.area.len() as u64;
        let reader = image_data(padded)
            .map_err(err("reading"))?
            .chain(io::Cursor::new(v.area));
        (Box::new(reader), len)
    } else {
        (image_data(size).map_err(err("reading"))?, size)
    };

    let tmp = tempfile::Builder::new()
        .prefix(".blob.")
        .tempfile_in(dir)
        .map_err(err("a blob in the push directory"))?;
    let mut out = Hashed {
        inner: BufWriter::with_capacity(
            1 << 20,
            tmp.as_file().try_clone().map_err(err("its blob"))?,
        ),
        hash: Sha256::new(),
        at: 0,
    };
    let werr = err("writing its blob");
    let mut plain = Sha256::new();
    let mut entries = Vec::new();
    let mut compressor = zstd::bulk::Compressor::new(ZSTD_LEVEL).map_err(err("zstd"))?;
    let mut buf = vec![0u8; o.chunk_size as usize];
    let mut offset = 0u64;
    loop {
        let n = read_full(&mut data, &mut buf).map_err(err("reading"))?;
        if n == 0 {
            break;
        }
        let chunk = &buf[..n];
        plain.update(chunk);
        let frame;
        let stored = if o.zstd {
            frame = compressor.compress(chunk).map_err(err("zstd"))?;
            &frame[..]
        } else {
            chunk
        };
        entries.push(Entry {
            blob_offset: out.at,
            uncompressed_offset: offset,
            checksum: Sha256::digest(stored).to_vec(),
        });
        out.write_all(stored).map_err(&werr)?;
        offset += n as u64;
    }
    if offset != data_len {
        return Err(err("reading")(io::Error::other(format!(
            "{offset} bytes read, {data_len} expected (did it change?)"
        ))));
    }
    // The last chunk's checksum covers what lies between it and the
    // index (a zstd padding frame).
    let mut tail = Vec::new();
    if o.zstd {
        let pad = (4 - out.at % 4) % 4;
        if pad != 0 {
            tail = chunk_index::skippable_frame(&vec![0u8; pad as usize]);
        }
        if let Some(last) = entries.last_mut() {
            let mut h = Sha256::new();
            let from = last.blob_offset;
            let mut f = std::fs::File::open(tmp.path()).map_err(&werr)?;
            out.inner.flush().map_err(&werr)?;
            io::Seek::seek(&mut f, io::SeekFrom::Start(from)).map_err(&werr)?;
            io::copy(&mut f, &mut h).map_err(&werr)?;
            h.update(&tail);
            last.checksum = h.finalize().to_vec();
        }
    }
    out.write_all(&tail).map_err(&werr)?;
    let index_start = out.at;
    let index = ChunkIndex {
        compression: if o.zstd {
            Compression::Zstd
        } else {
            Compression::None
        },
        uncompressed_size: data_len,
        hash_size: 32,
        entries,
        index_start,
    };
    let payload = index.encode();
    let section = if o.zstd {
        chunk_index::skippable_frame(&payload)
    } else {
        payload.clone()
    };
    out.write_all(&section).map_err(&werr)?;
    let end = out.at;
    out.inner.flush().map_err(&werr)?;
    let Hashed { inner, hash, at } = out;
    drop(inner);
    let digest = Digest::from_hasher(hash);
    annotations.insert(
        "org.erofs.chunk-index.range".into(),
        format!("{index_start}:{end}"),
    );
    annotations.insert(
        "org.erofs.chunk-index.digest".into(),
        Digest::of(&payload).to_string(),
    );
    annotations.insert(
        "org.erofs.chunk-index.mediaType".into(),
        chunk_index::MEDIA_TYPE.into(),
    );
    let diff_id = if o.zstd {
        let d = Digest::from_hasher(plain);
        annotations.insert("org.erofs.uncompressed-digest".into(), d.to_string());
        d
    } else {
        digest.clone()
    };
    let path = dir.join(digest.hex());
    tmp.persist(&path).map_err(|e| err("its blob")(e.error))?;
    Ok(LayerBlob {
        path,
        digest,
        size: at,
        diff_id,
        media_type: if o.zstd { EROFS_ZSTD } else { EROFS },
        annotations,
    })
}

/// A writer that hashes what it writes and counts it.
struct Hashed<W: Write> {
    inner: W,
    hash: Sha256,
    at: u64,
}

impl<W: Write> Write for Hashed<W> {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(b)?;
        self.hash.update(&b[..n]);
        self.at += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// `buf` filled from `r`, short only at its end.
fn read_full(r: &mut dyn Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// A manifest, index or config: its bytes and what it is.
#[derive(Clone, Debug)]
pub struct Document {
    /// Its media type.
    pub media_type: String,
    /// Its bytes.
    pub bytes: Vec<u8>,
    /// Their digest.
    pub digest: Digest,
}

impl Document {
    fn new(media_type: &str, value: &Value) -> Document {
        let bytes = serde_json::to_vec(value).unwrap_or_default();
        Document {
            media_type: media_type.into(),
            digest: Digest::of(&bytes),
            bytes,
        }
    }

    fn descriptor(&self) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("mediaType".into(), json!(self.media_type));
        m.insert("digest".into(), json!(self.digest.to_string()));
        m.insert("size".into(), json!(self.bytes.len()));
        m
    }
}

/// What `foliofs push` sends, besides the blobs: the layout's tar
/// manifest (and its config, unchanged), the EROFS config and manifest,
/// and the index of both.
#[derive(Clone, Debug)]
pub struct Publication {
    /// The layout's manifest, as it is.
    pub tar_manifest: Document,
    /// The layout's config, as it is.
    pub tar_config: Document,
    /// The EROFS image's config.
    pub config: Document,
    /// The EROFS image's manifest.
    pub manifest: Document,
    /// The index, tar manifest first.
    pub index: Document,
}

/// The documents for `image` of `layout` with `layers` (its layers as
/// EROFS blobs, lowest first).
pub fn publish(
    layout: &Layout,
    image: &Image,
    layers: &[LayerBlob],
) -> Result<Publication, OciError> {
    let read = |d: &Digest, what: &str| -> Result<Vec<u8>, OciError> {
        let path = layout.blob_path(d);
        let raw = read_bounded(&path, MAX_JSON)?;
        let got = Digest::of(&raw);
        if &got != d {
            return Err(OciError::Mismatch {
                what: format!("{what} {}", path.display()),
                want: d.clone(),
                got,
            });
        }
        Ok(raw)
    };
    let bad = |what: &str, why: &str| OciError::Json {
        what: what.into(),
        why: why.into(),
    };
    let manifest_raw = read(&image.manifest, "the manifest")?;
    let config_raw = read(&image.config, "the config")?;
    let manifest: Value = serde_json::from_slice(&manifest_raw)
        .map_err(|e| bad(&format!("manifest {}", image.manifest), &e.to_string()))?;
    let manifest_type = manifest["mediaType"].as_str().unwrap_or(OCI_MANIFEST);
    let config_type = manifest["config"]["mediaType"]
        .as_str()
        .unwrap_or(OCI_CONFIG);
    let Value::Object(mut config) = serde_json::from_slice(&config_raw)
        .map_err(|e| bad(&format!("config {}", image.config), &e.to_string()))?
    else {
        return Err(bad(
            &format!("config {}", image.config),
            "not a JSON object",
        ));
    };
    // The platform, as the config says it (spec §5.4: `erofs` in both).
    let mut platform = Map::new();
    for (from, to) in [
        ("os", "os"),
        ("architecture", "architecture"),
        ("variant", "variant"),
        ("os.version", "os.version"),
    ] {
        if let Some(v) = config.get(from).filter(|v| v.is_string()) {
            platform.insert(to.into(), v.clone());
        }
    }
    let tar_features: Vec<Value> = config
        .get("os.features")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut features = tar_features.clone();
    if !features.iter().any(|f| f == "erofs") {
        features.push(json!("erofs"));
    }
    config.insert("os.features".into(), Value::Array(features.clone()));
    config.insert(
        "rootfs".into(),
        json!({
            "type": "layers",
            "diff_ids": layers.iter().map(|l| l.diff_id.to_string()).collect::<Vec<_>>(),
        }),
    );
    let config = Document::new(OCI_CONFIG, &Value::Object(config));
    let top = layers.len().saturating_sub(1);
    let layer_descriptors: Vec<Value> = layers
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let mut annotations = l.annotations.clone();
            if i < top {
                annotations.insert("org.erofs.role".into(), "overlay-lower".into());
            }
            json!({
                "mediaType": l.media_type,
                "digest": l.digest.to_string(),
                "size": l.size,
                "annotations": annotations,
            })
        })
        .collect();
    let mut config_descriptor = config.descriptor();
    config_descriptor.insert("mediaType".into(), json!(OCI_CONFIG));
    let manifest_doc = Document::new(
        OCI_MANIFEST,
        &json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": config_descriptor,
            "layers": layer_descriptors,
        }),
    );
    let tar_manifest = Document {
        media_type: manifest_type.into(),
        digest: image.manifest.clone(),
        bytes: manifest_raw,
    };
    let tar_config = Document {
        media_type: config_type.into(),
        digest: image.config.clone(),
        bytes: config_raw,
    };
    let mut tar_entry = tar_manifest.descriptor();
    let mut tar_platform = platform.clone();
    if !tar_features.is_empty() {
        tar_platform.insert("os.features".into(), Value::Array(tar_features));
    }
    tar_entry.insert("platform".into(), Value::Object(tar_platform));
    let mut erofs_entry = manifest_doc.descriptor();
    let mut erofs_platform = platform;
    erofs_platform.insert("os.features".into(), Value::Array(features));
    erofs_entry.insert("platform".into(), Value::Object(erofs_platform));
    let index = Document::new(
        OCI_INDEX,
        &json!({
            "schemaVersion": 2,
            "mediaType": OCI_INDEX,
            "manifests": [tar_entry, erofs_entry],
        }),
    );
    Ok(Publication {
        tar_manifest,
        tar_config,
        config,
        manifest: manifest_doc,
        index,
    })
}
