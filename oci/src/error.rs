//! The one error type of this crate.
//!
//! Every variant carries the reason in words. None of them ever holds a registry password or
//! token: messages from the registry are scrubbed of the credentials in use before they are
//! stored (see [`crate::auth::Credentials::scrub`]).

use std::path::PathBuf;

/// Why a pull, a cache operation or a conversion failed.
///
/// The engine maps every variant to exit code 3 ("image unavailable").
#[derive(Debug, thiserror::Error)]
pub enum OciError {
    /// The image reference could not be parsed.
    #[error("invalid image reference `{reference}`: {reason}")]
    InvalidReference {
        /// The reference as given.
        reference: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The registry could not be reached (DNS, connection refused, TLS, timeout).
    #[error("registry {registry} unreachable: {reason}")]
    Unreachable {
        /// Registry host\[:port\].
        registry: String,
        /// The transport error.
        reason: String,
    },
    /// The registry (or its token server) refused the credentials, or asked for credentials
    /// that were not configured.
    #[error("registry {registry} refused access: {reason}")]
    AuthRefused {
        /// Registry host\[:port\].
        registry: String,
        /// The registry's answer (never the password).
        reason: String,
    },
    /// The repository, tag or digest does not exist in the registry.
    #[error("image {reference} not found: {reason}")]
    NotFound {
        /// The reference as given.
        reference: String,
        /// The registry's answer.
        reason: String,
    },
    /// Downloaded bytes do not hash to the digest they were addressed by.
    #[error("digest mismatch for {what}: expected {expected}, got {actual}")]
    DigestMismatch {
        /// What was being verified ("manifest", "layer sha256:…", …).
        what: String,
        /// The digest asked for.
        expected: String,
        /// The digest of what arrived.
        actual: String,
    },
    /// A manifest, config or layer media type this client does not handle.
    #[error("unsupported media type {media_type} ({what})")]
    UnsupportedMediaType {
        /// The media type.
        media_type: String,
        /// Where it was found.
        what: String,
    },
    /// An image index has no manifest for the requested platform.
    #[error("image {reference} has no manifest for {platform} (available: {available})")]
    NoMatchingPlatform {
        /// The reference as given.
        reference: String,
        /// The platform asked for.
        platform: String,
        /// The platforms the index offers, comma separated.
        available: String,
    },
    /// The registry answered something that violates the distribution spec.
    #[error("registry {registry}: {reason}")]
    Registry {
        /// Registry host\[:port\].
        registry: String,
        /// What went wrong.
        reason: String,
    },
    /// A layer holds an entry that would escape the root filesystem (or is otherwise refused).
    #[error("layer {layer}: entry `{entry}` refused: {reason}")]
    UnsafeLayer {
        /// The layer digest.
        layer: String,
        /// The entry's name as stored in the tar.
        entry: String,
        /// Why it was refused.
        reason: String,
    },
    /// A layer could not be read or applied.
    #[error("layer {layer}: {reason}")]
    Layer {
        /// The layer digest.
        layer: String,
        /// What went wrong.
        reason: String,
    },
    /// A helper program is not installed.
    #[error("`{tool}` not found: install the Debian package `{package}`")]
    ToolMissing {
        /// The program.
        tool: String,
        /// The Debian package that ships it.
        package: String,
    },
    /// A helper program failed.
    #[error("`{tool}` failed ({status}): {stderr}")]
    ToolFailed {
        /// The program.
        tool: String,
        /// Its exit status.
        status: String,
        /// The tail of its standard error.
        stderr: String,
    },
    /// Credentials could not be read (malformed `config.json`, half-set environment).
    #[error("registry credentials: {0}")]
    Credentials(String),
    /// Nothing in the cache matches.
    #[error("not in the OCI cache: {0}")]
    NotCached(String),
    /// A prefix matches more than one cached image.
    #[error("`{what}` matches {count} cached images; give more of the digest")]
    Ambiguous {
        /// The prefix given.
        what: String,
        /// How many images it matches.
        count: usize,
    },
    /// The image holds no kernel at any of the guest-image paths.
    #[error("image {reference} holds no kernel (looked at {})", looked_at.join(", "))]
    NoKernel {
        /// The reference as given.
        reference: String,
        /// The paths looked at.
        looked_at: Vec<String>,
    },
    /// The cache holds something this version cannot read.
    #[error("OCI cache at {}: {reason}", path.display())]
    Cache {
        /// The file or directory.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A file system operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done, with the path.
        context: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl OciError {
    /// Wraps an I/O error with what was being done.
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> OciError {
        OciError::Io {
            context: context.into(),
            source,
        }
    }
}

/// Adds `.ctx("doing what")` to I/O results.
pub(crate) trait IoContext<T> {
    /// Wraps the error with `context`.
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T, OciError>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T, OciError> {
        self.map_err(|e| OciError::io(context(), e))
    }
}

impl<T> IoContext<T> for rustix::io::Result<T> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T, OciError> {
        self.map_err(|e| OciError::io(context(), e.into()))
    }
}
