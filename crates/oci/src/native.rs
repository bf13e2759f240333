//! An image's native EROFS manifest (erofs-image-spec §6): found in an
//! index by `erofs` in its platform's `os.features` (or named directly),
//! and its layers' descriptors read into what a lazy mount needs: the
//! blob, how its chunks are stored, where its chunk index is and what it
//! hashes to, and its dm-verity root.
//!
//! What the spec leaves open, and what this does:
//! - of several EROFS entries for the platform, the first is taken, as
//!   for tar images;
//! - a layer whose role is `device` or `overlay-data` (a layer that only
//!   lends its blocks to another) is refused by name: the layers are
//!   stacked as overlay layers, lowest first;
//! - `org.erofs.dmverity.root_digest` is `sha256:` and 64 hex digits (the
//!   bare 64 digits are taken too); `block_size` must be 4096 and
//!   `hash_offset` a multiple of it.

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::chunk_index;
use crate::digest::Digest;
use crate::layout::{parse, Descriptor, Documents, Index, Platform, OCI_INDEX, OCI_MANIFEST};
use crate::publish::{EROFS, EROFS_ZSTD};
use crate::OciError;

/// A layer's dm-verity tree: where it starts in the layer's data and its
/// root digest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerityRoot {
    /// `org.erofs.dmverity.hash_offset`: the data it covers ends here.
    pub hash_offset: u64,
    /// `org.erofs.dmverity.root_digest`.
    pub root: [u8; 32],
}

/// A native EROFS layer, as its descriptor says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NativeLayer {
    /// The blob.
    pub digest: Digest,
    /// Its size.
    pub size: u64,
    /// One zstd frame per chunk (`+zstd`) rather than raw.
    pub zstd: bool,
    /// Where its embedded chunk index is (`org.erofs.chunk-index.range`),
    /// when it has one.
    pub index_range: Option<(u64, u64)>,
    /// What the index's payload hashes to, when the descriptor says.
    pub index_digest: Option<Digest>,
    /// Its dm-verity tree, when it has one.
    pub verity: Option<VerityRoot>,
}

/// A native EROFS image.
#[derive(Clone, Debug)]
pub struct NativeImage {
    /// Its manifest's digest.
    pub manifest: Digest,
    /// Its layers, lowest first.
    pub layers: Vec<NativeLayer>,
}

#[derive(Deserialize)]
struct Manifest {
    #[serde(rename = "schemaVersion")]
    schema_version: u32,
    layers: Vec<Descriptor>,
}

/// The native EROFS image for `platform` that the checked document `raw`
/// (an index or a manifest, named `digest`) leads to; `None` when it has
/// none (a tar image only).
pub(crate) fn resolve_native(
    docs: &dyn Documents,
    media_type: &str,
    digest: Digest,
    raw: &[u8],
    platform: &Platform,
) -> Result<Option<NativeImage>, OciError> {
    #[derive(Deserialize)]
    struct Typed {
        #[serde(rename = "mediaType", default)]
        media_type: String,
    }
    let media_type = if media_type.is_empty() {
        serde_json::from_slice::<Typed>(raw)
            .map(|t| t.media_type)
            .unwrap_or_default()
    } else {
        media_type.to_owned()
    };
    let (digest, raw) = if media_type == OCI_INDEX {
        let index: Index = parse(&digest, raw)?;
        let Some(m) = index.manifests.into_iter().find(|m| {
            m.platform
                .as_ref()
                .is_some_and(|p| platform.takes(p) && p.is_erofs())
        }) else {
            return Ok(None);
        };
        if !m.media_type.is_empty() && m.media_type != OCI_MANIFEST {
            return Err(docs.bad(format!(
                "{digest}: its EROFS entry {} is a {:?}, not an image manifest",
                m.digest, m.media_type
            )));
        }
        let d = Digest::parse(&m.digest)?;
        let raw = docs.manifest(&d, m.size)?;
        (d, raw)
    } else if media_type == OCI_MANIFEST || media_type.is_empty() {
        (digest, raw.to_vec())
    } else {
        return Ok(None);
    };
    let m: Manifest = parse(&digest, &raw)?;
    if m.schema_version != 2 {
        return Err(docs.bad(format!(
            "manifest {digest} has schemaVersion {}",
            m.schema_version
        )));
    }
    if !m
        .layers
        .iter()
        .any(|l| l.media_type == EROFS || l.media_type == EROFS_ZSTD)
    {
        return Ok(None);
    }
    let mut layers = Vec::with_capacity(m.layers.len());
    for (i, l) in m.layers.iter().enumerate() {
        layers.push(native_layer(l).map_err(|why| {
            docs.bad(format!(
                "manifest {digest}: layer {} ({}): {why}",
                i + 1,
                l.digest
            ))
        })?);
    }
    if layers.is_empty() {
        return Err(docs.bad(format!("manifest {digest} has no layers")));
    }
    Ok(Some(NativeImage {
        manifest: digest,
        layers,
    }))
}

