//! Opening an image of any supported format: detection by magic, then the
//! format's reader behind `dyn FileSystem`.
//!
//! Each format is one variant of [`Format`] and [`Image`]; the inspection
//! commands match on [`Image`] for what only a format can say (`info`,
//! `fsck`) and use [`Image::fs`] for everything else.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};
use foliofs_block::remote::is_remote;
use foliofs_block::{BlockSizeChoice, ImageOptions, IoMode, OpenOptions, Store};
use foliofs_erofs::Erofs;
use foliofs_romfs::RomFs;
use foliofs_vfs::options::OptionError;
use foliofs_vfs::FileSystem;

use crate::options::{MountOpts, READING_KEYS};

/// Bytes read from the start of a file to recognise its format: enough for
/// every magic below (EROFS sits at 1024).
const PROBE_LEN: usize = 4096;

/// An image format foliofs reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Romfs,
    Erofs,
}

impl Format {
    /// The format's name as `mount -t` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Format::Romfs => "romfs",
            Format::Erofs => "erofs",
        }
    }

    /// Recognises a format from the first bytes of a file.
    pub fn detect(head: &[u8]) -> Option<Format> {
        if foliofs_romfs::is_romfs(head) {
            return Some(Format::Romfs);
        }
        if head.get(1024..1028) == Some(&foliofs_erofs::superblock::MAGIC.to_le_bytes()[..]) {
            return Some(Format::Erofs);
        }
        None
    }
}

/// An open image.
pub enum Image {
    Romfs(Arc<RomFs>),
    Erofs(Arc<Erofs>),
}

impl Image {
    /// The image as a file system.
    pub fn fs(&self) -> Arc<dyn FileSystem> {
        match self {
            Image::Romfs(r) => r.clone(),
            Image::Erofs(e) => e.clone(),
        }
    }

    pub fn format(&self) -> Format {
        match self {
            Image::Romfs(_) => Format::Romfs,
            Image::Erofs(_) => Format::Erofs,
        }
    }
}

/// Reads the first bytes of `path` and names its format, or says what was
/// found instead. A URL is read through the block layer's store with the
/// remote options in `opts`, which keeps what it fetches in the disk cache
/// for the open that follows.
pub fn detect(path: &Path, opts: &OpenOptions) -> anyhow::Result<Format> {
    let head = probe(path, opts)?;
    match Format::detect(&head) {
        Some(f) => Ok(f),
        None => bail!(
            "{}: not a romfs or EROFS image: {}",
            shown(path),
            describe(&head)
        ),
    }
}

/// Detects the format of `path` and opens it, with the extra devices
/// (`-o device=PATH`, in order) an EROFS image's device table names.
pub fn open_with_devices(
    path: &Path,
    opts: &OpenOptions,
    devices: &[PathBuf],
) -> anyhow::Result<Image> {
    let format = detect(path, opts)?;
    refuse_devices(path, format, devices)?;
    let ctx = || format!("{}: cannot open {} image", shown(path), format.name());
    Ok(match format {
        Format::Romfs => Image::Romfs(Arc::new(RomFs::open(path, opts).with_context(ctx)?)),
        Format::Erofs => {
            let found;
            let devices = if devices.is_empty() && !is_remote(path) {
                found = find_devices(path, opts)?;
                &found
            } else {
                devices
            };
            Image::Erofs(Arc::new(
                Erofs::open(path, opts, devices).with_context(ctx)?,
            ))
        }
    })
}

/// Most files looked at beside an image for its extra devices.
const MAX_BESIDE: usize = 10_000;

