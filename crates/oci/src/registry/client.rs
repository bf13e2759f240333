//! Talking to a registry: requests with the authorization its 401 asked
//! for (a bearer token from its token service, or basic credentials),
//! manifests and config blobs read within a bound and checked against
//! their digests, and the image a reference names resolved as a layout's
//! is (an index to this machine's platform).

use std::sync::Mutex;
use std::time::Duration;

use ureq::http::Response;
use ureq::Body;

use super::auth::{self, Challenge, Credentials};
use super::blob::Blob;
use super::reference::Reference;
use crate::digest::Digest;
use crate::layout::{
    resolve, Documents, Image, Layer, Platform, DOCKER_LIST, DOCKER_MANIFEST, MAX_JSON, OCI_INDEX,
    OCI_MANIFEST,
};
use crate::store::BlobSource;
use crate::OciError;

/// How to reach a registry.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// Plain HTTP rather than HTTPS (skopeo's `--tls-verify=false`).
    pub plain_http: bool,
    /// The auth files looked in for credentials, first found first (see
    /// [`auth::auth_files`]).
    pub auth_files: Vec<std::path::PathBuf>,
}

/// Waits, each bounded: a registry that stops answering is an error, not
/// a hang.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(60);
const READ_TIMEOUT: Duration = Duration::from_secs(60);
/// Most of an error answer's body kept for its message.
const MAX_ERROR_BODY: u64 = 64 << 10;

