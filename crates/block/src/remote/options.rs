//! What a mount of a remote image may set with `-o`: the keys, their
//! grammar and their limits.

use std::path::PathBuf;
use std::time::Duration;

use foliofs_vfs::options::{flag, required, size_value, OptionError};

/// Default chunk: the unit of ranged GETs and of the disk cache. On
/// loopback a 1 MiB GET takes about 5 times a 4 KiB one (8.1 ms against
/// 1.6 ms to SeaweedFS here), and a real object store's first byte costs
/// tens of milliseconds more, so smaller chunks pay that latency many
/// times over for a sequential reader. Larger ones fetch more than a
/// start-up reads when it touches scattered small files, and 1 MiB is
/// also EROFS's largest compressed cluster, so one cluster is at most two
/// GETs.
pub const DEFAULT_CHUNK: u32 = 1 << 20;

/// Smallest and largest `chunk=`: below 64 KiB a ranged GET costs more in
/// its round trip than in its bytes; above 16 MiB a cold small read waits
/// for far more than it asked for.
pub const MIN_CHUNK: u32 = 64 << 10;
/// See [`MIN_CHUNK`].
pub const MAX_CHUNK: u32 = 16 << 20;
/// Longest `timeout=`, in seconds: an hour.
pub const MAX_TIMEOUT_SECS: u64 = 3600;

/// Refuses a chunk size that is not a power of two from 64 KiB to 16 MiB.
pub fn check_chunk(chunk: u32) -> std::result::Result<(), String> {
    if chunk.is_power_of_two() && (MIN_CHUNK..=MAX_CHUNK).contains(&chunk) {
        Ok(())
    } else {
        Err(format!(
            "chunk size {chunk} is not a power of two from 64 KiB to 16 MiB"
        ))
    }
}

/// How a remote image is fetched and cached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteOptions {
    /// Bytes per ranged GET and per cache entry (`chunk=SIZE`): a power of
    /// two from 64 KiB to 16 MiB.
    pub chunk: u32,
    /// Whether `chunk=` was given (a source whose chunks its own format
    /// fixes refuses another size rather than ignore it).
    pub chunk_given: bool,
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
    /// Where the object's digest is (`digest=URL`, or `digest` alone for
    /// the object's URL with `.digest` added); every fetched range is
    /// checked against it. `None`: fetched bytes are trusted.
    pub digest: Option<Digest>,
}

/// Where a remote object's digest is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Digest {
    /// Beside the object: its URL with `.digest` added.
    Beside,
    /// At this URL (read with the same endpoint and credentials).
    At(String),
}

impl Default for RemoteOptions {
    fn default() -> Self {
        RemoteOptions {
            chunk: DEFAULT_CHUNK,
            chunk_given: false,
            cache_dir: None,
            cache_size: None,
            prefetch_all: false,
            endpoint: None,
            region: None,
            path_style: false,
            insecure_http: false,
            timeout: Duration::from_secs(30),
            digest: None,
        }
    }
}

