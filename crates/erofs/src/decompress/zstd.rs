//! Zstandard: its configuration record and its decoder (libzstd, through
//! the zstd crate).

use crate::error::{ConfigProblem, Decode};
use zerocopy::FromBytes;

use crate::format::{z_erofs_zstd_cfgs, Algorithm};

/// Largest Zstd window log above 1 KiB the kernel takes (1 MiB windows).
const MAX_WINDOWLOG: u8 = 10;

/// Zstd's configuration record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ZstdConfig {
    /// The window is `1 << (windowlog + 10)` bytes.
    pub windowlog: u8,
}

impl ZstdConfig {
    /// Parses the record's bytes, validated as the kernel validates them.
    pub(crate) fn parse(rec: &[u8]) -> Result<ZstdConfig, ConfigProblem> {
        super::record_size(rec, size_of::<z_erofs_zstd_cfgs>(), false)?;
        let (r, _) = z_erofs_zstd_cfgs::read_from_prefix(rec).expect("the size was checked");
        let (format, windowlog) = (r.format, r.windowlog);
        if format != 0 {
            return Err(ConfigProblem::ZstdFormat { format });
        }
        if windowlog > MAX_WINDOWLOG {
            return Err(ConfigProblem::ZstdWindowLog { windowlog });
        }
        Ok(ZstdConfig { windowlog })
    }

    /// Largest frame window the image's Zstd data may ask for.
    pub fn window_size(&self) -> u64 {
        1 << (u32::from(self.windowlog) + 10)
    }
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
pub(super) fn decode(stream: &[u8], dst: &mut [u8], cfg: &ZstdConfig) -> Result<(), Decode> {
    use ::zstd::zstd_safe::{DCtx, DParameter, InBuffer, OutBuffer, ResetDirective};
    let invalid = |reason: String| Decode::Invalid {
        algorithm: Algorithm::Zstd,
        reason,
    };
    let window = cfg.window_size();
    let asked = frame_window(stream).map_err(|e| invalid(e.into()))?;
    if asked > window {
        return Err(invalid(format!(
            "a window of {asked} bytes, above the image's {window}"
        )));
    }
    let zerr = |code: usize| invalid(::zstd::zstd_safe::get_error_name(code).to_owned());
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
pub(super) fn frame_window(frame: &[u8]) -> Result<u64, &'static str> {
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
    let size = u64::from_le_bytes(le);
    // A 2-byte size counts from 256.
    Ok(if fcs == 2 { size + 256 } else { size })
}
