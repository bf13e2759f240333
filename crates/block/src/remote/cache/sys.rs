//! The system calls beneath the cache: open file description locks,
//! punching holes, finding data, free space, and how its files are opened.

use std::fs::{self, File};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Takes (or converts this description's lock to) a read or write lock
/// on `file`, without waiting. An open file description lock: closing
/// the file drops it, it conflicts with other opens of the same file in
/// this process too, and converting it is atomic (a refused write lock
/// leaves the read lock held).
pub(super) fn lock(file: &File, kind: libc::c_int) -> io::Result<()> {
    // SAFETY: struct flock is plain integers, for which zeroes are valid.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = 0;
    fl.l_len = 1;
    // SAFETY: fcntl reads `fl`, which outlives the call, on a descriptor
    // that `file` keeps open.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLK, &fl) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Frees `[offset, offset + len)` of `file`, keeping its size.
pub(super) fn punch(file: &File, offset: u64, len: u64) -> io::Result<()> {
    // SAFETY: fallocate takes an open descriptor and integers only.
    let r = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset as libc::off_t,
            len as libc::off_t,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Where the first data of `file` at or after `offset` is, if any.
pub(super) fn next_data(file: &File, offset: u64) -> Option<u64> {
    // SAFETY: lseek takes an open descriptor and integers only.
    let at = unsafe { libc::lseek(file.as_raw_fd(), offset as libc::off_t, libc::SEEK_DATA) };
    u64::try_from(at).ok()
}

/// Bytes free for an unprivileged user on the file system of `path`.
pub(super) fn free_space(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs is plain integers, for which zeroes are valid.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `st` is ours to write.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    Some((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

/// Opens (creating it 0600) a file of the cache for reading and writing.
pub(super) fn open_rw(path: &Path) -> io::Result<File> {
    fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
}
