//! The voidbox OCI client: pulls container images from OCI distribution registries and turns
//! them into read-only erofs disks for the guest.
//!
//! ```no_run
//! # async fn f() -> Result<(), voidbox_oci::OciError> {
//! use voidbox_oci::{NoProgress, PullOptions, Store};
//! let store = Store::open_default()?; // $XDG_CACHE_HOME/voidbox/oci or ~/.cache/voidbox/oci
//! let image = store.pull("alpine:3.20", &PullOptions::default(), &NoProgress).await?;
//! println!("{} -> {}", image.manifest_digest, image.rootfs_disk.display());
//! # Ok(()) }
//! ```
//!
//! What a pull does ([`Store::pull`]):
//! - **References** by tag or digest, Docker's defaults (`alpine` is
//!   `docker.io/library/alpine:latest`). Only sha256 digests are accepted.
//! - **Transport**: HTTPS (rustls, system roots) for every registry except loopback ones
//!   (`localhost`, `127.0.0.0/8`, `[::1]`), which use plain HTTP; other registries may use
//!   plain HTTP only when listed in [`PullOptions::insecure_registries`]
//!   (see [`plain_http_allowed`]).
//! - **Auth**: anonymous, HTTP basic, or bearer tokens from the registry's token server;
//!   credentials from `VOIDBOX_REGISTRY_USERNAME`/`VOIDBOX_REGISTRY_PASSWORD` or Docker's
//!   `config.json` ([`auth`]). Passwords never appear in logs or errors.
//! - **Platform**: image indexes resolve to [`PullOptions::platform`] (`linux/amd64`).
//! - **Verification**: every manifest and blob is hashed while it streams in and compared
//!   with its digest before anything is unpacked; blobs longer than their descriptor are cut
//!   off.
//! - **Cache**: content-addressed by image-manifest digest ([`Store`] documents the layout).
//!   A tag is resolved against the registry on every pull; a digest reference already cached
//!   needs no network ([`Store::lookup`] never touches it). Builds happen in a temporary
//!   directory inside the cache and are renamed into place, so nothing half-written stays;
//!   a per-digest `flock` makes concurrent pulls of one image wait and then reuse it.
//!   [`Store::list`], [`Store::remove`], [`Store::prune`] (LRU down to a byte cap) manage it.
//! - **Unpacking** ([`unpack`]): tar, tar+gzip and tar+zstd layers, whiteouts, opaque
//!   directories, hardlinks, and no path escapes (absolute names made relative, `..` refused,
//!   parents resolved inside the root, device nodes dropped, setuid/setgid bits dropped).
//! - **Conversion** ([`erofs`]): `mkfs.erofs` (Debian `erofs-utils`) under `fakeroot`
//!   (Debian `fakeroot`) so the layers' owners and modes land in the image without root.
//! - **Runtime config**: `Env`, `WorkingDir`, `User` (resolved against the image's
//!   `/etc/passwd` and `/etc/group`), `Entrypoint`, `Cmd` ([`RuntimeConfig`]).
//! - **Guest images**: [`Store::pull_boot_files`] returns the kernel and initramfs of a
//!   void-box guest image ([`boot`]).
//!
//! Every failure is an [`OciError`] naming the reason; the engine maps them all to exit 3.
//!
//! With the `testing` feature, [`testing`] offers loopback registries (anonymous, htpasswd,
//! token auth) and fixture-image builders for tests in other crates.

#![warn(missing_docs)]

pub mod artifact;
pub mod auth;
pub mod boot;
mod config;
mod connection;
pub mod erofs;
mod error;
mod options;
mod pull;
mod reference;
mod resolve;
mod store;
pub mod unpack;

#[cfg(feature = "testing")]
pub mod testing;

pub use config::RuntimeConfig;
pub use error::OciError;
pub use options::{plain_http_allowed, NoProgress, Platform, PullOptions, PullProgress};
pub use reference::{Digest, ImageRef};
pub use store::{BootFiles, CachedImage, PulledImage, Store};
