//! A connection held apart from the process that serves it, so that a
//! server can die and another take over its requests.
//!
//! A FUSE connection lives as long as one of its open files does. When a
//! server that holds the only ones dies, the kernel aborts the connection:
//! the requests it was working on fail, and every later access to the
//! mount is `ENOTCONN`. When the kernel closes one open file of several,
//! it ends the requests read on that one. So [`hold`] mounts and opens
//! every file the servers will read on (one per server thread), and its
//! caller keeps them all for the life of the mount without serving or
//! even opening the file system; a server gets duplicates of them
//! ([`Held::handoff`]) and takes them over with [`resume`]: the first
//! answers INIT, and reports what it agreed ([`Mounted::ready_report`]),
//! which the holder learns ([`Held::learn`]) and hands every later server.
//! When a server dies its files stay open in the holder,
//! the requests it had read stay in their queues, and
//! [`Held::resend`] (`FUSE_NOTIFY_RESEND`, Linux 6.9) puts them back in
//! the queue for the next server, marked as resent.
//!
//! Only a file system that keeps no state of its own between requests can
//! be served this way: a new server must answer for any node id the
//! kernel holds without having seen its LOOKUP. Image formats qualify
//! (their node ids are their own inode numbers, and they keep no file
//! handles); a ramfs does not (its files live in its server).
//!
//! Over io_uring a request a server has taken sits in its ring, which
//! `FUSE_NOTIFY_RESEND` does not reach (Linux 6.18 resends what the
//! `/dev/fuse` queues hold), so a held connection is served over
//! `/dev/fuse`.

use std::fmt::Write as _;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileTypeExt;
use std::path::PathBuf;
use std::sync::Arc;

use foliofs_vfs::FileSystem;

use crate::kernel::abi::init;
use crate::kernel::{conn, Agreed, Dev};
use crate::mount::{
    self, attach, Attached, MountConfig, MountError, MountInfo, MountMethod, Mounted,
};
use crate::server::Server;

/// A live mount whose INIT is answered and whose open files are held
/// here, served by other processes.
#[derive(Debug)]
pub struct Held {
    main: Dev,
    others: Vec<Dev>,
    /// What the first server agreed at INIT, once it said.
    agreed: Option<Agreed>,
    mountpoint: PathBuf,
    info: MountInfo,
    method: MountMethod,
}

/// Mounts a file system as `cfg` says and opens a file of the
/// connection for each of `cfg.threads` server threads. Nothing answers
/// it yet: the kernel's INIT and every request after it wait in its queue
/// until a server [`resume`]s the connection. (`cfg.server` is the
/// servers' business.)
pub fn hold(cfg: &MountConfig) -> Result<Held, MountError> {
    let Attached {
        fd,
        mountpoint,
        info,
        method,
    } = attach(cfg)?;
    let main = Dev::new(fd);
    let others = mount::clones(&main, cfg.threads).map_err(|e| {
        let _ = mount::detach(&mountpoint, method);
        MountError::Handshake(e)
    })?;
    Ok(Held {
        main,
        others,
        agreed: None,
        mountpoint,
        info,
        method,
    })
}

impl Held {
    /// The mount as `/proc/self/mountinfo` showed it when it was made.
    pub fn info(&self) -> &MountInfo {
        &self.info
    }

    /// Whether the kernel can resend what a dead server had read (it
    /// offered `FUSE_HAS_RESEND`, Linux 6.9), once a server answered INIT.
    /// Without, the requests a server dies with are never answered, and
    /// their callers hang.
    pub fn can_resend(&self) -> bool {
        self.agreed
            .is_some_and(|a| a.offered & init::HAS_RESEND != 0)
    }

    /// Takes in a server's ready report (see [`Mounted::ready_report`]):
    /// what the first one agreed at INIT is what every later one is
    /// handed. Returns what the report carries besides.
    pub fn learn<'r>(&mut self, report: &'r str) -> Result<&'r str, HandoffError> {
        let (agreed, rest) = parse_report(report)?;
        if self.agreed.is_none() {
            self.agreed = Some(agreed);
        }
        Ok(rest)
    }

    /// Puts the requests the servers read and did not answer back in the
    /// queue. Only once no server that read them is alive: a live one
    /// would answer them a second time, in vain.
    pub fn resend(&self) -> io::Result<()> {
        self.main.notify_resend()
    }

    /// Takes the mount out of the name space (lazily: open files stay
    /// served while servers run).
    pub fn detach(&self) -> io::Result<()> {
        mount::detach(&self.mountpoint, self.method)
    }

    /// Duplicates of the connection's open files for a new server, which
    /// inherits them (the duplicates are not close-on-exec: drop them once
    /// the server has started), and the description it takes them over
    /// by (see [`Handoff::parse`]).
    pub fn handoff(&self) -> io::Result<(Vec<OwnedFd>, String)> {
        let mut fds = Vec::with_capacity(1 + self.others.len());
        for d in std::iter::once(&self.main).chain(&self.others) {
            // dup(2) leaves the new descriptor without close-on-exec.
            fds.push(nix::unistd::dup(d.as_fd()).map_err(io::Error::from)?);
        }
        let numbers: Vec<String> = fds.iter().map(|f| f.as_raw_fd().to_string()).collect();
        let mut s = format!("fds={} ", numbers.join(","));
        if let Some(a) = &self.agreed {
            s.push_str(&describe_agreed(a));
            s.push(' ');
        }
        let _ = write!(
            s,
            "mount_id={} method={} mountpoint=",
            self.info.mount_id,
            match self.method {
                MountMethod::Syscall => "syscall",
                MountMethod::Fusermount => "fusermount",
            },
        );
        // Last, as it may hold spaces.
        s.push_str(&self.mountpoint.to_string_lossy());
        Ok((fds, s))
    }

    /// Gives the open files to this process's own server (where no other
    /// process can take over: see [`Held::can_resend`]).
    pub fn into_handoff(self) -> Handoff {
        Handoff {
            main: self.main.into_fd(),
            others: self.others.into_iter().map(Dev::into_fd).collect(),
            agreed: self.agreed,
            mount_id: self.info.mount_id,
            method: self.method,
            mountpoint: self.mountpoint,
        }
    }
}

