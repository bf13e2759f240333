//! The ledger's records, written and read back: one transaction per
//! operation, a sequence of these, little-endian.
//!
//! Records say what things *are* after an operation, not what it did, so
//! replaying one twice, or an inode's image older than one already seen,
//! changes nothing: an inode's image carries a version that grows with
//! each change, and the newest wins whatever the order.

use foliofs_vfs::{FileType, Ino, Rdev, Timespec};

/// Everything about an inode but its names, data blocks and xattrs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Image {
    pub ino: Ino,
    pub version: u64,
    pub kind: FileType,
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: Rdev,
    pub atime: Timespec,
    pub mtime: Timespec,
    pub ctime: Timespec,
    /// A regular file's size.
    pub size: u64,
    pub opens: u64,
    pub writers: u64,
    /// A directory's `..`.
    pub parent: Ino,
    /// A symbolic link's target; a backed file's name on the pool.
    pub target: Vec<u8>,
    /// A backed file's registration with the kernel (0: none).
    pub backing: u32,
}

/// One record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Rec {
    Inode(Image),
    /// `parent`'s entry `name` is `ino` (of `kind`) at `cookie`.
    Name {
        parent: Ino,
        name: Vec<u8>,
        cookie: u64,
        ino: Ino,
        kind: FileType,
    },
    /// `parent` has no entry `name`.
    NoName {
        parent: Ino,
        name: Vec<u8>,
    },
    /// Extended attribute `name` of `ino` is `value` (`None`: removed).
    Xattr {
        ino: Ino,
        name: Vec<u8>,
        value: Option<Vec<u8>>,
    },
    /// Block `idx` of file `ino` is block `k` of the data file.
    Map {
        ino: Ino,
        idx: u64,
        k: u64,
    },
    /// File `ino` has no block at or after `idx`.
    Cut {
        ino: Ino,
        idx: u64,
    },
    /// File `ino` has no block `idx`.
    Unmap {
        ino: Ino,
        idx: u64,
    },
    /// No inode number below this is handed out again.
    NextIno(u64),
    /// Request `request` was carried out: what a resent copy of it is
    /// answered with (the inode it made, the handle it opened).
    Done {
        request: u64,
        ino: Ino,
        fh: u64,
    },
}

const INODE: u8 = 1;
const NAME: u8 = 2;
const NO_NAME: u8 = 3;
const XATTR: u8 = 4;
const NO_XATTR: u8 = 5;
const MAP: u8 = 6;
const CUT: u8 = 7;
const UNMAP: u8 = 8;
const NEXT_INO: u8 = 9;
const DONE: u8 = 10;

fn kind_code(k: FileType) -> u8 {
    match k {
        FileType::RegularFile => 1,
        FileType::Directory => 2,
        FileType::Symlink => 3,
        FileType::BlockDevice => 4,
        FileType::CharDevice => 5,
        FileType::Fifo => 6,
        FileType::Socket => 7,
    }
}

fn kind_of(c: u8) -> Option<FileType> {
    Some(match c {
        1 => FileType::RegularFile,
        2 => FileType::Directory,
        3 => FileType::Symlink,
        4 => FileType::BlockDevice,
        5 => FileType::CharDevice,
        6 => FileType::Fifo,
        7 => FileType::Socket,
        _ => return None,
    })
}

/// A transaction being written.
#[derive(Default, Debug)]
pub(crate) struct Tx {
    pub buf: Vec<u8>,
}

