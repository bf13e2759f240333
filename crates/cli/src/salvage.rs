//! `foliofs salvage STATE DIR`: the files of a ramfs whose supervisor
//! gave up on it (its servers kept dying) out of the state it saved, into
//! DIR. The supervisor says where it saved them, in its log and in the
//! error the mount ends with.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;

#[derive(clap::Args, Debug)]
pub struct SalvageArgs {
    /// Replace existing files (never directories) of the same names.
    #[arg(long)]
    pub force: bool,
    /// The directory the supervisor saved the ramfs's state in.
    pub state: PathBuf,
    /// Directory to recreate the ramfs's tree in (created if missing).
    pub dir: PathBuf,
}

pub fn run(args: SalvageArgs) -> anyhow::Result<i32> {
    let files = foliofs_ramfs::StateFiles::open_saved(&args.state)
        .with_context(|| format!("{}: no saved ramfs state", args.state.display()))?;
    let fs = foliofs_ramfs::RamFs::salvage(files)
        .with_context(|| format!("{}: the ramfs cannot be read back", args.state.display()))?;
    crate::extract::extract(Arc::new(fs), &args.dir, None, args.force)
}
