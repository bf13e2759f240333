//! Conversions between the `vfs` types and the kernel's records, shared by
//! every request handler of the server, and the owner and permission
//! overrides applied on the way out.

use std::time::Duration;

use foliofs_vfs::{self as vfs, Attr, Ctx, TimeSet};

use crate::kernel::abi;

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

/// Who sent the request.
pub(crate) fn ctx(h: &abi::InHeader, umask: u32) -> Ctx {
    Ctx {
        uid: h.uid,
        gid: h.gid,
        pid: h.pid,
        umask,
    }
}

/// A time of a SETATTR: `now` for `*_NOW`, else the seconds and
/// nanoseconds sent.
pub(crate) fn time_set(now: bool, sec: u64, nsec: u32) -> TimeSet {
    if now {
        TimeSet::Now
    } else {
        TimeSet::At(timespec(sec, nsec))
    }
}

/// A time as the protocol sends it: seconds as the two's complement of a
/// 64-bit signed count, nanoseconds beside them.
pub(crate) fn timespec(sec: u64, nsec: u32) -> vfs::Timespec {
    vfs::Timespec {
        sec: sec as i64,
        nsec: nsec.min(999_999_999),
    }
}

/// `a` as the kernel takes it, after the overrides; `st_ino` is what
/// `stat` reports (the file system's own number).
pub(crate) fn fuse_attr(mut a: Attr, st_ino: u64, overrides: &Overrides) -> abi::Attr {
    if !overrides.is_empty() {
        overrides.apply(&mut a);
    }
    abi::Attr {
        ino: st_ino,
        size: a.size,
        blocks: a.blocks,
        atime: a.atime.sec as u64,
        mtime: a.mtime.sec as u64,
        ctime: a.ctime.sec as u64,
        atimensec: a.atime.nsec,
        mtimensec: a.mtime.nsec,
        ctimensec: a.ctime.nsec,
        mode: a.kind.mode_bits() | u32::from(a.perm),
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev.to_new_encoding(),
        blksize: a.blksize,
        flags: 0,
    }
}

/// Seconds and nanoseconds of a cache lifetime.
pub(crate) fn ttl_parts(ttl: Duration) -> (u64, u32) {
    (ttl.as_secs(), ttl.subsec_nanos())
}

/// A LOOKUP-style reply naming node `nodeid` (0: a name known to be
/// missing, or, in a listing, an entry that links no inode).
pub(crate) fn entry_out(nodeid: u64, attr: abi::Attr, ttl: Duration) -> abi::EntryOut {
    let (s, ns) = ttl_parts(ttl);
    abi::EntryOut {
        nodeid,
        generation: 0,
        entry_valid: s,
        attr_valid: s,
        entry_valid_nsec: ns,
        attr_valid_nsec: ns,
        attr,
    }
}

/// A GETATTR or SETATTR reply.
pub(crate) fn attr_out(attr: abi::Attr, ttl: Duration) -> abi::AttrOut {
    let (s, ns) = ttl_parts(ttl);
    abi::AttrOut {
        attr_valid: s,
        attr_valid_nsec: ns,
        dummy: 0,
        attr,
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
