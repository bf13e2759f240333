//! Compressing file data into fixed-size physical clusters, on every CPU.
//!
//! The kernel decodes each physical cluster (pcluster) into exactly the
//! bytes between its extent's start and the next extent's, so each one
//! must hold the compressed bytes of as much input as fits: LZ4's
//! "destSize" compression, which only liblz4 has (through `lz4-sys`,
//! whose bundled C library exports it although the crate does not bind
//! it: `lz4.rs`). libzstd has no such mode, so for Zstd the longest
//! prefix that fits is searched for (`zstd.rs`). A pcluster that would not
//! save a block holds one block of the input as it is (a PLAIN
//! pcluster). Compressed bytes are right-aligned in their blocks
//! (`LZ4_0PADDING`), as the kernel's in-place decoding expects; its
//! other decoders skip the leading zeros the same way.
//!
//! Files are cut into segments of [`SEGMENT`] bytes, compressed
//! independently by a pool of workers; results are written strictly in
//! the order the segments were read, so the image does not depend on how
//! many workers there are or how fast each one is (`pool.rs`: the
//! workers and the queue; `files.rs`: a compressed file from its first
//! segment read to its extents written).

mod files;
mod lz4;
mod pool;
mod zstd;

pub(crate) use files::ZFile;
pub(crate) use pool::Queue;

use zerocopy::little_endian::{U16, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// Bytes of a file compressed as one unit: extents never cross a
/// segment's end, and the pool holds a few segments per worker at most.
pub(crate) const SEGMENT: usize = 4 << 20;

/// The builder's compressor and its settings; the id written on disk is
/// its [`crate::format::Algorithm`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compressor {
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

impl Compressor {
    /// The number EROFS gives the algorithm on disk.
    pub(crate) fn on_disk(self) -> crate::format::Algorithm {
        match self {
            Compressor::Lz4 | Compressor::Lz4hc(_) => crate::format::Algorithm::Lz4,
            Compressor::Zstd { .. } => crate::format::Algorithm::Zstd,
        }
    }
}

impl Compression {
    /// log2 of the Zstd window, for Zstd.
    pub(crate) fn zstd_window_log(&self) -> Option<u8> {
        match self.compressor {
            Compressor::Zstd { dictsize, .. } => {
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
        match self.compressor {
            Compressor::Lz4 => Ok(()),
            Compressor::Lz4hc(l) if (1..=12).contains(&l) => Ok(()),
            Compressor::Lz4hc(l) => Err(format!("-z lz4hc,{l}: the level must be 1 to 12")),
            Compressor::Zstd { level, dictsize } => {
                let (lo, hi) = (
                    ::zstd::zstd_safe::min_c_level(),
                    ::zstd::zstd_safe::max_c_level(),
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
    pub compressor: Compressor,
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

/// A [`Pcluster`] as the spill file keeps it until its file's extents are
/// laid out.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct Spilled {
    la: U64,
    blocks: U16,
    raw: u8,
}

impl Pcluster {
    /// Bytes of one in the spill file.
    pub const SPILLED: usize = std::mem::size_of::<Spilled>();

    pub fn to_bytes(self) -> [u8; Self::SPILLED] {
        let s = Spilled {
            la: self.la.into(),
            blocks: self.blocks.into(),
            raw: u8::from(self.raw),
        };
        let mut b = [0u8; Self::SPILLED];
        b.copy_from_slice(s.as_bytes());
        b
    }

    /// `b` is one record (the spill file is read in whole records).
    pub fn from_bytes(b: &[u8]) -> Pcluster {
        let s = Spilled::ref_from_bytes(b).expect("one spilled record");
        Pcluster {
            la: s.la.get(),
            blocks: s.blocks.get(),
            raw: s.raw != 0,
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

/// What a worker compresses with.
enum Kind {
    Lz4(lz4::Lz4),
    Zstd(zstd::Zstd),
}

/// A compressor with its state, one per worker.
struct Engine {
    blksz: usize,
    kind: Kind,
    dst: Vec<u8>,
}

impl Engine {
    fn new(c: Compression, blksz: usize) -> Result<Engine, String> {
        let kind = match c.compressor {
            Compressor::Lz4 => Kind::Lz4(lz4::Lz4::new(None)?),
            Compressor::Lz4hc(level) => Kind::Lz4(lz4::Lz4::new(Some(level))?),
            Compressor::Zstd { level, .. } => {
                let log = c.zstd_window_log().expect("a Zstd window");
                Kind::Zstd(zstd::Zstd::new(level, log, c.pcluster)?)
            }
        };
        Ok(Engine {
            blksz,
            kind,
            dst: vec![0; c.pcluster as usize],
        })
    }

    /// Compresses the longest prefix of `src` that fits the pcluster:
    /// (compressed length, input consumed).
    fn dest_size(&mut self, src: &[u8]) -> Result<(usize, usize), String> {
        match &mut self.kind {
            Kind::Lz4(l) => l.dest_size(src, &mut self.dst),
            Kind::Zstd(z) => z.dest_size(src, &mut self.dst),
        }
    }

    /// Compresses one segment; `whole` when it is all of its file.
    fn segment(&mut self, src: Vec<u8>, whole: bool) -> Result<Outcome, String> {
        if let Kind::Zstd(z) = &mut self.kind {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zstd_windows_default_to_eight_pclusters_up_to_1_mib() {
        let z = |pcluster, dictsize| Compression {
            compressor: Compressor::Zstd { level: 3, dictsize },
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
