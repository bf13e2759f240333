//! Kernel-style `-o` mount options: comma separated, `key` or `key=value`.
//!
//! The generic options every foliofs mount understands are parsed here into
//! [`MountOptions`]. Keys this parser does not know are kept, in order, in
//! [`MountOptions::extra`] so a format (ramfs's `size=`, `mode=`, ...) can
//! claim them; whatever nobody claims is refused by name, as the kernel's
//! `fs_parse` refuses an unknown parameter.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use foliofs_block::remote::RemoteOptions;
use foliofs_block::{check_block_size, BlockSizeChoice, IoMode, OpenOptions};

use crate::spin::MAX_SPIN_US;

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
    /// `directio` / `nodirectio`.
    pub io_mode: IoMode,
    /// `largeblocks` / `blocksize=N`.
    pub block_size: BlockSizeChoice,
    /// Server threads (`threads=N`); the mount command's default when `None`.
    pub threads: Option<usize>,
    /// How long a server thread keeps polling for the next request
    /// (`spin=MICROSECONDS`, `nospin` for zero); the mount command's
    /// default when `None`.
    pub spin: Option<Duration>,
    /// Extra devices (`device=PATH`, repeatable), in order.
    pub devices: Vec<PathBuf>,
    /// How an image in object storage is fetched and cached (`chunk=`,
    /// `cache=`, `cache_size=`, `prefetch=all`, `endpoint=`, `region=`,
    /// `path_style`, `insecure_http`, `timeout=`; see
    /// [`MountOptions::REMOTE_KEYS`]).
    pub remote: RemoteOptions,
    /// `nosuid`/`suid`, `nodev`/`dev`, `noexec`/`exec`, `noatime`/`atime`,
    /// `sync` and `dirsync`. `nosuid,nodev` unless `suid` or `dev` say
    /// otherwise: an image is untrusted data until root says it is not.
    pub flags: MountFlags,
    /// `auto_unmount`: the mount goes away when its server dies.
    pub auto_unmount: bool,
    /// `io_uring` / `noio_uring`: whether requests may come over FUSE's
    /// io_uring where the kernel offers it; the mount command's default
    /// when `None`.
    pub io_uring: Option<bool>,
    /// `push=SIZE` / `nopush` (`Some(0)`): bytes an image mount may push
    /// into the kernel's page cache before they are read; the mount
    /// command's default when `None`.
    pub push: Option<u64>,
    /// `record=FILE`: write a start-up profile of this mount at unmount.
    pub record: Option<PathBuf>,
    /// `prefetch=FILE`: replay a start-up profile of the same image.
    pub prefetch: Option<PathBuf>,
    /// Options this parser does not know, `(key, value)`, in the order given.
    pub extra: Vec<(String, Option<String>)>,
    /// Every key given, in order, whichever field took it (also those left
    /// in `extra` and those passed over): a command that honours only some
    /// options refuses the rest by these.
    pub keys: Vec<String>,
}

/// Most server threads `threads=` accepts.
pub const MAX_THREADS: usize = 64;

/// Smallest and largest `chunk=`: below 64 KiB a ranged GET costs more in
/// its round trip than in its bytes; above 16 MiB a cold small read waits
/// for far more than it asked for.
pub const MIN_CHUNK: u32 = 64 << 10;
/// See [`MIN_CHUNK`].
pub const MAX_CHUNK: u32 = 16 << 20;
/// Longest `timeout=`, in seconds: an hour.
pub const MAX_TIMEOUT_SECS: u64 = 3600;

