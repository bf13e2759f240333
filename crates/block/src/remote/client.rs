//! Requests to the object store: HEAD and ranged GET behind a small
//! trait (so tests can stand in a backend that fails on demand), the retry
//! loop around them, and the HTTP backend (ureq, SigV4 by rusty-s3).

use std::time::{Duration, Instant};

use super::credentials::Credentials;
use super::stats::{Counters, Stat};
use super::url::{redact, Location};

/// The longest one request may take, whatever the total budget.
pub(crate) const MAX_REQUEST_TIME: Duration = Duration::from_secs(10);

/// What a HEAD says about the object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Head {
    /// The object's size in bytes.
    pub size: u64,
    /// Its ETag, if the server gives one.
    pub etag: Option<String>,
    /// Its Last-Modified, if the server gives one.
    pub last_modified: Option<String>,
}

impl Head {
    /// What tells this version of the object from a replacement: the ETag,
    /// else Last-Modified, else only the size.
    pub fn version(&self) -> String {
        match (&self.etag, &self.last_modified) {
            (Some(e), _) => format!("etag {e}"),
            (None, Some(m)) => format!("modified {m}"),
            (None, None) => format!("size {}", self.size),
        }
    }
}

/// A failed request: transient ones (connection, timeout, 5xx, 429) are
/// tried again, the others are final.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchError {
    /// Whether another try may do better.
    pub transient: bool,
    /// The bytes came and failed their check: counted apart, tried again.
    pub corrupt: bool,
    /// HTTP status, when the server answered.
    pub status: Option<u16>,
    /// What happened, without the URL (the caller names it) and never
    /// with a secret.
    pub message: String,
}

impl FetchError {
    /// A failure another try may not meet.
    pub fn transient(message: impl Into<String>) -> Self {
        FetchError {
            transient: true,
            corrupt: false,
            status: None,
            message: message.into(),
        }
    }

    /// A failure every try would meet.
    pub fn fatal(message: impl Into<String>) -> Self {
        FetchError {
            transient: false,
            corrupt: false,
            status: None,
            message: message.into(),
        }
    }

    /// Bytes that came and failed their check (damaged on the way or by
    /// the server): never handed on, tried again.
    pub fn corrupt(message: impl Into<String>) -> Self {
        FetchError {
            transient: true,
            corrupt: true,
            status: None,
            message: message.into(),
        }
    }

    /// The `io::ErrorKind` a final failure is reported as.
    pub fn io_kind(&self) -> std::io::ErrorKind {
        match self.status {
            Some(404) => std::io::ErrorKind::NotFound,
            Some(401 | 403) => std::io::ErrorKind::PermissionDenied,
            _ if self.message.contains("timed out") => std::io::ErrorKind::TimedOut,
            _ => std::io::ErrorKind::Other,
        }
    }
}

/// One request at a time to one object. Implementations check what came
/// back (status, Content-Range, version) and report it as a
/// [`FetchError`]; the caller checks the body's length.
pub trait Backend: Send + Sync {
    /// One HEAD, within `timeout`.
    fn head(&self, timeout: Duration) -> Result<Head, FetchError>;
    /// One GET of `len` bytes at `start` of the object `head` described,
    /// within `timeout`. A different version of the object is an error.
    fn get(
        &self,
        head: &Head,
        start: u64,
        len: u64,
        timeout: Duration,
    ) -> Result<Vec<u8>, FetchError>;
}

/// How long to keep trying.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RetryPolicy {
    /// Everything one operation may take, retries and waits included.
    pub total: Duration,
    /// The most one request may take.
    pub per_request: Duration,
    /// The first wait before trying again; each next one doubles, up to
    /// `max_backoff`, and each is shortened by a random part of up to a
    /// half so that many readers do not retry in step.
    pub first_backoff: Duration,
    pub max_backoff: Duration,
}

impl RetryPolicy {
    pub fn new(total: Duration) -> Self {
        RetryPolicy {
            total,
            per_request: MAX_REQUEST_TIME.min(total),
            first_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(2),
        }
    }
}

/// A final failure after `tries` attempts.
#[derive(Clone, Debug)]
pub(crate) struct GaveUp {
    pub last: FetchError,
    pub tries: u32,
    pub elapsed: Duration,
}

