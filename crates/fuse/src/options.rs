//! Kernel-style `-o` mount options of the FUSE layer: comma separated,
//! `key` or `key=value`.
//!
//! [`MountOptions`] holds what FUSE and `mount(8)` make of a mount: the
//! mount's flags, who may use it, the attributes it reports, the server's
//! threads, polling and pushes, and the keys fstab lines carry that change
//! nothing here. The keys that change how an image is read belong to the
//! layer that reads it, and a format's own keys to the format; a command
//! that mounts offers each item to those first and what none takes to
//! [`MountOptions::set`], and refuses by name what nobody takes, as the
//! kernel's `fs_parse` refuses an unknown parameter.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use foliofs_vfs::options::{flag, required, size_value};

use crate::server::spin::MAX_SPIN_US;

// Sizes and ids are read by the rules every foliofs command shares, which
// live in `foliofs_vfs::options` so that users without FUSE reach them too.
pub use foliofs_vfs::options::{format_size, parse_size, OptionError};

/// Mount flags that map onto `MS_*` bits of `mount(2)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MountFlags {
    /// `MS_NOSUID`: set-user-ID and set-group-ID bits are not honoured.
    pub nosuid: bool,
    /// `MS_NODEV`: device nodes cannot be opened.
    pub nodev: bool,
    /// `MS_NOEXEC`: programs cannot be run from the mount.
    pub noexec: bool,
    /// `MS_NOATIME`: reads do not update access times.
    pub noatime: bool,
    /// `MS_SYNCHRONOUS`: writes are synchronous.
    pub sync: bool,
    /// `MS_DIRSYNC`: directory changes are synchronous.
    pub dirsync: bool,
}

impl Default for MountFlags {
    /// `nosuid,nodev`: an image from anywhere must not grant privileges.
    fn default() -> Self {
        MountFlags {
            nosuid: true,
            nodev: true,
            noexec: false,
            noatime: false,
            sync: false,
            dirsync: false,
        }
    }
}

/// The parsed generic options of one mount.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct MountOptions {
    /// `ro` (Some(true)) or `rw` (Some(false)) as given last; `None` when neither.
    pub read_only: Option<bool>,
    /// `allow_other`: users other than the mounting one may use the mount.
    pub allow_other: bool,
    /// Owner reported for every inode (`uid=`), overriding the image's.
    pub uid: Option<u32>,
    /// Group reported for every inode (`gid=`).
    pub gid: Option<u32>,
    /// Permission bits cleared from every inode (`umask=`, octal).
    pub umask: Option<u32>,
    /// Source shown in `/proc/mounts` (`fsname=`); the image path by default.
    pub fsname: Option<String>,
    /// Log every request (`debug`).
    pub debug: bool,
    /// Let the kernel cache writes and send them later (`writeback`). Faster
    /// for some workloads, but a write the file system then refuses (a full
    /// ramfs) fails at fsync or close instead of at write(2), and its data
    /// is gone: off unless asked for.
    pub writeback: bool,
    /// Server threads (`threads=N`); the mount command's default when `None`.
    pub threads: Option<usize>,
    /// How long a server thread keeps polling for the next request
    /// (`spin=MICROSECONDS`, `nospin` for zero); the mount command's
    /// default when `None`.
    pub spin: Option<Duration>,
    /// `nosuid`/`suid`, `nodev`/`dev`, `noexec`/`exec`, `noatime`/`atime`,
    /// `sync` and `dirsync`. `nosuid,nodev` unless `suid` or `dev` say
    /// otherwise: an image is untrusted data until root says it is not.
    pub flags: MountFlags,
    /// `auto_unmount`: the mount goes away when its server dies.
    pub auto_unmount: bool,
    /// `io_uring` / `noio_uring`: whether requests may come over FUSE's
    /// io_uring where the kernel offers it; `None` is the mount command's
    /// default, `/dev/fuse`.
    pub io_uring: Option<bool>,
    /// `supervise` / `nosupervise`: whether a supervisor holds the
    /// connection and starts a new server when one dies (see
    /// [`crate::supervise::held`]); the mount command's default when `None`.
    pub supervise: Option<bool>,
    /// `push=SIZE` / `nopush` (`Some(0)`): bytes an image mount may push
    /// into the kernel's page cache before they are read; the mount
    /// command's default when `None`.
    pub push: Option<u64>,
    /// `record=FILE`: write a start-up profile of this mount at unmount.
    pub record: Option<PathBuf>,
    /// `prefetch=FILE`: replay a start-up profile of the same image.
    /// (`prefetch=all` is the remote image's whole fetch: a command offers
    /// it to the block layer first.)
    pub prefetch: Option<PathBuf>,
}