/// Options `mount(8)` and `mount.fuse3` pass through that change nothing for
/// a FUSE image mount (or are consumed by the helper). Refusing them would
/// make fstab lines fail.
const IGNORED: &[&str] = &[
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
    /// Parses a comma-separated option string. An empty string gives the
    /// defaults; empty items (`a,,b`) are skipped, as the kernel does.
    pub fn parse(s: &str) -> Result<MountOptions, OptionError> {
        MountOptions::parse_claiming(s, &|_| false)
    }

    /// Like [`MountOptions::parse`], but every key for which `claimed`
    /// returns true goes to [`MountOptions::extra`] untouched, for a format
    /// that gives it its own meaning (ramfs rounds `blocksize=` and owns
    /// `uid=`/`gid=` of its root).
    pub fn parse_claiming(
        s: &str,
        claimed: &dyn Fn(&str) -> bool,
    ) -> Result<MountOptions, OptionError> {
        let mut o = MountOptions::default();
        for item in s.split(',').filter(|i| !i.is_empty()) {
            let (key, value) = match item.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (item, None),
            };
            o.keys.push(key.to_owned());
            if claimed(key) {
                o.extra.push((key.to_owned(), value.map(ToOwned::to_owned)));
            } else {
                o.apply(key, value)?;
            }
        }
        Ok(o)
    }

    /// Parses several `-o` strings in order, as repeated `-o` flags are.
    pub fn parse_all<'a>(
        items: impl IntoIterator<Item = &'a str>,
    ) -> Result<MountOptions, OptionError> {
        let joined: Vec<&str> = items.into_iter().collect();
        MountOptions::parse(&joined.join(","))
    }

    fn apply(&mut self, key: &str, value: Option<&str>) -> Result<(), OptionError> {
        let flag = |v: Option<&str>| match v {
            None => Ok(()),
            Some(_) => Err(OptionError::bad(key, "takes no value")),
        };
        fn need<'v>(key: &str, v: Option<&'v str>) -> Result<&'v str, OptionError> {
            match v {
                Some(v) if !v.is_empty() => Ok(v),
                _ => Err(OptionError::bad(key, "needs a value")),
            }
        }
        match key {
            "ro" => {
                flag(value)?;
                self.read_only = Some(true);
            }
            "rw" => {
                flag(value)?;
                self.read_only = Some(false);
            }
            "allow_other" => {
                flag(value)?;
                self.allow_other = true;
            }
            "uid" => self.uid = Some(parse_id(key, need(key, value)?)?),
            "gid" => self.gid = Some(parse_id(key, need(key, value)?)?),
            "umask" => {
                let v = need(key, value)?;
                let m = foliofs_vfs::options::parse_mode(v)
                    .map_err(|e| OptionError::bad(key, format!("`{v}`: {e}")))?;
                self.umask = Some(m);
            }
            "fsname" => self.fsname = Some(need(key, value)?.to_owned()),
            "debug" => {
                flag(value)?;
                self.debug = true;
            }
            "writeback" => {
                flag(value)?;
                self.writeback = true;
            }
            "nowriteback" => {
                flag(value)?;
                self.writeback = false;
            }
            "directio" => {
                flag(value)?;
                self.io_mode = IoMode::Direct;
            }
            "nodirectio" => {
                flag(value)?;
                self.io_mode = IoMode::Buffered;
            }
            "largeblocks" => {
                flag(value)?;
                self.block_size = BlockSizeChoice::LargeBlocks;
            }
            "blocksize" => {
                let v = need(key, value)?;
                let n = parse_size(v).map_err(|e| OptionError::bad(key, format!("`{v}`: {e}")))?;
                let n = u32::try_from(n)
                    .ok()
                    .filter(|n| check_block_size(*n).is_ok())
                    .ok_or_else(|| {
                        OptionError::bad(key, format!("`{v}` is not a power of two from 1K to 2M"))
                    })?;
                self.block_size = BlockSizeChoice::Fixed(n);
            }
            "device" => self.devices.push(PathBuf::from(need(key, value)?)),
            "chunk" => {
                let v = need(key, value)?;
                let n = parse_size(v).map_err(|e| OptionError::bad(key, format!("`{v}`: {e}")))?;
                self.remote.chunk = u32::try_from(n)
                    .ok()
                    .filter(|n| n.is_power_of_two() && (MIN_CHUNK..=MAX_CHUNK).contains(n))
                    .ok_or_else(|| {
                        OptionError::bad(
                            key,
                            format!("`{v}` is not a power of two from 64K to 16M"),
                        )
                    })?;
            }
            "cache" => {
                let v = need(key, value)?;
                // The server runs from `/`, and fstab has no working
                // directory: a relative path would name another place.
                if !v.starts_with('/') {
                    return Err(OptionError::bad(
                        key,
                        format!("`{v}` is not an absolute path"),
                    ));
                }
                self.remote.cache_dir = Some(PathBuf::from(v));
            }
            "cache_size" => {
                let v = need(key, value)?;
                let n = parse_size(v).map_err(|e| OptionError::bad(key, format!("`{v}`: {e}")))?;
                if n == 0 {
                    return Err(OptionError::bad(
                        key,
                        "`0`: the cache must hold at least one chunk",
                    ));
                }
                self.remote.cache_size = Some(n);
            }
            "endpoint" => {
                let v = need(key, value)?;
                let scheme = v.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
                if !matches!(scheme.as_deref(), Some("https" | "http")) || v.ends_with("://") {
                    return Err(OptionError::bad(
                        key,
                        format!("`{v}` is not an https:// (or http://) URL"),
                    ));
                }
                self.remote.endpoint = Some(v.to_owned());
            }
            "region" => {
                let v = need(key, value)?;
                if !v
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                {
                    return Err(OptionError::bad(
                        key,
                        format!("`{v}` is not a region name (letters, digits and `-`)"),
                    ));
                }
                self.remote.region = Some(v.to_owned());
            }
            "path_style" => {
                flag(value)?;
                self.remote.path_style = true;
            }
            "insecure_http" => {
                flag(value)?;
                self.remote.insecure_http = true;
            }
            "timeout" => {
                let v = need(key, value)?;
                let secs = v
                    .parse::<u64>()
                    .ok()
                    .filter(|s| (1..=MAX_TIMEOUT_SECS).contains(s))
                    .ok_or_else(|| {
                        OptionError::bad(
                            key,
                            format!("`{v}` is not a whole number of seconds from 1 to {MAX_TIMEOUT_SECS}"),
                        )
                    })?;
                self.remote.timeout = Duration::from_secs(secs);
            }
            "threads" => {
                let v = need(key, value)?;
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
                let v = need(key, value)?;
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
                flag(value)?;
                self.spin = Some(Duration::ZERO);
            }
            // mount.fuse3 adds `dev,suid` where fstab says neither; the mount
            // command takes those off again (see `strip_helper_defaults`),
            // so what is left here was asked for.
            "suid" | "nosuid" => {
                flag(value)?;
                self.flags.nosuid = key == "nosuid";
            }
            "dev" | "nodev" => {
                flag(value)?;
                self.flags.nodev = key == "nodev";
            }
            "auto_unmount" => {
                flag(value)?;
                self.auto_unmount = true;
            }
            "io_uring" | "noio_uring" => {
                flag(value)?;
                self.io_uring = Some(key == "io_uring");
            }
            "push" => {
                let v = need(key, value)?;
                let n = parse_size(v).map_err(|e| OptionError::bad(key, format!("`{v}`: {e}")))?;
                self.push = Some(n);
            }
            "nopush" => {
                flag(value)?;
                self.push = Some(0);
            }
            "record" => self.record = Some(PathBuf::from(need(key, value)?)),
            // `all` fetches a remote image whole in the background; any
            // other value is a start-up profile to replay.
            "prefetch" => {
                let v = need(key, value)?;
                if v == "all" {
                    self.remote.prefetch_all = true;
                } else {
                    self.prefetch = Some(PathBuf::from(v));
                }
            }
            "exec" | "noexec" => {
                flag(value)?;
                self.flags.noexec = key == "noexec";
            }
            "atime" | "noatime" => {
                flag(value)?;
                self.flags.noatime = key == "noatime";
            }
            "sync" => {
                flag(value)?;
                self.flags.sync = true;
            }
            "dirsync" => {
                flag(value)?;
                self.flags.dirsync = true;
            }
            // mount.fuse3 names the subtype it was asked for; foliofs always
            // mounts as fuse.foliofs.
            "subtype" => {}
            k if IGNORED.contains(&k) || k.starts_with("x-") || k == "comment" => {}
            _ => self
                .extra
                .push((key.to_owned(), value.map(ToOwned::to_owned))),
        }
        Ok(())
    }

    /// Refuses any option left in [`MountOptions::extra`] (for formats
    /// that take no options of their own).
    pub fn refuse_extra(&self) -> Result<(), OptionError> {
        self.refuse_extra_except(&|_| false)
    }

    /// Refuses the first option left in [`MountOptions::extra`] for which
    /// `known` returns false: a caller that has its own answer for some
    /// keys (ramfs's, say) gives them that, and names no key as unknown
    /// that some foliofs command takes.
    pub fn refuse_extra_except(&self, known: &dyn Fn(&str) -> bool) -> Result<(), OptionError> {
        match self.extra.iter().find(|(k, _)| !known(k)) {
            Some((k, v)) => Err(OptionError::Unknown(match v {
                Some(v) => format!("{k}={v}"),
                None => k.clone(),
            })),
            None => Ok(()),
        }
    }

    /// The keys that change how an image is read: what
    /// [`MountOptions::open_options`] and [`MountOptions::devices`] are made
    /// of. Every other key changes only what a mount serves or how it is
    /// mounted, so a command that reads an image without mounting it refuses
    /// them rather than ignore them.
    pub const READING_KEYS: &'static [&'static str] = &[
        "directio",
        "nodirectio",
        "blocksize",
        "largeblocks",
        "device",
        "chunk",
        "cache",
        "cache_size",
        "prefetch",
        "endpoint",
        "region",
        "path_style",
        "insecure_http",
        "timeout",
    ];

    /// The keys that only mean something for an image in object storage
    /// (what [`MountOptions::remote`] is made of): a command that knows its
    /// source is a local file or a ramfs refuses them by name
    /// ([`MountOptions::remote_key`]).
    pub const REMOTE_KEYS: &'static [&'static str] = &[
        "chunk",
        "cache",
        "cache_size",
        "prefetch",
        "endpoint",
        "region",
        "path_style",
        "insecure_http",
        "timeout",
    ];

    /// The first key given that is one of [`MountOptions::REMOTE_KEYS`]
    /// (`prefetch` only as `prefetch=all`: with a file it names a start-up
    /// profile, which any image mount takes).
    pub fn remote_key(&self) -> Option<&str> {
        self.keys
            .iter()
            .map(String::as_str)
            .filter(|&k| k != "prefetch" || self.remote.prefetch_all)
            .find(|k| Self::REMOTE_KEYS.contains(k))
    }

    /// How to open an image's backing store under these options. This is
    /// the one place where `-o` options become [`OpenOptions`]: the mount
    /// command and the inspection commands both take them from here, so
    /// `directio`, `largeblocks`, `blocksize=` and the remote keys mean the
    /// same to both. (`device=` paths are [`MountOptions::devices`]; `uid=`, `gid=` and
    /// `umask=` change what the server reports, not how an image is read.)
    pub fn open_options(&self) -> OpenOptions {
        OpenOptions {
            block_size: self.block_size,
            io_mode: self.io_mode,
            remote: self.remote.clone(),
            ..OpenOptions::default()
        }
    }
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
mod tests {
    use super::*;

