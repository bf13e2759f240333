//! Which kernel is running: what the protocol may ask of it depends on
//! its release as much as on what INIT agrees (a few behaviours changed
//! without a flag).

/// Whether the running kernel's release is at least `major.minor`.
pub fn kernel_at_least(major: u32, minor: u32) -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    release_at_least(&release, major, minor)
}

/// Whether a release string ("6.18.44-fc", "5.15.0-91-generic") names
/// `major.minor` or later; an unreadable one does not.
fn release_at_least(release: &str, major: u32, minor: u32) -> bool {
    let mut parts = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let have = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    have >= (major, minor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_releases_compare_by_major_and_minor() {
        assert!(release_at_least("6.18.44-fc-v595\n", 6, 6));
        assert!(release_at_least("6.6.0", 6, 6));
        assert!(release_at_least("7.0-rc1", 6, 6));
        assert!(!release_at_least("6.5.13-1-pve", 6, 6));
        assert!(!release_at_least("5.15.0-91-generic", 6, 6));
        assert!(!release_at_least("", 6, 6));
    }
}
