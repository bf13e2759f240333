//! `foliofs mkfs erofs`: an EROFS image from a directory or a tar stream.
//! Options that mean what a mkfs.erofs option means are spelt as it spells
//! them, so one tool can stand in for the other in a script.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use foliofs_erofs::mkfs::{
    open_tar, Builder, Compression, Compressor, MergeLayer, Options, ZSTD_DEFAULT_LEVEL,
};

/// The options `foliofs mkfs erofs` and `mkfs.erofs` share.
#[derive(clap::Args, Debug)]
pub struct ErofsOpts {
    /// Block size in bytes: 512, 1024, 2048 or 4096 (default 4096). With
    /// `--tar=i` the block size is always 512, whatever -b says, as
    /// mkfs.erofs 1.9.3 does (an index image's blocks are the tar's).
    #[arg(short = 'b', value_name = "SIZE")]
    pub block_size: Option<u32>,
    /// Extended options, comma-separated: `noinline_data` (no tails of
    /// regular files inline after their inodes), `inline_data` (the
    /// default), `legacy-compress` (full lcluster indexes, 8 bytes a
    /// block, rather than compact ones).
    #[arg(short = 'E', value_name = "OPTS")]
    pub extended: Vec<String>,
    /// Every inode's mtime and the image's build time, in seconds since
    /// 1970 (default: each entry's own; the image is reproducible either
    /// way). With --mkfs-time, the build time only.
    #[arg(short = 'T', value_name = "SECONDS", allow_negative_numbers = true)]
    pub time: Option<i64>,
    /// -T sets the image's build time only; every entry keeps its own
    /// mtime.
    #[arg(long = "mkfs-time", overrides_with = "all_time")]
    pub mkfs_time: bool,
    /// -T sets every entry's mtime as well as the build time (the
    /// default; needs -T).
    #[arg(long = "all-time", overrides_with = "mkfs_time")]
    pub all_time: bool,
    /// The UUID: `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, `clear` (all
    /// zeros) or `random`; default: one made from a hash of the image's
    /// content.
    #[arg(short = 'U', value_name = "UUID")]
    pub uuid: Option<String>,
    /// Volume label (at most 15 bytes).
    #[arg(short = 'L', value_name = "LABEL")]
    pub label: Option<String>,
    /// Compress regular files: `lz4`, `lz4hc[,LEVEL]` (LEVEL 1 to 12,
    /// default 9) or `zstd[,LEVEL]` (libzstd's levels, default 3; also
    /// `zstd,level=N,dictsize=BYTES`, the window: a power of two up to
    /// 1 MiB, default 8 pclusters). Each physical cluster holds as much
    /// input as compresses into it; a cluster that would not save a
    /// block, and a file that would not, is stored as it is. Other
    /// algorithms are refused.
    #[arg(short = 'z', value_name = "ALG")]
    pub compress: Option<String>,
    /// Largest physical cluster in bytes with -z: a multiple of the block
    /// size, at most 1 MiB and 255 blocks (default: one block).
    #[arg(short = 'C', value_name = "SIZE")]
    pub pcluster: Option<u32>,
    /// Threads compressing with -z (default: one per CPU); the image is
    /// the same whatever the number.
    #[arg(long, value_name = "N")]
    pub workers: Option<usize>,
    /// The source is a tar stream: `--tar=f` (file data copied into the
    /// image) or `--tar=i` (an index image: metadata only, 512-byte
    /// blocks, each file pointing at its data in the tar, which must be
    /// uncompressed and is mounted with the image as `-o device=TAR` or
    /// appended to it). With --tar and no SOURCE the tar is read from
    /// standard input; without --tar a SOURCE that is not a directory is
    /// read as a tar.
    #[arg(long = "tar", value_name = "MODE", num_args = 0..=1, default_missing_value = "f", require_equals = true)]
    pub tar: Option<String>,
    /// The order of file data from a tar: only `none` (each file's data
    /// is written where the tar gives it, which is what foliofs always
    /// does); `path` is refused.
    #[arg(long = "sort", value_name = "ORDER")]
    pub sort: Option<String>,
    /// Turn AUFS whiteouts into overlayfs's: `.wh.NAME` becomes a character
    /// device 0:0 named NAME, `.wh..wh..opq` sets
    /// `trusted.overlay.opaque=y` on its directory.
    #[arg(long)]
    pub aufs: bool,
    /// The sources are layers, lowest first, stacked into one image as
    /// overlayfs stacks them: whiteouts and opaque directories applied
    /// and left out, directories merged with the upper one's attributes
    /// (a directory a layer's tar implied but did not list keeps the
    /// attributes below it). Each layer is an EROFS image, or a tar first
    /// built into one beside IMAGE (named by its UUID). Files point into
    /// their layers, which are the image's extra devices: a mount finds
    /// them beside the image, or takes one `-o device=LAYER` per layer, in
    /// order. What a layer keeps where no chunk can point (an inline
    /// tail, compressed data) is copied, and the summary says how much.
    #[arg(long)]
    pub merge: bool,
    /// With --merge: copy every byte of the layers' files into the image,
    /// which then needs no layer to be read (`--clean=data`, as mkfs.erofs
    /// spells it; `data` is the only mode).
    #[arg(long, value_name = "MODE", num_args = 0..=1, default_missing_value = "data", require_equals = true)]
    pub clean: Option<String>,
    /// Make every file owned by root.
    #[arg(long = "all-root")]
    pub all_root: bool,
    /// Make the image durable (fsync) before returning.
    #[arg(long)]
    pub fsync: bool,
    /// Print nothing but errors.
    #[arg(long, short = 'q')]
    pub quiet: bool,
}