    #[test]
    fn defaults() {
        let o = MountOptions::parse("").unwrap();
        assert_eq!(o, MountOptions::default());
        assert!(o.flags.nosuid && o.flags.nodev);
        assert_eq!(o.io_mode, IoMode::Buffered);
        assert_eq!(o.block_size, BlockSizeChoice::Default);
    }

    #[test]
    fn generic_options() {
        let o = MountOptions::parse(
            "ro,allow_other,uid=1000,gid=100,umask=027,fsname=img,debug,directio,blocksize=64K,device=/a,device=/b,noexec",
        )
        .unwrap();
        assert_eq!(o.read_only, Some(true));
        assert!(o.allow_other && o.debug && o.flags.noexec);
        assert_eq!((o.uid, o.gid, o.umask), (Some(1000), Some(100), Some(0o27)));
        assert_eq!(o.fsname.as_deref(), Some("img"));
        assert_eq!(o.io_mode, IoMode::Direct);
        assert_eq!(o.block_size, BlockSizeChoice::Fixed(65536));
        assert_eq!(o.devices, vec![PathBuf::from("/a"), PathBuf::from("/b")]);
        assert!(o.extra.is_empty());
    }

    #[test]
    fn later_options_win() {
        let o =
            MountOptions::parse("directio,nodirectio,blocksize=2M,largeblocks,suid,dev").unwrap();
        assert_eq!(o.io_mode, IoMode::Buffered);
        assert_eq!(o.block_size, BlockSizeChoice::LargeBlocks);
        assert!(!o.flags.nosuid && !o.flags.nodev);
        let o = MountOptions::parse("suid,dev,nosuid,nodev").unwrap();
        assert!(o.flags.nosuid && o.flags.nodev);
        let o = MountOptions::parse_all(["largeblocks", "blocksize=1m"]).unwrap();
        assert_eq!(o.block_size, BlockSizeChoice::Fixed(1 << 20));
    }

