//! The chunk index of an EROFS layer blob (erofs-image-spec §3.4,
//! `application/vnd.erofs.chunk-index.v1`): a 32-byte header (magic
//! `CD E4 EC 67`, version 1, compression, flags, uncompressed size, chunk
//! count, hash algorithm and size, reserved bytes) and one entry per
//! chunk (its blob offset, its offset in the uncompressed image data, and
//! a checksum over its bytes as stored in the blob). Written by `foliofs
//! push`; read back, every field checked, for whatever reads a layer by
//! chunks (a lazy mount).
//!
//! What the spec leaves open, and what this does:
//! - entries in order: the spec derives a zstd chunk's on-blob length
//!   from the next entry's offset, which only means something when the
//!   offsets rise, so both offsets must rise strictly from entry to
//!   entry (and a raw chunk's blob range must lie before the index);
//! - `UncompressedSize` 0 goes with no chunks (§3.4.6) and no chunks with
//!   size 0: a chunk of no bytes is refused, as is an index claiming
//!   bytes that no chunk holds;
//! - the payload is taken whole (its length must be exactly
//!   `32 + NumChunks * entrySize`, §3.4.4) and at most [`MAX_PAYLOAD`]
//!   bytes are ever read, whatever a header claims.

use std::io::{Read, Seek, SeekFrom};

use sha2::{Digest as _, Sha256, Sha512};

/// The chunk index's media type.
pub const MEDIA_TYPE: &str = "application/vnd.erofs.chunk-index.v1";
/// The header's first four bytes.
pub const MAGIC: [u8; 4] = [0xCD, 0xE4, 0xEC, 0x67];
/// The only version there is.
pub const VERSION: u8 = 1;
/// The header's size.
pub const HEADER: usize = 32;
/// Largest payload read: a 64 GiB layer in 1 MiB chunks with SHA-512
/// checksums is 5 MiB of index, so this is far past any real one and
/// still a bound on what a hostile annotation can make a reader allocate.
pub const MAX_PAYLOAD: u64 = 64 << 20;
/// The first and last magic numbers of a zstd skippable frame.
pub const SKIPPABLE_FIRST: u32 = 0x184D_2A50;
const SKIPPABLE_LAST: u32 = 0x184D_2A5F;

/// How each chunk's bytes are stored in the blob.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    /// Raw bytes (an `application/vnd.erofs` layer).
    None,
    /// One zstd frame per chunk (`application/vnd.erofs+zstd`).
    Zstd,
}

/// One chunk: where its bytes start in the blob and in the image data,
/// and the checksum of its on-blob bytes (empty without checksums).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// `BlockOffset`: its first byte in the blob.
    pub blob_offset: u64,
    /// `UncompressedOffset`: its first byte in the image data.
    pub uncompressed_offset: u64,
    /// `Checksum`: SHA-256 or SHA-512 of its on-blob bytes, or nothing.
    pub checksum: Vec<u8>,
}

/// A chunk index, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkIndex {
    /// How chunks are stored.
    pub compression: Compression,
    /// `UncompressedSize`: the image data's size.
    pub uncompressed_size: u64,
    /// `HashSize`: 0 (no checksums), 32 (SHA-256) or 64 (SHA-512).
    pub hash_size: u8,
    /// The chunks, in order.
    pub entries: Vec<Entry>,
    /// Where the index starts in its blob (`chunkIndexStart`, the end of
    /// the last zstd chunk); the blob's size for a standalone index.
    pub index_start: u64,
}

/// A chunk index that is not one: the field, its byte offset within the
/// payload (the 32-byte header and the entries), and what is wrong.
#[derive(Debug, thiserror::Error)]
#[error("chunk index: {field} at byte {offset}: {why}")]
pub struct ChunkIndexError {
    /// The field (`Magic`, `entry[3].BlockOffset`, ...).
    pub field: String,
    /// Its offset in the payload.
    pub offset: u64,
    /// What is wrong with it.
    pub why: String,
}

