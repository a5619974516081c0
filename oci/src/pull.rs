//! Talking to the registry: authentication, manifest resolution, verified blob downloads.
//!
//! `oci-client` does the HTTP, the auth dance (basic, or a bearer token from the registry's
//! token server) and checks manifest digests. Blobs are streamed to a file through
//! [`VerifyingWriter`], which hashes as the bytes arrive and refuses more bytes than the
//! descriptor announced; the digest is compared when the stream ends (`oci-client` compares
//! it too). Nothing downloaded is trusted before its digest matched.

use crate::auth::{credentials_for, Credentials};
use crate::error::OciError;
use crate::options::{plain_http_allowed, Platform, PullOptions, PullProgress};
use crate::reference::{Digest, ImageRef};
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::manifest::OciDescriptor;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, RegistryOperation};
use sha2::Digest as _;
use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::AsyncWrite;

/// Largest manifest or image config accepted (they are JSON documents of a few KiB).
const MAX_JSON_BLOB: u64 = 8 << 20;

const MANIFEST_TYPES: &[&str] = &[
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
];
const INDEX_TYPES: &[&str] = &[
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];
const CONFIG_TYPES: &[&str] = &[
    "application/vnd.oci.image.config.v1+json",
    "application/vnd.docker.container.image.v1+json",
];

/// A connection to one repository of one registry, authenticated.
pub(crate) struct Remote {
    client: Client,
    image: ImageRef,
    creds: Option<Credentials>,
}

/// The manifest a reference resolved to.
pub(crate) struct Resolved {
    /// Digest of the platform-specific image manifest (the cache key).
    pub manifest_digest: Digest,
    /// Digest of the index the reference pointed at, when it pointed at one.
    pub index_digest: Option<Digest>,
    /// The image manifest.
    pub manifest: oci_spec::image::ImageManifest,
}

/// Installs rustls' ring provider as the process default (once; a provider installed by
/// someone else is left alone).
fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

impl Remote {
    /// Connects to the registry of `image` and authenticates for pulling.
    pub(crate) async fn connect(image: &ImageRef, opts: &PullOptions) -> Result<Remote, OciError> {
        ensure_crypto_provider();
        let registry = image.registry().to_string();
        let protocol = if plain_http_allowed(&registry, &opts.insecure_registries) {
            ClientProtocol::HttpsExcept(vec![registry.clone()])
        } else {
            ClientProtocol::Https
        };
        let config = ClientConfig {
            protocol,
            connect_timeout: Some(std::time::Duration::from_secs(30)),
            read_timeout: Some(std::time::Duration::from_secs(300)),
            ..Default::default()
        };
        let creds = credentials_for(&registry)?;
        let client = Client::try_from(config).map_err(|e| OciError::Registry {
            registry: registry.clone(),
            reason: format!("cannot build the HTTP client: {e}"),
        })?;
        let remote = Remote {
            client,
            image: image.clone(),
            creds,
        };
        let auth = remote
            .creds
            .as_ref()
            .map(Credentials::to_registry_auth)
            .unwrap_or(RegistryAuth::Anonymous);
        remote
            .client
            .auth(image.oci(), &auth, RegistryOperation::Pull)
            .await
            .map_err(|e| remote.map_err(e, "authentication"))?;
        Ok(remote)
    }

    /// The image this connection is for.
    pub(crate) fn image(&self) -> &ImageRef {
        &self.image
    }

    /// Resolves the reference to an image manifest for `platform` (through an index if need be).
    pub(crate) async fn resolve(&self, platform: &Platform) -> Result<Resolved, OciError> {
        let mut accept: Vec<&str> = MANIFEST_TYPES.to_vec();
        accept.extend_from_slice(INDEX_TYPES);
        let (body, digest) = self.fetch_manifest(self.image.oci(), &accept).await?;
        if let Some(want) = self.image.digest() {
            if digest != want {
                return Err(OciError::DigestMismatch {
                    what: "manifest".into(),
                    expected: want.to_string(),
                    actual: digest.to_string(),
                });
            }
        }
        match manifest_kind(&body)? {
            Kind::Manifest => Ok(Resolved {
                manifest_digest: digest,
                index_digest: None,
                manifest: parse_manifest(&body)?,
            }),
            Kind::Index => {
                let index: oci_spec::image::ImageIndex = serde_json::from_slice(&body)
                    .map_err(|e| self.spec(format!("image index: {e}")))?;
                let child = self.pick(&index, platform)?;
                let child_ref = self.image.at_digest(&child);
                let (body, got) = self.fetch_manifest(&child_ref, MANIFEST_TYPES).await?;
                if got != child {
                    return Err(OciError::DigestMismatch {
                        what: "manifest".into(),
                        expected: child.to_string(),
                        actual: got.to_string(),
                    });
                }
                if manifest_kind(&body)? != Kind::Manifest {
                    return Err(self.spec("an image index points at another index".into()));
                }
                Ok(Resolved {
                    manifest_digest: got,
                    index_digest: Some(digest),
                    manifest: parse_manifest(&body)?,
                })
            }
        }
    }