    #[test]
    fn mount_fuse3_defaults_come_off() {
        for (given, meant) in [
            ("ro,dev,suid", "ro"),
            ("ro,nodev,suid", "ro,nodev"),
            ("ro,nosuid,dev", "ro,nosuid"),
            ("ro,nodev,nosuid", "ro,nodev,nosuid"),
            // fstab said `dev`; mount.fuse3 added both again.
            ("dev,dev,suid", "dev"),
            ("suid,dev,suid", "suid"),
            ("dev,suid", ""),
        ] {
            assert_eq!(strip_helper_defaults(given), meant, "{given}");
        }
    }

    #[test]
    fn push_and_profile_options() {
        let o = MountOptions::parse("push=64M,record=/tmp/p,prefetch=/tmp/q").unwrap();
        assert_eq!(o.push, Some(64 << 20));
        assert_eq!(o.record, Some(PathBuf::from("/tmp/p")));
        assert_eq!(o.prefetch, Some(PathBuf::from("/tmp/q")));
        assert_eq!(MountOptions::parse("push=1M,nopush").unwrap().push, Some(0));
        assert_eq!(MountOptions::parse("").unwrap().push, None);
        for s in ["push=", "push=x", "nopush=1", "record=", "prefetch="] {
            assert!(MountOptions::parse(s).is_err(), "{s}");
        }
        // `all` is the remote image's whole fetch, not a profile.
        let o = MountOptions::parse("prefetch=all").unwrap();
        assert!(o.remote.prefetch_all && o.prefetch.is_none());
        assert_eq!(o.remote_key(), Some("prefetch"));
        assert_eq!(
            MountOptions::parse("prefetch=/p").unwrap().remote_key(),
            None
        );
    }

