//! Writing the image front to back: file data as it streams in, whole
//! blocks straight into place, written once; the tails that will be
//! inlined after their inodes go to a spill file until the metadata is
//! laid out, so memory never holds file data beyond one buffer. Every
//! byte written is hashed, for a UUID that depends on the content alone.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;

use xxhash_rust::xxh3::Xxh3;

use super::compress::Pcluster;
use super::BuildError;

/// Where a regular file's data went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FileData {
    pub size: u64,
    /// First block of the data written in place (0 when there is none).
    pub blkaddr: u64,
    /// Blocks written in place (the last one zero-padded when the tail is
    /// not inlined).
    pub blocks: u64,
    /// The tail to inline after the inode: its offset and length in the
    /// spill file.
    pub tail: Option<(u64, u32)>,
    /// For a compressed file, where its extents wait in the spill file
    /// (offset, count), whose pclusters fill `blocks` blocks from
    /// `blkaddr` in order. Kept there rather than in memory, which would
    /// otherwise grow with the data (an extent per pcluster).
    pub z: Option<(u64, u32)>,
    /// For an index image (`--tar=i`), where the data is in the tar, the
    /// image's extra device: a byte offset, a multiple of 512.
    pub device_at: Option<u64>,
    /// For a sparse file stored chunk-based: log2 of the chunk size, and
    /// where its chunks' block addresses (4 bytes each, `NULL_ADDR` for a
    /// hole) wait in the spill file (offset, count).
    pub chunks: Option<(u8, u64, u32)>,
    /// For a merged file whose data stays in its layers: log2 of the
    /// chunk size, and where its chunk indexes (device and block each)
    /// wait in the spill file (offset, count).
    pub indexes: Option<(u8, u64, u32)>,
}

impl FileData {
    /// A file of `size` bytes whose data is placed once its compression
    /// comes back.
    pub fn placed_later(size: u64) -> FileData {
        FileData {
            size,
            blkaddr: 0,
            blocks: 0,
            tail: None,
            z: None,
            device_at: None,
            chunks: None,
            indexes: None,
        }
    }

    /// A file whose `size` bytes are at byte `at` of the tar an index
    /// image is made of.
    pub fn in_tar(size: u64, at: u64) -> FileData {
        FileData {
            device_at: (size > 0).then_some(at),
            ..FileData::placed_later(size)
        }
    }
}

/// Bytes of file data read and written at a time.
const CHUNK: usize = 1 << 20;

pub(crate) struct Writer {
    image: File,
    pub blksz: u64,
    /// The next block to write: everything before it is written.
    pub next_block: u64,
    spill: File,
    spill_len: u64,
    hash: Xxh3,
    buf: Vec<u8>,
}

impl Writer {
    /// Writes from block `first` of `image` on (what is before it is the
    /// superblock's, written last).
    pub fn new(mut image: File, blksz: u64, first: u64) -> io::Result<Writer> {
        image.seek(SeekFrom::Start(first * blksz))?;
        Ok(Writer {
            image,
            blksz,
            next_block: first,
            spill: tempfile::tempfile()?,
            spill_len: 0,
            hash: Xxh3::new(),
            buf: vec![0; CHUNK],
        })
    }

    fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.hash.update(bytes);
        self.image.write_all(bytes)
    }

    /// Writes `size` bytes read from `r` as a file's data. A tail of at
    /// most `room` bytes (the space an inode's block will have after it)
    /// goes to the spill file, to be inlined; anything else is written in
    /// place, the last block zero-padded.
    pub fn file(
        &mut self,
        r: &mut dyn Read,
        size: u64,
        room: Option<u64>,
        what: &dyn Fn() -> String,
    ) -> Result<FileData, BuildError> {
        let tail_len = size % self.blksz;
        let inline = tail_len > 0 && room.is_some_and(|r| tail_len <= r);
        let in_place = if inline { size - tail_len } else { size };
        let blkaddr = self.next_block;
        let mut left = in_place;
        let short = |got: u64| BuildError::Io {
            what: what(),
            source: io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("truncated: {size} bytes of data expected, {got} found"),
            ),
        };
        let mut buf = std::mem::take(&mut self.buf);
        let res = (|| {
            while left > 0 {
                let n = left.min(CHUNK as u64) as usize;
                let got = read_full(r, &mut buf[..n]).map_err(BuildError::io(what()))?;
                if got < n {
                    return Err(short(in_place - left + got as u64));
                }
                self.put(&buf[..n])
                    .map_err(BuildError::io("writing the image"))?;
                left -= n as u64;
            }
            let pad = (self.blksz - in_place % self.blksz) % self.blksz;
            if pad > 0 {
                buf[..pad as usize].fill(0);
                self.put(&buf[..pad as usize])
                    .map_err(BuildError::io("writing the image"))?;
            }
            let blocks = in_place.div_ceil(self.blksz);
            self.next_block += blocks;
            let mut tail = None;
            if inline {
                let t = &mut buf[..tail_len as usize];
                let got = read_full(r, t).map_err(BuildError::io(what()))?;
                if got < t.len() {
                    return Err(short(in_place + got as u64));
                }
                let at = self
                    .spill(t)
                    .map_err(BuildError::io("writing the spill file"))?;
                tail = Some((at, tail_len as u32));
            }
            Ok(FileData {
                size,
                blkaddr: if blocks > 0 { blkaddr } else { 0 },
                blocks,
                tail,
                z: None,
                device_at: None,
                chunks: None,
                indexes: None,
            })
        })();
        self.buf = buf;
        res
    }

    /// Writes `bytes` in place from the next block, zero-padded to a
    /// block, and returns its first block.
    pub fn blocks(&mut self, bytes: &[u8]) -> io::Result<u64> {
        let at = self.next_block;
        self.put(bytes)?;
        let pad = (self.blksz - bytes.len() as u64 % self.blksz) % self.blksz;
        self.put(&vec![0; pad as usize])?;
        self.next_block += (bytes.len() as u64).div_ceil(self.blksz);
        Ok(at)
    }

    /// Writes whole blocks of `bytes` in place.
    pub fn raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        debug_assert_eq!(bytes.len() as u64 % self.blksz, 0);
        self.put(bytes)?;
        self.next_block += bytes.len() as u64 / self.blksz;
        Ok(())
    }

    /// Puts `bytes` at the end of the spill file, returning their offset.
    fn spill(&mut self, bytes: &[u8]) -> io::Result<u64> {
        let at = self.spill_len;
        self.spill.write_all_at(bytes, at)?;
        self.spill_len += bytes.len() as u64;
        Ok(at)
    }

    /// Puts a chunk-based file's block addresses in the spill file.
    pub fn spill_chunks(&mut self, addrs: &[u32]) -> io::Result<u64> {
        let bytes: Vec<u8> = addrs.iter().flat_map(|a| a.to_le_bytes()).collect();
        self.spill(&bytes)
    }

    /// A chunk-based file's block map, as stored after its inode.
    pub fn chunk_map(&self, off: u64, n: u32) -> io::Result<Vec<u8>> {
        let mut v = vec![0; n as usize * 4];
        self.spill.read_exact_at(&mut v, off)?;
        Ok(v)
    }

    /// Puts a merged file's chunk indexes in the spill file.
    pub fn spill_indexes(&mut self, indexes: &[u8]) -> io::Result<u64> {
        self.spill(indexes)
    }

    /// `len` bytes of the spill file from `off`: a merged file's chunk
    /// indexes, as stored after its inode.
    pub fn spilled(&self, off: u64, len: usize) -> io::Result<Vec<u8>> {
        let mut v = vec![0; len];
        self.spill.read_exact_at(&mut v, off)?;
        Ok(v)
    }

    /// Puts a compressed file's extents in the spill file.
    pub fn spill_extents(&mut self, ext: &[Pcluster]) -> io::Result<(u64, u32)> {
        let bytes: Vec<u8> = ext.iter().flat_map(|e| e.to_bytes()).collect();
        Ok((self.spill(&bytes)?, ext.len() as u32))
    }

    /// A compressed file's extents from the spill file.
    pub fn extents(&self, (off, n): (u64, u32)) -> io::Result<Vec<Pcluster>> {
        let mut v = vec![0; n as usize * Pcluster::SPILLED];
        self.spill.read_exact_at(&mut v, off)?;
        Ok(v.chunks(Pcluster::SPILLED)
            .map(Pcluster::from_bytes)
            .collect())
    }

    /// A tail from the spill file.
    pub fn tail(&self, (off, len): (u64, u32)) -> io::Result<Vec<u8>> {
        let mut v = vec![0; len as usize];
        self.spill.read_exact_at(&mut v, off)?;
        Ok(v)
    }

    /// The hash of everything written so far.
    pub fn digest(&self) -> u128 {
        self.hash.digest128()
    }

    /// The image file, everything but the superblock written.
    pub fn into_image(self) -> File {
        self.image
    }
}

/// Reads until `buf` is full or the input ends; the count read.
pub(crate) fn read_full(r: &mut dyn Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}
