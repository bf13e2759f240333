//! An OCI image layout on disk (`oci-layout`, `index.json`, `blobs/`), as
//! umoci, skopeo and buildah write it: a tag resolved through the index
//! (and an image index or Docker manifest list within it, by this
//! machine's platform) to a manifest, its config and its layers. Every
//! JSON blob is read whole within a bound and checked against its digest
//! and size before it is parsed.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::digest::Digest;
use crate::OciError;

/// Largest JSON document read (an index, a manifest, a config).
pub const MAX_JSON: u64 = 4 << 20;
/// Most nested indexes followed from `index.json` to a manifest.
const MAX_DEPTH: usize = 4;

/// An OCI image manifest.
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// An OCI image index.
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub(crate) const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub(crate) const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// How a layer blob is compressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    /// A plain tar.
    None,
    /// gzip.
    Gzip,
    /// Zstandard.
    Zstd,
}

impl Compression {
    /// The compression a layer media type names, if it is a tar layer.
    pub fn of_media_type(t: &str) -> Option<Compression> {
        Some(match t {
            "application/vnd.oci.image.layer.v1.tar"
            | "application/vnd.oci.image.layer.nondistributable.v1.tar" => Compression::None,
            "application/vnd.oci.image.layer.v1.tar+gzip"
            | "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"
            | "application/vnd.docker.image.rootfs.diff.tar.gzip"
            | "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip" => Compression::Gzip,
            "application/vnd.oci.image.layer.v1.tar+zstd"
            | "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd" => Compression::Zstd,
            _ => return None,
        })
    }
}

/// A descriptor, as the index and manifests give one.
#[derive(Clone, Debug, Deserialize)]
pub struct Descriptor {
    /// What the blob is.
    #[serde(rename = "mediaType", default)]
    pub media_type: String,
    /// Its digest, as written.
    pub digest: String,
    /// Its size in bytes.
    pub size: u64,
    /// Annotations (the tag in `org.opencontainers.image.ref.name`).
    #[serde(default)]
    pub annotations: std::collections::BTreeMap<String, String>,
    /// For an index entry, the platform it is for.
    #[serde(default)]
    pub platform: Option<Platform>,
}

/// A platform, as an index entry names it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
pub struct Platform {
    /// `linux`.
    #[serde(default)]
    pub os: String,
    /// `amd64`, `arm64`, ...
    #[serde(default)]
    pub architecture: String,
    /// `v7`, `v8`, ... (empty when not given).
    #[serde(default)]
    pub variant: String,
    /// `os.features`: `erofs` marks a native EROFS image (erofs-image-spec
    /// §6), which a tar image's reader passes over.
    #[serde(rename = "os.features", default)]
    pub features: Vec<String>,
}

impl Platform {
    /// This machine's platform, as OCI names it (any variant).
    pub fn host() -> Platform {
        let arch = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            "x86" => "386",
            "powerpc64" => "ppc64le",
            other => other,
        };
        Platform {
            os: "linux".into(),
            architecture: arch.into(),
            variant: String::new(),
            features: Vec::new(),
        }
    }

    /// `OS/ARCH[/VARIANT]`, as `--platform` spells it.
    pub fn parse(s: &str) -> Result<Platform, OciError> {
        let parts: Vec<&str> = s.split('/').collect();
        let ok = |p: &&str| {
            !p.is_empty()
                && p.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        };
        match parts.as_slice() {
            [os, arch] | [os, arch, _] if parts.iter().all(ok) => Ok(Platform {
                os: (*os).into(),
                architecture: (*arch).into(),
                variant: parts.get(2).map_or(String::new(), |v| (*v).into()),
                features: Vec::new(),
            }),
            _ => Err(OciError::Json {
                what: format!("platform {s:?}"),
                why: "expected OS/ARCH or OS/ARCH/VARIANT, e.g. linux/arm64/v8".into(),
            }),
        }
    }

    /// Whether an index entry for this platform is a native EROFS image.
    pub fn is_erofs(&self) -> bool {
        self.features.iter().any(|f| f == "erofs")
    }

    /// Whether an index entry for `entry` is an image for this platform:
    /// the same OS and architecture, and the same variant when this one
    /// names one (arm64's is v8 when an entry names none).
    pub(crate) fn takes(&self, entry: &Platform) -> bool {
        let variant = |p: &Platform| match (p.architecture.as_str(), p.variant.as_str()) {
            ("arm64", "") => "v8".to_owned(),
            (_, v) => v.to_owned(),
        };
        entry.os == self.os
            && entry.architecture == self.architecture
            && (self.variant.is_empty() || variant(entry) == variant(self))
    }
}

