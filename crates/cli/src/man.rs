//! `foliofs man [COMMAND...]`: a manual page in roff, generated from the
//! command's own definition (the same text `--help` shows).

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::CommandFactory;

/// Print a manual page.
#[derive(clap::Args, Debug)]
pub struct ManArgs {
    /// The command whose page to print, as on the command line (`mount`,
    /// `mkfs romfs`); none for foliofs(1) itself, which lists the others.
    pub command: Vec<String>,
    /// Write every page (foliofs.1, foliofs-mount.1, foliofs-mkfs-romfs.1,
    /// ...) into this directory instead, as an installer puts them in
    /// man1/.
    #[arg(long, value_name = "DIR", conflicts_with = "command")]
    pub out_dir: Option<PathBuf>,
}

/// foliofs's command tree, with each subcommand named as its page is
/// (foliofs-mount, ...).
fn root() -> clap::Command {
    // `help` has no page of its own: `man` is the manual.
    let mut cmd = crate::Cli::command().disable_help_subcommand(true);
    cmd.build();
    cmd
}

fn render(cmd: clap::Command) -> anyhow::Result<Vec<u8>> {
    let mut page = Vec::new();
    clap_mangen::Man::new(cmd)
        .source(format!("foliofs {}", env!("CARGO_PKG_VERSION")))
        .manual("foliofs manual")
        .render(&mut page)?;
    Ok(page)
}

/// Writes the page of `cmd` and of each of its visible subcommands, in
/// turn, into `dir`.
fn write_all(cmd: &clap::Command, dir: &Path) -> anyhow::Result<()> {
    let file = dir.join(format!("{}.1", cmd.get_display_name().unwrap_or("foliofs")));
    std::fs::write(&file, render(cmd.clone())?)
        .with_context(|| format!("writing {}", file.display()))?;
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_all(sub, dir)?;
    }
    Ok(())
}

pub fn run(args: ManArgs) -> anyhow::Result<i32> {
    let mut cmd = root();
    if let Some(dir) = &args.out_dir {
        write_all(&cmd, dir)?;
        return Ok(0);
    }
    for (i, name) in args.command.iter().enumerate() {
        let Some(sub) = cmd.find_subcommand(name).filter(|s| !s.is_hide_set()) else {
            let within = if i == 0 {
                "foliofs".to_owned()
            } else {
                format!("foliofs {}", args.command[..i].join(" "))
            };
            bail!("{within} has no command {name:?}");
        };
        cmd = sub.clone();
    }
    let page = render(cmd)?;
    let mut out = std::io::stdout().lock();
    out.write_all(&page)?;
    out.flush()?;
    Ok(0)
}