impl GaveUp {
    /// "LAST (after N tries in S s)" or just "LAST" for a first-try final
    /// error.
    pub fn describe(&self) -> String {
        if self.tries <= 1 {
            self.last.message.clone()
        } else {
            format!(
                "{} (gave up after {} tries in {:.1} s)",
                self.last.message,
                self.tries,
                self.elapsed.as_secs_f64()
            )
        }
    }
}

/// Runs `attempt` (given its time limit) until it succeeds, fails for
/// good, or the policy's total time is spent.
pub(crate) fn retrying<T>(
    policy: &RetryPolicy,
    counters: &Counters,
    mut attempt: impl FnMut(Duration) -> Result<T, FetchError>,
) -> Result<T, GaveUp> {
    let start = Instant::now();
    let deadline = start + policy.total;
    let mut backoff = policy.first_backoff;
    let mut tries = 0;
    loop {
        tries += 1;
        let left = deadline.saturating_duration_since(Instant::now());
        let limit = policy.per_request.min(left).max(Duration::from_millis(1));
        match attempt(limit) {
            Ok(v) => return Ok(v),
            Err(e) => {
                let wait = jitter(backoff);
                let now = Instant::now();
                if !e.transient || now + wait >= deadline {
                    return Err(GaveUp {
                        last: e,
                        tries,
                        elapsed: now - start,
                    });
                }
                counters.add(Stat::Retries, 1);
                std::thread::sleep(wait);
                backoff = (backoff * 2).min(policy.max_backoff);
            }
        }
    }
}

/// `d` less a random part of up to half of it.
fn jitter(d: Duration) -> Duration {
    use std::sync::atomic::{AtomicU64, Ordering};
    static STATE: AtomicU64 = AtomicU64::new(0);
    let mut x = STATE.load(Ordering::Relaxed);
    if x == 0 {
        x = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|t| t.as_nanos() as u64)
            .unwrap_or(1)
            | 1;
    }
    // xorshift64: enough to spread retries, nothing depends on it.
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    STATE.store(x, Ordering::Relaxed);
    let frac = (x >> 11) as f64 / (1u64 << 53) as f64;
    d.mul_f64(1.0 - frac / 2.0)
}

/// Talks HTTP(S) to one object: S3 (presigned SigV4 per request, or
/// unsigned when there are no credentials) or a plain URL.
pub(crate) struct HttpBackend {
    agent: ureq::Agent,
    target: Target,
    /// The hint a 403 gets.
    forbidden_hint: &'static str,
}

enum Target {
    S3 {
        bucket: Box<rusty_s3::Bucket>,
        key: String,
        credentials: Option<rusty_s3::Credentials>,
    },
    Plain(String),
}

/// How long a presigned request stays valid: it is sent at once, this
/// only has to outlast clock skew and a slow connect.
const PRESIGN_FOR: Duration = Duration::from_secs(15 * 60);

impl HttpBackend {
    pub fn new(
        location: &Location,
        region: &str,
        path_style: bool,
        insecure_http: bool,
        credentials: Option<&Credentials>,
    ) -> Result<HttpBackend, String> {
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .https_only(!insecure_http)
            .max_idle_connections_per_host(16)
            .user_agent(concat!("foliofs/", env!("CARGO_PKG_VERSION")))
            .build();
        let agent = super::resolve::agent(config);
        let (target, forbidden_hint) = match location {
            Location::S3 {
                endpoint,
                bucket,
                key,
            } => {
                let style = if path_style {
                    rusty_s3::UrlStyle::Path
                } else {
                    rusty_s3::UrlStyle::VirtualHost
                };
                let bucket = rusty_s3::Bucket::new(
                    endpoint.clone(),
                    style,
                    bucket.clone(),
                    region.to_owned(),
                )
                .map_err(|e| format!("bucket: {e}"))?;
                let hint = if credentials.is_some() {
                    " (check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)"
                } else {
                    " (no credentials found: set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE)"
                };
                (
                    Target::S3 {
                        bucket: Box::new(bucket),
                        key: key.clone(),
                        credentials: credentials.map(Credentials::to_s3),
                    },
                    hint,
                )
            }
            Location::Http(u) => (
                Target::Plain(u.as_str().to_owned()),
                " (a presigned URL may have expired)",
            ),
        };
        Ok(HttpBackend {
            agent,
            target,
            forbidden_hint,
        })
    }

