//! [`Erofs`] behind the [`FileSystem`] trait.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use foliofs_vfs::{
    Attr, DirEntry, Error, FileSystem, FileType, FsInfo, Ino, Result, Scratch, StatFs,
};

use crate::data::Phys;
use crate::format::NAME_LEN_MAX;
use crate::inode::Layout;
use crate::{xattr, Corrupt, Erofs};

/// Longest symlink target read (the kernel's `PATH_MAX` less the NUL).
const SYMLINK_MAX: u64 = 4095;

impl FileSystem for Erofs {
    fn root(&self) -> Ino {
        self.ino_of(self.sb.root_nid)
    }

    fn info(&self) -> FsInfo {
        FsInfo {
            fs_type: "erofs",
            block_size: self.sb.block_size(),
            name_max: NAME_LEN_MAX as u32,
            read_only: true,
        }
    }

    fn statfs(&self) -> Result<StatFs> {
        Ok(self.statfs_inner())
    }

    fn getattr(&self, ino: Ino) -> Result<Attr> {
        Ok(self.attr(&self.inode(self.nid_of(ino))?))
    }

    fn lookup(&self, parent: Ino, name: &OsStr) -> Result<Attr> {
        let dir = self.dir_inode(parent)?;
        let name = name.as_bytes();
        if name.len() > NAME_LEN_MAX {
            return Err(Error::NameTooLong);
        }
        match self.lookup_nid(&dir, name)? {
            Some(nid) => Ok(self.attr(&self.inode(nid)?)),
            None => Err(Error::NotFound),
        }
    }

    fn readdir(
        &self,
        ino: Ino,
        offset: u64,
        sink: &mut dyn FnMut(DirEntry<'_>) -> bool,
    ) -> Result<()> {
        self.readdir_inner(ino, offset, false, sink)
    }

    /// The kernel's EROFS lists a directory's entries as they are stored,
    /// sorted by name, "." and ".." among them.
    fn lists_dots(&self) -> bool {
        true
    }

    fn readdir_with_dots(
        &self,
        ino: Ino,
        offset: u64,
        sink: &mut dyn FnMut(DirEntry<'_>) -> bool,
    ) -> Result<()> {
        self.readdir_inner(ino, offset, true, sink)
    }

    fn prefetch_dir(&self, ino: Ino, offset: u64, every: bool) {
        self.prefetch_dir_inner(ino, offset, every)
    }

    fn read<'a>(
        &self,
        ino: Ino,
        offset: u64,
        size: u32,
        scratch: &'a mut Scratch,
    ) -> Result<&'a [u8]> {
        let inode = self.inode(self.nid_of(ino))?;
        match inode.kind {
            FileType::Directory => Err(Error::IsDir),
            FileType::RegularFile | FileType::Symlink => {
                self.read_file(&inode, offset, size, scratch)
            }
            _ => Err(Error::Invalid),
        }
    }

    /// `SEEK_DATA` / `SEEK_HOLE`: chunk holes are holes, as the kernel's
    /// iomap reports them; every other layout is all data.
    fn lseek(&self, ino: Ino, offset: u64, whence: i32) -> Result<u64> {
        let inode = self.inode(self.nid_of(ino))?;
        if offset >= inode.size {
            return Err(Error::NoDataPastOffset);
        }
        if whence != libc::SEEK_DATA && whence != libc::SEEK_HOLE {
            return Err(Error::Invalid);
        }
        if inode.layout != Layout::ChunkBased {
            return Ok(if whence == libc::SEEK_DATA {
                offset
            } else {
                inode.size
            });
        }
        let want_hole = whence == libc::SEEK_HOLE;
        let mut pos = offset;
        while pos < inode.size {
            let run = self.map_flat(&inode, pos, inode.size)?;
            if run.la > pos || run.la + run.len <= pos {
                return Err(Error::corrupt(
                    inode.pos,
                    Corrupt::NoDataRun {
                        nid: inode.nid,
                        offset: pos,
                    },
                ));
            }
            if (run.phys == Phys::Hole) == want_hole {
                return Ok(pos);
            }
            pos = run.la + run.len;
        }
        // Past the last data there is only the implicit hole at EOF.
        if want_hole {
            Ok(inode.size)
        } else {
            Err(Error::NoDataPastOffset)
        }
    }

    fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        let inode = self.inode(self.nid_of(ino))?;
        if inode.kind != FileType::Symlink {
            return Err(Error::NotSymlink);
        }
        if inode.size > SYMLINK_MAX {
            return Err(Error::corrupt(
                inode.pos,
                Corrupt::SymlinkTooLong {
                    nid: inode.nid,
                    size: inode.size,
                },
            ));
        }
        let target = self.read_to_vec(&inode, 0, inode.size as usize)?;
        if target.len() as u64 != inode.size {
            return Err(Error::corrupt(
                inode.pos,
                Corrupt::SymlinkShort { nid: inode.nid },
            ));
        }
        Ok(target)
    }

    fn getxattr(&self, ino: Ino, name: &OsStr) -> Result<Vec<u8>> {
        let name = name.as_bytes();
        xattr::check_name(name)?;
        let inode = self.inode(self.nid_of(ino))?;
        for e in self.xattrs(&inode)? {
            if e.name == name {
                return self.xattr_value(&e);
            }
        }
        Err(Error::NoSuchXattr)
    }

    fn listxattr(&self, ino: Ino) -> Result<Vec<Vec<u8>>> {
        let inode = self.inode(self.nid_of(ino))?;
        Ok(self.xattrs(&inode)?.into_iter().map(|e| e.name).collect())
    }
}