fn bad(field: impl Into<String>, offset: u64, why: impl Into<String>) -> ChunkIndexError {
    ChunkIndexError {
        field: field.into(),
        offset,
        why: why.into(),
    }
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

impl ChunkIndex {
    /// The bytes of one entry.
    pub fn entry_size(&self) -> usize {
        16 + usize::from(self.hash_size)
    }

    /// The payload: header and entries, as §3.4.1 and §3.4.2 lay them out.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(HEADER + self.entries.len() * self.entry_size());
        v.extend_from_slice(&MAGIC);
        v.push(VERSION);
        v.push(match self.compression {
            Compression::None => 0,
            Compression::Zstd => 1,
        });
        v.extend_from_slice(&0u16.to_le_bytes());
        v.extend_from_slice(&self.uncompressed_size.to_le_bytes());
        v.extend_from_slice(&(self.entries.len() as u32).to_le_bytes());
        v.push(u8::from(self.hash_size != 0));
        v.push(self.hash_size);
        v.extend_from_slice(&[0u8; 10]);
        for e in &self.entries {
            v.extend_from_slice(&e.blob_offset.to_le_bytes());
            v.extend_from_slice(&e.uncompressed_offset.to_le_bytes());
            v.extend_from_slice(&e.checksum);
        }
        v
    }

    /// The payload `b`, every field checked, for a blob whose index
    /// starts at `index_start` (a standalone index: the indexed blob's
    /// size, for the last zstd chunk's length).
    pub fn parse(b: &[u8], index_start: u64) -> Result<ChunkIndex, ChunkIndexError> {
        if b.len() as u64 > MAX_PAYLOAD {
            return Err(bad(
                "payload",
                0,
                format!("{} bytes, over {MAX_PAYLOAD}", b.len()),
            ));
        }
        if b.len() < HEADER {
            return Err(bad(
                "header",
                0,
                format!("{} bytes, shorter than the {HEADER}-byte header", b.len()),
            ));
        }
        if b[0..4] != MAGIC {
            return Err(bad(
                "Magic",
                0,
                format!("{:02x?}, not CD E4 EC 67", &b[0..4]),
            ));
        }
        if b[4] != VERSION {
            return Err(bad("Version", 4, format!("{}, not 1", b[4])));
        }
        let compression = match b[5] {
            0 => Compression::None,
            1 => Compression::Zstd,
            c => {
                return Err(bad(
                    "CompressionType",
                    5,
                    format!("{c}, neither 0 (none) nor 1 (zstd)"),
                ))
            }
        };
        let flags = u16::from_le_bytes([b[6], b[7]]);
        if flags != 0 {
            return Err(bad(
                "Flags",
                6,
                format!("{flags:#06x}: no flag is defined in version 1"),
            ));
        }
        let uncompressed_size = u64_at(b, 8);
        let n = u32::from_le_bytes([b[16], b[17], b[18], b[19]]);
        let hash_size = match (b[20], b[21]) {
            (0, 0) => 0,
            (1, s @ (32 | 64)) => s,
            (0, s) => {
                return Err(bad(
                    "HashSize",
                    21,
                    format!("{s}, but HashAlgo 0 (none) has size 0"),
                ))
            }
            (1, s) => {
                return Err(bad(
                    "HashSize",
                    21,
                    format!("{s}: SHA-2 is 32 (SHA-256) or 64 (SHA-512)"),
                ))
            }
            (a, _) => {
                return Err(bad(
                    "HashAlgo",
                    20,
                    format!("{a}, neither 0 (none) nor 1 (SHA-2)"),
                ))
            }
        };
        if let Some(i) = b[22..32].iter().position(|&x| x != 0) {
            return Err(bad(
                "Reserved",
                22 + i as u64,
                format!("{:#04x}, not 0", b[22 + i]),
            ));
        }
        let entry = 16 + u64::from(hash_size);
        let want = HEADER as u64 + u64::from(n) * entry;
        if b.len() as u64 != want {
            return Err(bad(
                "NumChunks",
                16,
                format!(
                    "{n} entries of {entry} bytes make a {want}-byte payload, but it is {} bytes",
                    b.len()
                ),
            ));
        }
        if (n == 0) != (uncompressed_size == 0) {
            return Err(bad(
                "NumChunks",
                16,
                format!("{n} chunks for an image of {uncompressed_size} bytes"),
            ));
        }
        let mut entries = Vec::with_capacity(n as usize);
        for i in 0..n as usize {
            let at = HEADER + i * entry as usize;
            entries.push(Entry {
                blob_offset: u64_at(b, at),
                uncompressed_offset: u64_at(b, at + 8),
                checksum: b[at + 16..at + entry as usize].to_vec(),
            });
        }
        let index = ChunkIndex {
            compression,
            uncompressed_size,
            hash_size,
            entries,
            index_start,
        };
        index.check_entries()?;
        Ok(index)
    }

    /// The entries' offsets: rising, within the image data and before
    /// the index.
    fn check_entries(&self) -> Result<(), ChunkIndexError> {
        let entry = self.entry_size() as u64;
        let at = |i: usize, field: u64| HEADER as u64 + i as u64 * entry + field;
        for (i, e) in self.entries.iter().enumerate() {
            let prev = i.checked_sub(1).map(|p| &self.entries[p]);
            let field = |f: &str| format!("entry[{i}].{f}");
            match prev {
                None if e.uncompressed_offset != 0 => {
                    return Err(bad(
                        field("UncompressedOffset"),
                        at(i, 8),
                        format!("{}, but the first chunk starts at 0", e.uncompressed_offset),
                    ))
                }
                Some(p) if e.uncompressed_offset <= p.uncompressed_offset => {
                    return Err(bad(
                        field("UncompressedOffset"),
                        at(i, 8),
                        format!(
                            "{}, not past the previous chunk's {}",
                            e.uncompressed_offset, p.uncompressed_offset
                        ),
                    ))
                }
                _ => {}
            }
            if e.uncompressed_offset >= self.uncompressed_size {
                return Err(bad(
                    field("UncompressedOffset"),
                    at(i, 8),
                    format!(
                        "{}, past the image data's {} bytes",
                        e.uncompressed_offset, self.uncompressed_size
                    ),
                ));
            }
        }
        // Lengths come from the next entry's offsets: all are checked
        // above before any length is taken.
        for (i, e) in self.entries.iter().enumerate() {
            let prev = i.checked_sub(1).map(|p| &self.entries[p]);
            let field = |f: &str| format!("entry[{i}].{f}");
            if let (Compression::Zstd, Some(p)) = (self.compression, prev) {
                if e.blob_offset <= p.blob_offset {
                    return Err(bad(
                        field("BlockOffset"),
                        at(i, 0),
                        format!(
                            "{}, not past the previous frame's {}",
                            e.blob_offset, p.blob_offset
                        ),
                    ));
                }
            }
            let (start, len) = (e.blob_offset, self.blob_len(i));
            let fits = match self.compression {
                Compression::None => start
                    .checked_add(len)
                    .is_some_and(|end| end <= self.index_start),
                Compression::Zstd => start < self.index_start,
            };
            if !fits {
                return Err(bad(
                    field("BlockOffset"),
                    at(i, 0),
                    format!(
                        "{start} (+{len} bytes) is not before the index at {}",
                        self.index_start
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Chunk `i`'s bytes in the blob: offset and length (§3.4.2).
    pub fn blob_range(&self, i: usize) -> (u64, u64) {
        (self.entries[i].blob_offset, self.blob_len(i))
    }

    fn blob_len(&self, i: usize) -> u64 {
        match self.compression {
            Compression::None => self.uncompressed_range(i).1,
            Compression::Zstd => {
                let next = self
                    .entries
                    .get(i + 1)
                    .map_or(self.index_start, |e| e.blob_offset);
                next.saturating_sub(self.entries[i].blob_offset)
            }
        }
    }

    /// Chunk `i`'s bytes in the image data: offset and length.
    pub fn uncompressed_range(&self, i: usize) -> (u64, u64) {
        let start = self.entries[i].uncompressed_offset;
        let end = self
            .entries
            .get(i + 1)
            .map_or(self.uncompressed_size, |e| e.uncompressed_offset);
        (start, end - start)
    }

    /// Whether `bytes`, chunk `i` as read from the blob, have its
    /// checksum (true without checksums).
    pub fn checks(&self, i: usize, bytes: &[u8]) -> bool {
        let want = &self.entries[i].checksum;
        match self.hash_size {
            32 => Sha256::digest(bytes).as_slice() == want.as_slice(),
            64 => Sha512::digest(bytes).as_slice() == want.as_slice(),
            _ => true,
        }
    }
}

/// `org.erofs.chunk-index.range` (`offset[:end]`, §2.3) of a blob of
/// `blob_size` bytes: the section's offset and end, end defaulting to the
/// blob's end.
pub fn parse_range(value: &str, blob_size: u64) -> Result<(u64, u64), ChunkIndexError> {
    let field = "org.erofs.chunk-index.range";
    let num = |s: &str| -> Result<u64, ChunkIndexError> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad(field, 0, format!("{value:?} is not OFFSET[:END]")));
        }
        s.parse()
            .map_err(|_| bad(field, 0, format!("{value:?}: {s} is too large")))
    };
    let (start, end) = match value.split_once(':') {
        Some((s, e)) => (num(s)?, num(e)?),
        None => (num(value)?, blob_size),
    };
    if start > end || end > blob_size {
        return Err(bad(
            field,
            0,
            format!("{value:?} is not a range within the blob's {blob_size} bytes"),
        ));
    }
    Ok((start, end))
}

/// The chunk index embedded in `blob` (of `blob_size` bytes) at `range`
/// (the annotation's value): the raw payload for a raw layer, the payload
/// of a zstd skippable frame for a `+zstd` one; checked against `digest`
/// (the `org.erofs.chunk-index.digest` annotation) when given, and
/// against the layer's compression. Reads at most [`MAX_PAYLOAD`] bytes.
pub fn read_embedded<R: Read + Seek>(
    blob: &mut R,
    blob_size: u64,
    range: &str,
    zstd: bool,
    digest: Option<&crate::Digest>,
) -> Result<ChunkIndex, crate::OciError> {
    let (start, end) = parse_range(range, blob_size)?;
    let len = end - start;
    if len > MAX_PAYLOAD + 8 {
        return Err(bad("payload", 0, format!("{len} bytes, over {MAX_PAYLOAD}")).into());
    }
    let io = |e: std::io::Error| crate::OciError::Io {
        what: format!("the chunk index at {start}..{end}"),
        source: e,
    };
    blob.seek(SeekFrom::Start(start)).map_err(io)?;
    let mut raw = Vec::with_capacity(len as usize);
    blob.take(len).read_to_end(&mut raw).map_err(io)?;
    if raw.len() as u64 != len {
        return Err(io(std::io::ErrorKind::UnexpectedEof.into()));
    }
    from_section(&raw, start, zstd, digest)
}

/// The chunk index in `raw`, the bytes of its section (which starts at
/// `start` of the blob), as [`read_embedded`] checks it.
pub fn from_section(
    raw: &[u8],
    start: u64,
    zstd: bool,
    digest: Option<&crate::Digest>,
) -> Result<ChunkIndex, crate::OciError> {
    let len = raw.len() as u64;
    let payload = if zstd {
        if raw.len() < 8 {
            return Err(bad("skippable frame", 0, "shorter than its 8-byte header").into());
        }
        let magic = u32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]);
        if !(SKIPPABLE_FIRST..=SKIPPABLE_LAST).contains(&magic) {
            return Err(bad(
                "skippable frame",
                0,
                format!("magic {magic:#010x} is not a zstd skippable frame's"),
            )
            .into());
        }
        let size = u32::from_le_bytes([raw[4], raw[5], raw[6], raw[7]]);
        if u64::from(size) != len - 8 {
            return Err(bad(
                "skippable frame",
                4,
                format!("frame size {size}, but the range holds {} bytes", len - 8),
            )
            .into());
        }
        &raw[8..]
    } else {
        raw
    };
    if let Some(want) = digest {
        let got = crate::Digest::of(payload);
        if &got != want {
            return Err(crate::OciError::Mismatch {
                what: "the chunk index (org.erofs.chunk-index.digest)".into(),
                want: want.clone(),
                got,
            });
        }
    }
    let index = ChunkIndex::parse(payload, start)?;
    let expected = if zstd {
        Compression::Zstd
    } else {
        Compression::None
    };
    if index.compression != expected {
        return Err(bad(
            "CompressionType",
            5,
            format!(
                "{:?}, but the layer is {}",
                index.compression,
                if zstd { "+zstd" } else { "raw" }
            ),
        )
        .into());
    }
    Ok(index)
}

/// A zstd skippable frame (magic `0x184D2A50`) around `payload`.
pub fn skippable_frame(payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(8 + payload.len());
    v.extend_from_slice(&SKIPPABLE_FIRST.to_le_bytes());
    v.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    v.extend_from_slice(payload);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> (ChunkIndex, Vec<u8>) {
        let blob: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        let chunks = [(0u64, 4096u64), (4096, 4096), (8192, 10_000 - 8192)];
        let entries = chunks
            .iter()
            .map(|&(o, l)| Entry {
                blob_offset: o,
                uncompressed_offset: o,
                checksum: Sha256::digest(&blob[o as usize..(o + l) as usize]).to_vec(),
            })
            .collect();
        (
            ChunkIndex {
                compression: Compression::None,
                uncompressed_size: 10_000,
                hash_size: 32,
                entries,
                index_start: 10_000,
            },
            blob,
        )
    }

    #[test]
    fn an_index_encodes_and_parses_back_and_checks_its_chunks() {
        let (idx, blob) = sample();
        let b = idx.encode();
        assert_eq!(b.len(), 32 + 3 * 48);
        assert_eq!(&b[0..8], &[0xCD, 0xE4, 0xEC, 0x67, 1, 0, 0, 0]);
        let back = ChunkIndex::parse(&b, 10_000).unwrap();
        assert_eq!(back, idx);
        for i in 0..3 {
            let (o, l) = back.blob_range(i);
            assert!(back.checks(i, &blob[o as usize..(o + l) as usize]));
        }
        assert_eq!(back.blob_range(2), (8192, 10_000 - 8192));
        assert!(!back.checks(0, &blob[1..4097]));
    }

    #[test]
    fn an_empty_layer_has_no_chunks() {
        let idx = ChunkIndex {
            compression: Compression::Zstd,
            uncompressed_size: 0,
            hash_size: 0,
            entries: vec![],
            index_start: 0,
        };
        assert_eq!(ChunkIndex::parse(&idx.encode(), 0).unwrap(), idx);
    }

    /// Each damage, and the field and offset the error names.
    #[test]
    fn every_bad_field_is_named_with_its_offset() {
        let (idx, _) = sample();
        let good = idx.encode();
        type Damage = Box<dyn Fn(&mut Vec<u8>)>;
        let cases: Vec<(Damage, &str, u64)> = vec![
            (Box::new(|b| b[0] = 0), "Magic", 0),
            (Box::new(|b| b[4] = 2), "Version", 4),
            (Box::new(|b| b[5] = 2), "CompressionType", 5),
            (Box::new(|b| b[7] = 1), "Flags", 6),
            (Box::new(|b| b[20] = 2), "HashAlgo", 20),
            (Box::new(|b| b[21] = 48), "HashSize", 21),
            (Box::new(|b| b[20] = 0), "HashSize", 21),
            (Box::new(|b| b[27] = 1), "Reserved", 27),
            (Box::new(|b| b[16] = 4), "NumChunks", 16),
            (Box::new(|b| b.truncate(100)), "NumChunks", 16),
            (Box::new(|b| b.truncate(20)), "header", 0),
            (
                Box::new(|b| b[32 + 8] = 1),
                "entry[0].UncompressedOffset",
                40,
            ),
            (
                Box::new(|b| b[32 + 48 + 9] = 0),
                "entry[1].UncompressedOffset",
                88,
            ),
            (
                Box::new(|b| b[32 + 96 + 9] = 0xff),
                "entry[2].UncompressedOffset",
                136,
            ),
            (
                Box::new(|b| b[32 + 96 + 1] = 0x30),
                "entry[2].BlockOffset",
                128,
            ),
            (Box::new(|b| b[8] = 0x20), "entry[2].BlockOffset", 128),
            (
                Box::new(|b| b[32 + 48..32 + 56].copy_from_slice(&u64::MAX.to_le_bytes())),
                "entry[1].BlockOffset",
                80,
            ),
        ];
        for (damage, field, offset) in cases {
            let mut b = good.clone();
            damage(&mut b);
            let e = ChunkIndex::parse(&b, 10_000).unwrap_err();
            assert_eq!((e.field.as_str(), e.offset), (field, offset), "{e}");
            assert!(e.to_string().starts_with("chunk index: "), "{e}");
        }
    }

    #[test]
    fn zstd_frames_must_rise_and_end_before_the_index() {
        let idx = ChunkIndex {
            compression: Compression::Zstd,
            uncompressed_size: 8192,
            hash_size: 0,
            entries: vec![
                Entry {
                    blob_offset: 0,
                    uncompressed_offset: 0,
                    checksum: vec![],
                },
                Entry {
                    blob_offset: 100,
                    uncompressed_offset: 4096,
                    checksum: vec![],
                },
            ],
            index_start: 150,
        };
        let b = idx.encode();
        let back = ChunkIndex::parse(&b, 150).unwrap();
        assert_eq!(back.blob_range(0), (0, 100));
        assert_eq!(back.blob_range(1), (100, 50));
        let e = ChunkIndex::parse(&b, 100).unwrap_err();
        assert_eq!(e.field, "entry[1].BlockOffset");
        let mut b2 = b.clone();
        b2[32 + 16] = 0;
        let e = ChunkIndex::parse(&b2, 150).unwrap_err();
        assert_eq!(e.field, "entry[1].BlockOffset");
    }

    #[test]
    fn ranges_and_embedded_frames_are_checked() {
        assert_eq!(parse_range("10:20", 30).unwrap(), (10, 20));
        assert_eq!(parse_range("10", 30).unwrap(), (10, 30));
        for v in [
            "",
            ":",
            "a:1",
            "20:10",
            "10:31",
            "-1",
            "99999999999999999999",
        ] {
            assert!(parse_range(v, 30).is_err(), "{v}");
        }
        let (idx, mut blob) = sample();
        let payload = idx.encode();
        let start = blob.len();
        blob.extend_from_slice(&skippable_frame(&payload));
        let range = format!("{start}:{}", blob.len());
        let mut c = std::io::Cursor::new(&blob);
        // A raw index inside a frame, read as +zstd: the frame is
        // right, the compression is not the layer's.
        let e = read_embedded(&mut c, blob.len() as u64, &range, true, None).unwrap_err();
        assert!(e.to_string().contains("CompressionType"), "{e}");
        let e = read_embedded(&mut c, blob.len() as u64, &range, false, None).unwrap_err();
        assert!(e.to_string().contains("Magic"), "{e}");
        let other = crate::Digest::of(b"x");
        let e = read_embedded(&mut c, blob.len() as u64, &range, true, Some(&other)).unwrap_err();
        assert!(e.to_string().contains("digest"), "{e}");
        let mut bad_frame = blob.clone();
        bad_frame[start + 4] ^= 1;
        let mut c = std::io::Cursor::new(&bad_frame);
        let e = read_embedded(&mut c, blob.len() as u64, &range, true, None).unwrap_err();
        assert!(e.to_string().contains("frame size"), "{e}");
    }
}
