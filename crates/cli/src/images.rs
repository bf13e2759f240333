//! `foliofs images` and `foliofs rmi`: the store's images, by the names
//! they were prepared under, listed and removed; and the record a
//! preparation leaves (see `foliofs_oci::catalog`).

use std::io::Write;
use std::path::Path;

use anyhow::bail;
use foliofs_oci::catalog::{is_record_file, Catalog, Damaged, Entry};
use foliofs_oci::{Image, Prepared, Store};

/// List the store's images.
#[derive(clap::Args, Debug)]
pub struct ImagesArgs {
    /// Write the list as JSON, for scripts.
    #[arg(long)]
    pub json: bool,
}

/// Remove images from the store.
#[derive(clap::Args, Debug)]
pub struct RmiArgs {
    /// The images: a name as `foliofs images` lists it (`oci:DIR[:TAG]`
    /// also as a relative path), an id (the manifest digest, or 4 or more
    /// of its first hex digits), or a record's file (`ref-<hex>.json`,
    /// as a damaged one is named).
    #[arg(required_unless_present = "prune")]
    pub names: Vec<String>,
    /// Also remove everything no record names: layer and merged images,
    /// and temporary files of builds left for over 10 minutes.
    #[arg(long)]
    pub prune: bool,
}

/// Records that `reference` names `image`, as prepared.
pub fn record(
    store: &Store,
    reference: &str,
    image: &Image,
    prepared: &Prepared,
) -> anyhow::Result<()> {
    let name = name_of(reference).unwrap_or_else(|| reference.to_owned());
    // The image is there to mount whether or not it is recorded (a store
    // this user may only read takes no record).
    if let Err(e) = store.record(&name, image, prepared) {
        eprintln!(
            "foliofs: warning: {name} is not recorded in the store (foliofs images will not list it): {}",
            foliofs_vfs::chain_line(&e)
        );
    }
    Ok(())
}

/// The name a record keeps for `reference`: a layout's made absolute, a
/// registry's spelled out in full (host, repository and tag), so that
/// two spellings of one image are one name.
fn name_of(reference: &str) -> Option<String> {
    if let Some(Ok(r)) = foliofs_oci::registry::Reference::parse(reference) {
        return Some(r.to_string());
    }
    let (dir, tag) = foliofs_oci::parse_reference(reference)?;
    Some(foliofs_oci::catalog::oci_name(&dir, tag.as_deref()))
}

fn warn_damaged(damaged: &[Damaged]) {
    for d in damaged {
        eprintln!(
            "foliofs: warning: {}: {}; skipped (foliofs rmi {} removes it)",
            d.file, d.why, d.file
        );
    }
}

pub fn run_images(args: ImagesArgs) -> anyhow::Result<i32> {
    let store = crate::image::store()?;
    let listing = store.listing()?;
    warn_damaged(&listing.damaged);
    let mut out = std::io::stdout().lock();
    if args.json {
        writeln!(out, "{}", listing.to_json())?;
        return Ok(0);
    }
    let rows: Vec<[String; 5]> = listing
        .images
        .iter()
        .map(|i| {
            [
                i.name.clone(),
                short_id(&i.id).to_owned(),
                i.layers.to_string(),
                human(i.size),
                utc(i.prepared),
            ]
        })
        .collect();
    let head = ["NAME", "ID", "LAYERS", "SIZE", "PREPARED"];
    let mut widths = head.map(str::len);
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: [&str; 5]| {
        let mut s = String::new();
        for (i, (c, w)) in cells.iter().zip(widths).enumerate() {
            if i == 4 {
                s.push_str(c);
            } else if i == 2 || i == 3 {
                s.push_str(&format!("{c:>w$}  "));
            } else {
                s.push_str(&format!("{c:<w$}  "));
            }
        }
        s
    };
    writeln!(out, "{}", line(head))?;
    for r in &rows {
        writeln!(out, "{}", line(r.each_ref().map(String::as_str)))?;
    }
    writeln!(
        out,
        "{} image{}, {} on disk (layers they share counted once)",
        rows.len(),
        if rows.len() == 1 { "" } else { "s" },
        human(listing.total_size)
    )?;
    Ok(0)
}

