//! Conversions between the `vfs` types and fuser's, shared by every request
//! handler of the server, and the owner and permission overrides applied on
//! the way out.

use std::time::SystemTime;

use foliofs_vfs::{self as vfs, Attr, Ctx, Error, TimeSet};
use fuser::{Errno, INodeNo, Request, TimeOrNow};

/// Owner and permission overrides (`uid=`, `gid=`, `umask=`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Overrides {
    /// Owner reported for every inode (`uid=`).
    pub uid: Option<u32>,
    /// Group reported for every inode (`gid=`).
    pub gid: Option<u32>,
    /// Permission bits cleared, as [`Overrides::apply`] describes (`umask=`).
    pub umask: Option<u32>,
}

impl Overrides {
    /// Applies the overrides to `a`. With `umask=`, directories and files
    /// the image marks executable start from 0777, other files from 0666,
    /// and the umask clears bits from that (as vfat and udf do); symlinks
    /// keep 0777 since their mode is never checked.
    pub fn apply(&self, a: &mut Attr) {
        if let Some(uid) = self.uid {
            a.uid = uid;
        }
        if let Some(gid) = self.gid {
            a.gid = gid;
        }
        if let Some(umask) = self.umask {
            if a.kind != vfs::FileType::Symlink {
                let base = if a.kind == vfs::FileType::Directory || a.perm & 0o111 != 0 {
                    0o777
                } else {
                    0o666
                };
                a.perm = (base & !umask) as u16;
            }
        }
    }

    fn is_empty(&self) -> bool {
        *self == Overrides::default()
    }
}

pub(crate) fn errno(e: &Error) -> Errno {
    Errno::from_i32(e.errno())
}

pub(crate) fn fuser_kind(k: vfs::FileType) -> fuser::FileType {
    match k {
        vfs::FileType::RegularFile => fuser::FileType::RegularFile,
        vfs::FileType::Directory => fuser::FileType::Directory,
        vfs::FileType::Symlink => fuser::FileType::Symlink,
        vfs::FileType::BlockDevice => fuser::FileType::BlockDevice,
        vfs::FileType::CharDevice => fuser::FileType::CharDevice,
        vfs::FileType::Fifo => fuser::FileType::NamedPipe,
        vfs::FileType::Socket => fuser::FileType::Socket,
    }
}

pub(crate) fn ctx(req: &Request, umask: u32) -> Ctx {
    Ctx {
        uid: req.uid(),
        gid: req.gid(),
        pid: req.pid(),
        umask,
    }
}

pub(crate) fn time_set(t: TimeOrNow) -> TimeSet {
    match t {
        TimeOrNow::Now => TimeSet::Now,
        TimeOrNow::SpecificTime(t) => TimeSet::At(vfs::Timespec::from_system(t)),
    }
}

/// `a` as fuser wants it, after the overrides; `st_ino` is the node id the
/// kernel will use for entry replies, and the file system's own number for
/// attribute replies.
pub(crate) fn file_attr(mut a: Attr, st_ino: u64, overrides: &Overrides) -> fuser::FileAttr {
    if !overrides.is_empty() {
        overrides.apply(&mut a);
    }
    let time = |t: vfs::Timespec| -> SystemTime { t.to_system() };
    fuser::FileAttr {
        ino: INodeNo(st_ino),
        size: a.size,
        blocks: a.blocks,
        atime: time(a.atime),
        mtime: time(a.mtime),
        ctime: time(a.ctime),
        crtime: time(a.ctime),
        kind: fuser_kind(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev.to_new_encoding(),
        blksize: a.blksize,
        flags: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use foliofs_vfs::{FileType, Rdev, Timespec};

    fn attr(kind: FileType, perm: u16) -> Attr {
        Attr {
            ino: 7,
            size: 0,
            blocks: 0,
            kind,
            perm,
            nlink: 1,
            uid: 0,
            gid: 0,
            rdev: Rdev::default(),
            atime: Timespec::ZERO,
            mtime: Timespec::ZERO,
            ctime: Timespec::ZERO,
            blksize: 1024,
        }
    }

    #[test]
    fn overrides_set_owner_and_mask_permissions() {
        let o = Overrides {
            uid: Some(1000),
            gid: Some(100),
            umask: Some(0o027),
        };
        for (kind, perm, want) in [
            (FileType::Directory, 0o644, 0o750),
            (FileType::RegularFile, 0o644, 0o640),
            (FileType::RegularFile, 0o755, 0o750),
            (FileType::Symlink, 0o777, 0o777),
            (FileType::CharDevice, 0o600, 0o640),
        ] {
            let mut a = attr(kind, perm);
            o.apply(&mut a);
            assert_eq!((a.uid, a.gid, a.perm), (1000, 100, want), "{kind:?}");
        }
        let mut a = attr(FileType::RegularFile, 0o4755);
        Overrides::default().apply(&mut a);
        assert_eq!((a.uid, a.gid, a.perm), (0, 0, 0o4755));
    }
}
