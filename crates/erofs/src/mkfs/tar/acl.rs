//! POSIX ACLs from their text form, as GNU tar and bsdtar write them in
//! `SCHILY.acl.access` / `SCHILY.acl.default` (`user::rw-,user:1000:r--,
//! group::r--,mask::r--,other::r--`; bsdtar appends each named entry's id,
//! `user:alice:r--:1000`), to the kernel's binary
//! `system.posix_acl_access` / `system.posix_acl_default` values: a
//! version-2 header, then (tag, permissions, id) entries sorted as the
//! kernel checks them.

use std::collections::BTreeMap;

const VERSION: u32 = 2;
const USER_OBJ: u16 = 0x01;
const USER: u16 = 0x02;
const GROUP_OBJ: u16 = 0x04;
const GROUP: u16 = 0x08;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;
/// The id of entries that name no user or group.
const UNDEFINED_ID: u32 = u32::MAX;

/// The binary xattr value of an ACL's text. A named user or group is
/// taken by number: the text's own id (bsdtar's fourth field), a name
/// that is a number, or else the name looked up in `ids` (the build
/// host's `/etc/passwd` and `/etc/group`, as tar's own extraction looks
/// them up). An empty text is no ACL.
pub fn to_xattr(
    text: &[u8],
    ids: &dyn Fn(bool, &str) -> Option<u32>,
) -> Result<Option<Vec<u8>>, String> {
    let text =
        std::str::from_utf8(text).map_err(|_| "an ACL that is not UTF-8 text".to_string())?;
    let mut entries: BTreeMap<(u16, u32), u16> = BTreeMap::new();
    for raw in text.split([',', '\n']) {
        let e = raw.split('#').next().unwrap_or("").trim();
        if e.is_empty() {
            continue;
        }
        let e = e
            .strip_prefix("default:")
            .or_else(|| e.strip_prefix("d:"))
            .unwrap_or(e);
        let f: Vec<&str> = e.split(':').collect();
        if !(3..=4).contains(&f.len()) {
            return Err(format!("ACL entry {e:?}: expected TAG:QUALIFIER:PERMS"));
        }
        let perms =
            perms(f[2]).ok_or_else(|| format!("ACL entry {e:?}: permissions {:?}", f[2]))?;
        let named = !f[1].is_empty();
        let tag = match (f[0], named) {
            ("user" | "u", false) => USER_OBJ,
            ("user" | "u", true) => USER,
            ("group" | "g", false) => GROUP_OBJ,
            ("group" | "g", true) => GROUP,
            ("mask" | "m", _) => MASK,
            ("other" | "o", _) => OTHER,
            _ => return Err(format!("ACL entry {e:?}: unknown tag {:?}", f[0])),
        };
        let id = if tag == USER || tag == GROUP {
            let id = match f.get(3) {
                Some(n) => n.parse().ok(),
                None => f[1].parse().ok().or_else(|| ids(tag == USER, f[1])),
            };
            id.ok_or_else(|| {
                format!(
                    "ACL entry {e:?}: no {} named {:?} on this host, and no number given",
                    if tag == USER { "user" } else { "group" },
                    f[1]
                )
            })?
        } else {
            UNDEFINED_ID
        };
        if entries.insert((tag, id), perms).is_some() {
            return Err(format!("ACL entry {e:?} given twice"));
        }
    }
    if entries.is_empty() {
        return Ok(None);
    }
    let has = |t: u16| entries.keys().any(|k| k.0 == t);
    for (t, name) in [
        (USER_OBJ, "user::"),
        (GROUP_OBJ, "group::"),
        (OTHER, "other::"),
    ] {
        if !has(t) {
            return Err(format!("an ACL without its {name} entry"));
        }
    }
    if (has(USER) || has(GROUP)) && !has(MASK) {
        return Err("an ACL with named entries but no mask:: entry".into());
    }
    let mut out = VERSION.to_le_bytes().to_vec();
    for ((tag, id), perm) in entries {
        out.extend_from_slice(&tag.to_le_bytes());
        out.extend_from_slice(&perm.to_le_bytes());
        out.extend_from_slice(&id.to_le_bytes());
    }
    Ok(Some(out))
}

