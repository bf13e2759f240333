//! Turning a physical cluster into its decompressed extent.
//!
//! Every algorithm's data is right-aligned in its physical cluster behind
//! zero padding (LZ4 only with the 0PADDING feature) and has no length of
//! its own: the map says how many bytes the extent has, and decoding stops
//! there. A full decode must produce exactly that many; a partial one (an
//! extent that deduplication points into the front of a longer stream)
//! keeps the first bytes of a stream that goes on.
//!
//! Decoders are handed bounded input and output only: the input is the
//! physical cluster (at most 1 MiB), the output the extent (at most
//! [`MAX_DECODED`]), and a decoder's own memory is held to the window or
//! dictionary the image's configuration records allow, so no stream, however
//! hostile, can make one allocate more, loop or panic.

use std::io::Read;

use foliofs_vfs::{Error, Result};

use crate::error::Decode;
use crate::format::{le64, INCOMPAT_LZ4_0PADDING};
use crate::superblock::CompressionConfigs;
use crate::zmap::{ZExtent, ZFormat};
use crate::{Corrupt, Erofs};

/// How many trailing-zero trims are tried on an LZ4 cluster written without
/// 0PADDING before it is declared corrupt.
const MAX_TRIMS: usize = 64;

// The format's own; kept reachable here, where decoding is.
pub use crate::format::{Algorithm, MAX_DECODED};

/// What decoding needs to know about the image.
#[derive(Clone, Copy, Debug)]
pub struct Codec {
    /// Each listed algorithm's configuration record.
    pub configs: CompressionConfigs,
    /// LZ4 data is right-aligned behind zeros (the other algorithms' always is).
    pub lz4_zero_padding: bool,
    /// The image's block size, which bounds the zero run.
    pub block_size: u64,
}

impl Erofs {
    /// How this image's extents are decoded.
    pub(crate) fn codec(&self) -> Codec {
        Codec {
            configs: self.configs,
            lz4_zero_padding: self.sb.has_incompat(INCOMPAT_LZ4_0PADDING),
            block_size: u64::from(self.sb.block_size()),
        }
    }
}

/// Decompresses `src` (the physical cluster, `ext.plen` bytes) into `out`
/// (at least `ext.llen` bytes). The extent's bytes are `out[..ext.llen]`;
/// an LZ4 stream may fill room beyond that (mkfs's legacy mode starts the
/// next extent at a cluster boundary inside a stream; like the kernel's
/// partial decoding, the excess is not part of the extent). With `partial`
/// the stream may go on past the extent. Damage is reported at `ext.pa`.
pub fn decompress_into(
    ext: &ZExtent,
    src: &[u8],
    codec: &Codec,
    out: &mut [u8],
    partial: bool,
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
            let start = (ext.la % codec.block_size) as usize % src.len();
            let first = (src.len() - start).min(llen);
            out[..first].copy_from_slice(&src[start..start + first]);
            out[first..llen].copy_from_slice(&src[..llen - first]);
            Ok(())
        }
        ZFormat::Fragment => Err(bad(Decode::NotInCluster)),
        ZFormat::Zeros => {
            out[..llen].fill(0);
            Ok(())
        }
        ZFormat::Compressed(Algorithm::Lz4) if !codec.lz4_zero_padding => {
            lz4_unpadded(src, out, llen).map_err(bad)
        }
        ZFormat::Compressed(alg) => {
            // The zero run ends within the cluster's first block.
            let window = src
                .len()
                .min((codec.block_size - ext.pa % codec.block_size) as usize);
            let skip = src[..window]
                .iter()
                .position(|&b| b != 0)
                .ok_or_else(|| bad(Decode::ZeroBlock { algorithm: alg }))?;
            let stream = &src[skip..];
            if alg == Algorithm::Lz4 && !partial {
                lz4_full(stream, out, llen).map_err(bad)
            } else {
                decode(alg, &codec.configs, stream, &mut out[..llen], partial).map_err(bad)
            }
        }
    }
}

/// Decodes `stream` (the compressed bytes after any zero padding) of
/// algorithm `alg` into all of `dst`: the whole stream when not `partial`,
/// else its first `dst.len()` bytes.
pub fn decode(
    alg: Algorithm,
    configs: &CompressionConfigs,
    stream: &[u8],
    dst: &mut [u8],
    partial: bool,
) -> std::result::Result<(), Decode> {
    if dst.len() > MAX_DECODED {
        return Err(Decode::TooLong {
            llen: dst.len(),
            most: MAX_DECODED,
        });
    }
    let unconfigured = Decode::NoConfig { algorithm: alg };
    match alg {
        Algorithm::Lz4 => {
            if partial {
                lz4_partial(stream, dst)
            } else {
                lz4_full(stream, dst, dst.len())
            }
        }
        Algorithm::MicroLzma => {
            let cfg = configs.lzma.ok_or(unconfigured)?;
            micro_lzma(stream, dst, cfg.dict_size, partial)
        }
        Algorithm::Deflate => {
            configs.deflate.ok_or(unconfigured)?;
            deflate(stream, dst, partial)
        }
        Algorithm::Zstd => {
            let cfg = configs.zstd.ok_or(unconfigured)?;
            zstd(stream, dst, cfg.window_size())
        }
    }
}

