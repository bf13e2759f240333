//! File headers: the 16-byte record before every entry's name and data.

use foliofs_block::BlockDev;
use foliofs_vfs::{Error, FileType, Result};

use crate::superblock::MAX_NAME;
use crate::Corrupt;

/// Size of the fixed part of a header; also the alignment of every header.
pub const HEADER_SIZE: u64 = 16;
/// Low bits of `next` holding the type and exec bit.
const TYPE_MASK: u32 = 7;
const EXEC_BIT: u32 = 8;
/// Offsets are 16-byte aligned; the low four bits carry flags.
pub const OFFSET_MASK: u32 = !15;

/// The eight romfs entry types, numbered as on disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EntryType {
    /// `spec` is the header offset of the entry it links to.
    HardLink,
    /// `spec` is the offset of the first entry.
    Directory,
    /// Data follows the header.
    Regular,
    /// Data is the target, without a NUL.
    Symlink,
    /// `spec` is `major << 16 | minor`.
    BlockDevice,
    /// `spec` is `major << 16 | minor`.
    CharDevice,
    /// A Unix socket.
    Socket,
    /// A named pipe.
    Fifo,
}

impl EntryType {
    /// The type stored in the low three bits of `next`.
    pub fn from_bits(bits: u32) -> EntryType {
        match bits & TYPE_MASK {
            0 => EntryType::HardLink,
            1 => EntryType::Directory,
            2 => EntryType::Regular,
            3 => EntryType::Symlink,
            4 => EntryType::BlockDevice,
            5 => EntryType::CharDevice,
            6 => EntryType::Socket,
            _ => EntryType::Fifo,
        }
    }

    /// The on-disk type number.
    pub fn bits(self) -> u32 {
        match self {
            EntryType::HardLink => 0,
            EntryType::Directory => 1,
            EntryType::Regular => 2,
            EntryType::Symlink => 3,
            EntryType::BlockDevice => 4,
            EntryType::CharDevice => 5,
            EntryType::Socket => 6,
            EntryType::Fifo => 7,
        }
    }

    /// The file type of an inode of this type (`None` for a hard link, which
    /// is not an inode of its own).
    pub fn file_type(self) -> Option<FileType> {
        Some(match self {
            EntryType::HardLink => return None,
            EntryType::Directory => FileType::Directory,
            EntryType::Regular => FileType::RegularFile,
            EntryType::Symlink => FileType::Symlink,
            EntryType::BlockDevice => FileType::BlockDevice,
            EntryType::CharDevice => FileType::CharDevice,
            EntryType::Socket => FileType::Socket,
            EntryType::Fifo => FileType::Fifo,
        })
    }

    /// The romfs type for a file type.
    pub fn from_file_type(t: FileType) -> EntryType {
        match t {
            FileType::Directory => EntryType::Directory,
            FileType::RegularFile => EntryType::Regular,
            FileType::Symlink => EntryType::Symlink,
            FileType::BlockDevice => EntryType::BlockDevice,
            FileType::CharDevice => EntryType::CharDevice,
            FileType::Socket => EntryType::Socket,
            FileType::Fifo => EntryType::Fifo,
        }
    }

    /// Whether `spec` must be zero for this type.
    pub fn spec_must_be_zero(self) -> bool {
        matches!(
            self,
            EntryType::Regular | EntryType::Symlink | EntryType::Socket | EntryType::Fifo
        )
    }

    /// Whether `size` counts data bytes after the header.
    pub fn has_data(self) -> bool {
        matches!(self, EntryType::Regular | EntryType::Symlink)
    }

    /// A short name for messages and listings.
    pub fn name(self) -> &'static str {
        match self {
            EntryType::HardLink => "hard link",
            EntryType::Directory => "directory",
            EntryType::Regular => "regular file",
            EntryType::Symlink => "symlink",
            EntryType::BlockDevice => "block device",
            EntryType::CharDevice => "char device",
            EntryType::Socket => "socket",
            EntryType::Fifo => "fifo",
        }
    }
}

/// One parsed file header with its name.
#[derive(Clone)]
pub struct Header {
    /// Where the header sits in the image.
    pub offset: u64,
    /// The next entry in the same directory (0 = none), flags removed.
    pub next: u64,
    /// The entry type (low three bits of `next`).
    pub kind: EntryType,
    /// The exec bit (bit 3 of `next`).
    pub exec: bool,
    /// Type-specific: link target, first entry, or device number.
    pub spec: u32,
    /// Data bytes (regular files and symlinks).
    pub size: u32,
    /// The stored checksum word.
    pub checksum: u32,
    name: [u8; MAX_NAME],
    name_len: u8,
}