/// The access ACL's xattr name, and the default ACL's.
pub const ACCESS: &[u8] = b"system.posix_acl_access";
/// See [`ACCESS`].
pub const DEFAULT: &[u8] = b"system.posix_acl_default";

/// Checks a binary ACL as the kernel's `setxattr` does (version 2,
/// whole entries, sorted, each required entry once), so an image never
/// holds one the kernel would not have taken.
pub fn validate(v: &[u8]) -> Result<(), String> {
    if v.len() < 4 || !(v.len() - 4).is_multiple_of(8) {
        return Err(format!(
            "{} bytes: not a version header and whole entries",
            v.len()
        ));
    }
    if v[..4] != VERSION.to_le_bytes() {
        return Err("not version 2".into());
    }
    let mut last: Option<(u16, u32)> = None;
    let mut seen = 0u16;
    for e in v[4..].chunks_exact(8) {
        let tag = u16::from_le_bytes([e[0], e[1]]);
        let perm = u16::from_le_bytes([e[2], e[3]]);
        let id = u32::from_le_bytes([e[4], e[5], e[6], e[7]]);
        if ![USER_OBJ, USER, GROUP_OBJ, GROUP, MASK, OTHER].contains(&tag) || perm > 7 {
            return Err(format!(
                "an entry with tag {tag:#x} and permissions {perm:#o}"
            ));
        }
        let named = tag == USER || tag == GROUP;
        let key = (tag, if named { id } else { 0 });
        if last.is_some_and(|l| l >= key) || (!named && seen & tag != 0) {
            return Err("entries out of order or given twice".into());
        }
        seen |= tag;
        last = Some(key);
    }
    for (t, name) in [
        (USER_OBJ, "user::"),
        (GROUP_OBJ, "group::"),
        (OTHER, "other::"),
    ] {
        if seen & t == 0 {
            return Err(format!("no {name} entry"));
        }
    }
    if seen & (USER | GROUP) != 0 && seen & MASK == 0 {
        return Err("named entries but no mask:: entry".into());
    }
    Ok(())
}

/// The permission bits an access ACL gives a file (as setting it does):
/// the owner's, the mask's (else the owning group's), and others'.
pub fn mode_bits(v: &[u8]) -> u32 {
    let (mut u, mut g, mut m, mut o) = (0, 0, None, 0);
    for e in v[4..].chunks_exact(8) {
        let perm = u32::from(u16::from_le_bytes([e[2], e[3]]));
        match u16::from_le_bytes([e[0], e[1]]) {
            USER_OBJ => u = perm,
            GROUP_OBJ => g = perm,
            MASK => m = Some(perm),
            OTHER => o = perm,
            _ => {}
        }
    }
    u << 6 | m.unwrap_or(g) << 3 | o
}

/// Sets an access ACL's owner, mask (else owning group) and others
/// entries from `mode`, as `chmod` does to a file that has one.
pub fn chmod(v: &mut [u8], mode: u32) {
    let has_mask = v[4..]
        .chunks_exact(8)
        .any(|e| u16::from_le_bytes([e[0], e[1]]) == MASK);
    for e in v[4..].chunks_exact_mut(8) {
        let perm = match u16::from_le_bytes([e[0], e[1]]) {
            USER_OBJ => mode >> 6 & 7,
            GROUP_OBJ if !has_mask => mode >> 3 & 7,
            MASK => mode >> 3 & 7,
            OTHER => mode & 7,
            _ => continue,
        };
        e[2..4].copy_from_slice(&(perm as u16).to_le_bytes());
    }
}

