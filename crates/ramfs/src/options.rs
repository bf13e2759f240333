//! Mount options of a ramfs: `blocksize=`, `huge=`, `passthrough`, `mode=`, `size=`,
//! `nr_inodes=`, `uid=`, `gid=`.

use std::fmt::Write as _;

use foliofs_vfs::options::OptionError;

/// The default allocation unit, the page size the kernel's ramfs uses.
pub const DEFAULT_BLOCK_SIZE: u32 = 4096;
/// Smallest block size `blocksize=` is clamped to.
pub const MIN_BLOCK_SIZE: u32 = 4096;
/// Largest block size `blocksize=` is clamped to (the largest folio the
/// kernel's page cache supports on x86-64).
pub const MAX_BLOCK_SIZE: u32 = 2 << 20;
/// The root directory's default permission bits.
pub const DEFAULT_MODE: u32 = 0o755;

/// A `size=` limit as the user wrote it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SizeLimit {
    /// An absolute number of bytes; 0 means no limit (as for tmpfs).
    Bytes(u64),
    /// A percentage of physical memory.
    Percent(u32),
}

/// Options of one ramfs mount.
///
/// The mount command feeds every `-o` option it does not know itself to
/// [`Options::set`]; what is left unset keeps the defaults (block size 4 KiB,
/// root mode 0755 owned by 0:0, half of RAM, half as many inodes as RAM has
/// pages).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// The allocation unit of file data, a power of two in
    /// [`MIN_BLOCK_SIZE`, `MAX_BLOCK_SIZE`].
    pub block_size: u32,
    /// Permission bits of the root directory (`0o7777` at most).
    pub mode: u32,
    /// Owner of the root directory.
    pub uid: u32,
    /// Group of the root directory.
    pub gid: u32,
    /// `size=`, if given.
    pub size: Option<SizeLimit>,
    /// `nr_inodes=`, if given; 0 means no limit.
    pub nr_inodes: Option<u64>,
    /// `huge=always`: each 2 MiB block is one transparent huge page.
    pub huge: bool,
    /// `passthrough` (`Some(true)`) or `nopassthrough`: whether file data
    /// lives in the kernel's page cache, read and written by the kernel
    /// itself (see [`RamFs::new_backed`](crate::RamFs::new_backed)); `None`
    /// leaves it to the mount (on where it is allowed).
    pub passthrough: Option<bool>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            block_size: DEFAULT_BLOCK_SIZE,
            mode: DEFAULT_MODE,
            uid: 0,
            gid: 0,
            size: None,
            nr_inodes: None,
            huge: false,
            passthrough: None,
        }
    }
}

/// A size by the rules of [`foliofs_vfs::options::parse_size`] (binary
/// K to E suffixes). ramfs has always let blanks surround its values.
fn parse_size(key: &str, value: &str) -> Result<u64, String> {
    foliofs_vfs::options::parse_size(value.trim()).map_err(|e| format!("{key}={value}: {e}"))
}

/// An id by the rules of [`foliofs_vfs::options::parse_id`]: `(uid_t)-1`
/// would give the root an owner the kernel reads as "no change".
fn parse_id(key: &str, value: &str) -> Result<u32, String> {
    foliofs_vfs::options::parse_id(value.trim()).map_err(|e| format!("{key}={value}: {e}"))
}

/// Physical memory in bytes, as `sysinfo(2)` reports it.
pub fn total_ram() -> u64 {
    let mut info = std::mem::MaybeUninit::<libc::sysinfo>::zeroed();
    // SAFETY: sysinfo only writes into the struct we pass, which is valid and
    // zero-initialised; we read it only after a successful return.
    let rc = unsafe { libc::sysinfo(info.as_mut_ptr()) };
    if rc != 0 {
        // Without the figure, fall back to a limit that still bounds memory.
        return 1 << 30;
    }
    // SAFETY: sysinfo returned 0, so it filled the struct.
    let info = unsafe { info.assume_init() };
    info.totalram
        .saturating_mul(u64::from(info.mem_unit.max(1)))
}

