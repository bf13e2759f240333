//! One request from the kernel, parsed: its header and its operation with
//! the operation's arguments, borrowed from the buffer it was read into.
//!
//! The kernel is trusted to send well-formed requests, but a short or
//! garbled one is still answered (`EINVAL` or `ENOSYS`), never a panic.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use zerocopy::FromBytes;

use super::abi::{self, opcode, InHeader};

/// A parsed request.
#[derive(Debug)]
pub struct Request<'a> {
    pub header: InHeader,
    pub op: Op<'a>,
}

/// What the kernel asks, with its arguments (parsed in full; the server
/// takes what it needs).
#[derive(Debug)]
#[allow(dead_code)]
pub enum Op<'a> {
    Init(abi::InitIn),
    Destroy,
    Lookup {
        name: &'a OsStr,
    },
    Forget(u64),
    BatchForget(Vec<abi::ForgetOne>),
    Getattr(abi::GetattrIn),
    Setattr(abi::SetattrIn),
    Readlink,
    Symlink {
        name: &'a OsStr,
        target: &'a [u8],
    },
    Mknod {
        arg: abi::MknodIn,
        name: &'a OsStr,
    },
    Mkdir {
        arg: abi::MkdirIn,
        name: &'a OsStr,
    },
    Unlink {
        name: &'a OsStr,
    },
    Rmdir {
        name: &'a OsStr,
    },
    Rename {
        newdir: u64,
        flags: u32,
        name: &'a OsStr,
        newname: &'a OsStr,
    },
    Link {
        oldnodeid: u64,
        newname: &'a OsStr,
    },
    Open(abi::OpenIn),
    Read(abi::ReadIn),
    Write {
        arg: abi::WriteIn,
        data: &'a [u8],
    },
    Statfs,
    Release(abi::ReleaseIn),
    Fsync(abi::FsyncIn),
    Setxattr {
        arg: abi::SetxattrIn,
        name: &'a OsStr,
        value: &'a [u8],
    },
    Getxattr {
        size: u32,
        name: &'a OsStr,
    },
    Listxattr {
        size: u32,
    },
    Removexattr {
        name: &'a OsStr,
    },
    Flush(abi::FlushIn),
    Opendir(abi::OpenIn),
    Readdir(abi::ReadIn),
    Readdirplus(abi::ReadIn),
    Releasedir(abi::ReleaseIn),
    Fsyncdir(abi::FsyncIn),
    Access(abi::AccessIn),
    Create {
        arg: abi::CreateIn,
        name: &'a OsStr,
    },
    Interrupt(abi::InterruptIn),
    Fallocate(abi::FallocateIn),
    Lseek(abi::LseekIn),
    /// Anything else: answered `ENOSYS`, which most opcodes take as "never
    /// again" (locks, ioctls, polls, bmap, copy_file_range, statx, tmpfile,
    /// syncfs ...).
    Other(u32),
    /// Too short for its opcode.
    Malformed(u32),
}

/// Why a buffer is not a request at all.
#[derive(Debug, PartialEq, Eq)]
pub enum ParseError {
    /// Shorter than a header, or than its header's length says.
    Short,
}

/// Splits a NUL-terminated name off the front of `b`.
fn name(b: &[u8]) -> Option<(&OsStr, &[u8])> {
    let end = b.iter().position(|&c| c == 0)?;
    Some((OsStr::from_bytes(&b[..end]), &b[end + 1..]))
}

fn arg<T: FromBytes>(b: &[u8]) -> Option<(T, &[u8])> {
    T::read_from_prefix(b).ok()
}

