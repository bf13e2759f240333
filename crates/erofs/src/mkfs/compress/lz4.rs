//! LZ4 and LZ4HC through liblz4's destSize entry points: the only
//! compressors that stop when the output is full, which is what a
//! fixed-size physical cluster needs. `lz4-sys`'s bundled C library
//! exports them although the crate does not bind them, so they are
//! declared here as lz4.h and lz4hc.h give them; this is the crate's only
//! `unsafe`.

#![allow(unsafe_code)]

use std::os::raw::{c_char, c_int, c_void};

// Linked for its bundled liblz4.
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

/// LZ4's fast compressor, or LZ4HC at a level with its state.
pub(super) struct Lz4 {
    /// The HC state (null for the fast compressor).
    hc: *mut c_void,
    level: u8,
}

// SAFETY: the HC state is owned by this value alone and used by one
// thread at a time; liblz4's states hold no thread-affine data.
unsafe impl Send for Lz4 {}

impl Lz4 {
    /// The fast compressor (`hc` None) or LZ4HC at level `hc`.
    pub fn new(hc: Option<u8>) -> Result<Lz4, String> {
        let Some(level) = hc else {
            return Ok(Lz4 {
                hc: std::ptr::null_mut(),
                level: 0,
            });
        };
        // SAFETY: no arguments; the result is checked for null.
        let state = unsafe { LZ4_createStreamHC() };
        if state.is_null() {
            return Err("liblz4 could not allocate an LZ4HC state".into());
        }
        Ok(Lz4 { hc: state, level })
    }

    /// Compresses the longest prefix of `src` that fits `dst`:
    /// (compressed length, input consumed).
    pub fn dest_size(&mut self, src: &[u8], dst: &mut [u8]) -> Result<(usize, usize), String> {
        let mut consumed = c_int::try_from(src.len()).map_err(|_| "segment too large")?;
        let cap = c_int::try_from(dst.len()).map_err(|_| "pcluster too large")?;
        let n = if self.hc.is_null() {
            // SAFETY: `src` is valid for `consumed` bytes and `dst` for
            // `cap`; liblz4 reads and writes no further and sets
            // `consumed` to what it took.
            unsafe {
                LZ4_compress_destSize(
                    src.as_ptr().cast(),
                    dst.as_mut_ptr().cast(),
                    &mut consumed,
                    cap,
                )
            }
        } else {
            // SAFETY: as above; `hc` is a live state from
            // LZ4_createStreamHC, which the call reinitialises.
            unsafe {
                LZ4_compress_HC_destSize(
                    self.hc,
                    src.as_ptr().cast(),
                    dst.as_mut_ptr().cast(),
                    &mut consumed,
                    cap,
                    c_int::from(self.level),
                )
            }
        };
        if n <= 0 || consumed <= 0 || consumed as usize > src.len() || n > cap {
            return Err(format!(
                "liblz4 failed to compress {} bytes into {cap}",
                src.len()
            ));
        }
        Ok((n as usize, consumed as usize))
    }
}

impl Drop for Lz4 {
    fn drop(&mut self) {
        if !self.hc.is_null() {
            // SAFETY: `hc` came from LZ4_createStreamHC and is freed once.
            unsafe { LZ4_freeStreamHC(self.hc) };
        }
    }
}
