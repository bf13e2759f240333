//! `foliofs`: mount, build, check and benchmark romfs, EROFS and ramfs file
//! systems in userspace.

mod cat;
mod completions;
mod digest;
mod extract;
mod fsck;
mod image;
mod images;
mod info;
mod inspect;
mod ls;
mod man;
mod mkfs;

mod mount;
mod mounts;
mod open;
mod options;
mod progress;
mod push;
mod salvage;
mod takeover;
mod umount;

use clap::{CommandFactory, Parser, Subcommand};

#[derive(Parser)]
#[command(name = "foliofs", version, about)]
struct Cli {
    #[command(subcommand)]
    cmd: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Mount an image (or a ramfs) over FUSE; returns once the mount is live.
    Mount(mount::MountArgs),
    /// Pull an image (docker://HOST/REPO[:TAG]) into the store: its layers
    /// and merged image, whose path is printed.
    Pull(image::PullArgs),
    /// Publish an OCI layout's image (oci:DIR[:TAG]) to a registry as
    /// native EROFS layers, beside its tar image in one index.
    Push(push::PushArgs),
    /// Unmount a foliofs mount (also one whose server was killed).
    Umount(umount::UmountArgs),
    /// List live foliofs mounts with their source and effective options.
    Mounts(mounts::MountsArgs),
    /// Have a new server, from the foliofs binary on disk now, take over a
    /// live supervised mount (an upgrade in place).
    Takeover(takeover::TakeoverArgs),
    /// Recreate the files of a ramfs whose supervisor gave up on it from
    /// the state it saved (the mount's error and log say where).
    Salvage(salvage::SalvageArgs),
    /// Measure foliofs beside the kernel's file systems (the patches' tables).
    #[cfg(feature = "bench")]
    Bench(foliofs_bench::BenchArgs),
    /// Left out of this build; named so that `foliofs bench ...` says so
    /// rather than being taken for `mount.fuse3`'s `SOURCE MOUNTPOINT` form.
    #[cfg(not(feature = "bench"))]
    #[command(hide = true, disable_help_flag = true)]
    Bench {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// Build an image from a directory tree.
    Mkfs(mkfs::MkfsArgs),
    /// Show an image's format, size, volume name, entry counts and checks.
    Info(info::InfoArgs),
    /// List a directory of an image.
    Ls(ls::LsArgs),
    /// Write a file of an image to stdout.
    Cat(cat::CatArgs),
    /// Recreate an image's tree (or part of it) in a directory.
    Extract(extract::ExtractArgs),
    /// Check an image for damage; exit 0 when clean, 1 with one line per defect.
    Fsck(fsck::FsckArgs),
    /// Write an image file's digest (IMAGE.digest): upload it beside the
    /// image and mount with `-o digest` so that every fetched byte is checked.
    Digest(digest::DigestArgs),
    /// Print a completion script for bash, zsh, fish, elvish or PowerShell.
    Completions(completions::CompletionsArgs),
    /// Print a manual page (roff) of foliofs or one of its commands.
    Man(man::ManArgs),
    /// List the store's images: name, id, layers, size on disk, when prepared.
    Images(images::ImagesArgs),
    /// Remove images from the store by name or id (and with --prune,
    /// whatever no image uses).
    Rmi(images::RmiArgs),
    /// Detach a mount once its server is gone (`-o auto_unmount`; started
    /// by the server itself).
    #[command(hide = true)]
    WatchMount(mount::WatchArgs),
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn"))
        .format_timestamp(None)
        .init();
    // Native EROFS layers in a registry are images like any other, named
    // by their sources wherever an image's path goes.
    foliofs_oci::registry::lazy::register();
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // Installed (or linked) as `mkfs.erofs`, foliofs takes mkfs.erofs's
    // command lines, so that tools which run mkfs.erofs (containerd's
    // EROFS differ and snapshotter) build their images with it.
    let as_mkfs_erofs = args
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .is_some_and(|n| n == "mkfs.erofs");
    let res = if as_mkfs_erofs {
        match mkfs::erofs::MkfsErofsCli::try_parse_from(&args) {
            Ok(a) => mkfs::erofs::run_as_mkfs_erofs(a),
            Err(e) => parse_error(e, "mkfs.erofs (foliofs)"),
        }
    } else {
        let args = mount_helper_args(args);
        let erofs =
            args.get(1).is_some_and(|a| a == "mkfs") && args.get(2).is_some_and(|a| a == "erofs");
        match Cli::try_parse_from(&args) {
            Ok(cli) => run(cli.cmd),
            Err(e) if erofs => parse_error(e, "foliofs mkfs erofs"),
            Err(e) => e.exit(),
        }
    };
    let code = match res {
        Ok(code) => code,
        Err(e) => {
            let prog = if as_mkfs_erofs {
                "mkfs.erofs (foliofs)"
            } else {
                "foliofs"
            };
            eprintln!("{prog}: {}", error_line(&e));
            1
        }
    };
    // What the remote objects fetched last is still being written to
    // their disk cache; exit skips destructors, so wait for it here.
    if !foliofs_block::remote::settle_all(std::time::Duration::from_secs(10)) {
        log::warn!("the last fetched chunks were not all written to the cache within 10 s");
    }
    std::process::exit(code);
}

/// Exits as clap does for `e`, except that an option of mkfs.erofs which
/// foliofs lacks is named in one line.
fn parse_error(e: clap::Error, prog: &str) -> ! {
    match mkfs::erofs::not_implemented(&e) {
        Some(line) => {
            eprintln!("{prog}: {line}");
            std::process::exit(2)
        }
        None => e.exit(),
    }
}

/// `e` and its causes on one line, each once.
pub fn error_line(e: &anyhow::Error) -> String {
    foliofs_vfs::chain_line(e.as_ref())
}

fn run(cmd: Command) -> anyhow::Result<i32> {
    match cmd {
        Command::Mount(a) => mount::run(a),
        Command::Pull(a) => image::pull(a),
        Command::Push(a) => push::run(a),
        Command::Umount(a) => umount::run(a),
        Command::Takeover(a) => takeover::run(a),
        Command::Salvage(a) => salvage::run(a),
        Command::Mounts(a) => mounts::run(a),
        #[cfg(feature = "bench")]
        Command::Bench(a) => foliofs_bench::run(a),
        #[cfg(not(feature = "bench"))]
        Command::Bench { .. } => {
            anyhow::bail!(
                "this foliofs was built without `bench` (cargo feature `bench`, on by default)"
            )
        }
        Command::Mkfs(a) => mkfs::run(a),
        Command::Info(a) => info::run(a),
        Command::Ls(a) => ls::run(a),
        Command::Cat(a) => cat::run(a),
        Command::Extract(a) => extract::run(a),
        Command::Fsck(a) => fsck::run(a),
        Command::Digest(a) => digest::run(a),
        Command::Completions(a) => completions::run(a),
        Command::Man(a) => man::run(a),
        Command::Images(a) => images::run_images(a),
        Command::Rmi(a) => images::run_rmi(a),
        Command::WatchMount(a) => mount::watch(a),
    }
}

/// `mount.fuse3` runs `foliofs SOURCE MOUNTPOINT -o OPTIONS` (no subcommand):
/// that form means `foliofs mount`.
fn mount_helper_args(mut args: Vec<std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    if let Some(first) = args.get(1).and_then(|a| a.to_str().map(str::to_owned)) {
        let cmd = Cli::command();
        let known = cmd
            .get_subcommands()
            .any(|s| s.get_name() == first || s.get_all_aliases().any(|a| a == first))
            || first == "help";
        if !known && !first.starts_with('-') && args.len() >= 3 {
            args.splice(1..1, ["mount".into(), "--mount-helper".into()]);
        }
    }
    args
}
