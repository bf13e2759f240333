//! A native EROFS layer read lazily from its registry: the block layer's
//! remote object (chunks, flights, read-ahead, the disk cache,
//! `prefetch=all`) over a backend that turns each chunk of the layer's
//! data into a range request for that chunk's bytes in the blob, checks
//! them against the chunk index's checksum, decompresses a `+zstd` chunk,
//! and checks every 4096-byte block against the layer's dm-verity tree
//! when it has one. Nothing that fails a check reaches a reader or the
//! disk cache: the fetch is tried again and, failing still, the read is
//! EIO.
//!
//! A layer is named, wherever a path to an image goes, by a source of the
//! scheme [`SCHEME`] that holds all its descriptor says (see
//! [`source`]), so that a server restarted under a mount opens it again
//! from its command line alone.
//!
//! What this asks of a layer, beyond the spec's MUSTs:
//! - an embedded chunk index with checksums (`HashSize` 32 or 64): a
//!   layer without one could only be checked whole, so it is pulled, not
//!   mounted lazily;
//! - chunks of one size but the last, a power of two from 64 KiB to
//!   16 MiB (or one chunk of at most 16 MiB), so that
//!   each fetch of the block layer is one checked chunk;
//! - a raw layer's chunks at the same offsets in the blob as in the data.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use foliofs_block::remote::scheme::{self, Opened, Verify};
use foliofs_block::remote::{Backend, FetchError, Head, RemoteOptions};

use super::client::{header, status_failure, Client, Failure, Payload};
use super::reference::Reference;
use crate::chunk_index::{self, ChunkIndex, Compression};
use crate::digest::Digest;
use crate::native::{parse_hex32, NativeLayer, VerityRoot};
use crate::verity::{Tree, BLOCK};

/// The scheme a lazily read layer is named by.
pub const SCHEME: &str = "erofs-layer:";
/// Chunk sizes a lazy read takes (the block layer's `chunk=` range).
const MIN_UNIT: u64 = foliofs_block::remote::MIN_CHUNK as u64;
const MAX_UNIT: u64 = foliofs_block::remote::MAX_CHUNK as u64;
/// The fetch size of a raw layer with a dm-verity tree, unless `chunk=`
/// says: a start-up reads small files here and there, and each fetch of
/// one costs this much at least.
const VERITY_UNIT: u64 = 64 << 10;
/// How much of the image's end the request for a raw layer's tree and
/// index brings too: where a layer built as the store builds them keeps
/// its inodes and directories, which a merge reads first.
const TAIL_METADATA: u64 = 256 << 10;
/// The most one request fetches of a run of chunks queued in order.
const MAX_RUN_BYTES: u64 = 1 << 20;
/// Tries of the chunk index's fetch at open.
const OPEN_TRIES: u32 = 3;
/// Each request's bound at open.
const OPEN_TIMEOUT: Duration = Duration::from_secs(30);

/// Has this process open [`SCHEME`] sources: called once at start by
/// whatever mounts or merges native layers.
pub fn register() {
    scheme::register(SCHEME, open);
}

/// The source naming `layer` of the image `reference` names, reached by
/// plain HTTP when `plain_http`.
pub fn source(reference: &Reference, plain_http: bool, layer: &NativeLayer) -> String {
    let mut s = format!(
        "{SCHEME}{}/{}@{};size={}",
        reference.host, reference.repository, layer.digest, layer.size
    );
    if layer.zstd {
        s.push_str(";zstd");
    }
    if let Some((a, b)) = layer.index_range {
        s.push_str(&format!(";index={a}:{b}"));
    }
    if let Some(d) = &layer.index_digest {
        s.push_str(&format!(";index-digest={d}"));
    }
    if let Some(v) = &layer.verity {
        let hex: String = v.root.iter().map(|b| format!("{b:02x}")).collect();
        s.push_str(&format!(";verity={}:{hex}", v.hash_offset));
    }
    if plain_http {
        s.push_str(";http");
    }
    s
}

