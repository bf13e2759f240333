//! `foliofs push`: an OCI layout's image published to a registry as a
//! native EROFS image (erofs-image-spec) beside its tar image. The
//! layout's layers are built into the store as `mount oci:` builds them;
//! each layer image becomes an `application/vnd.erofs[+zstd]` blob with
//! its chunk index (and dm-verity tree) in a directory of the store's
//! that is removed at the end; the layout's tar blobs, config and
//! manifest are pushed unchanged; the index under the tag lists the tar
//! manifest first and the EROFS one after it.

use anyhow::Context;
use foliofs_oci::layout::Layer;
use foliofs_oci::publish::{self, LayerOptions};
use foliofs_oci::registry::{self, Client, Reference};
use foliofs_oci::{Layout, Platform};

/// Publish an OCI layout's image to a registry as native EROFS layers.
#[derive(clap::Args, Debug)]
pub struct PushArgs {
    #[command(flatten)]
    pub registry: crate::image::RegistryArgs,
    /// `application/vnd.erofs+zstd` layers (one zstd frame per chunk)
    /// rather than raw, kernel-mountable ones.
    #[arg(long)]
    pub zstd: bool,
    /// Append a dm-verity tree to each layer's image (its root digest and
    /// offset in the layer's annotations).
    #[arg(long = "dm-verity")]
    pub dm_verity: bool,
    /// The chunk size of each layer's chunk index: a multiple of 4K up
    /// to 64M.
    #[arg(long, value_name = "SIZE", default_value = "1M", value_parser = parse_chunk)]
    pub chunk_size: u64,
    /// The image: `oci:DIR[:TAG]` (an OCI layout of tar layers).
    pub source: String,
    /// Where to: `docker://HOST[:PORT]/REPO[:TAG]`.
    pub destination: String,
}

fn parse_chunk(s: &str) -> Result<u64, String> {
    let n = foliofs_vfs::options::parse_size(s).map_err(|e| e.to_string())?;
    if n == 0 || !n.is_multiple_of(4096) || n > publish::MAX_CHUNK {
        return Err(format!(
            "{s}: a multiple of 4K up to {}M",
            publish::MAX_CHUNK >> 20
        ));
    }
    Ok(n)
}

/// `foliofs push`: the index's digest on stdout, what was sent on stderr.
pub fn run(a: PushArgs) -> anyhow::Result<i32> {
    let Some((dir, tag)) = foliofs_oci::parse_reference(&a.source) else {
        anyhow::bail!("{}: not an oci:DIR[:TAG] reference", a.source);
    };
    let dest = match Reference::parse(&a.destination) {
        Some(r) => r?,
        None => anyhow::bail!(
            "{}: not a docker://HOST/REPO[:TAG] reference",
            a.destination
        ),
    };
    if dest.digest.is_some() {
        anyhow::bail!(
            "{}: push to a tag, not a digest (the index's digest is not known before)",
            a.destination
        );
    }
    let platform = match &a.registry.platform {
        Some(p) => Platform::parse(p)?,
        None => Platform::host(),
    };
    let layout = Layout::open(&dir)?;
    let image = layout.image_for(tag.as_deref(), &platform)?;
    let store = crate::image::store()?;
    let (layers, built) = store.layers(&layout, &image)?;
    // The format forbids overlayfs's markers in the bottom layer (nothing
    // is below it for them to hide): refused, not dropped, so that what
    // is published is what the layout holds.
    if let Some(bottom) = layers.first() {
        if let Some((path, what)) = foliofs_erofs::mkfs::first_overlay_marker(&bottom.path)? {
            anyhow::bail!(
                "{}: layer 1 (the bottom one) holds {what} at {path}, which the EROFS image layer format forbids in a bottom layer",
                a.source
            );
        }
    }
    let work = tempfile::Builder::new()
        .prefix(".push.")
        .tempdir_in(store.dir())
        .with_context(|| format!("a directory in the store {}", store.dir().display()))?;
    let options = LayerOptions {
        zstd: a.zstd,
        verity: a.dm_verity,
        chunk_size: a.chunk_size,
    };
    let blobs = layers
        .iter()
        .map(|l| publish::layer_blob(&l.path, work.path(), &options))
        .collect::<Result<Vec<_>, _>>()?;
    let published = publish::publish(&layout, &image, &blobs)?;

    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let client = Client::new(
        dest.clone(),
        &registry::Options {
            plain_http: !a.registry.tls_verify,
            auth_files: registry::auth::auth_files(&env),
        },
    )?;
    let mut sent = 0usize;
    let mut there = 0usize;
    let mut count = |uploaded: bool| {
        if uploaded {
            sent += 1;
        } else {
            there += 1;
        }
    };
    for l in &image.layers {
        count(client.push_blob(&tar_blob(&layout, l), &l.digest, l.size)?);
    }
    client.push_blob_bytes(&published.tar_config.bytes)?;
    for b in &blobs {
        count(client.push_blob(&b.path, &b.digest, b.size)?);
    }
    client.push_blob_bytes(&published.config.bytes)?;
    for m in [&published.tar_manifest, &published.manifest] {
        client.push_manifest(&m.digest.to_string(), &m.media_type, &m.bytes)?;
    }
    let index = client.push_manifest(
        &dest.manifest_ref(),
        &published.index.media_type,
        &published.index.bytes,
    )?;
    println!("{index}");
    eprintln!(
        "{}: index {index}: tar manifest {}, EROFS manifest {} ({} layers, {} built into the store now; {sent} blobs uploaded, {there} already there)",
        a.destination,
        published.tar_manifest.digest,
        published.manifest.digest,
        blobs.len(),
        built,
    );
    Ok(0)
}

/// A tar layer's blob file in the layout.
fn tar_blob(layout: &Layout, l: &Layer) -> std::path::PathBuf {
    layout.blob_path(&l.digest)
}
