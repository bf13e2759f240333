//! Container images as sources: `oci:DIR[:TAG]` (an OCI image layout) and
//! `docker://HOST/REPO[:TAG|@DIGEST]` (an image in a registry) turned
//! into the store's layer images and merged image, for `pull`,
//! `mkfs erofs --merge` and `mount`.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::Context;
use foliofs_erofs::mkfs::MergeLayer;
use foliofs_oci::layout::Layer;
use foliofs_oci::registry::{self, Client, Reference};
use foliofs_oci::{BlobSource, Image, Layout, OciError, Platform, Store};

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

/// How a `docker://` image is reached and chosen (ignored for `oci:`).
#[derive(clap::Args, Clone, Debug)]
pub struct RegistryArgs {
    /// With `false`, talk plain HTTP to a `docker://` image's registry
    /// (skopeo's spelling); HTTPS otherwise.
    #[arg(long = "tls-verify", value_name = "BOOL", default_value_t = true,
          num_args = 0..=1, default_missing_value = "true",
          action = clap::ArgAction::Set)]
    pub tls_verify: bool,
    /// Where the image is an index of images for several platforms, the
    /// one to take: OS/ARCH[/VARIANT] (this machine's by default).
    #[arg(long, value_name = "OS/ARCH[/VARIANT]")]
    pub platform: Option<String>,
}

impl Default for RegistryArgs {
    fn default() -> Self {
        RegistryArgs {
            tls_verify: true,
            platform: None,
        }
    }
}

/// An image and where its layers' blobs are read from.
struct Resolved {
    source: Box<dyn BlobSource>,
    image: Image,
}

/// The image `reference` names (`oci:` or `docker://`), its manifest and
/// config read; `None` when it is not an image reference.
fn resolve(reference: &str, args: &RegistryArgs) -> anyhow::Result<Option<Resolved>> {
    let platform = match &args.platform {
        Some(p) => Platform::parse(p)?,
        None => Platform::host(),
    };
    if let Some((dir, tag)) = foliofs_oci::parse_reference(reference) {
        let layout = Layout::open(&dir)?;
        let image = layout.image_for(tag.as_deref(), &platform)?;
        return Ok(Some(Resolved {
            source: Box::new(layout),
            image,
        }));
    }
    let Some(r) = Reference::parse(reference) else {
        return Ok(None);
    };
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let options = registry::Options {
        plain_http: !args.tls_verify,
        auth_files: registry::auth::auth_files(&env),
    };
    let client = Client::new(r?, &options)?;
    let image = client.image(&platform)?;
    Ok(Some(Resolved {
        source: Box::new(client),
        image,
    }))
}

/// The layers of the image `reference` names, built into the store where
/// missing; `None` when it is not an image reference.
pub fn layers(reference: &Path, args: &RegistryArgs) -> anyhow::Result<Option<Vec<MergeLayer>>> {
    let Some(s) = reference.to_str() else {
        return Ok(None);
    };
    let Some(r) = resolve(s, args)? else {
        return Ok(None);
    };
    let source = Progress::new(&*r.source, &r.image);
    let (layers, _) = store()?.layers(&source, &r.image)?;
    Ok(Some(layers))
}

/// The merged image in the store for the image `reference` names, built
/// where missing; `None` when it is not an image reference. A registry's
/// image with a native EROFS manifest whose layers carry chunk indexes is
/// read lazily ([`lazy`]); any other is pulled first.
pub fn merged(
    reference: &Path,
    args: &RegistryArgs,
    open: &foliofs_block::OpenOptions,
) -> anyhow::Result<Option<PathBuf>> {
    let Some(s) = reference.to_str() else {
        return Ok(None);
    };
    if let Some(p) = lazy(s, args, open)? {
        return Ok(Some(p));
    }
    let Some(r) = resolve(s, args)? else {
        return Ok(None);
    };
    let source = Progress::new(&*r.source, &r.image);
    let prepared = store()?.prepare(&source, &r.image)?;
    crate::images::record(&store()?, s, &r.image, &prepared)?;
    log::info!("{s}: {}", summary(&r.image, &prepared));
    Ok(Some(prepared.image))
}