/// What a request sends.
pub(crate) enum Payload<'a> {
    /// Nothing.
    None,
    /// These bytes (a manifest).
    Bytes(&'a [u8]),
    /// The file's bytes, this many (a blob).
    File(&'a std::path::Path, u64),
}

/// A failed request: whether another try may do better, and why.
#[derive(Debug)]
pub(crate) struct Failure {
    pub transient: bool,
    pub why: String,
}

impl Failure {
    pub(crate) fn fatal(why: impl Into<String>) -> Failure {
        Failure {
            transient: false,
            why: why.into(),
        }
    }
}

/// A registry's repository, as a reference names it.
pub struct Client {
    agent: ureq::Agent,
    /// `https://HOST` (or `http://`).
    base: String,
    reference: Reference,
    credentials: Option<Credentials>,
    /// Where credentials were looked for, for the error without them.
    looked_in: String,
    /// The `Authorization` header the last 401 asked for.
    authorization: Mutex<Option<String>>,
}

impl Client {
    /// A client for `reference`'s repository.
    pub fn new(reference: Reference, options: &Options) -> Result<Client, OciError> {
        let credentials = auth::credentials(&reference.host, &options.auth_files)?;
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .https_only(!options.plain_http)
            .timeout_connect(Some(CONNECT_TIMEOUT))
            .timeout_recv_response(Some(RESPONSE_TIMEOUT))
            .timeout_per_read(Some(READ_TIMEOUT))
            .user_agent(concat!("foliofs/", env!("CARGO_PKG_VERSION")))
            .build();
        let scheme = if options.plain_http { "http" } else { "https" };
        Ok(Client {
            agent: foliofs_block::remote::resolve::agent(config),
            base: format!("{scheme}://{}", reference.api_host()),
            looked_in: options
                .auth_files
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            reference,
            credentials,
            authorization: Mutex::new(None),
        })
    }

    /// The reference this client was made for.
    pub fn reference(&self) -> &Reference {
        &self.reference
    }

    /// An error about this reference.
    pub(crate) fn error(&self, why: impl Into<String>) -> OciError {
        OciError::Registry {
            what: self.reference.to_string(),
            why: why.into(),
        }
    }

    /// The image the reference names; `platform`'s when it names an
    /// index.
    pub fn image(&self, platform: &Platform) -> Result<Image, OciError> {
        let r = self.reference.manifest_ref();
        let (raw, media_type, digest) = self.manifest_raw(&r, None)?;
        resolve(self, &media_type, digest, &raw, platform)
    }

    /// The native EROFS image the reference names (an index's entry for
    /// `platform` with `erofs` in its `os.features`, or a manifest of
    /// EROFS layers); `None` when it names only a tar image.
    pub fn native_image(
        &self,
        platform: &Platform,
    ) -> Result<Option<crate::native::NativeImage>, OciError> {
        let r = self.reference.manifest_ref();
        let (raw, media_type, digest) = self.manifest_raw(&r, None)?;
        crate::native::resolve_native(self, &media_type, digest, &raw, platform)
    }

    /// `GET /v2/NAME/PATH` with `headers`, answering a 401 once with the
    /// authorization it asks for; any other status is the caller's. Every
    /// request is answered so, not just a client's first: a bearer token
    /// that expires mid-pull is replaced by a new one at the next request
    /// it fails (a blob's `Range` resume too).
    pub(crate) fn get(
        &self,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Result<Response<Body>, Failure> {
        self.send("GET", &self.url(path), headers, &Payload::None)
    }

    /// `https://HOST/v2/NAME/PATH`.
    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}/v2/{}/{path}", self.base, self.reference.repository)
    }

    /// The URL a `Location` header names, made absolute against the
    /// registry (the distribution spec allows either).
    pub(crate) fn absolute(&self, location: &str) -> String {
        if location.starts_with("http://") || location.starts_with("https://") {
            location.to_owned()
        } else if location.starts_with('/') {
            format!("{}{location}", self.base)
        } else {
            format!("{}/{location}", self.base)
        }
    }

    /// `method` on `url` with `headers` and `payload` (sent afresh when a
    /// 401 is answered), as [`Client::get`] does it.
    pub(crate) fn send(
        &self,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        payload: &Payload,
    ) -> Result<Response<Body>, Failure> {
        self.send_within(method, url, headers, payload, None)
    }

    /// [`Client::send`], each request within `timeout` when one is given
    /// (a lazy read's, whose caller retries) rather than the client's own
    /// bounds.
    pub(crate) fn send_within(
        &self,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        payload: &Payload,
        timeout: Option<Duration>,
    ) -> Result<Response<Body>, Failure> {
        let send = |authorization: Option<&str>| {
            let mut req = ureq::http::Request::builder().method(method).uri(url);
            for (k, v) in headers {
                req = req.header(*k, *v);
            }
            if let Some(a) = authorization {
                req = req.header("authorization", a);
            }
            let build = |req: ureq::http::request::Builder, body| {
                req.body(body)
                    .map_err(|e| Failure::fatal(format!("{method} {url}: {e}")))
            };
            let sent = match payload {
                Payload::None => {
                    let mut req = req
                        .body(())
                        .map_err(|e| Failure::fatal(format!("{method} {url}: {e}")))?;
                    if let Some(t) = timeout {
                        req = self
                            .agent
                            .configure_request(req)
                            .timeout_global(Some(t))
                            .build();
                    }
                    self.agent.run(req)
                }
                Payload::Bytes(b) => {
                    let mut bytes = *b;
                    let req = req.header("content-length", b.len().to_string());
                    self.agent
                        .run(build(req, ureq::SendBody::from_reader(&mut bytes))?)
                }
                Payload::File(path, size) => {
                    // Streamed from the file, never held whole.
                    let mut file = std::fs::File::open(path)
                        .map_err(|e| Failure::fatal(format!("{}: {e}", path.display())))?;
                    let req = req.header("content-length", size.to_string());
                    self.agent
                        .run(build(req, ureq::SendBody::from_reader(&mut file))?)
                }
            };
            sent.map_err(|e| {
                let mut f = transport(e);
                if !self.base.starts_with("http:")
                    && (f.why.contains("TLS") || f.why.contains("corrupt message"))
                {
                    f.why
                        .push_str(" (a registry on plain HTTP needs --tls-verify=false)");
                }
                f
            })
        };
        let push = !matches!(method, "GET" | "HEAD");
        let held = self
            .authorization
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let resp = send(held.as_deref())?;
        if resp.status() != 401 {
            return Ok(resp);
        }
        let challenge = header(&resp, "www-authenticate").and_then(auth::parse_challenge);
        let authorization = match challenge {
            Some(c) if c.scheme == "bearer" => format!("Bearer {}", self.token(&c, push)?),
            Some(c) if c.scheme == "basic" => match &self.credentials {
                Some(cr) => format!("Basic {}", cr.basic),
                None => return Err(self.unauthorized()),
            },
            Some(c) => {
                return Err(Failure::fatal(format!(
                    "401 Unauthorized, asking for {:?} authentication, which this does not do",
                    c.scheme
                )))
            }
            None => return Err(self.unauthorized()),
        };
        if held.as_deref() == Some(authorization.as_str()) && authorization.starts_with("Basic") {
            return Err(self.unauthorized());
        }
        *self.authorization.lock().unwrap_or_else(|p| p.into_inner()) = Some(authorization.clone());
        let resp = send(Some(&authorization))?;
        if resp.status() != 401 {
            return Ok(resp);
        }
        // A token just issued and refused at once is the token service's
        // or the registry's fault (a token already expired, for another
        // service, ...), not the credentials': asking again would only
        // get the same, so this is the end.
        match header(&resp, "www-authenticate").and_then(auth::parse_challenge) {
            Some(c) if authorization.starts_with("Bearer") && c.scheme == "bearer" => {
                Err(Failure::fatal(format!(
                    "401 Unauthorized: the registry refused the token its token service {} \
                     had just given{}",
                    c.params.get("realm").map_or("", String::as_str),
                    c.params
                        .get("error")
                        .map(|e| format!(" ({e})"))
                        .unwrap_or_default()
                )))
            }
            _ => Err(self.unauthorized()),
        }
    }

    /// Where credentials were looked for, for an error without them.
    fn looked_in(&self) -> &str {
        if self.looked_in.is_empty() {
            "any auth file (none is set)"
        } else {
            &self.looked_in
        }
    }

    fn unauthorized(&self) -> Failure {
        Failure::fatal(match &self.credentials {
            Some(c) => format!(
                "401 Unauthorized: the registry refused the credentials for {} from {}",
                self.reference.host,
                c.from.display()
            ),
            None => format!(
                "401 Unauthorized: the registry wants credentials, and none for {} are in {}",
                self.reference.host,
                self.looked_in()
            ),
        })
    }

    /// A bearer token from the token service `c` names, asked for with
    /// the basic credentials when there are some, for the scope the
    /// challenge names (else pulling, and pushing too when `push`).
    fn token(&self, c: &Challenge, push: bool) -> Result<String, Failure> {
        use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
        let realm = c.params.get("realm").ok_or_else(|| {
            Failure::fatal("401 Unauthorized: a Bearer challenge without a realm")
        })?;
        let scope = c.params.get("scope").cloned().unwrap_or_else(|| {
            format!(
                "repository:{}:{}",
                self.reference.repository,
                if push { "pull,push" } else { "pull" }
            )
        });
        let mut url = realm.clone();
        let mut sep = if url.contains('?') { '&' } else { '?' };
        for (k, v) in [
            ("service", c.params.get("service")),
            ("scope", Some(&scope)),
        ] {
            if let Some(v) = v {
                url.push_str(&format!(
                    "{sep}{k}={}",
                    utf8_percent_encode(v, NON_ALPHANUMERIC)
                ));
                sep = '&';
            }
        }
        let mut req = self.agent.get(&url);
        if let Some(cr) = &self.credentials {
            req = req.header("authorization", format!("Basic {}", cr.basic));
        }
        let mut resp = req.call().map_err(|e| Failure {
            why: format!("the token service {realm}: {}", transport(e).why),
            transient: true,
        })?;
        let status = resp.status().as_u16();
        if status != 200 {
            let mut f = status_failure(&mut resp);
            f.why = match (&self.credentials, status) {
                (Some(cr), 401 | 403) => format!(
                    "the token service {realm} refused the credentials from {}: {}",
                    cr.from.display(),
                    f.why
                ),
                (None, 401 | 403) => format!(
                    "the token service {realm} wants credentials, and none for {} are in {}: {}",
                    self.reference.host,
                    self.looked_in(),
                    f.why
                ),
                _ => format!("the token service {realm}: {}", f.why),
            };
            return Err(f);
        }
        #[derive(serde::Deserialize)]
        struct Token {
            #[serde(default)]
            token: String,
            #[serde(default)]
            access_token: String,
        }
        let raw = read_json(&mut resp)
            .map_err(|why| Failure::fatal(format!("the token service {realm}: {why}")))?;
        let t: Token = serde_json::from_slice(&raw)
            .map_err(|e| Failure::fatal(format!("the token service {realm}: {e}")))?;
        let t = if t.token.is_empty() {
            t.access_token
        } else {
            t.token
        };
        if t.is_empty() || !t.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(Failure::fatal(format!(
                "the token service {realm} sent no usable token"
            )));
        }
        Ok(t)
    }

    /// The manifest or index `r` (a tag or a digest) names: its bytes,
    /// media type and digest, checked against `want` (digest and size)
    /// when given, against the digest `r` is when it is one, and against
    /// the registry's `Docker-Content-Digest`.
    fn manifest_raw(
        &self,
        r: &str,
        want: Option<(&Digest, u64)>,
    ) -> Result<(Vec<u8>, String, Digest), OciError> {
        let what = format!("manifest {r}");
        let accept = [OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, DOCKER_LIST].join(", ");
        let mut resp = self
            .get(&format!("manifests/{r}"), &[("accept", &accept)])
            .map_err(|f| self.error(format!("{what}: {}", f.why)))?;
        if resp.status() != 200 {
            let f = status_failure(&mut resp);
            return Err(self.error(format!("{what}: {}", f.why)));
        }
        let media_type = header(&resp, "content-type")
            .map(|t| t.split(';').next().unwrap_or("").trim().to_owned())
            .filter(|t| {
                [OCI_MANIFEST, OCI_INDEX, DOCKER_MANIFEST, DOCKER_LIST].contains(&t.as_str())
            })
            .unwrap_or_default();
        let said = header(&resp, "docker-content-digest").map(str::to_owned);
        let raw = read_json(&mut resp).map_err(|why| self.error(format!("{what}: {why}")))?;
        let got = Digest::of(&raw);
        let by_digest = Digest::parse(r).ok();
        for want in want.map(|w| w.0).into_iter().chain(by_digest.as_ref()) {
            if &got != want {
                return Err(OciError::Mismatch {
                    what: format!("{}: {what}", self.reference),
                    want: want.clone(),
                    got,
                });
            }
        }
        if let Some((_, size)) = want {
            if raw.len() as u64 != size {
                return Err(self.error(format!(
                    "{what}: {} bytes, but its descriptor says {size}",
                    raw.len()
                )));
            }
        }
        if let Some(said) = said {
            let said = Digest::parse(&said)
                .map_err(|e| self.error(format!("{what}: Docker-Content-Digest: {e}")))?;
            if said != got {
                return Err(OciError::Mismatch {
                    what: format!("{}: {what} (its Docker-Content-Digest)", self.reference),
                    want: said,
                    got,
                });
            }
        }
        Ok((raw, media_type, got))
    }
}

