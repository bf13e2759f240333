//! Name lookup in a directory.

use foliofs_vfs::Result;

use crate::inode::Inode;
use crate::Erofs;

impl Erofs {
    /// Looks `name` up in `dir` by binary search over its sorted blocks.
    pub fn lookup_nid(&self, dir: &Inode, name: &[u8]) -> Result<Option<u64>> {
        let bs = u64::from(self.sb.block_size());
        let (mut lo, mut hi) = (0u64, dir.size.div_ceil(bs));
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let step = self.with_dir_block(dir, mid, |b| {
                let first = b.get(0).name;
                let last = b.get(b.len() - 1).name;
                Ok(if name < first {
                    Err(std::cmp::Ordering::Less)
                } else if name > last {
                    Err(std::cmp::Ordering::Greater)
                } else {
                    Ok(b.find(name).ok().map(|i| b.get(i).nid))
                })
            })?;
            match step {
                Ok(found) => return Ok(found),
                Err(std::cmp::Ordering::Less) => hi = mid,
                Err(_) => lo = mid + 1,
            }
        }
        Ok(None)
    }
}
