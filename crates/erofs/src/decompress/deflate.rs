//! Raw DEFLATE: its configuration record and its decoder (`flate2`).

use crate::error::{ConfigProblem, Decode};
use zerocopy::FromBytes;

use crate::format::{z_erofs_deflate_cfgs, Algorithm};

/// Largest DEFLATE window (log2) the kernel takes.
const MAX_WINDOWBITS: u8 = 15;

/// DEFLATE's configuration record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeflateConfig {
    /// log2 of the window the compressor used.
    pub windowbits: u8,
}

impl DeflateConfig {
    /// Parses the record's bytes, validated as the kernel validates them.
    pub(crate) fn parse(rec: &[u8]) -> Result<DeflateConfig, ConfigProblem> {
        super::record_size(rec, size_of::<z_erofs_deflate_cfgs>(), false)?;
        let (r, _) = z_erofs_deflate_cfgs::read_from_prefix(rec).expect("the size was checked");
        let windowbits = r.windowbits;
        if windowbits > MAX_WINDOWBITS {
            return Err(ConfigProblem::DeflateWindowBits { windowbits });
        }
        Ok(DeflateConfig { windowbits })
    }
}

/// Raw DEFLATE (no zlib or gzip wrapper). A full decode must reach the
/// final block's end exactly where the extent ends, as the kernel checks; a
/// partial one stops when the extent is full.
pub(super) fn decode(stream: &[u8], dst: &mut [u8], partial: bool) -> Result<(), Decode> {
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
