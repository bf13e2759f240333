//! Mounting and unmounting through the set-user-ID `fusermount3`, for a
//! process that may not call mount(2) for FUSE itself (a user without
//! `CAP_SYS_ADMIN` over its mount namespace).
//!
//! The protocol is fuse3's: one end of a Unix socket pair is handed to
//! `fusermount3` by number in `_FUSE_COMMFD`; it opens `/dev/fuse`, mounts,
//! and sends the descriptor back as `SCM_RIGHTS` with one byte of data.
//!
//! fusermount3's own `auto_unmount` is not used: before fuse 3.15 it probes
//! the mount as root, which a mount without `allow_other` refuses, so it
//! never unmounts; and it unmounts only where opening the root directory
//! fails, which on a read-only mount (whose `opendir` the kernel no longer
//! sends) succeeds even with the server dead. [`super::watch`] does that
//! job instead.

use std::ffi::OsString;
use std::io::{self, IoSliceMut, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use nix::sys::socket::{
    recvmsg, socketpair, AddressFamily, ControlMessageOwned, MsgFlags, SockFlag, SockType,
};

/// The program fuse3 installs set-user-ID root.
pub const PROGRAM: &str = "fusermount3";

/// The environment variable that carries the socket's descriptor number.
const COMMFD_ENV: &str = "_FUSE_COMMFD";

/// Where distributions put `fusermount3`, tried after `PATH` (mount(8)
/// runs helpers with a minimal `PATH`).
const DIRS: &[&str] = &["/usr/bin", "/bin", "/usr/local/bin"];

/// Why `fusermount3` could not be used.
#[derive(Debug, thiserror::Error)]
pub enum FusermountError {
    /// The program is not installed (or cannot be started).
    #[error("cannot run {PROGRAM} (Debian: apt-get install fuse3): {0}")]
    Spawn(#[source] io::Error),
    /// It ran and refused or failed; its own words, without its name.
    #[error("{0}")]
    Refused(String),
    /// The socket pair, or the exchange over it, failed.
    #[error("talking to {PROGRAM} failed: {0}")]
    Socket(#[source] io::Error),
}

/// The `fusermount3` to run: the first on `PATH`, else in the usual places.
fn program() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(DIRS.iter().map(PathBuf::from))
        .map(|d| d.join(PROGRAM))
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from(PROGRAM))
}

/// Escapes `,` and `\` as `fusermount3` reads an `fsname=` value.
pub fn escape_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        if c == ',' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Its stderr as one line, without the `fusermount3: ` prefix it puts on
/// every message.
fn message(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let lines: Vec<&str> = text
        .lines()
        .map(|l| {
            l.trim()
                .strip_prefix(PROGRAM)
                .and_then(|r| r.strip_prefix(": "))
                .unwrap_or(l.trim())
        })
        .filter(|l| !l.is_empty())
        .collect();
    lines.join("; ")
}

/// Mounts at `mountpoint` (absolute, canonical) with `fusermount3 -o opts`
/// and returns the new connection's `/dev/fuse` descriptor. `opts` are
/// `fusermount3`'s: mount flags, `fsname=`, `subtype=`, `allow_other`,
/// `default_permissions`.
///
/// Call this before the process starts threads: the descriptor handed to
/// `fusermount3` is open without close-on-exec until it has started.
pub fn mount(mountpoint: &Path, opts: &str) -> Result<OwnedFd, FusermountError> {
    let (ours, theirs) = socketpair(
        AddressFamily::Unix,
        SockType::Stream,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(|e| FusermountError::Socket(e.into()))?;
    // dup(2) leaves close-on-exec off: the copy is the one the child keeps.
    let inherited = nix::unistd::dup(&theirs).map_err(|e| FusermountError::Socket(e.into()))?;
    drop(theirs);
    let mut child = Command::new(program())
        .arg("-o")
        .arg(opts)
        .arg("--")
        .arg(mountpoint)
        .env(COMMFD_ENV, inherited.as_raw_fd().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .current_dir("/")
        .spawn()
        .map_err(FusermountError::Spawn)?;
    drop(inherited);

    let received = receive_fd(&ours);
    drop(ours);
    // It exits once it has sent the descriptor, or failed.
    let mut text = Vec::new();
    if let Some(mut s) = child.stderr.take() {
        let _ = s.read_to_end(&mut text);
    }
    let status = child.wait();
    let msg = message(&text);
    match received {
        Ok(Some(dev)) => {
            if !msg.is_empty() {
                log::warn!("{PROGRAM}: {msg}");
            }
            Ok(dev)
        }
        Ok(None) if msg.is_empty() => Err(FusermountError::Refused(match status {
            Ok(s) => format!("{PROGRAM} exited ({s}) without mounting"),
            Err(e) => format!("{PROGRAM} did not mount: {e}"),
        })),
        Ok(None) => Err(FusermountError::Refused(msg)),
        Err(e) => Err(FusermountError::Socket(io::Error::new(
            e.kind(),
            format!("{e}; {PROGRAM}: {msg}"),
        ))),
    }
}

/// Waits for the descriptor `fusermount3` sends; `None` when it closed the
/// socket without sending one (it failed, and said why on stderr).
fn receive_fd(sock: &OwnedFd) -> io::Result<Option<OwnedFd>> {
    let mut byte = [0u8; 1];
    let mut cmsg = nix::cmsg_space!(std::os::fd::RawFd);
    loop {
        let mut iov = [IoSliceMut::new(&mut byte)];
        let msg = match recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(m) => m,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        };
        if msg.bytes == 0 {
            return Ok(None);
        }
        let mut got = None;
        for c in msg.cmsgs().map_err(io::Error::from)? {
            if let ControlMessageOwned::ScmRights(fds) = c {
                for fd in fds {
                    // SAFETY: the kernel installed this descriptor in our
                    // table for this message (SCM_RIGHTS); nothing else
                    // refers to it, so taking ownership is sound. Any
                    // beyond the first are closed when dropped.
                    #[allow(unsafe_code)]
                    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
                    got.get_or_insert(owned);
                }
            }
        }
        return match got {
            Some(fd) => Ok(Some(fd)),
            None => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "a message without a descriptor",
            )),
        };
    }
}

/// `fusermount3 -u [-z] MOUNTPOINT`. It unmounts only a FUSE mount of the
/// calling user (its `user_id=`), or any as root.
pub fn unmount(mountpoint: &Path, lazy: bool) -> Result<(), FusermountError> {
    let mut args: Vec<OsString> = vec!["-u".into()];
    if lazy {
        args.push("-z".into());
    }
    args.push("--".into());
    args.push(mountpoint.into());
    let out = Command::new(program())
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .current_dir("/")
        .output()
        .map_err(FusermountError::Spawn)?;
    if out.status.success() {
        Ok(())
    } else {
        let msg = message(&out.stderr);
        Err(FusermountError::Refused(if msg.is_empty() {
            format!("{PROGRAM} -u exited ({})", out.status)
        } else {
            msg
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_escaped_for_fusermount() {
        assert_eq!(escape_value("/img/a,b\\c"), "/img/a\\,b\\\\c");
        assert_eq!(escape_value("plain"), "plain");
    }

    #[test]
    fn messages_lose_the_program_name() {
        assert_eq!(
            message(b"fusermount3: user has no write access to mountpoint /m\n"),
            "user has no write access to mountpoint /m"
        );
        assert_eq!(message(b"\n"), "");
        assert_eq!(message(b"fusermount3: a\nfusermount3: b\n"), "a; b");
    }
}
