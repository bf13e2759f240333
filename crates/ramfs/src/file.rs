//! Open files and what they hold: opening and closing, and reading,
//! writing, allocating and seeking through [`FileData`]; symlink targets.
//!
//! [`FileData`]: crate::data::FileData

use std::sync::atomic::Ordering;

use foliofs_vfs::{Error, FileType, Ino, Result, Scratch, Timespec};

use crate::backing::Backed;
use crate::data::MAX_FILE_SIZE;
use crate::node::{Body, State};
use crate::RamFs;

impl RamFs {
    pub(crate) fn open_node(&self, st: &mut State, flags: i32) -> u64 {
        if flags & libc::O_TRUNC != 0 && flags & libc::O_ACCMODE != libc::O_RDONLY {
            match &mut st.body {
                Body::File(f) => {
                    f.truncate(0, u64::from(self.block_size), &self.space);
                    st.touch_mc(Timespec::now());
                }
                Body::Backed(b) => {
                    if let Err(e) = b.truncate(0) {
                        log::warn!("truncating a backing file at open: {e}");
                    }
                    st.touch_mc(Timespec::now());
                }
                _ => {}
            }
        }
        st.opens += 1;
        // The low bit of a handle says whether it may write, so `release`
        // can keep `writers` right without a table of handles.
        let writable = flags & libc::O_ACCMODE != libc::O_RDONLY;
        if writable {
            st.writers += 1;
        }
        (self.next_fh.fetch_add(1, Ordering::Relaxed) << 1) | u64::from(writable)
    }

