//! OCI artifacts: pushing and pulling an OCI image manifest whose config and layers are
//! arbitrary blobs (not a container image), with bounded, digest-verified downloads.
//!
//! This is the generic registry half of `voidbox image push|pull` (guest images as OCI
//! artifacts); what the blobs mean is the caller's business. [`ArtifactManifest`] is the
//! manifest document (with `artifactType` and annotations), [`ArtifactRemote`] a connection to
//! one repository: manifest digest resolution (`HEAD`), bounded manifest fetches, blob
//! downloads streamed to a file and hashed as they arrive (never more bytes than the
//! descriptor announced), blob uploads (skipped when the registry already has the blob) and
//! manifest uploads. Transport and credentials follow the rest of the crate: plain HTTP only
//! for loopback registries or those listed as insecure ([`crate::plain_http_allowed`]),
//! credentials from [`crate::auth::credentials_for`], scrubbed from every error.

use std::collections::BTreeMap;
use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll};

use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::manifest::OciDescriptor;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, RegistryOperation};
use serde::{Deserialize, Serialize};
use sha2::Digest as _;
use tokio::io::AsyncWrite;

use crate::auth::{credentials_for, Credentials};
use crate::error::OciError;
use crate::options::plain_http_allowed;
use crate::reference::{Digest, ImageRef};

/// Media type of an OCI image manifest (the only manifest kind artifacts use here).
pub const OCI_MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
/// What a manifest fetch accepts: everything a registry may hold under a reference, so that
/// the caller can say what it found instead of an artifact ([`ArtifactManifest::parse`]).
const ACCEPT: &[&str] = &[
    OCI_MANIFEST_MEDIA_TYPE,
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];
/// The annotation naming a layer's file (`org.opencontainers.image.title`).
pub const TITLE_ANNOTATION: &str = "org.opencontainers.image.title";

/// A content descriptor: media type, digest, size and annotations.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    /// The blob's media type.
    pub media_type: String,
    /// `sha256:<hex>` (checked by [`ArtifactManifest::parse`]).
    pub digest: String,
    /// Size in bytes.
    pub size: u64,
    /// Annotations (e.g. [`TITLE_ANNOTATION`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

impl Descriptor {
    /// Describes `bytes` as a blob of `media_type`.
    pub fn of(media_type: &str, bytes: &[u8]) -> Descriptor {
        Descriptor {
            media_type: media_type.to_string(),
            digest: Digest::of(bytes).to_string(),
            size: bytes.len() as u64,
            annotations: BTreeMap::new(),
        }
    }

    /// The same descriptor with annotation `key` = `value`.
    pub fn annotated(mut self, key: &str, value: &str) -> Descriptor {
        self.annotations.insert(key.to_string(), value.to_string());
        self
    }

    /// The [`TITLE_ANNOTATION`], if any.
    pub fn title(&self) -> Option<&str> {
        self.annotations.get(TITLE_ANNOTATION).map(String::as_str)
    }

    /// The validated digest.
    pub fn parsed_digest(&self) -> Result<Digest, String> {
        Digest::parse(&self.digest)
    }

    fn to_oci(&self) -> OciDescriptor {
        OciDescriptor {
            media_type: self.media_type.clone(),
            digest: self.digest.clone(),
            size: i64::try_from(self.size).unwrap_or(i64::MAX),
            ..Default::default()
        }
    }
}

/// An OCI image manifest used as an artifact manifest (`artifactType` set, arbitrary config
/// and layer media types).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ArtifactManifest {
    /// Always 2.
    pub schema_version: u32,
    /// Always [`OCI_MANIFEST_MEDIA_TYPE`].
    pub media_type: Option<String>,
    /// The artifact's type; `None` in ordinary container images.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_type: Option<String>,
    /// The config blob.
    pub config: Descriptor,
    /// The layer blobs, in order.
    pub layers: Vec<Descriptor>,
    /// Manifest annotations.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

impl ArtifactManifest {
    /// A manifest of `artifact_type` with `config` and `layers`.
    pub fn new(artifact_type: &str, config: Descriptor, layers: Vec<Descriptor>) -> Self {
        ArtifactManifest {
            schema_version: 2,
            media_type: Some(OCI_MANIFEST_MEDIA_TYPE.to_string()),
            artifact_type: Some(artifact_type.to_string()),
            config,
            layers,
            annotations: BTreeMap::new(),
        }
    }

