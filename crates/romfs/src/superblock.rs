//! The romfs superblock: magic, image size, checksum and volume name.

use foliofs_vfs::{Error, Result};

use crate::checksum::word_sum;
use crate::Corrupt;

/// The eight bytes every romfs image starts with.
pub const MAGIC: &[u8; 8] = b"-rom1fs-";
/// Longest volume name (and entry name), in bytes.
pub const MAX_NAME: usize = 127;
/// The superblock checksum covers at most this many leading bytes.
pub const CHECKSUM_SPAN: u32 = 512;

/// True when `head` (the first bytes of a file) starts with the romfs magic.
pub fn is_romfs(head: &[u8]) -> bool {
    head.starts_with(MAGIC)
}

/// A parsed superblock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    /// The image size the superblock declares (the unpadded end of the data).
    pub size: u32,
    /// The stored checksum word.
    pub checksum: u32,
    /// The volume name, without its NUL.
    pub volume_name: Vec<u8>,
    /// Offset of the first file header: the root directory.
    pub root_offset: u64,
}

impl Superblock {
    /// Parses the superblock from `head`, the first `min(512, image size)`
    /// bytes of an image whose file is `image_size` bytes long.
    ///
    /// `verify_checksum` is false only for tools that report a bad checksum
    /// as one defect among others and carry on.
    pub fn parse(head: &[u8], image_size: u64, verify_checksum: bool) -> Result<Superblock> {
        if is_romfs(head) && head.len() < 16 {
            return Err(Error::corrupt(
                0,
                Corrupt::SuperblockTruncated { len: head.len() },
            ));
        }
        if !is_romfs(head) {
            let found = head[..head.len().min(8)].to_vec();
            return Err(Error::corrupt(0, Corrupt::BadMagic { found }));
        }
        let size = u32::from_be_bytes(head[8..12].try_into().expect("4 bytes"));
        let checksum = u32::from_be_bytes(head[12..16].try_into().expect("4 bytes"));
        if u64::from(size) > image_size {
            return Err(Error::corrupt(
                8,
                Corrupt::ImageTruncated {
                    declared: size,
                    actual: image_size,
                },
            ));
        }
        let name_area = &head[16..];
        let name_len = match name_area.iter().take(MAX_NAME + 1).position(|&b| b == 0) {
            Some(n) => n,
            None if name_area.len() <= MAX_NAME => {
                return Err(Error::corrupt(16, Corrupt::VolumeNameOutOfImage))
            }
            None => return Err(Error::corrupt(16, Corrupt::VolumeNameNotTerminated)),
        };
        let root_offset = ((16 + name_len + 1 + 15) & !15) as u64;
        if u64::from(size) < root_offset + 16 {
            return Err(Error::corrupt(
                8,
                Corrupt::NoRoomForRoot {
                    size,
                    root: root_offset,
                },
            ));
        }
        if verify_checksum {
            let span = size.min(CHECKSUM_SPAN) as usize;
            if head.len() < span {
                return Err(Error::corrupt(0, Corrupt::SuperblockChecksumTruncated));
            }
            let sum = word_sum(&head[..span]);
            if sum != 0 {
                return Err(Error::corrupt(
                    12,
                    Corrupt::SuperblockChecksum { span, sum },
                ));
            }
        }
        Ok(Superblock {
            size,
            checksum,
            volume_name: name_area[..name_len].to_vec(),
            root_offset,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checksum::fix;

    fn sb(name: &[u8], size: u32) -> Vec<u8> {
        let mut v = MAGIC.to_vec();
        v.extend_from_slice(&size.to_be_bytes());
        v.extend_from_slice(&[0; 4]);
        v.extend_from_slice(name);
        v.push(0);
        while !v.len().is_multiple_of(16) {
            v.push(0);
        }
        v.resize(size.min(512) as usize, 0);
        let c = fix(&v);
        v[12..16].copy_from_slice(&c.to_be_bytes());
        v
    }

    #[test]
    fn parses_a_good_superblock() {
        let s = Superblock::parse(&sb(b"vol", 1024), 1024, true).unwrap();
        assert_eq!(s.volume_name, b"vol");
        assert_eq!(s.root_offset, 0x20);
        assert_eq!(s.size, 1024);
    }

    #[test]
    fn root_offset_follows_long_names() {
        let name = [b'n'; 127];
        let s = Superblock::parse(&sb(&name, 1024), 1024, true).unwrap();
        assert_eq!(s.root_offset, 16 + 128);
    }

    fn kind(e: Error) -> Corrupt {
        e.corruption::<Corrupt>()
            .unwrap_or_else(|| panic!("not romfs corruption: {e}"))
            .clone()
    }

    #[test]
    fn rejects_bad_magic_checksum_and_size() {
        let mut b = sb(b"vol", 1024);
        b[0] = b'+';
        let e = Superblock::parse(&b, 1024, true).unwrap_err();
        assert_eq!(
            kind(e),
            Corrupt::BadMagic {
                found: b"+rom1fs-".to_vec()
            }
        );
        let mut b = sb(b"vol", 1024);
        b[100] ^= 1;
        let e = Superblock::parse(&b, 1024, true).unwrap_err();
        assert_eq!(e.offset(), Some(12));
        assert!(matches!(
            kind(e),
            Corrupt::SuperblockChecksum { span: 512, .. }
        ));
        assert!(Superblock::parse(&b, 1024, false).is_ok());
        let e = Superblock::parse(&sb(b"vol", 1024), 512, true).unwrap_err();
        assert_eq!(
            kind(e),
            Corrupt::ImageTruncated {
                declared: 1024,
                actual: 512
            }
        );
        let e = Superblock::parse(b"-rom1fs-\0\0", 10, true).unwrap_err();
        assert_eq!(kind(e), Corrupt::SuperblockTruncated { len: 10 });
    }

    #[test]
    fn messages_name_what_is_wrong() {
        let e = Superblock::parse(&sb(b"vol", 1024), 512, true).unwrap_err();
        assert_eq!(
            e.to_string(),
            "corrupt image at offset 0x8: superblock says the image is 1024 bytes \
             but the file holds only 512 (truncated?)"
        );
    }
}