/// `foliofs mkfs erofs [OPTIONS] [SOURCE] IMAGE`, or with --merge
/// `LAYER... IMAGE`.
#[derive(clap::Args, Debug)]
#[command(allow_missing_positional = true)]
pub struct ErofsArgs {
    #[command(flatten)]
    pub opts: ErofsOpts,
    /// With --merge, how a `docker://` image is pulled.
    #[command(flatten)]
    pub registry: crate::image::RegistryArgs,
    /// A directory, a tar file (plain, gzip or zstd), or `-` for a tar on
    /// standard input; with --tar it may be left out (standard input).
    /// With --merge, the layer images, lowest first.
    #[arg(value_name = "SOURCE")]
    pub src: Vec<PathBuf>,
    /// The image file to write.
    #[arg(value_name = "IMAGE")]
    pub image: PathBuf,
}

/// foliofs run as `mkfs.erofs` (a link to the binary by that name): the
/// options of `foliofs mkfs erofs`, and the positional arguments in
/// mkfs.erofs's order, `IMAGE [SOURCE]`.
#[derive(clap::Parser, Debug)]
#[command(
    name = "mkfs.erofs",
    // Not a version of erofs-utils: a script that reads it learns whose.
    version = concat!("(foliofs ", env!("CARGO_PKG_VERSION"), ")"),
    about = "Build an EROFS image (foliofs standing in for erofs-utils' mkfs.erofs)",
    long_about = "Build an EROFS image: foliofs standing in for erofs-utils' mkfs.erofs, \
                  with `foliofs mkfs erofs`'s options. As mkfs.erofs, the image comes \
                  first; with --tar=f or --tar=i and no SOURCE the tar is read from \
                  standard input. Options of mkfs.erofs that foliofs does not implement \
                  are refused."
)]
pub struct MkfsErofsCli {
    #[command(flatten)]
    pub opts: ErofsOpts,
    /// With layer images as the sources (mkfs.erofs's rebuild mode, as
    /// containerd builds its fsmeta image): `1`, whiteouts and opaque
    /// markers applied and left out, which is how foliofs merges; other
    /// values are refused.
    #[arg(long = "ovlfs-strip", value_name = "N", require_equals = true)]
    pub ovlfs_strip: Option<u8>,
    /// The image file to write.
    #[arg(value_name = "IMAGE")]
    pub image: PathBuf,
    /// A directory, a tar file (plain, gzip or zstd), or `-` for a tar on
    /// standard input; with --tar it may be left out (standard input).
    /// Layer images (EROFS) are merged, lowest first, as with --merge.
    #[arg(value_name = "SOURCE")]
    pub src: Vec<PathBuf>,
}