/// A source parsed back.
#[derive(Debug, PartialEq, Eq)]
struct Spec {
    reference: Reference,
    layer: NativeLayer,
    plain_http: bool,
}

fn parse(source: &str) -> Result<Spec, String> {
    let rest = source
        .strip_prefix(SCHEME)
        .ok_or_else(|| format!("not an {SCHEME} source"))?;
    let mut parts = rest.split(';');
    let name = parts.next().unwrap_or_default();
    let reference = Reference::parse(&format!("docker://{name}"))
        .ok_or("no image name")?
        .map_err(|e| e.to_string())?;
    let digest = reference
        .digest
        .clone()
        .ok_or("the layer is not named by its digest")?;
    let mut layer = NativeLayer {
        digest,
        size: 0,
        zstd: false,
        index_range: None,
        index_digest: None,
        verity: None,
    };
    let mut plain_http = false;
    let mut sized = false;
    for p in parts {
        let (k, v) = p.split_once('=').unwrap_or((p, ""));
        let num = |v: &str| {
            v.parse::<u64>()
                .map_err(|_| format!("{k}={v}: not a number"))
        };
        match k {
            "size" => {
                layer.size = num(v)?;
                sized = true;
            }
            "zstd" => layer.zstd = true,
            "http" => plain_http = true,
            "index" => {
                let (a, b) = v.split_once(':').ok_or(format!("index={v}: not A:B"))?;
                layer.index_range = Some((num(a)?, num(b)?));
            }
            "index-digest" => {
                layer.index_digest = Some(Digest::parse(v).map_err(|e| e.to_string())?)
            }
            "verity" => {
                let (a, h) = v
                    .split_once(':')
                    .ok_or(format!("verity={v}: not OFFSET:ROOT"))?;
                layer.verity = Some(VerityRoot {
                    hash_offset: num(a)?,
                    root: parse_hex32(h).ok_or(format!("verity={v}: not a SHA-256 root"))?,
                });
            }
            _ => return Err(format!("{p:?}: not a key of an {SCHEME} source")),
        }
    }
    if !sized {
        return Err("size= is missing".into());
    }
    Ok(Spec {
        reference,
        layer,
        plain_http,
    })
}

/// Reads a layer's chunks from its blob.
struct LayerBackend {
    client: Client,
    digest: Digest,
    index: Arc<ChunkIndex>,
    /// Each index chunk's size in the data (the last may be shorter).
    index_unit: u64,
    /// Each fetch's size: the index's chunk, or with a dm-verity tree
    /// over a raw layer any size (every block is checked by the tree).
    unit: u64,
    tree: Option<Arc<Verified>>,
}

/// A dm-verity tree and the data it covers.
struct Verified {
    tree: Tree,
    /// The data's end: blocks at or past it are the tree's own, which the
    /// chunk index's checksums cover.
    hash_offset: u64,
}

impl Verified {
    /// Checks every block of `bytes` (the data from `start`) that the
    /// tree covers.
    fn check(&self, start: u64, bytes: &[u8]) -> Result<(), String> {
        let end = (start + bytes.len() as u64).min(self.hash_offset);
        let mut at = start;
        while at < end {
            let Some(b) = bytes.get((at - start) as usize..(at - start + BLOCK) as usize) else {
                return Err(format!("bytes {at}-: not a whole block"));
            };
            if !self.tree.check(at / BLOCK, b) {
                return Err(format!(
                    "block {} (bytes {at}-{}) does not match its dm-verity hash",
                    at / BLOCK,
                    at + BLOCK - 1
                ));
            }
            at += BLOCK;
        }
        Ok(())
    }
}

/// What a chunk read back from the disk cache is checked against.
enum CachedCheck {
    /// Every block, against the tree.
    Tree(Arc<Verified>),
    /// A raw layer's chunk, against its checksum (its bytes are the
    /// blob's).
    Raw(Arc<ChunkIndex>, u64),
}

