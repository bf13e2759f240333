//! Requests about file data and listings: opens and creates (passed
//! through to the kernel where they can be), reads, writes, releases,
//! fsync, fallocate, lseek, and directory listings.

use std::ffi::OsStr;

use foliofs_vfs::{self as vfs, Error, Ino};

use super::convert::ctx;
use super::passthrough::PassedOpen;
use super::{next_listing, Server, DIRBUF, SCRATCH};
use crate::kernel::abi::{self, dirent_type, fopen, InHeader};
use crate::kernel::DirBuf;
use crate::kernel::Reply;

/// How long a READDIR waits for its reply being built ahead before it
/// builds it itself (a bound only: a build takes well under a millisecond).
const NEXT_LISTING_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

impl Server {
    /// Flags for a file opened with open(2) flags `flags`.
    fn open_flags(&self, flags: u32) -> u32 {
        let flags = flags as i32;
        if self.cfg.read_only {
            fopen::KEEP_CACHE
        } else if flags & libc::O_ACCMODE == libc::O_WRONLY && self.direct_writes {
            // A descriptor that cannot read gains nothing from the page
            // cache, and without the writeback cache every write(2) comes
            // here at once anyway. Direct I/O hands the server the writer's
            // own pages instead of a page-cache copy of them: one copy and
            // all page-cache bookkeeping fewer, twice the bandwidth of `dd`.
            // The kernel (6.6 on) writes back other descriptors' dirty
            // pages of the range and drops their cached pages around the
            // write, so they stay coherent, and it leaves dropping
            // set-user-ID to the server (`FUSE_WRITE_KILL_SUIDGID`).
            // Readable descriptors keep the page cache: mmap needs it.
            fopen::DIRECT_IO
        } else {
            0
        }
    }