/// The options of mkfs.erofs 1.9.3 (its `getopt_long` table and short
/// option string) that foliofs does not implement. Each is refused by
/// name in one line rather than with clap's generic error, so that a
/// script written for mkfs.erofs learns exactly which option stops it.
const NOT_IMPLEMENTED: &[&str] = &[
    "-d",
    "-x",
    "-m",
    "--exclude-path",
    "--exclude-regex",
    "--file-contexts",
    "--force-uid",
    "--force-gid",
    "--random-pclusterblks",
    "--random-algorithms",
    "--max-extent-bytes",
    "--compress-hints",
    "--chunksize",
    "--blobdev",
    "--ignore-mtime",
    "--preserve-mtime",
    "--uid-offset",
    "--gid-offset",
    "--mount-point",
    "--product-out",
    "--fs-config-file",
    "--offset",
    "--gzip",
    "--ungzip",
    "--gzinfo",
    "--unlzma",
    "--unxz",
    "--zfeature-bits",
    "--incremental",
    "--root-xattr-isize",
    "--hard-dereference",
    "--dsunit",
    "--async-queue-limit",
    "--fsalignblks",
    "--vmdk-desc",
    "--s3",
    "--oci",
    "--zD",
    "--MZ",
    "--xattr-prefix",
    "--xattr-inode-digest",
];

/// If clap's error is an option of mkfs.erofs that foliofs lacks, the
/// one line that says so.
pub fn not_implemented(e: &clap::Error) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if e.kind() != ErrorKind::UnknownArgument {
        return None;
    }
    let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg) else {
        return None;
    };
    let name = match arg.split_once('=') {
        Some((n, _)) => n,
        None if !arg.starts_with("--") => arg.get(..2).unwrap_or(arg),
        None => arg,
    };
    if name == "--ovlfs-strip" {
        // Known as mkfs.erofs (its rebuild mode), spelt --merge here.
        return Some(
            "--ovlfs-strip: mkfs.erofs's rebuild mode; `foliofs mkfs erofs` spells it --merge \
             (whiteouts are always applied and left out)"
                .into(),
        );
    }
    NOT_IMPLEMENTED
        .contains(&name)
        .then(|| format!("{name}: an option of mkfs.erofs that foliofs does not implement"))
}

fn parse_uuid(s: &str) -> anyhow::Result<[u8; 16]> {
    if s == "clear" {
        return Ok([0; 16]);
    }
    if s == "random" {
        // An RFC 9562 version 4 UUID; the image is then not reproducible,
        // which is what asking for a random one means.
        let mut u = [0u8; 16];
        std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom")?, &mut u)
            .context("-U random: reading /dev/urandom")?;
        u[6] = (u[6] & 0x0f) | 0x40;
        u[8] = (u[8] & 0x3f) | 0x80;
        return Ok(u);
    }
    let hex: String = s.chars().filter(|&c| c != '-').collect();
    if hex.len() != 32 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        bail!("-U {s:?}: expected a UUID (32 hex digits, dashes allowed), \"clear\" or \"random\"");
    }
    let mut out = [0u8; 16];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)?;
    }
    Ok(out)
}