impl Documents for Client {
    fn manifest(&self, digest: &Digest, size: u64) -> Result<Vec<u8>, OciError> {
        Ok(self
            .manifest_raw(&digest.to_string(), Some((digest, size)))?
            .0)
    }

    fn config(&self, digest: &Digest, size: u64) -> Result<Vec<u8>, OciError> {
        let what = format!("config {digest}");
        if size > MAX_JSON {
            return Err(self.error(format!("{what}: {size} bytes of JSON, over {MAX_JSON}")));
        }
        // Read whole within its bound, as a manifest is (not a Blob's
        // resumable stream: it is small).
        let mut resp = self
            .get(&format!("blobs/{digest}"), &[])
            .map_err(|f| self.error(format!("{what}: {}", f.why)))?;
        if resp.status() != 200 {
            let f = status_failure(&mut resp);
            return Err(self.error(format!("{what}: {}", f.why)));
        }
        let raw = read_json(&mut resp).map_err(|why| self.error(format!("{what}: {why}")))?;
        let got = Digest::of(&raw);
        if &got != digest {
            return Err(OciError::Mismatch {
                what: format!("{}: {what}", self.reference),
                want: digest.clone(),
                got,
            });
        }
        if raw.len() as u64 != size {
            return Err(self.error(format!(
                "{what}: {} bytes, but its descriptor says {size}",
                raw.len()
            )));
        }
        Ok(raw)
    }

