//! Registry credentials and challenges: basic credentials from the auth
//! files podman, skopeo and docker write (`{"auths": {"HOST": {"auth":
//! base64(user:pass)}}}`), and the `WWW-Authenticate` challenges of a
//! 401 (`Bearer realm=...,service=...,scope=...` or `Basic realm=...`).

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde::Deserialize;

use crate::layout::MAX_JSON;
use crate::OciError;

/// Basic credentials for a registry, and the file they came from.
#[derive(Clone, Debug)]
pub struct Credentials {
    /// `base64(user:pass)`, as the `Authorization: Basic` header takes it.
    pub basic: String,
    /// The auth file they were found in.
    pub from: PathBuf,
}

/// The auth files looked in, first found first: `$REGISTRY_AUTH_FILE`,
/// `$XDG_RUNTIME_DIR/containers/auth.json`, `~/.docker/config.json`.
pub fn auth_files(env: &dyn Fn(&str) -> Option<String>) -> Vec<PathBuf> {
    let mut files = Vec::new();
    if let Some(f) = env("REGISTRY_AUTH_FILE") {
        files.push(PathBuf::from(f));
    }
    if let Some(d) = env("XDG_RUNTIME_DIR") {
        files.push(Path::new(&d).join("containers/auth.json"));
    }
    if let Some(h) = env("HOME") {
        files.push(Path::new(&h).join(".docker/config.json"));
    }
    files
}

/// The credentials for `host` in the first of `files` that has some; a
/// file that is there but unreadable or malformed is an error naming it.
pub fn credentials(host: &str, files: &[PathBuf]) -> Result<Option<Credentials>, OciError> {
    #[derive(Deserialize)]
    struct File {
        #[serde(default)]
        auths: BTreeMap<String, Entry>,
    }
    #[derive(Deserialize)]
    struct Entry {
        #[serde(default)]
        auth: String,
    }
    for path in files {
        let io = |e: std::io::Error| OciError::Io {
            what: format!("auth file {}", path.display()),
            source: e,
        };
        let f = match std::fs::File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io(e)),
        };
        let mut raw = Vec::new();
        f.take(MAX_JSON + 1).read_to_end(&mut raw).map_err(io)?;
        if raw.len() as u64 > MAX_JSON {
            return Err(io(std::io::Error::other(format!("over {MAX_JSON} bytes"))));
        }
        let file: File = serde_json::from_slice(&raw).map_err(|e| OciError::Json {
            what: format!("auth file {}", path.display()),
            why: e.to_string(),
        })?;
        let found = file
            .auths
            .iter()
            .find(|(k, e)| !e.auth.is_empty() && same_registry(k, host));
        if let Some((key, e)) = found {
            let bad = |why: &str| OciError::Json {
                what: format!("auth file {}: {key:?}", path.display()),
                why: why.into(),
            };
            let plain = base64::engine::general_purpose::STANDARD
                .decode(e.auth.trim())
                .map_err(|_| bad("`auth` is not base64"))?;
            if !plain.contains(&b':') {
                return Err(bad("`auth` is not base64 of USER:PASSWORD"));
            }
            return Ok(Some(Credentials {
                basic: e.auth.trim().to_owned(),
                from: path.clone(),
            }));
        }
    }
    Ok(None)
}

/// Whether an auth file's key names the registry `host`: as written, or
/// as a URL (docker's `https://index.docker.io/v1/` for Docker Hub).
fn same_registry(key: &str, host: &str) -> bool {
    let k = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    let k = k.split('/').next().unwrap_or(k);
    let hub = |h: &str| matches!(h, "docker.io" | "index.docker.io" | "registry-1.docker.io");
    k == host || (hub(k) && hub(host))
}

/// A `WWW-Authenticate` challenge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Challenge {
    /// The scheme, in lower case (`bearer`, `basic`).
    pub scheme: String,
    /// Its parameters, names in lower case.
    pub params: BTreeMap<String, String>,
}

