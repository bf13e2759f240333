//! `docker://` references, as skopeo spells them: `docker://NAME[:TAG]`
//! or `docker://NAME@sha256:HEX`, where NAME's first component is a
//! registry host when it has a `.` or a `:` or is `localhost`, and
//! otherwise the image is Docker Hub's (`library/` before a name of one
//! component).

use crate::digest::Digest;
use crate::OciError;

/// Docker Hub, as references name it.
pub const DOCKER_HUB: &str = "docker.io";
/// The host Docker Hub's API answers on.
const DOCKER_HUB_API: &str = "registry-1.docker.io";
/// Longest reference taken (distribution's limit on a name is 255).
const MAX_REFERENCE: usize = 1024;

/// An image in a registry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reference {
    /// The registry as the reference names it (`docker.io`,
    /// `127.0.0.1:5000`).
    pub host: String,
    /// The repository (`library/debian`).
    pub repository: String,
    /// The tag, when not named by digest (`latest` when none is given).
    pub tag: Option<String>,
    /// The manifest's digest, when named by it.
    pub digest: Option<Digest>,
}

impl Reference {
    /// `docker://...` parsed; `None` when `s` is not a `docker://`
    /// reference, an error naming what is wrong when it is a malformed one.
    pub fn parse(s: &str) -> Option<Result<Reference, OciError>> {
        let rest = s.strip_prefix("docker://")?;
        Some(parse_name(rest).map_err(|why| OciError::Json {
            what: format!("image reference {:?}", cut(s)),
            why,
        }))
    }

    /// The host the registry's API is on.
    pub fn api_host(&self) -> &str {
        if self.host == DOCKER_HUB {
            DOCKER_HUB_API
        } else {
            &self.host
        }
    }

    /// The tag or digest, as the API's manifest URL takes it.
    pub fn manifest_ref(&self) -> String {
        match (&self.digest, &self.tag) {
            (Some(d), _) => d.to_string(),
            (None, Some(t)) => t.clone(),
            (None, None) => "latest".into(),
        }
    }
}

impl std::fmt::Display for Reference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "docker://{}/{}", self.host, self.repository)?;
        match (&self.digest, &self.tag) {
            (Some(d), _) => write!(f, "@{d}"),
            (None, Some(t)) => write!(f, ":{t}"),
            (None, None) => Ok(()),
        }
    }
}

fn cut(s: &str) -> String {
    s.chars().take(200).collect()
}

fn parse_name(s: &str) -> Result<Reference, String> {
    if s.len() > MAX_REFERENCE {
        return Err(format!("over {MAX_REFERENCE} bytes"));
    }
    let (name, digest) = match s.split_once('@') {
        Some((n, d)) => (n, Some(Digest::parse(d).map_err(|e| e.to_string())?)),
        None => (s, None),
    };
    // A tag follows the last `:` after the last `/` (a `:` before it is a
    // port's).
    let last = name.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match name[last..].rfind(':') {
        Some(i) => (&name[..last + i], Some(&name[last + i + 1..])),
        None => (name, None),
    };
    if let Some(t) = tag {
        if digest.is_some() {
            return Err("a tag and a digest both: name the image by one".into());
        }
        check_tag(t)?;
    }
    let (host, path) = match name.split_once('/') {
        Some((h, p)) if h.contains(['.', ':']) || h == "localhost" => (h, p.to_owned()),
        _ => (DOCKER_HUB, name.to_owned()),
    };
    check_host(host)?;
    let host = if host == "index.docker.io" {
        DOCKER_HUB
    } else {
        host
    };
    let repository = if host == DOCKER_HUB && !path.contains('/') {
        format!("library/{path}")
    } else {
        path
    };
    check_repository(&repository)?;
    Ok(Reference {
        host: host.to_owned(),
        repository,
        tag: match (&digest, tag) {
            (None, None) => Some("latest".into()),
            (_, t) => t.map(str::to_owned),
        },
        digest,
    })
}

fn check_tag(t: &str) -> Result<(), String> {
    let ok = !t.is_empty()
        && t.len() <= 128
        && !t.starts_with(['.', '-'])
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "tag {t:?}: expected up to 128 of A-Z a-z 0-9 _ . - (not first . or -)"
        ))
    }
}

