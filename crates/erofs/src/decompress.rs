//! Turning a physical cluster into its decompressed extent.

use foliofs_vfs::{Error, Result};

use crate::error::Decode;
use crate::zmap::{ZExtent, ZFormat};
use crate::Corrupt;

/// How many trailing-zero trims are tried on an LZ4 cluster written without
/// 0PADDING before it is declared corrupt.
const MAX_TRIMS: usize = 64;

/// Decompresses `src` (the physical cluster, `ext.plen` bytes) into a new
/// vector of the extent's `ext.llen` bytes. `zero_padding` says the LZ4
/// stream is right-aligned behind zeros; `block_size` bounds that zero run
/// as the kernel does. A stream may encode up to `slack` bytes more than its
/// extent (mkfs's legacy mode starts the next extent at a cluster boundary
/// inside it); like the kernel's partial decoding, the excess is dropped.
pub fn decompress(
    ext: &ZExtent,
    src: &[u8],
    zero_padding: bool,
    block_size: u64,
    slack: usize,
) -> Result<Vec<u8>> {
    let mut out = vec![0u8; ext.llen as usize + slack];
    decompress_into(ext, src, zero_padding, block_size, &mut out)?;
    out.truncate(ext.llen as usize);
    Ok(out)
}

/// As [`decompress`], into `out` (at least `ext.llen` bytes; room beyond
/// that takes a stream's excess). The extent's bytes are `out[..ext.llen]`.
pub fn decompress_into(
    ext: &ZExtent,
    src: &[u8],
    zero_padding: bool,
    block_size: u64,
    out: &mut [u8],
) -> Result<()> {
    let llen = ext.llen as usize;
    let bad = |problem: Decode| {
        Error::corrupt(
            ext.pa,
            Corrupt::Decompress {
                la: ext.la,
                problem,
            },
        )
    };
    if out.len() < llen {
        return Err(bad(Decode::Buffer {
            llen,
            buffer: out.len(),
        }));
    }
    match ext.format {
        ZFormat::Shifted => {
            if src.len() < llen {
                return Err(bad(Decode::PlainOverrun));
            }
            out[..llen].copy_from_slice(&src[..llen]);
            Ok(())
        }
        ZFormat::Interlaced => {
            if src.len() < llen || src.is_empty() {
                return Err(bad(Decode::PlainOverrun));
            }
            let start = (ext.la % block_size) as usize % src.len();
            let first = (src.len() - start).min(llen);
            out[..first].copy_from_slice(&src[start..start + first]);
            out[first..llen].copy_from_slice(&src[..llen - first]);
            Ok(())
        }
        ZFormat::Lz4 => {
            if zero_padding {
                let window = src.len().min((block_size - ext.pa % block_size) as usize);
                let skip = src[..window]
                    .iter()
                    .position(|&b| b != 0)
                    .ok_or_else(|| bad(Decode::Lz4ZeroBlock))?;
                let n = lz4_flex::block::decompress_into(&src[skip..], out).map_err(|e| {
                    bad(Decode::Lz4Invalid {
                        reason: e.to_string(),
                    })
                })?;
                if n < llen {
                    return Err(bad(Decode::Lz4Short { decoded: n, llen }));
                }
                return Ok(());
            }
            // Without 0PADDING the stream is left-aligned and followed by
            // zeros; it ends at the first point where a decode yields the
            // whole extent.
            let last = src.iter().rposition(|&b| b != 0).map_or(0, |p| p + 1);
            for end in (last..=src.len()).take(MAX_TRIMS) {
                if let Ok(n) = lz4_flex::block::decompress_into(&src[..end], out) {
                    if n >= llen {
                        return Ok(());
                    }
                }
            }
            Err(bad(Decode::Lz4NoEnd))
        }
        ZFormat::Fragment => Err(bad(Decode::NotInCluster)),
    }
}
