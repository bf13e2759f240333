//! Opening a remote object: its location and credentials, the digest to
//! check it against, the HEAD that fixes its size and version, its disk
//! cache, and the fetch threads.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

use foliofs_vfs::Result;

use super::{
    open_error, registry, release_unused, RemoteObject, Shared, State, Stream, MAX_AHEAD,
    MAX_CHUNKS, STREAMS, WORKERS,
};
use crate::remote::cache::DiskCache;
use crate::remote::client::{retrying, Backend, HttpBackend, RetryPolicy};
use crate::remote::credentials::AwsConfig;
use crate::remote::digest::{self, Digest};
use crate::remote::options::{self, check_chunk};
use crate::remote::scheme::{self, Verify};
use crate::remote::stats::Counters;
use crate::remote::url::{parse, redact, Location};
use crate::remote::RemoteOptions;

/// The sources being opened now, each with the lock its opens take.
fn opening() -> &'static Mutex<HashMap<String, Arc<Mutex<()>>>> {
    static O: OnceLock<Mutex<HashMap<String, Arc<Mutex<()>>>>> = OnceLock::new();
    O.get_or_init(Default::default)
}

/// Where an object's digest comes from: its backend and its URL as shown.
type DigestSource = (Box<dyn Backend>, String);

impl RemoteObject {
    /// Opens `source` (an `s3://`, `https://` or `http://` URL) as `opts`
    /// say, or returns the object this process already opened so.
    pub fn open(source: &str, opts: &RemoteOptions) -> Result<Arc<RemoteObject>> {
        let key = format!("{source}\n{opts:?}");
        if let Some(o) = registry().lock().unwrap().get(&key) {
            return Ok(o.clone());
        }
        release_unused();
        // One open of a source at a time, but opens of different ones side
        // by side: an open costs requests (a merge opens its layers eight
        // at once), which a lock over every open would make one by one.
        let slot = opening()
            .lock()
            .unwrap()
            .entry(key.clone())
            .or_default()
            .clone();
        let one = slot.lock().unwrap_or_else(|e| e.into_inner());
        let opened = Self::open_new(source, opts, &key);
        drop(one);
        opening().lock().unwrap().remove(&key);
        opened
    }

    /// [`RemoteObject::open`] of a source not open yet (unless another
    /// thread opened it meanwhile), entered in the registry.
    fn open_new(source: &str, opts: &RemoteOptions, key: &str) -> Result<Arc<RemoteObject>> {
        if let Some(o) = registry().lock().unwrap().get(key) {
            return Ok(o.clone());
        }
        let object = match scheme::opener(source.as_bytes()) {
            Some(opener) => {
                let shown = redact(source);
                let cache_dir = cache_dir(opts, &shown)?;
                let o = opener(source, opts, &cache_dir)
                    .map_err(|why| open_error(io::ErrorKind::InvalidData, &shown, why))?;
                if opts.digest.is_some() {
                    return Err(open_error(
                        io::ErrorKind::InvalidInput,
                        &o.shown,
                        "-o digest: this source is checked by its own chunk checksums",
                    ));
                }
                let opts = RemoteOptions {
                    chunk: o.chunk,
                    ..opts.clone()
                };
                let object = Self::open_checked(
                    o.backend,
                    &o.identity,
                    &o.shown,
                    &cache_dir,
                    &opts,
                    None,
                    o.verify,
                )?;
                object.set_max_run(o.max_run);
                for (at, bytes) in &o.preload {
                    object.preload(*at, bytes);
                }
                Arc::new(object)
            }
            None => {
                let shown = redact(source);
                let (location, backend, digest_backend) = backends(source, opts, &shown)?;
                let cache_dir = cache_dir(opts, &shown)?;
                Arc::new(Self::open_with(
                    Box::new(backend),
                    &location.identity(),
                    &shown,
                    &cache_dir,
                    opts,
                    digest_backend,
                )?)
            }
        };
        registry()
            .lock()
            .unwrap()
            .insert(key.to_owned(), object.clone());
        Ok(object)
    }