/// A held connection as a new server receives it.
#[derive(Debug)]
pub struct Handoff {
    main: OwnedFd,
    others: Vec<OwnedFd>,
    /// `None` for the first server, which answers INIT.
    agreed: Option<Agreed>,
    mount_id: u64,
    method: MountMethod,
    mountpoint: PathBuf,
}

/// Why a description of a held connection cannot be taken over.
#[derive(Debug, thiserror::Error)]
#[error("the connection handed over is unusable: {0}")]
pub struct HandoffError(String);

impl Handoff {
    /// Takes over the open files a description from [`Held::handoff`]
    /// names. Each must be an open `/dev/fuse` in this process.
    ///
    /// Call this once, with the description this process was started
    /// with: the descriptors become this process's to close.
    pub fn parse(s: &str) -> Result<Handoff, HandoffError> {
        let bad = |m: String| HandoffError(m);
        let (head, mountpoint) = s
            .split_once(" mountpoint=")
            .ok_or_else(|| bad("no mountpoint".into()))?;
        let kv: std::collections::BTreeMap<&str, &str> =
            head.split(' ').filter_map(|w| w.split_once('=')).collect();
        let get = |k: &str| kv.get(k).copied().ok_or_else(|| bad(format!("no {k}")));
        let num = |k: &str| -> Result<u64, HandoffError> {
            let v = get(k)?;
            let n = match v.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => v.parse(),
            };
            n.map_err(|_| bad(format!("{k}={v} is not a number")))
        };
        let mut fds = Vec::new();
        for n in get("fds")?.split(',') {
            let fd: RawFd = n
                .parse()
                .map_err(|_| bad(format!("descriptor {n} is not a number")))?;
            fds.push(take_fuse_fd(fd).map_err(bad)?);
        }
        if fds.is_empty() {
            return Err(bad("no descriptors".into()));
        }
        let main = fds.remove(0);
        Ok(Handoff {
            main,
            others: fds,
            agreed: match kv.get("minor") {
                Some(_) => Some(Agreed {
                    minor: num("minor")? as u32,
                    flags: num("flags")?,
                    offered: num("offered")?,
                    max_write: num("max_write")? as u32,
                }),
                None => None,
            },
            mount_id: num("mount_id")?,
            method: match get("method")? {
                "syscall" => MountMethod::Syscall,
                "fusermount" => MountMethod::Fusermount,
                m => return Err(bad(format!("method {m}"))),
            },
            mountpoint: PathBuf::from(mountpoint),
        })
    }

    /// The mount's id.
    pub fn mount_id(&self) -> u64 {
        self.mount_id
    }
}

/// What INIT agreed, as a handoff or a ready report spells it.
fn describe_agreed(a: &Agreed) -> String {
    format!(
        "minor={} flags={:#x} offered={:#x} max_write={}",
        a.minor, a.flags, a.offered, a.max_write
    )
}

/// The ready report a server sends its holder: what INIT agreed, then
/// `extra` (anything the caller's own servers say of themselves, on the
/// same line).
fn ready_report(a: &Agreed, extra: &str) -> String {
    format!(
        "ready {}\t{}\n",
        describe_agreed(a),
        extra.replace(['\n', '\t'], " ")
    )
}

impl Mounted {
    /// The line a server under a holder reports ready with: what INIT
    /// agreed, then `extra` (see [`Held::learn`]).
    pub fn ready_report(&self, extra: &str) -> String {
        ready_report(self.agreed(), extra)
    }
}

