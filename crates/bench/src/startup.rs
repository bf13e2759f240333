//! Container start-up: every file of a tree read from an image right after
//! it was unpacked (1st run, a fresh mount of an image in the page cache),
//! then again on the same mount (later run). One image per format, built
//! once, so that a start-up profile recorded on it replays on every mount
//! of it; rows are measured in interleaved rounds, as counted.rs does.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Result;

use crate::counted::{measure, trip_notes, Activated, Plan, Prime, Step, Trips};
use crate::env::BenchEnv;
use crate::images::source_tree;
use crate::mount::{How, Mounted};
use crate::report::{Column, Row, Section, Unit};
use crate::rows::{
    cold_note, progress, read_ahead_note, unavailable, Image, NoImage, NO_MKFS_EROFS,
};
use crate::timing::{time_cmd, time_read_tree};
use crate::Config;

/// Builds an image with `cmd` into `img`; the build time goes in `built`.
fn build(cmd: &mut Command, img: PathBuf, what: &str, built: &mut Vec<String>) -> Image {
    match time_cmd(cmd) {
        Ok(s) => {
            built.push(format!("{what} {s:.2} s"));
            Ok(img)
        }
        Err(e) => Err(NoImage::failed(&e)),
    }
}

/// Records a start-up profile of `image`: a buffered foliofs mount with
/// `record=` (which pushes nothing, so every read shows) reads the tree
/// once, as the 1st runs do, and writes the profile as it unmounts.
fn record_profile(env: &BenchEnv, image: &Path, profile: &Path) -> Result<()> {
    let how = How::Foliofs {
        fstype: "erofs",
        opts: format!("record={}", profile.display()),
    };
    let _ = std::fs::remove_file(profile);
    {
        let m = Mounted::new(env, &how, image, &env.fresh_dir("mnt")?)?;
        time_read_tree(&m.dir)?;
    }
    if !profile.is_file() {
        anyhow::bail!("the recording mount wrote no {}", profile.display());
    }
    Ok(())
}

/// The start-up columns: a fresh mount's first run, then a later one. The
/// unpack section follows each way of unpacking with the same two.
pub(crate) fn run_columns() -> [Column; 2] {
    [
        Column {
            key: "first",
            label: "1st run",
            unit: Unit::Seconds,
        },
        Column {
            key: "next",
            label: "later run",
            unit: Unit::Seconds,
        },
    ]
}

/// The EROFS seed's container start-up table, with what pushing and
/// start-up profiles do to it.
pub fn startup(env: &BenchEnv, cfg: &Config) -> Result<Section> {
    let (src, stats) = source_tree(env, cfg, "startup", cfg.startup_files, cfg.startup_bytes)?;
    let columns = columns();
    let images = build_images(env, cfg, &src);
    let small_pages = small_pages_copy(env, cfg, &src);
    let plans = plans(&src, &images, &small_pages);
    let (rows, trips, activated) = run_rows(env, cfg, &src, &plans, &small_pages);
    let (reference, ref_name, pairs) = reference_and_pairs(&rows);
    let mut notes = vec![format!(
        "start-up set: every file of {} files, {} MB, read in directory order; each image built once ({}); 1st run = a fresh mount of an image already in the page cache (as right after unpacking it), later run = the same again on that mount; {} rounds, each measuring every row once in this order; the profile was recorded once, before the rounds, by a buffered foliofs mount with record= reading the set; ratios are to {ref_name}; pair lines give the median of the rounds' ratios and best over best, directio rows against the kernel's directio too",
        stats.files,
        stats.bytes / 1_000_000,
        if images.built.is_empty() { "none".to_owned() } else { images.built.join(", ") },
        cfg.runs,
    )];
    notes.push(small_pages_note(&small_pages));
    notes.extend(activation_note(&activated));
    notes.extend(cold_note(env));
    notes.extend(crate::rows::uring_note(env));
    notes.extend(read_ahead_note(env));
    notes.extend(trip_notes(&trips, Some((stats.files, "file"))));
    Ok(Section {
        name: "startup",
        title: "startup: start a container image right after unpacking it (EROFS buffered vs direct I/O, pushing, start-up profiles)".into(),
        columns,
        rows,
        reference,
        pairs,
        notes,
    })
}

fn columns() -> Vec<Column> {
    let mut columns = run_columns().to_vec();
    // The two runs together: the 4 KiB-page floor bounds this column, not
    // each run alone (see `activation_note`).
    columns.push(Column {
        key: "both",
        label: "1st + later",
        unit: Unit::Seconds,
    });
    columns
}

/// The images the rows read, each built once.
struct Images {
    erofs: Image,
    romfs: Image,
    /// The EROFS image, once its start-up profile is recorded.
    recorded: Image,
    profile: PathBuf,
    /// Each build's time, for the notes.
    built: Vec<String>,
}

