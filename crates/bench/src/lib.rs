//! `foliofs bench`: the kernel patches' tables, measured on this machine,
//! foliofs beside the kernel's own file systems and FUSE peers.
//!
//! The bench drives the `foliofs` binary it runs in (`current_exe`), as a
//! user would, so it is a library only to keep it out of the product: the
//! binary links it behind its default `bench` feature and hands it
//! [`BenchArgs`]; [`run`] does the rest. It measures mounts through the
//! same public surfaces anyone has: the mount table, the records and
//! request counts a server publishes (`foliofs_fuse::records::published`), and the
//! option grammar of each layer.

mod bigdir;
mod counted;
mod env;
mod evict;
mod image;
mod images;
mod mkfs;
mod mount;
mod ramfs;
mod readahead;
mod realstart;
mod registry;
mod remote;
mod report;
mod rows;
mod seq;
mod smallfiles;
mod startup;
mod stats;
mod timing;
mod tree;
mod unpack;
mod wakeup;

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};

use report::{Host, Report};

/// Which tables to produce.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Which {
    /// One large file read cold (romfs tests 1 and 2).
    Seq,
    /// A whole tree listed and stat'ed cold (romfs test 3).
    Tree,
    /// Sequential writes at every ramfs block size.
    Ramfs,
    /// Container start-up: 1st and later runs from one image (EROFS buffered vs direct I/O, pushing, profiles).
    Startup,
    /// Unpacking a layer tar.gz (foliofs mkfs erofs, mkfs.erofs --tar=f, tar x), each followed by the start-up reads.
    Unpack,
    /// Small files on ramfs: untar, read back and rm -rf a tree; many creates and unlinks.
    Smallfiles,
    /// A real program's start-up: Python importing modules from an image.
    Realstart,
    /// One flat directory of many entries listed and stat'ed cold.
    Bigdir,
    /// An EROFS image in S3 (a SeaweedFS started on loopback), cold and warm disk cache, beside the local file (needs `weed`; not part of `all`: it adds a server and a minute).
    Remote,
    /// A container image of many layers, from an OCI layout, made into a root file system (foliofs mount oci:, the kernel's mount of the merged image, mkfs.erofs per layer under overlayfs, umoci unpack) and started from; then a lookup-heavy start on the merged image and on the overlay stack.
    Image,
    /// An image pulled from a registry (docker-registry on loopback, pushed with skopeo): foliofs mount docker:// beside skopeo copy with mkfs.erofs per layer under overlayfs, and with umoci unpack (needs docker-registry and skopeo; not part of `all`: it adds a server).
    Registry,
    /// Every section but `remote` and `registry`.
    All,
    /// Reads every file under `--tree` and prints the seconds: the image
    /// section's reader, run as a process of its own by whoever a row
    /// runs as.
    #[value(hide = true)]
    ReadTree,
    /// Reads the first byte of the first file under `--tree` and prints
    /// the seconds: the registry section's first-byte reader.
    #[value(hide = true)]
    FirstByte,
}

/// Arguments of `foliofs bench`.
#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Section to run.
    #[arg(value_enum, default_value = "all")]
    pub which: Which,
    /// Small sizes and fewer runs (about a minute on two cores).
    #[arg(long)]
    pub quick: bool,
    /// Size of the seq section's file (suffixes K, M, G, T, P, E); default 250M, 64M with --quick.
    #[arg(long, value_parser = foliofs_vfs::options::parse_size)]
    pub size: Option<u64>,
    /// Use this directory as the tree for `tree` and `startup` instead of a generated one.
    #[arg(long)]
    pub tree: Option<PathBuf>,
    /// Runs per figure (the median is shown, with min and max); default 3, 2 with --quick.
    #[arg(long)]
    pub runs: Option<usize>,
    /// Write every raw run to this JSON file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write SVG charts into this directory.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Where to keep the generated data (default: the temporary directory).
    #[arg(long)]
    pub workdir: Option<PathBuf>,
    /// The mkfs.erofs to build every EROFS image with (default: the one on
    /// PATH); the Zstd, MicroLZMA and DEFLATE rows need one that makes them.
    #[arg(long, value_name = "PATH")]
    pub mkfs_erofs: Option<PathBuf>,
}