    #[test]
    fn spin_is_microseconds_and_nospin_is_zero() {
        let spin = |s: &str| MountOptions::parse(s).unwrap().spin;
        assert_eq!(spin(""), None);
        assert_eq!(spin("spin=150"), Some(Duration::from_micros(150)));
        assert_eq!(spin("spin=0"), Some(Duration::ZERO));
        assert_eq!(spin("spin=10000"), Some(Duration::from_millis(10)));
        assert_eq!(spin("spin=40,nospin"), Some(Duration::ZERO));
    }

    #[test]
    fn auto_unmount_is_an_option() {
        assert!(MountOptions::parse("auto_unmount").unwrap().auto_unmount);
        assert!(!MountOptions::parse("").unwrap().auto_unmount);
    }

    #[test]
    fn passthrough_options_are_accepted() {
        let o = MountOptions::parse(
            "rw,dev,suid,exec,atime,noatime,defaults,_netdev,nofail,x-systemd.automount,subtype=foliofs,,default_permissions",
        )
        .unwrap();
        assert!(o.extra.is_empty());
        assert_eq!(o.read_only, Some(false));
    }

    #[test]
    fn unknown_keys_are_kept_then_refused() {
        let o = MountOptions::parse("size=1M,mode=0700,bogus").unwrap();
        assert_eq!(o.extra.len(), 3);
        assert_eq!(
            o.refuse_extra().unwrap_err().to_string(),
            "unknown mount option `size=1M`"
        );
    }