fn build_images(env: &BenchEnv, cfg: &Config, src: &Path) -> Images {
    progress(cfg, "[startup] building the images");
    let mut built = Vec::new();
    let erofs: Image = match &cfg.mkfs_erofs {
        // -T0: every build of a tree is the same image but for its UUID;
        // it is built once anyway, so the profile always matches it.
        Some(mkfs) => build(
            Command::new(mkfs)
                .args(["--quiet", "-T0"])
                .arg(env.dir.join("startup.erofs"))
                .arg(src),
            env.dir.join("startup.erofs"),
            "mkfs.erofs",
            &mut built,
        ),
        None => Err(NoImage::skip(NO_MKFS_EROFS)),
    };
    let romfs = build(
        Command::new(&env.exe)
            .args(["mkfs", "romfs"])
            .arg(src)
            .arg(env.dir.join("startup.romfs")),
        env.dir.join("startup.romfs"),
        "foliofs mkfs romfs",
        &mut built,
    );
    // The profile every prefetch row replays, recorded before the rounds.
    let profile = env.dir.join("startup.profile");
    let recorded = recorded(env, cfg, &erofs, &profile);
    Images {
        erofs,
        romfs,
        recorded,
        profile,
        built,
    }
}

/// The EROFS image with a start-up profile recorded into `profile`, or
/// why there is none.
fn recorded(env: &BenchEnv, cfg: &Config, erofs: &Image, profile: &Path) -> Image {
    match erofs {
        Ok(img) => {
            let how = How::Foliofs {
                fstype: "erofs",
                opts: String::new(),
            };
            if let Some(why) = unavailable(env, &how) {
                Err(NoImage::skip(why))
            } else {
                progress(cfg, "[startup] recording the start-up profile");
                record_profile(env, img, profile)
                    .map(|()| img.clone())
                    .map_err(|e| NoImage::failed(&e.context("recording the profile")))
            }
        }
        Err(no) => Err(no.clone()),
    }
}

/// The rows in table order; [`reference_and_pairs`] counts on it.
fn plans(
    src: &Path,
    images: &Images,
    small_pages: &Result<(Mounted, String), NoImage>,
) -> Vec<Plan> {
    let Images {
        erofs,
        romfs,
        recorded,
        profile,
        ..
    } = images;
    let prefetch = format!("prefetch={}", profile.display());
    let foliofs = |label: &str, fstype: &'static str, opts: &str, image: &Image| Plan {
        label: label.into(),
        kind: "foliofs",
        how: How::Foliofs {
            fstype,
            opts: opts.into(),
        },
        image: image.clone(),
    };
    let kernel = |label: &str, opts: &str| Plan {
        label: label.into(),
        kind: "kernel",
        how: How::KernelFile {
            fstype: "erofs",
            opts: opts.into(),
        },
        image: erofs.clone(),
    };
    // Indices below: 0 and 1 are the kernel's, 2..=4 buffered foliofs
    // EROFS, 5..=7 its directio rows.
    vec![
        kernel("kernel erofs, file-backed buffered", ""),
        kernel("kernel erofs, file-backed directio", "directio"),
        foliofs("foliofs erofs, buffered nopush", "erofs", "nopush", erofs),
        foliofs("foliofs erofs, buffered push", "erofs", "", erofs),
        foliofs(
            "foliofs erofs, buffered prefetch=profile",
            "erofs",
            &prefetch,
            recorded,
        ),
        foliofs(
            "foliofs erofs, directio nopush",
            "erofs",
            "directio,nopush",
            erofs,
        ),
        foliofs("foliofs erofs, directio push", "erofs", "directio", erofs),
        foliofs(
            "foliofs erofs, directio prefetch=profile",
            "erofs",
            &format!("directio,{prefetch}"),
            recorded,
        ),
        foliofs("foliofs romfs 1K, push", "romfs", "blocksize=1K", romfs),
        foliofs(
            "foliofs romfs largeblocks, push",
            "romfs",
            "largeblocks",
            romfs,
        ),
        // The buffered push row over FUSE's io_uring, where the run has it.
        foliofs(
            "foliofs erofs, buffered push, io_uring",
            "erofs",
            "io_uring",
            erofs,
        ),
        Plan {
            label: SMALL_PAGES_LABEL.into(),
            kind: "baseline",
            how: How::Plain,
            image: small_pages
                .as_ref()
                .map(|(m, _)| m.dir.clone())
                .map_err(Clone::clone),
        },
        Plan {
            label: "plain directory (page-cached)".into(),
            kind: "baseline",
            how: How::Plain,
            image: Ok(src.to_owned()),
        },
    ]
}

