//! Inodes: a header after hard links are followed, and its attributes as
//! the Linux kernel derives them.

use foliofs_vfs::{Attr, FileType, Rdev, Timespec};

use crate::header::{EntryType, Header};

/// A resolved entry (never a hard link). Its inode number is its header
/// offset, which every hard link to it shares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Inode {
    /// The header offset.
    pub ino: u64,
    /// The file type.
    pub kind: FileType,
    /// The exec bit.
    pub exec: bool,
    /// The header's `spec` field (first entry, device number).
    pub spec: u32,
    /// The header's `size` field.
    pub size: u32,
    /// Header plus padded name.
    pub meta_size: u32,
    /// Where the data starts (regular files and symlinks).
    pub data_offset: u64,
}

impl Inode {
    /// The inode of a non-link header.
    pub(crate) fn from_header(h: &Header) -> Inode {
        Inode {
            ino: h.offset,
            kind: h
                .kind
                .file_type()
                .expect("hard links are resolved before this"),
            exec: h.exec,
            spec: h.spec,
            size: h.size,
            meta_size: h.meta_size() as u32,
            data_offset: h.data_offset(),
        }
    }

    /// The first entry of a directory (0 when empty).
    pub fn first_entry(&self) -> u64 {
        u64::from(self.spec & crate::header::OFFSET_MASK)
    }

    /// The device number of a block or char device (`spec` = major<<16 | minor).
    pub fn rdev(&self) -> Rdev {
        match self.kind {
            FileType::BlockDevice | FileType::CharDevice => {
                Rdev::new(self.spec >> 16, self.spec & 0xffff)
            }
            _ => Rdev::default(),
        }
    }

    /// Permission bits the kernel gives this inode: directories and regular
    /// files 0644 plus 0111 with the exec bit, symlinks 0777, devices 0600,
    /// sockets and fifos 0644.
    pub fn perm(&self) -> u16 {
        match self.kind {
            FileType::Directory | FileType::RegularFile => {
                if self.exec {
                    0o755
                } else {
                    0o644
                }
            }
            FileType::Symlink => 0o777,
            FileType::BlockDevice | FileType::CharDevice => 0o600,
            FileType::Socket | FileType::Fifo => 0o644,
        }
    }

    /// `st_size`: a directory reports its header plus padded name; every
    /// other type the header's size field.
    pub fn file_size(&self) -> u64 {
        if self.kind == FileType::Directory {
            u64::from(self.meta_size)
        } else {
            u64::from(self.size)
        }
    }

    /// The attributes `stat(2)` shows on a kernel mount; `blksize` is the
    /// mount's block size.
    pub fn attr(&self, blksize: u32) -> Attr {
        let size = self.file_size();
        Attr {
            ino: self.ino,
            size,
            blocks: (size + 511) >> 9,
            kind: self.kind,
            perm: self.perm(),
            nlink: 1,
            uid: 0,
            gid: 0,
            rdev: self.rdev(),
            atime: Timespec::ZERO,
            mtime: Timespec::ZERO,
            ctime: Timespec::ZERO,
            blksize,
        }
    }

    /// The romfs type of this inode.
    pub fn entry_type(&self) -> EntryType {
        EntryType::from_file_type(self.kind)
    }
}
