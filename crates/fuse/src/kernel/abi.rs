//! The FUSE protocol as the kernel defines it (`include/uapi/linux/fuse.h`,
//! protocol 7.44 in Linux 6.18): flags and the fixed records of
//! requests, replies and notifications. Records are `repr(C)` with the
//! kernel's field order and widths; zerocopy reads them from and writes
//! them to bytes without `unsafe` and checks at compile time that they
//! have no padding of their own.
//!
//! Only what foliofs speaks is here: the records of both transports and of
//! the notifications, some of which a given mount never sends.

// The protocol's names as one table, used or not by a given build path.
#![allow(dead_code)]

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// The protocol version replied to INIT: 7 and the kernel's minor, at most
/// this one.
pub const KERNEL_VERSION: u32 = 7;
/// The newest minor version whose records are these.
pub const KERNEL_MINOR_VERSION: u32 = 44;
/// The oldest minor version served: every record here has its 7.31 size
/// from then on (Linux 5.4), and the flags asked for exist.
pub const OLDEST_MINOR_VERSION: u32 = 31;

/// The node id of the root.
pub const ROOT_ID: u64 = 1;

/// Notification codes (the `error` field of a notification's header).
pub mod notify {
    pub const INVAL_INODE: i32 = 2;
    pub const INVAL_ENTRY: i32 = 3;
    pub const STORE: i32 = 4;
    pub const RESEND: i32 = 7;
}

/// INIT flags (`flags`, and `flags2` shifted up by 32).
pub mod init {
    pub const ASYNC_READ: u64 = 1 << 0;
    pub const ATOMIC_O_TRUNC: u64 = 1 << 3;
    pub const BIG_WRITES: u64 = 1 << 5;
    pub const DO_READDIRPLUS: u64 = 1 << 13;
    pub const READDIRPLUS_AUTO: u64 = 1 << 14;
    pub const WRITEBACK_CACHE: u64 = 1 << 16;
    pub const PARALLEL_DIROPS: u64 = 1 << 18;
    pub const HANDLE_KILLPRIV: u64 = 1 << 19;
    pub const MAX_PAGES: u64 = 1 << 22;
    pub const CACHE_SYMLINKS: u64 = 1 << 23;
    pub const HANDLE_KILLPRIV_V2: u64 = 1 << 28;
    pub const INIT_EXT: u64 = 1 << 30;
    pub const PASSTHROUGH: u64 = 1 << 37;
    pub const HAS_RESEND: u64 = 1 << 39;
    pub const OVER_IO_URING: u64 = 1 << 41;
}

/// `fuse_open_out.open_flags`.
pub mod fopen {
    pub const DIRECT_IO: u32 = 1 << 0;
    pub const KEEP_CACHE: u32 = 1 << 1;
    pub const PASSTHROUGH: u32 = 1 << 7;
}

/// `fuse_setattr_in.valid`.
pub mod fattr {
    pub const MODE: u32 = 1 << 0;
    pub const UID: u32 = 1 << 1;
    pub const GID: u32 = 1 << 2;
    pub const SIZE: u32 = 1 << 3;
    pub const ATIME: u32 = 1 << 4;
    pub const MTIME: u32 = 1 << 5;
    pub const FH: u32 = 1 << 6;
    pub const ATIME_NOW: u32 = 1 << 7;
    pub const MTIME_NOW: u32 = 1 << 8;
    pub const CTIME: u32 = 1 << 10;
    pub const KILL_SUIDGID: u32 = 1 << 11;
}

/// `fuse_write_in.write_flags`.
pub const WRITE_CACHE: u32 = 1 << 0;
/// `fuse_write_in.write_flags`: the writer lacks `CAP_FSETID`.
pub const WRITE_KILL_SUIDGID: u32 = 1 << 2;
/// `fuse_open_in.open_flags` / `fuse_create_in.open_flags`: a truncating
/// open by someone without `CAP_FSETID` (with `HANDLE_KILLPRIV_V2`).
pub const OPEN_KILL_SUIDGID: u32 = 1 << 0;
/// `fuse_fsync_in.fsync_flags`.
pub const FSYNC_FDATASYNC: u32 = 1 << 0;
/// A resent request has this bit set in its `unique`.
pub const UNIQUE_RESEND: u64 = 1 << 63;

/// The smallest buffer a read of `/dev/fuse` may use.
pub const MIN_READ_BUFFER: usize = 8192;

