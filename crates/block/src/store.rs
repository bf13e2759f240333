//! The backing store: an image file or a block device, read with `pread`,
//! or an object in remote storage read through its disk cache.

use std::fs::File;
use std::io::{self, Seek, SeekFrom};
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use foliofs_vfs::{AlignedBuf, Error, Result};

use crate::remote::{self, RemoteObject};
use crate::OpenOptions;

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

/// What a store reads.
#[derive(Debug)]
enum Backing {
    /// The file for data, and, in direct mode, a second buffered handle for
    /// metadata (the first one when buffered).
    File {
        data: File,
        meta: Option<File>,
    },
    Remote(Arc<RemoteObject>),
}

/// An open image file, block device or remote object.
#[derive(Debug)]
pub struct Store {
    backing: Backing,
    /// The path, or for a remote object its URL as shown (no query string
    /// or user info), so messages built from it carry no secret.
    path: PathBuf,
    size: u64,
    mode: IoMode,
    /// Offset and length alignment `O_DIRECT` needs (1 when buffered).
    dio_align: u32,
    /// Why `O_DIRECT` was asked for but not used, if so.
    fallback: Option<String>,
}

impl Store {
    /// Opens `path` read-only, with `opts.io_mode`; a path that
    /// [`remote::is_remote`] recognises is a URL, opened with `opts.remote`
    /// (and never with `O_DIRECT`: it is read through its disk cache). With
    /// [`IoMode::Direct`], a backing file that refuses `O_DIRECT` (at open
    /// or at the first read) is read buffered instead, with a warning, as
    /// the kernel's file-backed mounts do.
    pub fn open(path: &Path, opts: &OpenOptions) -> Result<Store> {
        if remote::is_remote(path) {
            return Self::open_remote(path, opts);
        }
        let mode = opts.io_mode;
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
            backing: Backing::File {
                data: plain,
                meta: None,
            },
            path: path.to_owned(),
            size,
            mode: IoMode::Buffered,
            dio_align: 1,
            fallback: None,
        };
        if mode == IoMode::Direct {
            match Self::open_direct(path, size) {
                Ok((file, align)) => {
                    // Metadata keeps the buffered handle, as the kernel's
                    // file-backed EROFS reads its metadata through the
                    // image's page cache whatever `directio` says.
                    let Backing::File { data, meta } = &mut store.backing else {
                        unreachable!("a local store")
                    };
                    *meta = Some(std::mem::replace(data, file));
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

    fn open_remote(path: &Path, opts: &OpenOptions) -> Result<Store> {
        let invalid = |why: String| Error::Io {
            offset: 0,
            source: io::Error::new(io::ErrorKind::InvalidInput, why),
        };
        let Some(url) = path.to_str() else {
            return Err(invalid(format!(
                "{}: a URL must be valid UTF-8",
                remote::redact(&path.to_string_lossy())
            )));
        };
        if opts.io_mode == IoMode::Direct {
            return Err(invalid(format!(
                "{}: `directio` does not apply to an image in object storage (it is read through its disk cache)",
                remote::redact(url)
            )));
        }
        let object = RemoteObject::open(url, &opts.remote)?;
        Ok(Store {
            path: PathBuf::from(object.shown()),
            size: object.size(),
            backing: Backing::Remote(object),
            mode: IoMode::Buffered,
            dio_align: 1,
            fallback: None,
        })
    }

    /// The remote object behind this store, if it is one.
    pub fn remote(&self) -> Option<&Arc<RemoteObject>> {
        match &self.backing {
            Backing::Remote(o) => Some(o),
            Backing::File { .. } => None,
        }
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
            let mut probe = AlignedBuf::new(align as usize, align as usize);
            file.read_at(probe.as_mut_slice(), 0)
                .map_err(|e| format!("probe read: {e}"))?;
        }
        Ok((file, align))
    }

    /// The image's size in bytes, as seen when it was opened.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The path it was opened from (for a remote object, its URL without
    /// query string or user info).
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

    /// Fills `buf` from `offset` with file data (`O_DIRECT` in direct
    /// mode). Short reads (the file shrank under us) are an I/O error naming
    /// the offset, never silent zeroes. In direct mode the caller passes
    /// aligned offset, length and memory; the end of the file may fall
    /// inside `buf`, and only then does this return fewer bytes.
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        match &self.backing {
            Backing::File { data, .. } => self.read_file_at(data, buf, offset),
            Backing::Remote(o) => o.read_at(buf, offset),
        }
    }

    /// As [`Store::read_at`], for metadata: always through the page cache,
    /// with no alignment asked of the caller.
    pub fn read_meta_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        match &self.backing {
            Backing::File { data, meta } => {
                self.read_file_at(meta.as_ref().unwrap_or(data), buf, offset)
            }
            Backing::Remote(o) => o.read_at(buf, offset),
        }
    }

    fn read_file_at(&self, file: &File, buf: &mut [u8], offset: u64) -> Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            match file.read_at(&mut buf[done..], offset + done as u64) {
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

    /// Asks the kernel to start reading the metadata in `[offset, offset +
    /// len)` into the page cache ([`Store::read_meta_at`] reads through it
    /// in either mode). The kernel submits the reads without waiting for
    /// them (it may still wait for a free slot in a full device queue):
    /// later reads of the range then find it there, or in flight. Many such
    /// hints at once keep the device busy with several requests where one
    /// reader would wait for each in turn. A remote store queues the chunks
    /// of the range for its fetch threads (after the reads someone waits
    /// for).
    pub fn will_need(&self, offset: u64, len: u64) {
        let file = match &self.backing {
            Backing::File { data, meta } => meta.as_ref().unwrap_or(data),
            Backing::Remote(o) => return o.will_need(offset, len),
        };
        if len == 0 || offset >= self.size {
            return;
        }
        let len = len.min(self.size - offset);
        let (Ok(off), Ok(len)) = (i64::try_from(offset), i64::try_from(len)) else {
            return;
        };
        // SAFETY: posix_fadvise reads only its integer arguments. It is a
        // hint: a failure changes nothing, so its result is not needed.
        unsafe {
            libc::posix_fadvise(file.as_raw_fd(), off, len, libc::POSIX_FADV_WILLNEED);
        }
    }

    /// The raw descriptor of a local store (for `posix_fadvise` and the
    /// like); `None` for a remote one.
    pub fn raw_fd(&self) -> Option<i32> {
        match &self.backing {
            Backing::File { data, .. } => Some(data.as_raw_fd()),
            Backing::Remote(_) => None,
        }
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
