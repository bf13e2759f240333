//! Sources that another layer knows how to fetch and check: a scheme
//! (such as a registry's lazily read image layers) registered once per
//! process with the function that opens its sources. Such an object is
//! read as any remote object is (chunks, flights, read-ahead, the disk
//! cache, `prefetch=all`), through the backend its opener returns; the
//! block layer knows nothing of what stands behind it.

use std::sync::{Mutex, OnceLock};

use super::client::Backend;
use super::options::RemoteOptions;

/// Checks a chunk read back from the disk cache, once per process, before
/// a byte of it is served: for a source whose every block must be
/// verified wherever it comes from (a dm-verity tree's), not only as it
/// is fetched.
pub trait Verify: Send + Sync {
    /// `Ok` when `chunk`, the object's bytes from `start`, is right; else
    /// why not.
    fn verify(&self, start: u64, chunk: &[u8]) -> Result<(), String>;
}

/// A source its scheme's opener opened.
pub struct Opened {
    /// What fetches its bytes, each fetch checked before it returns.
    pub backend: Box<dyn Backend>,
    /// What the disk cache keys it by (content-addressed where it can be,
    /// so that two names of the same bytes share their chunks).
    pub identity: String,
    /// How messages name it.
    pub shown: String,
    /// The fetch size its checks need (each fetch one checked unit).
    pub chunk: u32,
    /// The check of chunks read back from the disk cache, if any.
    pub verify: Option<Box<dyn Verify>>,
    /// Most chunks one fetch may take when they follow each other in a
    /// queue (read-ahead, a read across chunks, `prefetch=all`): 1 for a
    /// backend whose every request costs the same whatever its length.
    pub max_run: u32,
    /// Chunks the opener fetched and checked already (each at a multiple
    /// of `chunk`, whole): into the disk cache before the first read.
    pub preload: Vec<(u64, Vec<u8>)>,
}

/// Opens a source of a registered scheme, whose chunks go to the disk
/// cache in `cache_dir` (where it may keep what it needs to open again
/// without its server): one line on failure.
pub type Opener =
    fn(source: &str, opts: &RemoteOptions, cache_dir: &std::path::Path) -> Result<Opened, String>;

fn schemes() -> &'static Mutex<Vec<(&'static str, Opener)>> {
    static S: OnceLock<Mutex<Vec<(&'static str, Opener)>>> = OnceLock::new();
    S.get_or_init(Default::default)
}

/// Has sources that start with `prefix` (such as `"erofs-layer:"`)
/// opened by `opener` from now on in this process.
pub fn register(prefix: &'static str, opener: Opener) {
    let mut s = schemes().lock().unwrap_or_else(|p| p.into_inner());
    if !s.iter().any(|(p, _)| *p == prefix) {
        s.push((prefix, opener));
    }
}

/// The opener of `source`'s scheme, if one is registered.
pub(crate) fn opener(source: &[u8]) -> Option<Opener> {
    let s = schemes().lock().unwrap_or_else(|p| p.into_inner());
    s.iter()
        .find(|(p, _)| source.len() > p.len() && source.starts_with(p.as_bytes()))
        .map(|&(_, o)| o)
}
