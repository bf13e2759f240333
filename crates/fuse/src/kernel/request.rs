//! One request from the kernel, parsed: its header, its operation (see
//! `op.rs`) and the operation's arguments, borrowed from the buffer it was
//! read into.
//!
//! The kernel is trusted to send well-formed requests, but a short or
//! garbled one is still answered (`EINVAL` or `ENOSYS`), never a panic.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use zerocopy::FromBytes;

use super::abi::{self, InHeader};
use super::Op;

/// A parsed request.
#[derive(Debug)]
pub struct Request<'a> {
    pub header: InHeader,
    /// The operation; `None` for an opcode foliofs does not know.
    pub op: Option<Op>,
    pub args: Args<'a>,
}

/// The arguments of a request, by the operation that takes them (parsed
/// in full; the server takes what it needs). RENAME and RENAME2 both give
/// [`Args::Rename`].
#[derive(Debug)]
#[allow(dead_code)]
pub enum Args<'a> {
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
    /// An operation whose arguments nobody reads (locks, ioctls, polls,
    /// bmap, copy_file_range, statx, tmpfile, syncfs), or an opcode not
    /// known: answered by its operation alone, mostly `ENOSYS`, which most
    /// opcodes take as "never again".
    Other,
    /// Too short for its opcode.
    Malformed,
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
        let op = Op::from_code(header.opcode);
        let args = Self::args(op, body).unwrap_or(Args::Malformed);
        Ok(Request { header, op, args })
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
        let op = Op::from_code(header.opcode);
        let args = if op == Some(Op::Write) {
            arg::<abi::WriteIn>(fixed).map(|(arg, _)| {
                let n = (arg.size as usize).min(payload.len());
                Args::Write {
                    arg,
                    data: &payload[..n],
                }
            })
        } else {
            scratch.clear();
            scratch.extend_from_slice(fixed);
            scratch.extend_from_slice(payload);
            Self::args(op, scratch)
        };
        Request {
            header,
            op,
            args: args.unwrap_or(Args::Malformed),
        }
    }

    /// The bytes of an opcode's fixed arguments, as an io_uring entry's
    /// per-opcode area holds them (0 for opcodes whose arguments are all
    /// names or data).
    pub fn fixed_size(code: u32) -> usize {
        let Some(op) = Op::from_code(code) else {
            return 0;
        };
        match op {
            Op::Init => size_of::<abi::InitIn>(),
            Op::Forget => size_of::<abi::ForgetIn>(),
            Op::BatchForget => size_of::<abi::BatchForgetIn>(),
            Op::Getattr => size_of::<abi::GetattrIn>(),
            Op::Setattr => size_of::<abi::SetattrIn>(),
            Op::Mknod => size_of::<abi::MknodIn>(),
            Op::Mkdir => size_of::<abi::MkdirIn>(),
            Op::Rename => size_of::<abi::RenameIn>(),
            Op::Rename2 => size_of::<abi::Rename2In>(),
            Op::Link => size_of::<abi::LinkIn>(),
            Op::Open | Op::Opendir => size_of::<abi::OpenIn>(),
            Op::Read | Op::Readdir | Op::Readdirplus => size_of::<abi::ReadIn>(),
            Op::Write => size_of::<abi::WriteIn>(),
            Op::Release | Op::Releasedir => size_of::<abi::ReleaseIn>(),
            Op::Fsync | Op::Fsyncdir => size_of::<abi::FsyncIn>(),
            Op::Setxattr => size_of::<abi::SetxattrIn>(),
            Op::Getxattr | Op::Listxattr => size_of::<abi::GetxattrIn>(),
            Op::Flush => size_of::<abi::FlushIn>(),
            Op::Access => size_of::<abi::AccessIn>(),
            Op::Create => size_of::<abi::CreateIn>(),
            Op::Interrupt => size_of::<abi::InterruptIn>(),
            Op::Fallocate => size_of::<abi::FallocateIn>(),
            Op::Lseek => size_of::<abi::LseekIn>(),
            _ => 0,
        }
    }

    fn args(op: Option<Op>, b: &'a [u8]) -> Option<Args<'a>> {
        let Some(op) = op else {
            return Some(Args::Other);
        };
        Some(match op {
            Op::Init => Args::Init(arg(b)?.0),
            Op::Destroy => Args::Destroy,
            Op::Lookup => Args::Lookup { name: name(b)?.0 },
            Op::Forget => Args::Forget(arg::<abi::ForgetIn>(b)?.0.nlookup),
            Op::BatchForget => {
                let (head, mut rest) = arg::<abi::BatchForgetIn>(b)?;
                let mut v = Vec::with_capacity((head.count as usize).min(rest.len() / 16));
                for _ in 0..head.count {
                    let (one, r) = arg::<abi::ForgetOne>(rest)?;
                    v.push(one);
                    rest = r;
                }
                Args::BatchForget(v)
            }
            Op::Getattr => Args::Getattr(arg(b)?.0),
            Op::Setattr => Args::Setattr(arg(b)?.0),
            Op::Readlink => Args::Readlink,
            Op::Symlink => {
                let (name, rest) = name(b)?;
                let end = rest.iter().position(|&c| c == 0).unwrap_or(rest.len());
                Args::Symlink {
                    name,
                    target: &rest[..end],
                }
            }
            Op::Mknod => {
                let (arg, rest) = arg(b)?;
                Args::Mknod {
                    arg,
                    name: name(rest)?.0,
                }
            }
            Op::Mkdir => {
                let (arg, rest) = arg(b)?;
                Args::Mkdir {
                    arg,
                    name: name(rest)?.0,
                }
            }
            Op::Unlink => Args::Unlink { name: name(b)?.0 },
            Op::Rmdir => Args::Rmdir { name: name(b)?.0 },
            Op::Rename => {
                let (a, rest) = arg::<abi::RenameIn>(b)?;
                let (n, rest) = name(rest)?;
                Args::Rename {
                    newdir: a.newdir,
                    flags: 0,
                    name: n,
                    newname: name(rest)?.0,
                }
            }
            Op::Rename2 => {
                let (a, rest) = arg::<abi::Rename2In>(b)?;
                let (n, rest) = name(rest)?;
                Args::Rename {
                    newdir: a.newdir,
                    flags: a.flags,
                    name: n,
                    newname: name(rest)?.0,
                }
            }
            Op::Link => {
                let (a, rest) = arg::<abi::LinkIn>(b)?;
                Args::Link {
                    oldnodeid: a.oldnodeid,
                    newname: name(rest)?.0,
                }
            }
            Op::Open => Args::Open(arg(b)?.0),
            Op::Read => Args::Read(arg(b)?.0),
            Op::Write => {
                let (arg, rest) = arg::<abi::WriteIn>(b)?;
                Args::Write {
                    data: rest.get(..arg.size as usize)?,
                    arg,
                }
            }
            Op::Statfs => Args::Statfs,
            Op::Release => Args::Release(arg(b)?.0),
            Op::Fsync => Args::Fsync(arg(b)?.0),
            Op::Setxattr => {
                let (arg, rest) = arg::<abi::SetxattrIn>(b)?;
                let (name, rest) = name(rest)?;
                Args::Setxattr {
                    value: rest.get(..arg.size as usize)?,
                    arg,
                    name,
                }
            }
            Op::Getxattr => {
                let (a, rest) = arg::<abi::GetxattrIn>(b)?;
                Args::Getxattr {
                    size: a.size,
                    name: name(rest)?.0,
                }
            }
            Op::Listxattr => Args::Listxattr {
                size: arg::<abi::GetxattrIn>(b)?.0.size,
            },
            Op::Removexattr => Args::Removexattr { name: name(b)?.0 },
            Op::Flush => Args::Flush(arg(b)?.0),
            Op::Opendir => Args::Opendir(arg(b)?.0),
            Op::Readdir => Args::Readdir(arg(b)?.0),
            Op::Readdirplus => Args::Readdirplus(arg(b)?.0),
            Op::Releasedir => Args::Releasedir(arg(b)?.0),
            Op::Fsyncdir => Args::Fsyncdir(arg(b)?.0),
            Op::Access => Args::Access(arg(b)?.0),
            Op::Create => {
                let (arg, rest) = arg(b)?;
                Args::Create {
                    arg,
                    name: name(rest)?.0,
                }
            }
            Op::Interrupt => Args::Interrupt(arg(b)?.0),
            Op::Fallocate => Args::Fallocate(arg(b)?.0),
            Op::Lseek => Args::Lseek(arg(b)?.0),
            Op::Getlk
            | Op::Setlk
            | Op::Setlkw
            | Op::Ioctl
            | Op::Bmap
            | Op::Poll
            | Op::CopyFileRange
            | Op::Syncfs
            | Op::Tmpfile
            | Op::Statx => Args::Other,
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
        let buf = request(Op::Lookup.code(), b"hello\0");
        let r = Request::parse(&buf).unwrap();
        assert_eq!(r.header.unique, 7);
        assert!(matches!(r.args, Args::Lookup { name } if name == "hello"));

        let mut body = abi::Rename2In {
            newdir: 9,
            flags: 2,
            padding: 0,
        }
        .as_bytes()
        .to_vec();
        body.extend_from_slice(b"a\0bb\0");
        let buf = request(Op::Rename2.code(), &body);
        let r = Request::parse(&buf).unwrap();
        assert!(
            matches!(r.args, Args::Rename { newdir: 9, flags: 2, name, newname }
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
        let buf = request(Op::Write.code(), &body);
        let r = Request::parse(&buf).unwrap();
        assert!(matches!(r.args, Args::Write { arg, data } if arg.offset == 100 && data == b"xyz"));
    }

    #[test]
    fn short_or_unknown_requests_are_answerable() {
        assert_eq!(Request::parse(&[0u8; 10]).unwrap_err(), ParseError::Short);
        let mut buf = request(Op::Lookup.code(), b"x\0");
        buf[0] = 200; // longer than the buffer
        assert_eq!(Request::parse(&buf).unwrap_err(), ParseError::Short);
        let buf = request(Op::Lookup.code(), b"no terminator");
        assert!(matches!(
            Request::parse(&buf).unwrap().args,
            Args::Malformed
        ));
        let buf = request(Op::Getattr.code(), &[0u8; 4]);
        assert!(matches!(
            Request::parse(&buf).unwrap().args,
            Args::Malformed
        ));
        let buf = request(31337, b"");
        assert!(matches!(Request::parse(&buf).unwrap().args, Args::Other));
        // A write whose data is shorter than it says.
        let body = abi::WriteIn {
            size: 10,
            ..Default::default()
        };
        let buf = request(Op::Write.code(), body.as_bytes());
        assert!(matches!(
            Request::parse(&buf).unwrap().args,
            Args::Malformed
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
        let buf = request(Op::BatchForget.code(), &body);
        match Request::parse(&buf).unwrap().args {
            Args::BatchForget(v) => {
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
        let buf = request(Op::BatchForget.code(), body.as_bytes());
        assert!(matches!(
            Request::parse(&buf).unwrap().args,
            Args::Malformed
        ));
    }
}
