//! Errors of the runtimes disk: fetching, checking, building, finding and verifying it.

use std::path::PathBuf;

use crate::image::ImageError;

/// What can go wrong with the runtimes disk.
#[derive(Debug, thiserror::Error)]
pub enum RuntimesError {
    /// The host lacks something (Debian's `musl`, `mkfs.erofs`, a cache directory).
    #[error("{0}")]
    Environment(String),
    /// The npm registry could not be reached or did not serve the tarball.
    #[error("cannot fetch {url}: {reason}")]
    Registry {
        /// The URL asked for.
        url: String,
        /// Why it failed (connection error, HTTP status, truncated body).
        reason: String,
    },
    /// The tarball's bytes do not hash to the pinned integrity.
    #[error(
        "{package}: the tarball from {url} does not match the pinned integrity\n  \
         pinned: {expected}\n  got:    {actual}"
    )]
    Integrity {
        /// `name@version`.
        package: String,
        /// Where it came from.
        url: String,
        /// The pinned `sha512-…` integrity.
        expected: String,
        /// The integrity of the bytes received.
        actual: String,
    },
    /// The (verified) tarball holds something refused: an unsafe path, a needed entry
    /// that is missing, not a regular file, duplicated or too large.
    #[error("{package}: refusing the tarball: {what}")]
    Tarball {
        /// `name@version`.
        package: String,
        /// What is wrong.
        what: String,
    },
    /// An I/O error on a path.
    #[error("{path}: {source}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The image cache (locks, temporary directory) or `mkfs.erofs` failed.
    #[error(transparent)]
    Image(#[from] ImageError),
    /// A cached manifest that cannot be read or does not match its directory.
    #[error("{path}: bad runtimes manifest: {what}")]
    Manifest {
        /// The manifest file.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// `verify` found problems.
    #[error("runtimes disk {key} failed verification:\n  {}", problems.join("\n  "))]
    Verify {
        /// The disk's cache key.
        key: String,
        /// Each problem.
        problems: Vec<String>,
    },
    /// No cached runtimes disk (where one was required).
    #[error("{0}")]
    NotFound(String),
}

impl RuntimesError {
    /// Process exit code for the CLI: 3 for environment problems (no registry, no musl,
    /// nothing cached), 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            RuntimesError::Environment(_)
            | RuntimesError::Registry { .. }
            | RuntimesError::NotFound(_) => 3,
            RuntimesError::Image(e) => e.exit_code(),
            _ => 1,
        }
    }

    /// Wraps an I/O error with its path.
    pub fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> RuntimesError {
        let path = path.into();
        move |source| RuntimesError::Io { path, source }
    }
}

impl From<RuntimesError> for ImageError {
    /// For `voidbox image build`: environment problems stay environment problems (exit 3).
    fn from(e: RuntimesError) -> ImageError {
        match e {
            RuntimesError::Image(e) => e,
            e if e.exit_code() == 3 => ImageError::Environment(format!("runtimes disk: {e}")),
            e => ImageError::Step {
                step: "building the runtimes disk".into(),
                log_tail: e.to_string(),
                log: None,
            },
        }
    }
}
