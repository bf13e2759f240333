//! A digest of a remote object: one SHA-256 per piece, so that a fetched
//! range is checked before it reaches a reader or the disk cache. S3 sends
//! no checksum of a byte range, and the images themselves carry none of
//! their data, so without this a body of the right length with wrong bytes
//! would be served and cached as if it were right.
//!
//! Layout (little-endian): the magic `FOLIODGS`, the version (u32), the
//! piece size as a power of two (u32 shift), the object's size (u64), the
//! number of pieces (u64), one 32-byte SHA-256 per piece, then a SHA-256 of
//! everything before it, so that a damaged digest is refused rather than
//! taken for damaged data.

use sha2::{Digest as _, Sha256};

/// The first bytes of a digest.
pub const MAGIC: &[u8; 8] = b"FOLIODGS";
/// The only version this reads and writes.
pub const VERSION: u32 = 1;
/// The piece size `foliofs digest` writes: the smallest `chunk=`, so that
/// every fetch covers whole pieces whatever the chunk size.
pub const PIECE: u32 = super::options::MIN_CHUNK;
/// The smallest piece size a digest may have.
const MIN_PIECE: u32 = 4096;
const HEADER: usize = 32;
const HASH: usize = 32;
/// The largest digest read: 256 MiB of hashes, 512 GiB in 64 KiB pieces.
/// A digest's size is known from the object's before it is fetched, so
/// a hostile one cannot make this allocate more.
pub const MAX_LEN: u64 = 256 << 20;

/// Why a digest was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DigestError {
    /// The magic is not [`MAGIC`] (or the digest is shorter than a header).
    #[error("not a foliofs digest (bad magic at offset 0)")]
    Magic,
    /// Not [`VERSION`].
    #[error("digest version {0} is not {VERSION}")]
    Version(u32),
    /// A piece size this does not read.
    #[error("piece size 2^{0} is not a power of two from 4 KiB to 64 KiB")]
    Piece(u32),
    /// The digest is of an object of another size.
    #[error("the digest is for an object of {digest} bytes, this one has {object}")]
    Size {
        /// The size the digest names.
        digest: u64,
        /// The object's.
        object: u64,
    },
    /// The piece count does not fit the size.
    #[error("the digest lists {listed} pieces where {size} bytes need {needed}")]
    #[allow(missing_docs)]
    Count { listed: u64, needed: u64, size: u64 },
    /// The digest is cut short or too long for its list.
    #[error("the digest is {got} bytes, {want} expected for its {pieces} pieces")]
    #[allow(missing_docs)]
    Length { got: u64, want: u64, pieces: u64 },
    /// Larger than [`MAX_LEN`].
    #[error("the digest is {0} bytes: more than the {MAX_LEN} read")]
    TooLarge(u64),
    /// Its own hash does not match.
    #[error("the digest's own SHA-256 (at offset {0}) does not match: it is damaged")]
    Damaged(u64),
}

/// A parsed, checked digest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Digest {
    piece: u64,
    size: u64,
    hashes: Vec<[u8; HASH]>,
}

/// The length of the digest of `size` bytes in pieces of `piece`.
pub fn encoded_len(size: u64, piece: u64) -> u64 {
    (HEADER + HASH) as u64 + size.div_ceil(piece) * HASH as u64
}

impl Digest {
    /// The digest of `data` in pieces of `piece` bytes (a power of two).
    pub fn of_reader(mut r: impl std::io::Read, piece: u32) -> std::io::Result<Digest> {
        assert!(piece.is_power_of_two());
        let mut hashes = Vec::new();
        let mut buf = vec![0u8; piece as usize];
        let mut size = 0u64;
        loop {
            let mut n = 0;
            while n < buf.len() {
                match r.read(&mut buf[n..]) {
                    Ok(0) => break,
                    Ok(k) => n += k,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            if n == 0 {
                break;
            }
            size += n as u64;
            hashes.push(Sha256::digest(&buf[..n]).into());
            if n < buf.len() {
                break;
            }
        }
        Ok(Digest {
            piece: u64::from(piece),
            size,
            hashes,
        })
    }

    /// The encoded digest.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(encoded_len(self.size, self.piece) as usize);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&VERSION.to_le_bytes());
        out.extend_from_slice(&self.piece.trailing_zeros().to_le_bytes());
        out.extend_from_slice(&self.size.to_le_bytes());
        out.extend_from_slice(&(self.hashes.len() as u64).to_le_bytes());
        for h in &self.hashes {
            out.extend_from_slice(h);
        }
        let own = Sha256::digest(&out);
        out.extend_from_slice(&own);
        out
    }

    /// Parses `bytes` as the digest of an object of `object_size` bytes.
    pub fn parse(bytes: &[u8], object_size: u64) -> Result<Digest, DigestError> {
        let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap());
        if bytes.len() < HEADER + HASH || &bytes[..8] != MAGIC {
            return Err(DigestError::Magic);
        }
        let version = u32_at(8);
        if version != VERSION {
            return Err(DigestError::Version(version));
        }
        let shift = u32_at(12);
        if !(MIN_PIECE.trailing_zeros()..=PIECE.trailing_zeros()).contains(&shift) {
            return Err(DigestError::Piece(shift));
        }
        let piece = 1u64 << shift;
        let size = u64_at(16);
        let listed = u64_at(24);
        let needed = size.div_ceil(piece);
        if listed != needed {
            return Err(DigestError::Count {
                listed,
                needed,
                size,
            });
        }
        let want = encoded_len(size, piece);
        if bytes.len() as u64 != want {
            return Err(DigestError::Length {
                got: bytes.len() as u64,
                want,
                pieces: listed,
            });
        }
        let body = bytes.len() - HASH;
        if Sha256::digest(&bytes[..body])[..] != bytes[body..] {
            return Err(DigestError::Damaged(body as u64));
        }
        if size != object_size {
            return Err(DigestError::Size {
                digest: size,
                object: object_size,
            });
        }
        let hashes = bytes[HEADER..body]
            .chunks_exact(HASH)
            .map(|h| h.try_into().unwrap())
            .collect();
        Ok(Digest {
            piece,
            size,
            hashes,
        })
    }

