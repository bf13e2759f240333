//! FUSE over io_uring (Linux 6.14 and later, where root has written `Y`
//! to `/sys/module/fuse/parameters/enable_uring`): one queue per possible
//! CPU, each served by a thread pinned to that CPU. The kernel puts a
//! request on the queue of the CPU its caller runs on, so the server
//! thread that answers it is woken on the same CPU. The reply does not
//! stay there: it wakes the caller while the ring's thread still runs on
//! that CPU, and the scheduler moves the caller to an idle one (3.3 moves
//! per ramfs create on 2 CPUs). So a mount takes io_uring only when asked
//! by name.
//!
//! Each queue holds [`DEPTH`] entries. An entry is two buffers the kernel
//! fills with a request (the header and fixed arguments in the first, names
//! and data in the second) and takes the reply from; it is handed over with
//! `FUSE_IO_URING_CMD_REGISTER` and, after each reply,
//! `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`, which commits the reply and waits
//! for the next request in one submission. FORGET, INTERRUPT and the
//! notifications stay on `/dev/fuse`, as do requests sent before every
//! queue is registered.

use std::cell::RefCell;
use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::Arc;

use foliofs_vfs::AlignedBuf;
use io_uring::{opcode, squeue, types, IoUring};
use zerocopy::{FromBytes, IntoBytes};

use super::abi::{InHeader, OutHeader, UringCmdReq, UringEntInOut, URING_HEADER_AREA};
use super::reply::Sink;
use super::{Agreed, Dev, Handler, Reply, Request};

/// Entries per queue: requests one CPU may have in flight at once (a
/// caller waits for its own; readahead and async reads add a few).
pub const DEPTH: usize = 16;

const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;

/// The header buffer's parts: the in/out header, the opcode's fixed
/// arguments, then the entry's own record.
const OP_AREA: std::ops::Range<usize> = URING_HEADER_AREA..2 * URING_HEADER_AREA;
const ENT_AREA: usize = 2 * URING_HEADER_AREA;
/// What the header buffer holds, rounded to a page (the kernel may pin it).
const HEADER_BYTES: usize = 4096;

/// The CPUs the kernel may run a caller on: one queue each, or the kernel
/// never switches the connection over (`/sys/devices/system/cpu/possible`).
pub fn possible_cpus() -> io::Result<Vec<usize>> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    parse_cpu_list(text.trim())
        .ok_or_else(|| io::Error::other(format!("cannot read the CPU list {text:?}")))
}

fn parse_cpu_list(s: &str) -> Option<Vec<usize>> {
    let mut v = Vec::new();
    for part in s.split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => v.extend(a.parse::<usize>().ok()?..=b.parse().ok()?),
            None => v.push(part.parse().ok()?),
        }
    }
    (!v.is_empty()).then_some(v)
}

/// One request slot of a queue.
struct Entry {
    /// Page-aligned, and never resized, so that they do not move while
    /// the kernel holds their addresses.
    header: AlignedBuf,
    payload: AlignedBuf,
    /// The two buffers as the kernel reads them at REGISTER.
    iov: [libc::iovec; 2],
}

// SAFETY: the iovecs only point into this entry's own buffers, which move
// with it to the queue's thread and are used there alone.
#[allow(unsafe_code)]
unsafe impl Send for Entry {}

/// Where a reply goes before it is committed: straight into the entry's
/// payload buffer when the request borrowed nothing of it (reads, listings:
/// their data is copied once, as over `/dev/fuse`), else into a side buffer
/// that is copied over after the handler returns (names and write data
/// are still borrowed while it runs; their replies are small).
enum Out<'a> {
    Direct(&'a mut [u8]),
    Staged(&'a mut Vec<u8>),
}

struct RingSink<'a> {
    out: RefCell<Out<'a>>,
    /// The reply: errno and payload length, once sent.
    sent: RefCell<Option<(i32, usize)>>,
}

