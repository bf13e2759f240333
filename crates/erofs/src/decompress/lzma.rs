//! MicroLZMA: its configuration record and its decoder (`lzma-rust2`).

use std::io::Read;

use crate::error::{ConfigProblem, Decode};
use zerocopy::FromBytes;

use crate::format::{z_erofs_lzma_cfgs, Algorithm};

/// Smallest MicroLZMA dictionary the kernel takes.
const MIN_DICT: u32 = 4 << 10;
/// Largest MicroLZMA dictionary the kernel takes.
const MAX_DICT: u32 = 8 << 20;

/// MicroLZMA's configuration record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LzmaConfig {
    /// Dictionary size in bytes.
    pub dict_size: u32,
}

impl LzmaConfig {
    /// Parses the record's bytes, validated as the kernel validates them.
    pub(crate) fn parse(rec: &[u8]) -> Result<LzmaConfig, ConfigProblem> {
        // Unlike the other records, the kernel takes this one only at its
        // exact size.
        super::record_size(rec, size_of::<z_erofs_lzma_cfgs>(), true)?;
        let (r, _) = z_erofs_lzma_cfgs::read_from_prefix(rec).expect("the size was checked");
        let (dict_size, format) = (r.dict_size.get(), r.format.get());
        if format != 0 {
            return Err(ConfigProblem::LzmaFormat { format });
        }
        if !(MIN_DICT..=MAX_DICT).contains(&dict_size) {
            return Err(ConfigProblem::LzmaDictSize { dict_size });
        }
        Ok(LzmaConfig { dict_size })
    }
}

/// MicroLZMA: byte 0 is the complement of the LZMA properties byte and
/// stands in for the range coder's first byte, which is always zero; the
/// rest is plain LZMA1 with neither sizes nor end marker.
pub(super) fn decode(
    stream: &[u8],
    dst: &mut [u8],
    cfg: &LzmaConfig,
    partial: bool,
) -> Result<(), Decode> {
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
    let dict = cfg.dict_size.min(dst.len().max(4096) as u32);
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
