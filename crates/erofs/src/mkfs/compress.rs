//! Compressing file data into fixed-size physical clusters, on every CPU.
//!
//! The kernel decodes each physical cluster (pcluster) into exactly the
//! bytes between its extent's start and the next extent's, so each one
//! must hold the compressed bytes of as much input as fits: LZ4's
//! "destSize" compression, which only liblz4 has (through `lz4-sys`,
//! whose bundled C library exports it although the crate does not bind
//! it). libzstd has no such mode, so for Zstd the longest prefix that
//! fits is searched for (`zstd_dest_size`). A pcluster that would not
//! save a block holds one block of the input as it is (a PLAIN
//! pcluster). Compressed bytes are right-aligned in their blocks
//! (`LZ4_0PADDING`), as the kernel's in-place decoding expects; its
//! other decoders skip the leading zeros the same way.
//!
//! Files are cut into segments of [`SEGMENT`] bytes, compressed
//! independently by a pool of workers; results are written strictly in
//! the order the segments were read, so the image does not depend on how
//! many workers there are or how fast each one is.

#![allow(unsafe_code)]

use std::collections::VecDeque;
use std::os::raw::{c_char, c_int, c_void};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

// Linked for its bundled liblz4; the two destSize entry points and the
// HC state's constructor are declared here as lz4.h and lz4hc.h give them.
use lz4_sys as _;

extern "C" {
    fn LZ4_compress_destSize(
        src: *const c_char,
        dst: *mut c_char,
        src_size: *mut c_int,
        target_dst_size: c_int,
    ) -> c_int;
    fn LZ4_createStreamHC() -> *mut c_void;
    fn LZ4_freeStreamHC(state: *mut c_void) -> c_int;
    fn LZ4_compress_HC_destSize(
        state: *mut c_void,
        src: *const c_char,
        dst: *mut c_char,
        src_size: *mut c_int,
        target_dst_size: c_int,
        level: c_int,
    ) -> c_int;
}

/// Bytes of a file compressed as one unit: extents never cross a
/// segment's end, and the pool holds a few segments per worker at most.
pub(crate) const SEGMENT: usize = 4 << 20;

/// The compressor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algorithm {
    /// LZ4's fast compressor.
    Lz4,
    /// LZ4HC at a level from 1 to 12.
    Lz4hc(u8),
    /// Zstd, each pcluster one frame.
    Zstd {
        /// A level libzstd takes, negative ones included.
        level: i32,
        /// The largest window a frame uses: a power of two from 1 KiB to
        /// 1 MiB; by default eight pclusters' worth, as mkfs.erofs
        /// chooses.
        dictsize: Option<u32>,
    },
}

/// Zstd's default level, as libzstd and mkfs.erofs have it.
pub const ZSTD_DEFAULT_LEVEL: i32 = 3;

impl Algorithm {
    /// The number EROFS gives the algorithm on disk.
    pub(crate) fn on_disk(self) -> crate::format::Algorithm {
        match self {
            Algorithm::Lz4 | Algorithm::Lz4hc(_) => crate::format::Algorithm::Lz4,
            Algorithm::Zstd { .. } => crate::format::Algorithm::Zstd,
        }
    }
}

impl Compression {
    /// log2 of the Zstd window, for Zstd.
    pub(crate) fn zstd_window_log(&self) -> Option<u8> {
        match self.algorithm {
            Algorithm::Zstd { dictsize, .. } => {
                let d = dictsize.unwrap_or_else(|| {
                    let d = (u64::from(self.pcluster) << 3).min(crate::format::MAX_PCLUSTER);
                    1 << (63 - d.leading_zeros())
                });
                Some(d.trailing_zeros() as u8)
            }
            _ => None,
        }
    }

    /// Why these settings cannot be built at `blksz`-byte blocks, if they
    /// cannot: one line naming the option, as `-z` and `-C` spell it.
    pub fn check(&self, blksz: u64) -> Result<(), String> {
        let p = u64::from(self.pcluster);
        if p == 0 || !p.is_multiple_of(blksz) || p > crate::format::MAX_PCLUSTER || p / blksz > 255
        {
            return Err(format!(
                "-C {p}: the pcluster size must be a multiple of the block size ({blksz}), \
                 at most 1 MiB and at most 255 blocks"
            ));
        }
        match self.algorithm {
            Algorithm::Lz4 => Ok(()),
            Algorithm::Lz4hc(l) if (1..=12).contains(&l) => Ok(()),
            Algorithm::Lz4hc(l) => Err(format!("-z lz4hc,{l}: the level must be 1 to 12")),
            Algorithm::Zstd { level, dictsize } => {
                let (lo, hi) = (
                    zstd::zstd_safe::min_c_level(),
                    zstd::zstd_safe::max_c_level(),
                );
                if !(lo..=hi).contains(&level) {
                    return Err(format!(
                        "-z zstd,level={level}: the level must be {lo} to {hi}"
                    ));
                }
                match dictsize {
                    Some(d) if !d.is_power_of_two() || !(1 << 10..=1 << 20).contains(&d) => {
                        Err(format!(
                            "-z zstd,dictsize={d}: the window must be a power of two \
                             from 1024 to 1048576 bytes"
                        ))
                    }
                    _ => Ok(()),
                }
            }
        }
    }
}

