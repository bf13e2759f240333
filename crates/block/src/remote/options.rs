//! What a mount of a remote image may set with `-o`.

use std::path::PathBuf;
use std::time::Duration;

/// Default chunk: the unit of ranged GETs and of the disk cache. On
/// loopback a 1 MiB GET takes about 5 times a 4 KiB one (8.1 ms against
/// 1.6 ms to SeaweedFS here), and a real object store's first byte costs
/// tens of milliseconds more, so smaller chunks pay that latency many
/// times over for a sequential reader. Larger ones fetch more than a
/// start-up reads when it touches scattered small files, and 1 MiB is
/// also EROFS's largest compressed cluster, so one cluster is at most two
/// GETs.
pub const DEFAULT_CHUNK: u32 = 1 << 20;

/// How a remote image is fetched and cached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteOptions {
    /// Bytes per ranged GET and per cache entry (`chunk=SIZE`): a power of
    /// two from 64 KiB to 16 MiB.
    pub chunk: u32,
    /// The cache directory (`cache=DIR`); `None` for the default:
    /// `$XDG_CACHE_HOME/foliofs` (or `~/.cache/foliofs`), `/var/cache/foliofs`
    /// for root.
    pub cache_dir: Option<PathBuf>,
    /// Bytes the cache directory may hold (`cache_size=SIZE`); `None` for
    /// the default.
    pub cache_size: Option<u64>,
    /// Fetch the whole object in the background (`prefetch=all`), after the
    /// reads that someone waits for.
    pub prefetch_all: bool,
    /// S3 endpoint (`endpoint=URL`); `None` for AWS's.
    pub endpoint: Option<String>,
    /// S3 region (`region=NAME`); `None` for the environment's or
    /// `~/.aws/config`'s, else `us-east-1`.
    pub region: Option<String>,
    /// Path-style S3 addressing (`path_style`): `ENDPOINT/BUCKET/KEY`
    /// rather than `BUCKET.ENDPOINT/KEY`.
    pub path_style: bool,
    /// Allow plain `http://` URLs and endpoints (`insecure_http`).
    pub insecure_http: bool,
    /// The longest one read waits for the backend, across retries
    /// (`timeout=SECONDS`), before it fails with EIO.
    pub timeout: Duration,
}

impl Default for RemoteOptions {
    fn default() -> Self {
        RemoteOptions {
            chunk: DEFAULT_CHUNK,
            cache_dir: None,
            cache_size: None,
            prefetch_all: false,
            endpoint: None,
            region: None,
            path_style: false,
            insecure_http: false,
            timeout: Duration::from_secs(30),
        }
    }
}
