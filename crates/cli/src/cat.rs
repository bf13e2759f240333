//! `foliofs cat`: write a file of an image to stdout.

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::ffi::OsStringExt;

use anyhow::{bail, Context};
use foliofs_vfs::{FileType, Scratch};

use crate::inspect::{kind_name, resolve, CHUNK};
use crate::open::ImageArgs;

#[derive(clap::Args, Debug)]
pub struct CatArgs {
    #[command(flatten)]
    pub image: ImageArgs,
    /// Path of a regular file in the image.
    pub path: String,
}

/// `foliofs cat IMAGE PATH`.
pub fn run(args: CatArgs) -> anyhow::Result<i32> {
    let image = args.image.open()?;
    let fs = image.fs();
    let a = resolve(&*fs, &args.path)?;
    match a.kind {
        FileType::RegularFile => {}
        FileType::Symlink => bail!(
            "{}: is a symlink to {:?}",
            args.path,
            OsString::from_vec(fs.readlink(a.ino)?)
        ),
        k => bail!("{}: is a {}, not a regular file", args.path, kind_name(k)),
    }
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut scratch = Scratch::new();
    let mut off = 0u64;
    loop {
        let data = fs
            .read(a.ino, off, CHUNK, &mut scratch)
            .with_context(|| format!("{}: read at {off}", args.path))?;
        if data.is_empty() {
            break;
        }
        if let Err(e) = out.write_all(data) {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                return Ok(0);
            }
            return Err(e.into());
        }
        off += data.len() as u64;
    }
    out.flush()?;
    if off != a.size {
        bail!("{}: read {off} bytes of {}", args.path, a.size);
    }
    Ok(0)
}