/// `rwx` with `-` for a missing one, in any order (as `setfacl` takes
/// them), as the permission bits.
fn perms(s: &str) -> Option<u16> {
    let mut p = 0;
    for c in s.chars() {
        p |= match c {
            'r' => 4,
            'w' => 2,
            'x' => 1,
            '-' => 0,
            _ => return None,
        };
    }
    (!s.is_empty()).then_some(p)
}

/// Looks a user (`user` true) or group name up in the host's
/// `/etc/passwd` or `/etc/group`.
pub fn host_id(user: bool, name: &str) -> Option<u32> {
    let file = if user { "/etc/passwd" } else { "/etc/group" };
    let text = std::fs::read_to_string(file).ok()?;
    text.lines().find_map(|l| {
        let mut f = l.split(':');
        (f.next()? == name).then(|| f.nth(1)?.parse().ok())?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn none(_: bool, _: &str) -> Option<u32> {
        None
    }

    #[test]
    fn text_to_the_kernels_bytes() {
        let v = to_xattr(
            b"user::rw-,user:1234:r--,group::r-x,group:5678:rw-,mask::rwx,other::---",
            &none,
        )
        .unwrap()
        .unwrap();
        let mut want = 2u32.to_le_bytes().to_vec();
        for (t, p, id) in [
            (1u16, 6u16, u32::MAX),
            (2, 4, 1234),
            (4, 5, u32::MAX),
            (8, 6, 5678),
            (0x10, 7, u32::MAX),
            (0x20, 0, u32::MAX),
        ] {
            want.extend_from_slice(&t.to_le_bytes());
            want.extend_from_slice(&p.to_le_bytes());
            want.extend_from_slice(&id.to_le_bytes());
        }
        assert_eq!(v, want);
        // bsdtar's form: names with their ids, and newlines.
        let b = to_xattr(b"user::rw-\nuser:alice:r--:1234\ngroup::r-x\ngroup:staff:rw-:5678\nmask::rwx\nother::---\n", &none)
            .unwrap()
            .unwrap();
        assert_eq!(b, want);
        let named = |_: bool, n: &str| (n == "alice").then_some(1234);
        assert!(to_xattr(b"u::rw-,u:alice:r,g::r,m::r,o::r", &named)
            .unwrap()
            .is_some());
        assert_eq!(to_xattr(b"", &none).unwrap(), None);
    }

    #[test]
    fn binary_acls_checked_and_kept_with_the_mode() {
        let mut v = to_xattr(
            b"user::rw-,user:7:r--,group::r--,mask::rwx,other::r--",
            &none,
        )
        .unwrap()
        .unwrap();
        assert!(validate(&v).is_ok());
        assert_eq!(mode_bits(&v), 0o674);
        chmod(&mut v, 0o750);
        assert_eq!(mode_bits(&v), 0o750);
        // The named entry keeps its permissions; the owning group too.
        assert_eq!(&v[14..16], &4u16.to_le_bytes());
        let minimal = to_xattr(b"u::rwx,g::r-x,o::---", &none).unwrap().unwrap();
        assert_eq!(mode_bits(&minimal), 0o750);
        for bad in [&v[..11], &v[4..], &[2, 0, 0, 0][..]] {
            assert!(validate(bad).is_err());
        }
        let mut swapped = v.clone();
        swapped[4..12].swap_with_slice(&mut v.clone()[12..20]);
        assert!(validate(&swapped).is_err());
    }

    #[test]
    fn bad_acls() {
        for bad in [
            &b"user::rw-,user:bob:r--,group::r--,mask::r--,other::r--"[..],
            b"user::rw-,user:7:r--,group::r--,other::r--",
            b"user::rw-,other::r--",
            b"user::rwz,group::r--,other::r--",
            b"owner::rw-,group::r--,other::r--",
            b"user::rw-,user::r--,group::r--,other::r--",
        ] {
            assert!(
                to_xattr(bad, &none).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
