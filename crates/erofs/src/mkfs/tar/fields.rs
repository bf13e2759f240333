//! A header's own fields, and what a PAX header's records change in
//! them, as Go's `archive/tar` merges them: an empty record keeps the
//! header's field (but an empty xattr is an xattr), the last record of a
//! key wins, and keys that store nothing EROFS keeps are passed over.

use std::collections::BTreeMap;

use super::acl;
use super::header::{self, Format, BLOCK};
use super::pax::{self, Records};

/// What a PAX header gives beside the fields: xattrs by full name, and
/// ACL text by the xattr it becomes.
pub(super) type Extras = (BTreeMap<Vec<u8>, Vec<u8>>, Vec<(&'static [u8], Vec<u8>)>);

/// Applies a PAX header's records to the fields of the entry after it.
pub(super) fn apply_records(recs: &Records, h: &mut Fields) -> Result<Extras, String> {
    let mut xattrs = BTreeMap::new();
    let mut acls: Vec<(&'static [u8], Vec<u8>)> = Vec::new();
    for (k, v) in recs {
        if k.starts_with(b"SCHILY.xattr.")
            || k.starts_with(b"LIBARCHIVE.xattr.")
            || k.starts_with(b"SCHILY.acl.")
        {
            // Empty values are values too: an empty xattr exists.
        } else if v.is_empty() {
            // An empty record keeps the header's field, as in Go.
            continue;
        }
        let num = |what: &str| {
            pax::int(v).ok_or_else(|| {
                format!(
                    "PAX {what} {:?} is not a number",
                    String::from_utf8_lossy(v)
                )
            })
        };
        match k.as_slice() {
            b"path" => h.path = v.clone(),
            b"linkpath" => h.link = v.clone(),
            b"uid" => h.uid = num("uid")?,
            b"gid" => h.gid = num("gid")?,
            b"size" => {
                h.size =
                    u64::try_from(num("size")?).map_err(|_| "a negative PAX size".to_string())?;
            }
            b"mtime" => {
                (h.mtime, h.nsec) = pax::time(v).ok_or_else(|| {
                    format!("PAX mtime {:?} is not a time", String::from_utf8_lossy(v))
                })?;
            }
            b"SCHILY.acl.access" => acls.push((acl::ACCESS, v.clone())),
            b"SCHILY.acl.default" => acls.push((acl::DEFAULT, v.clone())),
            k => {
                if let Some(name) = k.strip_prefix(b"SCHILY.xattr.") {
                    xattrs.insert(name.to_vec(), v.clone());
                } else if let Some(name) = k.strip_prefix(b"LIBARCHIVE.xattr.") {
                    let name: Vec<u8> = percent_encoding::percent_decode(name).collect();
                    xattrs.insert(name, libarchive_value(v)?);
                }
                // Everything else stores nothing EROFS keeps:
                // atime and ctime (EROFS has one time), uname and
                // gname (ids are numeric, as in containerd),
                // hdrcharset (names are kept as bytes either way),
                // SCHILY.fflags (chattr flags, which EROFS has no
                // field for and an unpacked layer does not keep),
                // comments, and the GNU.sparse.* records, which the
                // reader takes for sparse files.
            }
        }
    }
    Ok((xattrs, acls))
}

/// A LIBARCHIVE.xattr value: base64, with or without padding.
fn libarchive_value(v: &[u8]) -> Result<Vec<u8>, String> {
    use base64::Engine;
    let trimmed = v
        .strip_suffix(b"==")
        .or_else(|| v.strip_suffix(b"="))
        .unwrap_or(v);
    base64::engine::general_purpose::STANDARD_NO_PAD
        .decode(trimmed)
        .map_err(|e| format!("LIBARCHIVE.xattr value: {e}"))
}

/// A header's own fields, before meta headers apply.
pub(super) struct Fields {
    pub(super) path: Vec<u8>,
    pub(super) link: Vec<u8>,
    pub(super) mode: i64,
    pub(super) uid: i64,
    pub(super) gid: i64,
    pub(super) size: u64,
    pub(super) mtime: i64,
    pub(super) nsec: u32,
    pub(super) major: i64,
    pub(super) minor: i64,
}

pub(super) fn parse_header(b: &[u8; BLOCK], fmt: Format) -> Result<Fields, String> {
    let num = |r: std::ops::Range<usize>, what: &str| {
        header::number(&b[r]).map_err(|w| format!("{what}: {w}"))
    };
    let size = num(header::SIZE, "size")?;
    let size = u64::try_from(size).map_err(|_| "a negative size".to_string())?;
    let mut f = Fields {
        path: header::string(&b[header::NAME]).to_vec(),
        link: header::string(&b[header::LINKNAME]).to_vec(),
        mode: num(header::MODE, "mode")?,
        uid: num(header::UID, "uid")?,
        gid: num(header::GID, "gid")?,
        size,
        mtime: num(header::MTIME, "mtime")?,
        nsec: 0,
        major: 0,
        minor: 0,
    };
    if fmt == Format::V7 {
        return Ok(f);
    }
    f.major = num(header::DEVMAJOR, "device major")?;
    f.minor = num(header::DEVMINOR, "device minor")?;
    let prefix: &[u8] = match fmt {
        Format::Ustar => header::string(&b[header::PREFIX]),
        Format::Star => header::string(&b[header::STAR_PREFIX]),
        Format::Gnu => {
            // GNU keeps times where USTAR keeps its prefix. Go before 1.8
            // wrote a prefix there in GNU headers; Go still reads such a
            // field as a prefix when it is not a pair of times, and so
            // does this.
            let times_ok = [header::GNU_ATIME, header::GNU_CTIME]
                .into_iter()
                .all(|r| b[r.start] == 0 || header::number(&b[r]).is_ok());
            let p = header::string(&b[header::PREFIX]);
            if times_ok || !p.is_ascii() {
                b""
            } else {
                p
            }
        }
        Format::V7 => b"",
    };
    if !prefix.is_empty() {
        f.path = [prefix, b"/", &f.path].concat();
    }
    Ok(f)
}