    #[test]
    fn malformed_values_name_the_option() {
        for (s, key) in [
            ("blocksize=3K", "blocksize"),
            ("blocksize=512", "blocksize"),
            ("blocksize=4M", "blocksize"),
            ("blocksize=", "blocksize"),
            ("blocksize=x", "blocksize"),
            ("uid=abc", "uid"),
            ("uid", "uid"),
            ("umask=9", "umask"),
            ("umask=10000", "umask"),
            ("umask=+22", "umask"),
            ("umask=", "umask"),
            ("ro=1", "ro"),
            ("largeblocks=yes", "largeblocks"),
            ("fsname=", "fsname"),
            ("threads=0", "threads"),
            ("threads=many", "threads"),
            ("spin=x", "spin"),
            ("spin=10001", "spin"),
            ("spin=-1", "spin"),
            ("spin=", "spin"),
            ("nospin=1", "nospin"),
        ] {
            let e = MountOptions::parse(s).unwrap_err();
            assert!(
                matches!(&e, OptionError::BadValue { key: k, .. } if k == key),
                "{s}: {e}"
            );
            assert!(e.to_string().contains(key));
        }
    }

    #[test]
    fn claimed_keys_are_left_to_the_format() {
        let o = MountOptions::parse_claiming("blocksize=12000,uid=5,ro,mode=700", &|k| {
            matches!(k, "blocksize" | "uid" | "mode")
        })
        .unwrap();
        assert_eq!(o.block_size, BlockSizeChoice::Default);
        assert_eq!(o.uid, None);
        assert_eq!(o.read_only, Some(true));
        assert_eq!(
            o.extra,
            vec![
                ("blocksize".to_owned(), Some("12000".to_owned())),
                ("uid".to_owned(), Some("5".to_owned())),
                ("mode".to_owned(), Some("700".to_owned())),
            ]
        );
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1024").unwrap(), 1024);
        assert_eq!(parse_size("1k").unwrap(), 1024);
        assert_eq!(parse_size("2M").unwrap(), 2 << 20);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert!(parse_size("K").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("99999999999999999999G").is_err());
        for n in [1024, 65536, 3 << 20, 1536, 1 << 30] {
            assert_eq!(parse_size(&format_size(n)).unwrap(), n);
        }
    }

    #[test]
    fn ids_refuse_minus_one_by_name() {
        let o = MountOptions::parse("uid=4294967294,gid=0").unwrap();
        assert_eq!((o.uid, o.gid), (Some(u32::MAX - 1), Some(0)));
        for s in ["uid=4294967295", "gid=4294967295", "uid=-1"] {
            let e = MountOptions::parse(s).unwrap_err().to_string();
            assert!(e.contains("no change"), "{s}: {e}");
        }
        for s in ["uid=4294967296", "gid=-5", "uid=+1", "gid=1k"] {
            let e = MountOptions::parse(s).unwrap_err().to_string();
            assert!(e.contains("not a numeric id"), "{s}: {e}");
        }
    }

