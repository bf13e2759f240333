//! Requests about names and attributes: lookups, attributes, the changes
//! to the name space, extended attributes, statfs and access.

use std::ffi::OsStr;

use foliofs_vfs::{self as vfs, Attr, Error, SetAttr};

use super::convert::{attr_out, ctx, entry_out, time_set, timespec};
use super::name_index::Indexed;
use super::Server;
use crate::kernel::abi::{self, fattr, InHeader};
use crate::kernel::Reply;

impl Server {
    pub(super) fn lookup(&self, h: &InHeader, name: &OsStr, reply: Reply<'_>) {
        let parent = self.ino(h.nodeid);
        self.lean.looked_up(parent);
        let found = if self.immutable {
            self.lookup_image(parent, name)
        } else {
            self.fs.lookup(parent, name)
        };
        match found {
            // A name that is not there stays cached as missing (node 0 with
            // a lifetime) like a found one: every way a name can appear goes
            // through this mount, and the kernel makes the entry positive
            // itself when it does. Saves a LOOKUP per repeated miss (stat
            // of a missing file, a create without O_EXCL after a check).
            Err(Error::NotFound) => {
                reply.record(&entry_out(0, abi::Attr::default(), self.cfg.ttl));
            }
            Ok(a) => {
                reply.record(&self.entry(a));
                if let Some(r) = &self.recorder {
                    r.lookup(a.ino);
                }
                self.known(&a);
            }
            Err(e) => reply.error(e.errno()),
        }
    }

    /// A lookup in an image, through the index of `parent` where it has
    /// one, and making one once it is looked up often (see `name_index.rs`).
    fn lookup_image(&self, parent: vfs::Ino, name: &OsStr) -> vfs::Result<vfs::Attr> {
        let bytes = std::os::unix::ffi::OsStrExt::as_bytes(name);
        if bytes == b"." || bytes == b".." {
            return self.fs.lookup(parent, name);
        }
        match self.name_index.indexed(parent, bytes) {
            Indexed::Found(ino) => return self.fs.getattr(ino),
            Indexed::Missing => return Err(Error::NotFound),
            Indexed::Unknown => {}
        }
        let found = self.fs.lookup(parent, name);
        if found.is_ok() && self.name_index.looked_up_in_format(parent) {
            self.index_dir(parent);
        }
        found
    }

