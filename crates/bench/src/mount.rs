//! Mounting every kind of row: foliofs, the kernel's file systems (from a
//! file, a loop device or memory), squashfuse, or a directory as it is.

use std::ffi::CString;
use std::fs::{self};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use anyhow::{bail, Context, Result};

use crate::env::{detach, run, BenchEnv, LIVE, STOPPING};

/// The read-ahead of a user's first read-only foliofs mount, in KiB.
static USER_READ_AHEAD_KB: AtomicU32 = AtomicU32::new(0);

/// The read-ahead the kernel gave a user's read-only foliofs mount (root
/// raises it; a user cannot), once one was mounted.
pub fn user_read_ahead_kb() -> Option<u32> {
    match USER_READ_AHEAD_KB.load(Ordering::Relaxed) {
        0 => None,
        kb => Some(kb),
    }
}

/// The read-ahead of the mount at `dir`, from its bdi.
fn read_ahead_kb(dir: &Path) -> Option<u32> {
    let m = foliofs_fuse::find_mount(dir).ok()??;
    fs::read_to_string(format!(
        "/sys/class/bdi/{}:{}/read_ahead_kb",
        m.major, m.minor
    ))
    .ok()?
    .trim()
    .parse()
    .ok()
}

/// How a mount is made.
#[derive(Clone, Debug)]
pub enum How {
    /// `foliofs mount -t TYPE -o OPTS`.
    Foliofs { fstype: &'static str, opts: String },
    /// `foliofs mount oci:DIR:TAG` (or `docker://...`) with its store at
    /// `store`, by `who`.
    Image {
        store: PathBuf,
        who: crate::image::Who,
        /// Options of `mount` before the reference (`--tls-verify=false`).
        extra: Vec<String>,
    },
    /// The kernel, mount(2) with the image file itself as the source.
    KernelFile { fstype: &'static str, opts: String },
    /// The kernel, through a loop device.
    KernelLoop { fstype: &'static str },
    /// squashfuse.
    Squashfuse,
    /// The kernel's in-memory file systems (source "none").
    KernelMem { fstype: &'static str, opts: String },
    /// No mount: the source is a directory used as it is.
    Plain,
}

/// A live mount, unmounted on drop.
pub struct Mounted {
    pub dir: PathBuf,
    how: How,
    exe: PathBuf,
}

impl Mounted {
    pub fn new(env: &BenchEnv, how: &How, source: &Path, dir: &Path) -> Result<Mounted> {
        Self::with_env(env, how, source, dir, &[])
    }

    /// [`Mounted::new`], with `vars` added to a foliofs server's
    /// environment (a remote image's credentials).
    pub fn with_env(
        env: &BenchEnv,
        how: &How,
        source: &Path,
        dir: &Path,
        vars: &[(&str, &str)],
    ) -> Result<Mounted> {
        if let How::Plain = how {
            return Ok(Mounted {
                dir: source.to_owned(),
                how: how.clone(),
                exe: env.exe.clone(),
            });
        }
        fs::create_dir_all(dir)?;
        // Held while mounting: the Ctrl-C handler waits for this mount and
        // then finds it in the list.
        let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
        if STOPPING.load(Ordering::SeqCst) {
            bail!("interrupted");
        }
        match how {
            How::Foliofs { fstype, opts } => {
                let mut c = Command::new(&env.exe);
                c.envs(vars.iter().copied());
                c.args(["mount", "-t", fstype]);
                // With io_uring on for the run, a row that names no
                // transport is a /dev/fuse row.
                let named = opts
                    .split(',')
                    .any(|o| o == "io_uring" || o == "noio_uring");
                let opts = if env.uring && !named {
                    [opts.as_str(), "noio_uring"]
                        .iter()
                        .filter(|s| !s.is_empty())
                        .copied()
                        .collect::<Vec<_>>()
                        .join(",")
                } else {
                    opts.clone()
                };
                if !opts.is_empty() {
                    c.args(["-o", &opts]);
                }
                run(c.arg(source).arg(dir))?;
                if !env.root && *fstype != "ramfs" && user_read_ahead_kb().is_none() {
                    if let Some(kb) = read_ahead_kb(dir) {
                        USER_READ_AHEAD_KB.store(kb, Ordering::Relaxed);
                    }
                }
            }
            How::Image { store, who, extra } => {
                let mut c = who.command(&env.exe);
                c.env("FOLIOFS_STORE", store).arg("mount");
                if env.uring {
                    c.args(["-o", "noio_uring"]);
                }
                run(c.args(extra).arg(source).arg(dir))?;
            }
            How::KernelFile { fstype, opts } | How::KernelMem { fstype, opts } => {
                sys_mount(source, dir, fstype, opts)?
            }
            How::KernelLoop { fstype } => {
                run(Command::new("mount")
                    .args(["-t", fstype, "-o", "loop,ro"])
                    .arg(source)
                    .arg(dir))?;
            }
            How::Squashfuse => run(Command::new("squashfuse").arg(source).arg(dir))?,
            How::Plain => unreachable!("handled above"),
        }
        live.push(dir.to_owned());
        Ok(Mounted {
            dir: dir.to_owned(),
            how: how.clone(),
            exe: env.exe.clone(),
        })
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let How::Plain = self.how {
            return;
        }
        let ok = match self.how {
            How::Foliofs { .. } | How::Image { .. } => {
                run(Command::new(&self.exe).arg("umount").arg(&self.dir)).is_ok()
            }
            How::Squashfuse => run(Command::new("fusermount3").arg("-u").arg(&self.dir)).is_ok(),
            _ => run(Command::new("umount").arg(&self.dir)).is_ok(),
        };
        if !ok {
            let _ = run(&mut detach(&self.dir));
        }
        LIVE.lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|d| d != &self.dir);
    }
}

fn cstr(p: &[u8]) -> Result<CString> {
    CString::new(p).context("a path with a NUL byte")
}

/// mount(2) directly: util-linux would put a loop device under a regular file.
fn sys_mount(source: &Path, dir: &Path, fstype: &str, opts: &str) -> Result<()> {
    let src = cstr(source.as_os_str().as_bytes())?;
    let tgt = cstr(dir.as_os_str().as_bytes())?;
    let ty = cstr(fstype.as_bytes())?;
    let data = cstr(opts.as_bytes())?;
    let flags = if fstype == "erofs" || fstype == "squashfs" {
        libc::MS_RDONLY
    } else {
        0
    };
    // SAFETY: every pointer is a valid NUL-terminated string that outlives the call.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            tgt.as_ptr(),
            ty.as_ptr(),
            flags,
            data.as_ptr().cast(),
        )
    };
    if rc != 0 {
        bail!(
            "mount -t {fstype} -o {opts:?} {} {}: {}",
            source.display(),
            dir.display(),
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}
