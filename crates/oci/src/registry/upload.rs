//! Pushing to a registry (the distribution spec's push): a blob is asked
//! for first (`HEAD /v2/NAME/blobs/DIGEST`) and skipped when there, else
//! uploaded in one piece (`POST /v2/NAME/blobs/uploads/`, then `PUT` of
//! its bytes, streamed from its file, to the `Location` answered with
//! `?digest=`); a manifest or index is `PUT /v2/NAME/manifests/REF`. The
//! auth is the pull's: a 401 on a request that writes asks the token
//! service for the scope its challenge names (`pull,push`).

use std::path::Path;

use super::client::{header, status_failure, Client, Payload};
use crate::digest::Digest;
use crate::OciError;

impl Client {
    /// Whether the repository has the blob `digest`.
    pub fn has_blob(&self, digest: &Digest) -> Result<bool, OciError> {
        let what = format!("blob {digest}");
        let mut resp = self
            .send(
                "HEAD",
                &self.url(&format!("blobs/{digest}")),
                &[],
                &Payload::None,
            )
            .map_err(|f| self.error(format!("{what}: {}", f.why)))?;
        match resp.status().as_u16() {
            200 => Ok(true),
            404 => Ok(false),
            _ => Err(self.error(format!("{what}: {}", status_failure(&mut resp).why))),
        }
    }

    /// Uploads the blob `digest` of `size` bytes from `path`, unless the
    /// repository has it; true when it was uploaded.
    pub fn push_blob(&self, path: &Path, digest: &Digest, size: u64) -> Result<bool, OciError> {
        if self.has_blob(digest)? {
            return Ok(false);
        }
        self.upload(digest, &Payload::File(path, size))?;
        Ok(true)
    }

    /// Uploads the blob `bytes` (a config), unless the repository has it.
    pub fn push_blob_bytes(&self, bytes: &[u8]) -> Result<Digest, OciError> {
        let digest = Digest::of(bytes);
        if !self.has_blob(&digest)? {
            self.upload(&digest, &Payload::Bytes(bytes))?;
        }
        Ok(digest)
    }

    /// A monolithic upload: a session, then its bytes and digest.
    fn upload(&self, digest: &Digest, payload: &Payload) -> Result<(), OciError> {
        let what = format!("uploading blob {digest}");
        let mut resp = self
            .send(
                "POST",
                &self.url("blobs/uploads/"),
                &[("content-length", "0")],
                &Payload::None,
            )
            .map_err(|f| self.error(format!("{what}: {}", f.why)))?;
        if resp.status().as_u16() != 202 {
            return Err(self.error(format!("{what}: {}", status_failure(&mut resp).why)));
        }
        let Some(location) = header(&resp, "location").filter(|l| !l.is_empty()) else {
            return Err(self.error(format!("{what}: 202 Accepted without a Location")));
        };
        let mut url = self.absolute(location);
        url.push(if url.contains('?') { '&' } else { '?' });
        url.push_str(&format!(
            "digest={}",
            digest.to_string().replace(':', "%3A")
        ));
        let mut resp = self
            .send(
                "PUT",
                &url,
                &[("content-type", "application/octet-stream")],
                payload,
            )
            .map_err(|f| self.error(format!("{what}: {}", f.why)))?;
        if resp.status().as_u16() != 201 {
            return Err(self.error(format!("{what}: {}", status_failure(&mut resp).why)));
        }
        self.said_digest(&resp, digest, &what)
    }

    /// `PUT`s the manifest or index `bytes` of `media_type` under
    /// `reference` (a tag, or its own digest).
    pub fn push_manifest(
        &self,
        reference: &str,
        media_type: &str,
        bytes: &[u8],
    ) -> Result<Digest, OciError> {
        let digest = Digest::of(bytes);
        let what = format!("manifest {reference} ({digest})");
        let mut resp = self
            .send(
                "PUT",
                &self.url(&format!("manifests/{reference}")),
                &[("content-type", media_type)],
                &Payload::Bytes(bytes),
            )
            .map_err(|f| self.error(format!("{what}: {}", f.why)))?;
        if resp.status().as_u16() != 201 {
            return Err(self.error(format!("{what}: {}", status_failure(&mut resp).why)));
        }
        self.said_digest(&resp, &digest, &what)?;
        Ok(digest)
    }

    /// A `Docker-Content-Digest` that is not what was sent is the
    /// registry's error (it stored something else).
    fn said_digest(
        &self,
        resp: &ureq::http::Response<ureq::Body>,
        digest: &Digest,
        what: &str,
    ) -> Result<(), OciError> {
        if let Some(said) = header(resp, "docker-content-digest") {
            let said = Digest::parse(said)
                .map_err(|e| self.error(format!("{what}: Docker-Content-Digest: {e}")))?;
            if &said != digest {
                return Err(OciError::Mismatch {
                    what: format!("{}: {what} (its Docker-Content-Digest)", self.reference()),
                    want: digest.clone(),
                    got: said,
                });
            }
        }
        Ok(())
    }
}
