//! Which folios hold a file's pages in the kernel's page cache: the file
//! is mapped and each page touched, its frame read from
//! `/proc/self/pagemap`, and the frame's flags from `/proc/kpageflags`
//! (root only). A folio is a head page and the tail pages after it.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::mapping::Mapping;

const PAGE: u64 = 4096;

/// Which pages of the first `len` bytes of `f` are in the page cache, by
/// mincore(2) (which tells of the page cache to the file's owner or a
/// writer; a test's own file is both).
pub fn resident(f: &File, len: usize) -> io::Result<Vec<bool>> {
    let vec = Mapping::read_only(f, len)?.resident()?;
    Ok(vec.iter().map(|b| b & 1 == 1).collect())
}

/// `KPF_COMPOUND_TAIL` of `/proc/kpageflags`.
const TAIL: u64 = 1 << 16;

/// Folio sizes in bytes, each with how many folios of that size hold the
/// file's pages. Pages not in memory (holes) count in none.
pub fn sizes(path: &Path) -> io::Result<BTreeMap<u64, u64>> {
    let file = File::open(path)?;
    let len = file.metadata()?.len();
    let mut out = BTreeMap::new();
    if len == 0 {
        return Ok(out);
    }
    let len = usize::try_from(len).map_err(io::Error::other)?;
    let map = Mapping::read_only(&file, len)?;
    walk(&map, &mut out).map(|()| out)
}

fn walk(map: &Mapping, out: &mut BTreeMap<u64, u64>) -> io::Result<()> {
    let (addr, len) = (map.addr(), map.len());
    let pages = (len as u64).div_ceil(PAGE);
    for i in 0..pages {
        map.touch((i * PAGE) as usize);
    }
    let pagemap = File::open("/proc/self/pagemap")?;
    let flags = File::open("/proc/kpageflags")?;
    let mut run = 0u64;
    let mut flush = |run: &mut u64| {
        if *run > 0 {
            *out.entry(*run * PAGE).or_default() += 1;
        }
        *run = 0;
    };
    let mut entry = [0u8; 8];
    for i in 0..pages {
        pagemap.read_exact_at(&mut entry, (addr as u64 / PAGE + i) * 8)?;
        let e = u64::from_le_bytes(entry);
        if e >> 63 == 0 {
            flush(&mut run);
            continue;
        }
        let pfn = e & ((1 << 55) - 1);
        if pfn == 0 {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "page frames are hidden (reading them needs CAP_SYS_ADMIN)",
            ));
        }
        flags.read_exact_at(&mut entry, pfn * 8)?;
        if u64::from_le_bytes(entry) & TAIL != 0 && run > 0 {
            run += 1;
        } else {
            flush(&mut run);
            run = 1;
        }
    }
    flush(&mut run);
    Ok(())
}
