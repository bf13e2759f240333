//! A shared mapping of a file, unmapped when dropped: what the tests and
//! the bench map files for (reading through a mapping, asking mincore(2)
//! what is cached, finding the frames behind its pages).
//!
//! Its bytes are only ever copied in and out, never lent as a `&[u8]`: a
//! shared mapping changes under any reference when the file is written,
//! which is what the tests that map files are about.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;

/// The first `len` bytes of a file, mapped shared (`MAP_SHARED`), so the
/// mapping sees the page cache and, when writable, changes it.
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
    writable: bool,
}

// SAFETY: the mapping belongs to this value alone; its bytes are only
// copied in and out through raw pointers, which any thread may do.
unsafe impl Send for Mapping {}
// SAFETY: as for `Send`: no method lends a reference into the mapping.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps the first `len` bytes of `f` for reading. `len` 0 is refused,
    /// as mmap(2) refuses it (`EINVAL`).
    pub fn read_only(f: &File, len: usize) -> io::Result<Mapping> {
        Mapping::new(f, len, false)
    }

    /// Maps the first `len` bytes of `f` for reading and writing (`f` open
    /// for both).
    pub fn read_write(f: &File, len: usize) -> io::Result<Mapping> {
        Mapping::new(f, len, true)
    }

    fn new(f: &File, len: usize, writable: bool) -> io::Result<Mapping> {
        let prot = if writable {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: a new shared mapping with no address hint replaces no
        // existing memory; the result is checked before use and owned by
        // the value returned, which unmaps it.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                prot,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap returned 0"))?;
        Ok(Mapping { ptr, len, writable })
    }

    /// The mapping's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping is empty (never: mmap refuses 0 bytes).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The address of the mapping's first byte (for `/proc/self/pagemap`).
    pub fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    fn check(&self, at: usize, n: usize) {
        assert!(
            at.checked_add(n).is_some_and(|end| end <= self.len),
            "{at}+{n} is outside the mapping of {} bytes",
            self.len
        );
    }

    /// Copies the mapping's bytes from `at` into `buf`; panics if they
    /// run past its end.
    pub fn copy_out(&self, at: usize, buf: &mut [u8]) {
        self.check(at, buf.len());
        // SAFETY: `at..at + buf.len()` lies inside the live mapping
        // (checked above), which `buf`, a Rust borrow, cannot overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(at), buf.as_mut_ptr(), buf.len())
        }
    }

    /// `n` bytes from `at`, copied.
    pub fn get(&self, at: usize, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n];
        self.copy_out(at, &mut v);
        v
    }

    /// Reads the byte at `at` with a volatile load, so it is read (and its
    /// page faulted in) even when the value is not used.
    pub fn touch(&self, at: usize) -> u8 {
        self.check(at, 1);
        // SAFETY: `at` lies inside the live mapping (checked above).
        unsafe { std::ptr::read_volatile(self.ptr.as_ptr().add(at)) }
    }

    /// Copies `data` into the mapping at `at`; panics if the mapping is
    /// read-only or `data` runs past its end.
    pub fn write(&self, at: usize, data: &[u8]) {
        assert!(self.writable, "a read-only mapping");
        self.check(at, data.len());
        // SAFETY: `at..at + data.len()` lies inside the live, writable
        // mapping (checked above), which `data`, a Rust borrow, cannot
        // overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(at), data.len())
        }
    }

    /// mincore(2)'s vector: a byte per page of the mapping, bit 0 set
    /// where the page is in memory. Since Linux 5.0 it tells of the page
    /// cache only to the file's owner or one who may write it; others
    /// learn only of their own mapping's pages.
    pub fn resident(&self) -> io::Result<Vec<u8>> {
        // SAFETY: sysconf reads a constant.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let mut vec = vec![0u8; self.len.div_ceil(page)];
        // SAFETY: the live mapping's range, and `vec` has a byte for each
        // of its pages.
        let rc = unsafe { libc::mincore(self.ptr.as_ptr().cast(), self.len, vec.as_mut_ptr()) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(vec)
    }

    /// Writes the mapping's dirty pages back to the file and waits
    /// (msync(2) with `MS_SYNC`).
    pub fn sync(&self) -> io::Result<()> {
        // SAFETY: the live mapping's range; msync changes no memory.
        let rc = unsafe { libc::msync(self.ptr.as_ptr().cast(), self.len, libc::MS_SYNC) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping `new` made, unmapped once; nothing refers to
        // it past this value.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::FileExt;

    fn file(bytes: &[u8]) -> File {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(bytes).unwrap();
        f
    }

    #[test]
    fn a_read_only_mapping_copies_out_what_the_file_holds() {
        let f = file(b"hello, mapping");
        let m = Mapping::read_only(&f, 14).unwrap();
        assert_eq!(m.len(), 14);
        assert_eq!(m.get(7, 7), b"mapping");
        assert_eq!(m.touch(0), b'h');
        // A write(2) shows through the shared mapping.
        f.write_all_at(b"J", 0).unwrap();
        assert_eq!(m.touch(0), b'J');
        assert_eq!(m.resident().unwrap().len(), 1);
    }

    #[test]
    fn a_writable_mapping_writes_the_file() {
        let f = file(&[0u8; 5000]);
        let m = Mapping::read_write(&f, 5000).unwrap();
        m.write(4096, b"xy");
        m.sync().unwrap();
        let mut got = [0u8; 2];
        f.read_exact_at(&mut got, 4096).unwrap();
        assert_eq!(&got, b"xy");
    }

    #[test]
    fn nothing_is_mapped_for_zero_bytes() {
        let f = file(b"");
        assert!(Mapping::read_only(&f, 0).is_err());
    }

    #[test]
    #[should_panic(expected = "outside the mapping")]
    fn reads_past_the_end_panic() {
        let f = file(b"abc");
        Mapping::read_only(&f, 3).unwrap().get(2, 2);
    }

    #[test]
    #[should_panic(expected = "read-only")]
    fn a_read_only_mapping_refuses_writes() {
        let f = file(b"abc");
        Mapping::read_only(&f, 3).unwrap().write(0, b"x");
    }
}