pub fn run_rmi(args: RmiArgs) -> anyhow::Result<i32> {
    let store = crate::image::store()?;
    let _lock = store.lock_exclusive(&|| {
        eprintln!("foliofs: waiting for the store's lock (an image is being prepared)")
    })?;
    let catalog = store.catalog()?;
    warn_damaged(&catalog.damaged);
    // Every name found before anything is removed: one that is not
    // changes nothing.
    let mut files: Vec<String> = Vec::new();
    for n in &args.names {
        for f in find(&catalog, store.dir(), n)? {
            if !files.contains(&f) {
                files.push(f);
            }
        }
    }
    let removed = store.remove(&files, args.prune)?;
    let mut out = std::io::stdout().lock();
    for f in &removed {
        let what = catalog
            .entries
            .iter()
            .find(|e| &e.file == f)
            .map_or(String::new(), |e| format!(" ({})", e.record.name));
        writeln!(out, "removed {f}{what}")?;
    }
    Ok(0)
}

/// The record files `n` names in `catalog`.
fn find(catalog: &Catalog, dir: &Path, n: &str) -> anyhow::Result<Vec<String>> {
    let by = |f: &dyn Fn(&Entry) -> bool| -> Vec<String> {
        catalog
            .entries
            .iter()
            .filter(|e| f(e))
            .map(|e| e.file.clone())
            .collect()
    };
    let named = by(&|e| e.record.name == n);
    if !named.is_empty() {
        return Ok(named);
    }
    if is_record_file(n) {
        if dir.join(n).is_file() {
            return Ok(vec![n.to_owned()]);
        }
        bail!("{n}: no such record in the store {}", dir.display());
    }
    if let Some(name) = name_of(n) {
        let named = by(&|e| e.record.name == name);
        if !named.is_empty() {
            return Ok(named);
        }
        bail!(
            "{n}: no image of that name in the store {} (foliofs images lists them)",
            dir.display()
        );
    }
    let hex = n.strip_prefix("sha256:").unwrap_or(n);
    if hex.len() >= 4 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        let ids = by(&|e| e.manifest.hex().starts_with(hex));
        let distinct: std::collections::BTreeSet<&str> = catalog
            .entries
            .iter()
            .filter(|e| e.manifest.hex().starts_with(hex))
            .map(|e| e.manifest.hex())
            .collect();
        if distinct.len() > 1 {
            bail!("{n}: an id of {} images; give more of it", distinct.len());
        }
        if !ids.is_empty() {
            return Ok(ids);
        }
    }
    bail!(
        "{n}: no image of that name or id in the store {} (foliofs images lists them)",
        dir.display()
    )
}

/// The id as the table shows it: the digest's first 12 hex digits.
fn short_id(id: &str) -> &str {
    let hex = id.strip_prefix("sha256:").unwrap_or(id);
    hex.get(..12).unwrap_or(hex)
}

/// `n` bytes in binary units, one decimal.
fn human(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

/// Seconds since the epoch as a UTC date and time.
fn utc(secs: u64) -> String {
    format!(
        "{} UTC",
        crate::ls::utc_minutes(i64::try_from(secs).unwrap_or(i64::MAX))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_and_sizes_read_as_people_write_them() {
        assert_eq!(utc(0), "1970-01-01 00:00 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00 UTC");
        assert_eq!(utc(1_700_000_000), "2023-11-14 22:13 UTC");
        assert_eq!(human(1000), "1000 B");
        assert_eq!(human(1536), "1.5 KiB");
        assert_eq!(human(3 << 30), "3.0 GiB");
    }
}
