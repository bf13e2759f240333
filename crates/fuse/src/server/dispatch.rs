//! The one place a parsed request passes through on its way to its
//! handler: what every request costs the server besides its own work
//! (counting it, keeping the polling thread awake, logging it with
//! `debug`) is done here once, so no handler can forget it or do it twice,
//! and the handlers hold only their own work.
//!
//! The requests the server answers without a handler of their own
//! (forgets, FLUSH, RELEASEDIR, FSYNCDIR, ioctls, locks, what no format
//! offers) are answered here too.

use super::Server;
use crate::kernel::abi::{self, InHeader};
use crate::kernel::{Args, Op, Reply, Request};

impl Server {
    /// Counts, logs and answers `req`.
    pub(super) fn dispatch(&self, req: Request<'_>, reply: Reply<'_>) {
        let h = &req.header;
        let resent = h.unique & abi::UNIQUE_RESEND != 0;
        if resent {
            self.requests.resent();
        }
        let _scope = foliofs_vfs::request::Scope::enter(h.unique & !abi::UNIQUE_RESEND, resent);
        // A malformed request is answered, not counted: it never reached
        // its operation.
        if let Some(op) = req.op.filter(|_| !matches!(req.args, Args::Malformed)) {
            self.count(op, &req.args);
        }
        if self.cfg.debug {
            log_request(h, &req.args);
        }
        match req.args {
            Args::Lookup { name } => self.lookup(h, name, reply),
            Args::Forget(n) => {
                self.fs.forget(self.ino(h.nodeid), n);
                reply.none();
            }
            Args::BatchForget(list) => {
                for f in list {
                    self.fs.forget(self.ino(f.nodeid), f.nlookup);
                }
                reply.none();
            }
            Args::Getattr(_) => self.getattr(h, reply),
            Args::Setattr(arg) => self.setattr(h, &arg, reply),
            Args::Readlink => self.readlink(h, reply),
            Args::Symlink { name, target } => self.symlink(h, name, target, reply),
            Args::Mknod { arg, name } => self.mknod(h, &arg, name, reply),
            Args::Mkdir { arg, name } => self.mkdir(h, &arg, name, reply),
            Args::Unlink { name } => self.unlink(h, name, reply),
            Args::Rmdir { name } => self.rmdir(h, name, reply),
            Args::Rename {
                newdir,
                flags,
                name,
                newname,
            } => self.rename(h, newdir, flags, name, newname, reply),
            Args::Link { oldnodeid, newname } => self.link(h, oldnodeid, newname, reply),
            Args::Open(arg) => self.open(h, &arg, reply),
            Args::Read(arg) => self.read(h, &arg, reply),
            Args::Write { arg, data } => self.write(h, &arg, data, reply),
            Args::Statfs => self.statfs(reply),
            Args::Release(arg) => self.release(h, &arg, reply),
            Args::Fsync(arg) => self.fsync(h, &arg, reply),
            Args::Setxattr { arg, name, value } => self.setxattr(h, &arg, name, value, reply),
            Args::Getxattr { size, name } => self.getxattr(h, size, name, reply),
            Args::Listxattr { size } => self.listxattr(h, size, reply),
            Args::Removexattr { name } => self.removexattr(h, name, reply),
            // Nothing is buffered here between write(2) and close(2), and
            // the kernel writes its own dirty pages back before it would
            // ask. ENOSYS makes it stop sending a FLUSH round trip on every
            // close.
            Args::Flush(_) => reply.error(libc::ENOSYS),
            Args::Opendir(_) => self.opendir(reply),
            Args::Readdir(arg) => self.readdir(h, &arg, reply),
            Args::Readdirplus(arg) => self.readdirplus(h, &arg, reply),
            Args::Releasedir(_) => reply.ok(),
            // ENOSYS, so the kernel stops asking (nothing of a directory is
            // buffered between it and here).
            Args::Fsyncdir(_) => reply.error(libc::ENOSYS),
            Args::Access(arg) => self.access(h, arg.mask, reply),
            Args::Create { arg, name } => self.create(h, &arg, name, reply),
            // Nothing here blocks long enough to be worth interrupting.
            Args::Interrupt(_) => reply.none(),
            Args::Fallocate(arg) => self.fallocate(h, &arg, reply),
            Args::Lseek(arg) => self.lseek(h, &arg, reply),
            Args::Init(_) => reply.error(libc::EPROTO),
            Args::Destroy => reply.ok(),
            // Ioctls (no file here has any: programs probe with them,
            // Python asks every file whether it is a terminal, and ENOTTY
            // is what a plain file answers), locks (the kernel keeps POSIX
            // locks itself, local to this mount), and what no format
            // offers: ENOSYS, which most opcodes take as "never again".
            Args::Other => match req.op {
                Some(Op::Ioctl) => reply.error(libc::ENOTTY),
                _ => reply.error(libc::ENOSYS),
            },
            Args::Malformed => {
                log::warn!("a malformed request (opcode {}): EINVAL", h.opcode);
                reply.error(libc::EINVAL)
            }
        }
    }

