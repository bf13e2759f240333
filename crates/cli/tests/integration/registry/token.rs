//! A token service of the tests' own, for a docker-registry configured
//! with `auth: token` (Debian ships none): HTTP/1.1 on a free loopback
//! port, answering `GET /token?service=S&scope=repository:NAME:ACTIONS`
//! with a JWT the registry verifies as distribution 2.8 does
//! (`registry/auth/token/token.go`): signed RS256 by a key whose
//! self-signed certificate is both the token's `x5c` and the registry's
//! `rootcertbundle`, with `iss`, `aud` (the service), `exp`, `nbf` and
//! the `access` granted from the scope.
//!
//! Key and certificate are made with the `openssl` CLI at start, and each
//! token is signed by `openssl dgst -sha256 -sign` (an RSA PKCS#1 v1.5
//! signature is the JWS RS256 signature as it is), so the tests need no
//! crypto crate of their own.
//!
//! One thread per connection, one request per connection
//! (`Connection: close`); stopped when dropped.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;

use crate::common;

/// The registry's `service` (the tokens' audience) and the tokens'
/// issuer.
pub const SERVICE: &str = "foliofs-test-registry";
pub const ISSUER: &str = "foliofs-test-tokens";

/// distribution 2.8 accepts a token until `exp` plus this (its `Leeway`,
/// for clock skew), so a token meant to be good for less is given an
/// `exp` this much earlier.
const REGISTRY_LEEWAY: Duration = Duration::from_secs(60);

/// The longest a client may take to send its request head.
const READ_TIMEOUT: Duration = Duration::from_secs(10);
/// The largest request head accepted.
const MAX_HEAD: usize = 64 << 10;

/// Who may have tokens.
#[derive(Clone, Debug)]
pub struct Policy {
    /// The one user:password whose Basic credentials get pull and push;
    /// other credentials are refused with 401.
    pub user: (String, String),
    /// Whether a request without credentials gets pull (else 401).
    pub anonymous_pull: bool,
}

struct State {
    policy: Policy,
    key: PathBuf,
    /// The certificate, base64 DER, as the `x5c` header takes it.
    x5c: String,
    /// How long the registry is to accept the tokens issued from now on.
    valid_for: Mutex<Duration>,
    issued: AtomicU64,
    refused: AtomicU64,
    stop: AtomicBool,
    dir: PathBuf,
}

/// A token service on loopback, stopped when dropped.
pub struct TokenServer {
    addr: SocketAddr,
    state: Arc<State>,
    accept: Option<JoinHandle<()>>,
    dir: tempfile::TempDir,
}

impl TokenServer {
    /// Makes a key and certificate and starts serving tokens as `policy`
    /// says, each good for 5 minutes until [`TokenServer::set_valid_for`].
    pub fn start(policy: Policy) -> TokenServer {
        let dir = tempfile::Builder::new()
            .prefix("foliofs-tokens.")
            .tempdir()
            .unwrap();
        let out = common::run_timeout(
            Command::new("openssl")
                .args([
                    "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                ])
                .args(["-subj", &format!("/CN={ISSUER}")])
                .arg("-keyout")
                .arg(dir.path().join("key.pem"))
                .arg("-out")
                .arg(dir.path().join("cert.pem")),
            Duration::from_secs(60),
        );
        assert!(
            out.status.success(),
            "openssl req: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let out = common::run_timeout(
            Command::new("openssl")
                .args(["x509", "-outform", "DER", "-in"])
                .arg(dir.path().join("cert.pem")),
            Duration::from_secs(60),
        );
        assert!(
            out.status.success(),
            "openssl x509: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State {
            policy,
            key: dir.path().join("key.pem"),
            x5c: base64::engine::general_purpose::STANDARD.encode(&out.stdout),
            valid_for: Mutex::new(Duration::from_secs(300)),
            issued: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            dir: dir.path().to_owned(),
        });
        let s = state.clone();
        let accept = std::thread::Builder::new()
            .name("token-server".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if s.stop.load(Ordering::Relaxed) {
                        return;
                    }
                    let Ok(conn) = conn else { continue };
                    let s = s.clone();
                    let _ = std::thread::Builder::new()
                        .name("token-server-conn".into())
                        .spawn(move || {
                            let _ = serve(conn, &s);
                        });
                }
            })
            .unwrap();
        TokenServer {
            addr,
            state,
            accept: Some(accept),
            dir,
        }
    }

    /// `http://127.0.0.1:PORT/token`, the registry's `realm`.
    pub fn realm(&self) -> String {
        format!("http://{}/token", self.addr)
    }

    /// The certificate the registry takes as its `rootcertbundle`.
    pub fn cert(&self) -> PathBuf {
        self.dir.path().join("cert.pem")
    }

    /// The tokens issued from now on are accepted by the registry for
    /// `d` (to the second) after they are issued.
    pub fn set_valid_for(&self, d: Duration) {
        *self.state.valid_for.lock().unwrap() = d;
    }

    /// Tokens issued so far.
    pub fn issued(&self) -> u64 {
        self.state.issued.load(Ordering::Relaxed)
    }

    /// Requests refused (401) so far.
    pub fn refused(&self) -> u64 {
        self.state.refused.load(Ordering::Relaxed)
    }
}

impl Drop for TokenServer {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::Relaxed);
        // Wakes the accepting thread.
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

