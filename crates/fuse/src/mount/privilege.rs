//! What this process may do about mounts: whether it may call mount(2) for
//! FUSE itself, whether it is root of the whole machine, what
//! `/etc/fuse.conf` grants users, and which kernel it runs on.

use std::fs;

/// `CAP_SYS_ADMIN`'s bit in the capability sets.
const CAP_SYS_ADMIN: u32 = 21;

/// fuse3's configuration file (read by `fusermount3`).
pub const FUSE_CONF: &str = "/etc/fuse.conf";

/// Whether `CAP_SYS_ADMIN` is in this process's effective set. In the
/// initial user namespace that is root's power to mount; in a user
/// namespace of our own (`unshare -Urm`) it is the power to mount FUSE in
/// the mount namespaces that user namespace owns (Linux 4.18 and later).
pub fn has_cap_sys_admin() -> bool {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << CAP_SYS_ADMIN) != 0)
}

/// Whether this process lives in the initial user namespace, the one whose
/// identity map is the whole id range: there root is root of the machine,
/// and device nodes and set-user-ID programs mean what they say.
pub fn in_initial_user_namespace() -> bool {
    fs::read_to_string("/proc/self/uid_map").is_ok_and(|m| {
        let f: Vec<&str> = m.split_whitespace().collect();
        f == ["0", "0", "4294967295"]
    })
}

/// Whether this process is root of the machine: `CAP_SYS_ADMIN` in the
/// initial user namespace.
pub fn is_machine_root() -> bool {
    has_cap_sys_admin() && in_initial_user_namespace()
}

/// Whether `text` (a `fuse.conf`) has `user_allow_other` on a line of its
/// own, as `fusermount3` reads it: `#` starts a comment, blanks around it
/// do not count, and a last line without its newline is not read.
pub fn conf_allows_other(text: &str) -> bool {
    text.split_inclusive('\n')
        .filter(|l| l.ends_with('\n'))
        .any(|l| l.split('#').next().unwrap_or("").trim() == "user_allow_other")
}

/// Whether [`FUSE_CONF`] lets users mount with `allow_other`.
pub fn user_allow_other() -> bool {
    fs::read_to_string(FUSE_CONF).is_ok_and(|t| conf_allows_other(&t))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fuse_conf_lines() {
        assert!(conf_allows_other("user_allow_other\n"));
        assert!(conf_allows_other("# x\n  user_allow_other  # yes\n"));
        assert!(!conf_allows_other("#user_allow_other\n"));
        assert!(!conf_allows_other("user_allow_other=1\n"));
        assert!(!conf_allows_other("mount_max = 1000\n"));
        assert!(!conf_allows_other("user_allow_other"));
    }
}
