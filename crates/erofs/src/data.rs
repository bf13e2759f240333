//! File data: mapping an uncompressed file's offset to where its bytes live
//! (flat, inline tail or chunk table, on the primary image or an extra
//! device) and reading them; compressed files are handed to `zdata`.

use std::cell::RefCell;

use foliofs_block::BlockDev;
use foliofs_vfs::{Error, Result, Scratch};

use crate::chunk::{ChunkEntry, ChunkFormat};
use crate::inode::{Inode, Layout};
use crate::{Corrupt, Erofs};

/// Where a run of file bytes lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phys {
    Hole,
    /// Device index (0 = primary) and byte position.
    At(usize, u64),
    /// Byte position in the metabox inode's data (the inline tail of an
    /// inode kept there).
    Metabox(u64),
    /// Byte position of an inline tail in the primary image's metadata,
    /// read as metadata (through the page cache) whatever `directio` says,
    /// as the kernel reads it.
    Tail(u64),
}

/// A run of uncompressed file data starting at logical offset `la`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Run {
    pub(crate) la: u64,
    pub(crate) len: u64,
    pub(crate) phys: Phys,
}

thread_local! {
    /// Buffer for pieces of a read that spans several runs or extents.
    pub(crate) static PIECE: RefCell<Scratch> = RefCell::new(Scratch::new());
}

/// Runs `f` with a thread-local scratch, or a fresh one if that one is busy
/// (a nested call).
pub(crate) fn with_scratch<R>(
    key: &'static std::thread::LocalKey<RefCell<Scratch>>,
    f: impl FnOnce(&mut Scratch) -> R,
) -> R {
    key.with(|cell| match cell.try_borrow_mut() {
        Ok(mut s) => f(&mut s),
        Err(_) => f(&mut Scratch::new()),
    })
}

/// `len` bytes of data at `pos` run past the end of device `d`.
fn data_out_of_image(d: &BlockDev, pos: u64, len: usize) -> Error {
    Error::corrupt(
        pos,
        Corrupt::DataOutOfImage {
            len,
            pos,
            device: d.store().path().to_owned(),
            size: d.size(),
        },
    )
}

impl Erofs {
    /// Resolves (device id, byte position) to an opened device and position.
    pub(crate) fn resolve(&self, device_id: u16, pos: u64, at: u64) -> Result<(usize, u64)> {
        let bs_bits = self.sb.blkszbits;
        if device_id == 0 {
            // A block address may fall into an extra device's mapped range.
            let blk = pos >> bs_bits;
            for (i, d) in self.devices.iter().enumerate() {
                let start = d.slot.mapped_blkaddr;
                if d.dev.is_some() && start != 0 && blk >= start && blk - start < d.slot.blocks {
                    return Ok((i + 1, pos - (start << bs_bits)));
                }
            }
            return Ok((0, pos));
        }
        let d = self
            .devices
            .get(usize::from(device_id) - 1)
            .ok_or_else(|| {
                Error::corrupt(
                    at,
                    Corrupt::NoSuchDevice {
                        device: device_id,
                        devices: self.devices.len(),
                    },
                )
            })?;
        match d.dev {
            Some(_) => Ok((usize::from(device_id), pos)),
            None => {
                let base = d.slot.mapped_blkaddr << bs_bits;
                let p = pos.checked_add(base).ok_or_else(|| {
                    Error::corrupt(
                        at,
                        Corrupt::DeviceAddressOverflow {
                            device: device_id,
                            pos,
                        },
                    )
                })?;
                Ok((0, p))
            }
        }
    }

    pub(crate) fn device(&self, i: usize) -> &BlockDev {
        if i == 0 {
            &self.dev
        } else {
            self.devices[i - 1]
                .dev
                .as_ref()
                .expect("resolved to an opened device")
        }
    }

