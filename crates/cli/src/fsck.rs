//! `foliofs fsck`: check an image for damage with the format's own checker.

use anyhow::{bail, Context};
use foliofs_vfs::CheckReport;

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
    let (format, opts) = args.image.detect()?;
    // The checkers report nothing until they are done: a spinner shows a
    // long check is alive.
    let bar = progress::spinner(format!("checking {}", open::shown(path)));
    let report: Box<dyn CheckReport> = match format {
        Format::Romfs => Box::new(
            foliofs_romfs::check::check(path, &opts)
                .with_context(|| format!("{}: cannot read", open::shown(path)))?,
        ),
        Format::Erofs => {
            let open::Image::Erofs(e) = args.image.open()? else {
                bail!("{}: not an EROFS image", open::shown(path));
            };
            Box::new(e.fsck())
        }
    };
    bar.finish_and_clear();
    for d in report.defects() {
        println!("{}: {d}", open::shown(path));
    }
    if report.unlisted() > 0 {
        println!("{}: ... and {} more", open::shown(path), report.unlisted());
    }
    if report.is_clean() {
        eprintln!("{}: clean ({})", open::shown(path), report.summary());
        Ok(0)
    } else {
        eprintln!("{}: {} defect(s)", open::shown(path), report.defect_count());
        Ok(1)
    }
}
