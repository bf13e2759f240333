//! `foliofs`: mount, build, check and benchmark romfs, EROFS and ramfs file
//! systems in userspace.

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "foliofs", version, about)]
struct Cli {
    #[command(subcommand)]
    cmd: Command,
}

#[derive(Subcommand)]
enum Command {}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn"))
        .format_timestamp(None)
        .init();
    let cli = Cli::parse();
    let code = match run(cli.cmd) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("foliofs: {e:#}");
            1
        }
    };
    std::process::exit(code);
}

fn run(cmd: Command) -> anyhow::Result<i32> {
    match cmd {}
}