    #[test]
    fn blocksize_errors_name_the_value_and_the_rule() {
        for (s, why) in [
            ("blocksize=16E", "too large"),
            ("blocksize=4Q", "suffix `Q`"),
            ("blocksize=0", "power of two"),
            ("blocksize=1T", "power of two"),
        ] {
            let e = MountOptions::parse(s).unwrap_err().to_string();
            assert!(e.contains(why) && e.contains("blocksize"), "{s}: {e}");
        }
    }

    #[test]
    fn keys_are_recorded_in_order_wherever_they_went() {
        let o =
            MountOptions::parse_claiming("ro,,size=1M,defaults,uid=5,x-a=b,directio,ro", &|k| {
                k == "size"
            })
            .unwrap();
        assert_eq!(
            o.keys,
            ["ro", "size", "defaults", "uid", "x-a", "directio", "ro"]
        );
        assert_eq!(MountOptions::parse("").unwrap().keys, Vec::<String>::new());
    }

    #[test]
    fn reading_keys_are_exactly_what_open_options_and_devices_hold() {
        let read = |o: &MountOptions| (o.open_options(), o.devices.clone());
        let default = read(&MountOptions::default());
        for s in [
            "directio",
            "blocksize=64K",
            "largeblocks",
            "device=/d",
            "chunk=4M",
            "cache=/c",
            "cache_size=1G",
            "prefetch=all",
            "endpoint=https://e",
            "region=r",
            "path_style",
            "insecure_http",
            "timeout=5",
        ] {
            let o = MountOptions::parse(s).unwrap();
            assert!(MountOptions::READING_KEYS.contains(&o.keys[0].as_str()));
            assert_ne!(read(&o), default, "{s}");
        }
        // `prefetch` reads differently only as `prefetch=all`: a start-up
        // profile changes nothing of how the image is read (the inspection
        // commands refuse it by its value).
        let o = MountOptions::parse("prefetch=/p").unwrap();
        assert_eq!(read(&o), default);
        // `nodirectio` is the default, but undoes an earlier `directio`.
        let o = MountOptions::parse("directio,nodirectio").unwrap();
        assert_eq!(read(&o), default);
        assert!(MountOptions::READING_KEYS.contains(&"nodirectio"));
        for s in [
            "ro",
            "rw",
            "allow_other",
            "uid=5",
            "gid=5",
            "umask=022",
            "fsname=x",
            "debug",
            "writeback",
            "nowriteback",
            "threads=2",
            "spin=50",
            "nospin",
            "push=1M",
            "nopush",
            "record=/p",
            "noexec",
            "noatime",
            "sync",
            "dirsync",
            "suid",
            "dev",
            "subtype=foliofs",
            "defaults",
        ] {
            let o = MountOptions::parse(s).unwrap();
            assert!(
                !MountOptions::READING_KEYS.contains(&o.keys[0].as_str()),
                "{s}"
            );
            assert_eq!(read(&o), default, "{s}");
        }
    }