    fn url(&self, head: bool) -> String {
        use rusty_s3::S3Action;
        match &self.target {
            Target::S3 {
                bucket,
                key,
                credentials,
            } => {
                if head {
                    rusty_s3::actions::HeadObject::new(bucket, credentials.as_ref(), key)
                        .sign(PRESIGN_FOR)
                        .into()
                } else {
                    rusty_s3::actions::GetObject::new(bucket, credentials.as_ref(), key)
                        .sign(PRESIGN_FOR)
                        .into()
                }
            }
            Target::Plain(u) => u.clone(),
        }
    }

    fn status_error(&self, status: u16) -> FetchError {
        let reason = reason(status);
        let (transient, hint) = match status {
            403 => (false, self.forbidden_hint),
            408 | 429 => (true, ""),
            412 => (false, " (the object changed since it was opened)"),
            416 => (false, " (the object is shorter than when it was opened)"),
            500..=599 => (true, ""),
            _ => (false, ""),
        };
        FetchError {
            transient,
            corrupt: false,
            status: Some(status),
            message: format!("{status} {reason}{hint}"),
        }
    }
}

fn header<'a>(resp: &'a ureq::http::Response<ureq::Body>, name: &str) -> Option<&'a str> {
    resp.headers().get(name).and_then(|v| v.to_str().ok())
}

fn reason(status: u16) -> &'static str {
    ureq::http::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("")
}

/// A ureq failure as a [`FetchError`], with any URL in its text redacted
/// (a presigned URL's query string is its signature).
fn transport_error(e: ureq::Error, limit: Duration) -> FetchError {
    use ureq::Error as E;
    match e {
        E::Timeout(what) => FetchError::transient(format!(
            "timed out after {:.1} s ({what})",
            limit.as_secs_f64()
        )),
        E::Io(io) => {
            let text = io.to_string();
            if text.contains("certificate") || text.contains("Certificate") {
                FetchError::fatal(format!("TLS: {text}"))
            } else {
                FetchError::transient(text)
            }
        }
        E::ConnectionFailed => FetchError::transient("connection failed"),
        E::HostNotFound => FetchError::transient("host not found"),
        E::Protocol(p) => FetchError::transient(format!("HTTP protocol error: {p}")),
        E::Rustls(t) => FetchError::fatal(format!("TLS: {t}")),
        E::Tls(t) => FetchError::fatal(format!("TLS: {t}")),
        E::RequireHttpsOnly(_) => {
            FetchError::fatal("redirected to plain http:// (needs `-o insecure_http`)")
        }
        other => FetchError::fatal(scrub(&other.to_string())),
    }
}

