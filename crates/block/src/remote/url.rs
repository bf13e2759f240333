//! Image URLs: what they name, where the requests go, and how they are
//! shown (never with a query string or user info: a presigned URL carries
//! its signature there).

use super::RemoteOptions;

/// What a remote source names, checked against the options.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum Location {
    /// An object in an S3 bucket, reached through `endpoint`.
    S3 {
        /// The endpoint (`https://s3.REGION.amazonaws.com` unless
        /// `endpoint=` says otherwise).
        endpoint: url::Url,
        bucket: String,
        key: String,
    },
    /// A plain HTTP(S) URL, fetched as is (with its query string).
    Http(url::Url),
}

impl std::fmt::Debug for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::S3 {
                endpoint,
                bucket,
                key,
            } => write!(f, "S3({} {bucket}/{key})", redact(endpoint.as_str())),
            Location::Http(u) => write!(f, "Http({})", redact(u.as_str())),
        }
    }
}

/// A URL foliofs cannot use, with the reason. Its text names the URL
/// redacted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{url}: {why}")]
pub struct UrlError {
    /// The URL as shown ([`redact`]ed).
    pub url: String,
    /// What is wrong with it.
    pub why: String,
}

fn bad(url: &str, why: impl Into<String>) -> UrlError {
    UrlError {
        url: redact(url),
        why: why.into(),
    }
}

/// `url` without user info, query string or fragment: the form foliofs
/// shows in messages, logs and mount tables.
pub fn redact(url: &str) -> String {
    let cut = url.find(['?', '#']).unwrap_or(url.len());
    let url = &url[..cut];
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let rest = &url[scheme_end + 3..];
    let auth_end = rest.find('/').unwrap_or(rest.len());
    match rest[..auth_end].rfind('@') {
        Some(at) => format!("{}{}", &url[..scheme_end + 3], &rest[at + 1..]),
        None => url.to_owned(),
    }
}

/// Parses `source` (an `s3://`, `https://` or `http://` URL) against the
/// options that decide where it is fetched from; `region` is the region
/// already resolved (options, environment, AWS config).
pub(crate) fn parse(
    source: &str,
    opts: &RemoteOptions,
    region: &str,
) -> Result<Location, UrlError> {
    let lower = source.get(..8).unwrap_or(source).to_ascii_lowercase();
    if lower.starts_with("s3://") {
        let rest = &source[5..];
        let (bucket, key) = rest
            .split_once('/')
            .ok_or_else(|| bad(source, "an s3:// URL is s3://BUCKET/KEY"))?;
        if bucket.is_empty() || key.is_empty() {
            return Err(bad(source, "an s3:// URL is s3://BUCKET/KEY"));
        }
        if rest.contains(['?', '#']) {
            return Err(bad(
                source,
                "an s3:// URL takes no query string (`?`) or fragment (`#`)",
            ));
        }
        // Bucket names are DNS labels: lower case letters, digits, dots
        // and hyphens (AWS's rules, loosely: other stores are laxer).
        if !bucket
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
        {
            return Err(bad(source, format!("`{bucket}` is not a bucket name")));
        }
        let endpoint = match &opts.endpoint {
            Some(e) => e.clone(),
            None => format!("https://s3.{region}.amazonaws.com"),
        };
        let endpoint = url::Url::parse(&endpoint)
            .map_err(|e| bad(&endpoint, format!("not an endpoint URL ({e})")))?;
        check_scheme(endpoint.as_str(), &endpoint, opts, "endpoint")?;
        if endpoint.query().is_some() || !endpoint.path().trim_end_matches('/').is_empty() {
            return Err(bad(
                endpoint.as_str(),
                "an endpoint is scheme://HOST[:PORT], with no path or query",
            ));
        }
        Ok(Location::S3 {
            endpoint,
            bucket: bucket.to_owned(),
            key: key.to_owned(),
        })
    } else if lower.starts_with("https://") || lower.starts_with("http://") {
        let u = url::Url::parse(source).map_err(|e| bad(source, format!("not a URL ({e})")))?;
        check_scheme(source, &u, opts, "URL")?;
        if u.path().ends_with('/') {
            return Err(bad(source, "names a directory, not an object"));
        }
        Ok(Location::Http(u))
    } else {
        Err(bad(source, "not an s3://, https:// or http:// URL"))
    }
}

