//! Talking to the registry: authentication, manifest resolution, verified blob downloads.
//!
//! `oci-client` does the HTTP, the auth dance (basic, or a bearer token from the registry's
//! token server) and checks manifest digests; the client, the auth and the sorting of its
//! errors are [`Connection`]'s. Blobs are streamed to a file through
//! [`VerifyingWriter`], which hashes as the bytes arrive and refuses more bytes than the
//! descriptor announced; the digest is compared when the stream ends (`oci-client` compares
//! it too). Nothing downloaded is trusted before its digest matched.

use crate::connection::{Connection, VerifyingWriter};
use crate::error::OciError;
use crate::options::{Platform, PullOptions, PullProgress};
use crate::reference::{Digest, ImageRef};
use oci_client::manifest::OciDescriptor;
use oci_client::RegistryOperation;
use std::path::Path;

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
    conn: Connection,
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

impl Remote {
    /// Connects to the registry of `image` and authenticates for pulling.
    pub(crate) async fn connect(image: &ImageRef, opts: &PullOptions) -> Result<Remote, OciError> {
        let conn = Connection::connect(
            image,
            &opts.insecure_registries,
            RegistryOperation::Pull,
            "downloading",
        )
        .await?;
        Ok(Remote { conn })
    }

    /// The image this connection is for.
    pub(crate) fn image(&self) -> &ImageRef {
        &self.conn.image
    }

    /// Resolves the reference to an image manifest for `platform` (through an index if need be).
    pub(crate) async fn resolve(&self, platform: &Platform) -> Result<Resolved, OciError> {
        let mut accept: Vec<&str> = MANIFEST_TYPES.to_vec();
        accept.extend_from_slice(INDEX_TYPES);
        let (body, digest) = self.fetch_manifest(self.conn.image.oci(), &accept).await?;
        if let Some(want) = self.conn.image.digest() {
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
                let child_ref = self.conn.image.at_digest(&child);
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
            reference: self.conn.image.given().to_string(),
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
        let (body, _) = self
            .conn
            .client
            .pull_manifest_raw(reference, &self.conn.auth(), accept)
            .await
            .map_err(|e| self.conn.map_err(e, "manifest"))?;
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
        self.conn
            .pull_blob(
                &descriptor(&media_type, &digest, desc.size()),
                &digest,
                &mut w,
                "image config",
            )
            .await?;
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
        self.conn
            .pull_blob(&descriptor(media_type, digest, size), digest, &mut w, &what)
            .await?;
        tokio::io::AsyncWriteExt::flush(&mut w.inner)
            .await
            .map_err(|e| OciError::io(format!("writing {}", dest.display()), e))
    }

    fn spec(&self, reason: String) -> OciError {
        self.conn.spec(reason)
    }
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