fn parse_report(report: &str) -> Result<(Agreed, &str), HandoffError> {
    let bad = |m: &str| HandoffError(format!("{m} in the ready report {report:?}"));
    let body = report
        .trim_end_matches('\n')
        .strip_prefix("ready ")
        .ok_or_else(|| bad("no `ready`"))?;
    let (head, extra) = body.split_once('\t').unwrap_or((body, ""));
    let kv: std::collections::BTreeMap<&str, &str> =
        head.split(' ').filter_map(|w| w.split_once('=')).collect();
    let num = |k: &str| -> Result<u64, HandoffError> {
        let v = kv.get(k).ok_or_else(|| bad(k))?;
        match v.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16),
            None => v.parse(),
        }
        .map_err(|_| bad(k))
    };
    Ok((
        Agreed {
            minor: num("minor")? as u32,
            flags: num("flags")?,
            offered: num("offered")?,
            max_write: num("max_write")? as u32,
        },
        extra,
    ))
}

/// Owns descriptor `fd` of this process, which must be `/dev/fuse`.
fn take_fuse_fd(fd: RawFd) -> Result<OwnedFd, String> {
    if fd < 0 {
        return Err(format!("descriptor {fd}"));
    }
    // Checked before it is owned, so a wrong number closes nothing.
    let meta = std::fs::metadata(format!("/proc/self/fd/{fd}"))
        .map_err(|e| format!("descriptor {fd}: {e}"))?;
    let is_fuse = meta.file_type().is_char_device() && {
        use std::os::unix::fs::MetadataExt;
        let rdev = meta.rdev();
        nix::sys::stat::major(rdev) == 10 && nix::sys::stat::minor(rdev) == 229
    };
    if !is_fuse {
        return Err(format!("descriptor {fd} is not /dev/fuse"));
    }
    // SAFETY: the process that started this one left `fd` open for it to
    // take over, and `Handoff::parse` (called once, see its contract)
    // is the only code that names it: no other owner closes it.
    #[allow(unsafe_code)]
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Serves `fs` on a connection another server answered INIT on: this
/// server takes its state from what was agreed and reads on the open
/// files handed over, a thread each. Call [`Mounted::serve`] (or
/// [`Mounted::run`]) next.
pub fn resume(
    fs: Arc<dyn FileSystem>,
    cfg: &MountConfig,
    handoff: Handoff,
) -> Result<Mounted, MountError> {
    let server = Arc::new(Server::new(fs, cfg.server.clone()));
    let dev = Arc::new(Dev::new(handoff.main));
    let _ = server.dev_slot().set(dev.clone());
    let agreed = match handoff.agreed {
        Some(a) => {
            conn::resume(&*server, a);
            a
        }
        None => {
            let a = conn::handshake(&dev, &*server).map_err(MountError::Handshake)?;
            if a.flags & init::OVER_IO_URING != 0 {
                // Not asked for; a kernel that sent it anyway is not served.
                return Err(MountError::Handshake(io::Error::other(
                    "INIT took io_uring, which a held connection is not served over",
                )));
            }
            a
        }
    };
    mount::start_spin(cfg, &dev, &server);
    // After a lazy unmount the mount is gone from the table while its open
    // files are still served: the id is what is known for sure.
    let info = mount::mount_table()
        .ok()
        .and_then(|t| t.into_iter().find(|m| m.mount_id == handoff.mount_id))
        .unwrap_or_else(|| MountInfo {
            mount_id: handoff.mount_id,
            major: 0,
            minor: 0,
            mountpoint: handoff.mountpoint.clone(),
            fs_type: mount::FS_TYPE.to_owned(),
            source: String::new(),
            mount_options: String::new(),
            super_options: String::new(),
        });
    if handoff.agreed.is_none() {
        mount::tune_bdi(cfg, &info);
    }
    Ok(Mounted::from_parts(
        dev,
        handoff.others.into_iter().map(Dev::new).collect(),
        server,
        agreed,
        handoff.mountpoint,
        info,
        handoff.method,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_description_names_only_fuse_descriptors() {
        // Descriptor 0 is no /dev/fuse, a number past the table is none.
        let e = Handoff::parse("fds=0 minor=45 flags=0x1 offered=0x1 max_write=4096 mount_id=1 method=syscall mountpoint=/m").unwrap_err();
        assert!(e.to_string().contains("not /dev/fuse"), "{e}");
        let e = Handoff::parse("fds=999999 minor=45 flags=0x1 offered=0x1 max_write=4096 mount_id=1 method=syscall mountpoint=/m").unwrap_err();
        assert!(e.to_string().contains("999999"), "{e}");
        let e = Handoff::parse("fds=0 minor=45").unwrap_err();
        assert!(e.to_string().contains("mountpoint"), "{e}");
    }

    #[test]
    fn a_ready_report_carries_what_init_agreed() {
        let a = Agreed {
            minor: 44,
            flags: 0xc42001,
            offered: 1 << 39,
            max_write: 1 << 20,
        };
        let r = ready_report(&a, "erofs\tblocksize=4K,buffered\n");
        assert_eq!(r.matches('\n').count(), 1);
        let (b, extra) = parse_report(&r).unwrap();
        assert_eq!(b, a);
        assert_eq!(extra, "erofs blocksize=4K,buffered ");
        assert!(parse_report("readyish").is_err());
    }
}