fn check_host(h: &str) -> Result<(), String> {
    let ok = !h.is_empty()
        && h.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'[' | b']'));
    if ok {
        Ok(())
    } else {
        Err(format!("registry host {h:?} is not a host[:port]"))
    }
}

/// Distribution's grammar: components of lower-case letters and digits,
/// joined within by `.`, `_`, `__` or runs of `-`.
fn check_repository(r: &str) -> Result<(), String> {
    let component = |c: &str| {
        let b = c.as_bytes();
        let alnum = |x: u8| x.is_ascii_lowercase() || x.is_ascii_digit();
        if b.is_empty() || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
            return false;
        }
        let mut i = 0;
        while i < b.len() {
            if alnum(b[i]) {
                i += 1;
                continue;
            }
            let start = i;
            while i < b.len() && !alnum(b[i]) {
                i += 1;
            }
            let sep = &c[start..i];
            if !(sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|x| x == b'-')) {
                return false;
            }
        }
        true
    };
    if !r.is_empty() && r.len() <= 255 && r.split('/').all(component) {
        Ok(())
    } else {
        Err(format!(
            "repository {r:?}: expected lower-case letters and digits in /-separated components (joined by . _ __ or -)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(s: &str) -> Reference {
        Reference::parse(s).unwrap().unwrap()
    }

    #[test]
    fn references_name_host_repository_and_tag_as_skopeo_does() {
        let r = parsed("docker://debian");
        assert_eq!(
            (r.host.as_str(), r.repository.as_str(), r.tag.as_deref()),
            ("docker.io", "library/debian", Some("latest"))
        );
        assert_eq!(r.api_host(), "registry-1.docker.io");
        assert_eq!(r.to_string(), "docker://docker.io/library/debian:latest");
        let r = parsed("docker://user/app:1.2");
        assert_eq!(
            (r.host.as_str(), r.repository.as_str()),
            ("docker.io", "user/app")
        );
        assert_eq!(r.tag.as_deref(), Some("1.2"));
        let r = parsed("docker://127.0.0.1:5000/a/b-c:t");
        assert_eq!(
            (r.host.as_str(), r.repository.as_str(), r.tag.as_deref()),
            ("127.0.0.1:5000", "a/b-c", Some("t"))
        );
        assert_eq!(r.api_host(), "127.0.0.1:5000");
        let r = parsed("docker://localhost/x");
        assert_eq!((r.host.as_str(), r.repository.as_str()), ("localhost", "x"));
        let r = parsed("docker://quay.io/org/img");
        assert_eq!(
            (r.host.as_str(), r.tag.as_deref()),
            ("quay.io", Some("latest"))
        );
        let r = parsed("docker://index.docker.io/alpine");
        assert_eq!(
            (r.host.as_str(), r.repository.as_str()),
            ("docker.io", "library/alpine")
        );
        let hex = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        let r = parsed(&format!("docker://h.example:443/r@sha256:{hex}"));
        assert_eq!(r.tag, None);
        assert_eq!(r.manifest_ref(), format!("sha256:{hex}"));
        assert_eq!(
            r.to_string(),
            format!("docker://h.example:443/r@sha256:{hex}")
        );
    }

    #[test]
    fn malformed_references_are_refused_and_others_left_alone() {
        assert!(Reference::parse("oci:/a/b").is_none());
        assert!(Reference::parse("/docker://x").is_none());
        let hex = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        for bad in [
            "docker://",
            "docker://Debian",
            "docker://h:5000/",
            "docker://h:5000/a//b",
            "docker://a:",
            "docker://a:.x",
            "docker://a/-b",
            "docker://a@sha256:00",
            "docker://a@md5:00",
            "docker://h/a b",
            "docker://h_x:1/a",
        ] {
            assert!(Reference::parse(bad).unwrap().is_err(), "{bad}");
        }
        let both = format!("docker://a:t@sha256:{hex}");
        let e = Reference::parse(&both).unwrap().unwrap_err().to_string();
        assert!(e.contains("a tag and a digest"), "{e}");
    }
}