/// Most server threads `threads=` accepts.
pub const MAX_THREADS: usize = 64;

/// Options `mount(8)` and `mount.fuse3` pass through that change nothing for
/// a FUSE image mount (or are consumed by the helper). Refusing them would
/// make fstab lines fail. So are `x-*` and `comment`, which are fstab's.
pub const IGNORED: &[&str] = &[
    "defaults",
    "_netdev",
    "nofail",
    "auto",
    "noauto",
    "user",
    "nouser",
    "users",
    "owner",
    "group",
    "async",
    "relatime",
    "norelatime",
    "strictatime",
    "nostrictatime",
    "diratime",
    "nodiratime",
    "lazytime",
    "nolazytime",
    "silent",
    "loud",
    "default_permissions",
];

/// Takes off the `dev` and `suid` that `mount.fuse3` appends to the
/// options it hands a file system: it adds `dev` unless they hold `nodev`,
/// then `suid` unless they hold `nosuid`, so this undoes exactly that and
/// keeps a `dev` or `suid` that fstab itself says.
pub fn strip_helper_defaults(options: &str) -> String {
    let mut items: Vec<&str> = options.split(',').collect();
    for (added, unless) in [("suid", "nosuid"), ("dev", "nodev")] {
        if !items.contains(&unless) && items.last() == Some(&added) {
            items.pop();
        }
    }
    items.join(",")
}