    /// Parses a manifest body: schema version 2, an OCI image manifest (`mediaType` absent or
    /// [`OCI_MANIFEST_MEDIA_TYPE`]), sha256 digests only. The error says what was found.
    pub fn parse(body: &[u8]) -> Result<ArtifactManifest, String> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Probe {
            schema_version: Option<i64>,
            media_type: Option<String>,
            manifests: Option<serde_json::Value>,
        }
        let probe: Probe =
            serde_json::from_slice(body).map_err(|e| format!("manifest is not JSON: {e}"))?;
        if probe.schema_version != Some(2) {
            return Err(format!(
                "manifest schemaVersion {}, expected 2",
                probe
                    .schema_version
                    .map_or("missing".to_string(), |v| v.to_string())
            ));
        }
        match probe.media_type.as_deref() {
            Some(OCI_MANIFEST_MEDIA_TYPE) => {}
            None if probe.manifests.is_none() => {}
            None => return Err("an image index, not an image manifest".into()),
            Some(other) => {
                return Err(format!(
                    "manifest media type {other}, expected {OCI_MANIFEST_MEDIA_TYPE}"
                ))
            }
        }
        let m: ArtifactManifest =
            serde_json::from_slice(body).map_err(|e| format!("manifest does not parse: {e}"))?;
        for d in std::iter::once(&m.config).chain(&m.layers) {
            d.parsed_digest()?;
        }
        Ok(m)
    }

    /// The JSON body to push (compact; its sha256 is the manifest digest).
    pub fn to_body(&self) -> Vec<u8> {
        // Plain structs of strings and numbers always serialise.
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// What a connection is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Reading manifests and blobs.
    Pull,
    /// Reading and writing.
    Push,
}

/// A connection to the repository of one reference, authenticated for [`Access`].
pub struct ArtifactRemote {
    client: Client,
    image: ImageRef,
    creds: Option<Credentials>,
}

impl std::fmt::Debug for ArtifactRemote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArtifactRemote")
            .field("image", &self.image.given())
            .field("creds", &self.creds)
            .finish()
    }
}

/// Installs rustls' ring provider as the process default (once; a provider installed by
/// someone else is left alone).
fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

