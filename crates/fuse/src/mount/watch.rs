//! `auto_unmount`: a watcher process takes a mount down once its server is
//! gone, however it went (`SIGKILL` included), so no dead mount is left
//! answering "Transport endpoint is not connected".
//!
//! The server keeps the write end of a pipe (close-on-exec) for as long as
//! it lives; the watcher, a process of its own started by [`spawn`], holds
//! only the read end. End-of-file on it means the kernel closed every copy
//! of the write end: the server has exited. The watcher then detaches the
//! mount if the mount it was started for (by mount id) is still the topmost
//! at the mount point; one made there since, or stacked on top, is left
//! alone. It needs no help from the server, which is what a killed server
//! cannot give, and no probe of the mount: see `fusermount.rs` for why
//! fusermount3's own `auto_unmount` is not used.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use nix::mount::MntFlags;

use super::{fusermount, privilege};

/// Starts `cmd` (a program that calls [`wait_and_detach`] on the
/// descriptor whose number is appended to its arguments) as the watcher of
/// a mount. Returns the child and the pipe's write end, which the server
/// must keep open until it exits: closing it early is taken as the
/// server's death.
///
/// Call this before the process starts threads: the read end is open
/// without close-on-exec until the child has started.
pub fn spawn(mut cmd: Command) -> io::Result<(Child, OwnedFd)> {
    let (rd, wr) = std::io::pipe()?;
    // dup(2) leaves close-on-exec off: the copy is the one the child keeps.
    let inherited = nix::unistd::dup(&rd)?;
    drop(rd);
    let child = cmd
        .arg(inherited.as_raw_fd().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .current_dir("/")
        .spawn()?;
    drop(inherited);
    Ok((child, wr.into()))
}

/// Waits until every copy of the write end of `pipe` is closed, then
/// detaches mount `mount_id` if it is still the topmost at `mountpoint`.
/// Returns whether it detached it.
pub fn wait_and_detach(pipe: OwnedFd, mount_id: u64, mountpoint: &Path) -> io::Result<bool> {
    // Nothing is ever written: this returns at end-of-file, retrying
    // interrupted reads.
    io::copy(&mut File::from(pipe), &mut io::sink())?;
    match super::find_mount(mountpoint)? {
        Some(m) if m.mount_id == mount_id => {}
        _ => return Ok(false),
    }
    log::info!(
        "the server of {} is gone; detaching it",
        mountpoint.display()
    );
    if privilege::has_cap_sys_admin() {
        match nix::mount::umount2(mountpoint, MntFlags::MNT_DETACH) {
            Ok(()) => return Ok(true),
            Err(nix::errno::Errno::EPERM) if !privilege::in_initial_user_namespace() => {}
            Err(e) => return Err(e.into()),
        }
    }
    fusermount::unmount(mountpoint, true).map_err(io::Error::other)?;
    Ok(true)
}