impl<'a> Request<'a> {
    /// Parses the request at the start of `buf` (one read's worth, from
    /// `/dev/fuse`, or an io_uring entry's header and payload joined).
    pub fn parse(buf: &'a [u8]) -> Result<Request<'a>, ParseError> {
        let (header, _) = InHeader::read_from_prefix(buf).map_err(|_| ParseError::Short)?;
        let len = header.len as usize;
        if len < size_of::<InHeader>() || len > buf.len() {
            return Err(ParseError::Short);
        }
        // Extensions (security contexts, supplementary groups) follow the
        // arguments only where INIT asked for them, which it never does.
        let body = &buf[size_of::<InHeader>()..len];
        let op = Self::op(header.opcode, body).unwrap_or(Op::Malformed(header.opcode));
        Ok(Request { header, op })
    }

    /// Parses a request whose header and argument bytes come apart, as an
    /// io_uring entry carries them: the header, the opcode's fixed
    /// arguments, and the payload after them.
    pub fn parse_split(
        header: InHeader,
        fixed: &'a [u8],
        payload: &'a [u8],
        scratch: &'a mut Vec<u8>,
    ) -> Request<'a> {
        // Names and data follow the fixed arguments; rejoin them so one
        // parser serves both transports (requests with a payload are
        // short, but for WRITE, whose data stays where it is).
        let op = if header.opcode == opcode::WRITE {
            arg::<abi::WriteIn>(fixed)
                .map(|(arg, _)| {
                    let n = (arg.size as usize).min(payload.len());
                    Op::Write {
                        arg,
                        data: &payload[..n],
                    }
                })
                .unwrap_or(Op::Malformed(header.opcode))
        } else {
            scratch.clear();
            scratch.extend_from_slice(fixed);
            scratch.extend_from_slice(payload);
            Self::op(header.opcode, scratch).unwrap_or(Op::Malformed(header.opcode))
        };
        Request { header, op }
    }

    /// The bytes of an opcode's fixed arguments, as an io_uring entry's
    /// per-opcode area holds them (0 for opcodes whose arguments are all
    /// names or data).
    pub fn fixed_size(op: u32) -> usize {
        match op {
            opcode::INIT => size_of::<abi::InitIn>(),
            opcode::FORGET => size_of::<abi::ForgetIn>(),
            opcode::BATCH_FORGET => size_of::<abi::BatchForgetIn>(),
            opcode::GETATTR => size_of::<abi::GetattrIn>(),
            opcode::SETATTR => size_of::<abi::SetattrIn>(),
            opcode::MKNOD => size_of::<abi::MknodIn>(),
            opcode::MKDIR => size_of::<abi::MkdirIn>(),
            opcode::RENAME => size_of::<abi::RenameIn>(),
            opcode::RENAME2 => size_of::<abi::Rename2In>(),
            opcode::LINK => size_of::<abi::LinkIn>(),
            opcode::OPEN | opcode::OPENDIR => size_of::<abi::OpenIn>(),
            opcode::READ | opcode::READDIR | opcode::READDIRPLUS => size_of::<abi::ReadIn>(),
            opcode::WRITE => size_of::<abi::WriteIn>(),
            opcode::RELEASE | opcode::RELEASEDIR => size_of::<abi::ReleaseIn>(),
            opcode::FSYNC | opcode::FSYNCDIR => size_of::<abi::FsyncIn>(),
            opcode::SETXATTR => size_of::<abi::SetxattrIn>(),
            opcode::GETXATTR | opcode::LISTXATTR => size_of::<abi::GetxattrIn>(),
            opcode::FLUSH => size_of::<abi::FlushIn>(),
            opcode::ACCESS => size_of::<abi::AccessIn>(),
            opcode::CREATE => size_of::<abi::CreateIn>(),
            opcode::INTERRUPT => size_of::<abi::InterruptIn>(),
            opcode::FALLOCATE => size_of::<abi::FallocateIn>(),
            opcode::LSEEK => size_of::<abi::LseekIn>(),
            _ => 0,
        }
    }

