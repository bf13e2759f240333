use std::ffi::OsStr;
use std::sync::Arc;

use crate::{AlignedBuf, Ino};

/// The kind of an inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FileType {
    /// A regular file (`S_IFREG`).
    RegularFile,
    /// A directory (`S_IFDIR`).
    Directory,
    /// A symbolic link (`S_IFLNK`); its target is read with `readlink`.
    Symlink,
    /// A block device node (`S_IFBLK`); the device is in [`Attr::rdev`].
    BlockDevice,
    /// A character device node (`S_IFCHR`); the device is in [`Attr::rdev`].
    CharDevice,
    /// A named pipe (`S_IFIFO`).
    Fifo,
    /// A Unix socket node (`S_IFSOCK`).
    Socket,
}

impl FileType {
    /// The `S_IFMT` bits of this type.
    pub fn mode_bits(self) -> u32 {
        match self {
            FileType::RegularFile => libc::S_IFREG,
            FileType::Directory => libc::S_IFDIR,
            FileType::Symlink => libc::S_IFLNK,
            FileType::BlockDevice => libc::S_IFBLK,
            FileType::CharDevice => libc::S_IFCHR,
            FileType::Fifo => libc::S_IFIFO,
            FileType::Socket => libc::S_IFSOCK,
        }
    }

    /// The type named by the `S_IFMT` bits of `mode`, if any.
    pub fn from_mode(mode: u32) -> Option<FileType> {
        Some(match mode & libc::S_IFMT {
            libc::S_IFREG => FileType::RegularFile,
            libc::S_IFDIR => FileType::Directory,
            libc::S_IFLNK => FileType::Symlink,
            libc::S_IFBLK => FileType::BlockDevice,
            libc::S_IFCHR => FileType::CharDevice,
            libc::S_IFIFO => FileType::Fifo,
            libc::S_IFSOCK => FileType::Socket,
            _ => return None,
        })
    }

    /// The type of a host file, as `std` reports it.
    pub fn from_std(t: std::fs::FileType) -> Option<FileType> {
        use std::os::unix::fs::FileTypeExt;
        Some(if t.is_file() {
            FileType::RegularFile
        } else if t.is_dir() {
            FileType::Directory
        } else if t.is_symlink() {
            FileType::Symlink
        } else if t.is_block_device() {
            FileType::BlockDevice
        } else if t.is_char_device() {
            FileType::CharDevice
        } else if t.is_fifo() {
            FileType::Fifo
        } else if t.is_socket() {
            FileType::Socket
        } else {
            return None;
        })
    }

    /// A short lower-case name ("dir", "reg", "lnk", "blk", "chr", "fifo", "sock").
    pub fn short_name(self) -> &'static str {
        match self {
            FileType::RegularFile => "reg",
            FileType::Directory => "dir",
            FileType::Symlink => "lnk",
            FileType::BlockDevice => "blk",
            FileType::CharDevice => "chr",
            FileType::Fifo => "fifo",
            FileType::Socket => "sock",
        }
    }
}

/// A point in time, seconds and nanoseconds since the Unix epoch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timespec {
    /// Whole seconds; negative before 1970.
    pub sec: i64,
    /// Nanoseconds added to `sec`, always forward in time: below
    /// 1,000,000,000 (so 0.5 s before the epoch is `sec: -1, nsec: 500_000_000`).
    pub nsec: u32,
}

impl Timespec {
    /// The epoch itself, 1970-01-01 00:00:00 UTC.
    pub const ZERO: Timespec = Timespec { sec: 0, nsec: 0 };

    /// From seconds and nanoseconds as the fields hold them (`nsec` below
    /// 1,000,000,000; not checked).
    pub fn new(sec: i64, nsec: u32) -> Self {
        Timespec { sec, nsec }
    }

    /// The current wall-clock time.
    pub fn now() -> Self {
        Self::from_system(std::time::SystemTime::now())
    }

    /// From a `SystemTime`, before the epoch included.
    pub fn from_system(t: std::time::SystemTime) -> Self {
        match t.duration_since(std::time::UNIX_EPOCH) {
            Ok(d) => Timespec::new(d.as_secs() as i64, d.subsec_nanos()),
            Err(e) => {
                let d = e.duration();
                if d.subsec_nanos() == 0 {
                    Timespec::new(-(d.as_secs() as i64), 0)
                } else {
                    Timespec::new(-(d.as_secs() as i64) - 1, 1_000_000_000 - d.subsec_nanos())
                }
            }
        }
    }