    fn bad(&self, why: String) -> OciError {
        self.error(why)
    }
}

impl BlobSource for Client {
    fn open_blob(&self, layer: &Layer) -> Result<Box<dyn std::io::Read + '_>, OciError> {
        Ok(Box::new(Blob::open(self, &layer.digest, layer.size)?))
    }
}

pub(crate) fn header<'a>(resp: &'a Response<Body>, name: &str) -> Option<&'a str> {
    resp.headers().get(name).and_then(|v| v.to_str().ok())
}

/// A JSON answer's body, refused past [`MAX_JSON`].
fn read_json(resp: &mut Response<Body>) -> Result<Vec<u8>, String> {
    if resp.body().content_length().is_some_and(|n| n > MAX_JSON) {
        return Err(format!("over {MAX_JSON} bytes of JSON"));
    }
    resp.body_mut()
        .with_config()
        .limit(MAX_JSON)
        .read_to_vec()
        .map_err(|e| match e {
            ureq::Error::BodyExceedsLimit(_) => format!("over {MAX_JSON} bytes of JSON"),
            e => transport(e).why,
        })
}

/// An answer that is not the one wanted, as a failure: its status, and
/// the registry's own message when its body has one.
pub(crate) fn status_failure(resp: &mut Response<Body>) -> Failure {
    let status = resp.status();
    let body = resp
        .body_mut()
        .with_config()
        .limit(MAX_ERROR_BODY)
        .read_to_vec()
        .unwrap_or_default();
    // The distribution spec's `{"errors": [{"code", "message"}]}`.
    #[derive(serde::Deserialize)]
    struct Errors {
        errors: Vec<Error>,
    }
    #[derive(serde::Deserialize)]
    struct Error {
        #[serde(default)]
        code: String,
        #[serde(default)]
        message: String,
    }
    let said = serde_json::from_slice::<Errors>(&body)
        .ok()
        .and_then(|e| e.errors.into_iter().next())
        .map(|e| {
            let text = format!("{} {}", e.code, e.message);
            format!(" ({})", text.trim().chars().take(200).collect::<String>())
        })
        .unwrap_or_default();
    Failure {
        transient: matches!(status.as_u16(), 408 | 429 | 500..=599),
        why: format!(
            "{} {}{said}",
            status.as_u16(),
            status.canonical_reason().unwrap_or("")
        ),
    }
}

/// A ureq failure: transient but for TLS and a redirect to plain HTTP.
pub(crate) fn transport(e: ureq::Error) -> Failure {
    use ureq::Error as E;
    let (transient, why) = match e {
        E::Timeout(what) => (true, format!("timed out ({what})")),
        E::ConnectionFailed => (true, "connection failed".to_owned()),
        E::HostNotFound => (true, "host not found".to_owned()),
        E::Io(io) => (true, io.to_string()),
        E::Protocol(p) => (true, format!("HTTP protocol error: {p}")),
        E::Rustls(t) => (false, format!("TLS: {t}")),
        E::Tls(t) => (false, format!("TLS: {t}")),
        E::RequireHttpsOnly(u) => (
            false,
            format!("{u} is plain HTTP (allowed only with --tls-verify=false)"),
        ),
        other => (false, other.to_string()),
    };
    Failure { transient, why }
}
