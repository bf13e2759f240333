//! `foliofs mkfs FORMAT ...`: building images, one file per format (and
//! for EROFS, mkfs.erofs's own command line when foliofs is run by that
//! name).

pub mod erofs;
pub mod romfs;

#[derive(clap::Args, Debug)]
pub struct MkfsArgs {
    #[command(subcommand)]
    pub format: MkfsFormat,
}

#[derive(clap::Subcommand, Debug)]
pub enum MkfsFormat {
    /// Build a romfs image (readable by Linux's romfs and genromfs's tools).
    Romfs(romfs::RomfsArgs),
    /// Build an EROFS image from a directory or a tar stream (readable by
    /// Linux's EROFS and erofs-utils).
    Erofs(erofs::ErofsArgs),
}

/// `foliofs mkfs ...`.
pub fn run(args: MkfsArgs) -> anyhow::Result<i32> {
    match args.format {
        MkfsFormat::Romfs(a) => romfs::run(a),
        MkfsFormat::Erofs(a) => erofs::run(a),
    }
}