    /// The registration an open of `ino` is passed through with, where the
    /// file system keeps its bytes in a backing file and the kernel took
    /// passthrough. A file with set-user-ID (or set-group-ID with group
    /// execute) is not: a write through the kernel would leave the bit,
    /// which the server drops on the writes it sees.
    fn pass_through(&self, ino: Ino, attr: Option<&vfs::Attr>) -> Option<PassedOpen<'_>> {
        let p = self.cfg.passthrough.as_ref()?;
        let file = self.fs.backing_file(ino)?;
        let set_id = |a: &vfs::Attr| a.perm & 0o4000 != 0 || a.perm & 0o2010 == 0o2010;
        let privileged = match attr {
            Some(a) => set_id(a),
            None => self.fs.getattr(ino).is_ok_and(|a| set_id(&a)),
        };
        let dev = self.dev.get()?;
        let passed = p.open(ino, !privileged, !self.fs.replayed(), || {
            super::passthrough::BackingId::open(dev, &file)
        })?;
        if passed.fresh() {
            // Before the open is answered: a server that dies after must
            // hand the next the registration the kernel then holds.
            self.fs.note_backing(ino, Some(passed.id()));
        }
        Some(passed)
    }

    /// An open by someone without `CAP_FSETID` that truncates: the kernel
    /// leaves dropping set-user-ID to the server.
    fn kill_on_open(&self, ino: Ino, open_flags: u32) -> vfs::Result<()> {
        if open_flags & abi::OPEN_KILL_SUIDGID != 0 {
            self.fs.kill_suid(ino)?;
        }
        Ok(())
    }

    pub(super) fn open(&self, h: &InHeader, arg: &abi::OpenIn, reply: Reply<'_>) {
        if self.cfg.read_only {
            // An image never changes under its mount, and the mount is
            // MS_RDONLY (the kernel refuses writable opens itself). ENOSYS
            // tells the kernel to stop sending opens and releases at all and
            // to keep every file's page cache: two round trips saved per
            // open(2), which is most of the cost of reading many small files.
            return reply.error(libc::ENOSYS);
        }
        let ino = self.ino(h.nodeid);
        if let Err(e) = self.kill_on_open(ino, arg.open_flags) {
            return reply.error(e.errno());
        }
        match self.fs.open(ino, arg.flags as i32) {
            Ok(fh) => {
                let passed = self.pass_through(ino, None);
                let out = abi::OpenOut {
                    fh,
                    open_flags: match &passed {
                        Some(_) => fopen::PASSTHROUGH,
                        None => self.open_flags(arg.flags),
                    },
                    backing_id: passed.as_ref().map_or(0, |p| p.id() as i32),
                };
                // Sent while the registration is held, so a release racing
                // it cannot give it back first.
                reply.record(&out);
                drop(passed);
            }
            Err(e) => reply.error(e.errno()),
        }
    }

    pub(super) fn create(&self, h: &InHeader, arg: &abi::CreateIn, name: &OsStr, reply: Reply<'_>) {
        let Some(reply) = self.writable(reply) else {
            return;
        };
        match self.fs.create(
            self.ino(h.nodeid),
            name,
            (arg.mode & 0o7777) as u16,
            arg.flags as i32,
            &ctx(h, arg.umask),
        ) {
            Ok((mut a, fh)) => {
                // An existing file truncated by O_TRUNC.
                if arg.open_flags & abi::OPEN_KILL_SUIDGID != 0 {
                    if let Err(e) = self.fs.kill_suid(a.ino) {
                        return reply.error(e.errno());
                    }
                    a = self.fs.getattr(a.ino).unwrap_or(a);
                }
                let entry = self.entry(a);
                let passed = self.pass_through(a.ino, Some(&a));
                let open = abi::OpenOut {
                    fh,
                    open_flags: match &passed {
                        Some(_) => fopen::PASSTHROUGH,
                        None => self.open_flags(arg.flags),
                    },
                    backing_id: passed.as_ref().map_or(0, |p| p.id() as i32),
                };
                reply.parts(&[
                    zerocopy::IntoBytes::as_bytes(&entry),
                    zerocopy::IntoBytes::as_bytes(&open),
                ]);
                drop(passed);
            }
            Err(e) => reply.error(e.errno()),
        }
    }

    pub(super) fn read(&self, h: &InHeader, arg: &abi::ReadIn, reply: Reply<'_>) {
        let ino = self.ino(h.nodeid);
        if let Some(p) = &self.pusher {
            p.reading(ino);
        }
        SCRATCH.with(|s| {
            let mut s = s.borrow_mut();
            match self.fs.read(ino, arg.offset, arg.size, &mut s) {
                Ok(data) => {
                    if let Some(r) = &self.recorder {
                        r.read(ino, arg.offset, data.len() as u64);
                    }
                    // Straight from the block cache (or the scratch) into
                    // the kernel: no copy into a reply buffer.
                    reply.parts(&[data])
                }
                Err(e) => {
                    log::warn!("read of inode {ino} at {}: {e}", arg.offset);
                    reply.error(e.errno())
                }
            }
        });
    }

    pub(super) fn write(&self, h: &InHeader, arg: &abi::WriteIn, data: &[u8], reply: Reply<'_>) {
        let Some(reply) = self.writable(reply) else {
            return;
        };
        let node = h.nodeid;
        let ino = self.ino(node);
        if arg.write_flags & abi::WRITE_KILL_SUIDGID != 0 {
            let before = self.fs.getattr(ino).map(|a| a.perm);
            if let Err(e) = self.fs.kill_suid(ino) {
                return reply.error(e.errno());
            }
            // The kernel cannot know the mode changed: its cached mode
            // would keep set-user-ID for permission checks (exec) until the
            // attributes expire, which on a writable mount they do not soon.
            if before.is_ok_and(|p| self.fs.getattr(ino).is_ok_and(|a| a.perm != p)) {
                self.forget_cached_attrs(node);
            }
        }
        let (fh, flags) = (arg.fh, arg.flags as i32);
        let written = |n: u32| abi::WriteOut {
            size: n,
            padding: 0,
        };
        if arg.write_flags & abi::WRITE_CACHE == 0 {
            // A short count reaches the writer as the result of write(2).
            return match self.fs.write(ino, fh, arg.offset, data, flags) {
                Ok(n) => reply.record(&written(n)),
                Err(e) => reply.error(e.errno()),
            };
        }
        // Writeback of cached pages: the kernel does not look at a short
        // count, so the bytes left over would be lost without an error.
        // Write on until everything is stored or the file system says why not.
        let mut done = 0usize;
        while done < data.len() {
            match self
                .fs
                .write(ino, fh, arg.offset + done as u64, &data[done..], flags)
            {
                Ok(0) => return reply.error(libc::EIO),
                Ok(n) => done += n as usize,
                Err(e) => return reply.error(e.errno()),
            }
        }
        reply.record(&written(done as u32))
    }

    pub(super) fn release(&self, h: &InHeader, arg: &abi::ReleaseIn, reply: Reply<'_>) {
        let ino = self.ino(h.nodeid);
        let r = self.fs.release(ino, arg.fh);
        // A resent release an earlier server carried out is in the counts
        // this server started from.
        if let Some(p) = self
            .cfg
            .passthrough
            .as_ref()
            .filter(|_| !self.fs.replayed())
        {
            if let Some(id) = p.release(ino) {
                // Said first: a registration forgotten is only held
                // longer; one remembered after it is given back would be
                // named to the kernel again.
                self.fs.note_backing(ino, None);
                drop(id);
            }
        }
        self.reply_empty(r, reply);
    }

    pub(super) fn fsync(&self, h: &InHeader, arg: &abi::FsyncIn, reply: Reply<'_>) {
        let r = self.fs.fsync(
            self.ino(h.nodeid),
            arg.fsync_flags & abi::FSYNC_FDATASYNC != 0,
        );
        self.reply_empty(r, reply);
    }

    pub(super) fn fallocate(&self, h: &InHeader, arg: &abi::FallocateIn, reply: Reply<'_>) {
        let Some(reply) = self.writable(reply) else {
            return;
        };
        let r = self
            .fs
            .fallocate(self.ino(h.nodeid), arg.offset, arg.length, arg.mode as i32);
        self.reply_empty(r, reply);
    }

    pub(super) fn lseek(&self, h: &InHeader, arg: &abi::LseekIn, reply: Reply<'_>) {
        match self
            .fs
            .lseek(self.ino(h.nodeid), arg.offset, arg.whence as i32)
        {
            Ok(o) => reply.record(&abi::LseekOut { offset: o }),
            Err(e) => reply.error(e.errno()),
        }
    }

    pub(super) fn opendir(&self, reply: Reply<'_>) {
        // No format keeps anything per directory handle (listings resume
        // at cookies), so ENOSYS: the kernel stops sending OPENDIR and
        // RELEASEDIR, two round trips per directory read (`rm -rf` and
        // `find` of a tree open each directory at least once). It caches
        // listings then (FOPEN_CACHE_DIR is its default without opendir).
        // On a writable mount that stays coherent: every change of a
        // directory goes through this kernel, which bumps the directory's
        // version, and a listing starting over at offset 0 drops a cache
        // of an older version. (A listing already under way may still
        // return a name removed since its opendir, which POSIX allows.)
        reply.error(libc::ENOSYS)
    }

    pub(super) fn readdir(&self, h: &InHeader, arg: &abi::ReadIn, reply: Reply<'_>) {
        let dir = self.ino(h.nodeid);
        let key = next_listing::Key {
            node: h.nodeid,
            offset: arg.offset,
            size: arg.size,
        };
        if let Some(l) = &self.next_listings {
            if let Some(b) = l.take(key, NEXT_LISTING_WAIT) {
                self.requests.sent_next_listing();
                reply.parts(&[&b.bytes]);
                if let Some(next) = b.resumes_at {
                    self.build_next_listing(dir, key, next);
                }
                return;
            }
        }
        let next = DIRBUF.with(|b| {
            let mut b = b.borrow_mut();
            b.start(arg.size);
            match self.list_into(dir, arg.offset, &mut b) {
                Ok(()) => {
                    reply.parts(&[b.bytes()]);
                    b.resumes_at()
                }
                Err(e) => {
                    reply.error(e.errno());
                    None
                }
            }
        });
        if let Some(next) = next {
            self.build_next_listing(dir, key, next);
        }
    }

    /// Fills `b` with the plain listing of `dir` from `offset`.
    fn list_into(&self, dir: Ino, offset: u64, b: &mut DirBuf) -> vfs::Result<()> {
        // Cookies 1 and 2 follow "." and ".."; the file system's own
        // cookies are shifted up by 2 so they never collide with those. A
        // format that lists the dots where its kernel driver does keeps
        // cookies of its own.
        let dt_dir = dirent_type(libc::S_IFDIR);
        let mut off = offset;
        if !self.lists_dots && off == 0 {
            if !b.push(dir, 1, dt_dir, b".") {
                return Ok(());
            }
            off = 1;
        }
        if !self.lists_dots && off == 1 {
            let parent = self.dotdot(dir).map_or(dir, |a| a.ino);
            if !b.push(parent, 2, dt_dir, b"..") {
                return Ok(());
            }
            off = 2;
        }
        next_listing::list_from(&*self.fs, self.lists_dots, dir, off, b)
    }

    /// Has the reply to the READDIR that will follow `asked` built from
    /// `next` while the kernel and the reader work through this one (see
    /// `next_listing.rs`).
    fn build_next_listing(&self, dir: Ino, asked: next_listing::Key, next: u64) {
        // The dots the server lists itself are left to the request.
        if !self.lists_dots && next < 2 {
            return;
        }
        if let Some(l) = &self.next_listings {
            l.offer(
                dir,
                next_listing::Key {
                    offset: next,
                    ..asked
                },
            );
        }
    }

    pub(super) fn readdirplus(&self, h: &InHeader, arg: &abi::ReadIn, reply: Reply<'_>) {
        let dir = self.ino(h.nodeid);
        let ttl = self.cfg.ttl;
        let dt_dir = dirent_type(libc::S_IFDIR);
        let mut known = Vec::new();
        let mut subdirs = Vec::new();
        let mut every = false;
        DIRBUF.with(|b| {
            let mut b = b.borrow_mut();
            b.start(arg.size);
            let mut off = arg.offset;
            // The kernel links no inode for "." and "..": their attributes
            // only give d_ino, which is the file system's own number. A
            // format that lists them itself keeps cookies of its own; the
            // others' are shifted up by 2, past those of the dots listed
            // here first.
            let shift = if self.lists_dots { 0 } else { 2 };
            for (cookie, name) in [(1u64, &b"."[..]), (2, b"..")] {
                if self.lists_dots || off != cookie - 1 {
                    continue;
                }
                let a = if cookie == 1 {
                    self.fs.getattr(dir)
                } else {
                    self.dotdot(dir)
                };
                let a = match a {
                    Ok(a) => a,
                    Err(e) => return reply.error(e.errno()),
                };
                let entry = super::convert::entry_out(0, self.attr(a, a.ino), ttl);
                if !b.push_plus(&entry, a.ino, cookie, dt_dir, name) {
                    return reply.parts(&[b.bytes()]);
                }
                off = cookie;
            }
            // Lean entries (see `lean.rs`) take nothing from the format but
            // the listing itself: no inode read, and no inode read ahead.
            // Directories are full entries either way.
            let full = self.lean.full();
            every = full;
            let from = off - shift;
            self.fs.prefetch_dir(dir, from, full);
            let mut lean = false;
            let mut failed = None;
            let mut added = 0usize;
            let mut sink = |e: vfs::DirEntry<'_>| {
                let name = std::os::unix::ffi::OsStrExt::as_bytes(e.name);
                let dots = name == b"." || name == b"..";
                // The dots a format lists itself, as above, and the lean
                // entries: a name, d_ino and d_type, and no inode.
                if dots || (!full && e.kind != vfs::FileType::Directory) {
                    let entry = super::convert::entry_out(0, abi::Attr::default(), ttl);
                    let kind = dirent_type(e.kind.mode_bits());
                    let fits = b.push_plus(&entry, e.ino, e.next + shift, kind, name);
                    lean |= fits && !dots;
                    added += usize::from(fits);
                    return !fits;
                }
                // The kernel counts every entry of a readdirplus reply as a
                // lookup (and forgets it later), so the entry is looked up,
                // which a format that frees inodes counts too. A format that
                // never changes keeps no counts, and the listing already
                // names the inode: its attributes are all it takes, where a
                // lookup would search the directory for the name again (in
                // a large EROFS directory, a binary search over its blocks
                // per entry). A directory is still looked up: romfs learns
                // its parent so.
                let found = if self.immutable && e.kind != vfs::FileType::Directory {
                    self.fs.getattr(e.ino)
                } else {
                    self.fs.lookup(dir, e.name)
                };
                let a = match found {
                    Ok(a) => a,
                    // Gone since the listing was taken: leave it out.
                    Err(Error::NotFound) => return false,
                    Err(err) => {
                        failed = Some(err);
                        return true;
                    }
                };
                let entry = self.entry(a);
                let fits = b.push_plus(
                    &entry,
                    entry.attr.ino,
                    e.next + shift,
                    dirent_type(entry.attr.mode),
                    name,
                );
                if !fits {
                    // Not sent: the kernel will not forget it.
                    self.fs.forget(a.ino, 1);
                } else {
                    added += 1;
                    if self.pusher.is_some() {
                        known.push(a);
                    }
                    if a.kind == vfs::FileType::Directory && self.subdir_hints.is_some() {
                        subdirs.push(a.ino);
                    }
                }
                !fits
            };
            let r = if self.lists_dots {
                self.fs.readdir_with_dots(dir, from, &mut sink)
            } else {
                self.fs.readdir(dir, from, &mut sink)
            };
            // Before the reply: a stat of what it lists may come at once.
            if lean {
                self.lean.listed(dir);
            }
            match (r, failed) {
                (Err(e), _) | (Ok(()), Some(e)) => {
                    log::warn!("readdir of inode {dir}: {e}");
                    if added > 0 {
                        // The entries already added hold lookup references
                        // the kernel only returns if it receives them: send
                        // those; the next call resumes at the failing entry
                        // and reports.
                        reply.parts(&[b.bytes()])
                    } else {
                        reply.error(e.errno())
                    }
                }
                (Ok(()), None) => reply.parts(&[b.bytes()]),
            }
        });
        // The kernel makes an inode of every entry sent.
        for a in &known {
            self.known(a);
        }
        if let Some(hints) = &self.subdir_hints {
            for d in subdirs {
                hints.offer(d, every);
            }
        }
    }
}