    /// Lists `dir` whole into its index; a listing that fails leaves it
    /// without one.
    fn index_dir(&self, dir: vfs::Ino) {
        let mut names = Vec::new();
        let mut sink = |e: vfs::DirEntry<'_>| {
            let name = std::os::unix::ffi::OsStrExt::as_bytes(e.name);
            if name != b"." && name != b".." {
                names.push((Box::from(name), e.ino));
            }
            false
        };
        let listed = if self.lists_dots {
            self.fs.readdir_with_dots(dir, 0, &mut sink)
        } else {
            self.fs.readdir(dir, 0, &mut sink)
        };
        match listed {
            Ok(()) => self.name_index.index(dir, names),
            Err(e) => log::debug!("no index of directory {dir}: {e}"),
        }
    }

    pub(super) fn getattr(&self, h: &InHeader, reply: Reply<'_>) {
        match self.fs.getattr(self.ino(h.nodeid)) {
            Ok(a) => reply.record(&attr_out(self.attr(a, a.ino), self.cfg.ttl)),
            Err(e) => reply.error(e.errno()),
        }
    }

    pub(super) fn setattr(&self, h: &InHeader, arg: &abi::SetattrIn, reply: Reply<'_>) {
        let v = arg.valid;
        let has = |bit: u32| v & bit != 0;
        let Some(reply) = self.writable(reply) else {
            return;
        };
        let ino = self.ino(h.nodeid);
        let set = SetAttr {
            mode: has(fattr::MODE).then_some(arg.mode & 0o7777),
            uid: has(fattr::UID).then_some(arg.uid),
            gid: has(fattr::GID).then_some(arg.gid),
            size: has(fattr::SIZE).then_some(arg.size),
            atime: has(fattr::ATIME)
                .then(|| time_set(has(fattr::ATIME_NOW), arg.atime, arg.atimensec)),
            mtime: has(fattr::MTIME)
                .then(|| time_set(has(fattr::MTIME_NOW), arg.mtime, arg.mtimensec)),
            ctime: has(fattr::CTIME).then(|| timespec(arg.ctime, arg.ctimensec)),
            fh: has(fattr::FH).then_some(arg.fh),
        };
        // A truncate by a caller without CAP_FSETID, or any chown: the
        // kernel leaves dropping set-user-ID to the server
        // (HANDLE_KILLPRIV_V2). Before the change, so a chmod in the same
        // call still says the last word.
        if has(fattr::KILL_SUIDGID) && set.mode.is_none() {
            if let Err(e) = self.fs.kill_suid(ino) {
                return reply.error(e.errno());
            }
        }
        match self.fs.setattr(ino, &set, &ctx(h, 0)) {
            Ok(a) => reply.record(&attr_out(self.attr(a, a.ino), self.cfg.ttl)),
            Err(e) => reply.error(e.errno()),
        }
    }

    pub(super) fn readlink(&self, h: &InHeader, reply: Reply<'_>) {
        match self.fs.readlink(self.ino(h.nodeid)) {
            Ok(t) => reply.parts(&[&t]),
            Err(e) => reply.error(e.errno()),
        }
    }

    pub(super) fn mknod(&self, h: &InHeader, arg: &abi::MknodIn, name: &OsStr, reply: Reply<'_>) {
        let Some(reply) = self.writable(reply) else {
            return;
        };
        let Some(kind) = vfs::FileType::from_mode(arg.mode) else {
            return reply.error(libc::EINVAL);
        };
        let r = self.fs.mknod(
            self.ino(h.nodeid),
            name,
            kind,
            (arg.mode & 0o7777) as u16,
            arg.rdev,
            &ctx(h, arg.umask),
        );
        self.reply_entry(r, reply);
    }

    pub(super) fn mkdir(&self, h: &InHeader, arg: &abi::MkdirIn, name: &OsStr, reply: Reply<'_>) {
        let Some(reply) = self.writable(reply) else {
            return;
        };
        let r = self.fs.mkdir(
            self.ino(h.nodeid),
            name,
            (arg.mode & 0o7777) as u16,
            &ctx(h, arg.umask),
        );
        self.reply_entry(r, reply);
    }

    pub(super) fn unlink(&self, h: &InHeader, name: &OsStr, reply: Reply<'_>) {
        let Some(reply) = self.writable(reply) else {
            return;
        };
        let r = self.fs.unlink(self.ino(h.nodeid), name, &ctx(h, 0));
        self.reply_empty(r, reply);
    }

    pub(super) fn rmdir(&self, h: &InHeader, name: &OsStr, reply: Reply<'_>) {
        let Some(reply) = self.writable(reply) else {
            return;
        };
        let r = self.fs.rmdir(self.ino(h.nodeid), name, &ctx(h, 0));
        self.reply_empty(r, reply);
    }

    pub(super) fn symlink(&self, h: &InHeader, name: &OsStr, target: &[u8], reply: Reply<'_>) {
        let Some(reply) = self.writable(reply) else {
            return;
        };
        let r = self
            .fs
            .symlink(self.ino(h.nodeid), name, target, &ctx(h, 0));
        self.reply_entry(r, reply);
    }

    pub(super) fn rename(
        &self,
        h: &InHeader,
        newdir: u64,
        flags: u32,
        name: &OsStr,
        newname: &OsStr,
        reply: Reply<'_>,
    ) {
        let Some(reply) = self.writable(reply) else {
            return;
        };
        let r = self.fs.rename(
            self.ino(h.nodeid),
            name,
            self.ino(newdir),
            newname,
            flags,
            &ctx(h, 0),
        );
        self.reply_empty(r, reply);
    }

    pub(super) fn link(&self, h: &InHeader, old: u64, newname: &OsStr, reply: Reply<'_>) {
        let Some(reply) = self.writable(reply) else {
            return;
        };
        let r = self
            .fs
            .link(self.ino(old), self.ino(h.nodeid), newname, &ctx(h, 0));
        self.reply_entry(r, reply);
    }

    pub(super) fn statfs(&self, reply: Reply<'_>) {
        match self.fs.statfs() {
            Ok(s) => reply.record(&abi::Kstatfs {
                blocks: s.blocks,
                bfree: s.bfree,
                bavail: s.bavail,
                files: s.files,
                ffree: s.ffree,
                bsize: s.bsize,
                namelen: s.namelen,
                frsize: s.frsize,
                padding: 0,
                spare: [0; 6],
            }),
            Err(e) => reply.error(e.errno()),
        }
    }

    pub(super) fn setxattr(
        &self,
        h: &InHeader,
        arg: &abi::SetxattrIn,
        name: &OsStr,
        value: &[u8],
        reply: Reply<'_>,
    ) {
        let Some(reply) = self.writable(reply) else {
            return;
        };
        let r = self.fs.setxattr(
            self.ino(h.nodeid),
            name,
            value,
            arg.flags as i32,
            &ctx(h, 0),
        );
        self.reply_empty(r, reply);
    }

    pub(super) fn getxattr(&self, h: &InHeader, size: u32, name: &OsStr, reply: Reply<'_>) {
        let r = self.fs.getxattr(self.ino(h.nodeid), name);
        reply_xattr(r, size, reply);
    }

    pub(super) fn listxattr(&self, h: &InHeader, size: u32, reply: Reply<'_>) {
        let r = self.fs.listxattr(self.ino(h.nodeid)).map(|names| {
            let mut out = Vec::new();
            for n in names {
                out.extend_from_slice(&n);
                out.push(0);
            }
            out
        });
        reply_xattr(r, size, reply);
    }

    pub(super) fn removexattr(&self, h: &InHeader, name: &OsStr, reply: Reply<'_>) {
        let Some(reply) = self.writable(reply) else {
            return;
        };
        let r = self.fs.removexattr(self.ino(h.nodeid), name, &ctx(h, 0));
        self.reply_empty(r, reply);
    }

    /// Only reached without default_permissions; checks as the kernel's
    /// generic_permission would, on the attributes the kernel sees.
    pub(super) fn access(&self, h: &InHeader, mask: u32, reply: Reply<'_>) {
        let a = match self.fs.getattr(self.ino(h.nodeid)) {
            Ok(a) => a,
            Err(e) => return reply.error(e.errno()),
        };
        let a = self.attr(a, a.ino);
        let (r, w, x) = (libc::R_OK as u32, libc::W_OK as u32, libc::X_OK as u32);
        if mask & w != 0 && self.cfg.read_only {
            return reply.error(libc::EROFS);
        }
        if h.uid == 0 {
            let x_ok =
                mask & x == 0 || a.mode & libc::S_IFMT == libc::S_IFDIR || a.mode & 0o111 != 0;
            return if x_ok {
                reply.ok()
            } else {
                reply.error(libc::EACCES)
            };
        }
        let shift = if h.uid == a.uid {
            6
        } else if h.gid == a.gid {
            3
        } else {
            0
        };
        let have = (a.mode >> shift) & 7;
        let want = mask & (r | w | x);
        if have & want == want {
            reply.ok()
        } else {
            reply.error(libc::EACCES)
        }
    }

    /// The attributes of `dir`'s parent, for a ".." entry; a directory
    /// whose parent cannot be found stands for itself. The kernel takes no
    /// reference for "..": the lookup's is given back at once, or a writable
    /// file system could never free that directory.
    pub(super) fn dotdot(&self, dir: vfs::Ino) -> vfs::Result<Attr> {
        let parent = self.fs.lookup(dir, OsStr::new(".."));
        if let Ok(p) = &parent {
            self.fs.forget(p.ino, 1);
        }
        parent.or_else(|_| self.fs.getattr(dir))
    }
}

/// A GETXATTR or LISTXATTR reply: the size alone when asked with size 0,
/// `ERANGE` when the value does not fit.
fn reply_xattr(r: vfs::Result<Vec<u8>>, size: u32, reply: Reply<'_>) {
    match r {
        Ok(v) if size == 0 => reply.record(&abi::GetxattrOut {
            size: v.len() as u32,
            padding: 0,
        }),
        Ok(v) if v.len() <= size as usize => reply.parts(&[&v]),
        Ok(_) => reply.error(libc::ERANGE),
        Err(e) => reply.error(e.errno()),
    }
}