/// Both runs of every row in interleaved rounds, with the "both" column
/// added.
fn run_rows(
    env: &BenchEnv,
    cfg: &Config,
    src: &Path,
    plans: &[Plan],
    small_pages: &Result<(Mounted, String), NoImage>,
) -> (Vec<Row>, Vec<Trips>, Vec<Activated>) {
    let read = |mnt: &Path| time_read_tree(mnt);
    // On the tmpfs row a 1st run fills its 4 KiB pages from the source's
    // page cache first, as a FUSE server's replies fill a mount's.
    let pages4k = small_pages.as_ref().ok().map(|(m, _)| m.dir.clone());
    let first = |mnt: &Path| match &pages4k {
        Some(d) if d == mnt => time_fill_and_read(src, mnt),
        _ => time_read_tree(mnt),
    };
    let steps = [
        Step {
            key: "first",
            fresh: true,
            run: &first,
        },
        Step {
            key: "next",
            fresh: false,
            run: &read,
        },
    ];
    let (mut rows, trips, activated) = measure(env, cfg, "startup", plans, &steps, Prime::Warm);
    rows.iter_mut().for_each(add_both);
    (rows, trips, activated)
}

/// The reference row and its name for the notes, and the pairs: each
/// foliofs row against the reference (directio ones against the kernel's
/// directio too), and the default mount against its 4 KiB-page floor.
fn reference_and_pairs(rows: &[Row]) -> (usize, &'static str, Vec<(usize, usize)>) {
    let (kb, kd) = (0, 1);
    let directio = 5..=7;
    // A user has no kernel EROFS rows; the directory is then the kernel's
    // own file system beside foliofs.
    let kernel_ok = rows[kb].note.is_none();
    let (reference, ref_name) = if kernel_ok {
        (kb, "the kernel's buffered file-backed EROFS")
    } else {
        (
            rows.len() - 1,
            "the plain directory (the kernel rows need root)",
        )
    };
    let floor = rows.len() - 2;
    let mut pairs = Vec::new();
    for i in 2..floor {
        if directio.contains(&i) && rows[kd].note.is_none() {
            pairs.push((i, kd));
        }
        pairs.push((i, reference));
    }
    if rows[floor].note.is_none() {
        // The buffered push row, the default mount, against its floor.
        pairs.push((3, floor));
        pairs.push((floor, reference));
    }
    (reference, ref_name, pairs)
}

fn small_pages_note(small_pages: &Result<(Mounted, String), NoImage>) -> String {
    match small_pages {
        Ok((_, folios)) => format!("{SMALL_PAGES_LABEL}: the page cache's own share of a run through FUSE, with no request: Linux 6.18 gives a FUSE file's page cache 4 KiB pages only, where the kernel's EROFS and the disk's file system use large folios; this row's 1st run copies the set into an emptied tmpfs mounted with huge=never ({folios}) with copy_file_range, from the source's page cache, and reads it, and its later run reads it again; a foliofs mount's two runs together cost at least this row's 1st + later, which no server can lower (each page made, filled, read twice and moved to the active LRU list once), but its runs split that work differently (below)"),
        Err(no) => format!("{SMALL_PAGES_LABEL}: not measured: {}", no.why),
    }
}

const SMALL_PAGES_LABEL: &str = "tmpfs, 4 KiB pages (page-cached)";

/// The "both" column: each round's 1st run plus its later run.
fn add_both(row: &mut Row) {
    let (Some(first), Some(next)) = (row.runs.get("first"), row.runs.get("next")) else {
        return;
    };
    if first.len() == next.len() {
        let both = first.iter().zip(next).map(|(a, b)| a + b).collect();
        row.runs.insert("both", both);
    }
}

/// Which run of each row moved its pages to the active LRU list: a page
/// moves on its second read, so the run that pays depends on what touched
/// the page first, and that differs between the 4 KiB-page floor (its copy)
/// and a FUSE mount (its 1st run's read).
fn activation_note(activated: &[Activated]) -> Option<String> {
    if activated.is_empty() {
        return None;
    }
    let columns = run_columns();
    let mut rows: Vec<(&str, Vec<String>)> = Vec::new();
    for a in activated {
        let run = columns
            .iter()
            .find(|c| c.key == a.key)
            .map_or(a.key, |c| c.label);
        let entry = format!("{run} {}", a.pages);
        match rows.iter_mut().find(|(r, _)| *r == a.row) {
            Some((_, runs)) => runs.push(entry),
            None => rows.push((&a.row, vec![entry])),
        }
    }
    let list = rows
        .iter()
        .map(|(r, runs)| format!("{r}: {}", runs.join(", ")))
        .collect::<Vec<_>>()
        .join("; ");
    Some(format!(
        "pages moved to the active LRU list in the last round (pgactivate of /proc/vmstat, machine-wide; the kernel moves a cached page there on its second read): {list}; {SMALL_PAGES_LABEL} pays the moves in its 1st run, its copy being each page's first touch, a FUSE mount mostly in its later run, its 1st run's read being the first, so the later-run column holds work for foliofs that it does not for the floor row, and the 1st + later column compares like with like"
    ))
}