impl Tx {
    fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    fn u16(&mut self, v: u16) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes(&mut self, b: &[u8]) {
        self.u32(b.len() as u32);
        self.buf.extend_from_slice(b);
    }
    fn time(&mut self, t: Timespec) {
        self.u64(t.sec as u64);
        self.u32(t.nsec);
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    pub fn put(&mut self, r: &Rec) {
        match r {
            Rec::Inode(i) => {
                self.u8(INODE);
                self.u64(i.ino);
                self.u64(i.version);
                self.u8(kind_code(i.kind));
                self.u16(i.perm);
                self.u32(i.nlink);
                self.u32(i.uid);
                self.u32(i.gid);
                self.u32(i.rdev.major);
                self.u32(i.rdev.minor);
                self.time(i.atime);
                self.time(i.mtime);
                self.time(i.ctime);
                self.u64(i.size);
                self.u64(i.opens);
                self.u64(i.writers);
                self.u64(i.parent);
                self.bytes(&i.target);
                self.u32(i.backing);
            }
            Rec::Name {
                parent,
                name,
                cookie,
                ino,
                kind,
            } => {
                self.u8(NAME);
                self.u64(*parent);
                self.u64(*cookie);
                self.u64(*ino);
                self.u8(kind_code(*kind));
                self.bytes(name);
            }
            Rec::NoName { parent, name } => {
                self.u8(NO_NAME);
                self.u64(*parent);
                self.bytes(name);
            }
            Rec::Xattr { ino, name, value } => match value {
                Some(v) => {
                    self.u8(XATTR);
                    self.u64(*ino);
                    self.bytes(name);
                    self.bytes(v);
                }
                None => {
                    self.u8(NO_XATTR);
                    self.u64(*ino);
                    self.bytes(name);
                }
            },
            Rec::Map { ino, idx, k } => {
                self.u8(MAP);
                self.u64(*ino);
                self.u64(*idx);
                self.u64(*k);
            }
            Rec::Cut { ino, idx } => {
                self.u8(CUT);
                self.u64(*ino);
                self.u64(*idx);
            }
            Rec::Unmap { ino, idx } => {
                self.u8(UNMAP);
                self.u64(*ino);
                self.u64(*idx);
            }
            Rec::NextIno(n) => {
                self.u8(NEXT_INO);
                self.u64(*n);
            }
            Rec::Done { request, ino, fh } => {
                self.u8(DONE);
                self.u64(*request);
                self.u64(*ino);
                self.u64(*fh);
            }
        }
    }
}

/// Why a transaction could not be read.
#[derive(Debug, thiserror::Error)]
#[error("byte {at} of the transaction: {what}")]
pub(crate) struct Bad {
    pub at: usize,
    pub what: &'static str,
}

/// Reads the records of one transaction.
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, at: 0 }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], Bad> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.buf.len());
        let Some(end) = end else {
            return Err(Bad {
                at: self.at,
                what: "a record runs past the transaction's end",
            });
        };
        let s = &self.buf[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, Bad> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, Bad> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().unwrap()))
    }
    fn u32(&mut self) -> Result<u32, Bad> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn u64(&mut self) -> Result<u64, Bad> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    fn bytes(&mut self) -> Result<Vec<u8>, Bad> {
        let n = self.u32()? as usize;
        Ok(self.take(n)?.to_vec())
    }
    fn time(&mut self) -> Result<Timespec, Bad> {
        let sec = self.u64()? as i64;
        let nsec = self.u32()?;
        if nsec >= 1_000_000_000 {
            return Err(self.bad("a time's nanoseconds are 10^9 or more"));
        }
        Ok(Timespec { sec, nsec })
    }
    fn kind(&mut self) -> Result<FileType, Bad> {
        let c = self.u8()?;
        kind_of(c).ok_or_else(|| self.bad("an unknown file type"))
    }
    fn bad(&self, what: &'static str) -> Bad {
        Bad { at: self.at, what }
    }

    /// The next record, `None` at the end.
    pub fn next_rec(&mut self) -> Result<Option<Rec>, Bad> {
        if self.at == self.buf.len() {
            return Ok(None);
        }
        let tag = self.u8()?;
        Ok(Some(match tag {
            INODE => Rec::Inode(Image {
                ino: self.u64()?,
                version: self.u64()?,
                kind: self.kind()?,
                perm: self.u16()?,
                nlink: self.u32()?,
                uid: self.u32()?,
                gid: self.u32()?,
                rdev: Rdev::new(self.u32()?, self.u32()?),
                atime: self.time()?,
                mtime: self.time()?,
                ctime: self.time()?,
                size: self.u64()?,
                opens: self.u64()?,
                writers: self.u64()?,
                parent: self.u64()?,
                target: self.bytes()?,
                backing: self.u32()?,
            }),
            NAME => {
                let parent = self.u64()?;
                let cookie = self.u64()?;
                let ino = self.u64()?;
                let kind = self.kind()?;
                let name = self.bytes()?;
                Rec::Name {
                    parent,
                    name,
                    cookie,
                    ino,
                    kind,
                }
            }
            NO_NAME => Rec::NoName {
                parent: self.u64()?,
                name: self.bytes()?,
            },
            XATTR => Rec::Xattr {
                ino: self.u64()?,
                name: self.bytes()?,
                value: Some(self.bytes()?),
            },
            NO_XATTR => Rec::Xattr {
                ino: self.u64()?,
                name: self.bytes()?,
                value: None,
            },
            MAP => Rec::Map {
                ino: self.u64()?,
                idx: self.u64()?,
                k: self.u64()?,
            },
            CUT => Rec::Cut {
                ino: self.u64()?,
                idx: self.u64()?,
            },
            UNMAP => Rec::Unmap {
                ino: self.u64()?,
                idx: self.u64()?,
            },
            NEXT_INO => Rec::NextIno(self.u64()?),
            DONE => Rec::Done {
                request: self.u64()?,
                ino: self.u64()?,
                fh: self.u64()?,
            },
            _ => {
                return Err(Bad {
                    at: self.at - 1,
                    what: "an unknown record type",
                })
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_record_reads_back_as_written() {
        let t = Timespec {
            sec: -5,
            nsec: 999_999_999,
        };
        let recs = vec![
            Rec::Inode(Image {
                ino: 7,
                version: 3,
                kind: FileType::Symlink,
                perm: 0o777,
                nlink: 1,
                uid: 1000,
                gid: 100,
                rdev: Rdev::new(8, 1),
                atime: t,
                mtime: t,
                ctime: t,
                size: 0,
                opens: 0,
                writers: 0,
                parent: 0,
                target: b"../x".to_vec(),
                backing: 3,
            }),
            Rec::Name {
                parent: 1,
                name: b"a".to_vec(),
                cookie: 9,
                ino: 7,
                kind: FileType::Symlink,
            },
            Rec::NoName {
                parent: 1,
                name: b"b".to_vec(),
            },
            Rec::Xattr {
                ino: 7,
                name: b"user.x".to_vec(),
                value: Some(vec![]),
            },
            Rec::Xattr {
                ino: 7,
                name: b"user.y".to_vec(),
                value: None,
            },
            Rec::Map {
                ino: 7,
                idx: 2,
                k: 5,
            },
            Rec::Cut { ino: 7, idx: 0 },
            Rec::Unmap { ino: 7, idx: 1 },
            Rec::NextIno(99),
            Rec::Done {
                request: 12,
                ino: 7,
                fh: 4,
            },
        ];
        let mut tx = Tx::default();
        for r in &recs {
            tx.put(r);
        }
        let mut rd = Reader::new(&tx.buf);
        let mut back = Vec::new();
        while let Some(r) = rd.next_rec().unwrap() {
            back.push(r);
        }
        assert_eq!(back, recs);
        // Any cut short fails with where, never panics.
        for n in 0..tx.buf.len() {
            let mut rd = Reader::new(&tx.buf[..n]);
            while let Ok(Some(_)) = rd.next_rec() {}
        }
        assert!(Reader::new(&[42]).next_rec().is_err());
    }
}