    /// Maps offset `ofs` (< size) of an uncompressed inode to the run holding
    /// it, extended over physically adjacent chunks up to `want_end`.
    pub(crate) fn map_flat(&self, inode: &Inode, ofs: u64, want_end: u64) -> Result<Run> {
        let bs = u64::from(self.sb.block_size());
        let blk_pos = |inode: &Inode| {
            inode.start_block().checked_mul(bs).ok_or_else(|| {
                Error::corrupt(inode.pos, Corrupt::BlockAddressOverflow { nid: inode.nid })
            })
        };
        match inode.layout {
            // A start block of all ones: no blocks, the file is zeros.
            Layout::FlatPlain if inode.no_blocks() => Ok(Run {
                la: 0,
                len: inode.size,
                phys: Phys::Hole,
            }),
            Layout::FlatPlain => Ok(Run {
                la: 0,
                len: inode.size,
                phys: Phys::At(0, blk_pos(inode)?),
            }),
            Layout::FlatInline => {
                let tail = (inode.size.div_ceil(bs).saturating_sub(1)) * bs;
                if ofs < tail {
                    return Ok(Run {
                        la: 0,
                        len: tail,
                        phys: Phys::At(0, blk_pos(inode)?),
                    });
                }
                let pos = inode.trailer_pos();
                let len = inode.size - tail;
                if pos % bs + len > bs {
                    return Err(Error::corrupt(
                        pos,
                        Corrupt::InlineTailCrossesBlock {
                            nid: inode.nid,
                            len,
                        },
                    ));
                }
                Ok(Run {
                    la: tail,
                    len,
                    phys: if inode.in_metabox {
                        Phys::Metabox(pos)
                    } else {
                        Phys::Tail(pos)
                    },
                })
            }
            Layout::ChunkBased => {
                let fmt = ChunkFormat::of(inode, self.sb.blkszbits)?;
                let table_end = fmt.entry_pos(inode, fmt.count(inode.size));
                if table_end.is_none_or(|end| end > self.meta_limit(inode)) {
                    return Err(Error::corrupt(
                        inode.pos,
                        Corrupt::ChunkTableOutOfImage {
                            nid: inode.nid,
                            size: inode.size,
                        },
                    ));
                }
                let csize = 1u64 << fmt.chunkbits;
                let first = ofs >> fmt.chunkbits;
                let (mut run, mut phys_end) = self.chunk_run(inode, &fmt, first)?;
                let mut n = first + 1;
                while run.la + run.len < want_end.min(inode.size) {
                    let (next, next_end) = self.chunk_run(inode, &fmt, n)?;
                    let adjacent = match (run.phys, next.phys) {
                        (Phys::Hole, Phys::Hole) => true,
                        (Phys::At(d, _), Phys::At(e, p)) => d == e && phys_end == p,
                        _ => false,
                    };
                    if !adjacent || run.len % csize != 0 {
                        break;
                    }
                    run.len += next.len;
                    phys_end = next_end;
                    n += 1;
                }
                Ok(run)
            }
            Layout::CompressedFull | Layout::CompressedCompact => {
                unreachable!("compressed inodes are read through zmap")
            }
        }
    }

    /// Chunk `n` as a run, and the physical position just past it.
    pub(crate) fn chunk_run(&self, inode: &Inode, fmt: &ChunkFormat, n: u64) -> Result<(Run, u64)> {
        let la = n << fmt.chunkbits;
        let len = (1u64 << fmt.chunkbits).min(inode.size - la);
        let pos = fmt.entry_pos(inode, n).ok_or_else(|| {
            Error::corrupt(
                inode.pos,
                Corrupt::ChunkTableOutOfImage {
                    nid: inode.nid,
                    size: inode.size,
                },
            )
        })?;
        let mut raw = [0u8; 8];
        let raw = &mut raw[..fmt.entry_size() as usize];
        self.meta_of(inode, pos, raw)?;
        let e = ChunkEntry::parse(raw, self.device_id_mask, fmt.wide);
        let Some(blkaddr) = e.blkaddr else {
            return Ok((
                Run {
                    la,
                    len,
                    phys: Phys::Hole,
                },
                0,
            ));
        };
        // 48 bits of blocks at most, so this cannot overflow.
        let bytes = blkaddr << self.sb.blkszbits;
        let (dev, p) = self.resolve(e.device_id, bytes, pos)?;
        Ok((
            Run {
                la,
                len,
                phys: Phys::At(dev, p),
            },
            p + len,
        ))
    }

