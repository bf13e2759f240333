//! `/dev/fuse`: one open file of a FUSE connection. Requests are read from
//! it one per `read(2)`, replies written with one `writev(2)` each (so a
//! read reply goes out straight from the block cache, no copy), and it
//! takes the connection's ioctls: another open file on the same connection
//! for another thread (`FUSE_DEV_IOC_CLONE`), and registering backing files
//! for passthrough. Notifications are replies with no request.

use std::fs::File;
use std::io::{self, IoSlice};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use zerocopy::IntoBytes;

use super::abi::{self, notify, OutHeader};

/// One open file of a FUSE connection.
#[derive(Debug)]
pub struct Dev {
    fd: OwnedFd,
}

impl AsFd for Dev {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Dev {
    /// The connection's descriptor, as `mount(2)` or `fusermount3` gave it.
    pub fn new(fd: OwnedFd) -> Dev {
        Dev { fd }
    }

    /// The descriptor, for another owner.
    pub fn into_fd(self) -> OwnedFd {
        self.fd
    }

    /// Another open file of the same connection: a thread that reads on
    /// its own is woken for its own requests and sets its own flags.
    pub fn clone_connection(&self) -> io::Result<Dev> {
        let f = File::options().read(true).write(true).open("/dev/fuse")?;
        let main: u32 = self.fd.as_raw_fd() as u32;
        // SAFETY: FUSE_DEV_IOC_CLONE reads one u32 (the descriptor to
        // clone) from the pointer, which points at `main` for the call.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::ioctl(f.as_raw_fd(), abi::ioctl::CLONE as _, &main) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Dev { fd: f.into() })
    }

    /// Another descriptor of this same open file (its flags, such as
    /// `O_NONBLOCK`, are shared).
    pub fn try_clone_fd(&self) -> io::Result<OwnedFd> {
        self.fd.try_clone()
    }

    /// Reads one request into `buf` (which must hold the largest the
    /// connection sends: `max_write` and a page). `EINTR` and a request
    /// withdrawn before it was read (`ENOENT`) are retried here; the
    /// unmount (`ENODEV`) and, on a non-blocking descriptor, `EAGAIN` come
    /// back to the caller.
    pub fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match rustix::io::read(&self.fd, &mut *buf) {
                Ok(n) => return Ok(n),
                Err(rustix::io::Errno::INTR | rustix::io::Errno::NOENT) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Writes one message: a header of `error` and `unique` and the parts
    /// after it, as one `writev(2)`.
    fn send(&self, unique: u64, error: i32, parts: &[&[u8]]) -> io::Result<()> {
        let len = size_of::<OutHeader>() + parts.iter().map(|p| p.len()).sum::<usize>();
        let header = OutHeader {
            len: len as u32,
            error,
            unique,
        };
        // On the stack for the replies there are (a record or two, or the
        // pieces of one read): the hot path allocates nothing.
        let mut inline = [IoSlice::new(&[]); 4];
        let mut heap = Vec::new();
        let iov: &[IoSlice<'_>] = if parts.len() < inline.len() {
            inline[0] = IoSlice::new(header.as_bytes());
            for (slot, p) in inline[1..].iter_mut().zip(parts) {
                *slot = IoSlice::new(p);
            }
            &inline[..1 + parts.len()]
        } else {
            heap.push(IoSlice::new(header.as_bytes()));
            heap.extend(parts.iter().map(|p| IoSlice::new(p)));
            &heap
        };
        loop {
            match rustix::io::writev(&self.fd, iov) {
                Ok(n) if n == len => return Ok(()),
                Ok(n) => {
                    return Err(io::Error::other(format!(
                        "short write to /dev/fuse: {n} of {len} bytes"
                    )))
                }
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Replies to request `unique`: `errno` 0 with `parts`, or an error
    /// (a positive errno) with none.
    pub fn reply(&self, unique: u64, errno: i32, parts: &[&[u8]]) -> io::Result<()> {
        match self.send(unique, -errno, parts) {
            // The request was interrupted and is gone: nobody waits.
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
            r => r,
        }
    }

    /// Pushes `data` into the kernel's page cache of `nodeid` at `offset`
    /// (`FUSE_NOTIFY_STORE`). `Ok(false)` when the kernel holds no such
    /// inode (it dropped it, or never had it): nothing was stored.
    pub fn notify_store(&self, nodeid: u64, offset: u64, data: &[u8]) -> io::Result<bool> {
        let arg = abi::NotifyStoreOut {
            nodeid,
            offset,
            size: data.len() as u32,
            padding: 0,
        };
        match self.send(0, notify::STORE, &[arg.as_bytes(), data]) {
            Ok(()) => Ok(true),
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Drops the kernel's cached attributes of `nodeid` and, for `len` > 0
    /// (or -1: to the end), its cached pages from `off`
    /// (`FUSE_NOTIFY_INVAL_INODE`).
    pub fn notify_inval_inode(&self, nodeid: u64, off: i64, len: i64) -> io::Result<()> {
        let arg = abi::NotifyInvalInodeOut {
            ino: nodeid,
            off,
            len,
        };
        match self.send(0, notify::INVAL_INODE, &[arg.as_bytes()]) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
            r => r,
        }
    }

    /// Puts every request a server read and did not answer back in the
    /// queue, marked as resent (`FUSE_NOTIFY_RESEND`, Linux 6.9): what a
    /// server that died was working on goes to the next one.
    pub fn notify_resend(&self) -> io::Result<()> {
        self.send(0, notify::RESEND, &[])
    }

    /// Registers `file` as a backing file for passthrough opens; the id
    /// goes in their replies. Needs `CAP_SYS_ADMIN` of the machine.
    pub fn backing_open(&self, file: BorrowedFd<'_>) -> io::Result<u32> {
        let map = abi::BackingMap {
            fd: file.as_raw_fd(),
            flags: 0,
            padding: 0,
        };
        // SAFETY: FUSE_DEV_IOC_BACKING_OPEN reads one `fuse_backing_map`
        // (16 bytes, `repr(C)`) from the pointer, which points at `map` for
        // the call; `file` is open for as long.
        #[allow(unsafe_code)]
        let rc = unsafe {
            libc::ioctl(
                self.fd.as_raw_fd(),
                abi::ioctl::BACKING_OPEN as _,
                &map as *const abi::BackingMap,
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(rc as u32)
    }

    /// Gives a backing file's registration back.
    pub fn backing_close(&self, id: u32) -> io::Result<()> {
        // SAFETY: FUSE_DEV_IOC_BACKING_CLOSE reads one u32 from the
        // pointer, which points at `id` for the call.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::ioctl(self.fd.as_raw_fd(), abi::ioctl::BACKING_CLOSE as _, &id) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}
