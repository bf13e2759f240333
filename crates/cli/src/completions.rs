//! `foliofs completions SHELL`: a completion script for a shell, generated
//! from the command's own definition so it never falls behind it.

use std::io::Write;

use clap::CommandFactory;
use clap_complete::Shell;

/// Print a shell completion script.
#[derive(clap::Args, Debug)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    pub shell: Shell,
}

pub fn run(args: CompletionsArgs) -> anyhow::Result<i32> {
    let mut cmd = crate::Cli::command();
    // clap_complete panics on a failed write; a buffer cannot fail, and a
    // closed stdout then is an ordinary error.
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut cmd, "foliofs", &mut script);
    let mut out = std::io::stdout().lock();
    out.write_all(&script)?;
    out.flush()?;
    Ok(0)
}
