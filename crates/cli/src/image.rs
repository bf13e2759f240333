//! Container images as sources: `oci:DIR[:TAG]` (an OCI image layout)
//! turned into the store's layer images and merged image, for
//! `mkfs erofs --merge` and `mount`.

use std::path::{Path, PathBuf};

use anyhow::Context;
use foliofs_erofs::mkfs::MergeLayer;
use foliofs_oci::{Layout, Store};

/// The store this user's images go to.
pub fn store() -> anyhow::Result<Store> {
    let dir = store_dir().context(
        "no store for images: neither XDG_CACHE_HOME nor HOME is set (root's is /var/lib/foliofs/store)",
    )?;
    Ok(Store::open(&dir)?)
}

/// The environment variable that puts the store elsewhere.
pub const STORE_ENV: &str = "FOLIOFS_STORE";

/// Where this user's store is, if anywhere: `$FOLIOFS_STORE`, else
/// `/var/lib/foliofs/store` for root and `$XDG_CACHE_HOME/foliofs/store`
/// (or `~/.cache/foliofs/store`) for a user.
pub fn store_dir() -> Option<PathBuf> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    if let Some(d) = env(STORE_ENV) {
        return Some(PathBuf::from(d));
    }
    Store::default_dir(nix::unistd::geteuid().is_root(), &env)
}

/// The image an `oci:DIR[:TAG]` reference names, and its layout.
fn resolve(reference: &str) -> anyhow::Result<Option<(Layout, foliofs_oci::Image)>> {
    let Some((dir, tag)) = foliofs_oci::parse_reference(reference) else {
        return Ok(None);
    };
    let layout = Layout::open(&dir)?;
    let image = layout.image(tag.as_deref())?;
    Ok(Some((layout, image)))
}

/// The layers of the image `reference` names, built into the store where
/// missing; `None` when it is not an image reference.
pub fn layers(reference: &Path) -> anyhow::Result<Option<Vec<MergeLayer>>> {
    let Some(s) = reference.to_str() else {
        return Ok(None);
    };
    let Some((layout, image)) = resolve(s)? else {
        return Ok(None);
    };
    let (layers, _) = store()?.layers(&layout, &image)?;
    Ok(Some(layers))
}

/// The merged image in the store for the image `reference` names, built
/// where missing; `None` when it is not an image reference.
pub fn merged(reference: &Path) -> anyhow::Result<Option<PathBuf>> {
    let Some(s) = reference.to_str() else {
        return Ok(None);
    };
    let Some((layout, image)) = resolve(s)? else {
        return Ok(None);
    };
    let prepared = store()?.prepare(&layout, &image)?;
    crate::images::record(&store()?, s, &image, &prepared)?;
    log::info!(
        "{s}: {} ({} layers built, merged image {})",
        prepared.image.display(),
        prepared.layers_built,
        if prepared.merged_built {
            "built"
        } else {
            "in the store"
        }
    );
    Ok(Some(prepared.image))
}
