//! One authenticated `oci-client` connection to a repository, shared by image pulls
//! ([`crate::pull`]) and OCI artifacts ([`crate::artifact`]).
//!
//! [`Connection`] builds the HTTP client (plain HTTP only where [`plain_http_allowed`] says
//! so), authenticates with the credentials of [`credentials_for`], sorts every
//! `oci-client` error into an [`OciError`] with those credentials scrubbed from its text, and
//! downloads blobs through a [`VerifyingWriter`]: hashed as the bytes arrive, never more
//! bytes than the descriptor announced, the digest compared before anything is trusted.

use std::pin::Pin;
use std::task::{Context, Poll};

use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::manifest::OciDescriptor;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, RegistryOperation};
use sha2::Digest as _;
use tokio::io::AsyncWrite;

use crate::auth::{credentials_for, Credentials};
use crate::error::OciError;
use crate::options::{plain_http_allowed, PullProgress};
use crate::reference::{Digest, ImageRef};

/// A client for the repository of one reference, authenticated, with its credentials.
pub(crate) struct Connection {
    pub(crate) client: Client,
    pub(crate) image: ImageRef,
    pub(crate) creds: Option<Credentials>,
    /// How local I/O errors during a transfer are worded ("downloading", "transferring").
    io_verb: &'static str,
}

/// Installs rustls' ring provider as the process default (once; a provider installed by
/// someone else is left alone).
fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

impl Connection {
    /// Connects to the registry of `image` (plain HTTP only where [`plain_http_allowed`] says
    /// so, given `insecure`) and authenticates for `op`. `io_verb` words local I/O errors of
    /// later transfers (`"{io_verb} {what}"`).
    pub(crate) async fn connect(
        image: &ImageRef,
        insecure: &[String],
        op: RegistryOperation,
        io_verb: &'static str,
    ) -> Result<Connection, OciError> {
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
        let conn = Connection {
            client,
            image: image.clone(),
            creds,
            io_verb,
        };
        conn.client
            .auth(image.oci(), &conn.auth(), op)
            .await
            .map_err(|e| conn.map_err(e, "authentication"))?;
        Ok(conn)
    }

    /// The credentials to send: basic auth when configured, else anonymous.
    pub(crate) fn auth(&self) -> RegistryAuth {
        self.creds
            .as_ref()
            .map(Credentials::to_registry_auth)
            .unwrap_or(RegistryAuth::Anonymous)
    }

    /// A distribution-spec violation by this registry, `reason` scrubbed of credentials.
    pub(crate) fn spec(&self, reason: String) -> OciError {
        OciError::Registry {
            registry: self.image.registry().to_string(),
            reason: self.scrub(reason),
        }
    }

    /// `text` with the credentials in use replaced by `***`.
    pub(crate) fn scrub(&self, text: String) -> String {
        match &self.creds {
            Some(c) => c.scrub(&text),
            None => text,
        }
    }

    /// Downloads blob `desc` (whose digest is `digest`) into `w` and checks what arrived
    /// against `digest` and the announced size; `what` names the blob in errors.
    pub(crate) async fn pull_blob<W: AsyncWrite + Unpin>(
        &self,
        desc: &OciDescriptor,
        digest: &Digest,
        w: &mut VerifyingWriter<'_, W>,
        what: &str,
    ) -> Result<(), OciError> {
        if let Err(e) = self.client.pull_blob(self.image.oci(), desc, &mut *w).await {
            if w.too_long {
                return Err(self.spec(format!(
                    "{what} is larger than the {} bytes its descriptor says",
                    w.limit
                )));
            }
            return Err(self.map_err(e, what));
        }
        w.check(digest, what)
    }

    /// Sorts an `oci-client` error into ours, scrubbing credentials from any text.
    pub(crate) fn map_err(&self, e: OciDistributionError, what: &str) -> OciError {
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
            E::IoError(io) => OciError::io(format!("{} {what}", self.io_verb), io),
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

/// Hashes and counts bytes on their way to `inner`; refuses more than `limit` bytes, and
/// reports each write to `progress`, if any.
pub(crate) struct VerifyingWriter<'a, W> {
    pub(crate) inner: W,
    hasher: sha2::Sha256,
    written: u64,
    limit: u64,
    too_long: bool,
    progress: Option<&'a dyn PullProgress>,
}

impl<'a, W> VerifyingWriter<'a, W> {
    /// A writer into `inner` that accepts at most `limit` bytes.
    pub(crate) fn new(inner: W, limit: u64, progress: Option<&'a dyn PullProgress>) -> Self {
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