impl Sink for RingSink<'_> {
    fn send(&self, _unique: u64, errno: i32, parts: &[&[u8]]) -> io::Result<()> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let mut out = self.out.borrow_mut();
        let mut at = 0;
        match &mut *out {
            Out::Direct(buf) => {
                if len > buf.len() {
                    *self.sent.borrow_mut() = Some((libc::EIO, 0));
                    return Err(io::Error::other(format!(
                        "a reply of {len} bytes does not fit the ring's {}",
                        buf.len()
                    )));
                }
                for p in parts {
                    buf[at..at + p.len()].copy_from_slice(p);
                    at += p.len();
                }
            }
            Out::Staged(v) => {
                v.clear();
                for p in parts {
                    v.extend_from_slice(p);
                }
            }
        }
        *self.sent.borrow_mut() = Some((errno, len));
        Ok(())
    }
}

/// One queue: its ring, its entries, the CPU it serves.
pub struct Queue {
    qid: u16,
    cpu: usize,
    ring: IoUring<squeue::Entry128>,
    entries: Vec<Entry>,
    fd: RawFd,
    payload_size: usize,
}

/// The queues of a connection, made and registered; [`Queues::serve`] runs
/// them.
pub struct Queues {
    queues: Vec<Queue>,
}

impl Queues {
    /// A queue for every possible CPU on the connection `dev`, whose INIT
    /// took `FUSE_OVER_IO_URING`; their entries are registered when
    /// [`Queues::serve`] starts them.
    pub fn new(dev: &Dev, agreed: &Agreed) -> io::Result<Queues> {
        let cpus = possible_cpus()?;
        // The kernel's payload: the largest write or read, with room for
        // the names and arguments some requests put there.
        let payload_size = agreed.max_write as usize + 4096;
        let mut queues = Vec::with_capacity(cpus.len());
        for (qid, cpu) in cpus.into_iter().enumerate() {
            let ring = IoUring::<squeue::Entry128>::builder()
                .setup_cqsize((DEPTH * 2) as u32)
                .build(DEPTH as u32)?;
            let mut entries: Vec<Entry> = (0..DEPTH)
                .map(|_| Entry {
                    header: AlignedBuf::new(HEADER_BYTES, 4096),
                    payload: AlignedBuf::new(payload_size, 4096),
                    iov: [libc::iovec {
                        iov_base: std::ptr::null_mut(),
                        iov_len: 0,
                    }; 2],
                })
                .collect();
            for e in &mut entries {
                let h = e.header.as_mut_slice();
                e.iov[0] = libc::iovec {
                    iov_base: h.as_mut_ptr().cast(),
                    iov_len: h.len(),
                };
                let p = e.payload.as_mut_slice();
                e.iov[1] = libc::iovec {
                    iov_base: p.as_mut_ptr().cast(),
                    iov_len: p.len(),
                };
            }
            queues.push(Queue {
                qid: u16::try_from(qid).map_err(io::Error::other)?,
                cpu,
                ring,
                entries,
                fd: dev.as_fd().as_raw_fd(),
                payload_size,
            });
        }
        Ok(Queues { queues })
    }

    /// Serves every queue on a thread of its own, pinned to its CPU, until
    /// the connection goes away. `dev` must stay open for as long (the
    /// rings name its descriptor).
    pub fn serve(
        self,
        dev: Arc<Dev>,
        handler: Arc<dyn Handler>,
    ) -> io::Result<Vec<std::thread::JoinHandle<io::Result<()>>>> {
        let mut threads = Vec::new();
        for q in self.queues {
            let (h, d) = (handler.clone(), dev.clone());
            threads.push(
                std::thread::Builder::new()
                    .name(format!("foliofs-ring-{}", q.qid))
                    .spawn(move || {
                        let r = q.run(&*h);
                        drop(d);
                        r
                    })?,
            );
        }
        Ok(threads)
    }
}