/// A layer descriptor of a native manifest, its annotations checked.
fn native_layer(l: &Descriptor) -> Result<NativeLayer, String> {
    let zstd = match l.media_type.as_str() {
        EROFS => false,
        EROFS_ZSTD => true,
        chunk_index::MEDIA_TYPE => {
            return Err(
                "a standalone chunk index layer, which this does not read (an embedded one is)"
                    .into(),
            )
        }
        other => return Err(format!("media type {other:?} is not an EROFS layer")),
    };
    let a: &BTreeMap<String, String> = &l.annotations;
    match a.get("org.erofs.role").map(String::as_str) {
        None | Some("overlay-lower") => {}
        Some(role) => {
            return Err(format!(
                "role {role:?}: only layers stacked as overlay layers are mounted"
            ))
        }
    }
    if let Some(t) = a.get("org.erofs.chunk-index.mediaType") {
        if t != chunk_index::MEDIA_TYPE {
            return Err(format!(
                "org.erofs.chunk-index.mediaType {t:?} is not {}",
                chunk_index::MEDIA_TYPE
            ));
        }
    }
    let index_range = a
        .get("org.erofs.chunk-index.range")
        .map(|r| chunk_index::parse_range(r, l.size))
        .transpose()
        .map_err(|e| e.to_string())?;
    let index_digest = a
        .get("org.erofs.chunk-index.digest")
        .map(|d| Digest::parse(d))
        .transpose()
        .map_err(|e| format!("org.erofs.chunk-index.digest: {e}"))?;
    let verity = match a.get("org.erofs.dmverity.root_digest") {
        None => None,
        Some(root) => {
            let field = |k: &str| {
                a.get(k)
                    .ok_or_else(|| format!("{k} is missing beside org.erofs.dmverity.root_digest"))
            };
            let block: u64 = field("org.erofs.dmverity.block_size")?
                .parse()
                .map_err(|_| "org.erofs.dmverity.block_size is not a number".to_owned())?;
            if block != crate::verity::BLOCK {
                return Err(format!(
                    "org.erofs.dmverity.block_size {block}: only 4096 is read"
                ));
            }
            let hash_offset: u64 = field("org.erofs.dmverity.hash_offset")?
                .parse()
                .map_err(|_| "org.erofs.dmverity.hash_offset is not a number".to_owned())?;
            if hash_offset == 0 || !hash_offset.is_multiple_of(block) {
                return Err(format!(
                    "org.erofs.dmverity.hash_offset {hash_offset} is not a positive multiple of {block}"
                ));
            }
            let hex = root.strip_prefix("sha256:").unwrap_or(root);
            Some(VerityRoot {
                hash_offset,
                root: parse_hex32(hex).ok_or_else(|| {
                    format!("org.erofs.dmverity.root_digest {root:?} is not a SHA-256 digest")
                })?,
            })
        }
    };
    Ok(NativeLayer {
        digest: Digest::parse(&l.digest).map_err(|e| e.to_string())?,
        size: l.size,
        zstd,
        index_range,
        index_digest,
        verity,
    })
}

/// 64 hex digits as 32 bytes.
pub(crate) fn parse_hex32(hex: &str) -> Option<[u8; 32]> {
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn desc(media_type: &str, annotations: &[(&str, &str)]) -> Descriptor {
        Descriptor {
            media_type: media_type.into(),
            digest: format!("sha256:{}", "ab".repeat(32)),
            size: 10_000,
            annotations: annotations
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
            platform: None,
        }
    }

    #[test]
    fn a_layers_annotations_are_read_and_checked() {
        let root = format!("sha256:{}", "01".repeat(32));
        let l = native_layer(&desc(
            EROFS_ZSTD,
            &[
                ("org.erofs.chunk-index.range", "9000:10000"),
                ("org.erofs.dmverity.root_digest", &root),
                ("org.erofs.dmverity.block_size", "4096"),
                ("org.erofs.dmverity.hash_offset", "8192"),
                ("org.erofs.role", "overlay-lower"),
            ],
        ))
        .unwrap();
        assert!(l.zstd);
        assert_eq!(l.index_range, Some((9000, 10_000)));
        assert_eq!(
            l.verity,
            Some(VerityRoot {
                hash_offset: 8192,
                root: [1; 32]
            })
        );
        for (k, v, says) in [
            ("org.erofs.role", "device", "role \"device\""),
            (
                "org.erofs.chunk-index.range",
                "9000:20000",
                "within the blob",
            ),
            ("org.erofs.dmverity.block_size", "512", "only 4096"),
            ("org.erofs.dmverity.hash_offset", "100", "multiple of 4096"),
            (
                "org.erofs.dmverity.root_digest",
                "sha256:12",
                "not a SHA-256",
            ),
        ] {
            let mut a = vec![
                ("org.erofs.dmverity.root_digest", root.as_str()),
                ("org.erofs.dmverity.block_size", "4096"),
                ("org.erofs.dmverity.hash_offset", "8192"),
            ];
            a.retain(|(key, _)| *key != k);
            a.push((k, v));
            let e = native_layer(&desc(EROFS, &a)).unwrap_err();
            assert!(e.contains(says), "{k}={v}: {e}");
        }
        let e = native_layer(&desc(chunk_index::MEDIA_TYPE, &[])).unwrap_err();
        assert!(e.contains("standalone chunk index"), "{e}");
    }
}