/// A copy of the start-up set in a tmpfs of 4 KiB pages, mounted for the
/// section (unmounted when the returned mount drops), and the folios the
/// kernel gave the copy's largest file.
fn small_pages_copy(
    env: &BenchEnv,
    cfg: &Config,
    src: &Path,
) -> Result<(Mounted, String), NoImage> {
    if !env.root {
        return Err(NoImage::skip("mounting a tmpfs needs root"));
    }
    progress(cfg, "[startup] copying the set into a tmpfs of 4 KiB pages");
    let made = (|| -> Result<(Mounted, String)> {
        let dir = env.fresh_dir("pages4k")?;
        let how = How::KernelMem {
            fstype: "tmpfs",
            opts: "huge=never,mode=0755".into(),
        };
        let m = Mounted::new(env, &how, Path::new("none"), &dir)?;
        copy_tree(src, &m.dir)?;
        let folios = largest_file_folios(&m.dir)?;
        Ok((m, folios))
    })();
    made.map_err(|e| NoImage::failed(&e.context("copying the start-up set into a tmpfs")))
}

/// The folio sizes of the largest file under `dir`, as "4Kx1234".
fn largest_file_folios(dir: &Path) -> Result<String> {
    fn largest(dir: &Path, best: &mut Option<(u64, PathBuf)>) -> Result<()> {
        for e in std::fs::read_dir(dir)? {
            let e = e?;
            let meta = e.metadata()?;
            if meta.is_dir() {
                largest(&e.path(), best)?;
            } else if meta.is_file() && best.as_ref().is_none_or(|(n, _)| meta.len() > *n) {
                *best = Some((meta.len(), e.path()));
            }
        }
        Ok(())
    }
    let mut best = None;
    largest(dir, &mut best)?;
    let Some((len, path)) = best else {
        return Ok("no files".into());
    };
    // Its pages are in the cache from the copy; the census counts those.
    let sizes = foliofs_testkit::folios::sizes(&path)?;
    let folios = sizes
        .iter()
        .rev()
        .map(|(size, n)| format!("{}x{n}", foliofs_vfs::options::format_size(*size)))
        .collect::<Vec<_>>()
        .join(" ");
    Ok(format!(
        "its largest file, {len} bytes, is in folios of {folios}"
    ))
}

/// Empties `dir`, then times copying `src` into it (each file with
/// `std::fs::copy`, which the kernel does from page cache to page cache)
/// and reading it all back.
fn time_fill_and_read(src: &Path, dir: &Path) -> Result<f64> {
    crate::env::empty_dir(dir)?;
    let start = std::time::Instant::now();
    copy_tree(src, dir)?;
    time_read_tree(dir)?;
    Ok(start.elapsed().as_secs_f64())
}

fn copy_tree(src: &Path, dst: &Path) -> Result<()> {
    for e in std::fs::read_dir(src)? {
        let e = e?;
        let to = dst.join(e.file_name());
        let t = e.file_type()?;
        if t.is_dir() {
            std::fs::create_dir(&to)?;
            copy_tree(&e.path(), &to)?;
        } else if t.is_file() {
            std::fs::copy(e.path(), &to)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_both_column_is_each_rounds_two_runs_and_needs_both() {
        let mut row = Row::new("r", "foliofs");
        row.runs.insert("first", vec![0.30, 0.25]);
        row.runs.insert("next", vec![0.06, 0.08]);
        add_both(&mut row);
        let both = &row.runs["both"];
        assert_eq!(both.len(), 2);
        assert!((both[0] - 0.36).abs() < 1e-12 && (both[1] - 0.33).abs() < 1e-12);
        // A row whose later run failed in a round has no sum to give.
        let mut short = Row::new("s", "foliofs");
        short.runs.insert("first", vec![0.30, 0.25]);
        short.runs.insert("next", vec![0.06]);
        add_both(&mut short);
        assert!(!short.runs.contains_key("both"));
    }

    #[test]
    fn the_activation_note_gives_each_rows_runs_in_order() {
        assert!(activation_note(&[]).is_none());
        let a = |row: &str, key, pages| Activated {
            row: row.into(),
            key,
            pages,
        };
        let note = activation_note(&[
            a("foliofs", "first", 16711),
            a("foliofs", "next", 53134),
            a("tmpfs", "first", 72982),
            a("tmpfs", "next", 0),
        ])
        .unwrap();
        assert!(
            note.contains(
                "foliofs: 1st run 16711, later run 53134; tmpfs: 1st run 72982, later run 0;"
            ),
            "{note}"
        );
    }
}