/// `ioctl` numbers of `/dev/fuse` (`_IOR`/`_IOW` of magic 229).
pub mod ioctl {
    /// `FUSE_DEV_IOC_CLONE`: `_IOR(229, 0, uint32_t)`.
    pub const CLONE: u64 = (2 << 30) | (4 << 16) | (229 << 8);
    /// `FUSE_DEV_IOC_BACKING_OPEN`: `_IOW(229, 1, struct fuse_backing_map)`.
    pub const BACKING_OPEN: u64 = (1 << 30) | (16 << 16) | (229 << 8) | 1;
    /// `FUSE_DEV_IOC_BACKING_CLOSE`: `_IOW(229, 2, uint32_t)`.
    pub const BACKING_CLOSE: u64 = (1 << 30) | (4 << 16) | (229 << 8) | 2;
}

macro_rules! records {
    ($($(#[$m:meta])* pub struct $name:ident { $($(#[$fm:meta])* pub $f:ident: $t:ty,)* })*) => {
        $(
            $(#[$m])*
            #[repr(C)]
            #[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
            pub struct $name { $($(#[$fm])* pub $f: $t,)* }
        )*
    };
}

records! {
    /// Every request starts with this.
    pub struct InHeader {
        pub len: u32,
        pub opcode: u32,
        pub unique: u64,
        pub nodeid: u64,
        pub uid: u32,
        pub gid: u32,
        pub pid: u32,
        pub total_extlen: u16,
        pub padding: u16,
    }

    /// Every reply and notification starts with this.
    pub struct OutHeader {
        pub len: u32,
        pub error: i32,
        pub unique: u64,
    }

    pub struct Attr {
        pub ino: u64,
        pub size: u64,
        pub blocks: u64,
        pub atime: u64,
        pub mtime: u64,
        pub ctime: u64,
        pub atimensec: u32,
        pub mtimensec: u32,
        pub ctimensec: u32,
        pub mode: u32,
        pub nlink: u32,
        pub uid: u32,
        pub gid: u32,
        pub rdev: u32,
        pub blksize: u32,
        pub flags: u32,
    }

    pub struct EntryOut {
        pub nodeid: u64,
        pub generation: u64,
        pub entry_valid: u64,
        pub attr_valid: u64,
        pub entry_valid_nsec: u32,
        pub attr_valid_nsec: u32,
        pub attr: Attr,
    }

    pub struct AttrOut {
        pub attr_valid: u64,
        pub attr_valid_nsec: u32,
        pub dummy: u32,
        pub attr: Attr,
    }

    pub struct ForgetIn {
        pub nlookup: u64,
    }

    pub struct ForgetOne {
        pub nodeid: u64,
        pub nlookup: u64,
    }

    pub struct BatchForgetIn {
        pub count: u32,
        pub dummy: u32,
    }

    pub struct GetattrIn {
        pub getattr_flags: u32,
        pub dummy: u32,
        pub fh: u64,
    }

    pub struct MknodIn {
        pub mode: u32,
        pub rdev: u32,
        pub umask: u32,
        pub padding: u32,
    }

    pub struct MkdirIn {
        pub mode: u32,
        pub umask: u32,
    }

    pub struct RenameIn {
        pub newdir: u64,
    }

    pub struct Rename2In {
        pub newdir: u64,
        pub flags: u32,
        pub padding: u32,
    }

    pub struct LinkIn {
        pub oldnodeid: u64,
    }

    pub struct SetattrIn {
        pub valid: u32,
        pub padding: u32,
        pub fh: u64,
        pub size: u64,
        pub lock_owner: u64,
        pub atime: u64,
        pub mtime: u64,
        pub ctime: u64,
        pub atimensec: u32,
        pub mtimensec: u32,
        pub ctimensec: u32,
        pub mode: u32,
        pub unused4: u32,
        pub uid: u32,
        pub gid: u32,
        pub unused5: u32,
    }

    pub struct OpenIn {
        pub flags: u32,
        pub open_flags: u32,
    }

    pub struct CreateIn {
        pub flags: u32,
        pub mode: u32,
        pub umask: u32,
        pub open_flags: u32,
    }

    pub struct OpenOut {
        pub fh: u64,
        pub open_flags: u32,
        pub backing_id: i32,
    }

    pub struct ReleaseIn {
        pub fh: u64,
        pub flags: u32,
        pub release_flags: u32,
        pub lock_owner: u64,
    }

    pub struct FlushIn {
        pub fh: u64,
        pub unused: u32,
        pub padding: u32,
        pub lock_owner: u64,
    }

    pub struct ReadIn {
        pub fh: u64,
        pub offset: u64,
        pub size: u32,
        pub read_flags: u32,
        pub lock_owner: u64,
        pub flags: u32,
        pub padding: u32,
    }

    pub struct WriteIn {
        pub fh: u64,
        pub offset: u64,
        pub size: u32,
        pub write_flags: u32,
        pub lock_owner: u64,
        pub flags: u32,
        pub padding: u32,
    }

    pub struct WriteOut {
        pub size: u32,
        pub padding: u32,
    }

    pub struct Kstatfs {
        pub blocks: u64,
        pub bfree: u64,
        pub bavail: u64,
        pub files: u64,
        pub ffree: u64,
        pub bsize: u32,
        pub namelen: u32,
        pub frsize: u32,
        pub padding: u32,
        pub spare: [u32; 6],
    }

    pub struct FsyncIn {
        pub fh: u64,
        pub fsync_flags: u32,
        pub padding: u32,
    }

    /// Without `FUSE_SETXATTR_EXT` (never asked for), 8 bytes.
    pub struct SetxattrIn {
        pub size: u32,
        pub flags: u32,
    }

    pub struct GetxattrIn {
        pub size: u32,
        pub padding: u32,
    }

    pub struct GetxattrOut {
        pub size: u32,
        pub padding: u32,
    }

    pub struct AccessIn {
        pub mask: u32,
        pub padding: u32,
    }

    pub struct InitIn {
        pub major: u32,
        pub minor: u32,
        pub max_readahead: u32,
        pub flags: u32,
        pub flags2: u32,
        pub unused: [u32; 11],
    }

    pub struct InitOut {
        pub major: u32,
        pub minor: u32,
        pub max_readahead: u32,
        pub flags: u32,
        pub max_background: u16,
        pub congestion_threshold: u16,
        pub max_write: u32,
        pub time_gran: u32,
        pub max_pages: u16,
        pub map_alignment: u16,
        pub flags2: u32,
        pub max_stack_depth: u32,
        pub request_timeout: u16,
        pub unused: [u16; 11],
    }

    pub struct InterruptIn {
        pub unique: u64,
    }

    pub struct FallocateIn {
        pub fh: u64,
        pub offset: u64,
        pub length: u64,
        pub mode: u32,
        pub padding: u32,
    }

    pub struct LseekIn {
        pub fh: u64,
        pub offset: u64,
        pub whence: u32,
        pub padding: u32,
    }

    pub struct LseekOut {
        pub offset: u64,
    }

    pub struct Dirent {
        pub ino: u64,
        pub off: u64,
        pub namelen: u32,
        pub kind: u32,
    }

    pub struct NotifyInvalInodeOut {
        pub ino: u64,
        pub off: i64,
        pub len: i64,
    }

    pub struct NotifyInvalEntryOut {
        pub parent: u64,
        pub namelen: u32,
        pub flags: u32,
    }

    pub struct NotifyStoreOut {
        pub nodeid: u64,
        pub offset: u64,
        pub size: u32,
        pub padding: u32,
    }

    pub struct BackingMap {
        pub fd: i32,
        pub flags: u32,
        pub padding: u64,
    }

    /// Part of the 288-byte header of an io_uring entry.
    pub struct UringEntInOut {
        pub flags: u64,
        pub commit_id: u64,
        pub payload_sz: u32,
        pub padding: u32,
        pub reserved: u64,
    }

    /// The 16 bytes of an io_uring FUSE command (`sqe->cmd`).
    pub struct UringCmdReq {
        pub flags: u64,
        pub commit_id: u64,
        pub qid: u16,
        pub padding: [u8; 6],
    }
}

/// Bytes of `fuse_uring_req_header`'s first two parts: the in/out header
/// area and the per-opcode area.
pub const URING_HEADER_AREA: usize = 128;

/// `d_type` of a file type, as directory entries carry it.
pub fn dirent_type(mode: u32) -> u32 {
    (mode & libc::S_IFMT) >> 12
}

/// The size of a record padded as directory entries are (to 8 bytes).
pub const fn align8(n: usize) -> usize {
    (n + 7) & !7
}

// The kernel's sizes, so a field added or dropped by mistake fails the
// build rather than the mount.
const _: () = {
    assert!(size_of::<InHeader>() == 40);
    assert!(size_of::<OutHeader>() == 16);
    assert!(size_of::<Attr>() == 88);
    assert!(size_of::<EntryOut>() == 128);
    assert!(size_of::<AttrOut>() == 104);
    assert!(size_of::<SetattrIn>() == 88);
    assert!(size_of::<ReadIn>() == 40);
    assert!(size_of::<WriteIn>() == 40);
    assert!(size_of::<Kstatfs>() == 80);
    assert!(size_of::<InitIn>() == 64);
    assert!(size_of::<InitOut>() == 64);
    assert!(size_of::<Dirent>() == 24);
    assert!(size_of::<OpenOut>() == 16);
    assert!(size_of::<BackingMap>() == 16);
    assert!(size_of::<UringEntInOut>() == 32);
    assert!(size_of::<UringCmdReq>() == 24);
};