    /// Opens the object behind `backend` (not shared): the HEAD, the cache,
    /// the fetch threads; and the digest from `digest` (its backend and
    /// its URL as shown) when one is asked for.
    pub(crate) fn open_with(
        backend: Box<dyn Backend>,
        identity: &str,
        shown: &str,
        cache_dir: &Path,
        opts: &RemoteOptions,
        digest: Option<DigestSource>,
    ) -> Result<RemoteObject> {
        Self::open_checked(backend, identity, shown, cache_dir, opts, digest, None)
    }

    /// [`RemoteObject::open_with`], with the check of chunks read back
    /// from the disk cache that `verify` makes.
    pub(crate) fn open_checked(
        backend: Box<dyn Backend>,
        identity: &str,
        shown: &str,
        cache_dir: &Path,
        opts: &RemoteOptions,
        digest: Option<DigestSource>,
        verify: Option<Box<dyn Verify>>,
    ) -> Result<RemoteObject> {
        check_chunk(opts.chunk).map_err(|e| open_error(io::ErrorKind::InvalidInput, shown, e))?;
        let counters = Counters::new();
        let policy = RetryPolicy::new(opts.timeout);
        let head = retrying(&policy, &counters, |t| backend.head(t))
            .map_err(|e| open_error(e.last.io_kind(), shown, e.describe()))?;
        let chunk = u64::from(opts.chunk);
        let chunks = head.size.div_ceil(chunk);
        if chunks > MAX_CHUNKS {
            // The cache keeps four bytes a chunk in memory and on disk: a
            // lying size must not decide how much.
            return Err(open_error(
                io::ErrorKind::InvalidData,
                shown,
                format!(
                    "the server says the object is {} bytes: more than {MAX_CHUNKS} chunks of {chunk} (pass a larger chunk=)",
                    head.size
                ),
            ));
        }
        let size = head.size;
        let digest = match digest {
            None => None,
            Some((b, dshown)) => Some(fetch_digest(&*b, size, &policy, &counters).map_err(
                |(kind, why)| open_error(kind, shown, format!("digest {dshown}: {why}")),
            )?),
        };
        let cache = DiskCache::open(
            cache_dir,
            identity,
            &head.version(),
            opts.chunk,
            size,
            opts.cache_size,
        )
        .map_err(|e| {
            open_error(
                e.kind(),
                shown,
                format!(
                    "cache directory {}: {e} (pass -o cache=DIR)",
                    cache_dir.display()
                ),
            )
        })?;
        let state = State {
            inflight: HashMap::new(),
            demand: VecDeque::new(),
            ahead: VecDeque::new(),
            prefetch: opts.prefetch_all.then_some(0),
            background: 0,
            streams: [Stream::default(); STREAMS],
            tick: 0,
            shutdown: false,
        };
        log::debug!(
            "{shown}: {size} bytes ({}), {} of {chunks} chunks of {chunk} cached in {} (limit {})",
            head.version(),
            (0..chunks).filter(|&c| cache.holds(c)).count(),
            cache_dir.display(),
            cache.limit()
        );
        let shared = Arc::new(Shared {
            backend,
            head,
            shown: shown.to_owned(),
            chunk,
            chunks,
            max_window: (MAX_AHEAD / chunk).clamp(1, 32),
            max_run: AtomicU64::new(1),
            cache,
            digest,
            verify: verify.map(|v| (v, (0..chunks).map(|_| AtomicBool::new(false)).collect())),
            policy,
            down: AtomicBool::new(false),
            counters,
            state: Mutex::new(state),
            work: Condvar::new(),
        });
        let spawn = |name: String, run: fn(&Shared)| {
            let s = shared.clone();
            std::thread::Builder::new()
                .name(name)
                .spawn(move || run(&s))
                .map_err(|e| open_error(e.kind(), shown, format!("cache thread: {e}")))
        };
        let mut threads = (0..WORKERS)
            .map(|i| spawn(format!("foliofs-fetch-{i}"), Shared::work_loop))
            .collect::<Result<Vec<_>>>()?;
        threads.push(spawn("foliofs-commit".into(), Shared::commit_loop)?);
        Ok(RemoteObject { shared, threads })
    }
}