fn format_uuid(u: &[u8; 16]) -> String {
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// A `-z` value as mkfs.erofs spells it: `ALG`, `ALG,LEVEL`, or `ALG`
/// followed by `,level=N` and (Zstd only) `,dictsize=BYTES`.
fn parse_compressor(z: &str) -> anyhow::Result<Compressor> {
    let mut parts = z.split(',');
    let name = parts.next().unwrap_or_default();
    let (mut level, mut dictsize) = (None, None);
    for (i, p) in parts.enumerate() {
        let number = |v: &str, what: &str| -> anyhow::Result<i64> {
            v.parse()
                .map_err(|_| anyhow::anyhow!("-z {z}: {what} {v:?} is not a number"))
        };
        if let Some(v) = p.strip_prefix("level=") {
            level = Some(number(v, "level")?);
        } else if let Some(v) = p.strip_prefix("dictsize=") {
            dictsize = Some(number(v, "dictsize")?);
        } else if i == 0 && p.starts_with(|c: char| c.is_ascii_digit()) {
            level = Some(number(p, "level")?);
        } else {
            bail!("-z {z}: {p:?} is not an option of {name} (level=N, dictsize=BYTES)");
        }
    }
    if dictsize.is_some() && name != "zstd" {
        bail!("-z {z}: only zstd takes a dictsize");
    }
    match name {
        "lz4" if level.is_some() => bail!("-z {z}: lz4 takes no level; use lz4hc,LEVEL"),
        "lz4" => Ok(Compressor::Lz4),
        "lz4hc" => match level.unwrap_or(9) {
            n @ 1..=12 => Ok(Compressor::Lz4hc(n as u8)),
            _ => bail!("-z {z}: the lz4hc level must be 1 to 12"),
        },
        "zstd" => Ok(Compressor::Zstd {
            level: match level {
                None => ZSTD_DEFAULT_LEVEL,
                Some(l) => i32::try_from(l)
                    .map_err(|_| anyhow::anyhow!("-z {z}: level {l} is out of range"))?,
            },
            dictsize: dictsize
                .map(|d| {
                    u32::try_from(d)
                        .map_err(|_| anyhow::anyhow!("-z {z}: dictsize {d} is out of range"))
                })
                .transpose()?,
        }),
        _ => bail!(
            "-z {z}: only lz4, lz4hc[,LEVEL] and zstd[,LEVEL] compression is built; \
             leave -z out for an uncompressed image"
        ),
    }
}

/// The options, or why one cannot be honoured.
fn options(a: &ErofsOpts) -> anyhow::Result<Options> {
    let mut o = Options::default();
    if let Some(b) = a.block_size {
        if !matches!(b, 512 | 1024 | 2048 | 4096) {
            bail!("-b {b}: the block size must be 512, 1024, 2048 or 4096");
        }
        o.blkszbits = b.trailing_zeros() as u8;
    }
    if let Some(z) = &a.compress {
        let compressor = parse_compressor(z)?;
        let blksz = 1u32 << o.blkszbits;
        let pcluster = a.pcluster.unwrap_or(blksz);
        let c = Compression {
            compressor,
            pcluster,
        };
        c.check(blksz.into()).map_err(anyhow::Error::msg)?;
        o.compression = Some(c);
    } else if let Some(c) = a.pcluster {
        bail!("-C {c}: a physical cluster size needs -z");
    }
    if let Some(n) = a.workers {
        if n == 0 {
            bail!("--workers 0: at least one thread is needed");
        }
        o.workers = n;
    }
    for list in &a.extended {
        for opt in list.split(',').filter(|s| !s.is_empty()) {
            match opt {
                "noinline_data" | "^inline_data" => o.inline_data = false,
                "inline_data" => o.inline_data = true,
                "legacy-compress" => o.legacy_compress = true,
                other => bail!(
                    "-E {other}: not an extended option foliofs knows (noinline_data, inline_data, legacy-compress)"
                ),
            }
        }
    }
    if a.tar.as_deref() == Some("i") {
        // The builder refuses what an index image cannot be. Its blocks
        // are the tar's 512 bytes whatever -b says: mkfs.erofs 1.9.3
        // forces that silently for the same command line, which is how
        // containerd calls it (`--tar=i -b4096`); foliofs does the same,
        // as documented under -b, and says so unless quiet.
        o.tar_index = true;
        o.blkszbits = 9;
    }
    match a.sort.as_deref() {
        // `none` asks for no particular data order, and mkfs.erofs then
        // writes each file's data as the tar streams it: foliofs always
        // writes data in the order it arrives.
        None | Some("none") => {}
        // `path` (mkfs.erofs's default) lays data out in the order of the
        // tree, which foliofs's single pass over a stream cannot.
        Some("path") => bail!(
            "--sort=path: foliofs writes file data in the order the source gives it; \
             only --sort=none is possible"
        ),
        Some(m) => bail!("--sort={m}: expected path or none"),
    }
    if a.all_time && a.time.is_none() {
        // mkfs.erofs would stamp every entry with the time of the build;
        // foliofs's images have no time of their own but -T's.
        bail!("--all-time: needs -T (foliofs applies no time but the one given)");
    }
    o.time = a.time;
    // Without -T there is no time to restrict to the build time: each
    // entry keeps its own mtime, which is all --mkfs-time asks.
    o.time_epoch_only = a.mkfs_time;
    o.uuid = a.uuid.as_deref().map(parse_uuid).transpose()?;
    o.all_root = a.all_root;
    o.aufs = a.aufs;
    o.fsync = a.fsync;
    if let Some(l) = &a.label {
        o.volume = l.as_bytes().to_vec();
    }
    Ok(o)
}

/// `foliofs mkfs erofs ...`.
pub fn run(a: ErofsArgs) -> anyhow::Result<i32> {
    if let (Some(_), false) = (&a.opts.clean, a.opts.merge) {
        bail!("--clean: copies the layers of a --merge; there is no merge here");
    }
    if a.opts.merge {
        return merge(&a.opts, &a.registry, &a.src, &a.image);
    }
    if a.src.len() > 1 {
        bail!(
            "{} sources: one directory or tar makes an image (--merge stacks layer images)",
            a.src.len()
        );
    }
    build(&a.opts, a.src.into_iter().next(), &a.image)
}

/// `foliofs mkfs erofs --merge LAYER... IMAGE`: each LAYER an EROFS
/// image, or a tar that is first built into one beside IMAGE.
fn merge(
    a: &ErofsOpts,
    registry: &crate::image::RegistryArgs,
    sources: &[PathBuf],
    image: &Path,
) -> anyhow::Result<i32> {
    if let Some(m) = &a.tar {
        bail!("--tar={m}: --merge takes layer images or tars, each found out by its bytes");
    }
    let mut opts = options(a)?;
    match a.clean.as_deref() {
        None => {}
        Some("data") => opts.merge_copy = true,
        Some(m) => bail!("--clean={m}: only --clean=data (every byte copied) is built"),
    }
    let bar = if a.quiet {
        indicatif::ProgressBar::hidden()
    } else {
        crate::progress::spinner(format!("merging into {}", image.display()))
    };
    let mut layers = Vec::with_capacity(sources.len());
    // Layer images this run made, and whether each file was new: a
    // failed merge takes the new ones away again.
    let mut built: Vec<(PathBuf, bool)> = Vec::new();
    let mut res = Ok(());
    for src in sources {
        if let Some(image_layers) = crate::image::layers(src, registry)? {
            layers.extend(image_layers);
            continue;
        }
        if is_erofs(src) {
            layers.push(MergeLayer::from(src.clone()));
            continue;
        }
        match layer_of_tar(src, image, &opts) {
            Ok((layer, new)) => {
                built.push((layer.path.clone(), new));
                layers.push(layer);
            }
            Err(e) => {
                res = Err(e);
                break;
            }
        }
    }
    let res = res.and_then(|()| Ok(Builder::build_merge(&layers, image, opts)?));
    bar.finish_and_clear();
    if res.is_err() {
        for (p, new) in &built {
            if *new {
                let _ = std::fs::remove_file(p);
            }
        }
    }
    let sum = res?;
    if !a.quiet {
        for (b, _) in &built {
            eprintln!("{}: a layer image built of a tar", b.display());
        }
        eprintln!(
            "{}: EROFS, {} layers, {} bytes, {} inodes, {} bytes of file data, \
             {} of them copied from the layers, UUID {}",
            image.display(),
            layers.len(),
            sum.image_size,
            sum.inodes,
            sum.data_bytes,
            sum.copied_bytes,
            format_uuid(&sum.uuid)
        );
    }
    Ok(0)
}

/// Whether `path` starts as an EROFS image does.
fn is_erofs(path: &Path) -> bool {
    use foliofs_erofs::format::{SUPER_OFFSET, SUPER_SIZE};
    let mut head = [0u8; SUPER_OFFSET as usize + SUPER_SIZE];
    std::fs::File::open(path)
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut head))
        .is_ok_and(|()| {
            foliofs_erofs::superblock::Superblock::parse(&head[SUPER_OFFSET as usize..]).is_ok()
        })
}

