//! `foliofs digest`: write the per-piece digest a remote mount checks its
//! fetches against (`-o digest`).

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context};
use foliofs_block::remote::digest::{Digest, PIECE};

#[derive(clap::Args, Debug)]
pub struct DigestArgs {
    /// The local image file (the one uploaded to object storage).
    pub image: PathBuf,
    /// Where to write the digest; default IMAGE.digest. Upload it beside
    /// the image as KEY.digest for `-o digest`, or anywhere for
    /// `-o digest=URL`.
    #[arg(short = 'o', long = "output")]
    pub output: Option<PathBuf>,
}

/// `foliofs digest IMAGE [-o OUT]`.
pub fn run(args: DigestArgs) -> anyhow::Result<i32> {
    if foliofs_block::remote::is_remote(&args.image) {
        bail!(
            "{}: a digest is made from the local file before it is uploaded (a remote object's bytes are what it checks)",
            args.image.display()
        );
    }
    let file =
        std::fs::File::open(&args.image).with_context(|| format!("{}", args.image.display()))?;
    if !file.metadata()?.is_file() {
        bail!("{}: not a regular file", args.image.display());
    }
    let digest = Digest::of_reader(std::io::BufReader::new(file), PIECE)
        .with_context(|| format!("{}", args.image.display()))?;
    let out = args.output.unwrap_or_else(|| {
        let mut p = args.image.clone().into_os_string();
        p.push(".digest");
        PathBuf::from(p)
    });
    // Written whole under another name, then renamed: a digest cut short
    // would fail every mount that uses it.
    let mut tmp = out.clone().into_os_string();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&digest.to_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, &out)
    };
    if let Err(e) = write() {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("{}", out.display()));
    }
    eprintln!(
        "{}: {} bytes in {} pieces of {} KiB",
        out.display(),
        digest.size(),
        digest.size().div_ceil(digest.piece()),
        digest.piece() >> 10
    );
    Ok(0)
}
