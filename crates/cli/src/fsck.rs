//! `foliofs fsck`: check an image for damage with the format's own checker.

use anyhow::{bail, Context};

use crate::open::{self, Format, ImageArgs};
use crate::progress;

#[derive(clap::Args, Debug)]
pub struct FsckArgs {
    #[command(flatten)]
    pub image: ImageArgs,
}

/// `foliofs fsck IMAGE`: exit 0 when clean, 1 with one line per defect.
pub fn run(args: FsckArgs) -> anyhow::Result<i32> {
    let path = &args.image.image;
    let opts = args.image.open_options()?;
    // The checkers report nothing until they are done: a spinner shows a
    // long check is alive.
    let bar = progress::spinner(format!("checking {}", path.display()));
    match open::detect(path)? {
        Format::Romfs => {
            let r = foliofs_romfs::check::check(path, &opts)
                .with_context(|| format!("{}: cannot read", path.display()))?;
            bar.finish_and_clear();
            for d in &r.defects {
                println!("{}: {d}", path.display());
            }
            if r.is_clean() {
                eprintln!(
                    "{}: clean ({} entries, {} headers checked)",
                    path.display(),
                    r.counts.values().sum::<u64>(),
                    r.headers_checked
                );
                Ok(0)
            } else {
                eprintln!("{}: {} defect(s)", path.display(), r.defects.len());
                Ok(1)
            }
        }
        Format::Erofs => {
            let open::Image::Erofs(e) = args.image.open()? else {
                bail!("{}: not an EROFS image", path.display());
            };
            let r = e.fsck();
            bar.finish_and_clear();
            for d in &r.errors {
                println!("{}: {d}", path.display());
            }
            if r.is_clean() {
                eprintln!(
                    "{}: clean ({} directories, {} files, {} symlinks, {} special, {} xattrs, {} data bytes)",
                    path.display(),
                    r.directories,
                    r.files,
                    r.symlinks,
                    r.specials,
                    r.xattrs,
                    r.data_bytes
                );
                Ok(0)
            } else {
                eprintln!("{}: {} defect(s)", path.display(), r.errors.len());
                Ok(1)
            }
        }
    }
}
