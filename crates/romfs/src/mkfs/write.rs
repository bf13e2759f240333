//! Writing the laid-out image: the superblock, each header with its data
//! in file order, the padding, and last the superblock's checksum.

use super::*;

/// Writes the image in one pass, keeping count of what it wrote.
pub(super) struct ImageWriter<'a> {
    w: BufWriter<File>,
    image: &'a Path,
    /// Bytes written so far.
    pos: u64,
    buf: Vec<u8>,
    sum: Summary,
    prog: Progress,
}

impl<'a> ImageWriter<'a> {
    /// A writer of the image `out` (at `image`), the build's summary
    /// starting from `sum` and its progress from `prog`.
    pub(super) fn new(out: File, image: &'a Path, sum: Summary, prog: Progress) -> Self {
        ImageWriter {
            w: BufWriter::with_capacity(1 << 20, out),
            image,
            pos: 0,
            buf: vec![0u8; 1 << 20],
            sum,
            prog,
        }
    }

    /// The superblock, its volume name padded to `root_off`; `end` is the
    /// image's size before padding. Its checksum is left zero until
    /// [`fix_checksum`].
    pub(super) fn superblock(
        &mut self,
        volume: &[u8],
        root_off: u64,
        end: u64,
    ) -> Result<(), MkfsError> {
        let mut sb = Vec::with_capacity(root_off as usize);
        sb.extend_from_slice(MAGIC);
        sb.extend_from_slice(&(end as u32).to_be_bytes());
        sb.extend_from_slice(&[0; 4]);
        sb.extend_from_slice(volume);
        sb.resize(root_off as usize, 0);
        self.w.write_all(&sb).map_err(io_err(self.image))?;
        self.pos = root_off;
        Ok(())
    }

    /// One entry: zeros up to its offset, its header, its data (the
    /// file's, copied from `nodes`' path, or a symlink's target), and
    /// padding to 16 bytes.
    pub(super) fn slot(
        &mut self,
        s: &Slot,
        nodes: &[Node],
        progress: &mut dyn FnMut(&Progress),
    ) -> Result<(), MkfsError> {
        write_zeros(&mut self.w, s.offset - self.pos).map_err(io_err(self.image))?;
        let meta = self.header(s)?;
        self.pos = s.offset + meta;
        let dot = s.name == b"." || s.name == b"..";
        if !dot {
            self.sum.entries += 1;
        }
        match &s.data {
            Data::None => {
                if s.bits & 7 == 0 && !dot {
                    self.sum.hard_links += 1;
                }
            }
            Data::Bytes(b) => {
                self.w.write_all(b).map_err(io_err(self.image))?;
                self.pos += b.len() as u64;
            }
            Data::File(n) => self.file(&nodes[*n].path, u64::from(s.size), progress)?,
        }
        let pad = align_up(self.pos, 16) - self.pos;
        write_zeros(&mut self.w, pad).map_err(io_err(self.image))?;
        self.pos += pad;
        Ok(())
    }

    /// Writes `s`'s header with its checksum; returns its length.
    fn header(&mut self, s: &Slot) -> Result<u64, MkfsError> {
        let meta = meta_size(s.name.len()) as usize;
        let mut h = Vec::with_capacity(meta);
        h.extend_from_slice(&(s.next | s.bits).to_be_bytes());
        h.extend_from_slice(&s.spec.to_be_bytes());
        h.extend_from_slice(&s.size.to_be_bytes());
        h.extend_from_slice(&[0; 4]);
        h.extend_from_slice(&s.name);
        h.resize(meta, 0);
        let c = fix(&h);
        h[12..16].copy_from_slice(&c.to_be_bytes());
        self.w.write_all(&h).map_err(io_err(self.image))?;
        Ok(meta as u64)
    }

