//! LZ4: its configuration record and its decoder (`lz4_flex`'s safe one).
//!
//! LZ4 is the one algorithm an image may store without zero padding
//! (before LZ4_0PADDING): its stream then starts at the cluster's first
//! byte and has no end of its own but where a decode yields the extent.

use crate::error::{ConfigProblem, Decode};
use zerocopy::FromBytes;

use crate::format::{z_erofs_lz4_cfgs, Algorithm, MAX_DECODED, MAX_PCLUSTER};

/// How many trailing-zero trims are tried on an LZ4 cluster written without
/// 0PADDING before it is declared corrupt.
const MAX_TRIMS: usize = 64;

/// LZ4's configuration record (or, without records, the superblock's
/// max distance).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Lz4Config {
    /// Longest match distance the compressor used (0 = the LZ4 default).
    pub max_distance: u16,
    /// Largest physical cluster, in blocks (0 = not recorded).
    pub max_pclusterblks: u16,
}

impl Lz4Config {
    /// Parses the record's bytes, validated as the kernel validates them:
    /// physical clusters of at most 1 MiB at the image's block size.
    pub(crate) fn parse(rec: &[u8], blkszbits: u8) -> Result<Lz4Config, ConfigProblem> {
        // A longer record is taken: room for fields to come.
        super::record_size(rec, size_of::<z_erofs_lz4_cfgs>(), false)?;
        let (r, _) = z_erofs_lz4_cfgs::read_from_prefix(rec).expect("the size was checked");
        let c = Lz4Config {
            max_distance: r.max_distance.get(),
            max_pclusterblks: r.max_pclusterblks.get(),
        };
        if u64::from(c.max_pclusterblks) > MAX_PCLUSTER >> blkszbits {
            return Err(ConfigProblem::Lz4PclusterBlocks {
                blocks: c.max_pclusterblks,
            });
        }
        Ok(c)
    }
}

fn error(e: lz4_flex::block::DecompressError) -> Decode {
    Decode::Invalid {
        algorithm: Algorithm::Lz4,
        reason: e.to_string(),
    }
}

/// A right-aligned LZ4 stream that must yield at least `llen` bytes; `out`
/// may take more.
pub(super) fn full(stream: &[u8], out: &mut [u8], llen: usize) -> Result<(), Decode> {
    let n = lz4_flex::block::decompress_into(stream, out).map_err(error)?;
    if n < llen {
        return Err(Decode::Short {
            algorithm: Algorithm::Lz4,
            decoded: n,
            llen,
        });
    }
    Ok(())
}

/// The first `dst.len()` bytes of an LZ4 stream that may go on. The LZ4
/// decoder only decodes whole blocks, so the stream's full length is found
/// by walking its tokens first.
pub(super) fn partial(stream: &[u8], dst: &mut [u8]) -> Result<(), Decode> {
    let total = decoded_len(stream).ok_or(Decode::Invalid {
        algorithm: Algorithm::Lz4,
        reason: "the token sequence runs past the stream".into(),
    })?;
    if total < dst.len() {
        return Err(Decode::Short {
            algorithm: Algorithm::Lz4,
            decoded: total,
            llen: dst.len(),
        });
    }
    if total == dst.len() {
        return full(stream, dst, total);
    }
    if total > MAX_DECODED {
        return Err(Decode::TooLong {
            llen: total,
            most: MAX_DECODED,
        });
    }
    let mut whole = vec![0u8; total];
    full(stream, &mut whole, total)?;
    dst.copy_from_slice(&whole[..dst.len()]);
    Ok(())
}

/// How many bytes an LZ4 block decodes to, from its tokens alone (`None`
/// if they run past its end). Each token costs at least one input byte, so
/// the walk is bounded by the stream's length.
pub(super) fn decoded_len(stream: &[u8]) -> Option<usize> {
    let mut at = 0usize;
    let mut total = 0usize;
    // A length nibble of 15 continues in bytes until one is below 255.
    let extend = |at: &mut usize, mut n: usize| -> Option<usize> {
        loop {
            let b = *stream.get(*at)?;
            *at += 1;
            n = n.checked_add(usize::from(b))?;
            if b != 255 {
                return Some(n);
            }
        }
    };
    loop {
        let token = *stream.get(at)?;
        at += 1;
        let mut literals = usize::from(token >> 4);
        if literals == 15 {
            literals = extend(&mut at, literals)?;
        }
        at = at.checked_add(literals)?;
        total = total.checked_add(literals)?;
        // The last sequence is literals only.
        if at == stream.len() {
            return Some(total);
        }
        if at + 2 > stream.len() {
            return None;
        }
        at += 2;
        let mut matched = usize::from(token & 15);
        if matched == 15 {
            matched = extend(&mut at, matched)?;
        }
        total = total.checked_add(matched + 4)?;
    }
}

/// An LZ4 cluster without 0PADDING: the stream is left-aligned and
/// followed by zeros, and ends at the first point where a decode yields
/// the whole extent.
pub(super) fn unpadded(src: &[u8], out: &mut [u8], llen: usize) -> Result<(), Decode> {
    let last = src.iter().rposition(|&b| b != 0).map_or(0, |p| p + 1);
    for end in (last..=src.len()).take(MAX_TRIMS) {
        if let Ok(n) = lz4_flex::block::decompress_into(&src[..end], out) {
            if n >= llen {
                return Ok(());
            }
        }
    }
    Err(Decode::Lz4NoEnd)
}