impl Verify for CachedCheck {
    fn verify(&self, start: u64, chunk: &[u8]) -> Result<(), String> {
        match self {
            CachedCheck::Tree(v) => v.check(start, chunk),
            CachedCheck::Raw(index, unit) => {
                let i = (start / unit) as usize;
                if index.checks(i, chunk) {
                    Ok(())
                } else {
                    Err(format!("chunk {i} does not match its checksum"))
                }
            }
        }
    }
}

impl LayerBackend {
    /// Bytes `len` at `start` of the blob, as one range request within
    /// `timeout` (a redirect followed).
    fn range(&self, start: u64, len: u64, timeout: Duration) -> Result<Vec<u8>, FetchError> {
        let last = start + len - 1;
        let range = format!("bytes={start}-{last}");
        let url = self.client.url(&format!("blobs/{}", self.digest));
        let mut resp = self
            .client
            .send_within(
                "GET",
                &url,
                &[("range", &range)],
                &Payload::None,
                Some(timeout),
            )
            .map_err(failure)?;
        match resp.status().as_u16() {
            206 => {
                let got = header(&resp, "content-range").unwrap_or("(none)").to_owned();
                let want = format!("bytes {start}-{last}/");
                if !got.starts_with(&want) {
                    return Err(FetchError::transient(format!(
                        "asked for bytes {start}-{last}, got Content-Range {got}"
                    )));
                }
            }
            200 => {
                return Err(FetchError::fatal(format!(
                    "asked for bytes {start}-{last} of blob {}, got 200 OK (the registry ignores ranges)",
                    self.digest
                )))
            }
            _ => return Err(failure(status_failure(&mut resp))),
        }
        let body = resp
            .body_mut()
            .with_config()
            .limit(len + 1)
            .read_to_vec()
            .map_err(|e| FetchError::transient(e.to_string()))?;
        if body.len() as u64 != len {
            return Err(FetchError::transient(format!(
                "bytes {start}-{last}: the registry sent {} bytes for {len}",
                body.len()
            )));
        }
        Ok(body)
    }

    /// Chunk `i`'s data: fetched, checked against its checksum, and
    /// decompressed.
    fn chunk(&self, i: usize, timeout: Duration) -> Result<Vec<u8>, FetchError> {
        let (at, len) = self.index.blob_range(i);
        let (_, plain) = self.index.uncompressed_range(i);
        let stored = self.range(at, len, timeout)?;
        if !self.index.checks(i, &stored) {
            return Err(FetchError::corrupt(format!(
                "chunk {i} (blob bytes {at}-{}): its bytes do not match the chunk index's checksum",
                at + len - 1
            )));
        }
        if self.index.compression == Compression::None {
            return Ok(stored);
        }
        // A frame that says more than the chunk holds is refused by the
        // bound, not allocated.
        let data = zstd::bulk::decompress(&stored, plain as usize)
            .map_err(|e| FetchError::fatal(format!("chunk {i} (blob bytes {at}-): zstd: {e}")))?;
        if data.len() as u64 != plain {
            return Err(FetchError::fatal(format!(
                "chunk {i}: its zstd frame holds {} bytes, the chunk index says {plain}",
                data.len()
            )));
        }
        Ok(data)
    }
}

fn failure(f: Failure) -> FetchError {
    if f.transient {
        FetchError::transient(f.why)
    } else {
        FetchError::fatal(f.why)
    }
}

impl Backend for LayerBackend {
    fn head(&self, _: Duration) -> Result<Head, FetchError> {
        // With a tree over a raw layer, the image is the data the tree
        // covers, as a dm-verity device shows it: the tree and the index
        // after it were fetched and checked at open, and a read-ahead to
        // the object's end must not fetch them again (by the index's
        // chunks, whole).
        let size = match &self.tree {
            Some(v) if self.index.compression == Compression::None => v.hash_offset,
            _ => self.index.uncompressed_size,
        };
        Ok(Head {
            size,
            etag: Some(self.digest.to_string()),
            last_modified: None,
        })
    }

