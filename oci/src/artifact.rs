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
//! credentials from [`crate::auth::credentials_for`], scrubbed from every error (the
//! connection, error sorting and verified downloads are shared with image pulls).

use std::collections::BTreeMap;
use std::path::Path;

use oci_client::manifest::OciDescriptor;
use oci_client::RegistryOperation;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWrite;

use crate::connection::{Connection, VerifyingWriter};
use crate::error::OciError;
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
    conn: Connection,
}

impl std::fmt::Debug for ArtifactRemote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArtifactRemote")
            .field("image", &self.conn.image.given())
            .field("creds", &self.conn.creds)
            .finish()
    }
}

impl ArtifactRemote {
    /// Connects to the registry of `image` (plain HTTP only where [`crate::plain_http_allowed`] says
    /// so, given `insecure`) and authenticates for `access`. An unreachable registry is
    /// [`OciError::Unreachable`].
    pub async fn connect(
        image: &ImageRef,
        access: Access,
        insecure: &[String],
    ) -> Result<ArtifactRemote, OciError> {
        let op = match access {
            Access::Pull => RegistryOperation::Pull,
            Access::Push => RegistryOperation::Push,
        };
        let conn = Connection::connect(image, insecure, op, "transferring").await?;
        Ok(ArtifactRemote { conn })
    }

    /// The reference this connection is for.
    pub fn image(&self) -> &ImageRef {
        &self.conn.image
    }

    /// The digest the reference resolves to now (a `HEAD` of the manifest; a `GET` when the
    /// registry sends no digest header). A pinned reference must resolve to its own digest.
    pub async fn resolve_digest(&self) -> Result<Digest, OciError> {
        let got = self
            .conn
            .client
            .fetch_manifest_digest(self.conn.image.oci(), &self.conn.auth())
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
        let reference = self.conn.image.at_digest(digest);
        let (body, _) = self
            .conn
            .client
            .pull_manifest_raw(&reference, &self.conn.auth(), ACCEPT)
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
        self.pull_blob(desc, &digest, Vec::new(), what).await
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
        let mut file = self.pull_blob(desc, &digest, file, what).await?;
        tokio::io::AsyncWriteExt::flush(&mut file)
            .await
            .map_err(|e| OciError::io(format!("writing {}", dest.display()), e))?;
        file.sync_all()
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
            .conn
            .client
            .blob_exists(self.conn.image.oci(), digest.as_str())
            .await
            .map_err(|e| self.map_err(e, &what))?
        {
            return Ok(false);
        }
        self.conn
            .client
            .push_blob(self.conn.image.oci(), data, digest.as_str())
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
        self.conn
            .client
            .push_manifest_raw(self.conn.image.oci(), body, content_type)
            .await
            .map_err(|e| self.map_err(e, "manifest"))?;
        Ok(digest)
    }

    fn check_pinned(&self, got: &Digest) -> Result<(), OciError> {
        match self.conn.image.digest() {
            Some(want) if &want != got => Err(OciError::DigestMismatch {
                what: "manifest".into(),
                expected: want.to_string(),
                actual: got.to_string(),
            }),
            _ => Ok(()),
        }
    }

    fn spec(&self, reason: String) -> OciError {
        self.conn.spec(reason)
    }

    fn map_err(&self, e: oci_client::errors::OciDistributionError, what: &str) -> OciError {
        self.conn.map_err(e, what)
    }

    /// Downloads blob `desc` (digest `digest`) into `inner`: at most `desc.size` bytes,
    /// verified; gives `inner` back.
    async fn pull_blob<W: AsyncWrite + Unpin>(
        &self,
        desc: &Descriptor,
        digest: &Digest,
        inner: W,
        what: &str,
    ) -> Result<W, OciError> {
        let mut w = VerifyingWriter::new(inner, desc.size, None);
        self.conn
            .pull_blob(&desc.to_oci(), digest, &mut w, what)
            .await?;
        Ok(w.inner)
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