/// The first challenge of a `WWW-Authenticate` header (RFC 9110's
/// `scheme param=value, param="quoted \" value"`); `None` when it has no
/// scheme.
pub fn parse_challenge(header: &str) -> Option<Challenge> {
    let s = header.trim_start();
    let end = s.find(|c: char| c.is_whitespace()).unwrap_or(s.len());
    let scheme = &s[..end];
    if scheme.is_empty() || scheme.contains(['=', ',', '"']) {
        return None;
    }
    let mut params = BTreeMap::new();
    let mut rest = s[end..].chars().peekable();
    loop {
        while rest.peek().is_some_and(|c| c.is_whitespace() || *c == ',') {
            rest.next();
        }
        let mut name = String::new();
        while let Some(&c) = rest.peek() {
            if c == '=' || c == ',' || c.is_whitespace() {
                break;
            }
            name.push(c);
            rest.next();
        }
        if name.is_empty() {
            break;
        }
        while rest.peek().is_some_and(|c| c.is_whitespace()) {
            rest.next();
        }
        if rest.peek() != Some(&'=') {
            // A second challenge's scheme (or token68): the first ends.
            break;
        }
        rest.next();
        while rest.peek().is_some_and(|c| c.is_whitespace()) {
            rest.next();
        }
        let mut value = String::new();
        if rest.peek() == Some(&'"') {
            rest.next();
            while let Some(c) = rest.next() {
                match c {
                    '"' => break,
                    '\\' => value.extend(rest.next()),
                    c => value.push(c),
                }
            }
        } else {
            while let Some(&c) = rest.peek() {
                if c == ',' || c.is_whitespace() {
                    break;
                }
                value.push(c);
                rest.next();
            }
        }
        params.insert(name.to_ascii_lowercase(), value);
    }
    Some(Challenge {
        scheme: scheme.to_ascii_lowercase(),
        params,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges_parse_as_registries_send_them() {
        let c = parse_challenge(
            r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/debian:pull""#,
        )
        .unwrap();
        assert_eq!(c.scheme, "bearer");
        assert_eq!(c.params["realm"], "https://auth.docker.io/token");
        assert_eq!(c.params["service"], "registry.docker.io");
        assert_eq!(c.params["scope"], "repository:library/debian:pull");
        let c = parse_challenge(r#"Basic realm="my \"realm\", here""#).unwrap();
        assert_eq!(c.scheme, "basic");
        assert_eq!(c.params["realm"], r#"my "realm", here"#);
        let c = parse_challenge("  bearer Realm = http://h/t , service=s,").unwrap();
        assert_eq!(c.params["realm"], "http://h/t");
        assert_eq!(c.params["service"], "s");
        // Only the first of two challenges.
        let c = parse_challenge(r#"Bearer realm="r", Basic realm="b""#).unwrap();
        assert_eq!(c.params.len(), 1);
        assert_eq!(c.params["realm"], "r");
        // Unterminated quotes end with the header.
        let c = parse_challenge(r#"Bearer realm="r"#).unwrap();
        assert_eq!(c.params["realm"], "r");
        assert_eq!(parse_challenge(""), None);
        assert_eq!(parse_challenge("realm=x"), None);
    }

    #[test]
    fn credentials_come_from_the_first_file_that_names_the_host() {
        let tmp = tempfile::tempdir().unwrap();
        let a = tmp.path().join("a.json");
        let b = tmp.path().join("b.json");
        let missing = tmp.path().join("none.json");
        // base64("u:p") and base64("v:q").
        std::fs::write(&a, r#"{"auths": {"other:5000": {"auth": "dTpw"}}}"#).unwrap();
        std::fs::write(
            &b,
            r#"{"auths": {"reg:5000": {"auth": "djpx"}, "https://index.docker.io/v1/": {"auth": "dTpw"}}}"#,
        )
        .unwrap();
        let files = [missing.clone(), a.clone(), b.clone()];
        let c = credentials("reg:5000", &files).unwrap().unwrap();
        assert_eq!((c.basic.as_str(), c.from.as_path()), ("djpx", b.as_path()));
        let c = credentials("other:5000", &files).unwrap().unwrap();
        assert_eq!(c.from, a);
        let c = credentials("docker.io", &files).unwrap().unwrap();
        assert_eq!(c.basic, "dTpw");
        assert!(credentials("nowhere", &files).unwrap().is_none());
        std::fs::write(&a, "{").unwrap();
        let e = credentials("reg:5000", &files).unwrap_err().to_string();
        assert!(e.contains("a.json"), "{e}");
        std::fs::write(&a, r#"{"auths": {"reg:5000": {"auth": "!!"}}}"#).unwrap();
        let e = credentials("reg:5000", &files).unwrap_err().to_string();
        assert!(e.contains("not base64"), "{e}");
    }
}
