//! Test harness (cargo feature `testing`): real registries on loopback and fixture images.
//!
//! Needs these Debian packages: `docker-registry` (distribution 2.8), `umoci`, `skopeo`,
//! `busybox-static`, `erofs-utils`, `fakeroot`, and `python3` for hostile tar layers.
//! [`require_tools`] says which are missing.
//!
//! ```no_run
//! use voidbox_oci::testing::{ImageBuilder, Layer, Registry};
//! # fn f() -> voidbox_oci::testing::Result<()> {
//! let registry = Registry::start()?; // anonymous, plain HTTP on 127.0.0.1:<free port>
//! let digest = ImageBuilder::busybox()?
//!     .layer(Layer::new().file("voidbox-fixture.txt", "hello\n", 0o644))?
//!     .env("GREETING=hi")
//!     .push(&registry, "fixture:v1")?;
//! let reference = registry.reference("fixture:v1"); // "127.0.0.1:PORT/fixture:v1"
//! # Ok(()) }
//! ```

mod erofs_inspect;
mod fixtures;
mod http;
mod registry;
mod token;

pub use erofs_inspect::{erofs_inode, ErofsInode};
pub use fixtures::{file_image, push_index, python_tar, ImageBuilder, Layer};
pub use http::{http_request, HttpResponse};
pub use registry::{Registry, RegistryAuthMode};

/// A harness failure, in words.
#[derive(Debug)]
pub struct HarnessError(pub String);

impl std::fmt::Display for HarnessError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for HarnessError {}

impl From<std::io::Error> for HarnessError {
    fn from(e: std::io::Error) -> Self {
        HarnessError(e.to_string())
    }
}

/// Result of harness operations.
pub type Result<T> = std::result::Result<T, HarnessError>;

/// Builds a [`HarnessError`] from format arguments.
macro_rules! herr {
    ($($t:tt)*) => { $crate::testing::HarnessError(format!($($t)*)) };
}
pub(crate) use herr;

/// The programs the harness and the crate need, with their Debian packages.
pub const TOOLS: &[(&str, &str)] = &[
    ("docker-registry", "docker-registry"),
    ("umoci", "umoci"),
    ("skopeo", "skopeo"),
    ("mkfs.erofs", "erofs-utils"),
    ("dump.erofs", "erofs-utils"),
    ("fakeroot", "fakeroot"),
    ("python3", "python3"),
];

/// Path of the static busybox the fixtures copy (Debian `busybox-static`).
pub const BUSYBOX: &str = "/bin/busybox";

/// Fails naming the Debian packages to install when a tool is missing.
pub fn require_tools() -> Result<()> {
    let mut missing: Vec<&str> = TOOLS
        .iter()
        .filter(|(tool, pkg)| crate::erofs::find_tool(tool, pkg).is_err())
        .map(|(_, pkg)| *pkg)
        .collect();
    if !std::path::Path::new(BUSYBOX).is_file() {
        missing.push("busybox-static");
    }
    missing.dedup();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(herr!(
            "missing test tools; apt-get install {}",
            missing.join(" ")
        ))
    }
}

/// Runs `cmd`, failing with its stderr when it does not succeed.
pub(crate) fn run(cmd: &mut std::process::Command) -> Result<std::process::Output> {
    let out = cmd
        .output()
        .map_err(|e| herr!("running {:?}: {e}", cmd.get_program()))?;
    if !out.status.success() {
        return Err(herr!(
            "{:?} {:?} failed ({}): {}{}",
            cmd.get_program(),
            cmd.get_args().collect::<Vec<_>>(),
            out.status,
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout)
        ));
    }
    Ok(out)
}
