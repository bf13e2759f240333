//! Name resolution for the HTTP clients, without a thread per request.
//!
//! ureq resolves a request's host before it looks for a pooled
//! connection, and under a timeout it resolves on a thread of its own,
//! made and joined for every request: for a ranged GET on a kept-open
//! connection that is a thread's start-up for nothing, measured here at
//! half a millisecond or more, a sixth of a read from a registry on
//! loopback. This resolver answers an address literal at once and keeps a
//! name's addresses for [`TTL`], so that only a name not looked up lately
//! costs a lookup (ureq's own, with its timeout).
//!
//! ureq marks its resolver interface as outside its semver promise; the
//! lock file holds the version this was written against.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ureq::config::Config;
use ureq::http::Uri;
use ureq::unversioned::resolver::{DefaultResolver, ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::{DefaultConnector, NextTimeout};

/// How long a name's addresses are kept.
const TTL: Duration = Duration::from_secs(30);

/// See the module's notes.
#[derive(Debug, Default)]
pub struct Resolve {
    names: Mutex<HashMap<String, (Instant, ResolvedSocketAddrs)>>,
}

impl Resolver for Resolve {
    fn resolve(
        &self,
        uri: &Uri,
        config: &Config,
        timeout: NextTimeout,
    ) -> Result<ResolvedSocketAddrs, ureq::Error> {
        let port = uri.port_u16().or(match uri.scheme_str() {
            Some("https") => Some(443),
            Some("http") => Some(80),
            _ => None,
        });
        let host = uri.host().unwrap_or_default();
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        if let (Ok(ip), Some(port)) = (bare.parse::<IpAddr>(), port) {
            let mut out = self.empty();
            out.push(SocketAddr::new(ip, port));
            return Ok(out);
        }
        let key = format!("{host}:{port:?}");
        let names = || self.names.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, addrs)) = names().get(&key) {
            if at.elapsed() < TTL {
                return Ok(addrs.clone());
            }
        }
        let addrs = DefaultResolver::default().resolve(uri, config, timeout)?;
        names().insert(key, (Instant::now(), addrs.clone()));
        Ok(addrs)
    }
}

/// An agent with `config` that resolves with [`Resolve`].
pub fn agent(config: Config) -> ureq::Agent {
    ureq::Agent::with_parts(config, DefaultConnector::default(), Resolve::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(r: &Resolve, uri: &str) -> Vec<SocketAddr> {
        let uri: Uri = uri.parse().unwrap();
        let config = Config::default();
        r.resolve(&uri, &config, NextTimeout::default())
            .unwrap()
            .iter()
            .copied()
            .collect()
    }

    #[test]
    fn literals_are_taken_as_they_are_and_names_are_kept() {
        let r = Resolve::default();
        assert_eq!(
            resolve(&r, "http://127.0.0.1:5000/v2/"),
            ["127.0.0.1:5000".parse().unwrap()]
        );
        assert_eq!(
            resolve(&r, "https://[::1]/x"),
            ["[::1]:443".parse().unwrap()]
        );
        let first = resolve(&r, "http://localhost:81/");
        assert!(!first.is_empty() && first.iter().all(|a| a.port() == 81));
        assert_eq!(r.names.lock().unwrap().len(), 1);
        assert_eq!(resolve(&r, "http://localhost:81/"), first);
    }
}