    fn get(
        &self,
        _: &Head,
        start: u64,
        len: u64,
        timeout: Duration,
    ) -> Result<Vec<u8>, FetchError> {
        let end = start + len;
        if let Some(v) = &self.tree {
            if self.index.compression == Compression::None && end <= v.hash_offset {
                // The bytes asked for and no more: the tree checks each
                // block, whatever chunk it lies in.
                let out = self.range(start, len, timeout)?;
                v.check(start, &out).map_err(FetchError::corrupt)?;
                return Ok(out);
            }
        }
        // The index's chunks that hold the range, each checked.
        let first = (start / self.index_unit) as usize;
        let last = ((end - 1) / self.index_unit) as usize;
        let mut out = Vec::with_capacity(len as usize);
        for i in first..=last.min(self.index.entries.len() - 1) {
            out.extend_from_slice(&self.chunk(i, timeout)?);
        }
        let skip = (start - first as u64 * self.index_unit) as usize;
        let mut out = out.split_off(skip.min(out.len()));
        out.truncate(len as usize);
        if let Some(v) = &self.tree {
            v.check(start, &out).map_err(FetchError::corrupt)?;
        }
        Ok(out)
    }
}

/// Opens a [`SCHEME`] source: its registry, its chunk index fetched and
/// checked, its dm-verity tree fetched and checked up to the root.
fn open(source: &str, opts: &RemoteOptions, cache_dir: &Path) -> Result<Opened, String> {
    let spec = parse(source)?;
    let shown = format!(
        "docker://{}/{}@{}",
        spec.reference.host, spec.reference.repository, spec.layer.digest
    );
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let options = super::Options {
        plain_http: spec.plain_http,
        auth_files: super::auth::auth_files(&env),
    };
    let client = Client::new(spec.reference.clone(), &options).map_err(|e| e.to_string())?;
    let layer = &spec.layer;
    let (a, b) = layer.index_range.ok_or(
        "the layer has no chunk index, so it cannot be read lazily and checked: pull it (foliofs pull)",
    )?;
    if b > layer.size || a > b || b - a > chunk_index::MAX_PAYLOAD + 8 {
        return Err(format!(
            "chunk index range {a}:{b} does not fit a blob of {} bytes",
            layer.size
        ));
    }
    let mut backend = LayerBackend {
        client,
        digest: layer.digest.clone(),
        index: Arc::new(ChunkIndex {
            compression: Compression::None,
            uncompressed_size: 0,
            hash_size: 0,
            entries: Vec::new(),
            index_start: 0,
        }),
        index_unit: 1,
        unit: 1,
        tree: None,
    };
    // Kept beside the disk cache when its digest is known (checked again
    // at every open), so that a layer whose chunks are cached opens
    // without its registry.
    let kept = layer
        .index_digest
        .as_ref()
        .map(|_| keep_dir(cache_dir).join(format!("{}.index", layer.digest.hex())));
    let kept_index = kept
        .as_ref()
        .and_then(|k| std::fs::read(k).ok())
        .and_then(|section| {
            chunk_index::from_section(&section, a, layer.zstd, layer.index_digest.as_ref()).ok()
        });
    // A raw layer with a tree ends in the image's last bytes (where a
    // layer built as the store builds them has its metadata), the tree
    // and the index, one after the other: one request brings all three,
    // each checked on its own (the index by its digest, the tree by its
    // root, the image's blocks by the tree).
    // The image's first piece (its superblock, which opening it reads
    // first) comes in a request of its own beside that one, rather than
    // after it; checked by the tree like the rest.
    let mut head: Option<Vec<u8>> = None;
    let tail: Option<(u64, Vec<u8>)> = match &layer.verity {
        Some(v) if !layer.zstd && kept_index.is_none() && v.hash_offset < a => {
            let from = v.hash_offset.saturating_sub(TAIL_METADATA);
            let piece = if opts.chunk_given {
                u64::from(opts.chunk)
            } else {
                VERITY_UNIT
            };
            let backend = &backend;
            let bytes = std::thread::scope(|s| {
                let first =
                    (from >= piece).then(|| s.spawn(move || fetch_at_open(backend, 0, piece).ok()));
                let bytes = fetch_at_open(backend, from, b - from);
                head = first.and_then(|h| h.join().ok().flatten());
                bytes
            })
            .map_err(|why| format!("its chunk index and tree (bytes {from}-{b}): {why}"))?;
            Some((from, bytes))
        }
        _ => None,
    };
    let index = match kept_index {
        Some(index) => index,
        None => {
            let section = match &tail {
                Some((from, bytes)) => bytes[(a - from) as usize..].to_vec(),
                None => fetch_at_open(&backend, a, b - a)
                    .map_err(|why| format!("its chunk index (bytes {a}-{b}): {why}"))?,
            };
            let index =
                chunk_index::from_section(&section, a, layer.zstd, layer.index_digest.as_ref())
                    .map_err(|e| e.to_string())?;
            if let Some(k) = &kept {
                keep(k, &section);
            }
            index
        }
    };
    if index.hash_size == 0 {
        return Err(
            "its chunk index has no checksums, so its chunks cannot be checked as they come: pull it (foliofs pull)"
                .into(),
        );
    }
    if index.entries.is_empty() {
        return Err("its chunk index lists no chunks".into());
    }
    let unit = index.uncompressed_range(0).1;
    let n = index.entries.len();
    for i in 0..n {
        let (at, len) = index.uncompressed_range(i);
        if at != i as u64 * unit || (i + 1 < n && len != unit) || len > unit {
            return Err(format!(
                "chunk {i} is {len} bytes at {at}: a lazy read takes chunks of one size ({unit}) but the last"
            ));
        }
        if index.compression == Compression::None && index.blob_range(i) != (at, len) {
            return Err(format!(
                "raw chunk {i} lies at blob byte {}, not at its data offset {at}",
                index.blob_range(i).0
            ));
        }
    }
    // With a tree over a raw layer, fetches need not follow the index.
    let verity_raw = layer.verity.is_some() && !layer.zstd;
    if !verity_raw && n > 1 && (!(MIN_UNIT..=MAX_UNIT).contains(&unit) || !unit.is_power_of_two()) {
        return Err(format!(
            "its chunks are {unit} bytes: a lazy read takes a power of two from {MIN_UNIT} to {MAX_UNIT}"
        ));
    }
    if layer.verity.is_some() && !unit.is_multiple_of(BLOCK) {
        return Err(format!(
            "its chunks are {unit} bytes: with a dm-verity tree they must be whole blocks of {BLOCK}"
        ));
    }
    let index_unit = unit;
    let unit = if verity_raw {
        // Every block is checked by the tree: fetched in pieces of the
        // size asked for, or small enough that a start-up's scattered
        // reads fetch little more than they read.
        if opts.chunk_given {
            u64::from(opts.chunk)
        } else {
            VERITY_UNIT
        }
    } else {
        if opts.chunk_given && u64::from(opts.chunk) != unit && n > 1 {
            return Err(format!(
                "chunk={}: its chunks are checked as the chunk index cuts them, {unit} bytes (give that or none)",
                opts.chunk
            ));
        }
        // One chunk: read as one, in a fetch of any size the cache takes.
        if n == 1 {
            unit.next_power_of_two().max(MIN_UNIT)
        } else {
            unit
        }
    };
    if unit > MAX_UNIT {
        return Err(format!(
            "its one chunk is {unit} bytes: a lazy read takes at most {MAX_UNIT}"
        ));
    }
    backend.index = Arc::new(index);
    backend.index_unit = index_unit;
    backend.unit = unit;
    let size = backend.index.uncompressed_size;
    let mut preload = Vec::new();
    let verify: Option<Box<dyn Verify>> = match &layer.verity {
        Some(v) => {
            if v.hash_offset >= size {
                return Err(format!(
                    "dm-verity hash offset {} is not within its {size} bytes of data",
                    v.hash_offset
                ));
            }
            // Kept beside the disk cache too: checked up to its root at
            // every open, wherever it came from.
            let kept = keep_dir(cache_dir).join(format!("{}.verity", layer.digest.hex()));
            let blocks = v.hash_offset / BLOCK;
            let tree = match std::fs::read(&kept)
                .ok()
                .and_then(|area| Tree::parse(&area, blocks, &v.root).ok())
            {
                Some(tree) => tree,
                None => {
                    let area = match &tail {
                        Some((from, bytes)) if size - from <= bytes.len() as u64 => {
                            bytes[(v.hash_offset - from) as usize..(size - from) as usize].to_vec()
                        }
                        _ => fetch_tree(&backend, v.hash_offset, size)?,
                    };
                    let tree = Tree::parse(&area, blocks, &v.root)
                        .map_err(|why| format!("its dm-verity tree: {why}"))?;
                    keep(&kept, &area);
                    tree
                }
            };
            let verified = Arc::new(Verified {
                tree,
                hash_offset: v.hash_offset,
            });
            if let Some(h) = head.take().filter(|h| h.len() as u64 == unit) {
                if verified.check(0, &h).is_ok() {
                    preload.push((0, h));
                }
            }
            if let Some((from, bytes)) = &tail {
                // The image's last pieces the tail brought (the very last
                // one shorter, ending where the tree begins, as the image
                // does), each block checked by the tree, for the disk cache.
                let mut at = from.div_ceil(unit) * unit;
                while at < v.hash_offset {
                    let end = (at + unit).min(v.hash_offset);
                    let piece = &bytes[(at - from) as usize..(end - from) as usize];
                    if verified.check(at, piece).is_ok() {
                        preload.push((at, piece.to_vec()));
                    }
                    at = end;
                }
            }
            backend.tree = Some(verified.clone());
            Some(Box::new(CachedCheck::Tree(verified)))
        }
        None if backend.index.compression == Compression::None => {
            Some(Box::new(CachedCheck::Raw(backend.index.clone(), unit)))
        }
        // A zstd chunk's checksum is of its frame, which the cache does
        // not keep: its own sums guard what it holds.
        None => None,
    };
    Ok(Opened {
        identity: layer.digest.to_string(),
        shown,
        chunk: unit as u32,
        backend: Box::new(backend),
        verify,
        preload,
        // Fetched by the tree's blocks, a run of chunks is one request
        // (a registry's request costs far more than 64 KiB of its bytes);
        // by the index's, each chunk is its own, in parallel.
        max_run: if verity_raw {
            (MAX_RUN_BYTES / unit).max(1) as u32
        } else {
            1
        },
    })
}