impl RemoteOptions {
    /// The `-o` keys of an image in object storage. `prefetch` is shared
    /// with the FUSE layer: only `prefetch=all` is this one's (see
    /// [`RemoteOptions::set`]).
    pub const KEYS: &'static [&'static str] = &[
        "chunk",
        "cache",
        "cache_size",
        "prefetch",
        "endpoint",
        "region",
        "path_style",
        "insecure_http",
        "timeout",
        "digest",
    ];

    /// Whether `key` is one of [`RemoteOptions::KEYS`].
    pub fn is_key(key: &str) -> bool {
        Self::KEYS.contains(&key)
    }

    /// Applies one `-o` option: `Ok(true)` when it is this layer's (and
    /// valid), `Ok(false)` when it is not, an error naming the key when its
    /// value is malformed. `prefetch=` with any value but `all` names a
    /// start-up profile, which is the FUSE layer's: `Ok(false)`, so the
    /// caller offers it there.
    pub fn set(&mut self, key: &str, value: Option<&str>) -> Result<bool, OptionError> {
        match key {
            "chunk" => {
                let v = required(key, value)?;
                let n = size_value(key, v)?;
                self.chunk = u32::try_from(n)
                    .ok()
                    .filter(|&n| check_chunk(n).is_ok())
                    .ok_or_else(|| {
                        OptionError::bad(
                            key,
                            format!("`{v}` is not a power of two from 64K to 16M"),
                        )
                    })?;
                self.chunk_given = true;
            }
            "cache" => {
                let v = required(key, value)?;
                // The server runs from `/`, and fstab has no working
                // directory: a relative path would name another place.
                if !v.starts_with('/') {
                    return Err(OptionError::bad(
                        key,
                        format!("`{v}` is not an absolute path"),
                    ));
                }
                self.cache_dir = Some(PathBuf::from(v));
            }
            "cache_size" => {
                let n = size_value(key, required(key, value)?)?;
                if n == 0 {
                    return Err(OptionError::bad(
                        key,
                        "`0`: the cache must hold at least one chunk",
                    ));
                }
                self.cache_size = Some(n);
            }
            "prefetch" => {
                if required(key, value)? != "all" {
                    return Ok(false);
                }
                self.prefetch_all = true;
            }
            "endpoint" => {
                let v = required(key, value)?;
                let scheme = v.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
                if !matches!(scheme.as_deref(), Some("https" | "http")) || v.ends_with("://") {
                    return Err(OptionError::bad(
                        key,
                        format!("`{v}` is not an https:// (or http://) URL"),
                    ));
                }
                self.endpoint = Some(v.to_owned());
            }
            "region" => {
                let v = required(key, value)?;
                if !v
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                {
                    return Err(OptionError::bad(
                        key,
                        format!("`{v}` is not a region name (letters, digits and `-`)"),
                    ));
                }
                self.region = Some(v.to_owned());
            }
            "path_style" => {
                flag(key, value)?;
                self.path_style = true;
            }
            "insecure_http" => {
                flag(key, value)?;
                self.insecure_http = true;
            }
            "timeout" => {
                let v = required(key, value)?;
                let secs = v
                    .parse::<u64>()
                    .ok()
                    .filter(|s| (1..=MAX_TIMEOUT_SECS).contains(s))
                    .ok_or_else(|| {
                        OptionError::bad(
                            key,
                            format!("`{v}` is not a whole number of seconds from 1 to {MAX_TIMEOUT_SECS}"),
                        )
                    })?;
                self.timeout = Duration::from_secs(secs);
            }
            "digest" => {
                self.digest = Some(match value {
                    None => Digest::Beside,
                    Some(v) => {
                        let scheme = v.split_once("://").map(|(s, _)| s.to_ascii_lowercase());
                        if !matches!(scheme.as_deref(), Some("s3" | "https" | "http"))
                            || v.ends_with("://")
                        {
                            return Err(OptionError::bad(
                                key,
                                format!("`{v}` is not an s3://, https:// or http:// URL"),
                            ));
                        }
                        Digest::At(v.to_owned())
                    }
                });
            }
            _ => return Ok(false),
        }
        Ok(true)
    }

    /// The options from `-o` items, `(key, value)` in the order given; a
    /// key that is not this layer's is refused by name, as is a bad value.
    pub fn from_mount_options(
        items: &[(String, Option<String>)],
    ) -> Result<RemoteOptions, OptionError> {
        let mut o = RemoteOptions::default();
        crate::options::apply_all(items, |k, v| o.set(k, v))?;
        Ok(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<RemoteOptions, OptionError> {
        let items: Vec<_> = foliofs_vfs::options::items(s)
            .map(|(k, v)| (k.to_owned(), v.map(ToOwned::to_owned)))
            .collect();
        RemoteOptions::from_mount_options(&items)
    }

    #[test]
    fn remote_options() {
        let r = parse(
            "chunk=4M,cache=/var/c,cache_size=2G,prefetch=all,endpoint=http://127.0.0.1:8333,region=eu-west-1,path_style,insecure_http,timeout=3",
        )
        .unwrap();
        assert_eq!(r.chunk, 4 << 20);
        assert_eq!(r.cache_dir.as_deref(), Some(std::path::Path::new("/var/c")));
        assert_eq!(r.cache_size, Some(2 << 30));
        assert!(r.prefetch_all && r.path_style && r.insecure_http);
        assert_eq!(r.endpoint.as_deref(), Some("http://127.0.0.1:8333"));
        assert_eq!(r.region.as_deref(), Some("eu-west-1"));
        assert_eq!(r.timeout, Duration::from_secs(3));
        assert_eq!(r.digest, None);
        assert_eq!(parse("digest").unwrap().digest, Some(Digest::Beside));
        assert_eq!(
            parse("digest=s3://b/k.d").unwrap().digest,
            Some(Digest::At("s3://b/k.d".into()))
        );
        // A URL's `=` and `:` stay in the value.
        let r = parse("endpoint=https://h:9000/p?a=b").unwrap();
        assert_eq!(r.endpoint.as_deref(), Some("https://h:9000/p?a=b"));
        // The limits themselves are fine.
        for s in [
            "chunk=64K",
            "chunk=16M",
            "timeout=1",
            "timeout=3600",
            "cache_size=1",
        ] {
            parse(s).unwrap_or_else(|e| panic!("{s}: {e}"));
        }
    }

    #[test]
    fn prefetch_is_remote_only_as_all() {
        let mut r = RemoteOptions::default();
        assert_eq!(r.set("prefetch", Some("/p")), Ok(false));
        assert_eq!(r.set("prefetch", Some("all.prof")), Ok(false));
        assert_eq!(r, RemoteOptions::default());
        assert_eq!(r.set("prefetch", Some("all")), Ok(true));
        assert!(r.prefetch_all);
        assert!(RemoteOptions::is_key("prefetch"));
    }

    #[test]
    fn remote_values_are_refused_by_name() {
        for (s, key, why) in [
            ("chunk=3M", "chunk", "power of two from 64K to 16M"),
            ("chunk=32K", "chunk", "power of two from 64K to 16M"),
            ("chunk=32M", "chunk", "power of two from 64K to 16M"),
            ("chunk=8G", "chunk", "power of two from 64K to 16M"),
            ("chunk=x", "chunk", "unknown size suffix"),
            ("chunk", "chunk", "needs a value"),
            ("cache=rel/dir", "cache", "not an absolute path"),
            ("cache=", "cache", "needs a value"),
            ("cache_size=0", "cache_size", "at least one chunk"),
            ("cache_size=1Q", "cache_size", "suffix"),
            ("prefetch", "prefetch", "needs a value"),
            ("prefetch=", "prefetch", "needs a value"),
            ("endpoint=ftp://h", "endpoint", "not an https://"),
            ("endpoint=h:9000", "endpoint", "not an https://"),
            ("endpoint=https://", "endpoint", "not an https://"),
            ("region=eu/west", "region", "not a region name"),
            ("path_style=yes", "path_style", "takes no value"),
            ("insecure_http=1", "insecure_http", "takes no value"),
            ("timeout=0", "timeout", "from 1 to 3600"),
            ("timeout=3601", "timeout", "from 1 to 3600"),
            ("timeout=1.5", "timeout", "from 1 to 3600"),
            ("timeout=-1", "timeout", "from 1 to 3600"),
            ("digest=", "digest", "not an s3://"),
            ("digest=k.digest", "digest", "not an s3://"),
            ("digest=s3://", "digest", "not an s3://"),
        ] {
            let e = parse(s).unwrap_err();
            assert!(
                matches!(&e, OptionError::BadValue { key: k, .. } if k == key),
                "{s}: {e}"
            );
            assert!(e.to_string().contains(why), "{s}: {e}");
        }
        assert_eq!(
            parse("chunk=1M,ro").unwrap_err(),
            OptionError::Unknown("ro".into())
        );
    }

    #[test]
    fn chunk_limits_are_the_ones_checked_at_open() {
        for n in [MIN_CHUNK, DEFAULT_CHUNK, MAX_CHUNK] {
            assert!(check_chunk(n).is_ok(), "{n}");
        }
        for n in [MIN_CHUNK / 2, MAX_CHUNK * 2, 3 << 20, 0] {
            assert!(check_chunk(n).is_err(), "{n}");
        }
    }
}
