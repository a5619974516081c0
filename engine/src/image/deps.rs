//! Build dependencies from Debian packages: checking, installing (as root, with
//! apt-get) and reading the versions that go into the image's content hash.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::error::ImageError;
use super::recipe;

/// Debian packages the builder needs.
pub const PACKAGES: &[&str] = &[
    recipe::KERNEL_SOURCE_PACKAGE,
    "flex",
    "bison",
    "bc",
    "libelf-dev",
    "cpio",
    "xz-utils",
    "patch",
    "make",
    "gcc",
    "binutils",
    "libc6-dev",
    super::erofs::EROFS_PACKAGE,
    // the musl loader and bash of the runtimes disk (engine/src/runtimes)
    MUSL_PACKAGE,
    BASH_PACKAGE,
];

/// Debian package whose `libc.so` is the musl dynamic loader (of the runtimes disk).
pub const MUSL_PACKAGE: &str = "musl";
/// Where Debian's `musl` installs it.
pub const MUSL_LIBC: &str = "/usr/lib/x86_64-linux-musl/libc.so";
/// Debian package carrying a static bash (the runtimes disk's shell).
pub const BASH_PACKAGE: &str = "bash-static";
/// Where Debian's `bash-static` installs it.
pub const BASH_STATIC: &str = "/bin/bash-static";

/// Where the host's busybox-static installs its binary (tests only: the guest's busybox is
/// Debian trixie's, see [`super::busybox`]).
pub const BUSYBOX_PATH: &str = "/bin/busybox";

/// Versions of the tools that shape the output.
#[derive(Debug, Clone)]
pub struct Toolchain {
    /// Debian version of the kernel source package, e.g. `6.1.192-2`.
    pub kernel_source_version: String,
    /// Debian version of the guest's busybox-static ([`super::busybox`]).
    pub busybox_version: String,
    /// `gcc --version`, first line.
    pub gcc: String,
    /// `strip --version`, first line.
    pub strip: String,
    /// Debian version of erofs-utils (`mkfs.erofs`).
    pub erofs_utils_version: String,
    /// The kernel source tarball.
    pub source_tarball: PathBuf,
    /// The guest's static busybox binary.
    pub busybox: PathBuf,
}

/// Debian version of an installed package, or `None`.
pub fn installed_version(pkg: &str) -> Option<String> {
    let out = Command::new("dpkg-query")
        .args(["-W", "-f=${Status}\t${Version}", pkg])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let (status, version) = text.split_once('\t')?;
    (out.status.success() && status == "install ok installed" && !version.is_empty())
        .then(|| version.to_string())
}

/// The packages of [`PACKAGES`] that are not installed.
pub fn missing_packages() -> Result<Vec<&'static str>, ImageError> {
    if which("dpkg-query").is_none() {
        return Err(ImageError::Environment(
            "the image builder needs a Debian-based host (dpkg-query and apt-get not found)".into(),
        ));
    }
    Ok(PACKAGES
        .iter()
        .copied()
        .filter(|p| installed_version(p).is_none())
        .collect())
}

/// Installs missing packages with apt-get (root only); `log` receives a line per step.
pub fn ensure_packages(log: &mut dyn FnMut(&str)) -> Result<(), ImageError> {
    let missing = missing_packages()?;
    if missing.is_empty() {
        return Ok(());
    }
    let list = missing.join(" ");
    if !is_root() {
        return Err(ImageError::Environment(format!(
            "missing build packages: {list}\n  install them as root: apt-get install --no-install-recommends {list}"
        )));
    }
    log(&format!("installing {list} (apt-get)"));
    let update = Command::new("apt-get")
        .args(["-q", "update"])
        .env("DEBIAN_FRONTEND", "noninteractive")
        .output();
    match update {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            return Err(ImageError::Environment(format!(
                "apt-get update failed (no network?):\n{}",
                tail(&String::from_utf8_lossy(&o.stderr), 10)
            )))
        }
        Err(e) => return Err(ImageError::Environment(format!("running apt-get: {e}"))),
    }
    let out = Command::new("apt-get")
        .args(["-q", "-y", "install", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .output()
        .map_err(|e| ImageError::Environment(format!("running apt-get: {e}")))?;
    if !out.status.success() {
        return Err(ImageError::Environment(format!(
            "apt-get install {list} failed:\n{}",
            tail(&String::from_utf8_lossy(&out.stderr), 10)
        )));
    }
    let still = missing_packages()?;
    if !still.is_empty() {
        return Err(ImageError::Environment(format!(
            "still missing after apt-get: {}",
            still.join(" ")
        )));
    }
    Ok(())
}

/// Reads the toolchain versions (packages must be installed), with the guest's busybox.
pub fn toolchain(busybox: super::busybox::GuestBusybox) -> Result<Toolchain, ImageError> {
    let need = |pkg: &str| {
        installed_version(pkg)
            .ok_or_else(|| ImageError::Environment(format!("package {pkg} is not installed")))
    };
    let first_line = |tool: &str| {
        Command::new(tool)
            .arg("--version")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.lines().next().map(str::to_string))
            .ok_or_else(|| ImageError::Environment(format!("{tool} not found")))
    };
    let gcc = first_line("gcc")?;
    let strip = first_line("strip")?;
    let tc = Toolchain {
        kernel_source_version: need(recipe::KERNEL_SOURCE_PACKAGE)?,
        busybox_version: busybox.version,
        gcc,
        strip,
        erofs_utils_version: need(super::erofs::EROFS_PACKAGE)?,
        source_tarball: PathBuf::from(recipe::KERNEL_SOURCE_TARBALL),
        busybox: busybox.path,
    };
    for p in [&tc.source_tarball, &tc.busybox] {
        if !p.is_file() {
            return Err(ImageError::Environment(format!(
                "{} is missing (reinstall its package)",
                p.display()
            )));
        }
    }
    Ok(tc)
}

/// The effective user is root.
pub fn is_root() -> bool {
    // /proc/self/status "Uid:" line: real, effective, saved, fs.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

/// Finds an executable on `PATH`.
pub fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    p.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_last_lines() {
        assert_eq!(tail("a\nb\nc\n", 2), "b\nc");
        assert_eq!(tail("a", 5), "a");
        assert_eq!(tail("", 5), "");
    }

    #[test]
    fn which_finds_sh() {
        assert!(which("sh").is_some());
        assert!(which("definitely-not-a-command-xyz").is_none());
    }
}
