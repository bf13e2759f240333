//! What foliofs's tests and its bench share, so that each is written once:
//!
//! - [`weed`]: a SeaweedFS (`weed mini`) of the caller's own on loopback,
//!   every port its own, with objects put in it signed or through its
//!   filer;
//! - [`proxy`]: a fault-injecting HTTP proxy to put in front of it;
//! - [`data`]: seeded files and trees, the same bytes on every machine;
//! - [`folios`]: the folio sizes that hold a file in the page cache;
//! - [`mapping`]: a shared mapping of a file, unmapped when dropped.
//!
//! Not published: it exists for this workspace's tests and `foliofs bench`.

#![warn(missing_docs)]

pub mod data;
pub mod folios;
pub mod mapping;
pub mod proxy;
pub mod registry;
pub mod weed;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Waits, polling every few milliseconds, until `cond` holds, and fails
/// the test naming `what` if it does not within `within`.
pub fn wait_until(what: &str, within: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !cond() {
        assert!(Instant::now() < deadline, "not within {within:?}: {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A program on `PATH`, or one that `cargo install` put in `~/.cargo/bin`
/// (pjdfstest, fsx) when that is not on `PATH`.
pub fn find_program(name: &str) -> Option<PathBuf> {
    let on_path = std::env::var_os("PATH")
        .map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(name))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let homes = home
        .iter()
        .map(|h| Path::new(h).join(".cargo/bin").join(name));
    on_path.into_iter().chain(homes).find(|p| p.is_file())
}