/// The extra devices of the EROFS image at `path`, found beside it when
/// none are given: an image whose devices are not mapped into its own
/// block space (a merged image's layers) names each in its device table
/// by a tag, which is a layer's UUID (as `mkfs erofs --merge` and
/// mkfs.erofs's rebuild mode write it) or a path. Each is looked for among
/// the EROFS images in the same directory and then in the store of image
/// layers, by UUID, or as that path beside the image. None found for an
/// image that needs none.
pub fn find_devices(path: &Path, opts: &OpenOptions) -> anyhow::Result<Vec<PathBuf>> {
    if let Some(sources) = lazy_devices(path)? {
        return Ok(sources);
    }
    let (_, slots) = Erofs::device_table(path, opts)
        .with_context(|| format!("{}: cannot read its device table", shown(path)))?;
    if slots.is_empty() || slots.iter().all(|s| s.mapped_blkaddr != 0) {
        return Ok(Vec::new());
    }
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    };
    let mut by_uuid = uuids_beside(&dir, path);
    // Then the store, where image layers are kept.
    if let Some(store) = crate::image::store_dir().filter(|s| s.is_dir() && *s != dir) {
        for (uuid, p) in uuids_beside(&store, path) {
            by_uuid.entry(uuid).or_insert(p);
        }
    }
    let mut out = Vec::with_capacity(slots.len());
    for (i, slot) in slots.iter().enumerate() {
        let tag = String::from_utf8_lossy(&slot.tag).into_owned();
        let hex = tag.to_ascii_lowercase().replace('-', "");
        let found = by_uuid.get(&hex).cloned().or_else(|| {
            let p = dir.join(&tag);
            (!tag.is_empty() && p.is_file()).then_some(p)
        });
        match found {
            Some(p) => out.push(p),
            None => bail!(
                "{}: its device {} (tag {tag:?}) is not beside it in {}: give every device with -o device=PATH, in order",
                shown(path),
                i + 1,
                dir.display()
            ),
        }
    }
    Ok(out)
}

/// The sources of a lazily read image's layers, listed beside it (see
/// `foliofs_oci::store::lazy_devices`); `None` for any other image.
pub fn lazy_devices(path: &Path) -> anyhow::Result<Option<Vec<PathBuf>>> {
    let list = foliofs_oci::store::lazy_devices(path);
    let text = match std::fs::read_to_string(&list) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("{}", list.display())),
    };
    Ok(Some(text.lines().map(PathBuf::from).collect()))
}

/// The UUIDs (hex, lower case) of the EROFS images in `dir` but `image`.
fn uuids_beside(dir: &Path, image: &Path) -> std::collections::HashMap<String, PathBuf> {
    let mut out = std::collections::HashMap::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    let me = std::fs::canonicalize(image).ok();
    for e in entries.flatten().take(MAX_BESIDE) {
        let p = e.path();
        if !e.file_type().is_ok_and(|t| t.is_file()) || std::fs::canonicalize(&p).ok() == me {
            continue;
        }
        use foliofs_erofs::format::{SUPER_OFFSET, SUPER_SIZE};
        let mut head = [0u8; SUPER_OFFSET as usize + SUPER_SIZE];
        let ok = File::open(&p)
            .and_then(|mut f| f.read_exact(&mut head))
            .is_ok();
        let Some(sb) = ok
            .then(|| {
                foliofs_erofs::superblock::Superblock::parse(&head[SUPER_OFFSET as usize..]).ok()
            })
            .flatten()
        else {
            continue;
        };
        let uuid = sb.uuid_hex();
        out.entry(uuid).or_insert(p);
    }
    out
}

/// Whether a mount of `source` with the extra devices `devices` reads
/// anything remote: the image, a device given, or the layers of a lazily
/// read image listed beside it.
pub fn reads_remote(source: &Path, devices: &[PathBuf]) -> bool {
    is_remote(source)
        || devices.iter().any(|d| is_remote(d))
        || foliofs_oci::store::lazy_devices(source).exists()
}

/// Refuses the options that cannot apply to where `source` is: a remote
/// key (`chunk=`, `cache=`, ...) for a local image, and `directio` for an
/// image in object storage, which is read through its disk cache.
pub fn refuse_misplaced(source: &Path, opts: &MountOpts) -> anyhow::Result<()> {
    // An EROFS image's blob may be remote while the image is not: the
    // remote keys then apply to the blob.
    let remote = crate::open::reads_remote(source, &opts.image.devices);
    if remote {
        if opts.image.open.io_mode == IoMode::Direct {
            bail!(
                "{}: mount option `directio` is for local images: an image in object storage is read through its disk cache",
                shown(source)
            );
        }
    } else if let Some(key) = opts.remote_key() {
        bail!(
            "{}: mount option `{key}` is for images in object storage (s3://, https://), not a local image",
            source.display()
        );
    }
    Ok(())
}

/// `source` as messages, records and `/proc/mounts` show it: a URL without
/// its query string or user info (a presigned URL's signature, a
/// password), a path as it is.
pub fn shown(source: &Path) -> String {
    if is_remote(source) {
        foliofs_block::remote::redact(&source.to_string_lossy())
    } else {
        source.display().to_string()
    }
}

/// Refuses `device=` for a format that has no extra devices.
fn refuse_devices(path: &Path, format: Format, devices: &[PathBuf]) -> anyhow::Result<()> {
    if !devices.is_empty() && format != Format::Erofs {
        bail!(
            "{}: option `device` is only for EROFS images ({} has no extra devices)",
            shown(path),
            format.name()
        );
    }
    Ok(())
}