impl std::fmt::Display for Platform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if !self.variant.is_empty() {
            write!(f, "/{}", self.variant)?;
        }
        Ok(())
    }
}

#[derive(Deserialize)]
pub(crate) struct Index {
    #[serde(rename = "schemaVersion")]
    pub(crate) schema_version: u32,
    #[serde(default)]
    pub(crate) manifests: Vec<Descriptor>,
}

#[derive(Deserialize)]
struct Manifest {
    #[serde(rename = "schemaVersion")]
    schema_version: u32,
    config: Descriptor,
    layers: Vec<Descriptor>,
}

#[derive(Deserialize)]
struct Config {
    rootfs: RootFs,
}

#[derive(Deserialize)]
struct RootFs {
    diff_ids: Vec<String>,
}

/// A layer of an image: its blob and what its tar hashes to.
#[derive(Clone, Debug)]
pub struct Layer {
    /// The blob's digest.
    pub digest: Digest,
    /// The blob's size.
    pub size: u64,
    /// How the blob is compressed.
    pub compression: Compression,
    /// The digest of the uncompressed tar (the config's diff_id).
    pub diff_id: Digest,
}

/// An image resolved from a layout.
#[derive(Clone, Debug)]
pub struct Image {
    /// The manifest's digest.
    pub manifest: Digest,
    /// The config's digest.
    pub config: Digest,
    /// Its layers, lowest first.
    pub layers: Vec<Layer>,
}

/// An OCI image layout directory.
#[derive(Clone, Debug)]
pub struct Layout {
    dir: PathBuf,
}

/// `oci:DIR[:TAG]`, split as skopeo splits it (the tag is what follows the
/// last `:` when it holds no `/`); `None` for anything else.
pub fn parse_reference(s: &str) -> Option<(PathBuf, Option<String>)> {
    let rest = s.strip_prefix("oci:")?;
    match rest.rsplit_once(':') {
        Some((dir, tag)) if !tag.is_empty() && !tag.contains('/') && !dir.is_empty() => {
            Some((PathBuf::from(dir), Some(tag.to_owned())))
        }
        _ if !rest.is_empty() => Some((PathBuf::from(rest), None)),
        _ => None,
    }
}

impl Layout {
    /// The layout at `dir`, after checking its `oci-layout` file.
    pub fn open(dir: &Path) -> Result<Layout, OciError> {
        let marker = dir.join("oci-layout");
        let text = read_bounded(&marker, 4096)?;
        #[derive(Deserialize)]
        struct Marker {
            #[serde(rename = "imageLayoutVersion")]
            version: String,
        }
        let m: Marker = serde_json::from_slice(&text).map_err(|e| OciError::Json {
            what: marker.display().to_string(),
            why: e.to_string(),
        })?;
        if !m.version.starts_with("1.") {
            return Err(OciError::Layout {
                dir: dir.to_owned(),
                why: format!("image layout version {:?}; 1.x is read", m.version),
            });
        }
        Ok(Layout {
            dir: dir.to_owned(),
        })
    }

    /// The file of the blob `d`.
    pub fn blob_path(&self, d: &Digest) -> PathBuf {
        self.dir.join("blobs/sha256").join(d.hex())
    }

    /// The image tagged `tag` (or the only one, when no tag is given),
    /// this machine's where the tag names an index.
    pub fn image(&self, tag: Option<&str>) -> Result<Image, OciError> {
        self.image_for(tag, &Platform::host())
    }

