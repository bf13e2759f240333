//! Images in object storage: `s3://BUCKET/KEY`, `https://HOST/PATH` (and
//! `http://` when asked for), read in chunks through a local disk cache.

mod cache;
mod client;
mod credentials;
pub mod digest;
mod object;
mod options;
pub mod resolve;
pub mod scheme;
mod stats;
mod url;

use std::path::Path;

pub use client::{Backend, FetchError, Head};
pub use credentials::{AwsConfig, Credentials};
pub use object::{release_unused, settle_all, RemoteObject};
pub use options::{
    check_chunk, RemoteOptions, DEFAULT_CHUNK, MAX_CHUNK, MAX_TIMEOUT_SECS, MIN_CHUNK,
};
pub use stats::{stats, RemoteStats};
pub use url::{redact, UrlError};

/// Whether an image source names an object rather than a local path: it
/// starts with `s3://`, `https://` or `http://`, or with a scheme
/// registered in this process ([`scheme::register`]). A local file whose
/// path starts so is still reachable as `./s3://...`.
pub fn is_remote(source: &Path) -> bool {
    let s = source.as_os_str().as_encoded_bytes();
    [&b"s3://"[..], b"https://", b"http://"]
        .iter()
        .any(|scheme| s.len() > scheme.len() && s[..scheme.len()].eq_ignore_ascii_case(scheme))
        || scheme::opener(s).is_some()
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod scheme_tests {
    use super::*;

    #[test]
    fn urls_are_told_from_paths() {
        for url in ["s3://b/k", "https://h/p", "http://h/p", "S3://b/k"] {
            assert!(is_remote(Path::new(url)), "{url}");
        }
        for path in ["./s3://b/k", "image.erofs", "/dev/vdb", "s3://", "s3:/b/k"] {
            assert!(!is_remote(Path::new(path)), "{path}");
        }
    }
}