fn probe(path: &Path, opts: &OpenOptions) -> anyhow::Result<Vec<u8>> {
    if is_remote(path) {
        // The store's errors name the URL (redacted) and what the server
        // said: a 403 or 404 is one line as it is.
        let store = Store::open(path, opts)?;
        let mut head = vec![0u8; store.size().min(PROBE_LEN as u64) as usize];
        let n = store.read_at(&mut head, 0)?;
        head.truncate(n);
        return Ok(head);
    }
    let mut f = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut head = Vec::with_capacity(PROBE_LEN);
    (&mut f)
        .take(PROBE_LEN as u64)
        .read_to_end(&mut head)
        .with_context(|| format!("cannot read {}", path.display()))?;
    Ok(head)
}

/// A short description of an unrecognised file: a known magic when there is
/// one, else its first bytes.
fn describe(head: &[u8]) -> String {
    if head.is_empty() {
        return "the file is empty".into();
    }
    let at = |off: usize, magic: &[u8]| head.get(off..off + magic.len()) == Some(magic);
    let known = [
        (at(0, b"hsqs") || at(0, b"sqsh"), "a squashfs image"),
        (at(1080, &[0x53, 0xef]), "an ext2/3/4 file system"),
        (at(0, b"070701") || at(0, b"070707"), "a cpio archive"),
        (at(0, &[0x1f, 0x8b]), "gzip-compressed data"),
        (
            at(0, &[0xfd, b'7', b'z', b'X', b'Z', 0]),
            "xz-compressed data",
        ),
        (at(0, &[0x28, 0xb5, 0x2f, 0xfd]), "zstd-compressed data"),
        (at(257, b"ustar"), "a tar archive"),
        (at(0, b"\x7fELF"), "an ELF executable"),
        (at(0, b"-rom1fs"), "a damaged romfs magic"),
    ];
    if let Some((_, what)) = known.iter().find(|(hit, _)| *hit) {
        return format!("it looks like {what}");
    }
    let n = head.len().min(16);
    let shown: String = head[..n]
        .iter()
        .map(|&b| {
            if b.is_ascii_graphic() {
                (b as char).to_string()
            } else {
                format!("\\x{b:02x}")
            }
        })
        .collect();
    format!(
        "found \"{shown}\" at offset 0 (romfs starts with \"-rom1fs-\"; EROFS has e2 e1 f5 e0 at offset 1024)"
    )
}

/// An image path with its options, as every inspection command takes it.
#[derive(clap::Args, Debug, Clone)]
pub struct ImageArgs {
    /// The image file or block device.
    pub image: PathBuf,
    /// The mount options that change how an image is read, as `foliofs
    /// mount` takes them: `largeblocks`, `blocksize=N`, `directio` or
    /// `nodirectio`, `device=PATH` for an EROFS extra device (comma-separated;
    /// may be repeated). Other mount options are refused.
    #[arg(short = 'o', value_name = "OPTS")]
    pub options: Vec<String>,
}

impl ImageArgs {
    /// The `-o` options, parsed as `foliofs mount` parses them for an image
    /// (each key by its own layer, so a bad value keeps its own error).
    /// Only the keys that change how an image is read ([`READING_KEYS`],
    /// the block layer's) are taken: the mount-only ones (owners,
    /// `allow_other`, `ro`, ramfs's keys, ...) would change nothing here,
    /// so they are refused by name rather than ignored.
    pub fn image_options(&self) -> anyhow::Result<ImageOptions> {
        let o = parse_mount_options("auto", &self.options)?;
        // A key no foliofs mount takes is unknown, not mount-only.
        o.refuse_extra_except(&foliofs_ramfs::Options::is_key)?;
        if let Some(key) = o.keys.iter().find(|k| !READING_KEYS.contains(&k.as_str())) {
            bail!(
                "mount option `{key}` only applies to `foliofs mount`: it does not change how an image is read"
            );
        }
        // `prefetch=` is a reading key only as `prefetch=all`; a start-up
        // profile only means something to a mount.
        if o.fuse.prefetch.is_some() {
            bail!(
                "mount option `prefetch=FILE` only applies to `foliofs mount`: it replays a start-up profile"
            );
        }
        refuse_misplaced(&self.image, &o)?;
        Ok(o.image)
    }

