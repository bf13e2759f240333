//! The backing store: an image file or a block device, read with `pread`.

use std::fs::File;
use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use foliofs_vfs::{Error, Result};

/// How the backing file is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum IoMode {
    /// Through the page cache (the default: shares cached pages with every
    /// other reader of the image, as the kernel's file-backed mounts do).
    #[default]
    Buffered,
    /// `O_DIRECT`: bypasses the page cache; needs aligned offsets, lengths
    /// and buffers, which [`crate::BlockDev`] provides.
    Direct,
}

/// An open image file or block device.
#[derive(Debug)]
pub struct Store {
    file: File,
    path: PathBuf,
    size: u64,
    mode: IoMode,
    /// Offset and length alignment `O_DIRECT` needs (1 when buffered).
    dio_align: u32,
    /// Why `O_DIRECT` was asked for but not used, if so.
    fallback: Option<String>,
}

impl Store {
    /// Opens `path` read-only. With [`IoMode::Direct`], a backing file that
    /// refuses `O_DIRECT` (at open or at the first read) is read buffered
    /// instead, with a warning, as the kernel's file-backed mounts do.
    pub fn open(path: &Path, mode: IoMode) -> Result<Store> {
        let io_err = |source: io::Error| Error::Io { offset: 0, source };
        let plain = File::open(path).map_err(|e| Error::Io {
            offset: 0,
            source: io::Error::new(e.kind(), format!("{}: {e}", path.display())),
        })?;
        let meta = plain.metadata().map_err(io_err)?;
        let size = if meta.file_type().is_block_device() {
            (&plain).seek(SeekFrom::End(0)).map_err(io_err)?
        } else if meta.is_file() {
            meta.len()
        } else {
            return Err(Error::Io {
                offset: 0,
                source: io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{}: not a regular file or block device", path.display()),
                ),
            });
        };
        let mut store = Store {
            file: plain,
            path: path.to_owned(),
            size,
            mode: IoMode::Buffered,
            dio_align: 1,
            fallback: None,
        };
        if mode == IoMode::Direct {
            match Self::open_direct(path, size) {
                Ok((file, align)) => {
                    store.file = file;
                    store.mode = IoMode::Direct;
                    store.dio_align = align;
                }
                Err(why) => {
                    log::warn!(
                        "{}: O_DIRECT not supported ({why}); reading buffered",
                        path.display()
                    );
                    store.fallback = Some(why);
                }
            }
        }
        Ok(store)
    }

    fn open_direct(path: &Path, size: u64) -> std::result::Result<(File, u32), String> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .map_err(|e| e.to_string())?;
        let align = dio_alignment(&file).max(512);
        // Some file systems accept the flag at open and refuse the read.
        if size >= u64::from(align) {
            let mut probe = vec![0u8; 2 * align as usize];
            let off = probe.as_ptr().align_offset(align as usize);
            file.read_at(&mut probe[off..off + align as usize], 0)
                .map_err(|e| format!("probe read: {e}"))?;
        }
        Ok((file, align))
    }

    /// The image's size in bytes, as seen when it was opened.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The path it was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The I/O mode actually in use.
    pub fn mode(&self) -> IoMode {
        self.mode
    }

    /// Why direct I/O was asked for and not used, if it was.
    pub fn direct_fallback(&self) -> Option<&str> {
        self.fallback.as_deref()
    }

    /// The alignment direct reads need (offset, length and memory); 1 when buffered.
    pub fn dio_align(&self) -> u32 {
        self.dio_align
    }

    /// Fills `buf` from `offset`. Short reads (the file shrank under us) are
    /// an I/O error naming the offset, never silent zeroes. In direct mode the
    /// caller passes aligned offset, length and memory; the end of the file
    /// may fall inside `buf`, and only then does this return fewer bytes.
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            match self.file.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(source) => {
                    return Err(Error::Io {
                        offset: offset + done as u64,
                        source,
                    })
                }
            }
        }
        let want = buf.len().min(self.size.saturating_sub(offset) as usize);
        if done < want {
            return Err(Error::Io {
                offset: offset + done as u64,
                source: io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "{}: image ends at byte {} (it was {} bytes when opened)",
                        self.path.display(),
                        offset + done as u64,
                        self.size
                    ),
                ),
            });
        }
        Ok(done)
    }

    /// Asks the kernel to start reading `[offset, offset + len)` into the
    /// page cache. The kernel submits the reads without waiting for them
    /// (it may still wait for a free slot in a full device queue): later
    /// reads of the range then find it there, or in flight. Many such hints at once keep the
    /// device busy with several requests where one reader would wait for
    /// each in turn. Buffered stores only: direct reads bypass the page
    /// cache, so there is nothing to fill.
    pub fn will_need(&self, offset: u64, len: u64) {
        if self.mode != IoMode::Buffered || len == 0 || offset >= self.size {
            return;
        }
        let len = len.min(self.size - offset);
        let (Ok(off), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
            return;
        };
        // SAFETY: posix_fadvise reads only its integer arguments. It is a
        // hint: a failure changes nothing, so its result is not needed.
        unsafe {
            libc::posix_fadvise(self.file.as_raw_fd(), off, len, libc::POSIX_FADV_WILLNEED);
        }
    }

    /// The raw descriptor (for `posix_fadvise` and the like).
    pub fn raw_fd(&self) -> i32 {
        self.file.as_raw_fd()
    }
}

/// The offset alignment `O_DIRECT` needs on this file, from `statx`
/// (`STATX_DIOALIGN`, Linux 6.1+); 4096 when the kernel does not say.
fn dio_alignment(file: &File) -> u32 {
    // SAFETY: `libc::statx` is integers only, for which all-zero bytes are a
    // valid value.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: statx only writes into `stx`, which we own and which outlives
    // the call, and reads the empty, NUL-terminated path; the descriptor is
    // open.
    let rc = unsafe {
        libc::statx(
            file.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            &mut stx,
        )
    };
    if rc == 0 && stx.stx_mask & libc::STATX_DIOALIGN != 0 && stx.stx_dio_offset_align != 0 {
        stx.stx_dio_offset_align.max(stx.stx_dio_mem_align)
    } else {
        4096
    }
}