/// How to compress: the algorithm and the largest pcluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Compression {
    /// The compressor.
    pub algorithm: Algorithm,
    /// Largest physical cluster in bytes (`-C`): a multiple of the block
    /// size, one block by default.
    pub pcluster: u32,
}

/// One extent of a compressed file and the pcluster holding it. Pclusters
/// follow each other in the image, so their addresses are implied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Pcluster {
    /// Offset in the file where the extent starts.
    pub la: u64,
    /// Blocks of the pcluster.
    pub blocks: u16,
    /// The pcluster holds the input as it is.
    pub raw: bool,
}

impl Pcluster {
    /// Bytes of one in the spill file.
    pub const SPILLED: usize = 11;

    pub fn to_bytes(self) -> [u8; Self::SPILLED] {
        let mut b = [0u8; Self::SPILLED];
        b[..8].copy_from_slice(&self.la.to_le_bytes());
        b[8..10].copy_from_slice(&self.blocks.to_le_bytes());
        b[10] = u8::from(self.raw);
        b
    }

    pub fn from_bytes(b: &[u8]) -> Pcluster {
        Pcluster {
            la: u64::from_le_bytes(b[..8].try_into().expect("8 bytes")),
            blocks: u16::from_le_bytes([b[8], b[9]]),
            raw: b[10] != 0,
        }
    }
}

/// A compressed segment: its extents (offsets from the segment's start)
/// and the pclusters' bytes, whole blocks.
pub(crate) struct Packed {
    pub extents: Vec<Pcluster>,
    pub bytes: Vec<u8>,
}

/// What a worker made of a segment.
pub(crate) enum Outcome {
    Packed(Packed),
    /// A file that is one segment and that compression does not shrink by
    /// a block: stored uncompressed, as it was read.
    Plain(Vec<u8>),
}

/// A compressor with its state, one per worker.
struct Engine {
    c: Compression,
    blksz: usize,
    hc: *mut c_void,
    zstd: Option<Zstd>,
    dst: Vec<u8>,
}

/// A Zstd context and the buffer its tries are written to.
struct Zstd {
    cctx: zstd::zstd_safe::CCtx<'static>,
    tries: Vec<u8>,
    /// The last fit in this segment, (input, frame size): the next
    /// search's first guess. Reset with each segment, so that the image
    /// does not depend on which worker compressed what before.
    last: Option<(usize, usize)>,
}

// SAFETY: the HC state is owned by this Engine alone and used by one thread
// at a time; liblz4's states hold no thread-affine data.
unsafe impl Send for Engine {}

impl Engine {
    fn new(c: Compression, blksz: usize) -> Result<Engine, String> {
        let hc = match c.algorithm {
            // SAFETY: no arguments; the result is checked for null.
            Algorithm::Lz4hc(_) => unsafe { LZ4_createStreamHC() },
            _ => std::ptr::null_mut(),
        };
        if matches!(c.algorithm, Algorithm::Lz4hc(_)) && hc.is_null() {
            return Err("liblz4 could not allocate an LZ4HC state".into());
        }
        let zstd = match c.algorithm {
            Algorithm::Zstd { level, .. } => {
                use zstd::zstd_safe::{CCtx, CParameter};
                let zerr = |e| format!("libzstd: {}", zstd::zstd_safe::get_error_name(e));
                let mut cctx = CCtx::try_create().ok_or("libzstd could not allocate a context")?;
                cctx.set_parameter(CParameter::CompressionLevel(level))
                    .map_err(zerr)?;
                let log = c.zstd_window_log().expect("a Zstd window");
                cctx.set_parameter(CParameter::WindowLog(u32::from(log)))
                    .map_err(zerr)?;
                // Room for the frame of four pclusters' input even if it
                // does not compress, so that a try's size is known and
                // the next one can be aimed.
                let tries = vec![0; zstd::zstd_safe::compress_bound(4 * c.pcluster as usize)];
                Some(Zstd {
                    cctx,
                    tries,
                    last: None,
                })
            }
            _ => None,
        };
        Ok(Engine {
            c,
            blksz,
            hc,
            zstd,
            dst: vec![0; c.pcluster as usize],
        })
    }