    /// The object's size.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Bytes per piece.
    pub fn piece(&self) -> u64 {
        self.piece
    }

    /// Checks `data`, the object's bytes from `start`: `start` must be on a
    /// piece boundary and `data` must end on one or at the object's end.
    /// `Err` names the first piece whose bytes do not match.
    pub fn check(&self, start: u64, data: &[u8]) -> Result<(), String> {
        let end = start + data.len() as u64;
        if !start.is_multiple_of(self.piece)
            || (!end.is_multiple_of(self.piece) && end != self.size)
            || end > self.size
        {
            return Err(format!(
                "bytes {start}-{end} are not whole pieces of {} of an object of {}",
                self.piece, self.size
            ));
        }
        for (i, bytes) in data.chunks(self.piece as usize).enumerate() {
            let p = start / self.piece + i as u64;
            if Sha256::digest(bytes)[..] != self.hashes[p as usize] {
                let at = p * self.piece;
                return Err(format!(
                    "bytes {at}-{} do not match the digest (piece {p})",
                    at + bytes.len() as u64 - 1
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    #[test]
    fn round_trip_and_piece_check() {
        for n in [0, 1, 4096, 65536, 65537, 300_000] {
            let d = data(n);
            let g = Digest::of_reader(&d[..], PIECE).unwrap();
            let bytes = g.to_bytes();
            assert_eq!(bytes.len() as u64, encoded_len(n as u64, PIECE.into()));
            let p = Digest::parse(&bytes, n as u64).unwrap();
            assert_eq!(p, g);
            assert_eq!(p.check(0, &d), Ok(()));
            if n > 131_072 {
                assert_eq!(p.check(65536, &d[65536..]), Ok(()));
                let mut bad = d.clone();
                bad[65536 + 5] ^= 1;
                let e = p.check(0, &bad).unwrap_err();
                assert!(
                    e.contains("bytes 65536-131071") && e.contains("piece 1"),
                    "{e}"
                );
                // Not on a piece boundary, or not ending on one.
                assert!(p
                    .check(1, &d[1..])
                    .unwrap_err()
                    .contains("not whole pieces"));
                assert!(p
                    .check(0, &d[..1000])
                    .unwrap_err()
                    .contains("not whole pieces"));
            }
        }
    }

    #[test]
    fn hostile_digests_are_refused_by_name() {
        let d = data(200_000);
        let good = Digest::of_reader(&d[..], PIECE).unwrap().to_bytes();
        let n = d.len() as u64;
        let with = |f: &dyn Fn(&mut Vec<u8>)| {
            let mut b = good.clone();
            f(&mut b);
            Digest::parse(&b, n)
        };
        assert_eq!(with(&|b| b[0] = b'X'), Err(DigestError::Magic));
        assert_eq!(with(&|b| b.truncate(10)), Err(DigestError::Magic));
        assert_eq!(Digest::parse(&[], n), Err(DigestError::Magic));
        assert_eq!(with(&|b| b[8] = 9), Err(DigestError::Version(9)));
        assert_eq!(with(&|b| b[12] = 20), Err(DigestError::Piece(20)));
        assert_eq!(with(&|b| b[12] = 11), Err(DigestError::Piece(11)));
        assert!(matches!(
            with(&|b| b[24] = 200),
            Err(DigestError::Count {
                listed: 200,
                needed: 4,
                ..
            })
        ));
        // A huge size with a matching count: refused by length, with no
        // allocation by what it claims.
        assert!(matches!(
            with(&|b| {
                b[16..24].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
                b[24..32].copy_from_slice(&((u64::MAX / 2).div_ceil(65536)).to_le_bytes());
            }),
            Err(DigestError::Length { .. })
        ));
        assert!(matches!(
            with(&|b| b.truncate(b.len() - 1)),
            Err(DigestError::Length { .. })
        ));
        assert!(matches!(
            with(&|b| b[40] ^= 1),
            Err(DigestError::Damaged(_))
        ));
        let last = good.len() - 1;
        assert!(matches!(
            with(&|b| b[last] ^= 1),
            Err(DigestError::Damaged(_))
        ));
        assert_eq!(
            Digest::parse(&good, n + 1),
            Err(DigestError::Size {
                digest: n,
                object: n + 1
            })
        );
        // Every truncation is an error, never a panic.
        for len in 0..good.len() {
            assert!(Digest::parse(&good[..len], n).is_err(), "{len}");
        }
    }
}