/// The merged image of the native EROFS image `reference` names, its
/// layers read lazily from the registry through the disk cache; `None`
/// when it is not a `docker://` reference or names no native image whose
/// every layer has a chunk index. Its layers are opened as `open` says.
fn lazy(
    reference: &str,
    args: &RegistryArgs,
    open: &foliofs_block::OpenOptions,
) -> anyhow::Result<Option<PathBuf>> {
    let Some(r) = Reference::parse(reference) else {
        return Ok(None);
    };
    let r = r?;
    let platform = match &args.platform {
        Some(p) => Platform::parse(p)?,
        None => Platform::host(),
    };
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let options = registry::Options {
        plain_http: !args.tls_verify,
        auth_files: registry::auth::auth_files(&env),
    };
    let client = Client::new(r.clone(), &options)?;
    let Some(native) = client.native_image(&platform)? else {
        return Ok(None);
    };
    if let Some(i) = native.layers.iter().position(|l| l.index_range.is_none()) {
        log::info!(
            "{reference}: layer {} of its EROFS image has no chunk index: pulling its tar image rather than reading it lazily",
            i + 1
        );
        return Ok(None);
    }
    let sources: Vec<String> = native
        .layers
        .iter()
        .map(|l| registry::lazy::source(&r, options.plain_http, l))
        .collect();
    let (image, built) = store()?.prepare_lazy(&native.manifest, &sources, open)?;
    log::info!(
        "{reference}: {}, {} native EROFS layers read lazily, merged image {}",
        native.manifest,
        native.layers.len(),
        if built { "built" } else { "in the store" }
    );
    Ok(Some(image))
}

fn summary(image: &Image, p: &foliofs_oci::Prepared) -> String {
    format!(
        "{}, {} layers ({} built now), merged image {}",
        image.manifest,
        image.layers.len(),
        p.layers_built,
        if p.merged_built {
            "built"
        } else {
            "in the store"
        }
    )
}

/// Pull an image from a registry (or an OCI layout) into the store.
#[derive(clap::Args, Debug)]
pub struct PullArgs {
    #[command(flatten)]
    pub registry: RegistryArgs,
    /// `docker://HOST[:PORT]/REPO[:TAG]`, `docker://HOST/REPO@sha256:...`
    /// (or `oci:DIR[:TAG]`).
    pub reference: String,
}

/// `foliofs pull`: the image's layers and merged image into the store;
/// the merged image's path on stdout, what was done on stderr.
pub fn pull(a: PullArgs) -> anyhow::Result<i32> {
    let Some(r) = resolve(&a.reference, &a.registry)? else {
        anyhow::bail!(
            "{}: not an image reference (docker://HOST/REPO[:TAG] or oci:DIR[:TAG])",
            a.reference
        );
    };
    let source = Progress::new(&*r.source, &r.image);
    let prepared = store()?.prepare(&source, &r.image)?;
    crate::images::record(&store()?, &a.reference, &r.image, &prepared)?;
    println!("{}", prepared.image.display());
    eprintln!("{}: {}", a.reference, summary(&r.image, &prepared));
    Ok(0)
}

/// A blob source whose blobs fill a progress bar as they are read (drawn
/// on a terminal only).
struct Progress<'a> {
    inner: &'a dyn BlobSource,
    image: &'a Image,
    bar: indicatif::ProgressBar,
}

impl<'a> Progress<'a> {
    fn new(inner: &'a dyn BlobSource, image: &'a Image) -> Self {
        let bar = crate::progress::spinner("reading the image".into());
        Progress { inner, image, bar }
    }
}

impl BlobSource for Progress<'_> {
    fn open_blob(&self, layer: &Layer) -> Result<Box<dyn Read + '_>, OciError> {
        let blob = self.inner.open_blob(layer)?;
        crate::progress::show_bar(&self.bar, layer.size);
        self.bar.set_position(0);
        self.bar.set_message(format!(
            "layer {} of {} ({})",
            self.image
                .layers
                .iter()
                .position(|l| l.digest == layer.digest)
                .map_or(0, |i| i + 1),
            self.image.layers.len(),
            &layer.digest.to_string()[..19]
        ));
        Ok(Box::new(self.bar.wrap_read(blob)))
    }
}