/// The object's location and its backend, and the digest's backend with
/// its URL as shown when `-o digest` asks for one; `shown` is the source
/// as messages show it.
fn backends(
    source: &str,
    opts: &RemoteOptions,
    shown: &str,
) -> Result<(Location, HttpBackend, Option<DigestSource>)> {
    let aws = if source
        .get(..5)
        .is_some_and(|s| s.eq_ignore_ascii_case("s3://"))
    {
        AwsConfig::from_env()
    } else {
        AwsConfig::default()
    };
    let region = opts
        .region
        .clone()
        .or(aws.region.clone())
        .unwrap_or_else(|| "us-east-1".into());
    let location = parse(source, opts, &region)
        .map_err(|e| open_error(io::ErrorKind::InvalidInput, &e.url, e.why))?;
    log::debug!(
        "{shown}: {location:?}, region {region}, credentials: {}",
        aws.source
    );
    let backend = HttpBackend::new(
        &location,
        &region,
        opts.path_style,
        opts.insecure_http,
        aws.credentials.as_ref(),
    )
    .map_err(|e| open_error(io::ErrorKind::InvalidInput, shown, e))?;
    let digest_backend = match &opts.digest {
        None => None,
        Some(d) => {
            let url = match d {
                    options::Digest::At(u) => u.clone(),
                    options::Digest::Beside if source.contains('?') => {
                        return Err(open_error(
                            io::ErrorKind::InvalidInput,
                            shown,
                            "-o digest: the URL has a query string, so there is no KEY.digest beside it: pass -o digest=URL",
                        ))
                    }
                    options::Digest::Beside => format!("{source}.digest"),
                };
            let dshown = redact(&url);
            let dloc = parse(&url, opts, &region).map_err(|e| {
                open_error(
                    io::ErrorKind::InvalidInput,
                    shown,
                    format!("digest {}: {}", e.url, e.why),
                )
            })?;
            let b = HttpBackend::new(
                &dloc,
                &region,
                opts.path_style,
                opts.insecure_http,
                aws.credentials.as_ref(),
            )
            .map_err(|e| {
                open_error(
                    io::ErrorKind::InvalidInput,
                    shown,
                    format!("digest {dshown}: {e}"),
                )
            })?;
            Some((Box::new(b) as Box<dyn Backend>, dshown))
        }
    };
    Ok((location, backend, digest_backend))
}

/// Where the object's chunks are cached: `-o cache=`, else the user's (or
/// for root the system's) default.
fn cache_dir(opts: &RemoteOptions, shown: &str) -> Result<PathBuf> {
    Ok(match &opts.cache_dir {
        Some(d) => d.clone(),
        None => {
            // SAFETY: geteuid has no preconditions and cannot fail.
            let root = unsafe { libc::geteuid() } == 0;
            let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
            crate::remote::cache::default_dir(&env, root).ok_or_else(|| {
                open_error(
                    io::ErrorKind::NotFound,
                    shown,
                    "no cache directory (neither XDG_CACHE_HOME nor HOME is set): pass -o cache=DIR",
                )
            })?
        }
    })
}

/// Fetches and checks the digest of an object of `size` bytes: its length
/// is known from `size` before its GET, so a digest object of another
/// size is refused without reading it.
fn fetch_digest(
    backend: &dyn Backend,
    size: u64,
    policy: &RetryPolicy,
    counters: &Counters,
) -> std::result::Result<Digest, (io::ErrorKind, String)> {
    let head = retrying(policy, counters, |t| backend.head(t))
        .map_err(|e| (e.last.io_kind(), e.describe()))?;
    let bad = |why: String| (io::ErrorKind::InvalidData, why);
    if head.size > digest::MAX_LEN {
        return Err(bad(digest::DigestError::TooLarge(head.size).to_string()));
    }
    let body = retrying(policy, counters, |t| {
        let b = backend.get(&head, 0, head.size, t)?;
        if b.len() as u64 != head.size {
            return Err(crate::remote::client::FetchError::transient(format!(
                "the server sent {} bytes for {}",
                b.len(),
                head.size
            )));
        }
        Ok(b)
    })
    .map_err(|e| (e.last.io_kind(), e.describe()))?;
    Digest::parse(&body, size).map_err(|e| bad(e.to_string()))
}