/// `text` with every URL in it [`redact`]ed.
fn scrub(text: &str) -> String {
    text.split(' ')
        .map(|w| {
            if w.contains("://") {
                redact(w)
            } else {
                w.to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// `bytes FIRST-LAST/TOTAL` (TOTAL may be `*`).
fn parse_content_range(v: &str) -> Option<(u64, u64, Option<u64>)> {
    let rest = v.trim().strip_prefix("bytes ")?;
    let (range, total) = rest.split_once('/')?;
    let (a, b) = range.split_once('-')?;
    let total = if total == "*" {
        None
    } else {
        Some(total.parse().ok()?)
    };
    Some((a.parse().ok()?, b.parse().ok()?, total))
}

impl Backend for HttpBackend {
    fn head(&self, timeout: Duration) -> Result<Head, FetchError> {
        let resp = self
            .agent
            .head(self.url(true))
            .config()
            .timeout_global(Some(timeout))
            .build()
            .call()
            .map_err(|e| transport_error(e, timeout))?;
        let status = resp.status().as_u16();
        if status != 200 {
            return Err(self.status_error(status));
        }
        let size = header(&resp, "content-length")
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| FetchError::fatal("the server did not say the object's size"))?;
        Ok(Head {
            size,
            etag: header(&resp, "etag").map(str::to_owned),
            last_modified: header(&resp, "last-modified").map(str::to_owned),
        })
    }

    fn get(
        &self,
        head: &Head,
        start: u64,
        len: u64,
        timeout: Duration,
    ) -> Result<Vec<u8>, FetchError> {
        let last = start + len - 1;
        let mut req = self
            .agent
            .get(self.url(false))
            .header("range", format!("bytes={start}-{last}"));
        if let Some(etag) = &head.etag {
            req = req.header("if-match", etag);
        } else if let Some(m) = &head.last_modified {
            req = req.header("if-unmodified-since", m);
        }
        let mut resp = req
            .config()
            .timeout_global(Some(timeout))
            .build()
            .call()
            .map_err(|e| transport_error(e, timeout))?;
        let status = resp.status().as_u16();
        match status {
            206 => {
                let got = header(&resp, "content-range").unwrap_or("(none)");
                match parse_content_range(got) {
                    Some((a, b, total))
                        if a == start && b == last && total.is_none_or(|t| t == head.size) => {}
                    // A proxy or a server that lost its place: the bytes
                    // are not the ones asked for, but the next answer may be.
                    _ => {
                        return Err(FetchError::transient(format!(
                            "asked for bytes {start}-{last}/{}, got Content-Range {got}",
                            head.size
                        )))
                    }
                }
            }
            // A server that ignores ranges sends the whole object: fine
            // only when the range is the whole object.
            200 if start == 0 && len == head.size => {}
            200 => {
                return Err(FetchError::fatal(format!(
                    "asked for bytes {start}-{last}, got 200 OK (the server ignores ranges)"
                )))
            }
            s => return Err(self.status_error(s)),
        }
        let changed = match (&head.etag, header(&resp, "etag")) {
            (Some(want), Some(got)) => want != got,
            (None, _) => match (&head.last_modified, header(&resp, "last-modified")) {
                (Some(want), Some(got)) => want != got,
                _ => false,
            },
            _ => false,
        };
        if changed {
            return Err(FetchError::fatal(
                "the object changed since it was opened (another ETag)",
            ));
        }
        resp.body_mut()
            .with_config()
            .limit(len + 1)
            .read_to_vec()
            .map_err(|e| transport_error(e, timeout))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn quick(total_ms: u64) -> RetryPolicy {
        RetryPolicy {
            total: Duration::from_millis(total_ms),
            per_request: Duration::from_millis(total_ms.min(200)),
            first_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(40),
        }
    }

    #[test]
    fn transient_failures_are_retried_with_growing_waits() {
        let counters = Counters::new();
        let calls = AtomicU32::new(0);
        let t = Instant::now();
        let got = retrying(&quick(5000), &counters, |_| {
            if calls.fetch_add(1, Ordering::Relaxed) < 3 {
                Err(FetchError::transient("503 Service Unavailable"))
            } else {
                Ok(7)
            }
        });
        assert_eq!(got.unwrap(), 7);
        assert_eq!(counters.snapshot().retries, 3);
        // Waits of at least 5, 10 and 20 ms (each at least half of 10, 20, 40).
        assert!(
            t.elapsed() >= Duration::from_millis(35),
            "{:?}",
            t.elapsed()
        );
    }

    #[test]
    fn final_errors_are_not_retried() {
        let counters = Counters::new();
        let calls = AtomicU32::new(0);
        let e = retrying(&quick(5000), &counters, |_| -> Result<(), _> {
            calls.fetch_add(1, Ordering::Relaxed);
            Err(FetchError::fatal("404 Not Found"))
        })
        .unwrap_err();
        assert_eq!(calls.load(Ordering::Relaxed), 1);
        assert_eq!(e.describe(), "404 Not Found");
    }

    #[test]
    fn retries_stop_within_the_total_time() {
        let counters = Counters::new();
        let t = Instant::now();
        let e = retrying(&quick(300), &counters, |limit| -> Result<(), _> {
            assert!(limit <= Duration::from_millis(300));
            std::thread::sleep(Duration::from_millis(20));
            Err(FetchError::transient("connection refused"))
        })
        .unwrap_err();
        let took = t.elapsed();
        assert!(took < Duration::from_millis(300 + 100), "{took:?}");
        assert!(e.tries > 2, "{e:?}");
        assert!(e
            .describe()
            .starts_with("connection refused (gave up after"));
    }

    #[test]
    fn content_ranges_parse() {
        assert_eq!(
            parse_content_range("bytes 0-99/1000"),
            Some((0, 99, Some(1000)))
        );
        assert_eq!(parse_content_range("bytes 5-9/*"), Some((5, 9, None)));
        assert_eq!(parse_content_range("items 0-1/2"), None);
        assert_eq!(parse_content_range("bytes x-1/2"), None);
    }

    #[test]
    fn error_text_is_scrubbed() {
        assert_eq!(
            scrub("bad uri https://h/x?X-Amz-Signature=s3cr3t here"),
            "bad uri https://h/x here"
        );
    }
}
