//! Finding overlayfs's markers in a layer image: a whiteout (a character
//! device 0:0, or a `.wh.` name where the layer was built without
//! `--aufs`) or an opaque directory (`trusted.overlay.opaque=y`, or one
//! holding `.wh..wh..opq`). A layer that nothing lies below (the bottom
//! one of an image) has nothing for them to hide, and the EROFS image
//! layer format forbids them there.

use std::collections::HashSet;
use std::path::Path;

use foliofs_block::OpenOptions;
use foliofs_vfs::FileType;

use super::merge::{entries, layer_error, shown, shown_child, AUFS_OPAQUE, AUFS_PREFIX, OPAQUE};
use super::BuildError;
use crate::Erofs;

/// The path of the first overlay marker in the image at `image`, and what
/// it is; `None` when it has none.
pub fn first_overlay_marker(image: &Path) -> Result<Option<(String, &'static str)>, BuildError> {
    let fs = Erofs::open(image, &OpenOptions::default(), &[])
        .map_err(|e| layer_error(image, "", format!("not an EROFS image: {e}")))?;
    let mut todo: Vec<(u64, Vec<Vec<u8>>)> = vec![(fs.superblock().root_nid, Vec::new())];
    // Each directory once: a damaged image that lists a directory in
    // itself would otherwise be walked for ever.
    let mut seen = HashSet::new();
    while let Some((nid, comps)) = todo.pop() {
        let here = shown(&comps);
        let bad = |e: foliofs_vfs::Error| layer_error(image, &here, e.to_string());
        if !seen.insert(nid) {
            return Err(layer_error(
                image,
                &here,
                format!("directory nid {nid} is listed twice (a loop in a damaged image)"),
            ));
        }
        let dir = fs.inode(nid).map_err(bad)?;
        for x in fs.xattrs(&dir).map_err(bad)? {
            if x.name.as_slice() == OPAQUE && fs.xattr_value(&x).map_err(bad)? == b"y" {
                return Ok(Some((here, "an opaque directory")));
            }
        }
        for (name, child) in entries(&fs, &dir).map_err(bad)? {
            let path = shown_child(&comps, &name);
            if name.as_slice() == AUFS_OPAQUE {
                return Ok(Some((path, "an opaque directory's marker")));
            }
            if name.starts_with(AUFS_PREFIX) {
                return Ok(Some((path, "a whiteout")));
            }
            let inode = fs
                .inode(child)
                .map_err(|e| layer_error(image, &path, e.to_string()))?;
            let rdev = inode.rdev();
            if inode.kind == FileType::CharDevice && rdev.major == 0 && rdev.minor == 0 {
                return Ok(Some((path, "a whiteout")));
            }
            if inode.kind == FileType::Directory {
                let mut c = comps.clone();
                c.push(name);
                todo.push((child, c));
            }
        }
    }
    Ok(None)
}