impl std::fmt::Debug for Header {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Header")
            .field("offset", &self.offset)
            .field("next", &self.next)
            .field("kind", &self.kind)
            .field("exec", &self.exec)
            .field("spec", &self.spec)
            .field("size", &self.size)
            .field("name", &String::from_utf8_lossy(self.name()))
            .finish()
    }
}

impl Header {
    /// Reads and checks the header at `offset`. `first` is the offset of the
    /// first header (the root); nothing before it can be a header.
    ///
    /// Checked here: the offset, the name (NUL within 128 bytes, inside the
    /// image), the padded name and, for files and symlinks, the data inside
    /// the image, and a zero `spec` where the type requires it.
    pub fn read(dev: &BlockDev, offset: u64, first: u64) -> Result<Header> {
        let image = dev.size();
        if offset < first {
            return Err(Error::corrupt(
                offset,
                Corrupt::HeaderInSuperblock { offset, first },
            ));
        }
        if !offset.is_multiple_of(HEADER_SIZE) {
            return Err(Error::corrupt(offset, Corrupt::HeaderMisaligned { offset }));
        }
        if offset
            .checked_add(HEADER_SIZE + 1)
            .is_none_or(|e| e > image)
        {
            return Err(Error::corrupt(
                offset,
                Corrupt::HeaderOutOfImage {
                    offset,
                    size: image,
                },
            ));
        }
        let mut buf = [0u8; HEADER_SIZE as usize + MAX_NAME + 1];
        let avail = (image - offset).min(buf.len() as u64) as usize;
        dev.read_exact(offset, &mut buf[..avail])?;
        let word = |i: usize| u32::from_be_bytes(buf[i..i + 4].try_into().expect("4 bytes"));
        let (next_raw, spec, size, checksum) = (word(0), word(4), word(8), word(12));
        let name_area = &buf[HEADER_SIZE as usize..avail];
        let name_len = match name_area.iter().position(|&b| b == 0) {
            Some(n) => n,
            None if avail < buf.len() => {
                return Err(Error::corrupt(
                    offset + HEADER_SIZE,
                    Corrupt::NameOutOfImage,
                ))
            }
            None => {
                return Err(Error::corrupt(
                    offset + HEADER_SIZE,
                    Corrupt::NameNotTerminated,
                ))
            }
        };
        let mut name = [0u8; MAX_NAME];
        name[..name_len].copy_from_slice(&name_area[..name_len]);
        let h = Header {
            offset,
            next: u64::from(next_raw & OFFSET_MASK),
            kind: EntryType::from_bits(next_raw),
            exec: next_raw & EXEC_BIT != 0,
            spec,
            size,
            checksum,
            name,
            name_len: name_len as u8,
        };
        let data = h.data_offset();
        if data > image {
            return Err(Error::corrupt(
                offset,
                Corrupt::PaddedNameOutOfImage {
                    offset,
                    end: data,
                    size: image,
                },
            ));
        }
        if h.kind.has_data() && data + u64::from(size) > image {
            return Err(Error::corrupt(
                offset + 8,
                Corrupt::DataOutOfImage {
                    kind: h.kind,
                    name: h.name_lossy(),
                    offset,
                    len: size,
                    data,
                    size: image,
                },
            ));
        }
        if h.kind.spec_must_be_zero() && spec != 0 {
            return Err(Error::corrupt(
                offset + 4,
                Corrupt::SpecNotZero {
                    kind: h.kind,
                    name: h.name_lossy(),
                    offset,
                    spec,
                },
            ));
        }
        Ok(h)
    }

    /// The entry's name, without its NUL.
    pub fn name(&self) -> &[u8] {
        &self.name[..usize::from(self.name_len)]
    }

    /// The name for messages.
    pub fn name_lossy(&self) -> String {
        String::from_utf8_lossy(self.name()).into_owned()
    }

    /// Bytes of header plus NUL-terminated, 16-padded name.
    pub fn meta_size(&self) -> u64 {
        (HEADER_SIZE + u64::from(self.name_len) + 1 + 15) & !15
    }

    /// Where the data starts.
    pub fn data_offset(&self) -> u64 {
        self.offset + self.meta_size()
    }

    /// `spec` as an offset (hard-link target, first directory entry).
    pub fn spec_offset(&self) -> u64 {
        u64::from(self.spec & OFFSET_MASK)
    }
}