    pub(crate) fn do_read<'a>(
        &self,
        ino: Ino,
        offset: u64,
        size: u32,
        scratch: &'a mut Scratch,
    ) -> Result<&'a [u8]> {
        let node = self.table.get(ino)?;
        let st = node.read();
        let file = match (&st.body, node.kind) {
            (Body::File(f), _) => f,
            (Body::Backed(b), _) => {
                let buf = scratch.get(size as usize);
                let n = b.read_into(offset, buf).map_err(io_error)?;
                return Ok(&buf[..n]);
            }
            (_, FileType::Directory) => return Err(Error::IsDir),
            _ => return Err(Error::Invalid),
        };
        if offset >= file.size {
            return Ok(&[]);
        }
        let n = u64::from(size).min(file.size - offset) as usize;
        let buf = scratch.get(n);
        file.read_into(offset, buf, self.bs());
        Ok(buf)
    }

    pub(crate) fn do_readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        let node = self.table.get(ino)?;
        let st = node.read();
        match &st.body {
            Body::Symlink(t) => Ok(t.clone()),
            _ => Err(Error::NotSymlink),
        }
    }

    pub(crate) fn do_open(&self, ino: Ino, flags: i32) -> Result<u64> {
        let node = self.table.get(ino)?;
        let mut st = node.write();
        if !self.logs() {
            return Ok(self.open_node(&mut st, flags));
        }
        let before = crate::durable::blocks_in(&st, 0, u64::MAX);
        let fh = self.open_node(&mut st, flags);
        self.log(ino, fh, |tx| {
            tx.changed(&node, &mut st);
            if let Some(f) = st.file() {
                tx.blocks(ino, &before, f, 0, u64::MAX);
            }
        });
        Ok(fh)
    }

    pub(crate) fn do_release(&self, ino: Ino, fh: u64) -> Result<()> {
        // A create's descriptor nobody took (the open was not passed
        // through) would keep an unlinked file's memory. Only a pool's
        // creates keep one.
        if self.is_backed() {
            drop(self.take_fresh(ino));
        }
        let node = self.table.get(ino)?;
        let mut st = node.write();
        st.opens = st.opens.saturating_sub(1);
        if fh & 1 == 1 {
            st.writers = st.writers.saturating_sub(1);
        }
        self.settle(&node, &mut st);
        if self.logs() {
            self.log(ino, fh, |tx| tx.changed(&node, &mut st));
        }
        Ok(())
    }

    pub(crate) fn do_write(
        &self,
        ino: Ino,
        _fh: u64,
        offset: u64,
        data: &[u8],
        _flags: i32,
    ) -> Result<u32> {
        // The kernel resolves O_APPEND to an offset (its view of the size is
        // exact: every change goes through it), and with the writeback cache
        // it writes whole pages back through whichever handle it has, so the
        // offset is always the one to honour.
        let node = self.table.get(ino)?;
        if offset
            .checked_add(data.len() as u64)
            .is_none_or(|e| e > MAX_FILE_SIZE)
        {
            return Err(Error::TooBig);
        }
        let mut st = node.write();
        let bs = self.bs();
        let file = match &mut st.body {
            Body::File(f) => f,
            Body::Backed(b) => {
                // Pages this process fills are charged to its cgroup.
                if !self.space.take_page_cache(data.len() as u64) {
                    return Err(Error::NoSpace);
                }
                let n = b.write(offset, data).map_err(io_error)?;
                if n > 0 {
                    st.touch_mc(Timespec::now());
                }
                if self.logs() {
                    self.log(ino, 0, |tx| tx.changed(&node, &mut st));
                }
                return Ok(n as u32);
            }
            _ if node.kind == FileType::Directory => return Err(Error::IsDir),
            _ => return Err(Error::Invalid),
        };
        let span = (offset / bs, (offset + data.len() as u64).div_ceil(bs));
        let had = file.allocated();
        let before: Vec<(u64, u64)> = if self.logs() {
            file.arena_blocks(span.0, span.1).collect()
        } else {
            Vec::new()
        };
        let n = file.write(offset, data, bs, &self.space);
        let grew = file.allocated() != had;
        if n == 0 && !data.is_empty() {
            return Err(Error::NoSpace);
        }
        if n > 0 {
            st.touch_mc(Timespec::now());
        }
        if self.logs() {
            self.log(ino, 0, |tx| {
                tx.changed(&node, &mut st);
                if let (true, Some(f)) = (grew, st.file()) {
                    tx.blocks(ino, &before, f, span.0, span.1);
                }
            });
        }
        Ok(n as u32)
    }

    pub(crate) fn do_fallocate(&self, ino: Ino, offset: u64, length: u64, mode: i32) -> Result<()> {
        let node = self.table.get(ino)?;
        let end = offset
            .checked_add(length)
            .filter(|&e| e <= MAX_FILE_SIZE)
            .ok_or(Error::TooBig)?;
        if length == 0 {
            return Err(Error::Invalid);
        }
        let mut st = node.write();
        let bs = self.bs();
        let file = match &mut st.body {
            Body::File(f) => f,
            // The pool's tmpfs knows every mode ramfs does (and refuses the
            // rest with the same errno).
            Body::Backed(b) => {
                if mode & libc::FALLOC_FL_PUNCH_HOLE == 0 && !self.space.take_page_cache(length) {
                    return Err(Error::NoSpace);
                }
                b.fallocate(mode, offset, length).map_err(io_error)?;
                st.touch_mc(Timespec::now());
                if self.logs() {
                    self.log(ino, 0, |tx| tx.changed(&node, &mut st));
                }
                return Ok(());
            }
            _ if node.kind == FileType::Directory => return Err(Error::IsDir),
            _ => return Err(Error::Errno(libc::ENODEV)),
        };
        let keep = mode & libc::FALLOC_FL_KEEP_SIZE != 0;
        let rest = mode & !libc::FALLOC_FL_KEEP_SIZE;
        let span = (offset / bs, end.div_ceil(bs));
        let before: Vec<(u64, u64)> = if self.logs() {
            file.arena_blocks(span.0, span.1).collect()
        } else {
            Vec::new()
        };
        match rest {
            0 => {
                if !file.allocate(offset..end, bs, &self.space) {
                    return Err(Error::NoSpace);
                }
            }
            // Past the end there is only zeros, but blocks kept there by
            // fallocate(KEEP_SIZE) are freed too.
            libc::FALLOC_FL_PUNCH_HOLE if keep => file.punch(offset..end, bs, &self.space),
            libc::FALLOC_FL_ZERO_RANGE => {
                if !file.zero_range(offset..end, bs, &self.space) {
                    return Err(Error::NoSpace);
                }
            }
            _ => return Err(Error::OperationNotSupported),
        }
        if !keep && end > file.size {
            file.size = end;
        }
        st.touch_mc(Timespec::now());
        if self.logs() {
            self.log(ino, 0, |tx| {
                tx.changed(&node, &mut st);
                if let Some(f) = st.file() {
                    tx.blocks(ino, &before, f, span.0, span.1);
                }
            });
        }
        Ok(())
    }

    pub(crate) fn do_lseek(&self, ino: Ino, offset: u64, whence: i32) -> Result<u64> {
        let node = self.table.get(ino)?;
        let st = node.read();
        if let Body::Backed(b) = &st.body {
            return b.seek(offset, whence).map_err(io_error);
        }
        let file = st.file().ok_or(Error::Invalid)?;
        if offset >= file.size {
            return Err(Error::NoDataPastOffset);
        }
        // While a handle that may write is open, a cache above this file
        // system can hold data not written here yet (the kernel's FUSE
        // writeback cache does not write back before asking), so a hole seen
        // here may be data there. Reporting no holes is always correct.
        if st.writers > 0 {
            return match whence {
                libc::SEEK_DATA => Ok(offset),
                libc::SEEK_HOLE => Ok(file.size),
                _ => Err(Error::Invalid),
            };
        }
        match whence {
            libc::SEEK_DATA => file
                .next_data(offset, self.bs())
                .ok_or(Error::NoDataPastOffset),
            libc::SEEK_HOLE => Ok(file.next_hole(offset, self.bs())),
            _ => Err(Error::Invalid),
        }
    }
}

/// An error of the pool's tmpfs as ramfs reports its own: a full pool is
/// this file system's `size=` reached.
pub(crate) fn io_error(e: std::io::Error) -> Error {
    match e.raw_os_error() {
        Some(libc::ENOSPC) => Error::NoSpace,
        Some(libc::EFBIG) => Error::TooBig,
        Some(libc::ENXIO) => Error::NoDataPastOffset,
        Some(libc::EOPNOTSUPP) => Error::OperationNotSupported,
        Some(libc::EINVAL) => Error::Invalid,
        Some(n) => Error::Errno(n),
        None => Error::Errno(libc::EIO),
    }
}

impl Backed {
    /// Whether this body is one; for the FUSE layer's passthrough.
    pub(crate) fn of(st: &crate::node::State) -> Option<&Backed> {
        match &st.body {
            Body::Backed(b) => Some(b),
            _ => None,
        }
    }
}