/// Sizes and switches every section reads.
#[derive(Clone, Debug)]
pub(crate) struct Config {
    pub runs: usize,
    pub seq_size: u64,
    pub tree: Option<PathBuf>,
    pub tree_files: u64,
    pub tree_bytes: u64,
    pub ramfs_bytes: u64,
    pub startup_files: u64,
    pub startup_bytes: u64,
    /// The mkfs.erofs to run, `None` when there is none.
    pub mkfs_erofs: Option<PathBuf>,
    pub small_files: u64,
    pub bigdir_entries: u64,
    /// `--quick`: sections that cannot simply shrink a size do less.
    pub quick: bool,
    pub tty: bool,
}

impl Config {
    pub(crate) fn from_args(a: &BenchArgs) -> Result<Config> {
        let q = a.quick;
        let runs = a.runs.unwrap_or(if q { 2 } else { 3 });
        if runs == 0 {
            bail!("--runs must be at least 1");
        }
        let seq_size = a.size.unwrap_or(if q { 64 << 20 } else { 250 << 20 });
        if seq_size == 0 {
            bail!("--size must be more than 0");
        }
        if let Some(t) = &a.tree {
            if !t.is_dir() {
                bail!("--tree {}: not a directory", t.display());
            }
        }
        let mkfs_erofs = match &a.mkfs_erofs {
            Some(p) if !env::is_executable(p) => {
                bail!("--mkfs-erofs {}: not an executable file", p.display())
            }
            Some(p) => Some(p.clone()),
            None => env::have("mkfs.erofs").then(|| PathBuf::from("mkfs.erofs")),
        };
        Ok(Config {
            runs,
            seq_size,
            tree: a.tree.clone(),
            tree_files: if q { 1_000 } else { 9_600 },
            tree_bytes: if q { 40_000_000 } else { 630_000_000 },
            ramfs_bytes: if q { 256 << 20 } else { 4 << 30 },
            startup_files: if q { 400 } else { 3_000 },
            startup_bytes: if q { 20_000_000 } else { 300_000_000 },
            mkfs_erofs,
            small_files: if q { 10_000 } else { 100_000 },
            bigdir_entries: if q { 10_000 } else { 100_000 },
            quick: q,
            tty: std::io::stderr().is_terminal(),
        })
    }
}

