//! Compressed data: the configuration records that follow the superblock,
//! and turning a physical cluster into its decompressed extent.
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
//!
//! Each algorithm has a file of its own holding its configuration record
//! and its decoder, as Linux has `decompressor_lzma.c` and the others;
//! this one reads the records that follow the superblock and hands each
//! extent to its algorithm's decoder. A new algorithm is a new file, a
//! variant of [`Algorithm`], and an arm in each `match` on it here.

use foliofs_vfs::{Error, Result};

use crate::error::{ConfigProblem, Decode};
use crate::format::{INCOMPAT_COMPR_CFGS, INCOMPAT_LZ4_0PADDING, SUPER_OFFSET};
use crate::superblock::Superblock;
use crate::zmap::{ZExtent, ZFormat};
use crate::{Corrupt, Erofs, Incompatible};

mod deflate;
mod lz4;
mod lzma;
mod zstd;

pub use self::zstd::ZstdConfig;
pub use deflate::DeflateConfig;
pub use lz4::Lz4Config;
pub use lzma::LzmaConfig;
// The format's own; kept reachable here, where decoding is.
pub use crate::format::{Algorithm, MAX_DECODED};

/// The configuration of every algorithm the superblock lists (`None` for
/// the ones it does not).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompressionConfigs {
    /// LZ4 (always present on an image that can hold compressed files).
    pub lz4: Option<Lz4Config>,
    /// MicroLZMA.
    pub lzma: Option<LzmaConfig>,
    /// DEFLATE.
    pub deflate: Option<DeflateConfig>,
    /// Zstd.
    pub zstd: Option<ZstdConfig>,
}

impl CompressionConfigs {
    /// Reads the configuration records that follow the superblock (with
    /// COMPR_CFGS; without it only LZ4 exists, configured by the
    /// superblock's u16), validated as the kernel validates them at mount.
    /// `read` reads image bytes at a position.
    pub fn load(
        sb: &Superblock,
        mut read: impl FnMut(u64, &mut [u8]) -> Result<()>,
    ) -> Result<CompressionConfigs> {
        let mut cfgs = CompressionConfigs::default();
        if !sb.has_incompat(INCOMPAT_COMPR_CFGS) {
            cfgs.lz4 = Some(Lz4Config {
                max_distance: sb.compr_u16,
                max_pclusterblks: 0,
            });
            return Ok(cfgs);
        }
        let algs = sb.compr_u16;
        let known = Algorithm::ALL
            .iter()
            .fold(0u16, |bits, a| bits | 1 << a.number());
        let unknown = algs & !known;
        if unknown != 0 {
            return Err(Error::incompatible(Incompatible::Algorithm {
                algorithm: unknown.trailing_zeros() as u8,
            }));
        }
        // Records follow in ascending algorithm order, each 4-byte aligned,
        // a u16 length and then that many bytes.
        let mut pos = SUPER_OFFSET + sb.size();
        for algorithm in Algorithm::ALL {
            if algs & (1 << algorithm.number()) == 0 {
                continue;
            }
            pos = pos.div_ceil(4) * 4;
            let at = pos;
            let mut len = [0u8; 2];
            read(pos, &mut len)?;
            let len = u16::from_le_bytes(len);
            let mut rec = vec![0u8; usize::from(len)];
            read(pos + 2, &mut rec)?;
            pos += 2 + u64::from(len);
            let bad = |problem: ConfigProblem| {
                Error::corrupt(
                    at,
                    Corrupt::CompressionConfig {
                        algorithm: algorithm.number(),
                        problem,
                    },
                )
            };
            match algorithm {
                Algorithm::Lz4 => {
                    cfgs.lz4 = Some(Lz4Config::parse(&rec, sb.blkszbits).map_err(bad)?)
                }
                Algorithm::MicroLzma => cfgs.lzma = Some(LzmaConfig::parse(&rec).map_err(bad)?),
                Algorithm::Deflate => cfgs.deflate = Some(DeflateConfig::parse(&rec).map_err(bad)?),
                Algorithm::Zstd => cfgs.zstd = Some(ZstdConfig::parse(&rec).map_err(bad)?),
            }
        }
        Ok(cfgs)
    }

    /// True when the superblock lists `algorithm`.
    pub fn has(&self, algorithm: Algorithm) -> bool {
        match algorithm {
            Algorithm::Lz4 => self.lz4.is_some(),
            Algorithm::MicroLzma => self.lzma.is_some(),
            Algorithm::Deflate => self.deflate.is_some(),
            Algorithm::Zstd => self.zstd.is_some(),
        }
    }

    /// The algorithms configured, by number.
    pub fn algorithms(&self) -> Vec<u8> {
        Algorithm::ALL
            .into_iter()
            .filter(|&a| self.has(a))
            .map(Algorithm::number)
            .collect()
    }
}

/// Checks a record's length against the `expected` bytes its fields take:
/// at least that many, or with `exact` no other.
fn record_size(rec: &[u8], expected: usize, exact: bool) -> std::result::Result<(), ConfigProblem> {
    // The loader read `rec` from a u16 length.
    let len = rec.len() as u16;
    let expected = expected as u16;
    if len < expected || (exact && len != expected) {
        return Err(ConfigProblem::Size { len, expected });
    }
    Ok(())
}

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
            lz4::unpadded(src, out, llen).map_err(bad)
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
                lz4::full(stream, out, llen).map_err(bad)
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
        Algorithm::Lz4 if partial => lz4::partial(stream, dst),
        Algorithm::Lz4 => lz4::full(stream, dst, dst.len()),
        Algorithm::MicroLzma => {
            let cfg = configs.lzma.ok_or(unconfigured)?;
            lzma::decode(stream, dst, &cfg, partial)
        }
        Algorithm::Deflate => {
            configs.deflate.ok_or(unconfigured)?;
            deflate::decode(stream, dst, partial)
        }
        Algorithm::Zstd => {
            let cfg = configs.zstd.ok_or(unconfigured)?;
            self::zstd::decode(stream, dst, &cfg)
        }
    }
}

#[cfg(test)]
mod tests;