/// Where a layer's chunk index and dm-verity tree are kept, beside the
/// disk cache of its chunks.
fn keep_dir(cache_dir: &Path) -> PathBuf {
    cache_dir.join("erofs-layers")
}

/// Keeps `bytes` at `path`, whole or not at all; a failure only costs a
/// fetch at the next open.
fn keep(path: &Path, bytes: &[u8]) {
    let kept = path
        .parent()
        .map_or(Ok(()), std::fs::create_dir_all)
        .and_then(|()| {
            let mut tmp = path.as_os_str().to_owned();
            tmp.push(format!(".{}", std::process::id()));
            let tmp = PathBuf::from(tmp);
            std::fs::write(&tmp, bytes)?;
            std::fs::rename(&tmp, path)
        });
    if let Err(e) = kept {
        log::debug!("{}: not kept: {e}", path.display());
    }
}

/// Blob bytes `len` at `at`, fetched at open with a few tries.
fn fetch_at_open(backend: &LayerBackend, at: u64, len: u64) -> Result<Vec<u8>, String> {
    let mut tries = 0;
    loop {
        tries += 1;
        match backend.range(at, len, OPEN_TIMEOUT) {
            Ok(s) => return Ok(s),
            Err(e) if e.transient && tries < OPEN_TRIES => {
                std::thread::sleep(Duration::from_millis(200 * u64::from(tries)))
            }
            Err(e) => return Err(e.message),
        }
    }
}

