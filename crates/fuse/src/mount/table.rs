//! The mount table as `/proc/self/mountinfo` shows it: how a mount is
//! found after `mount(2)` without a request to a server not yet running,
//! and how the commands find a mount of ours by its path or id.

use std::ffi::OsString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// One line of `/proc/self/mountinfo`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountInfo {
    /// The mount's unique id (field 1).
    pub mount_id: u64,
    /// Major number of the superblock's device (`st_dev`); with `minor` it
    /// names the bdi in `/sys/class/bdi/MAJOR:MINOR`.
    pub major: u32,
    /// Minor number of the superblock's device.
    pub minor: u32,
    /// Where it is mounted, with mountinfo's escapes decoded.
    pub mountpoint: PathBuf,
    /// The file-system type, `fuse.foliofs` for ours (see [`FS_TYPE`](super::FS_TYPE)).
    pub fs_type: String,
    /// The mount source (`fsname=` for a FUSE mount).
    pub source: String,
    /// Per-mount options (`rw,nosuid,nodev,...`).
    pub mount_options: String,
    /// Per-superblock options (`user_id=0,...`).
    pub super_options: String,
}

impl MountInfo {
    /// The user who mounted it, as a FUSE mount's `user_id=` says.
    pub fn user_id(&self) -> Option<u32> {
        self.super_options
            .split(',')
            .find_map(|o| o.strip_prefix("user_id="))
            .and_then(|v| v.parse().ok())
    }
}

/// Decodes mountinfo's `\ooo` escapes (space, tab, newline, backslash).
fn unescape(s: &str) -> OsString {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    OsString::from(std::ffi::OsStr::from_bytes(&out))
}

/// Every mount this process can see, from `/proc/self/mountinfo`.
pub fn mount_table() -> io::Result<Vec<MountInfo>> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(text.lines().filter_map(parse_mountinfo_line).collect())
}

fn parse_mountinfo_line(line: &str) -> Option<MountInfo> {
    let (left, right) = line.split_once(" - ")?;
    let l: Vec<&str> = left.split(' ').collect();
    let r: Vec<&str> = right.split(' ').collect();
    if l.len() < 6 || r.len() < 3 {
        return None;
    }
    let (major, minor) = l[2].split_once(':')?;
    Some(MountInfo {
        mount_id: l[0].parse().ok()?,
        major: major.parse().ok()?,
        minor: minor.parse().ok()?,
        mountpoint: PathBuf::from(unescape(l[4])),
        mount_options: l[5].to_owned(),
        fs_type: r[0].to_owned(),
        source: unescape(r[1]).to_string_lossy().into_owned(),
        super_options: r[2].to_owned(),
    })
}

/// The topmost mount at `path` (already canonical), if any.
pub fn find_mount(path: &Path) -> io::Result<Option<MountInfo>> {
    Ok(mount_table()?
        .into_iter()
        .rev()
        .find(|m| m.mountpoint == path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines() {
        let l = "36 35 0:57 / /mnt/a\\040b rw,nosuid,nodev,relatime shared:1 - fuse.foliofs /img/x\\040y.romfs ro,user_id=0,group_id=0";
        let m = parse_mountinfo_line(l).unwrap();
        assert_eq!(m.mount_id, 36);
        assert_eq!((m.major, m.minor), (0, 57));
        assert_eq!(m.mountpoint, PathBuf::from("/mnt/a b"));
        assert_eq!(m.fs_type, "fuse.foliofs");
        assert_eq!(m.source, "/img/x y.romfs");
        assert_eq!(m.mount_options, "rw,nosuid,nodev,relatime");
        assert_eq!(m.user_id(), Some(0));
        assert!(parse_mountinfo_line("garbage").is_none());
    }
}
