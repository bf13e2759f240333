//! A compressed file on its way into the image: read in segments, each
//! handed to the workers as it is read, and written (its pclusters, then
//! its extents to the spill file) when its turn in the queue comes.

use std::io::Read;
use std::path::PathBuf;

use super::{Outcome, Pcluster, SEGMENT};
use crate::mkfs::data::{self, FileData};
use crate::mkfs::tree::{Body, Meta, NodeId};
use crate::mkfs::{truncated, BuildError, Builder, EntryError};

/// A file whose data goes through the compression queue.
pub(crate) struct ZFile {
    node: NodeId,
    size: u64,
    /// The tail room, for a file stored uncompressed after all.
    room: Option<u64>,
    what: String,
    data: FileData,
    /// Its extents so far, until its last segment is written.
    extents: Vec<Pcluster>,
}

impl Builder {
    /// Adds a regular file while compressing: its segments go to the
    /// workers as they are read, and are written as they come back, in
    /// order. A file of one block or less, which cannot be stored in
    /// fewer blocks, goes through the queue as it is, so that data stays
    /// in the order it was read.
    pub(crate) fn add_compressed(
        &mut self,
        comps: &[&[u8]],
        meta: Meta,
        r: &mut dyn Read,
        size: u64,
        room: Option<u64>,
        what: &dyn Fn() -> String,
    ) -> Result<NodeId, EntryError> {
        let small = size <= 1u64 << self.opts.blkszbits;
        let mut first = None;
        if small {
            let mut v = vec![0; size as usize];
            let got = data::read_full(r, &mut v)
                .map_err(|e| EntryError::Build(BuildError::io(what())(e)))?;
            if got < v.len() {
                return Err(EntryError::Build(truncated(what, size, got as u64)));
            }
            first = Some(v);
        }
        let placeholder = FileData::placed_later(size);
        let node = self
            .tree
            .insert(comps, meta, Body::File(placeholder.clone()))
            .map_err(EntryError::Bad)?;
        let slot = self.zfiles.len();
        self.zfiles.push(ZFile {
            node,
            size,
            room,
            what: what(),
            data: placeholder,
            extents: Vec::new(),
        });
        if let Some(v) = first {
            self.data_bytes += size;
            self.queue().plain(slot, v);
            self.write_while_full().map_err(EntryError::Build)?;
            return Ok(node);
        }
        let whole = size <= SEGMENT as u64;
        let mut done = 0u64;
        let mut seg = 0u32;
        while done < size {
            let n = (size - done).min(SEGMENT as u64) as usize;
            let mut buf = vec![0; n];
            let got = data::read_full(r, &mut buf)
                .map_err(|e| EntryError::Build(BuildError::io(what())(e)))?;
            if got < n {
                return Err(EntryError::Build(truncated(what, size, done + got as u64)));
            }
            self.queue().submit(slot, seg, buf, whole);
            self.write_while_full().map_err(EntryError::Build)?;
            done += n as u64;
            seg += 1;
        }
        self.data_bytes += size;
        Ok(node)
    }

    fn queue(&mut self) -> &mut super::Queue {
        self.queue.as_mut().expect("compressing")
    }

    /// Writes out the oldest segments while the queue holds more than a
    /// few per worker.
    fn write_while_full(&mut self) -> Result<(), BuildError> {
        while self.queue().full() {
            self.write_oldest()?;
        }
        Ok(())
    }

    /// Writes the oldest queued segment into the image; false when there
    /// was none.
    fn write_oldest(&mut self) -> Result<bool, BuildError> {
        let Some((slot, seg, out)) = self.queue.as_mut().and_then(|q| q.pop()) else {
            return Ok(false);
        };
        let z = &mut self.zfiles[slot];
        let start = u64::from(seg) * SEGMENT as u64;
        let len = (z.size - start).min(SEGMENT as u64);
        let out = out.map_err(|why| BuildError::Source {
            path: PathBuf::from(&z.what),
            why,
        })?;
        match out {
            Outcome::Plain(v) => {
                let what = z.what.clone();
                z.data = self
                    .w
                    .file(&mut v.as_slice(), z.size, z.room, &|| what.clone())?;
            }
            Outcome::Packed(pk) => {
                if seg == 0 {
                    z.data.blkaddr = self.w.next_block;
                }
                let blocks = pk.bytes.len() as u64 / self.w.blksz;
                self.w
                    .raw(&pk.bytes)
                    .map_err(BuildError::io("writing the image"))?;
                z.data.blocks += blocks;
                z.extents.extend(pk.extents.into_iter().map(|mut e| {
                    e.la += start;
                    e
                }));
                if start + len == z.size {
                    let ext = std::mem::take(&mut z.extents);
                    z.data.z = Some(
                        self.w
                            .spill_extents(&ext)
                            .map_err(BuildError::io("writing the spill file"))?,
                    );
                }
            }
        }
        Ok(true)
    }

    /// Writes every queued segment and gives each compressed file's node
    /// where its data went.
    pub(crate) fn drain(&mut self) -> Result<(), BuildError> {
        while self.write_oldest()? {}
        for z in self.zfiles.drain(..) {
            self.tree.nodes[z.node].body = Body::File(z.data);
        }
        Ok(())
    }
}