/// Answers one request on `conn`.
fn serve(conn: TcpStream, s: &State) -> std::io::Result<()> {
    conn.set_read_timeout(Some(READ_TIMEOUT))?;
    conn.set_write_timeout(Some(READ_TIMEOUT))?;
    let mut r = BufReader::new(conn.try_clone()?).take(MAX_HEAD as u64);
    let mut lines = Vec::new();
    loop {
        let mut line = String::new();
        if r.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let line = line.trim_end_matches(['\r', '\n']).to_owned();
        if line.is_empty() {
            break;
        }
        lines.push(line);
    }
    let (status, body) = answer(&lines, s);
    let reason = match status {
        200 => "OK",
        401 => "Unauthorized",
        404 => "Not Found",
        _ => "Internal Server Error",
    };
    let mut conn = conn;
    let mut head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if status == 401 {
        head.push_str("WWW-Authenticate: Basic realm=\"foliofs-test-tokens\"\r\n");
    }
    head.push_str("\r\n");
    conn.write_all(head.as_bytes())?;
    conn.write_all(body.as_bytes())?;
    conn.flush()
}

/// The status and JSON body for a request of these head lines.
fn answer(lines: &[String], s: &State) -> (u16, String) {
    let error = |status: u16, why: &str| {
        (
            status,
            serde_json::json!({"errors": [{"code": "DENIED", "message": why}]}).to_string(),
        )
    };
    let Some(target) = lines
        .first()
        .and_then(|l| l.strip_prefix("GET "))
        .and_then(|l| l.split(' ').next())
    else {
        return error(404, "only GET /token is served");
    };
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    if path != "/token" {
        return error(404, "only GET /token is served");
    }
    let params: Vec<(String, String)> = query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (unescape(k), unescape(v)))
        .collect();
    let basic = lines.iter().skip(1).find_map(|l| {
        let (k, v) = l.split_once(':')?;
        if !k.trim().eq_ignore_ascii_case("authorization") {
            return None;
        }
        let v = v.trim();
        let (scheme, cred) = v.split_once(' ')?;
        if !scheme.eq_ignore_ascii_case("basic") {
            return None;
        }
        let raw = base64::engine::general_purpose::STANDARD
            .decode(cred.trim())
            .ok()?;
        let text = String::from_utf8(raw).ok()?;
        let (u, p) = text.split_once(':')?;
        Some((u.to_owned(), p.to_owned()))
    });
    let (subject, may): (&str, &[&str]) = match &basic {
        Some(c) if *c == s.policy.user => (&s.policy.user.0, &["pull", "push"]),
        None if s.policy.anonymous_pull => ("", &["pull"]),
        _ => {
            s.refused.fetch_add(1, Ordering::Relaxed);
            return error(401, "authentication required");
        }
    };
    if !params.iter().any(|(k, v)| k == "service" && v == SERVICE) {
        return error(404, &format!("this serves tokens for {SERVICE} only"));
    }
    // Each `scope` is `repository:NAME:ACTION,...`; what it asks is
    // granted as far as the policy allows.
    let access: Vec<serde_json::Value> = params
        .iter()
        .filter(|(k, _)| k == "scope")
        .flat_map(|(_, v)| v.split(' '))
        .filter_map(|scope| {
            let (kind, rest) = scope.split_once(':')?;
            let (name, actions) = rest.rsplit_once(':')?;
            let granted: Vec<&str> = actions.split(',').filter(|a| may.contains(a)).collect();
            Some(serde_json::json!({"type": kind, "name": name, "actions": granted}))
        })
        .collect();
    let valid_for = *s.valid_for.lock().unwrap();
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let n = s.issued.load(Ordering::Relaxed);
    let header = serde_json::json!({"typ": "JWT", "alg": "RS256", "x5c": [s.x5c]});
    let claims = serde_json::json!({
        "iss": ISSUER,
        "sub": subject,
        "aud": SERVICE,
        "exp": now + valid_for.as_secs() as i64 - REGISTRY_LEEWAY.as_secs() as i64,
        "nbf": now,
        "iat": now,
        "jti": format!("{now}-{n}-{}", rand::random::<u64>()),
        "access": access,
    });
    let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
    let signing_input = format!(
        "{}.{}",
        b64(header.to_string().as_bytes()),
        b64(claims.to_string().as_bytes())
    );
    let signature = match sign(&s.dir, &s.key, signing_input.as_bytes()) {
        Ok(sig) => sig,
        Err(why) => return error(500, &why),
    };
    let token = format!("{signing_input}.{}", b64(&signature));
    s.issued.fetch_add(1, Ordering::Relaxed);
    (
        200,
        serde_json::json!({
            "token": token,
            "access_token": token,
            "expires_in": valid_for.as_secs(),
        })
        .to_string(),
    )
}

/// `input`'s RS256 signature by the key `key`.
fn sign(dir: &Path, key: &Path, input: &[u8]) -> Result<Vec<u8>, String> {
    let file = tempfile::NamedTempFile::new_in(dir).map_err(|e| e.to_string())?;
    std::fs::write(file.path(), input).map_err(|e| e.to_string())?;
    let out = common::try_run_timeout(
        Command::new("openssl")
            .args(["dgst", "-sha256", "-sign"])
            .arg(key)
            .arg(file.path()),
        Duration::from_secs(30),
    )?;
    if !out.status.success() || out.stdout.len() != 256 {
        return Err(format!(
            "openssl dgst -sign: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(out.stdout)
}

/// A query component, percent-decoded (`+` as a space, as forms have it).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    let hex = |c: u8| (c as char).to_digit(16);
    while i < b.len() {
        match (
            b[i],
            b.get(i + 1).and_then(|&c| hex(c)),
            b.get(i + 2).and_then(|&c| hex(c)),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
            (b'+', ..) => out.push(b' '),
            (c, ..) => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