    /// The manifest entry of `index` for `platform`.
    fn pick(
        &self,
        index: &oci_spec::image::ImageIndex,
        platform: &Platform,
    ) -> Result<Digest, OciError> {
        let mut available = Vec::new();
        for m in index.manifests() {
            let Some(p) = m.platform() else { continue };
            let (os, arch) = (p.os().to_string(), p.architecture().to_string());
            if platform.matches(&os, &arch, p.variant().as_deref()) {
                return Digest::parse(m.digest().as_ref()).map_err(|e| self.spec(e));
            }
            available.push(match p.variant() {
                Some(v) => format!("{os}/{arch}/{v}"),
                None => format!("{os}/{arch}"),
            });
        }
        Err(OciError::NoMatchingPlatform {
            reference: self.image.given().to_string(),
            platform: platform.to_string(),
            available: if available.is_empty() {
                "none".into()
            } else {
                available.join(", ")
            },
        })
    }

    async fn fetch_manifest(
        &self,
        reference: &oci_client::Reference,
        accept: &[&str],
    ) -> Result<(Vec<u8>, Digest), OciError> {
        let auth = self
            .creds
            .as_ref()
            .map(Credentials::to_registry_auth)
            .unwrap_or(RegistryAuth::Anonymous);
        let (body, _) = self
            .client
            .pull_manifest_raw(reference, &auth, accept)
            .await
            .map_err(|e| self.map_err(e, "manifest"))?;
        if body.len() as u64 > MAX_JSON_BLOB {
            return Err(self.spec(format!("manifest of {} bytes", body.len())));
        }
        // oci-client checked the digest against the reference and the Docker-Content-Digest
        // header; the digest we key the cache by is computed here, from the bytes themselves.
        let digest = Digest::of(&body);
        if let Some(want) = reference.digest() {
            if want != digest.as_str() {
                return Err(OciError::DigestMismatch {
                    what: "manifest".into(),
                    expected: want.to_string(),
                    actual: digest.to_string(),
                });
            }
        }
        Ok((body.to_vec(), digest))
    }

    /// Downloads the image config blob (verified) and parses it.
    pub(crate) async fn config(
        &self,
        manifest: &oci_spec::image::ImageManifest,
    ) -> Result<oci_spec::image::ImageConfiguration, OciError> {
        let desc = manifest.config();
        let media_type = desc.media_type().to_string();
        if !CONFIG_TYPES.contains(&media_type.as_str()) {
            return Err(OciError::UnsupportedMediaType {
                media_type,
                what: "image config (not a container image)".into(),
            });
        }
        if desc.size() > MAX_JSON_BLOB {
            return Err(self.spec(format!("image config of {} bytes", desc.size())));
        }
        let digest = Digest::parse(desc.digest().as_ref()).map_err(|e| self.spec(e))?;
        let mut buf = Vec::new();
        let mut w = VerifyingWriter::new(&mut buf, desc.size(), None);
        self.client
            .pull_blob(
                self.image.oci(),
                &descriptor(&media_type, &digest, desc.size()),
                &mut w,
            )
            .await
            .map_err(|e| self.map_blob_err(e, &w, "image config"))?;
        w.check(&digest, "image config")?;
        serde_json::from_slice(&buf).map_err(|e| self.spec(format!("image config: {e}")))
    }