impl ArtifactRemote {
    /// Connects to the registry of `image` (plain HTTP only where [`plain_http_allowed`] says
    /// so, given `insecure`) and authenticates for `access`. An unreachable registry is
    /// [`OciError::Unreachable`].
    pub async fn connect(
        image: &ImageRef,
        access: Access,
        insecure: &[String],
    ) -> Result<ArtifactRemote, OciError> {
        ensure_crypto_provider();
        let registry = image.registry().to_string();
        let protocol = if plain_http_allowed(&registry, insecure) {
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
        let remote = ArtifactRemote {
            client,
            image: image.clone(),
            creds,
        };
        let op = match access {
            Access::Pull => RegistryOperation::Pull,
            Access::Push => RegistryOperation::Push,
        };
        remote
            .client
            .auth(image.oci(), &remote.auth(), op)
            .await
            .map_err(|e| remote.map_err(e, "authentication"))?;
        Ok(remote)
    }

    /// The reference this connection is for.
    pub fn image(&self) -> &ImageRef {
        &self.image
    }

    fn auth(&self) -> RegistryAuth {
        self.creds
            .as_ref()
            .map(Credentials::to_registry_auth)
            .unwrap_or(RegistryAuth::Anonymous)
    }

    /// The digest the reference resolves to now (a `HEAD` of the manifest; a `GET` when the
    /// registry sends no digest header). A pinned reference must resolve to its own digest.
    pub async fn resolve_digest(&self) -> Result<Digest, OciError> {
        let got = self
            .client
            .fetch_manifest_digest(self.image.oci(), &self.auth())
            .await
            .map_err(|e| self.map_err(e, "manifest"))?;
        let got = Digest::parse(&got).map_err(|e| self.spec(e))?;
        self.check_pinned(&got)?;
        Ok(got)
    }

    /// Fetches the manifest `digest` names in this repository and checks its digest; refuses a
    /// body over `max` bytes. (Whatever kind of manifest it is: [`ArtifactManifest::parse`]
    /// says whether it is an artifact.)
    pub async fn fetch_manifest(&self, digest: &Digest, max: u64) -> Result<Vec<u8>, OciError> {
        let reference = self.image.at_digest(digest);
        let (body, _) = self
            .client
            .pull_manifest_raw(&reference, &self.auth(), ACCEPT)
            .await
            .map_err(|e| self.map_err(e, "manifest"))?;
        if body.len() as u64 > max {
            return Err(self.spec(format!(
                "manifest of {} bytes (at most {max} accepted)",
                body.len()
            )));
        }
        let actual = Digest::of(&body);
        if &actual != digest {
            return Err(OciError::DigestMismatch {
                what: "manifest".into(),
                expected: digest.to_string(),
                actual: actual.to_string(),
            });
        }
        Ok(body.to_vec())
    }

    /// Downloads blob `desc` into memory (verified); `what` names it in errors.
    pub async fn blob_to_vec(&self, desc: &Descriptor, what: &str) -> Result<Vec<u8>, OciError> {
        let digest = desc.parsed_digest().map_err(|e| self.spec(e))?;
        let mut buf = Vec::new();
        let mut w = BoundedHasher::new(&mut buf, desc.size);
        let r = self
            .client
            .pull_blob(self.image.oci(), &desc.to_oci(), &mut w)
            .await;
        if let Err(e) = r {
            return Err(self.map_blob_err(e, &w, what));
        }
        w.check(&digest, what)?;
        Ok(buf)
    }

    /// Streams blob `desc` into a new file `dest`, hashing as the bytes arrive and refusing
    /// more than `desc.size` of them; the digest is compared before this returns. `what`
    /// names the blob in errors. On error `dest` may hold partial data: the caller removes it.
    pub async fn blob_to_file(
        &self,
        desc: &Descriptor,
        dest: &Path,
        what: &str,
    ) -> Result<(), OciError> {
        let digest = desc.parsed_digest().map_err(|e| self.spec(e))?;
        let file = tokio::fs::File::create(dest)
            .await
            .map_err(|e| OciError::io(format!("creating {}", dest.display()), e))?;
        let mut w = BoundedHasher::new(file, desc.size);
        let r = self
            .client
            .pull_blob(self.image.oci(), &desc.to_oci(), &mut w)
            .await;
        if let Err(e) = r {
            return Err(self.map_blob_err(e, &w, what));
        }
        w.check(&digest, what)?;
        tokio::io::AsyncWriteExt::flush(&mut w.inner)
            .await
            .map_err(|e| OciError::io(format!("writing {}", dest.display()), e))?;
        w.inner
            .sync_all()
            .await
            .map_err(|e| OciError::io(format!("syncing {}", dest.display()), e))
    }

    /// Uploads `data` as blob `desc` unless the repository already has it; returns whether it
    /// was uploaded.
    pub async fn push_blob(&self, desc: &Descriptor, data: Vec<u8>) -> Result<bool, OciError> {
        let digest = desc.parsed_digest().map_err(|e| self.spec(e))?;
        if Digest::of(&data) != digest || data.len() as u64 != desc.size {
            return Err(OciError::DigestMismatch {
                what: format!("blob to push ({} bytes)", data.len()),
                expected: digest.to_string(),
                actual: Digest::of(&data).to_string(),
            });
        }
        let what = format!("blob {digest}");
        if self
            .client
            .blob_exists(self.image.oci(), digest.as_str())
            .await
            .map_err(|e| self.map_err(e, &what))?
        {
            return Ok(false);
        }
        self.client
            .push_blob(self.image.oci(), data, digest.as_str())
            .await
            .map_err(|e| self.map_err(e, &what))?;
        Ok(true)
    }

    /// Uploads `manifest` under the reference's tag and returns its digest.
    pub async fn push_manifest(&self, manifest: &ArtifactManifest) -> Result<Digest, OciError> {
        let body = manifest.to_body();
        let digest = Digest::of(&body);
        // (`http::HeaderValue`, inferred: the crate does not name `http` itself.)
        let content_type = OCI_MANIFEST_MEDIA_TYPE
            .parse()
            .map_err(|_| self.spec("bad manifest content type".into()))?;
        self.client
            .push_manifest_raw(self.image.oci(), body, content_type)
            .await
            .map_err(|e| self.map_err(e, "manifest"))?;
        Ok(digest)
    }

    fn check_pinned(&self, got: &Digest) -> Result<(), OciError> {
        match self.image.digest() {
            Some(want) if &want != got => Err(OciError::DigestMismatch {
                what: "manifest".into(),
                expected: want.to_string(),
                actual: got.to_string(),
            }),
            _ => Ok(()),
        }
    }

    fn spec(&self, reason: String) -> OciError {
        OciError::Registry {
            registry: self.image.registry().to_string(),
            reason: self.scrub(reason),
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
        w: &BoundedHasher<W>,
        what: &str,
    ) -> OciError {
        if w.too_long {
            return self.spec(format!(
                "{what} is larger than the {} bytes its descriptor says",
                w.limit
            ));
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
                    self.spec(text)
                }
            }
            E::ServerError { code, message, .. } => match code {
                401 | 403 => refused(format!("{what}: HTTP {code} {}", message.trim())),
                404 => not_found(format!("{what}: HTTP 404")),
                _ => self.spec(format!("{what}: HTTP {code} {}", message.trim())),
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
            E::IoError(io) => OciError::io(format!("transferring {what}"), io),
            other => self.spec(format!("{what}: {other}")),
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

/// Hashes and counts bytes on their way to `inner`; refuses more than `limit` bytes.
struct BoundedHasher<W> {
    inner: W,
    hasher: sha2::Sha256,
    written: u64,
    limit: u64,
    too_long: bool,
}

impl<W> BoundedHasher<W> {
    fn new(inner: W, limit: u64) -> Self {
        BoundedHasher {
            inner,
            hasher: sha2::Sha256::new(),
            written: 0,
            limit,
            too_long: false,
        }
    }

    /// Compares what was written with `digest` and the announced size.
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

impl<W: AsyncWrite + Unpin> AsyncWrite for BoundedHasher<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = &mut *self;
        if this.written.saturating_add(buf.len() as u64) > this.limit {
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

    fn sample() -> ArtifactManifest {
        let config = Descriptor::of("application/x.config+json", b"{}");
        let layer = Descriptor::of("application/x.blob", b"hello").annotated(TITLE_ANNOTATION, "f");
        let mut m = ArtifactManifest::new("application/x.artifact", config, vec![layer]);
        m.annotations.insert("k".into(), "v".into());
        m
    }

    #[test]
    fn round_trips_with_artifact_type_and_titles() {
        let m = sample();
        let body = m.to_body();
        let text = String::from_utf8(body.clone()).unwrap();
        assert!(
            text.contains(r#""artifactType":"application/x.artifact""#),
            "{text}"
        );
        assert!(text.contains(r#""mediaType":"application/vnd.oci.image.manifest.v1+json""#));
        let back = ArtifactManifest::parse(&body).unwrap();
        assert_eq!(back, m);
        assert_eq!(back.layers[0].title(), Some("f"));
        assert_eq!(back.layers[0].size, 5);
    }

    #[test]
    fn refuses_other_documents() {
        let err = |s: &str| ArtifactManifest::parse(s.as_bytes()).unwrap_err();
        assert!(err("{").contains("not JSON"));
        assert!(err(r#"{"schemaVersion":1}"#).contains("schemaVersion 1"));
        assert!(err(
            r#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[]}"#
        )
        .contains("index.v1"));
        assert!(err(r#"{"schemaVersion":2,"manifests":[]}"#).contains("index"));
        // A digest that is not sha256 never reaches a path.
        let mut m = sample();
        m.layers[0].digest = "sha512:00".into();
        assert!(ArtifactManifest::parse(&m.to_body())
            .unwrap_err()
            .contains("sha512"));
        // Ordinary container images parse (no artifactType): the caller refuses them.
        let mut plain = sample();
        plain.artifact_type = None;
        assert_eq!(
            ArtifactManifest::parse(&plain.to_body())
                .unwrap()
                .artifact_type,
            None
        );
    }
}
