//! Zstd into fixed-size physical clusters. libzstd cannot stop when its
//! output is full (it has no "destSize" mode, as liblz4 has), so the
//! longest prefix whose frame fits a pcluster is searched for.

use ::zstd::zstd_safe::{is_error_kind, zstd_sys::ZSTD_ErrorCode, CCtx, CParameter};

/// A Zstd context and the buffer its tries are written to.
pub(super) struct Zstd {
    cctx: CCtx<'static>,
    tries: Vec<u8>,
    /// The last fit in this segment, (input, frame size): the next
    /// search's first guess. Reset with each segment, so that the image
    /// does not depend on which worker compressed what before.
    pub last: Option<(usize, usize)>,
}

impl Zstd {
    /// A context at `level` with a window of 2^`window_log` bytes, for
    /// pclusters of `pcluster` bytes.
    pub fn new(level: i32, window_log: u8, pcluster: u32) -> Result<Zstd, String> {
        let zerr = |e| format!("libzstd: {}", ::zstd::zstd_safe::get_error_name(e));
        let mut cctx = CCtx::try_create().ok_or("libzstd could not allocate a context")?;
        cctx.set_parameter(CParameter::CompressionLevel(level))
            .map_err(zerr)?;
        cctx.set_parameter(CParameter::WindowLog(u32::from(window_log)))
            .map_err(zerr)?;
        // Room for the frame of four pclusters' input even if it does not
        // compress, so that a try's size is known and the next one can be
        // aimed.
        let tries = vec![0; ::zstd::zstd_safe::compress_bound(4 * pcluster as usize)];
        Ok(Zstd {
            cctx,
            tries,
            last: None,
        })
    }

    /// The longest prefix of `src` whose Zstd frame fits `dst`, compressed
    /// into it: (frame length, input consumed).
    ///
    /// libzstd cannot stop when its output is full, so prefixes are tried.
    /// The search keeps the longest prefix known to fit and the shortest
    /// known not to, with their frame sizes, and tries next where the line
    /// between the two reaches the pcluster's size (the first guess is the
    /// last fit's ratio in this segment, which is usually close): frame size
    /// grows nearly in proportion to input, so this lands within a few bytes
    /// in a few tries, where halving the gap would take a dozen. A try that
    /// does not halve the gap makes the next one halve it, so the search
    /// never stalls. It stops when the gap closes or a fit leaves less than
    /// a byte free.
    pub fn dest_size(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(usize, usize), String> {
        let z = self;
        let cap = dst.len();
        // (input, frame size): the longest prefix that fits and the shortest
        // that does not, whose size is unknown when it overflowed the tries'
        // buffer.
        let (mut fit, mut fit_n) = (0usize, 0usize);
        let (mut over, mut over_n) = (src.len() + 1, None::<usize>);
        let mut m = match z.last {
            Some((input, n)) => cap * input / n,
            None => cap * 4,
        };
        // Which end the last two tries moved (true: the fitting one), for
        // the Illinois rule below.
        let mut moved = [None::<bool>; 2];
        loop {
            m = m.clamp(fit + 1, over - 1);
            let got = match z.cctx.compress2(&mut z.tries[..], &src[..m]) {
                Ok(n) => Some(n),
                Err(e) if is_error_kind(e, ZSTD_ErrorCode::ZSTD_error_dstSize_tooSmall) => None,
                Err(e) => {
                    return Err(format!(
                        "libzstd failed to compress {m} bytes: {}",
                        ::zstd::zstd_safe::get_error_name(e)
                    ))
                }
            };
            let fits = matches!(got, Some(n) if n > 0 && n <= cap);
            if fits {
                let n = got.expect("a fit has a size");
                dst[..n].copy_from_slice(&z.tries[..n]);
                (fit, fit_n) = (m, n);
                if n + (cap / 1024).max(1) >= cap {
                    break;
                }
            } else {
                (over, over_n) = (m, got);
            }
            if over <= fit + 1 {
                break;
            }
            moved = [moved[1], Some(fits)];
            m = match over_n {
                Some(on) => {
                    // Regula falsi on (frame size - pcluster), aiming at a
                    // full pcluster; when one end has stayed put twice, its
                    // weight is halved (Illinois), so that a curved size
                    // function does not make the other end creep.
                    let (mut below, mut above) = ((cap - fit_n) as f64, (on - cap) as f64);
                    if moved == [Some(true), Some(true)] {
                        above /= 2.0;
                    } else if moved == [Some(false), Some(false)] {
                        below /= 2.0;
                    }
                    fit + ((over - fit) as f64 * below / (below + above)) as usize
                }
                // Too big to be sized: in proportion from the last fit, or
                // half of what did not fit.
                None if fit > 0 => (cap * fit / fit_n).min(fit + (over - fit) / 2),
                None => over / 2,
            };
        }
        if fit == 0 {
            return Err(format!(
                "libzstd fit no input into a pcluster of {cap} bytes"
            ));
        }
        z.last = Some((fit, fit_n));
        Ok((fit_n, fit))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(frame: &[u8], len: usize) -> Vec<u8> {
        ::zstd::bulk::decompress(frame, len).unwrap()
    }

    #[test]
    fn a_zstd_pcluster_holds_a_frame_of_the_longest_prefix_found_that_fits() {
        let text: Vec<u8> = (0..200_000u32)
            .flat_map(|i| format!("{} ", i.wrapping_mul(2_654_435_761) % 977).into_bytes())
            .collect();
        let mut x = 7u64;
        let noise: Vec<u8> = (0..200_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        for pcluster in [4096u32, 65536] {
            let window = (pcluster * 8).trailing_zeros() as u8;
            let mut z = Zstd::new(super::super::ZSTD_DEFAULT_LEVEL, window, pcluster).unwrap();
            let mut dst = vec![0; pcluster as usize];
            for (what, src) in [("text", &text), ("noise", &noise)] {
                let (n, took) = z.dest_size(src, &mut dst).unwrap();
                assert!(n <= pcluster as usize, "{what}: {n} bytes");
                assert_eq!(decode(&dst[..n], took), src[..took], "{what}");
                if what == "text" {
                    // It compresses, and a pcluster more of input would
                    // not have fitted (at the same settings).
                    assert!(took > 2 * pcluster as usize, "{what}: {took}");
                    let end = (took + pcluster as usize).min(src.len());
                    let more = z.cctx.compress2(&mut z.tries[..], &src[..end]);
                    assert!(
                        more.is_err() || more.unwrap() > pcluster as usize || took == src.len()
                    );
                } else {
                    assert!(took < pcluster as usize, "{what}: {took}");
                }
            }
        }
    }
}