    /// Counts a request of `op`, and keeps the polling thread awake for
    /// the next one. What is not counted (see [`Op::counter`]) does not
    /// keep it awake either.
    fn count(&self, op: Op, args: &Args<'_>) {
        if op.counter().is_none() {
            return;
        }
        // A BATCH_FORGET counts each inode it forgets.
        let n = match args {
            Args::BatchForget(list) => list.len() as u64,
            _ => 1,
        };
        if n == 0 {
            return;
        }
        self.requests.bump_by(op, n);
        if let Some(s) = self.spin.get() {
            s.touch();
        }
    }
}

/// With `debug`, one line on stderr for the requests worth following (the
/// foreground terminal, or the log file a background server was given),
/// whatever the log filter says: asking for it is the filter.
fn log_request(h: &InHeader, args: &Args<'_>) {
    let node = h.nodeid;
    match args {
        Args::Lookup { name } => eprintln!("foliofs: lookup({node}, {name:?}) pid {}", h.pid),
        Args::Getattr(_) => eprintln!("foliofs: getattr({node})"),
        Args::Setattr(arg) => eprintln!(
            "foliofs: setattr({node}, valid {:#x}, mode {:o}, size {})",
            arg.valid, arg.mode, arg.size
        ),
        Args::Readlink => eprintln!("foliofs: readlink({node})"),
        Args::Mknod { arg, name } => eprintln!("foliofs: mknod({node}, {name:?}, {:o})", arg.mode),
        Args::Mkdir { arg, name } => eprintln!("foliofs: mkdir({node}, {name:?}, {:o})", arg.mode),
        Args::Unlink { name } => eprintln!("foliofs: unlink({node}, {name:?})"),
        Args::Rmdir { name } => eprintln!("foliofs: rmdir({node}, {name:?})"),
        Args::Symlink { name, target } => eprintln!(
            "foliofs: symlink({node}, {name:?}, {:?})",
            String::from_utf8_lossy(target)
        ),
        Args::Rename {
            newdir,
            flags,
            name,
            newname,
        } => eprintln!("foliofs: rename({node}, {name:?}, {newdir}, {newname:?}, {flags:#x})"),
        Args::Link { oldnodeid, newname } => {
            eprintln!("foliofs: link({oldnodeid}, {node}, {newname:?})")
        }
        Args::Getxattr { name, .. } => eprintln!("foliofs: getxattr({node}, {name:?})"),
        Args::Open(arg) => eprintln!("foliofs: open({node}, {:#x})", arg.flags),
        Args::Create { arg, name } => {
            eprintln!("foliofs: create({node}, {name:?}, {:o})", arg.mode)
        }
        Args::Read(arg) => eprintln!("foliofs: read({node}, {}, {})", arg.offset, arg.size),
        Args::Write { arg, data } => {
            eprintln!("foliofs: write({node}, {}, {})", arg.offset, data.len())
        }
        Args::Opendir(_) => eprintln!("foliofs: opendir({node})"),
        Args::Readdir(arg) => eprintln!("foliofs: readdir({node}, {})", arg.offset),
        Args::Readdirplus(arg) => eprintln!("foliofs: readdirplus({node}, {})", arg.offset),
        _ => {}
    }
}