    fn op(code: u32, b: &'a [u8]) -> Option<Op<'a>> {
        Some(match code {
            opcode::INIT => Op::Init(arg(b)?.0),
            opcode::DESTROY => Op::Destroy,
            opcode::LOOKUP => Op::Lookup { name: name(b)?.0 },
            opcode::FORGET => Op::Forget(arg::<abi::ForgetIn>(b)?.0.nlookup),
            opcode::BATCH_FORGET => {
                let (head, mut rest) = arg::<abi::BatchForgetIn>(b)?;
                let mut v = Vec::with_capacity((head.count as usize).min(rest.len() / 16));
                for _ in 0..head.count {
                    let (one, r) = arg::<abi::ForgetOne>(rest)?;
                    v.push(one);
                    rest = r;
                }
                Op::BatchForget(v)
            }
            opcode::GETATTR => Op::Getattr(arg(b)?.0),
            opcode::SETATTR => Op::Setattr(arg(b)?.0),
            opcode::READLINK => Op::Readlink,
            opcode::SYMLINK => {
                let (name, rest) = name(b)?;
                let end = rest.iter().position(|&c| c == 0).unwrap_or(rest.len());
                Op::Symlink {
                    name,
                    target: &rest[..end],
                }
            }
            opcode::MKNOD => {
                let (arg, rest) = arg(b)?;
                Op::Mknod {
                    arg,
                    name: name(rest)?.0,
                }
            }
            opcode::MKDIR => {
                let (arg, rest) = arg(b)?;
                Op::Mkdir {
                    arg,
                    name: name(rest)?.0,
                }
            }
            opcode::UNLINK => Op::Unlink { name: name(b)?.0 },
            opcode::RMDIR => Op::Rmdir { name: name(b)?.0 },
            opcode::RENAME => {
                let (a, rest) = arg::<abi::RenameIn>(b)?;
                let (n, rest) = name(rest)?;
                Op::Rename {
                    newdir: a.newdir,
                    flags: 0,
                    name: n,
                    newname: name(rest)?.0,
                }
            }
            opcode::RENAME2 => {
                let (a, rest) = arg::<abi::Rename2In>(b)?;
                let (n, rest) = name(rest)?;
                Op::Rename {
                    newdir: a.newdir,
                    flags: a.flags,
                    name: n,
                    newname: name(rest)?.0,
                }
            }
            opcode::LINK => {
                let (a, rest) = arg::<abi::LinkIn>(b)?;
                Op::Link {
                    oldnodeid: a.oldnodeid,
                    newname: name(rest)?.0,
                }
            }
            opcode::OPEN => Op::Open(arg(b)?.0),
            opcode::READ => Op::Read(arg(b)?.0),
            opcode::WRITE => {
                let (arg, rest) = arg::<abi::WriteIn>(b)?;
                Op::Write {
                    data: rest.get(..arg.size as usize)?,
                    arg,
                }
            }
            opcode::STATFS => Op::Statfs,
            opcode::RELEASE => Op::Release(arg(b)?.0),
            opcode::FSYNC => Op::Fsync(arg(b)?.0),
            opcode::SETXATTR => {
                let (arg, rest) = arg::<abi::SetxattrIn>(b)?;
                let (name, rest) = name(rest)?;
                Op::Setxattr {
                    value: rest.get(..arg.size as usize)?,
                    arg,
                    name,
                }
            }
            opcode::GETXATTR => {
                let (a, rest) = arg::<abi::GetxattrIn>(b)?;
                Op::Getxattr {
                    size: a.size,
                    name: name(rest)?.0,
                }
            }
            opcode::LISTXATTR => Op::Listxattr {
                size: arg::<abi::GetxattrIn>(b)?.0.size,
            },
            opcode::REMOVEXATTR => Op::Removexattr { name: name(b)?.0 },
            opcode::FLUSH => Op::Flush(arg(b)?.0),
            opcode::OPENDIR => Op::Opendir(arg(b)?.0),
            opcode::READDIR => Op::Readdir(arg(b)?.0),
            opcode::READDIRPLUS => Op::Readdirplus(arg(b)?.0),
            opcode::RELEASEDIR => Op::Releasedir(arg(b)?.0),
            opcode::FSYNCDIR => Op::Fsyncdir(arg(b)?.0),
            opcode::ACCESS => Op::Access(arg(b)?.0),
            opcode::CREATE => {
                let (arg, rest) = arg(b)?;
                Op::Create {
                    arg,
                    name: name(rest)?.0,
                }
            }
            opcode::INTERRUPT => Op::Interrupt(arg(b)?.0),
            opcode::FALLOCATE => Op::Fallocate(arg(b)?.0),
            opcode::LSEEK => Op::Lseek(arg(b)?.0),
            other => Op::Other(other),
        })
    }
}

#[cfg(test)]
mod tests {
    use zerocopy::IntoBytes;

