//! A byte buffer whose bytes start at an aligned address, as `O_DIRECT`
//! reads and the kernel's shared buffers need.

/// A window of bytes starting at an address aligned to a power of two,
/// cut from an over-allocated vector: the vector keeps `align` bytes of
/// slack and the window starts at its first aligned address, so no
/// `unsafe` allocation is needed.
///
/// The window does not move while the buffer lives, unless
/// [`AlignedBuf::resize`] has to grow the vector: a buffer whose address
/// is handed to the kernel is made once with [`AlignedBuf::new`] and only
/// read and written after that.
#[derive(Clone, Default)]
pub struct AlignedBuf {
    raw: Vec<u8>,
    start: usize,
    len: usize,
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("len", &self.len)
            .field("capacity", &self.raw.len())
            .finish()
    }
}

impl AlignedBuf {
    /// `len` zero bytes starting at an address aligned to `align` (a power
    /// of two).
    pub fn new(len: usize, align: usize) -> AlignedBuf {
        let mut b = AlignedBuf {
            raw: vec![0u8; len + align],
            start: 0,
            len: 0,
        };
        b.cut(len, align);
        b
    }

    /// Makes the window `len` bytes aligned to `align` (a power of two),
    /// growing the vector when it is too short (the window may then move),
    /// and returns it. Its contents are whatever was there before.
    pub fn resize(&mut self, len: usize, align: usize) -> &mut [u8] {
        let need = len + align;
        if self.raw.len() < need {
            self.raw.resize(need, 0);
        }
        self.cut(len, align);
        self.as_mut_slice()
    }

    /// Makes the window `len` bytes aligned to `align` (a power of two) if
    /// the vector already has room for it, so reusing a buffer never
    /// allocates; returns false, leaving the buffer as it was, if it has
    /// not.
    pub fn refit(&mut self, len: usize, align: usize) -> bool {
        if self.raw.len() < len + align {
            return false;
        }
        self.cut(len, align);
        true
    }

    fn cut(&mut self, len: usize, align: usize) {
        debug_assert!(align.is_power_of_two());
        // With `align` bytes of slack the offset is below `align`, so the
        // window fits the vector.
        self.start = self.raw.as_ptr().align_offset(align);
        self.len = len;
    }

    /// The window.
    pub fn as_slice(&self) -> &[u8] {
        &self.raw[self.start..self.start + self.len]
    }

    /// The window, to fill.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..self.start + self.len]
    }

    /// The window's length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the window is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes held, slack included (for memory accounting).
    pub fn capacity(&self) -> usize {
        self.raw.len()
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl AsMut<[u8]> for AlignedBuf {
    fn as_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn aligned(b: &[u8], align: usize) -> bool {
        (b.as_ptr() as usize).is_multiple_of(align)
    }

    #[test]
    fn a_new_buffer_is_zeroed_and_aligned() {
        for align in [1usize, 512, 4096] {
            let b = AlignedBuf::new(5000, align);
            assert_eq!(b.len(), 5000);
            assert!(aligned(b.as_slice(), align));
            assert!(b.as_slice().iter().all(|&x| x == 0));
            assert_eq!(b.capacity(), 5000 + align);
        }
    }

    #[test]
    fn resizing_grows_only_when_too_short() {
        let mut b = AlignedBuf::default();
        assert!(b.is_empty());
        assert_eq!(b.capacity(), 0);
        let w = b.resize(10_000, 4096);
        assert_eq!(w.len(), 10_000);
        assert!(aligned(w, 4096));
        w[9_999] = 7;
        // Smaller and less aligned: the same vector, re-cut.
        let w = b.resize(100, 512);
        assert_eq!(w.len(), 100);
        assert!(aligned(w, 512));
        assert_eq!(b.capacity(), 10_000 + 4096);
    }

    #[test]
    fn refitting_never_allocates() {
        let mut b = AlignedBuf::new(4096, 512);
        b.as_mut_slice()[0] = 1;
        assert!(!b.refit(4096, 4096), "no room for 4 KiB at 4 KiB");
        assert_eq!((b.len(), b.as_slice()[0]), (4096, 1), "left as it was");
        assert!(b.refit(2048, 1024));
        assert_eq!(b.len(), 2048);
        assert!(aligned(b.as_slice(), 1024));
        assert_eq!(b.capacity(), 4096 + 512);
    }

    #[test]
    fn the_window_is_what_the_slices_see() {
        let mut b = AlignedBuf::new(8, 64);
        b.as_mut().copy_from_slice(b"12345678");
        assert_eq!(b.as_ref(), b"12345678");
    }
}