/// Builds the tar `src` into a layer image beside `image`, named by its
/// UUID (a hash of its content, so the same tar gives the same file),
/// as containerd builds its layers: whiteouts made overlayfs's, no data
/// inline, so that every byte can be pointed at.
/// True with it when the file is new.
fn layer_of_tar(src: &Path, image: &Path, merged: &Options) -> anyhow::Result<(MergeLayer, bool)> {
    let dir = match image.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    };
    let tmp = tempfile::Builder::new()
        .prefix(".layer.")
        .suffix(".erofs")
        .tempfile_in(&dir)
        .with_context(|| format!("a layer image in {}", dir.display()))?
        .into_temp_path();
    let opts = Options {
        blkszbits: merged.blkszbits,
        inline_data: false,
        aufs: true,
        time: merged.time,
        time_epoch_only: merged.time_epoch_only,
        all_root: merged.all_root,
        fsync: merged.fsync,
        ..Options::default()
    };
    let what = || {
        format!(
            "--merge: {}: neither an EROFS image nor a tar",
            src.display()
        )
    };
    let r = open_tar(src, false).with_context(what)?;
    let sum = Builder::build_tar(r, &tmp, opts).with_context(what)?;
    let hex = foliofs_erofs::superblock::uuid_hex(&sum.uuid);
    let path = dir.join(format!("{hex}.erofs"));
    let new = !path.exists();
    tmp.persist(&path)
        .with_context(|| format!("renaming a layer image to {}", path.display()))?;
    let layer = MergeLayer {
        path,
        implied: sum.implied_dirs.into_iter().collect(),
    };
    Ok((layer, new))
}