    /// The image tagged `tag`, `platform`'s where the tag names an index.
    pub fn image_for(&self, tag: Option<&str>, platform: &Platform) -> Result<Image, OciError> {
        let index_path = self.dir.join("index.json");
        let raw = read_bounded(&index_path, MAX_JSON)?;
        let index: Index = serde_json::from_slice(&raw).map_err(|e| OciError::Json {
            what: index_path.display().to_string(),
            why: e.to_string(),
        })?;
        if index.schema_version != 2 {
            return Err(self.bad(format!(
                "index.json has schemaVersion {}; 2 is read",
                index.schema_version
            )));
        }
        let chosen: Vec<&Descriptor> = match tag {
            Some(t) => index
                .manifests
                .iter()
                .filter(|d| d.annotations.get(REF_NAME).map(String::as_str) == Some(t))
                .collect(),
            None => index.manifests.iter().collect(),
        };
        let d = match chosen.as_slice() {
            [d] => (*d).clone(),
            [] => {
                let tags: Vec<&str> = index
                    .manifests
                    .iter()
                    .filter_map(|d| d.annotations.get(REF_NAME).map(String::as_str))
                    .collect();
                return Err(self.bad(match tag {
                    Some(t) => format!("no image tagged {t:?} (tags: {})", tags.join(", ")),
                    None => "index.json lists no image".into(),
                }));
            }
            _ => {
                return Err(self.bad(format!(
                    "{} images{}: give one tag (oci:DIR:TAG)",
                    chosen.len(),
                    tag.map_or(String::new(), |t| format!(" tagged {t:?}"))
                )))
            }
        };
        let digest = Digest::parse(&d.digest)?;
        let raw = self.manifest(&digest, d.size)?;
        resolve(self, &d.media_type, digest, &raw, platform)
    }

    /// The JSON blob `digest`, of `size` bytes, checked.
    fn json(&self, digest: &Digest, size: u64) -> Result<Vec<u8>, OciError> {
        if size > MAX_JSON {
            return Err(self.bad(format!("{digest}: {size} bytes of JSON, over {MAX_JSON}")));
        }
        let path = self.blob_path(digest);
        let raw = read_bounded(&path, MAX_JSON)?;
        if raw.len() as u64 != size {
            return Err(self.bad(format!(
                "{digest}: {} bytes, but its descriptor says {size}",
                raw.len()
            )));
        }
        let got = Digest::of(&raw);
        if &got != digest {
            return Err(OciError::Mismatch {
                what: path.display().to_string(),
                want: digest.clone(),
                got,
            });
        }
        Ok(raw)
    }
}

impl crate::store::BlobSource for Layout {
    fn open_blob(&self, layer: &Layer) -> Result<Box<dyn Read + '_>, OciError> {
        let path = self.blob_path(&layer.digest);
        let f = File::open(&path).map_err(|e| OciError::Io {
            what: path.display().to_string(),
            source: e,
        })?;
        Ok(Box::new(f))
    }
}

impl Documents for Layout {
    fn manifest(&self, digest: &Digest, size: u64) -> Result<Vec<u8>, OciError> {
        self.json(digest, size)
    }

    fn config(&self, digest: &Digest, size: u64) -> Result<Vec<u8>, OciError> {
        self.json(digest, size)
    }

    fn bad(&self, why: String) -> OciError {
        OciError::Layout {
            dir: self.dir.clone(),
            why,
        }
    }
}

/// Where the JSON of an image is read from: a layout's blobs, or a
/// registry's manifests and blobs. What either returns is whole, within
/// [`MAX_JSON`], and checked against its digest and size.
pub(crate) trait Documents {
    /// The manifest or index `digest`, of `size` bytes.
    fn manifest(&self, digest: &Digest, size: u64) -> Result<Vec<u8>, OciError>;
    /// The config blob `digest`, of `size` bytes.
    fn config(&self, digest: &Digest, size: u64) -> Result<Vec<u8>, OciError>;
    /// An error of this source's, saying `why`.
    fn bad(&self, why: String) -> OciError;
}