    /// Compresses the longest prefix of `src` that fits the pcluster:
    /// (compressed length, input consumed).
    fn dest_size(&mut self, src: &[u8]) -> Result<(usize, usize), String> {
        if let Some(z) = &mut self.zstd {
            return zstd_dest_size(z, src, &mut self.dst);
        }
        let mut consumed = c_int::try_from(src.len()).map_err(|_| "segment too large")?;
        let cap = self.dst.len() as c_int;
        let n = match self.c.algorithm {
            // SAFETY: `src` is valid for `consumed` bytes and `dst` for
            // `cap`; liblz4 reads and writes no further and sets
            // `consumed` to what it took.
            Algorithm::Lz4 => unsafe {
                LZ4_compress_destSize(
                    src.as_ptr().cast(),
                    self.dst.as_mut_ptr().cast(),
                    &mut consumed,
                    cap,
                )
            },
            // SAFETY: as above; `hc` is a live state from
            // LZ4_createStreamHC, which the call reinitialises.
            Algorithm::Lz4hc(level) => unsafe {
                LZ4_compress_HC_destSize(
                    self.hc,
                    src.as_ptr().cast(),
                    self.dst.as_mut_ptr().cast(),
                    &mut consumed,
                    cap,
                    c_int::from(level),
                )
            },
            Algorithm::Zstd { .. } => unreachable!("Zstd has its own search"),
        };
        if n <= 0 || consumed <= 0 || consumed as usize > src.len() || n > cap {
            return Err(format!(
                "liblz4 failed to compress {} bytes into {cap}",
                src.len()
            ));
        }
        Ok((n as usize, consumed as usize))
    }