impl Options {
    /// The `-o` keys a ramfs mount owns. A mount hands these to ramfs before
    /// the generic option layer reads them (ramfs rounds `blocksize=` where
    /// an image refuses odd sizes, and `uid=`/`gid=` own its root rather
    /// than override every inode's owner).
    pub const KEYS: &'static [&'static str] = &[
        "blocksize",
        "mode",
        "uid",
        "gid",
        "size",
        "nr_inodes",
        "huge",
        "passthrough",
        "nopassthrough",
    ];

    /// Whether `key` is a ramfs option: the one answer for every command
    /// that mounts a ramfs.
    pub fn is_key(key: &str) -> bool {
        Options::KEYS.contains(&key)
    }

    /// The options of a ramfs mount from its `-o` items, `(key, value)` in
    /// the order given (what the generic layer left for the format). A key
    /// that is not ramfs's is refused by name, as is a bad value; then
    /// [`Options::check`] decides whether the whole can be had here.
    pub fn from_mount_options(items: &[(String, Option<String>)]) -> Result<Options, OptionError> {
        let mut o = Options::default();
        for (k, v) in items {
            match o.set(k, v.as_deref()) {
                Ok(true) => {}
                Ok(false) => {
                    return Err(OptionError::Unknown(match v {
                        Some(v) => format!("{k}={v}"),
                        None => k.clone(),
                    }))
                }
                Err(why) => return Err(OptionError::bad(k, why)),
            }
        }
        o.check().map_err(OptionError::Conflict)?;
        Ok(o)
    }

    /// Applies one `-o` option. Returns `Ok(true)` when the key is a ramfs
    /// option (and was valid), `Ok(false)` when it is not one of ours, and an
    /// error naming the option when its value is malformed or refused.
    pub fn set(&mut self, key: &str, value: Option<&str>) -> Result<bool, String> {
        if !Options::is_key(key) {
            return Ok(false);
        }
        let need = || value.ok_or_else(|| format!("{key}: needs a value ({key}=...)"));
        let flag = || match value {
            None => Ok(()),
            Some(_) => Err(format!("{key}: takes no value")),
        };
        match key {
            "passthrough" | "nopassthrough" => {
                flag()?;
                self.passthrough = Some(key == "passthrough");
            }
            "blocksize" => {
                let v = need()?;
                let n = parse_size(key, v)?;
                if n == 0 {
                    return Err("blocksize=0: the block size must not be zero".into());
                }
                // Round down to a power of two, then clamp, as the kernel does.
                let pow = 1u64 << (63 - n.leading_zeros());
                let clamped = pow.clamp(u64::from(MIN_BLOCK_SIZE), u64::from(MAX_BLOCK_SIZE));
                self.block_size = clamped as u32;
            }
            "mode" => {
                let v = need()?;
                self.mode = foliofs_vfs::options::parse_mode(v.trim())
                    .map_err(|e| format!("{key}={v}: {e}"))?;
            }
            "uid" => self.uid = parse_id(key, need()?)?,
            "gid" => self.gid = parse_id(key, need()?)?,
            "size" => {
                let v = need()?.trim();
                if let Some(p) = v.strip_suffix('%') {
                    let p: u32 = p
                        .parse()
                        .map_err(|_| format!("size={v}: expected N% with a whole number N"))?;
                    if p == 0 || p > 100 {
                        return Err(format!("size={v}: the percentage must be 1..100"));
                    }
                    self.size = Some(SizeLimit::Percent(p));
                } else {
                    self.size = Some(SizeLimit::Bytes(parse_size(key, v)?));
                }
            }
            "nr_inodes" => self.nr_inodes = Some(parse_size(key, need()?)?),
            "huge" => {
                self.huge = match need()?.trim() {
                    "always" => true,
                    "never" => false,
                    v => return Err(format!("huge={v}: expected always or never")),
                }
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// Checks what no single option can: `huge=always` needs blocks the size
    /// of a huge page on this machine, and huge pages that are not disabled.
    pub fn check(&self) -> Result<(), String> {
        if !self.huge {
            return Ok(());
        }
        let thp = std::path::Path::new("/sys/kernel/mm/transparent_hugepage");
        let pmd = std::fs::read_to_string(thp.join("hpage_pmd_size"))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok());
        let huge_size = pmd.unwrap_or(u64::from(MAX_BLOCK_SIZE));
        if u64::from(self.block_size) != huge_size {
            return Err(format!(
                "huge=always needs blocksize={}K, the size of a huge page here; this mount's blocks are {}K",
                huge_size >> 10,
                self.block_size >> 10
            ));
        }
        // The per-size setting (Linux 6.8 on) decides unless it defers to
        // the global one.
        let per_size = thp.join(format!("hugepages-{}kB/enabled", huge_size >> 10));
        let setting = match std::fs::read_to_string(&per_size) {
            Ok(s) if !s.contains("[inherit]") => Ok((s, per_size)),
            _ => std::fs::read_to_string(thp.join("enabled")).map(|s| (s, thp.join("enabled"))),
        };
        match setting {
            Ok((s, path)) if s.contains("[never]") => Err(format!(
                "huge=always: transparent huge pages are disabled here ({})",
                path.display()
            )),
            Ok(_) => Ok(()),
            Err(e) => Err(format!(
                "huge=always: this kernel has no transparent huge pages ({e})"
            )),
        }
    }

    /// The options that differ from the defaults, comma separated, in the
    /// form the kernel's `show_options` prints (without the leading comma);
    /// empty when everything is at its default.
    pub fn show(&self) -> String {
        let mut s = String::new();
        let mut push = |part: std::fmt::Arguments<'_>| {
            if !s.is_empty() {
                s.push(',');
            }
            let _ = s.write_fmt(part);
        };
        if self.mode != DEFAULT_MODE {
            push(format_args!("mode={:o}", self.mode));
        }
        if self.uid != 0 {
            push(format_args!("uid={}", self.uid));
        }
        if self.gid != 0 {
            push(format_args!("gid={}", self.gid));
        }
        match self.size {
            Some(SizeLimit::Bytes(b)) => push(format_args!("size={b}")),
            Some(SizeLimit::Percent(p)) => push(format_args!("size={p}%")),
            None => {}
        }
        if let Some(n) = self.nr_inodes {
            push(format_args!("nr_inodes={n}"));
        }
        if self.block_size != DEFAULT_BLOCK_SIZE {
            push(format_args!("blocksize={}", self.block_size));
        }
        if self.huge {
            push(format_args!("huge=always"));
        }
        s
    }

    /// The byte limit these options give on a machine with `ram` bytes of
    /// memory; `None` means unlimited (`size=0`).
    pub fn size_limit(&self, ram: u64) -> Option<u64> {
        match self.size {
            None => Some(ram / 2),
            Some(SizeLimit::Bytes(0)) => None,
            Some(SizeLimit::Bytes(b)) => Some(b),
            Some(SizeLimit::Percent(p)) => Some(ram / 100 * u64::from(p)),
        }
    }

    /// The inode limit these options give on a machine with `ram` bytes of
    /// memory; `None` means unlimited (`nr_inodes=0`).
    pub fn inode_limit(&self, ram: u64) -> Option<u64> {
        match self.nr_inodes {
            None => Some((ram / 4096 / 2).max(1024)),
            Some(0) => None,
            Some(n) => Some(n),
        }
    }
}

#[cfg(test)]
mod tests;