    /// Copies a regular file's `size` bytes, reporting progress every
    /// 64 MiB and after each file.
    fn file(
        &mut self,
        path: &Path,
        size: u64,
        progress: &mut dyn FnMut(&Progress),
    ) -> Result<(), MkfsError> {
        let prog = &mut self.prog;
        copy_file(path, size, &mut self.w, &mut self.buf, &mut |n| {
            prog.bytes_done += n;
            if prog.bytes_done % (64 << 20) < n {
                progress(prog);
            }
        })?;
        self.pos += size;
        self.sum.files += 1;
        self.sum.data_bytes += size;
        self.prog.files_done += 1;
        progress(&self.prog);
        Ok(())
    }

    /// Pads the image with zeros to `padded` bytes and flushes it; returns
    /// the file and the summary.
    pub(super) fn finish(mut self, padded: u64) -> Result<(File, Summary), MkfsError> {
        write_zeros(&mut self.w, padded - self.pos).map_err(io_err(self.image))?;
        let out = self.w.into_inner().map_err(|e| MkfsError::Io {
            path: self.image.to_owned(),
            source: e.into_error(),
        })?;
        Ok((out, self.sum))
    }
}

/// Sets the superblock's checksum over the first `min(end, 512)` bytes
/// written, and syncs the image.
pub(super) fn fix_checksum(mut out: File, image: &Path, end: u64) -> Result<(), MkfsError> {
    // The superblock checksum covers whatever headers and data fall in the
    // first 512 bytes, so it is fixed last.
    let span = end.min(u64::from(CHECKSUM_SPAN)) as usize;
    let mut head = vec![0u8; span];
    out.seek(SeekFrom::Start(0)).map_err(io_err(image))?;
    out.read_exact(&mut head).map_err(io_err(image))?;
    let c = word_sum(&head).wrapping_neg();
    out.seek(SeekFrom::Start(12)).map_err(io_err(image))?;
    out.write_all(&c.to_be_bytes()).map_err(io_err(image))?;
    out.sync_all().map_err(io_err(image))?;
    Ok(())
}

fn write_zeros(w: &mut impl Write, mut n: u64) -> std::io::Result<()> {
    const Z: [u8; 4096] = [0; 4096];
    while n > 0 {
        let k = n.min(Z.len() as u64) as usize;
        w.write_all(&Z[..k])?;
        n -= k as u64;
    }
    Ok(())
}

/// Copies exactly `size` bytes of `path`; a file that has shrunk or grown
/// since it was scanned is an error.
fn copy_file(
    path: &Path,
    size: u64,
    w: &mut impl Write,
    buf: &mut [u8],
    on_bytes: &mut dyn FnMut(u64),
) -> Result<(), MkfsError> {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(io_err(path))?;
    let mut left = size;
    while left > 0 {
        let k = left.min(buf.len() as u64) as usize;
        let n = f.read(&mut buf[..k]).map_err(io_err(path))?;
        if n == 0 {
            return Err(MkfsError::Changed {
                path: path.to_owned(),
                expected: size,
                found: format!("it ended after {}", size - left),
            });
        }
        w.write_all(&buf[..n]).map_err(io_err(path))?;
        left -= n as u64;
        on_bytes(n as u64);
    }
    let mut probe = [0u8; 1];
    if f.read(&mut probe).map_err(io_err(path))? != 0 {
        return Err(MkfsError::Changed {
            path: path.to_owned(),
            expected: size,
            found: "it has grown".into(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_that_changed_size_is_an_error_not_padding() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("f");
        std::fs::write(&p, vec![5u8; 1000]).unwrap();
        let mut buf = vec![0u8; 64];
        let mut sink = Vec::new();
        // Scanned at 1200 bytes, 1000 there now: it shrank.
        let e = copy_file(&p, 1200, &mut sink, &mut buf, &mut |_| {}).unwrap_err();
        assert!(
            matches!(&e, MkfsError::Changed { found, .. } if found.contains("ended after 1000")),
            "{e}"
        );
        // Scanned at 900 bytes: it grew.
        sink.clear();
        let e = copy_file(&p, 900, &mut sink, &mut buf, &mut |_| {}).unwrap_err();
        assert!(e.to_string().contains("grown"), "{e}");
        sink.clear();
        copy_file(&p, 1000, &mut sink, &mut buf, &mut |_| {}).unwrap();
        assert_eq!(sink, vec![5u8; 1000]);
    }
}