/// Runs the benchmark and prints its tables; exit code 1 if a row failed.
pub fn run(args: BenchArgs) -> Result<i32> {
    if matches!(args.which, Which::ReadTree | Which::FirstByte) {
        let dir = args.tree.context("needs --tree DIR")?;
        let secs = if args.which == Which::ReadTree {
            timing::time_read_tree(&dir)?
        } else {
            timing::time_first_byte(&dir)?
        };
        println!("{secs}");
        return Ok(0);
    }
    let cfg = Config::from_args(&args)?;
    let env = env::BenchEnv::new(args.workdir.as_deref())?;
    ctrlc::set_handler(|| {
        eprintln!("\nfoliofs bench: interrupted; unmounting and removing its data");
        env::emergency_cleanup();
        std::process::exit(130);
    })
    .context("installing the Ctrl-C handler")?;
    if !env.root {
        eprintln!("{}", env::NOT_ROOT);
    }
    let wanted = match args.which {
        Which::All => vec![
            Which::Seq,
            Which::Tree,
            Which::Ramfs,
            Which::Startup,
            Which::Unpack,
            Which::Smallfiles,
            Which::Realstart,
            Which::Bigdir,
            Which::Image,
        ],
        w => vec![w],
    };
    let mut report = Report {
        host: Host::probe(),
        quick: args.quick,
        cold_cache: env.root,
        sections: Vec::new(),
    };
    eprintln!("foliofs bench: {}", report.host.wakeup.describe());
    if let Some(r) = &report.host.proactive_reclaim {
        eprintln!(
            "foliofs bench: {r}; an image a row expects in the page cache can be partly on the disk again, so figures vary more"
        );
    }
    for w in &wanted {
        let sections = match w {
            Which::Seq => seq::seq(&env, &cfg).map(|s| vec![s]),
            Which::Tree => tree::tree(&env, &cfg).map(|s| vec![s]),
            Which::Ramfs => ramfs::ramfs(&env, &cfg).map(|s| vec![s]),
            Which::Startup => startup::startup(&env, &cfg).map(|s| vec![s]),
            Which::Unpack => unpack::unpack(&env, &cfg).map(|s| vec![s]),
            Which::Smallfiles => smallfiles::smallfiles(&env, &cfg).map(|s| vec![s]),
            Which::Realstart => realstart::realstart(&env, &cfg).map(|s| vec![s]),
            Which::Bigdir => bigdir::bigdir(&env, &cfg).map(|s| vec![s]),
            Which::Remote => remote::remote(&env, &cfg).map(|s| vec![s]),
            Which::Image => image::image(&env, &cfg),
            Which::Registry => registry::registry(&env, &cfg).map(|s| vec![s]),
            Which::All | Which::ReadTree | Which::FirstByte => unreachable!("handled above"),
        }?;
        for s in sections {
            if cfg.tty {
                eprint!("\r\x1b[K");
            }
            println!("{}", report::table(&s));
            report.sections.push(s);
        }
    }
    crate::env::restore_uring();
    if let Some(p) = &args.json {
        report::write_json(&report, p)?;
        eprintln!("foliofs bench: wrote {}", p.display());
    }
    if let Some(d) = &args.plot {
        for f in report::write_plots(&report, d)? {
            eprintln!("foliofs bench: wrote {}", f.display());
        }
    }
    let failed: Vec<String> = report
        .sections
        .iter()
        .flat_map(|s| {
            s.rows
                .iter()
                .filter(|r| r.failed)
                .map(move |r| format!("{}: {}", s.name, r.label))
        })
        .collect();
    if !failed.is_empty() {
        eprintln!(
            "foliofs bench: {} row(s) failed: {}",
            failed.len(),
            failed.join("; ")
        );
        return Ok(1);
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        b: BenchArgs,
    }

    #[test]
    fn quick_shrinks_every_section() {
        let full = Config::from_args(&T::parse_from(["t"]).b).unwrap();
        let quick = Config::from_args(&T::parse_from(["t", "--quick"]).b).unwrap();
        assert_eq!(full.seq_size, 250 << 20);
        assert_eq!(full.runs, 3);
        assert!(quick.seq_size < full.seq_size);
        assert!(quick.tree_files < full.tree_files);
        assert!(quick.ramfs_bytes < full.ramfs_bytes);
        assert!(quick.small_files < full.small_files);
        assert!(quick.bigdir_entries < full.bigdir_entries);
        assert!(quick.runs < full.runs);
    }

    #[test]
    fn explicit_options_win_and_bad_ones_are_refused() {
        let a = T::parse_from(["t", "seq", "--quick", "--size", "8M", "--runs", "5"]).b;
        assert_eq!(a.which, Which::Seq);
        let c = Config::from_args(&a).unwrap();
        assert_eq!((c.seq_size, c.runs), (8 << 20, 5));
        assert!(Config::from_args(&T::parse_from(["t", "--runs", "0"]).b).is_err());
        assert!(Config::from_args(&T::parse_from(["t", "--tree", "/no/such/dir"]).b).is_err());
        let no_mkfs = T::parse_from(["t", "--mkfs-erofs", "/no/such/mkfs.erofs"]).b;
        assert!(Config::from_args(&no_mkfs).is_err());
        let mkfs = T::parse_from(["t", "--mkfs-erofs", "/bin/true"]).b;
        let c = Config::from_args(&mkfs).unwrap();
        assert_eq!(
            c.mkfs_erofs.as_deref(),
            Some(std::path::Path::new("/bin/true"))
        );
        assert!(T::try_parse_from(["t", "everything"]).is_err());
        assert!(T::try_parse_from(["t", "--size", "lots"]).is_err());
    }
}