    /// To a `SystemTime`, the inverse of [`Timespec::from_system`].
    pub fn to_system(self) -> std::time::SystemTime {
        use std::time::{Duration, UNIX_EPOCH};
        if self.sec >= 0 {
            UNIX_EPOCH + Duration::new(self.sec as u64, self.nsec)
        } else {
            UNIX_EPOCH - Duration::new(self.sec.unsigned_abs(), 0) + Duration::new(0, self.nsec)
        }
    }
}

/// A device number, as major and minor.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Rdev {
    /// The major number: which driver.
    pub major: u32,
    /// The minor number: which device of that driver.
    pub minor: u32,
}

impl Rdev {
    /// From a major and a minor number.
    pub fn new(major: u32, minor: u32) -> Self {
        Rdev { major, minor }
    }

    /// From a host `dev_t`.
    pub fn from_dev_t(dev: u64) -> Self {
        Rdev::new(libc::major(dev), libc::minor(dev))
    }

    /// To a host `dev_t`.
    pub fn to_dev_t(self) -> u64 {
        libc::makedev(self.major, self.minor)
    }

    /// The kernel's 32-bit `new_encode_dev` form (used by the FUSE protocol
    /// and by EROFS on disk).
    pub fn to_new_encoding(self) -> u32 {
        (self.minor & 0xff) | ((self.major & 0xfff) << 8) | ((self.minor & !0xff) << 12)
    }

    /// The inverse of [`Rdev::to_new_encoding`].
    pub fn from_new_encoding(dev: u32) -> Self {
        Rdev::new((dev & 0xfff00) >> 8, (dev & 0xff) | ((dev >> 12) & 0xfff00))
    }
}

/// Attributes of one inode, as `stat(2)` shows them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attr {
    /// The inode number reported in `st_ino` (the format's own numbering).
    pub ino: Ino,
    /// Length in bytes: a file's data, a symlink's target; for a
    /// directory, whatever the format reports.
    pub size: u64,
    /// Allocated space in 512-byte units.
    pub blocks: u64,
    /// The file type, the `S_IFMT` part of `st_mode`.
    pub kind: FileType,
    /// Permission bits including setuid, setgid and sticky (`0o7777`).
    pub perm: u16,
    /// Number of hard links (names) to the inode.
    pub nlink: u32,
    /// Owner's user id.
    pub uid: u32,
    /// Owner's group id.
    pub gid: u32,
    /// The device a device node stands for; zero for other types.
    pub rdev: Rdev,
    /// Last access.
    pub atime: Timespec,
    /// Last change of the contents.
    pub mtime: Timespec,
    /// Last change of the inode (contents or attributes).
    pub ctime: Timespec,
    /// Preferred I/O size reported in `st_blksize`.
    pub blksize: u32,
}

impl Attr {
    /// The full `st_mode`: type bits and permission bits.
    pub fn mode(&self) -> u32 {
        self.kind.mode_bits() | u32::from(self.perm)
    }
}

/// One directory entry handed to a `readdir` sink.
#[derive(Clone, Copy, Debug)]
pub struct DirEntry<'a> {
    /// The entry's inode, in the file system's own numbering.
    pub ino: Ino,
    /// The cookie that resumes the listing just after this entry.
    pub next: u64,
    /// The entry's file type.
    pub kind: FileType,
    /// The entry's name: one path component, no `/` (`.` and `..` included
    /// when the format lists them).
    pub name: &'a OsStr,
}

/// Figures for `statfs(2)`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatFs {
    /// Total blocks, in units of `frsize`.
    pub blocks: u64,
    /// Free blocks, in units of `frsize`.
    pub bfree: u64,
    /// Free blocks an unprivileged user may fill, in units of `frsize`.
    pub bavail: u64,
    /// Total inodes.
    pub files: u64,
    /// Free inodes.
    pub ffree: u64,
    /// Preferred I/O size in bytes (`f_bsize`).
    pub bsize: u32,
    /// The unit of `blocks`, `bfree` and `bavail`, in bytes (`f_frsize`).
    pub frsize: u32,
    /// Longest name, in bytes.
    pub namelen: u32,
}

