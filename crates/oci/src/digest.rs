//! Content digests: `sha256:` and 64 hex digits, as OCI names blobs, and a
//! reader that hashes what passes through it so a blob is checked as it
//! is used, never read twice.

use std::io::{self, Read};

use sha2::{Digest as _, Sha256};

use crate::OciError;

/// A SHA-256 digest, as OCI writes it (`sha256:<64 lower-case hex>`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest {
    hex: String,
}

impl Digest {
    /// Parses `sha256:HEX`; any other algorithm, or a malformed digest
    /// (which could name a path outside the blobs), is refused.
    pub fn parse(s: &str) -> Result<Digest, OciError> {
        let bad = |why: &str| OciError::Digest {
            digest: s.chars().take(100).collect(),
            why: why.into(),
        };
        let hex = s
            .strip_prefix("sha256:")
            .ok_or_else(|| bad("only sha256 digests are read"))?;
        if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(bad("expected 64 lower-case hex digits after sha256:"));
        }
        Ok(Digest { hex: hex.into() })
    }

    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest::from_hasher(Sha256::new_with_prefix(bytes))
    }

    pub(crate) fn from_hasher(h: Sha256) -> Digest {
        let hex = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
        Digest { hex }
    }

    /// The 64 hex digits.
    pub fn hex(&self) -> &str {
        &self.hex
    }
}

impl std::fmt::Display for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "sha256:{}", self.hex)
    }
}

/// A reader that hashes and counts every byte read through it.
pub struct Hashing<R> {
    inner: R,
    hash: Sha256,
    /// Bytes read so far.
    pub bytes: u64,
}

impl<R: Read> Hashing<R> {
    /// Hashes what is read from `inner`.
    pub fn new(inner: R) -> Self {
        Hashing {
            inner,
            hash: Sha256::new(),
            bytes: 0,
        }
    }

    /// Reads the rest, then the digest of everything read.
    pub fn finish(mut self) -> io::Result<(Digest, u64)> {
        io::copy(&mut self, &mut io::sink())?;
        Ok((Digest::from_hasher(self.hash), self.bytes))
    }
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_parse_strictly_and_hash_what_passes() {
        let empty = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        assert_eq!(Digest::parse(empty).unwrap(), Digest::of(b""));
        for bad in [
            "sha512:00",
            "sha256:E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855",
            "sha256:../../etc/passwd",
            "sha256:e3b0",
        ] {
            assert!(Digest::parse(bad).is_err(), "{bad}");
        }
        let mut h = Hashing::new(&b"abc"[..]);
        let mut one = [0u8; 1];
        h.read_exact(&mut one).unwrap();
        let (d, n) = h.finish().unwrap();
        assert_eq!((d, n), (Digest::of(b"abc"), 3));
    }
}