/// The layer data from `hash_offset` to its end (`size`): the dm-verity
/// hash area, fetched chunk by chunk, each checked by its checksum.
fn fetch_tree(backend: &LayerBackend, hash_offset: u64, size: u64) -> Result<Vec<u8>, String> {
    // By the index's chunks, each fetched once and checked by its checksum.
    let unit = backend.index_unit;
    let from = hash_offset / unit * unit;
    let mut area = Vec::with_capacity((size - from) as usize);
    let head = backend.head(OPEN_TIMEOUT).map_err(|e| e.message)?;
    let mut at = from;
    while at < size {
        let len = unit.min(size - at);
        let mut tries = 0;
        let chunk = loop {
            tries += 1;
            match backend.get(&head, at, len, OPEN_TIMEOUT) {
                Ok(c) => break c,
                Err(e) if e.transient && tries < OPEN_TRIES => {
                    std::thread::sleep(Duration::from_millis(200 * u64::from(tries)))
                }
                Err(e) => {
                    return Err(format!(
                        "its dm-verity tree (bytes {at}-{}): {}",
                        at + len - 1,
                        e.message
                    ))
                }
            }
        };
        area.extend_from_slice(&chunk);
        at += len;
    }
    Ok(area.split_off((hash_offset - from) as usize))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_block_before_the_hash_offset_is_checked_against_the_tree() {
        let blocks = 40u64;
        let data: Vec<u8> = (0..blocks * BLOCK).map(|i| (i % 251) as u8).collect();
        let v = crate::verity::build(&mut &data[..], blocks, [3; 32]).unwrap();
        let verified = Verified {
            tree: Tree::parse(&v.area, blocks, &v.root).unwrap(),
            hash_offset: blocks * BLOCK,
        };
        // A chunk of 16 blocks, and the last one running into the tree.
        assert!(verified.check(0, &data[..16 * 4096]).is_ok());
        let mut tail = data[32 * 4096..].to_vec();
        tail.extend_from_slice(&v.area);
        assert!(verified.check(32 * 4096, &tail).is_ok());
        let mut bad = data[16 * 4096..32 * 4096].to_vec();
        bad[5 * 4096 + 7] ^= 1;
        let e = verified.check(16 * 4096, &bad).unwrap_err();
        assert!(e.contains("block 21"), "{e}");
        // Past the data, the tree's own bytes are left to the checksums.
        let mut tree_bytes = tail.clone();
        let last = tree_bytes.len() - 1;
        tree_bytes[last] ^= 1;
        assert!(verified.check(32 * 4096, &tree_bytes).is_ok());
        // A torn chunk is refused, not read past.
        assert!(verified.check(0, &data[..5000]).is_err());
    }

    #[test]
    fn a_source_says_all_its_descriptor_does() {
        let reference = Reference::parse("docker://127.0.0.1:5000/a/b:t")
            .unwrap()
            .unwrap();
        let layer = NativeLayer {
            digest: Digest::of(b"x"),
            size: 12345,
            zstd: true,
            index_range: Some((1000, 12345)),
            index_digest: Some(Digest::of(b"y")),
            verity: Some(VerityRoot {
                hash_offset: 4096,
                root: [0xab; 32],
            }),
        };
        let s = source(&reference, true, &layer);
        let spec = parse(&s).unwrap();
        assert_eq!(spec.layer, layer);
        assert!(spec.plain_http);
        assert_eq!(spec.reference.host, "127.0.0.1:5000");
        assert_eq!(spec.reference.repository, "a/b");
        let bare = NativeLayer {
            zstd: false,
            index_range: None,
            index_digest: None,
            verity: None,
            ..layer
        };
        let spec = parse(&source(&reference, false, &bare)).unwrap();
        assert_eq!(spec.layer, bare);
        assert!(!spec.plain_http);
        for bad in [
            format!("{SCHEME}h/r:tag;size=1"),
            format!("{SCHEME}h/r@{};size=x", Digest::of(b"x")),
            format!("{SCHEME}h/r@{}", Digest::of(b"x")),
            format!("{SCHEME}h/r@{};size=1;what", Digest::of(b"x")),
        ] {
            assert!(parse(&bad).is_err(), "{bad}");
        }
    }
}
