//! A blob from a registry as one continuous reader: a connection that
//! breaks off is picked up again from the next byte (`Range: bytes=N-`)
//! a bounded number of times, so a decompressor reading it never sees the
//! break; and its end is an end only once the size and digest the
//! manifest gave are met, so no reader takes a short or wrong stream for
//! a whole one.

use std::io::{self, Read};
use std::time::Duration;

use sha2::{Digest as _, Sha256};

use super::client::{header, status_failure, Client, Failure};
use crate::digest::Digest;
use crate::OciError;

/// Most times a blob's download is picked up again after breaking off.
const MAX_RESUMES: u32 = 5;
/// The wait before a resume, times the tries since the last progress.
const RESUME_WAIT: Duration = Duration::from_millis(250);

/// The blob `digest` of `size` bytes, read from a registry.
pub struct Blob<'a> {
    client: &'a Client,
    digest: Digest,
    size: u64,
    body: Option<ureq::BodyReader<'static>>,
    hash: Sha256,
    got: u64,
    resumes: u32,
    /// Tries since bytes last came.
    idle_tries: u32,
    checked: bool,
}

impl<'a> Blob<'a> {
    /// Asks for the blob; a refusal (no such blob, no access) is an error
    /// here rather than at the first read.
    pub(crate) fn open(
        client: &'a Client,
        digest: &Digest,
        size: u64,
    ) -> Result<Blob<'a>, OciError> {
        let mut b = Blob {
            client,
            digest: digest.clone(),
            size,
            body: None,
            hash: Sha256::new(),
            got: 0,
            resumes: 0,
            idle_tries: 0,
            checked: false,
        };
        if size > 0 {
            let body = b
                .request()
                .map_err(|f| client.error(format!("blob {digest}: {}", f.why)))?;
            b.body = Some(body);
        }
        Ok(b)
    }

    /// The blob from byte `got` on.
    fn request(&self) -> Result<ureq::BodyReader<'static>, Failure> {
        // Every request names where it starts, the first too, so that a
        // registry which ignores ranges shows it at once.
        let range = format!("bytes={}-", self.got);
        let mut resp = self
            .client
            .get(&format!("blobs/{}", self.digest), &[("range", &range)])?;
        let left = self.size - self.got;
        let skip = match resp.status().as_u16() {
            206 => {
                let cr = header(&resp, "content-range").unwrap_or("(none)");
                let start = cr
                    .strip_prefix("bytes ")
                    .and_then(|r| r.split_once('-'))
                    .and_then(|(a, _)| a.parse::<u64>().ok());
                let total = cr.rsplit_once('/').map(|(_, t)| t);
                let total_ok = total.is_some_and(|t| t == "*" || t == self.size.to_string());
                if start != Some(self.got) || !total_ok {
                    return Err(Failure::fatal(format!(
                        "asked for bytes {}- of {}, got Content-Range {cr}",
                        self.got, self.size
                    )));
                }
                0
            }
            200 => self.got,
            _ => return Err(status_failure(&mut resp)),
        };
        if let Some(n) = resp.body().content_length() {
            if n != left + skip {
                return Err(Failure::fatal(format!(
                    "the registry sends {} bytes, the manifest says {}",
                    n + self.got - skip,
                    self.size
                )));
            }
        }
        let mut body = resp.into_body().into_reader();
        // A whole blob where its rest was asked for: what was had already
        // is passed over (it was hashed as it came the first time).
        if skip > 0 {
            let passed =
                io::copy(&mut (&mut body).take(skip), &mut io::sink()).map_err(|e| Failure {
                    transient: true,
                    why: e.to_string(),
                })?;
            if passed != skip {
                return Err(Failure {
                    transient: true,
                    why: "the connection ended early".into(),
                });
            }
        }
        Ok(body)
    }

    /// The digest check at the end, once.
    fn check(&mut self) -> io::Result<()> {
        if self.checked {
            return Ok(());
        }
        let got = Digest::from_hasher(std::mem::take(&mut self.hash));
        if got != self.digest {
            return Err(io::Error::other(format!(
                "blob {}: the registry sent {} bytes whose digest is {got}",
                self.digest, self.size
            )));
        }
        self.checked = true;
        Ok(())
    }

    /// Gives up after a break it could not pick up from.
    fn broken(&self, why: &str) -> io::Error {
        io::Error::other(format!(
            "blob {}: broken off at byte {} of {}, and {} tries to resume failed (last: {why})",
            self.digest, self.got, self.size, self.resumes
        ))
    }
}

impl Read for Blob<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let mut why = String::new();
        loop {
            let left = self.size - self.got;
            if left == 0 {
                self.body = None;
                self.check()?;
                return Ok(0);
            }
            let Some(body) = self.body.as_mut() else {
                if self.resumes >= MAX_RESUMES {
                    return Err(self.broken(&why));
                }
                self.resumes += 1;
                self.idle_tries += 1;
                std::thread::sleep(RESUME_WAIT * self.idle_tries);
                log::info!(
                    "blob {}: resuming at byte {} of {} ({why})",
                    self.digest,
                    self.got,
                    self.size
                );
                match self.request() {
                    Ok(b) => self.body = Some(b),
                    Err(f) if f.transient => why = f.why,
                    Err(f) => {
                        return Err(io::Error::other(format!(
                            "blob {}: resuming at byte {}: {}",
                            self.digest, self.got, f.why
                        )))
                    }
                }
                continue;
            };
            let n = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
            match body.read(&mut buf[..n]) {
                Ok(0) => {
                    self.body = None;
                    why = "the connection ended early".into();
                }
                Ok(k) => {
                    self.hash.update(&buf[..k]);
                    self.got += k as u64;
                    self.idle_tries = 0;
                    return Ok(k);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.body = None;
                    why = e.to_string();
                }
            }
        }
    }
}
