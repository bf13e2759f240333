//! `foliofs mkfs romfs SOURCE IMAGE`.

use std::path::PathBuf;

use anyhow::{bail, Context};
use foliofs_romfs::mkfs::{self, MkfsOptions, Progress};

use crate::progress;

/// A byte count by the rules every foliofs option shares (binary K to E
/// suffixes); blanks around it are allowed, as they always were here.
fn parse_size(s: &str) -> Result<u64, foliofs_vfs::options::SizeError> {
    foliofs_vfs::options::parse_size(s.trim())
}

#[derive(clap::Args, Debug)]
pub struct RomfsArgs {
    /// Volume name (default "foliofs"; at most 127 bytes).
    #[arg(long, short = 'V')]
    pub volume: Option<String>,
    /// Start every regular file's data on a multiple of N bytes (a power of
    /// two from 16 to 2M; K and M suffixes allowed).
    #[arg(long, short = 'a', value_name = "N")]
    pub align: Option<String>,
    /// `N,GLOB`: align the data of matching files (the header of other
    /// matching entries) to N bytes; the largest matching N wins. A GLOB
    /// containing '/' matches the path from the source root ("/dir/*.bin"),
    /// otherwise the file name.
    #[arg(long = "align-pattern", short = 'A', value_name = "N,GLOB")]
    pub align_pattern: Vec<String>,
    /// Leave out entries matching GLOB (matched as for --align-pattern); an
    /// excluded directory is left out entirely.
    #[arg(long, short = 'x', value_name = "GLOB")]
    pub exclude: Vec<String>,
    /// Print nothing but errors.
    #[arg(long, short = 'q')]
    pub quiet: bool,
    /// The directory tree to store.
    pub src: PathBuf,
    /// The image file to write.
    pub image: PathBuf,
}

pub fn run(a: RomfsArgs) -> anyhow::Result<i32> {
    let mut opts = MkfsOptions::default();
    if let Some(v) = &a.volume {
        opts.volume = v.as_bytes().to_vec();
    }
    if let Some(n) = &a.align {
        opts.align = parse_size(n).with_context(|| format!("--align {n}"))?;
    }
    for p in &a.align_pattern {
        let Some((n, glob)) = p.split_once(',') else {
            bail!("--align-pattern {p:?}: expected N,GLOB");
        };
        let n = parse_size(n).with_context(|| format!("--align-pattern {p}"))?;
        opts.align_patterns.push((n, glob.to_owned()));
    }
    opts.excludes = a.exclude.clone();
    let bar = if a.quiet {
        indicatif::ProgressBar::hidden()
    } else {
        // Reading the tree reports nothing; copying files reports bytes.
        progress::spinner(format!("reading {}", a.src.display()))
    };
    let mut copying = false;
    let mut progress = |p: &Progress| {
        bar.set_message(format!(
            "{}/{} files, {}/{} MiB",
            p.files_done,
            p.files_total,
            p.bytes_done >> 20,
            p.bytes_total >> 20
        ));
        if !copying {
            copying = true;
            progress::show_bar(&bar, p.bytes_total);
        }
        bar.set_position(p.bytes_done);
    };
    let res = mkfs::build(&a.src, &a.image, &opts, &mut progress);
    bar.finish_and_clear();
    let sum = match res {
        Ok(s) => s,
        Err(e) => {
            // Leave no half-written image behind.
            let _ = std::fs::remove_file(&a.image);
            return Err(e.into());
        }
    };
    if !a.quiet {
        eprintln!(
            "{}: romfs, {} bytes, {} entries ({} files, {} hard links), {} bytes of file data",
            a.image.display(),
            sum.image_size,
            sum.entries,
            sum.files,
            sum.hard_links,
            sum.data_bytes
        );
    }
    Ok(0)
}