    #[test]
    fn remote_options() {
        let o = MountOptions::parse(
            "chunk=4M,cache=/var/c,cache_size=2G,prefetch=all,endpoint=http://127.0.0.1:8333,region=eu-west-1,path_style,insecure_http,timeout=3",
        )
        .unwrap();
        let r = &o.remote;
        assert_eq!(r.chunk, 4 << 20);
        assert_eq!(r.cache_dir.as_deref(), Some(std::path::Path::new("/var/c")));
        assert_eq!(r.cache_size, Some(2 << 30));
        assert!(r.prefetch_all && r.path_style && r.insecure_http);
        assert_eq!(r.endpoint.as_deref(), Some("http://127.0.0.1:8333"));
        assert_eq!(r.region.as_deref(), Some("eu-west-1"));
        assert_eq!(r.timeout, Duration::from_secs(3));
        assert!(o.extra.is_empty());
        assert_eq!(o.open_options().remote, o.remote);
        assert_eq!(o.remote_key(), Some("chunk"));
        for key in MountOptions::REMOTE_KEYS {
            assert!(MountOptions::READING_KEYS.contains(key), "{key}");
        }
        // A URL's `=` and `:` stay in the value.
        let o = MountOptions::parse("endpoint=https://h:9000/p?a=b").unwrap();
        assert_eq!(o.remote.endpoint.as_deref(), Some("https://h:9000/p?a=b"));
        // The limits themselves are fine.
        for s in [
            "chunk=64K",
            "chunk=16M",
            "timeout=1",
            "timeout=3600",
            "cache_size=1",
        ] {
            MountOptions::parse(s).unwrap_or_else(|e| panic!("{s}: {e}"));
        }
        assert_eq!(MountOptions::parse("ro,uid=5").unwrap().remote_key(), None);
        assert_eq!(
            MountOptions::parse("ro,timeout=5,chunk=1M")
                .unwrap()
                .remote_key(),
            Some("timeout")
        );
    }

    #[test]
    fn remote_values_are_refused_by_name() {
        for (s, key, why) in [
            ("chunk=3M", "chunk", "power of two from 64K to 16M"),
            ("chunk=32K", "chunk", "power of two from 64K to 16M"),
            ("chunk=32M", "chunk", "power of two from 64K to 16M"),
            ("chunk=8G", "chunk", "power of two from 64K to 16M"),
            ("chunk=x", "chunk", "unknown size suffix"),
            ("chunk", "chunk", "needs a value"),
            ("cache=rel/dir", "cache", "not an absolute path"),
            ("cache=", "cache", "needs a value"),
            ("cache_size=0", "cache_size", "at least one chunk"),
            ("cache_size=1Q", "cache_size", "suffix"),
            ("prefetch", "prefetch", "needs a value"),
            ("endpoint=ftp://h", "endpoint", "not an https://"),
            ("endpoint=h:9000", "endpoint", "not an https://"),
            ("endpoint=https://", "endpoint", "not an https://"),
            ("region=eu/west", "region", "not a region name"),
            ("path_style=yes", "path_style", "takes no value"),
            ("insecure_http=1", "insecure_http", "takes no value"),
            ("timeout=0", "timeout", "from 1 to 3600"),
            ("timeout=3601", "timeout", "from 1 to 3600"),
            ("timeout=1.5", "timeout", "from 1 to 3600"),
            ("timeout=-1", "timeout", "from 1 to 3600"),
        ] {
            let e = MountOptions::parse(s).unwrap_err();
            assert!(
                matches!(&e, OptionError::BadValue { key: k, .. } if k == key),
                "{s}: {e}"
            );
            assert!(e.to_string().contains(why), "{s}: {e}");
        }
    }

    #[test]
    fn open_options_carry_the_io_mode_and_block_size() {
        let o = MountOptions::parse("directio,blocksize=64K,uid=5,device=/d").unwrap();
        let oo = o.open_options();
        assert_eq!(oo.io_mode, IoMode::Direct);
        assert_eq!(oo.block_size, BlockSizeChoice::Fixed(65536));
        assert_eq!(oo.cache_bytes, OpenOptions::default().cache_bytes);
        assert_eq!(
            MountOptions::parse("largeblocks").unwrap().open_options(),
            OpenOptions {
                block_size: BlockSizeChoice::LargeBlocks,
                ..OpenOptions::default()
            }
        );
        assert_eq!(
            MountOptions::default().open_options(),
            OpenOptions::default()
        );
    }
}