/// An URING_CMD submission of `cmd` for entry `idx` of queue `qid`.
fn command(fd: RawFd, cmd: u32, qid: u16, commit_id: u64, idx: usize) -> squeue::Entry128 {
    let req = UringCmdReq {
        flags: 0,
        commit_id,
        qid,
        padding: [0; 6],
    };
    let mut area = [0u8; 80];
    area[..size_of::<UringCmdReq>()].copy_from_slice(req.as_bytes());
    opcode::UringCmd80::new(types::Fd(fd), cmd)
        .cmd(area)
        .build()
        .user_data(idx as u64)
}

impl Queue {
    /// The REGISTER submission of entry `idx`: its two buffers, as an
    /// array of two iovecs (`sqe->addr`, `sqe->len == 2`).
    fn register(&self, idx: usize) -> squeue::Entry128 {
        let mut e = command(self.fd, CMD_REGISTER, self.qid, 0, idx);
        let addr = self.entries[idx].iov.as_ptr() as u64;
        set_addr_len(&mut e, addr, 2);
        e
    }

    fn push(&mut self, e: &squeue::Entry128) -> io::Result<()> {
        // SAFETY: every buffer a submission names (the entry's iovecs and
        // the buffers they point at) lives in `self.entries`, which is not
        // dropped or moved while the ring runs: the queue owns both and
        // drops the ring first.
        #[allow(unsafe_code)]
        let pushed = unsafe { self.ring.submission().push(e) };
        pushed.map_err(|_| io::Error::other("the io_uring submission queue is full"))
    }

    fn run(mut self, handler: &dyn Handler) -> io::Result<()> {
        pin_to(self.cpu);
        for idx in 0..self.entries.len() {
            let e = self.register(idx);
            self.push(&e)?;
        }
        let mut staged = Vec::new();
        let mut scratch = Vec::new();
        loop {
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => return Err(e),
            }
            let done: Vec<(u64, i32)> = self
                .ring
                .completion()
                .map(|c| (c.user_data(), c.result()))
                .collect();
            for (idx, res) in done {
                let idx = idx as usize;
                if res < 0 {
                    match -res {
                        libc::EAGAIN | libc::EINTR => {
                            let e = self.register(idx);
                            self.push(&e)?;
                            continue;
                        }
                        // The file system is unmounted, or the connection
                        // aborted.
                        libc::ENOTCONN | libc::ENODEV | libc::ECANCELED => return Ok(()),
                        e => {
                            return Err(io::Error::other(format!(
                                "FUSE io_uring queue {}: {}",
                                self.qid,
                                io::Error::from_raw_os_error(e)
                            )))
                        }
                    }
                }
                let commit_id = self.answer(idx, handler, &mut staged, &mut scratch);
                let e = command(self.fd, CMD_COMMIT_AND_FETCH, self.qid, commit_id, idx);
                self.push(&e)?;
            }
        }
    }

    /// Answers the request entry `idx` holds; returns its commit id.
    fn answer(
        &mut self,
        idx: usize,
        handler: &dyn Handler,
        staged: &mut Vec<u8>,
        scratch: &mut Vec<u8>,
    ) -> u64 {
        let payload_size = self.payload_size;
        let ent = &mut self.entries[idx];
        let h = ent.header.as_slice();
        let header = InHeader::read_from_prefix(h)
            .map(|(x, _)| x)
            .unwrap_or_default();
        let (ring_ent, _) = UringEntInOut::read_from_prefix(&h[ENT_AREA..])
            .unwrap_or((UringEntInOut::default(), &[]));
        let mut fixed = [0u8; URING_HEADER_AREA];
        fixed.copy_from_slice(&h[OP_AREA]);
        let fixed_len = Request::fixed_size(header.opcode);
        let in_len = (ring_ent.payload_sz as usize).min(payload_size);
        let sent;
        {
            let (payload, out) = if in_len == 0 {
                (&[][..], Out::Direct(ent.payload.as_mut_slice()))
            } else {
                (&ent.payload.as_slice()[..in_len], Out::Staged(staged))
            };
            let sink = RingSink {
                out: RefCell::new(out),
                sent: RefCell::new(None),
            };
            let req = Request::parse_split(header, &fixed[..fixed_len], payload, scratch);
            handler.handle(req, Reply::new(header.unique, &sink));
            sent = sink.sent.into_inner().unwrap_or((libc::EIO, 0));
        }
        let (errno, mut len) = sent;
        if in_len > 0 {
            let p = ent.payload.as_mut_slice();
            len = len.min(p.len());
            p[..len].copy_from_slice(&staged[..len]);
        }
        let out = OutHeader {
            len: (size_of::<OutHeader>() + len) as u32,
            error: -errno,
            unique: header.unique,
        };
        let h = ent.header.as_mut_slice();
        h[..size_of::<OutHeader>()].copy_from_slice(out.as_bytes());
        let reply_ent = UringEntInOut {
            payload_sz: len as u32,
            ..ring_ent
        };
        h[ENT_AREA..ENT_AREA + size_of::<UringEntInOut>()].copy_from_slice(reply_ent.as_bytes());
        ring_ent.commit_id
    }
}

