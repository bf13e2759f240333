//! `foliofs info`: an image's format, size, volume name, entry counts and
//! checks, as the format itself reports them.

use anyhow::{bail, Context};

use crate::open::{self, Format, ImageArgs};

#[derive(clap::Args, Debug)]
pub struct InfoArgs {
    #[command(flatten)]
    pub image: ImageArgs,
}

/// `foliofs info IMAGE`.
pub fn run(args: InfoArgs) -> anyhow::Result<i32> {
    let path = &args.image.image;
    let (format, opts) = args.image.detect()?;
    match format {
        Format::Romfs => {
            let r = foliofs_romfs::check::check(path, &opts)
                .with_context(|| format!("{}: cannot read", open::shown(path)))?;
            let bs = foliofs_romfs::RomFs::open_unverified(path, &opts)
                .map(|fs| fs.block_dev().block_size())
                .ok();
            println!("format:          romfs");
            println!("image size:      {} bytes", r.image_size);
            println!("declared size:   {} bytes", r.declared_size);
            println!(
                "volume name:     {}",
                String::from_utf8_lossy(&r.volume_name)
            );
            if let Some(bs) = bs {
                println!("block size:      {bs} bytes");
            }
            println!(
                "superblock sum:  {}",
                if r.superblock_checksum_ok {
                    "ok"
                } else {
                    "BAD"
                }
            );
            println!(
                "header sums:     {} checked, {} bad",
                r.headers_checked, r.bad_header_checksums
            );
            let total: u64 = r.counts.values().sum();
            println!("entries:         {total}");
            for (kind, n) in &r.counts {
                println!("  {kind:<15}{n}");
            }
            println!("file data:       {} bytes", r.data_bytes);
            match r.data_alignment {
                Some(a) => println!("data alignment:  {a} bytes"),
                None => println!("data alignment:  - (no file data)"),
            }
            if r.is_clean() {
                println!("defects:         none");
            } else {
                println!(
                    "defects:         {} (run `foliofs fsck` for the list)",
                    r.defects.len()
                );
            }
            Ok(0)
        }
        Format::Erofs => erofs_info(&args.image),
    }
}

/// `info` for EROFS: the superblock, its features and the device table.
fn erofs_info(args: &ImageArgs) -> anyhow::Result<i32> {
    use foliofs_erofs::superblock as sbm;
    let open::Image::Erofs(e) = args.open()? else {
        bail!("{}: not an EROFS image", open::shown(&args.image));
    };
    let sb = e.superblock();
    let uuid: String = sb.uuid.iter().map(|b| format!("{b:02x}")).collect();
    let mut features: Vec<String> = (0..32)
        .map(|i| 1u32 << i)
        .filter(|bit| sb.has_compat(*bit))
        .map(|bit| match sbm::compat_name(bit) {
            Some(name) => name.to_owned(),
            None => format!("compat_{bit:#x}"),
        })
        .collect();
    features.extend(
        (0..32)
            .map(|i| 1u32 << i)
            .filter(|bit| sb.has_incompat(*bit))
            .map(sbm::incompat_name),
    );
    println!("format:          erofs");
    println!("image size:      {} bytes", e.block_dev().store().size());
    println!("block size:      {} bytes", sb.block_size());
    println!("blocks:          {}", sb.blocks);
    println!("inodes:          {}", sb.inos);
    println!("root nid:        {}", sb.root_nid);
    if sb.has_incompat(sbm::INCOMPAT_METABOX) {
        println!("metabox nid:     {}", sb.metabox_nid);
    }
    println!("uuid:            {uuid}");
    println!(
        "volume name:     {}",
        String::from_utf8_lossy(sb.volume_name())
    );
    println!("build time:      {}", sb.build_time());
    // Compact inodes keep their mtime as seconds after this.
    println!("epoch:           {}.{:09}", sb.epoch as i64, sb.fixed_nsec);
    println!("meta block:      {}", sb.meta_blkaddr);
    println!("xattr block:     {}", sb.xattr_blkaddr);
    println!("features:        {}", features.join(" "));
    let algorithms: Vec<String> = e
        .compression_configs()
        .algorithms()
        .into_iter()
        .map(sbm::algorithm_name)
        .collect();
    if sb.has_incompat(sbm::INCOMPAT_COMPR_CFGS) || sb.has_incompat(sbm::INCOMPAT_LZ4_0PADDING) {
        println!("compression:     {}", algorithms.join(" "));
    }
    for (i, d) in e.device_slots().iter().enumerate() {
        println!(
            "device {}:        {} blocks, mapped at {}, tag {:?}",
            i + 1,
            d.blocks,
            d.mapped_blkaddr,
            String::from_utf8_lossy(&d.tag)
        );
    }
    Ok(0)
}