    /// Reads `len` bytes of file data at `pos` of device `dev`, all or an
    /// error: with `directio`, read with `O_DIRECT` and kept in no cache,
    /// as the kernel reads it.
    pub(crate) fn read_phys_data<'a>(
        &self,
        dev: usize,
        pos: u64,
        len: usize,
        scratch: &'a mut Scratch,
    ) -> Result<&'a [u8]> {
        self.read_phys_via(dev, pos, len, scratch, true)
    }

    /// Reads file data at `pos` of device `dev` into `out`, all or an
    /// error: a file's body beside its inline tail goes straight into the
    /// reply, not through a scratch buffer and a copy.
    fn read_phys_into(&self, dev: usize, pos: u64, out: &mut [u8]) -> Result<()> {
        let d = self.device(dev);
        let got = with_scratch(&PIECE, |piece| d.read_data_into(pos, out, piece))?;
        if got != out.len() {
            return Err(data_out_of_image(d, pos, out.len()));
        }
        Ok(())
    }

    /// As [`Erofs::read_phys_data`]; through the page cache and the block
    /// cache unless `data` (directories, the metabox, the packed inode).
    fn read_phys_via<'a>(
        &self,
        dev: usize,
        pos: u64,
        len: usize,
        scratch: &'a mut Scratch,
        data: bool,
    ) -> Result<&'a [u8]> {
        let d = self.device(dev);
        let got = if data {
            d.read_data(pos, len, scratch)?
        } else {
            d.read(pos, len, scratch)?
        };
        if got.len() != len {
            return Err(data_out_of_image(d, pos, len));
        }
        Ok(got)
    }

    /// Reads the data of `inode` at `offset`, up to `size` bytes, through
    /// the caches: for directories and the inodes that hold metadata.
    pub fn read_inode<'a>(
        &self,
        inode: &Inode,
        offset: u64,
        size: u32,
        scratch: &'a mut Scratch,
    ) -> Result<&'a [u8]> {
        self.read_inode_via(inode, offset, size, scratch, false)
    }

    /// Reads a file's data at `offset`, up to `size` bytes, for a reader:
    /// as [`Erofs::read_inode`], but with `directio` uncompressed data is
    /// read with `O_DIRECT`.
    pub fn read_file<'a>(
        &self,
        inode: &Inode,
        offset: u64,
        size: u32,
        scratch: &'a mut Scratch,
    ) -> Result<&'a [u8]> {
        self.read_inode_via(inode, offset, size, scratch, true)
    }

    fn read_inode_via<'a>(
        &self,
        inode: &Inode,
        offset: u64,
        size: u32,
        scratch: &'a mut Scratch,
        data: bool,
    ) -> Result<&'a [u8]> {
        if offset >= inode.size || size == 0 {
            return Ok(&[]);
        }
        let end = inode.size.min(offset + u64::from(size));
        let total = (end - offset) as usize;
        if inode.layout.is_compressed() {
            return self.read_compressed(inode, offset, end, scratch);
        }
        let run = self.map_flat(inode, offset, end)?;
        if run.la + run.len >= end {
            let within = offset - run.la;
            return match run.phys {
                Phys::At(dev, p) => self.read_phys_via(dev, p + within, total, scratch, data),
                Phys::Metabox(p) => {
                    let out = scratch.get(total);
                    self.metabox_bytes(inode.nid, p + within, out)?;
                    Ok(out)
                }
                Phys::Tail(p) => {
                    let out = scratch.get(total);
                    self.meta(p + within, out)?;
                    Ok(out)
                }
                Phys::Hole => {
                    let out = scratch.get(total);
                    out.fill(0);
                    Ok(out)
                }
            };
        }
        let out = scratch.get(total);
        let mut pos = offset;
        let mut run = run;
        loop {
            let n = ((run.la + run.len).min(end) - pos) as usize;
            let at = (pos - offset) as usize;
            match run.phys {
                Phys::Hole => out[at..at + n].fill(0),
                Phys::Metabox(p) => {
                    self.metabox_bytes(inode.nid, p + (pos - run.la), &mut out[at..at + n])?
                }
                Phys::Tail(p) => self.meta(p + (pos - run.la), &mut out[at..at + n])?,
                Phys::At(dev, p) if data => {
                    self.read_phys_into(dev, p + (pos - run.la), &mut out[at..at + n])?
                }
                Phys::At(dev, p) => with_scratch(&PIECE, |piece| -> Result<()> {
                    let got = self.read_phys_via(dev, p + (pos - run.la), n, piece, false)?;
                    out[at..at + n].copy_from_slice(got);
                    Ok(())
                })?,
            }
            pos += n as u64;
            if pos >= end {
                break;
            }
            run = self.map_flat(inode, pos, end)?;
            if run.la > pos || run.la + run.len <= pos {
                return Err(Error::corrupt(
                    inode.pos,
                    Corrupt::NoDataRun {
                        nid: inode.nid,
                        offset: pos,
                    },
                ));
            }
        }
        Ok(out)
    }

    /// Reads up to `len` bytes at `offset` of `inode` into a new vector.
    pub fn read_to_vec(&self, inode: &Inode, offset: u64, len: usize) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        let mut scratch = Scratch::new();
        let end = inode.size.min(offset.saturating_add(len as u64));
        let mut pos = offset;
        while pos < end {
            let want = (end - pos).min(1 << 20) as u32;
            let got = self.read_inode(inode, pos, want, &mut scratch)?;
            if got.is_empty() {
                break;
            }
            out.extend_from_slice(got);
            pos += got.len() as u64;
        }
        Ok(out)
    }
}