/// Sets `sqe->addr` and `sqe->len` of a submission, which the builder of
/// URING_CMD cannot (it has no `len`).
fn set_addr_len(e: &mut squeue::Entry128, addr: u64, len: u32) {
    let p = (e as *mut squeue::Entry128).cast::<u8>();
    // SAFETY: `Entry128` is `repr(C)`: a 64-byte `io_uring_sqe` then 64
    // more bytes. In the sqe `addr` is the u64 at byte 16 and `len` the u32
    // at byte 24; both writes stay inside it and are unaligned-safe.
    #[allow(unsafe_code)]
    unsafe {
        p.add(16).cast::<u64>().write_unaligned(addr);
        p.add(24).cast::<u32>().write_unaligned(len);
    }
}

/// Runs this thread on `cpu` alone: requests come from callers there.
fn pin_to(cpu: usize) {
    let mut set = nix::sched::CpuSet::new();
    if set.set(cpu).is_ok() {
        if let Err(e) = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set) {
            log::debug!("cannot pin the ring thread to CPU {cpu}: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_read_as_the_kernel_writes_them() {
        assert_eq!(parse_cpu_list("0-1"), Some(vec![0, 1]));
        assert_eq!(parse_cpu_list("0"), Some(vec![0]));
        assert_eq!(parse_cpu_list("0-2,4,6-7"), Some(vec![0, 1, 2, 4, 6, 7]));
        assert_eq!(parse_cpu_list(""), None);
        assert_eq!(parse_cpu_list("x"), None);
    }

    #[test]
    fn submissions_carry_the_buffers_and_the_command() {
        let e = command(3, CMD_COMMIT_AND_FETCH, 1, 77, 5);
        let mut e2 = e.clone();
        set_addr_len(&mut e2, 0xdead_beef, 2);
        let bytes: &[u8; 128] = {
            let p = (&e2 as *const squeue::Entry128).cast::<[u8; 128]>();
            // SAFETY: Entry128 is 128 bytes of plain data (`repr(C)`).
            #[allow(unsafe_code)]
            unsafe {
                &*p
            }
        };
        assert_eq!(bytes[0], io_uring::opcode::UringCmd80::CODE);
        assert_eq!(
            u64::from_ne_bytes(bytes[16..24].try_into().unwrap()),
            0xdead_beef
        );
        assert_eq!(u32::from_ne_bytes(bytes[24..28].try_into().unwrap()), 2);
        // The command area (sqe->cmd, at byte 48) starts with the request.
        let req = UringCmdReq::read_from_prefix(&bytes[48..]).unwrap().0;
        assert_eq!((req.commit_id, req.qid), (77, 1));
        assert_eq!(u64::from_ne_bytes(bytes[32..40].try_into().unwrap()), 5);
    }

    #[test]
    fn aligned_buffers_start_on_a_page() {
        let b = AlignedBuf::new(5000, 4096);
        assert_eq!(b.as_slice().as_ptr() as usize % 4096, 0);
        assert_eq!(b.as_slice().len(), 5000);
    }
}
