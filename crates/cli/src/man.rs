//! `foliofs man [COMMAND...]`: a manual page in roff, generated from the
//! command's own definition (the same text `--help` shows).

use std::io::Write;

use anyhow::bail;
use clap::CommandFactory;

/// Print a manual page.
#[derive(clap::Args, Debug)]
pub struct ManArgs {
    /// The command whose page to print, as on the command line (`mount`,
    /// `mkfs romfs`); none for foliofs(1) itself, which lists the others.
    pub command: Vec<String>,
}

pub fn run(args: ManArgs) -> anyhow::Result<i32> {
    // `help` has no page of its own: `man` is the manual.
    let mut cmd = crate::Cli::command().disable_help_subcommand(true);
    // Building names each subcommand's page (foliofs-mount, ...).
    cmd.build();
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
    let mut page = Vec::new();
    clap_mangen::Man::new(cmd)
        .source(format!("foliofs {}", env!("CARGO_PKG_VERSION")))
        .manual("foliofs manual")
        .render(&mut page)?;
    let mut out = std::io::stdout().lock();
    out.write_all(&page)?;
    out.flush()?;
    Ok(0)
}