fn lz4_error(e: lz4_flex::block::DecompressError) -> Decode {
    Decode::Invalid {
        algorithm: Algorithm::Lz4,
        reason: e.to_string(),
    }
}

/// A right-aligned LZ4 stream that must yield at least `llen` bytes; `out`
/// may take more.
fn lz4_full(stream: &[u8], out: &mut [u8], llen: usize) -> std::result::Result<(), Decode> {
    let n = lz4_flex::block::decompress_into(stream, out).map_err(lz4_error)?;
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
fn lz4_partial(stream: &[u8], dst: &mut [u8]) -> std::result::Result<(), Decode> {
    let total = lz4_decoded_len(stream).ok_or(Decode::Invalid {
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
        return lz4_full(stream, dst, total);
    }
    if total > MAX_DECODED {
        return Err(Decode::TooLong {
            llen: total,
            most: MAX_DECODED,
        });
    }
    let mut whole = vec![0u8; total];
    lz4_full(stream, &mut whole, total)?;
    dst.copy_from_slice(&whole[..dst.len()]);
    Ok(())
}

/// How many bytes an LZ4 block decodes to, from its tokens alone (`None`
/// if they run past its end). Each token costs at least one input byte, so
/// the walk is bounded by the stream's length.
fn lz4_decoded_len(stream: &[u8]) -> Option<usize> {
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
fn lz4_unpadded(src: &[u8], out: &mut [u8], llen: usize) -> std::result::Result<(), Decode> {
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

/// MicroLZMA: byte 0 is the complement of the LZMA properties byte and
/// stands in for the range coder's first byte, which is always zero; the
/// rest is plain LZMA1 with neither sizes nor end marker.
fn micro_lzma(
    stream: &[u8],
    dst: &mut [u8],
    dict_size: u32,
    partial: bool,
) -> std::result::Result<(), Decode> {
    let invalid = |reason: String| Decode::Invalid {
        algorithm: Algorithm::MicroLzma,
        reason,
    };
    let Some(&first) = stream.first() else {
        return Err(invalid("no data".into()));
    };
    let props = !first;
    // lc + lp ≤ 12 is what LZMA1 streams may use; (pb * 5 + lp) * 9 + lc
    // stays below 225.
    if props >= 9 * 5 * 5 {
        return Err(invalid(format!("properties byte {props:#04x}")));
    }
    // No match reaches further back than the extent's start, so a
    // dictionary larger than the extent would only cost memory.
    let dict = dict_size.min(dst.len().max(4096) as u32);
    let input = Read::chain(&[0u8][..], &stream[1..]);
    // A prefix may end inside a match, which a declared size refuses:
    // partial decodes run with the size unknown and stop when `dst` is full.
    let size = if partial { u64::MAX } else { dst.len() as u64 };
    let mut reader = lzma_rust2::LzmaReader::new_with_props(input, size, props, dict, None)
        .map_err(|e| invalid(e.to_string()))?;
    // A full decode must end exactly where the extent does, as the kernel's
    // decoder checks.
    reader.set_relaxed_end_condition(partial);
    reader.read_exact(dst).map_err(|e| invalid(e.to_string()))
}

/// Zstd: one standard frame. Its window may not exceed the configuration
/// record's, as the kernel sets its decoder up; that also bounds what the
/// decoder allocates. Like the kernel, decoding stops when the extent is
/// full, whether or not the frame ends there.
///
/// libzstd (through the zstd crate) rather than a pure-Rust decoder: the
/// one this crate used copied a match `offset` bytes at a time, so a run of
/// one repeated byte (zero padding in binaries, sparse tables) decoded a
/// byte per call, seven times slower than the kernel on such data.
fn zstd(stream: &[u8], dst: &mut [u8], window: u64) -> std::result::Result<(), Decode> {
    use zstd::zstd_safe::{DCtx, DParameter, InBuffer, OutBuffer, ResetDirective};
    let invalid = |reason: String| Decode::Invalid {
        algorithm: Algorithm::Zstd,
        reason,
    };
    let asked = zstd_window(stream).map_err(|e| invalid(e.into()))?;
    if asked > window {
        return Err(invalid(format!(
            "a window of {asked} bytes, above the image's {window}"
        )));
    }
    let zerr = |code: usize| invalid(zstd::zstd_safe::get_error_name(code).to_owned());
    thread_local! {
        // A context holds about 100 KiB of tables; one per thread is
        // reused rather than set up for every extent.
        static DCTX: std::cell::RefCell<Option<DCtx<'static>>> = const {
            std::cell::RefCell::new(None)
        };
    }
    DCTX.with_borrow_mut(|slot| {
        if slot.is_none() {
            *slot =
                Some(DCtx::try_create().ok_or_else(|| invalid("no memory for a context".into()))?);
        }
        let dctx = slot.as_mut().expect("set above");
        dctx.reset(ResetDirective::SessionOnly).map_err(zerr)?;
        // 2^10 to 2^31, as libzstd takes it; the header check above is
        // the exact limit.
        let log = (64 - window.saturating_sub(1).leading_zeros()).clamp(10, 31);
        dctx.set_parameter(DParameter::WindowLogMax(log))
            .map_err(zerr)?;
        let want = dst.len();
        let mut input = InBuffer::around(stream);
        let mut output = OutBuffer::around(dst);
        loop {
            let before = (input.pos(), output.pos());
            let left = dctx
                .decompress_stream(&mut output, &mut input)
                .map_err(zerr)?;
            if output.pos() == want {
                return Ok(());
            }
            // The frame ended, or the stream did, before the extent.
            if left == 0 || (input.pos(), output.pos()) == before {
                return Err(Decode::Short {
                    algorithm: Algorithm::Zstd,
                    decoded: output.pos(),
                    llen: want,
                });
            }
        }
    })
}

/// The window a Zstd frame's header asks for (RFC 8878, 3.1.1.1): its
/// window descriptor, or for a single-segment frame its content size.
fn zstd_window(frame: &[u8]) -> std::result::Result<u64, &'static str> {
    const MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];
    if frame.get(..4) != Some(&MAGIC[..]) {
        return Err("no Zstandard frame magic");
    }
    let &fhd = frame.get(4).ok_or("the frame header is cut short")?;
    let single_segment = fhd & 0x20 != 0;
    if !single_segment {
        let &wd = frame.get(5).ok_or("the frame header is cut short")?;
        let log = 10 + u32::from(wd >> 3);
        let base = 1u64 << log;
        return Ok(base + (base / 8) * u64::from(wd & 7));
    }
    // Single segment: no window descriptor; the dictionary ID (0, 1, 2 or
    // 4 bytes) comes before the content size (1, 2, 4 or 8 bytes).
    let did = [0, 1, 2, 4][usize::from(fhd & 3)];
    let fcs = [1, 2, 4, 8][usize::from(fhd >> 6)];
    let at = 5 + did;
    let bytes = frame
        .get(at..at + fcs)
        .ok_or("the frame header is cut short")?;
    let mut le = [0u8; 8];
    le[..fcs].copy_from_slice(bytes);
    let size = le64(&le, 0);
    // A 2-byte size counts from 256.
    Ok(if fcs == 2 { size + 256 } else { size })
}

/// Raw DEFLATE (no zlib or gzip wrapper). A full decode must reach the
/// final block's end exactly where the extent ends, as the kernel checks; a
/// partial one stops when the extent is full.
fn deflate(stream: &[u8], dst: &mut [u8], partial: bool) -> std::result::Result<(), Decode> {
    thread_local! {
        // One inflater per server thread, reset for each stream: a new one
        // allocates and sets up its window and tables for every cluster,
        // which at 4 KiB clusters costs as much as the decoding.
        static INFLATER: std::cell::RefCell<flate2::Decompress> =
            std::cell::RefCell::new(flate2::Decompress::new(false));
    }
    let (status, decoded) = INFLATER.with_borrow_mut(|inflater| {
        inflater.reset(false);
        let status = inflater.decompress(stream, dst, flate2::FlushDecompress::Finish);
        (status, inflater.total_out() as usize)
    });
    let status = status.map_err(|e| Decode::Invalid {
        algorithm: Algorithm::Deflate,
        reason: e.to_string(),
    })?;
    let ended = status == flate2::Status::StreamEnd;
    if decoded == dst.len() && (ended || partial) {
        return Ok(());
    }
    if ended || decoded < dst.len() {
        return Err(Decode::Short {
            algorithm: Algorithm::Deflate,
            decoded,
            llen: dst.len(),
        });
    }
    Err(Decode::Invalid {
        algorithm: Algorithm::Deflate,
        reason: "the stream goes on past the extent".into(),
    })
}

#[cfg(test)]
mod tests;