    use super::*;

    fn request(opcode: u32, body: &[u8]) -> Vec<u8> {
        let h = InHeader {
            len: (size_of::<InHeader>() + body.len()) as u32,
            opcode,
            unique: 7,
            nodeid: 1,
            ..InHeader::default()
        };
        let mut v = h.as_bytes().to_vec();
        v.extend_from_slice(body);
        v
    }

    #[test]
    fn names_and_arguments_are_split_as_the_kernel_lays_them_out() {
        let buf = request(opcode::LOOKUP, b"hello\0");
        let r = Request::parse(&buf).unwrap();
        assert_eq!(r.header.unique, 7);
        assert!(matches!(r.op, Op::Lookup { name } if name == "hello"));

        let mut body = abi::Rename2In {
            newdir: 9,
            flags: 2,
            padding: 0,
        }
        .as_bytes()
        .to_vec();
        body.extend_from_slice(b"a\0bb\0");
        let buf = request(opcode::RENAME2, &body);
        let r = Request::parse(&buf).unwrap();
        assert!(
            matches!(r.op, Op::Rename { newdir: 9, flags: 2, name, newname }
            if name == "a" && newname == "bb")
        );

        let mut body = abi::WriteIn {
            size: 3,
            offset: 100,
            ..Default::default()
        }
        .as_bytes()
        .to_vec();
        body.extend_from_slice(b"xyz");
        let buf = request(opcode::WRITE, &body);
        let r = Request::parse(&buf).unwrap();
        assert!(matches!(r.op, Op::Write { arg, data } if arg.offset == 100 && data == b"xyz"));
    }

    #[test]
    fn short_or_unknown_requests_are_answerable() {
        assert_eq!(Request::parse(&[0u8; 10]).unwrap_err(), ParseError::Short);
        let mut buf = request(opcode::LOOKUP, b"x\0");
        buf[0] = 200; // longer than the buffer
        assert_eq!(Request::parse(&buf).unwrap_err(), ParseError::Short);
        let buf = request(opcode::LOOKUP, b"no terminator");
        assert!(matches!(
            Request::parse(&buf).unwrap().op,
            Op::Malformed(opcode::LOOKUP)
        ));
        let buf = request(opcode::GETATTR, &[0u8; 4]);
        assert!(matches!(
            Request::parse(&buf).unwrap().op,
            Op::Malformed(opcode::GETATTR)
        ));
        let buf = request(31337, b"");
        assert!(matches!(Request::parse(&buf).unwrap().op, Op::Other(31337)));
        // A write whose data is shorter than it says.
        let body = abi::WriteIn {
            size: 10,
            ..Default::default()
        };
        let buf = request(opcode::WRITE, body.as_bytes());
        assert!(matches!(
            Request::parse(&buf).unwrap().op,
            Op::Malformed(opcode::WRITE)
        ));
    }

    #[test]
    fn forgets_come_in_batches() {
        let mut body = abi::BatchForgetIn { count: 2, dummy: 0 }
            .as_bytes()
            .to_vec();
        for (n, k) in [(5u64, 1u64), (6, 3)] {
            body.extend_from_slice(
                abi::ForgetOne {
                    nodeid: n,
                    nlookup: k,
                }
                .as_bytes(),
            );
        }
        let buf = request(opcode::BATCH_FORGET, &body);
        match Request::parse(&buf).unwrap().op {
            Op::BatchForget(v) => {
                assert_eq!(v.len(), 2);
                assert_eq!((v[1].nodeid, v[1].nlookup), (6, 3));
            }
            op => panic!("{op:?}"),
        }
        // A count larger than what follows is malformed, not a huge
        // allocation.
        let body = abi::BatchForgetIn {
            count: u32::MAX,
            dummy: 0,
        };
        let buf = request(opcode::BATCH_FORGET, body.as_bytes());
        assert!(matches!(
            Request::parse(&buf).unwrap().op,
            Op::Malformed(opcode::BATCH_FORGET)
        ));
    }
}