/// The image the checked manifest or index `raw` (named `digest`, of the
/// media type `media_type` when known) leads to: an index to its entry
/// for `platform`, a manifest to its config's diff_ids and its layers.
pub(crate) fn resolve(
    docs: &dyn Documents,
    media_type: &str,
    digest: Digest,
    raw: &[u8],
    platform: &Platform,
) -> Result<Image, OciError> {
    let (mut media_type, mut digest, mut raw) = (media_type.to_owned(), digest, raw.to_vec());
    for _ in 0..=MAX_DEPTH {
        if media_type.is_empty() {
            // A descriptor (or a registry) that did not say: the
            // document's own field, else a manifest as OCI's first
            // layouts had them.
            #[derive(Deserialize)]
            struct Typed {
                #[serde(rename = "mediaType", default)]
                media_type: String,
            }
            media_type = serde_json::from_slice::<Typed>(&raw)
                .map(|t| t.media_type)
                .unwrap_or_default();
        }
        match media_type.as_str() {
            OCI_INDEX | DOCKER_LIST => {
                let index: Index = parse(&digest, &raw)?;
                let listed: Vec<String> = index
                    .manifests
                    .iter()
                    .filter_map(|m| m.platform.as_ref().map(Platform::to_string))
                    .collect();
                // A native EROFS image beside the tar one is not a tar
                // image, wherever the index lists it.
                let pick = index.manifests.into_iter().find(|m| {
                    m.platform
                        .as_ref()
                        .is_some_and(|p| platform.takes(p) && !p.is_erofs())
                });
                let Some(m) = pick else {
                    return Err(docs.bad(format!(
                        "{digest}: no image for {platform} (the index has {})",
                        if listed.is_empty() {
                            "none named by platform".to_owned()
                        } else {
                            listed.join(", ")
                        }
                    )));
                };
                digest = Digest::parse(&m.digest)?;
                raw = docs.manifest(&digest, m.size)?;
                media_type = m.media_type;
            }
            OCI_MANIFEST | DOCKER_MANIFEST | "" => return image(docs, digest, &raw),
            other => {
                return Err(docs.bad(format!("{digest}: media type {other:?} is not an image")))
            }
        }
    }
    Err(docs.bad(format!("indexes nested over {MAX_DEPTH} deep")))
}

/// The image of the checked manifest `raw`.
fn image(docs: &dyn Documents, digest: Digest, raw: &[u8]) -> Result<Image, OciError> {
    let m: Manifest = parse(&digest, raw)?;
    if m.schema_version != 2 {
        return Err(docs.bad(format!(
            "manifest {digest} has schemaVersion {}",
            m.schema_version
        )));
    }
    let config_digest = Digest::parse(&m.config.digest)?;
    let config: Config = parse(&config_digest, &docs.config(&config_digest, m.config.size)?)?;
    if config.rootfs.diff_ids.len() != m.layers.len() {
        return Err(docs.bad(format!(
            "manifest {digest}: {} layers, but its config lists {} diff_ids",
            m.layers.len(),
            config.rootfs.diff_ids.len()
        )));
    }
    let mut layers = Vec::with_capacity(m.layers.len());
    for (l, diff) in m.layers.iter().zip(&config.rootfs.diff_ids) {
        let compression = Compression::of_media_type(&l.media_type).ok_or_else(|| {
            docs.bad(format!(
                "layer {}: media type {:?} is not a tar layer this reads",
                l.digest, l.media_type
            ))
        })?;
        layers.push(Layer {
            digest: Digest::parse(&l.digest)?,
            size: l.size,
            compression,
            diff_id: Digest::parse(diff)?,
        });
    }
    Ok(Image {
        manifest: digest,
        config: config_digest,
        layers,
    })
}

/// The JSON document `digest`, parsed.
pub(crate) fn parse<T: for<'de> Deserialize<'de>>(
    digest: &Digest,
    raw: &[u8],
) -> Result<T, OciError> {
    serde_json::from_slice(raw).map_err(|e| OciError::Json {
        what: format!("{digest}"),
        why: e.to_string(),
    })
}

/// The file at `path`, refused past `max` bytes.
pub(crate) fn read_bounded(path: &Path, max: u64) -> Result<Vec<u8>, OciError> {
    let io = |e: std::io::Error| OciError::Io {
        what: path.display().to_string(),
        source: e,
    };
    let f = File::open(path).map_err(io)?;
    let mut v = Vec::new();
    f.take(max + 1).read_to_end(&mut v).map_err(io)?;
    if v.len() as u64 > max {
        return Err(OciError::Io {
            what: path.display().to_string(),
            source: std::io::Error::other(format!("over {max} bytes")),
        });
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_split_as_skopeo_splits_them() {
        assert_eq!(
            parse_reference("oci:/a/b:t"),
            Some((PathBuf::from("/a/b"), Some("t".into())))
        );
        assert_eq!(
            parse_reference("oci:/a/b"),
            Some((PathBuf::from("/a/b"), None))
        );
        assert_eq!(
            parse_reference("oci:x:1.0"),
            Some((PathBuf::from("x"), Some("1.0".into())))
        );
        assert_eq!(parse_reference("oci:"), None);
        assert_eq!(parse_reference("/a/b"), None);
    }
}