/// foliofs run as `mkfs.erofs ...`. EROFS images as the sources are
/// mkfs.erofs's rebuild mode, which foliofs runs as its merge.
pub fn run_as_mkfs_erofs(a: MkfsErofsCli) -> anyhow::Result<i32> {
    if a.opts.merge {
        bail!("--merge: foliofs's own spelling; as mkfs.erofs, give the layer images as sources");
    }
    let rebuild = a.src.len() > 1 || a.src.first().is_some_and(|s| is_erofs(s));
    if !rebuild {
        if let Some(n) = a.ovlfs_strip {
            bail!("--ovlfs-strip={n}: for layer images as the sources (rebuild mode)");
        }
        if a.opts.clean.is_some() {
            bail!("--clean: for layer images as the sources (rebuild mode)");
        }
        return build(&a.opts, a.src.into_iter().next(), &a.image);
    }
    match a.ovlfs_strip {
        Some(1) => {}
        Some(n) => bail!(
            "--ovlfs-strip={n}: foliofs's merge always applies whiteouts and opaque markers \
             and leaves them out; give --ovlfs-strip=1"
        ),
        None => bail!(
            "layer images as sources: without --ovlfs-strip=1 mkfs.erofs would keep the \
             whiteouts in the merged image, which foliofs's merge does not build; \
             give --ovlfs-strip=1"
        ),
    }
    if let Some(s) = a.src.iter().find(|s| !is_erofs(s)) {
        bail!(
            "{}: not an EROFS image; mkfs.erofs's rebuild mode takes layer images only",
            s.display()
        );
    }
    merge(&a.opts, &Default::default(), &a.src, &a.image)
}

fn build(a: &ErofsOpts, src: Option<PathBuf>, image: &Path) -> anyhow::Result<i32> {
    let opts = options(a)?;
    let opts_index = opts.tar_index;
    let src = match (src, a.tar.as_deref()) {
        (Some(s), _) => s,
        (None, Some(_)) => PathBuf::from("-"),
        (None, None) => bail!(
            "no SOURCE: give a directory or a tar, or --tar=f or --tar=i to read a tar \
             from standard input"
        ),
    };
    let as_tar = match a.tar.as_deref() {
        Some("f" | "i") => true,
        Some(m) => bail!("--tar={m}: expected f (data copied in) or i (an index of the tar)"),
        None => src != Path::new("-") && !src.is_dir(),
    } || src == Path::new("-");
    if let (Some(m), true) = (a.tar.as_deref(), src.is_dir()) {
        bail!("--tar={m}: {} is a directory, not a tar", src.display());
    }
    if opts.aufs && !as_tar {
        bail!(
            "--aufs applies to tar sources; {} is a directory",
            src.display()
        );
    }
    if let (true, Some(b), false) = (opts_index, a.block_size, a.quiet) {
        if b != 512 {
            eprintln!(
                "-b {b}: overridden: an index image (--tar=i) has the tar's 512-byte blocks, \
                 as with mkfs.erofs"
            );
        }
    }
    let bar = if a.quiet {
        indicatif::ProgressBar::hidden()
    } else {
        crate::progress::spinner(format!("building {}", image.display()))
    };
    let res = if as_tar {
        let r =
            open_tar(&src, opts.tar_index).with_context(|| format!("--tar: {}", src.display()))?;
        Builder::build_tar(r, image, opts)
    } else {
        Builder::build_dir(&src, image, opts)
    };
    bar.finish_and_clear();
    let sum = res?;
    if !a.quiet {
        eprintln!(
            "{}: EROFS, {} bytes, {} inodes, {} bytes of file data{}, UUID {}",
            image.display(),
            sum.image_size,
            sum.inodes,
            sum.data_bytes,
            if opts_index {
                " left in the tar (mount with -o device=TAR, or append the tar to the image)"
            } else {
                ""
            },
            format_uuid(&sum.uuid)
        );
    }
    Ok(0)
}
