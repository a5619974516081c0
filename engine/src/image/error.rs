//! Errors of the image builder and cache.

use std::path::PathBuf;

use super::kconfig::Mismatch;

/// What can go wrong building, finding or checking a guest image.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The host lacks something the builder cannot fix (not Debian, not root, no
    /// network for apt-get, no KVM to detect the profile, no guest agent binary).
    #[error("{0}")]
    Environment(String),
    /// The host KVM probe failed.
    #[error("cannot detect the host's KVM kind for `--profile auto`: {0}\n  pass --profile plain (hardware KVM) or --profile compat")]
    Probe(#[from] voidbox_vmm::probe::ProbeError),
    /// An I/O error on a path.
    #[error("{path}: {source}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A build step (a command) failed.
    #[error("{step} failed{}\n{log_tail}", log.as_ref().map(|p| format!(" (full log: {})", p.display())).unwrap_or_default())]
    Step {
        /// What was being done.
        step: String,
        /// The last lines of its output.
        log_tail: String,
        /// The full log, if kept.
        log: Option<PathBuf>,
    },
    /// Requested kernel options that kconfig dropped or changed.
    #[error("the kernel configuration does not have what the fragments ask for:\n  {}", .0.iter().map(|m| m.to_string()).collect::<Vec<_>>().join("\n  "))]
    Config(Vec<Mismatch>),
    /// A malformed recipe file (fragment).
    #[error(transparent)]
    Fragment(#[from] super::kconfig::FragmentError),
    /// Building or reading a cpio archive or the root tree failed.
    #[error("root tree: {0}")]
    Cpio(#[from] super::cpio::CpioError),
    /// No cached image matches.
    #[error("{0}")]
    NotFound(String),
    /// A hash prefix named on the command line matches no image, or several.
    #[error("{0}")]
    NoMatch(String),
    /// A manifest that cannot be read.
    #[error("{path}: bad manifest: {what}")]
    Manifest {
        /// The manifest file.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// `image verify` found problems.
    #[error("image {hash} failed verification:\n  {}", problems.join("\n  "))]
    Verify {
        /// The image.
        hash: String,
        /// Each problem.
        problems: Vec<String>,
    },
}

impl ImageError {
    /// Process exit code for the CLI: 3 for environment problems (nothing cached, nothing in
    /// the registry), 2 for a hash prefix that matches no image (as in `snapshot rm`), 1
    /// otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            ImageError::Environment(_) | ImageError::Probe(_) => 3,
            ImageError::NotFound(_) => 3,
            ImageError::NoMatch(_) => 2,
            _ => 1,
        }
    }

    /// Wraps an I/O error with its path.
    pub fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> ImageError {
        let path = path.into();
        move |source| ImageError::Io { path, source }
    }
}