    /// Compresses one segment; `whole` when it is all of its file.
    fn segment(&mut self, src: Vec<u8>, whole: bool) -> Result<Outcome, String> {
        if let Some(z) = &mut self.zstd {
            z.last = None;
        }
        let b = self.blksz;
        let mut extents = Vec::new();
        let mut bytes = Vec::with_capacity(src.len() / 2 + b);
        let mut pos = 0;
        while pos < src.len() {
            let rest = &src[pos..];
            let (n, consumed) = self.dest_size(rest)?;
            let blocks = n.div_ceil(b);
            let c = pos % b;
            let crossing_last = rest.len() <= b && c + rest.len() > b;
            if blocks * b >= consumed && crossing_last && consumed == rest.len() && n <= b {
                // The last piece, which as PLAIN would have to be split
                // in two blocks (below): compressed, it takes one, though
                // it saves nothing on its own.
                bytes.resize(bytes.len() + (b - n), 0);
                bytes.extend_from_slice(&self.dst[..n]);
                extents.push(Pcluster {
                    la: pos as u64,
                    blocks: 1,
                    raw: false,
                });
                pos += consumed;
            } else if blocks * b >= consumed {
                // Compression saves no block here: one block as it is.
                // The kernel takes the last extent of a file to run to the
                // end of its last lcluster, which for a PLAIN pcluster must
                // not be more than the one block it holds: so the last one
                // stops at an lcluster boundary rather than cross it.
                // (Segments start on lcluster boundaries.)
                let count = if crossing_last {
                    b - c
                } else {
                    rest.len().min(b)
                };
                bytes.extend_from_slice(&rest[..count]);
                bytes.resize(bytes.len() + (b - count), 0);
                extents.push(Pcluster {
                    la: pos as u64,
                    blocks: 1,
                    raw: true,
                });
                pos += count;
            } else {
                bytes.resize(bytes.len() + (blocks * b - n), 0);
                bytes.extend_from_slice(&self.dst[..n]);
                extents.push(Pcluster {
                    la: pos as u64,
                    blocks: blocks as u16,
                    raw: false,
                });
                pos += consumed;
            }
        }
        if whole && bytes.len() / b >= src.len().div_ceil(b) {
            return Ok(Outcome::Plain(src));
        }
        Ok(Outcome::Packed(Packed { extents, bytes }))
    }
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
fn zstd_dest_size(z: &mut Zstd, src: &[u8], dst: &mut [u8]) -> Result<(usize, usize), String> {
    use zstd::zstd_safe::{is_error_kind, zstd_sys::ZSTD_ErrorCode};
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
                    zstd::zstd_safe::get_error_name(e)
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

impl Drop for Engine {
    fn drop(&mut self) {
        if !self.hc.is_null() {
            // SAFETY: `hc` came from LZ4_createStreamHC and is freed once.
            unsafe { LZ4_freeStreamHC(self.hc) };
        }
    }
}

type Reply = Result<Outcome, String>;

struct Job {
    src: Vec<u8>,
    whole: bool,
    reply: Sender<Reply>,
}

/// A segment on its way: compressed by a worker, or kept as read.
pub(crate) enum Pending {
    Working(Receiver<Reply>),
    Ready(Outcome),
}

impl Pending {
    /// The outcome, waiting for its worker.
    pub fn wait(self) -> Reply {
        match self {
            Pending::Ready(o) => Ok(o),
            Pending::Working(rx) => rx
                .recv()
                .unwrap_or_else(|_| Err("a compression worker died".into())),
        }
    }
}

/// The workers, fed through one queue.
pub(crate) struct Pool {
    tx: Option<SyncSender<Job>>,
    threads: Vec<JoinHandle<()>>,
    pub workers: usize,
}

impl Pool {
    /// Starts `workers` threads compressing as `c` says.
    pub fn new(c: Compression, blksz: usize, workers: usize) -> Result<Pool, String> {
        let workers = workers.max(1);
        let (tx, rx) = mpsc::sync_channel::<Job>(workers);
        let rx = Arc::new(Mutex::new(rx));
        let mut threads = Vec::with_capacity(workers);
        for i in 0..workers {
            let mut engine = Engine::new(c, blksz)?;
            let rx = Arc::clone(&rx);
            let t = std::thread::Builder::new()
                .name(format!("compress-{i}"))
                .spawn(move || loop {
                    let job = match rx.lock() {
                        Ok(q) => q.recv(),
                        Err(_) => return,
                    };
                    let Ok(job) = job else { return };
                    let out = engine.segment(job.src, job.whole);
                    // The builder may have stopped on an error meanwhile.
                    let _ = job.reply.send(out);
                })
                .map_err(|e| format!("starting a compression worker: {e}"))?;
            threads.push(t);
        }
        Ok(Pool {
            tx: Some(tx),
            threads,
            workers,
        })
    }

    /// Hands a segment to the next free worker.
    pub fn submit(&self, src: Vec<u8>, whole: bool) -> Pending {
        let (reply, rx) = mpsc::channel();
        let tx = self.tx.as_ref().expect("the pool is open until dropped");
        if let Err(mpsc::SendError(job)) = tx.send(Job { src, whole, reply }) {
            let _ = job
                .reply
                .send(Err("the compression workers stopped".into()));
        }
        Pending::Working(rx)
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.tx = None;
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Segments in the order they were read, with the bytes they hold.
#[derive(Default)]
pub(crate) struct Queue {
    pub items: VecDeque<(usize, u32, Pending)>,
    pub bytes: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zstd_engine(pcluster: u32) -> Engine {
        let c = Compression {
            algorithm: Algorithm::Zstd {
                level: ZSTD_DEFAULT_LEVEL,
                dictsize: None,
            },
            pcluster,
        };
        c.check(4096).unwrap();
        Engine::new(c, 4096).unwrap()
    }

    fn decode(frame: &[u8], len: usize) -> Vec<u8> {
        zstd::bulk::decompress(frame, len).unwrap()
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
            let mut e = zstd_engine(pcluster);
            for (what, src) in [("text", &text), ("noise", &noise)] {
                let (n, took) = e.dest_size(src).unwrap();
                assert!(n <= pcluster as usize, "{what}: {n} bytes");
                assert_eq!(decode(&e.dst[..n], took), src[..took], "{what}");
                if what == "text" {
                    // It compresses, and a pcluster more of input would
                    // not have fitted (at the same settings).
                    assert!(took > 2 * pcluster as usize, "{what}: {took}");
                    let z = e.zstd.as_mut().unwrap();
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

    #[test]
    fn zstd_windows_default_to_eight_pclusters_up_to_1_mib() {
        let z = |pcluster, dictsize| Compression {
            algorithm: Algorithm::Zstd { level: 3, dictsize },
            pcluster,
        };
        assert_eq!(z(4096, None).zstd_window_log(), Some(15));
        assert_eq!(z(12288, None).zstd_window_log(), Some(16));
        assert_eq!(z(1 << 20, None).zstd_window_log(), Some(20));
        assert_eq!(z(4096, Some(1024)).zstd_window_log(), Some(10));
        assert!(z(4096, Some(1000)).check(4096).is_err());
        assert!(z(4096, Some(2 << 20)).check(4096).is_err());
    }
}