    /// Downloads blob `digest` of `size` bytes into `dest`, reporting progress.
    pub(crate) async fn blob_to_file(
        &self,
        media_type: &str,
        digest: &Digest,
        size: u64,
        dest: &Path,
        progress: &dyn PullProgress,
    ) -> Result<(), OciError> {
        let what = format!("layer {digest}");
        let file = tokio::fs::File::create(dest)
            .await
            .map_err(|e| OciError::io(format!("creating {}", dest.display()), e))?;
        let mut w = VerifyingWriter::new(file, size, Some(progress));
        self.client
            .pull_blob(
                self.image.oci(),
                &descriptor(media_type, digest, size),
                &mut w,
            )
            .await
            .map_err(|e| self.map_blob_err(e, &w, &what))?;
        w.check(digest, &what)?;
        tokio::io::AsyncWriteExt::flush(&mut w.inner)
            .await
            .map_err(|e| OciError::io(format!("writing {}", dest.display()), e))
    }

    fn spec(&self, reason: String) -> OciError {
        OciError::Registry {
            registry: self.image.registry().to_string(),
            reason,
        }
    }

    fn scrub(&self, text: String) -> String {
        match &self.creds {
            Some(c) => c.scrub(&text),
            None => text,
        }
    }

    fn map_blob_err<W>(
        &self,
        e: OciDistributionError,
        w: &VerifyingWriter<'_, W>,
        what: &str,
    ) -> OciError {
        if w.too_long {
            return OciError::Registry {
                registry: self.image.registry().to_string(),
                reason: format!(
                    "{what} is larger than the {} bytes its descriptor says",
                    w.limit
                ),
            };
        }
        self.map_err(e, what)
    }

    /// Sorts an `oci-client` error into ours, scrubbing credentials from any text.
    fn map_err(&self, e: OciDistributionError, what: &str) -> OciError {
        use OciDistributionError as E;
        let registry = self.image.registry().to_string();
        let refused = |reason: String| OciError::AuthRefused {
            registry: registry.clone(),
            reason: self.scrub(reason),
        };
        let not_found = |reason: String| OciError::NotFound {
            reference: self.image.given().to_string(),
            reason: self.scrub(reason),
        };
        match e {
            E::AuthenticationFailure(r) => refused(format!("token server refused: {}", r.trim())),
            E::UnauthorizedError { .. } => refused(format!(
                "{what}: unauthorized ({})",
                if self.creds.is_some() {
                    "credentials rejected"
                } else {
                    "no credentials configured"
                }
            )),
            E::RegistryError { envelope, .. } => {
                let codes: Vec<&OciErrorCode> = envelope.errors.iter().map(|e| &e.code).collect();
                let text = format!("{what}: {envelope}");
                if codes
                    .iter()
                    .any(|c| matches!(c, OciErrorCode::Unauthorized | OciErrorCode::Denied))
                {
                    refused(text)
                } else if codes.iter().any(|c| {
                    matches!(
                        c,
                        OciErrorCode::ManifestUnknown
                            | OciErrorCode::NameUnknown
                            | OciErrorCode::BlobUnknown
                            | OciErrorCode::NotFound
                    )
                }) {
                    not_found(text)
                } else {
                    self.spec(self.scrub(text))
                }
            }
            E::ServerError { code, message, .. } => match code {
                401 | 403 => refused(format!("{what}: HTTP {code} {}", message.trim())),
                404 => not_found(format!("{what}: HTTP 404")),
                _ => self.spec(self.scrub(format!("{what}: HTTP {code} {}", message.trim()))),
            },
            E::ImageManifestNotFoundError(r) => not_found(r),
            E::DigestError(oci_client::errors::DigestError::VerificationError {
                expected,
                actual,
            }) => OciError::DigestMismatch {
                what: what.to_string(),
                expected,
                actual,
            },
            E::UnsupportedMediaTypeError(m) => OciError::UnsupportedMediaType {
                media_type: m,
                what: what.to_string(),
            },
            E::RequestError(r) => OciError::Unreachable {
                registry,
                reason: self.scrub(format!("{what}: {}", error_chain(&r))),
            },
            E::IoError(io) => OciError::io(format!("downloading {what}"), io),
            other => self.spec(self.scrub(format!("{what}: {other}"))),
        }
    }
}

/// `error: cause: cause` for errors whose `Display` hides the cause.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        let s_text = s.to_string();
        if !out.contains(&s_text) {
            out.push_str(": ");
            out.push_str(&s_text);
        }
        src = s.source();
    }
    out
}

