//! `foliofs ls`: list a directory of an image.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;

use foliofs_vfs::{Attr, FileSystem, FileType, Timespec};

use crate::inspect::{list, resolve};
use crate::open::ImageArgs;

#[derive(clap::Args, Debug)]
pub struct LsArgs {
    /// Long listing: mode, links, owner, size (or device), time, name.
    #[arg(short = 'l')]
    pub long: bool,
    /// List subdirectories too.
    #[arg(short = 'R')]
    pub recursive: bool,
    #[command(flatten)]
    pub image: ImageArgs,
    /// Path in the image (default: the root).
    pub path: Option<String>,
}

/// `foliofs ls [-l] [-R] IMAGE [PATH]`.
pub fn run(args: LsArgs) -> anyhow::Result<i32> {
    let image = args.image.open()?;
    let fs = image.fs();
    let fs = &*fs;
    let path = args.path.clone().unwrap_or_else(|| ".".into());
    let attr = resolve(fs, &path)?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    if attr.kind != FileType::Directory {
        let name = path.rsplit('/').next().unwrap_or(&path);
        print_entry(&mut out, fs, &attr, OsStr::new(name), args.long)?;
        out.flush()?;
        return Ok(0);
    }
    let mut errors = 0;
    if !args.recursive {
        for (name, ino, _) in list(fs, attr.ino)? {
            let a = fs.getattr(ino)?;
            print_entry(&mut out, fs, &a, &name, args.long)?;
        }
        out.flush()?;
        return Ok(0);
    }
    // Depth-first with an explicit stack; a directory is listed once even
    // when a damaged image links it from several places.
    let mut done = HashSet::from([attr.ino]);
    let mut stack = vec![(attr.ino, path.trim_end_matches('/').to_owned())];
    let mut first = true;
    while let Some((dir, shown)) = stack.pop() {
        if !first {
            writeln!(out)?;
        }
        first = false;
        writeln!(out, "{shown}:")?;
        let entries = match list(fs, dir) {
            Ok(e) => e,
            Err(e) => {
                out.flush()?;
                eprintln!(
                    "foliofs: {}: {shown}: {e}",
                    crate::open::shown(&args.image.image)
                );
                errors += 1;
                continue;
            }
        };
        let mut subdirs = Vec::new();
        for (name, ino, kind) in entries {
            let a = fs.getattr(ino)?;
            print_entry(&mut out, fs, &a, &name, args.long)?;
            if kind == FileType::Directory {
                let child = format!("{shown}/{}", name.to_string_lossy());
                if done.insert(ino) {
                    subdirs.push((ino, child));
                } else {
                    out.flush()?;
                    eprintln!("foliofs: {child}: directory already listed (loop or linked directory); not descending");
                    errors += 1;
                }
            }
        }
        stack.extend(subdirs.into_iter().rev());
    }
    out.flush()?;
    Ok(if errors > 0 { 1 } else { 0 })
}

fn print_entry(
    out: &mut impl Write,
    fs: &dyn FileSystem,
    a: &Attr,
    name: &OsStr,
    long: bool,
) -> anyhow::Result<()> {
    if !long {
        out.write_all(name.as_bytes())?;
        out.write_all(b"\n")?;
        return Ok(());
    }
    let size = match a.kind {
        FileType::BlockDevice | FileType::CharDevice => {
            format!("{}, {}", a.rdev.major, a.rdev.minor)
        }
        _ => a.size.to_string(),
    };
    write!(
        out,
        "{} {:>3} {:>5} {:>5} {:>10} {} ",
        mode_string(a),
        a.nlink,
        a.uid,
        a.gid,
        size,
        date(a.mtime)
    )?;
    out.write_all(name.as_bytes())?;
    if a.kind == FileType::Symlink {
        out.write_all(b" -> ")?;
        out.write_all(&fs.readlink(a.ino)?)?;
    }
    out.write_all(b"\n")?;
    Ok(())
}

/// `drwxr-xr-x` style.
fn mode_string(a: &Attr) -> String {
    let t = match a.kind {
        FileType::Directory => 'd',
        FileType::RegularFile => '-',
        FileType::Symlink => 'l',
        FileType::BlockDevice => 'b',
        FileType::CharDevice => 'c',
        FileType::Fifo => 'p',
        FileType::Socket => 's',
    };
    let p = u32::from(a.perm);
    let mut s = String::with_capacity(10);
    s.push(t);
    for (shift, special, lower, upper) in [
        (6, 0o4000, 's', 'S'),
        (3, 0o2000, 's', 'S'),
        (0, 0o1000, 't', 'T'),
    ] {
        let bits = (p >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(match (bits & 1 != 0, p & special != 0) {
            (true, true) => lower,
            (false, true) => upper,
            (true, false) => 'x',
            (false, false) => '-',
        });
    }
    s
}

/// `YYYY-MM-DD HH:MM` in UTC.
fn date(t: Timespec) -> String {
    utc_minutes(t.sec)
}

/// `YYYY-MM-DD HH:MM` in UTC, of seconds since the epoch.
pub(crate) fn utc_minutes(sec: i64) -> String {
    let days = sec.div_euclid(86_400);
    let secs = sec.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (proleptic Gregorian).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}",
        secs / 3600,
        secs % 3600 / 60
    )
}