fn check_scheme(
    shown: &str,
    u: &url::Url,
    opts: &RemoteOptions,
    what: &str,
) -> Result<(), UrlError> {
    if u.host_str().is_none_or(str::is_empty) {
        return Err(bad(shown, format!("the {what} has no host")));
    }
    match u.scheme() {
        "https" => Ok(()),
        "http" if opts.insecure_http => Ok(()),
        "http" => Err(bad(
            shown,
            format!("a plain http:// {what} needs `-o insecure_http` (nothing would protect the data or the credentials on the way)"),
        )),
        other => Err(bad(shown, format!("unsupported scheme `{other}`"))),
    }
}

impl Location {
    /// The object's identity for the disk cache: the URL without its query
    /// string (which changes with every presigned URL), with the endpoint
    /// for S3 (two endpoints are two stores).
    pub(crate) fn identity(&self) -> String {
        match self {
            Location::S3 {
                endpoint,
                bucket,
                key,
            } => format!("s3 {} {bucket}/{key}", redact(endpoint.as_str())),
            Location::Http(u) => redact(u.as_str()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> RemoteOptions {
        RemoteOptions::default()
    }

    #[test]
    fn redaction_drops_queries_and_user_info() {
        assert_eq!(
            redact("https://h.example/a/b.img?X-Amz-Signature=abc&X-Amz-Credential=K"),
            "https://h.example/a/b.img"
        );
        assert_eq!(
            redact("https://user:pw@h.example:8443/x#frag"),
            "https://h.example:8443/x"
        );
        assert_eq!(redact("s3://bucket/key"), "s3://bucket/key");
        assert_eq!(redact("s3://b/a@b/c"), "s3://b/a@b/c");
        assert_eq!(redact("not a url?secret"), "not a url");
    }

    #[test]
    fn s3_urls_use_the_endpoint_or_aws() {
        let Location::S3 {
            endpoint,
            bucket,
            key,
        } = parse("s3://my-bucket/dir/img.erofs", &opts(), "eu-west-1").unwrap()
        else {
            panic!()
        };
        assert_eq!(endpoint.as_str(), "https://s3.eu-west-1.amazonaws.com/");
        assert_eq!(
            (bucket.as_str(), key.as_str()),
            ("my-bucket", "dir/img.erofs")
        );
        let o = RemoteOptions {
            endpoint: Some("http://127.0.0.1:8333".into()),
            insecure_http: true,
            ..opts()
        };
        assert!(matches!(
            parse("s3://b/k", &o, "us-east-1").unwrap(),
            Location::S3 { endpoint, .. } if endpoint.as_str() == "http://127.0.0.1:8333/"
        ));
    }

    #[test]
    fn plain_http_needs_insecure_http() {
        let o = RemoteOptions {
            endpoint: Some("http://127.0.0.1:8333".into()),
            ..opts()
        };
        let e = parse("s3://b/k", &o, "us-east-1").unwrap_err();
        assert!(e.to_string().contains("insecure_http"), "{e}");
        let e = parse("http://h/img?sig=secret", &opts(), "x").unwrap_err();
        assert!(e.to_string().starts_with("http://h/img: "), "{e}");
        assert!(!e.to_string().contains("secret"));
        let o = RemoteOptions {
            insecure_http: true,
            ..opts()
        };
        assert!(parse("http://h/img", &o, "x").is_ok());
    }

    #[test]
    fn bad_urls_are_named() {
        for (u, why) in [
            ("s3://bucket", "s3://BUCKET/KEY"),
            ("s3:///key", "s3://BUCKET/KEY"),
            ("s3://bucket/", "s3://BUCKET/KEY"),
            ("s3://b/k?x=1", "query"),
            ("s3://b@d/k", "bucket name"),
            ("https://h", "directory"),
            ("https://h/dir/", "directory"),
            ("ftp://h/x", "not an s3://"),
        ] {
            let e = parse(u, &opts(), "us-east-1").unwrap_err();
            assert!(e.to_string().contains(why), "{u}: {e}");
        }
        let o = RemoteOptions {
            endpoint: Some("https://h/path".into()),
            ..opts()
        };
        let e = parse("s3://b/k", &o, "r").unwrap_err();
        assert!(e.to_string().contains("no path"), "{e}");
    }

    #[test]
    fn identity_ignores_the_query_string() {
        let a = parse("https://h/i.img?sig=1", &opts(), "r").unwrap();
        let b = parse("https://h/i.img?sig=2", &opts(), "r").unwrap();
        assert_eq!(a.identity(), b.identity());
        assert!(!format!("{a:?}").contains("sig"));
    }
}