/// Static facts about a mounted file system.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FsInfo {
    /// Format name as `/proc/mounts` would show it ("romfs", "erofs", "ramfs").
    pub fs_type: &'static str,
    /// The effective block size (the unit of I/O or allocation).
    pub block_size: u32,
    /// Longest name a directory entry may have, in bytes.
    pub name_max: u32,
    /// True when the format cannot change at all: every mutating call
    /// fails with [`Error::ReadOnly`](crate::Error::ReadOnly).
    pub read_only: bool,
}

/// How to set a timestamp in `setattr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeSet {
    /// `UTIME_NOW`: the server's current time.
    Now,
    /// This time, as the caller gave it.
    At(Timespec),
}

/// The attributes a `setattr` call changes; `None` leaves one alone.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SetAttr {
    /// New permission bits (`0o7777`).
    pub mode: Option<u32>,
    /// New owner.
    pub uid: Option<u32>,
    /// New group.
    pub gid: Option<u32>,
    /// New length in bytes: truncates, or extends with zeros.
    pub size: Option<u64>,
    /// New access time.
    pub atime: Option<TimeSet>,
    /// New modification time.
    pub mtime: Option<TimeSet>,
    /// The change time to record, when the kernel sends one; without it the
    /// format uses the current time, since every `setattr` changes the
    /// inode.
    pub ctime: Option<Timespec>,
    /// The handle the change came through (`ftruncate`), if any.
    pub fh: Option<u64>,
}

/// Who is asking: the caller of the system call behind a request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ctx {
    /// The caller's effective user id (file system uid).
    pub uid: u32,
    /// The caller's effective group id (file system gid).
    pub gid: u32,
    /// The calling thread's id as the kernel sent it (0 for requests no
    /// process made, such as writeback); for logs, not for permissions.
    pub pid: u32,
    /// The caller's umask, where the kernel sent it (already applied to
    /// modes when the kernel does it; kept for formats that need it).
    pub umask: u32,
}

/// A reusable per-thread buffer for [`crate::FileSystem::read`].
///
/// It hands out slices aligned as `O_DIRECT` needs (an [`AlignedBuf`],
/// so without `unsafe`).
#[derive(Default)]
pub struct Scratch {
    buf: AlignedBuf,
    held: Option<Arc<dyn AsRef<[u8]> + Send + Sync>>,
}

impl std::fmt::Debug for Scratch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scratch")
            .field("capacity", &self.buf.capacity())
            .field("holding", &self.held.is_some())
            .finish()
    }
}

impl Scratch {
    /// An empty buffer; it grows on first use.
    pub fn new() -> Self {
        Scratch::default()
    }

    /// Keeps `data` (a cached block, say) alive until the next call and
    /// returns its bytes, so a reader can answer from shared memory without
    /// copying it.
    pub fn hold(&mut self, data: Arc<dyn AsRef<[u8]> + Send + Sync>) -> &[u8] {
        let held = self.held.insert(data);
        (**held).as_ref()
    }

    /// A slice of exactly `len` bytes starting at an address aligned to
    /// `align` (a power of two). Its contents are whatever was there before.
    pub fn aligned(&mut self, len: usize, align: usize) -> &mut [u8] {
        self.buf.resize(len, align)
    }

    /// A slice of exactly `len` bytes, with no alignment promise.
    pub fn get(&mut self, len: usize) -> &mut [u8] {
        self.aligned(len, 1)
    }

    /// Bytes currently held (for memory accounting).
    pub fn capacity(&self) -> usize {
        self.buf.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_dev_encoding_round_trips() {
        for (ma, mi) in [(0, 0), (1, 3), (8, 1), (259, 65536), (4095, 1_048_575)] {
            let d = Rdev::new(ma, mi);
            assert_eq!(Rdev::from_new_encoding(d.to_new_encoding()), d);
        }
        // The kernel's own example: major 1, minor 3 is 0x103.
        assert_eq!(Rdev::new(1, 3).to_new_encoding(), 0x103);
    }

    #[test]
    fn scratch_is_aligned() {
        let mut s = Scratch::new();
        for align in [512usize, 4096] {
            let b = s.aligned(10_000, align);
            assert_eq!(b.len(), 10_000);
            assert_eq!(b.as_ptr() as usize % align, 0);
        }
    }

    #[test]
    fn timespec_round_trips_before_epoch() {
        for t in [
            Timespec::new(-5, 250),
            Timespec::new(1_700_000_000, 999_999_999),
        ] {
            assert_eq!(Timespec::from_system(t.to_system()), t);
        }
    }
}
