//! What goes onto the runtimes disk: the pinned npm packages (name, version, the integrity
//! their tarball must hash to, the entries taken from it) and files of this host's Debian
//! packages: musl's loader (Claude Code's interpreter) and a static bash (the shell Claude
//! Code's Bash tool needs; the guest image has only busybox `sh`).

use std::path::PathBuf;

/// npm package carrying Claude Code's native musl build.
pub const CLAUDE_PACKAGE: &str = "@anthropic-ai/claude-code-linux-x64-musl";
/// Its pinned version.
pub const CLAUDE_VERSION: &str = "2.1.330";
/// The pinned npm integrity of its tarball.
pub const CLAUDE_INTEGRITY: &str = "sha512-OnduSSPY1b59FA8jTbq20Y1XkDUV0S1OVyvYBNslEbpX79P81JF7Ih4lgYvDKiFnnSv75z4Kv6qLE5DQqogYXA==";

/// npm package carrying Codex's static musl build (a platform build of `@openai/codex`).
pub const CODEX_PACKAGE: &str = "@openai/codex";
/// Its pinned version (the `linux-x64` platform build).
pub const CODEX_VERSION: &str = "0.169.0-linux-x64";
/// The pinned npm integrity of its tarball.
pub const CODEX_INTEGRITY: &str = "sha512-o05NyAOCDygSPRo1yinzxvkRSdmsZyBD9E7mbpmjRanSfM8lypqWtQgEo4XfNkwhuCR2aFu8mlGOsQGFXVbVww==";

// The host packages the disk is built from are the image builder's build dependencies.
pub use crate::image::deps::{BASH_PACKAGE, BASH_STATIC, MUSL_LIBC, MUSL_PACKAGE};

/// Disk path of the musl loader (relative to the mount point).
pub const LOADER_PATH: &str = "lib/ld-musl-x86_64.so.1";
/// Disk path of bash.
pub const BASH_PATH: &str = "bash/bin/bash";
/// Disk path of Claude Code.
pub const CLAUDE_PATH: &str = "claude/bin/claude";
/// Disk path of Codex.
pub const CODEX_PATH: &str = "codex/bin/codex";
/// Disk path of ripgrep (Codex's search tool, next to it so one `PATH` entry finds both).
pub const RG_PATH: &str = "codex/bin/rg";

/// One npm package to ship.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Package {
    /// npm name (`@scope/name`).
    pub name: String,
    /// Exact version.
    pub version: String,
    /// The `sha512-<base64>` integrity its tarball must have.
    pub integrity: String,
    /// The tarball entries shipped, and where they go on the disk.
    pub files: Vec<Ship>,
}

/// One tarball entry shipped on the disk (as an executable, mode 0555).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ship {
    /// Path inside the tarball (`package/…`).
    pub source: String,
    /// Path on the disk, relative to its root.
    pub dest: String,
}

impl Package {
    /// `name@version`.
    pub fn id(&self) -> String {
        format!("{}@{}", self.name, self.version)
    }
}

/// A file shipped from an installed Debian package of this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DebianFile {
    /// The Debian package.
    pub package: &'static str,
    /// Its installed Debian version.
    pub version: String,
    /// The file on this host.
    pub path: PathBuf,
    /// Path on the disk, relative to its root.
    pub dest: &'static str,
}

fn ship(source: &str, dest: &str) -> Ship {
    Ship {
        source: source.to_string(),
        dest: dest.to_string(),
    }
}

/// The pinned packages.
pub(crate) fn pinned() -> Vec<Package> {
    const CODEX_VENDOR: &str = "package/vendor/x86_64-unknown-linux-musl";
    vec![
        Package {
            name: CLAUDE_PACKAGE.into(),
            version: CLAUDE_VERSION.into(),
            integrity: CLAUDE_INTEGRITY.into(),
            files: vec![ship("package/claude", CLAUDE_PATH)],
        },
        Package {
            name: CODEX_PACKAGE.into(),
            version: CODEX_VERSION.into(),
            integrity: CODEX_INTEGRITY.into(),
            files: vec![
                ship(&format!("{CODEX_VENDOR}/bin/codex"), CODEX_PATH),
                ship(&format!("{CODEX_VENDOR}/codex-path/rg"), RG_PATH),
            ],
        },
    ]
}

/// The Debian files shipped (musl's loader, then bash), or why one is not there.
pub(crate) fn host_files() -> Result<Vec<DebianFile>, String> {
    [
        (
            MUSL_PACKAGE,
            MUSL_LIBC,
            LOADER_PATH,
            "the musl loader for Claude Code",
        ),
        (
            BASH_PACKAGE,
            BASH_STATIC,
            BASH_PATH,
            "bash for Claude Code's Bash tool",
        ),
    ]
    .into_iter()
    .map(|(package, source, dest, what)| {
        let hint = format!("install Debian's {package}: apt-get install {package}");
        let version = crate::image::deps::installed_version(package)
            .ok_or_else(|| format!("{what} is missing ({hint})"))?;
        let path = PathBuf::from(source);
        if !path.is_file() {
            return Err(format!("{source} is missing ({hint})"));
        }
        Ok(DebianFile {
            package,
            version,
            path,
            dest,
        })
    })
    .collect()
}