    /// Detects the image's format, and the open options these arguments
    /// ask for, for a reader of that format that is handed no extra
    /// devices: `device=` is refused unless the format has none to take.
    pub fn detect(&self) -> anyhow::Result<(Format, OpenOptions)> {
        let o = self.image_options()?;
        let format = detect(&self.image, &o.open)?;
        refuse_devices(&self.image, format, &o.devices)?;
        Ok((format, o.open))
    }

    /// Detects and opens the image, with the extra devices `device=PATH`
    /// names.
    pub fn open(&self) -> anyhow::Result<Image> {
        let o = self.image_options()?;
        open_with_devices(&self.image, &o.open, &o.devices)
    }
}

/// Parses `-o` option strings (in order, as repeated `-o` flags are) for a
/// file system of type `fstype`, each key by the layer that owns it (see
/// [`MountOpts::parse`]): for ramfs the keys ramfs says are its own
/// ([`foliofs_ramfs::Options::is_key`]) are left in [`MountOpts::extra`]
/// for it. An image format owns no keys, so whatever is left there is
/// refused by the caller.
pub fn parse_mount_options(fstype: &str, items: &[String]) -> Result<MountOpts, OptionError> {
    MountOpts::parse(fstype, items)
}

/// The ramfs a mount's options ask for: its own keys as ramfs reads them,
/// and a refusal of the generic options only an image can honour.
pub fn ramfs_options(o: &MountOpts) -> anyhow::Result<foliofs_ramfs::Options> {
    let mut ro = foliofs_ramfs::Options::from_mount_options(&o.extra)?;
    // The root belongs to whoever mounts, as a user's tmpfs would.
    let given = |k: &str| o.extra.iter().any(|(key, _)| key == k);
    if !given("uid") {
        ro.uid = nix::unistd::getuid().as_raw();
    }
    if !given("gid") {
        ro.gid = nix::unistd::getgid().as_raw();
    }
    for (asked, name) in [
        (o.image.open.io_mode == IoMode::Direct, "directio"),
        (
            o.image.open.block_size == BlockSizeChoice::LargeBlocks,
            "largeblocks",
        ),
        (!o.image.devices.is_empty(), "device"),
        (o.fuse.umask.is_some(), "umask"),
        (o.fuse.push.is_some(), "push"),
        (o.fuse.record.is_some(), "record"),
        (o.fuse.prefetch.is_some(), "prefetch"),
    ] {
        if asked {
            bail!("mount option `{name}` is for images; ramfs does not take it");
        }
    }
    if let Some(key) = o.remote_key() {
        bail!("mount option `{key}` is for images in object storage; ramfs does not take it");
    }
    Ok(ro)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image_args(options: &[&str]) -> ImageArgs {
        ImageArgs {
            image: PathBuf::from("img"),
            options: options.iter().map(|&o| o.to_owned()).collect(),
        }
    }

    #[test]
    fn inspection_takes_only_the_options_that_change_reading() {
        let o = image_args(&["directio,blocksize=64K", "nodirectio,largeblocks,device=/d"])
            .image_options()
            .unwrap();
        assert_eq!(o.open.io_mode, IoMode::Buffered);
        assert_eq!(o.open.block_size, BlockSizeChoice::LargeBlocks);
        assert_eq!(o.devices, [PathBuf::from("/d")]);
        for (opts, key) in [
            ("uid=5", "uid"),
            ("directio,allow_other", "allow_other"),
            ("ro", "ro"),
            ("umask=022", "umask"),
            ("writeback", "writeback"),
            ("threads=2", "threads"),
            ("spin=50", "spin"),
            ("suid", "suid"),
            ("defaults", "defaults"),
            ("size=1M", "size"),
            ("mode=700", "mode"),
        ] {
            let e = image_args(&[opts]).image_options().unwrap_err().to_string();
            assert_eq!(
                e,
                format!("mount option `{key}` only applies to `foliofs mount`: it does not change how an image is read"),
                "{opts}"
            );
        }
        // A start-up profile only means something to a mount.
        let e = image_args(&["prefetch=/p"]).image_options().unwrap_err();
        assert!(
            e.to_string()
                .contains("`prefetch=FILE` only applies to `foliofs mount`"),
            "{e}"
        );
        // Unknown keys and bad values keep their own errors.
        let e = image_args(&["uid=5,bogus=1"]).image_options().unwrap_err();
        assert_eq!(e.to_string(), "unknown mount option `bogus=1`");
        let e = image_args(&["uid=x"]).image_options().unwrap_err();
        assert!(
            e.to_string().contains("bad value for mount option `uid`"),
            "{e}"
        );
    }
}
