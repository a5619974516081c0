//! Image references (`[registry/]repository[:tag][@digest]`) and digests.

use crate::error::OciError;
use oci_client::Reference;

/// A parsed image reference.
///
/// Parsing follows Docker's rules: `alpine` is `docker.io/library/alpine:latest`; a reference
/// with both a tag and a digest is pulled by the digest.
#[derive(Debug, Clone)]
pub struct ImageRef {
    given: String,
    inner: Reference,
}

impl ImageRef {
    /// Parses `reference`; refuses digests other than `sha256:` + 64 lowercase hex digits.
    pub fn parse(reference: &str) -> Result<ImageRef, OciError> {
        let given = reference.trim();
        let inner: Reference =
            given
                .parse()
                .map_err(|e: oci_client::ParseError| OciError::InvalidReference {
                    reference: reference.to_string(),
                    reason: e.to_string(),
                })?;
        if let Some(digest) = inner.digest() {
            Digest::parse(digest).map_err(|reason| OciError::InvalidReference {
                reference: reference.to_string(),
                reason,
            })?;
        }
        Ok(ImageRef {
            given: given.to_string(),
            inner,
        })
    }

    /// The reference as given.
    pub fn given(&self) -> &str {
        &self.given
    }

    /// The registry to connect to, `host[:port]` (`docker.io` resolves to `index.docker.io`).
    pub fn registry(&self) -> &str {
        self.inner.resolve_registry()
    }

    /// The repository path (`library/alpine`).
    pub fn repository(&self) -> &str {
        self.inner.repository()
    }

    /// The tag, when the reference has one.
    pub fn tag(&self) -> Option<&str> {
        self.inner.tag()
    }

    /// The digest, when the reference pins one.
    pub fn digest(&self) -> Option<Digest> {
        self.inner.digest().and_then(|d| Digest::parse(d).ok())
    }

    /// The fully qualified form (`docker.io/library/alpine:3.20`, or `…@sha256:…` when pinned),
    /// which is how the cache records references.
    pub fn canonical(&self) -> String {
        match self.inner.digest() {
            Some(d) => format!("{}/{}@{}", self.inner.registry(), self.repository(), d),
            None => self.inner.whole(),
        }
    }

    /// The same repository addressed by `digest`.
    pub(crate) fn at_digest(&self, digest: &Digest) -> Reference {
        Reference::with_digest(
            self.inner.registry().to_string(),
            self.repository().to_string(),
            digest.to_string(),
        )
    }

    /// The `oci-client` form.
    pub(crate) fn oci(&self) -> &Reference {
        &self.inner
    }
}

/// A validated `sha256:<64 hex>` content digest. Only sha256 is accepted: the hex part names
/// cache directories, so nothing else may reach a path.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(String);

impl Digest {
    /// Parses `sha256:<64 lowercase hex>`; the error says what is wrong.
    pub fn parse(s: &str) -> Result<Digest, String> {
        let Some(hex) = s.strip_prefix("sha256:") else {
            return Err(format!(
                "unsupported digest `{s}` (only sha256 is supported)"
            ));
        };
        if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(format!("malformed sha256 digest `{s}`"));
        }
        Ok(Digest(s.to_string()))
    }

    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        use sha2::Digest as _;
        Digest(format!(
            "sha256:{}",
            hex::encode(sha2::Sha256::digest(bytes))
        ))
    }

    /// The 64 hex digits.
    pub fn hex(&self) -> &str {
        &self.0["sha256:".len()..]
    }

    /// `sha256:<hex>`.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Digest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_hub_defaults() {
        let r = ImageRef::parse("alpine").unwrap();
        assert_eq!(r.canonical(), "docker.io/library/alpine:latest");
        assert_eq!(r.registry(), "index.docker.io");
        assert_eq!(r.tag(), Some("latest"));
        assert!(r.digest().is_none());
    }

    #[test]
    fn loopback_registry_with_port_and_digest() {
        let d = format!("sha256:{}", "ab".repeat(32));
        let r = ImageRef::parse(&format!("127.0.0.1:5000/x/y@{d}")).unwrap();
        assert_eq!(r.registry(), "127.0.0.1:5000");
        assert_eq!(r.repository(), "x/y");
        assert_eq!(r.digest().unwrap().as_str(), d);
        assert_eq!(r.canonical(), format!("127.0.0.1:5000/x/y@{d}"));
    }

    #[test]
    fn bad_digests_are_refused() {
        assert!(Digest::parse("sha512:00").is_err());
        assert!(Digest::parse("sha256:../../etc").is_err());
        assert!(Digest::parse(&format!("sha256:{}", "AB".repeat(32))).is_err());
        assert!(ImageRef::parse("x@sha256:1234").is_err());
        assert!(ImageRef::parse("has space/x").is_err());
    }
}