impl MountOptions {
    /// The `-o` keys this layer acts on. [`IGNORED`], `x-*` and `comment`
    /// are taken too, and change nothing.
    pub const KEYS: &'static [&'static str] = &[
        "ro",
        "rw",
        "allow_other",
        "uid",
        "gid",
        "umask",
        "fsname",
        "debug",
        "writeback",
        "nowriteback",
        "threads",
        "spin",
        "nospin",
        "suid",
        "nosuid",
        "dev",
        "nodev",
        "auto_unmount",
        "io_uring",
        "noio_uring",
        "supervise",
        "nosupervise",
        "push",
        "nopush",
        "record",
        "prefetch",
        "exec",
        "noexec",
        "atime",
        "noatime",
        "sync",
        "dirsync",
        "subtype",
    ];

    /// Whether [`MountOptions::set`] takes `key`: one of
    /// [`MountOptions::KEYS`], or one it accepts and ignores.
    pub fn is_key(key: &str) -> bool {
        Self::KEYS.contains(&key) || is_ignored(key)
    }

    /// Parses a comma-separated option string of this layer's keys alone;
    /// any other key is refused by name. An empty string gives the
    /// defaults; empty items (`a,,b`) are skipped, as the kernel does.
    pub fn parse(s: &str) -> Result<MountOptions, OptionError> {
        let mut o = MountOptions::default();
        for (key, value) in foliofs_vfs::options::items(s) {
            if !o.set(key, value)? {
                return Err(OptionError::unknown(key, value));
            }
        }
        Ok(o)
    }

    /// The options from `-o` items, `(key, value)` in the order given; a
    /// key that is not this layer's is refused by name, as is a bad value.
    pub fn from_mount_options(
        items: &[(String, Option<String>)],
    ) -> Result<MountOptions, OptionError> {
        let mut o = MountOptions::default();
        for (k, v) in items {
            if !o.set(k, v.as_deref())? {
                return Err(OptionError::unknown(k, v.as_deref()));
            }
        }
        Ok(o)
    }

    /// Applies one `-o` option: `Ok(true)` when this layer takes it (and
    /// it is valid), `Ok(false)` when it is not one of ours, an error
    /// naming the key when its value is malformed. Later options win.
    pub fn set(&mut self, key: &str, value: Option<&str>) -> Result<bool, OptionError> {
        match key {
            "ro" => {
                flag(key, value)?;
                self.read_only = Some(true);
            }
            "rw" => {
                flag(key, value)?;
                self.read_only = Some(false);
            }
            "allow_other" => {
                flag(key, value)?;
                self.allow_other = true;
            }
            "uid" => self.uid = Some(parse_id(key, required(key, value)?)?),
            "gid" => self.gid = Some(parse_id(key, required(key, value)?)?),
            "umask" => {
                let v = required(key, value)?;
                let m = foliofs_vfs::options::parse_mode(v)
                    .map_err(|e| OptionError::bad(key, format!("`{v}`: {e}")))?;
                self.umask = Some(m);
            }
            "fsname" => self.fsname = Some(required(key, value)?.to_owned()),
            "debug" => {
                flag(key, value)?;
                self.debug = true;
            }
            "writeback" => {
                flag(key, value)?;
                self.writeback = true;
            }
            "nowriteback" => {
                flag(key, value)?;
                self.writeback = false;
            }
            "threads" => {
                let v = required(key, value)?;
                let n = v
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=MAX_THREADS).contains(n))
                    .ok_or_else(|| {
                        OptionError::bad(
                            key,
                            format!("`{v}` is not a count from 1 to {MAX_THREADS}"),
                        )
                    })?;
                self.threads = Some(n);
            }
            "spin" => {
                let v = required(key, value)?;
                let us = v
                    .parse::<u64>()
                    .ok()
                    .filter(|n| *n <= MAX_SPIN_US)
                    .ok_or_else(|| {
                        OptionError::bad(
                            key,
                            format!(
                                "`{v}` is not a number of microseconds from 0 to {MAX_SPIN_US}"
                            ),
                        )
                    })?;
                self.spin = Some(Duration::from_micros(us));
            }
            "nospin" => {
                flag(key, value)?;
                self.spin = Some(Duration::ZERO);
            }
            // mount.fuse3 adds `dev,suid` where fstab says neither; the mount
            // command takes those off again (see `strip_helper_defaults`),
            // so what is left here was asked for.
            "suid" | "nosuid" => {
                flag(key, value)?;
                self.flags.nosuid = key == "nosuid";
            }
            "dev" | "nodev" => {
                flag(key, value)?;
                self.flags.nodev = key == "nodev";
            }
            "auto_unmount" => {
                flag(key, value)?;
                self.auto_unmount = true;
            }
            "io_uring" | "noio_uring" => {
                flag(key, value)?;
                self.io_uring = Some(key == "io_uring");
            }
            "supervise" | "nosupervise" => {
                flag(key, value)?;
                self.supervise = Some(key == "supervise");
            }
            "push" => {
                self.push = Some(size_value(key, required(key, value)?)?);
            }
            "nopush" => {
                flag(key, value)?;
                self.push = Some(0);
            }
            "record" => self.record = Some(PathBuf::from(required(key, value)?)),
            "prefetch" => self.prefetch = Some(PathBuf::from(required(key, value)?)),
            "exec" | "noexec" => {
                flag(key, value)?;
                self.flags.noexec = key == "noexec";
            }
            "atime" | "noatime" => {
                flag(key, value)?;
                self.flags.noatime = key == "noatime";
            }
            "sync" => {
                flag(key, value)?;
                self.flags.sync = true;
            }
            "dirsync" => {
                flag(key, value)?;
                self.flags.dirsync = true;
            }
            // mount.fuse3 names the subtype it was asked for; foliofs always
            // mounts as fuse.foliofs.
            "subtype" => {}
            k if is_ignored(k) => {}
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// Whether `key` is one fstab lines carry that changes nothing here.
fn is_ignored(key: &str) -> bool {
    IGNORED.contains(&key) || key.starts_with("x-") || key == "comment"
}

impl fmt::Display for MountFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        for (on, name) in [
            (self.nosuid, "nosuid"),
            (self.nodev, "nodev"),
            (self.noexec, "noexec"),
            (self.noatime, "noatime"),
            (self.sync, "sync"),
            (self.dirsync, "dirsync"),
        ] {
            if on {
                parts.push(name);
            }
        }
        f.write_str(&parts.join(","))
    }
}

fn parse_id(key: &str, v: &str) -> Result<u32, OptionError> {
    foliofs_vfs::options::parse_id(v).map_err(|e| OptionError::bad(key, format!("`{v}`: {e}")))
}

#[cfg(test)]
mod tests;