fn descriptor(media_type: &str, digest: &Digest, size: u64) -> OciDescriptor {
    OciDescriptor {
        media_type: media_type.to_string(),
        digest: digest.to_string(),
        size: i64::try_from(size).unwrap_or(i64::MAX),
        ..Default::default()
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Kind {
    Manifest,
    Index,
}

/// Whether a manifest body is an image manifest or an index; anything else (schema 1,
/// artifacts) is an unsupported media type.
fn manifest_kind(body: &[u8]) -> Result<Kind, OciError> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Probe {
        schema_version: Option<i64>,
        media_type: Option<String>,
        manifests: Option<serde_json::Value>,
        layers: Option<serde_json::Value>,
    }
    let unsupported = |m: &str| OciError::UnsupportedMediaType {
        media_type: m.to_string(),
        what: "manifest".into(),
    };
    let p: Probe = serde_json::from_slice(body).map_err(|_| unsupported("(not JSON)"))?;
    if p.schema_version != Some(2) {
        return Err(unsupported(&format!(
            "schemaVersion {}",
            p.schema_version
                .map_or("missing".to_string(), |v| v.to_string())
        )));
    }
    match p.media_type.as_deref() {
        Some(m) if MANIFEST_TYPES.contains(&m) => Ok(Kind::Manifest),
        Some(m) if INDEX_TYPES.contains(&m) => Ok(Kind::Index),
        Some(m) => Err(unsupported(m)),
        None if p.manifests.is_some() => Ok(Kind::Index),
        None if p.layers.is_some() => Ok(Kind::Manifest),
        None => Err(unsupported("(none)")),
    }
}

fn parse_manifest(body: &[u8]) -> Result<oci_spec::image::ImageManifest, OciError> {
    serde_json::from_slice(body).map_err(|e| OciError::UnsupportedMediaType {
        media_type: "application/vnd.oci.image.manifest.v1+json".into(),
        what: format!("manifest does not parse: {e}"),
    })
}

/// Hashes and counts bytes on their way to `inner`; refuses more than `limit` bytes.
pub(crate) struct VerifyingWriter<'a, W> {
    inner: W,
    hasher: sha2::Sha256,
    written: u64,
    limit: u64,
    too_long: bool,
    progress: Option<&'a dyn PullProgress>,
}

impl<'a, W> VerifyingWriter<'a, W> {
    fn new(inner: W, limit: u64, progress: Option<&'a dyn PullProgress>) -> Self {
        VerifyingWriter {
            inner,
            hasher: sha2::Sha256::new(),
            written: 0,
            limit,
            too_long: false,
            progress,
        }
    }

    /// Compares what was written with `digest` (and the announced size).
    fn check(&self, digest: &Digest, what: &str) -> Result<(), OciError> {
        let actual = format!("sha256:{}", hex::encode(self.hasher.clone().finalize()));
        if actual != digest.as_str() || self.written != self.limit {
            return Err(OciError::DigestMismatch {
                what: format!("{what} ({} bytes, expected {})", self.written, self.limit),
                expected: digest.to_string(),
                actual,
            });
        }
        Ok(())
    }
}

impl<W: AsyncWrite + Unpin> AsyncWrite for VerifyingWriter<'_, W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        if this.written + buf.len() as u64 > this.limit {
            this.too_long = true;
            return Poll::Ready(Err(std::io::Error::other(
                "blob larger than its descriptor",
            )));
        }
        let n = match Pin::new(&mut this.inner).poll_write(cx, buf) {
            Poll::Ready(Ok(n)) => n,
            other => return other,
        };
        this.hasher.update(&buf[..n]);
        this.written += n as u64;
        if let Some(p) = this.progress {
            p.bytes(n as u64);
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_kinds() {
        let k = |s: &str| manifest_kind(s.as_bytes());
        assert_eq!(
            k(r#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[]}"#).unwrap(),
            Kind::Index
        );
        assert_eq!(
            k(r#"{"schemaVersion":2,"config":{},"layers":[]}"#).unwrap(),
            Kind::Manifest
        );
        assert!(matches!(
            k(r#"{"schemaVersion":1,"name":"x"}"#),
            Err(OciError::UnsupportedMediaType { .. })
        ));
        assert!(matches!(
            k(r#"{"schemaVersion":2,"mediaType":"application/vnd.cncf.helm.chart"}"#),
            Err(OciError::UnsupportedMediaType { .. })
        ));
    }
}
