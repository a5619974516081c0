//! The content hashes of an image's inputs and the `manifest.json` of a built image.

use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::error::ImageError;
use super::recipe::Profile;

/// Name of the manifest file in an image directory.
pub const MANIFEST_FILE: &str = "manifest.json";
/// Kernel file name in an image directory.
pub const VMLINUX_FILE: &str = "vmlinux";
/// Initramfs file name in an image directory of the old layout ([`LEGACY_FORMAT`]).
pub const INITRAMFS_FILE: &str = "initramfs.cpio";
/// System disk file name in an image directory: the guest's read-only root (erofs).
pub const SYSTEM_DISK_FILE: &str = "system.erofs";
/// The stripped static guest agent, also kept beside the system disk (for user-supplied
/// initramfs images, which get it appended as a one-file cpio).
pub const AGENT_FILE: &str = "voidbox-agent";
/// Manifest format of images that boot from a system disk.
pub const FORMAT: u32 = 2;
/// Manifest format of images of the old layout (kernel + initramfs). They are still listed
/// and removable, but never booted: the engine builds the current layout instead.
pub const LEGACY_FORMAT: u32 = 1;
/// Final kernel `.config`, kept for inspection.
pub const CONFIG_FILE: &str = "config";

/// A named blob identified by its SHA-256.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamedHash {
    /// File name.
    pub name: String,
    /// Hex SHA-256 of the contents.
    pub sha256: String,
}

/// Everything that determines the kernel. Its hash names the kernel cache entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelInputs {
    /// [`super::recipe::BUILDER_VERSION`].
    pub builder_version: u32,
    /// Guest kernel profile.
    pub profile: Profile,
    /// Debian source package and version, e.g. `linux-source-6.1 6.1.192-2`.
    pub source_package: String,
    /// `gcc --version` (first line).
    pub compiler: String,
    /// `KCFLAGS`, if any.
    pub kcflags: Option<String>,
    /// Config fragments, in merge order.
    pub fragments: Vec<NamedHash>,
    /// Patches, in application order.
    pub patches: Vec<NamedHash>,
}

/// Everything that determines the image. Its hash names the image directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageInputs {
    /// [`super::recipe::BUILDER_VERSION`].
    pub builder_version: u32,
    /// Hash of the [`KernelInputs`].
    pub kernel_inputs_hash: String,
    /// SHA-256 of the guest agent binary (`/init`).
    pub guest_agent_sha256: String,
    /// SHA-256 of the mock LLM runtime (`/opt/voidbox/runtimes/mock/bin/voidbox-mock-llm`),
    /// when the image ships it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mock_llm_sha256: Option<String>,
    /// SHA-256 of the busybox binary.
    pub busybox_sha256: String,
    /// Debian version of busybox-static.
    pub busybox_version: String,
    /// `strip --version` (first line); the agent is installed stripped.
    pub strip: String,
    /// Debian version of erofs-utils (`mkfs.erofs` packs the system disk); `None` in
    /// manifests of the old layout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub erofs_utils_version: Option<String>,
}

/// SHA-256 of bytes, hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// SHA-256 of a file, hex (streamed).
pub fn sha256_file(path: &Path) -> Result<String, ImageError> {
    let mut f = std::fs::File::open(path).map_err(ImageError::io(path))?;
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h).map_err(ImageError::io(path))?;
    Ok(hex::encode(h.finalize()))
}

/// Hash of a serialisable value: SHA-256 of its canonical JSON (fields in declaration
/// order, no whitespace).
pub fn content_hash<T: Serialize>(value: &T) -> String {
    // Serialising these plain structs cannot fail.
    let json = serde_json::to_vec(value).unwrap_or_default();
    sha256_hex(&json)
}

/// A built artifact.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Artifact {
    /// File name in the image directory.
    pub file: String,
    /// Size in bytes.
    pub size: u64,
    /// Hex SHA-256.
    pub sha256: String,
}

impl Artifact {
    /// Describes the file `name` in `dir`.
    pub fn of(dir: &Path, name: &str) -> Result<Artifact, ImageError> {
        let path = dir.join(name);
        let size = std::fs::metadata(&path)
            .map_err(ImageError::io(&path))?
            .len();
        Ok(Artifact {
            file: name.to_string(),
            size,
            sha256: sha256_file(&path)?,
        })
    }
}

/// Kernel facts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelManifest {
    /// `make kernelrelease`, e.g. `6.1.192-voidbox`.
    pub release: String,
    /// Debian source package and version.
    pub source_package: String,
    /// SHA-256 of the final `.config`.
    pub config_sha256: String,
    /// Patches applied, in order.
    pub patches: Vec<String>,
    /// Compiler used.
    pub compiler: String,
    /// `KCFLAGS`, if any.
    pub kcflags: Option<String>,
    /// Hash of the kernel inputs (names the kernel cache entry).
    pub inputs_hash: String,
    /// Seconds the kernel build took (0 when reused from the kernel cache).
    pub build_seconds: f64,
}

/// `manifest.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Manifest format: [`FORMAT`], or [`LEGACY_FORMAT`] for the old layout.
    pub format: u32,
    /// Content hash (of [`ImageInputs`]); the directory name.
    pub hash: String,
    /// Guest kernel profile.
    pub profile: Profile,
    /// The kernel command line the image expects (see [`Profile::cmdline`]).
    pub cmdline: String,
    /// Kernel facts.
    pub kernel: KernelManifest,
    /// SHA-256 of the guest agent binary given to the build.
    pub guest_agent_sha256: String,
    /// SHA-256 of the guest agent as installed in the image (stripped).
    pub init_sha256: String,
    /// Debian version of busybox-static.
    pub busybox_version: String,
    /// `vmlinux`.
    pub vmlinux: Artifact,
    /// `initramfs.cpio` (old layout only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initramfs: Option<Artifact>,
    /// `system.erofs`: the read-only root disk (`/dev/vda`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_disk: Option<Artifact>,
    /// `voidbox-agent`: the stripped agent binary, the same bytes as on the system disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<Artifact>,
    /// `config` (the kernel `.config`).
    pub config: Artifact,
    /// The hashed inputs.
    pub inputs: ImageInputs,
    /// The kernel's hashed inputs.
    pub kernel_inputs: KernelInputs,
    /// Seconds the whole build took.
    pub build_seconds: f64,
    /// Creation time, Unix seconds (not part of the hash).
    pub created_unix: u64,
    /// Names of the programs on the guest's `PATH` (`/bin`, `/sbin`, `/usr/bin`,
    /// `/usr/sbin`, `/usr/local/bin`), sorted; `None` in manifests written before it was
    /// recorded. `cli:NAME` skills are checked against it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_programs: Option<Vec<String>>,
}

impl Manifest {
    /// Reads and parses `dir/manifest.json`.
    pub fn load(dir: &Path) -> Result<Manifest, ImageError> {
        let path = dir.join(MANIFEST_FILE);
        let text = std::fs::read_to_string(&path).map_err(ImageError::io(&path))?;
        Manifest::parse(&text).map_err(|what| ImageError::Manifest { path, what })
    }

    /// Parses a manifest and checks its internal consistency.
    pub fn parse(text: &str) -> Result<Manifest, String> {
        let m: Manifest = serde_json::from_str(text).map_err(|e| e.to_string())?;
        match m.format {
            FORMAT if m.system_disk.is_none() || m.agent.is_none() => {
                return Err("no system disk or agent recorded".into())
            }
            FORMAT => {}
            LEGACY_FORMAT if m.initramfs.is_none() => return Err("no initramfs recorded".into()),
            LEGACY_FORMAT => {}
            f => return Err(format!("unsupported manifest format {f}")),
        }
        if m.hash != content_hash(&m.inputs) {
            return Err("hash does not match the recorded inputs".into());
        }
        if m.inputs.kernel_inputs_hash != content_hash(&m.kernel_inputs) {
            return Err("kernel inputs hash does not match the recorded kernel inputs".into());
        }
        Ok(m)
    }

    /// Whether the image has the current layout (kernel + system disk); images of the old
    /// layout are never booted.
    pub fn is_current_layout(&self) -> bool {
        self.format == FORMAT && self.system_disk.is_some() && self.agent.is_some()
    }

    /// Every artifact the manifest records, in a fixed order.
    pub fn artifacts(&self) -> Vec<&Artifact> {
        let mut v = vec![&self.vmlinux];
        v.extend(self.initramfs.iter());
        v.extend(self.system_disk.iter());
        v.extend(self.agent.iter());
        v.push(&self.config);
        v
    }

    /// [`Manifest::path_programs`] as a set.
    pub fn path_program_set(&self) -> Option<std::collections::BTreeSet<String>> {
        self.path_programs
            .as_ref()
            .map(|v| v.iter().cloned().collect())
    }

    /// Pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn kernel_inputs() -> KernelInputs {
        KernelInputs {
            builder_version: 1,
            profile: Profile::Compat,
            source_package: "linux-source-6.1 6.1.192-2".into(),
            compiler: "gcc (Debian 12.2.0-14) 12.2.0".into(),
            kcflags: Some("-mstringop-strategy=libcall".into()),
            fragments: vec![NamedHash {
                name: "base.config".into(),
                sha256: sha256_hex(b"CONFIG_A=y"),
            }],
            patches: vec![],
        }
    }

    pub(crate) fn manifest() -> Manifest {
        let ki = kernel_inputs();
        let inputs = ImageInputs {
            builder_version: 1,
            kernel_inputs_hash: content_hash(&ki),
            guest_agent_sha256: sha256_hex(b"agent"),
            mock_llm_sha256: None,
            busybox_sha256: sha256_hex(b"busybox"),
            busybox_version: "1:1.35.0-4".into(),
            strip: "GNU strip 2.40".into(),
            erofs_utils_version: Some("1.5-1".into()),
        };
        let art = |f: &str| Artifact {
            file: f.into(),
            size: 1,
            sha256: sha256_hex(b"x"),
        };
        Manifest {
            format: FORMAT,
            hash: content_hash(&inputs),
            profile: Profile::Compat,
            cmdline: super::super::recipe::image_cmdline(Profile::Compat),
            kernel: KernelManifest {
                release: "6.1.192-voidbox".into(),
                source_package: ki.source_package.clone(),
                config_sha256: sha256_hex(b"cfg"),
                patches: vec![],
                compiler: ki.compiler.clone(),
                kcflags: ki.kcflags.clone(),
                inputs_hash: inputs.kernel_inputs_hash.clone(),
                build_seconds: 1.0,
            },
            guest_agent_sha256: inputs.guest_agent_sha256.clone(),
            init_sha256: sha256_hex(b"init"),
            busybox_version: inputs.busybox_version.clone(),
            vmlinux: art(VMLINUX_FILE),
            initramfs: None,
            system_disk: Some(art(SYSTEM_DISK_FILE)),
            agent: Some(art(AGENT_FILE)),
            config: art(CONFIG_FILE),
            inputs,
            kernel_inputs: ki,
            build_seconds: 2.0,
            created_unix: 1_700_000_000,
            path_programs: Some(vec!["awk".into(), "sh".into()]),
        }
    }

    #[test]
    fn hash_is_deterministic_and_input_sensitive() {
        let a = kernel_inputs();
        assert_eq!(content_hash(&a), content_hash(&a.clone()));
        assert_eq!(content_hash(&a).len(), 64);
        let mut b = a.clone();
        b.profile = Profile::Plain;
        assert_ne!(content_hash(&a), content_hash(&b));
        let mut c = a.clone();
        c.fragments[0].sha256 = sha256_hex(b"CONFIG_A=n");
        assert_ne!(content_hash(&a), content_hash(&c));
    }

    #[test]
    fn manifest_round_trip_and_consistency() {
        let m = manifest();
        let back = Manifest::parse(&m.to_json()).unwrap();
        assert_eq!(m, back);
        // Created time is outside the hash.
        let mut later = m.clone();
        later.created_unix += 100;
        assert!(Manifest::parse(&later.to_json()).is_ok());
        // Tampered inputs are caught.
        let mut bad = m.clone();
        bad.inputs.guest_agent_sha256 = sha256_hex(b"other");
        assert!(Manifest::parse(&bad.to_json())
            .unwrap_err()
            .contains("hash"));
        assert!(Manifest::parse("{").is_err());
        assert!(Manifest::parse("{\"format\":2}").is_err());
        assert!(m.is_current_layout());
        // A current-format manifest without its disk is refused.
        let mut no_disk = m.clone();
        no_disk.system_disk = None;
        assert!(Manifest::parse(&no_disk.to_json())
            .unwrap_err()
            .contains("system disk"));
        let mut unknown = m.clone();
        unknown.format = 3;
        assert!(Manifest::parse(&unknown.to_json()).is_err());
    }

    #[test]
    fn old_layout_manifests_parse_but_are_not_current() {
        // A manifest written by the initramfs builder (format 1, no erofs-utils input):
        // its hash still checks out, so it is listed and removable, never booted.
        let mut m = manifest();
        m.format = LEGACY_FORMAT;
        m.inputs.erofs_utils_version = None;
        m.inputs.builder_version = 1;
        m.hash = content_hash(&m.inputs);
        m.system_disk = None;
        m.agent = None;
        m.initramfs = Some(Artifact {
            file: INITRAMFS_FILE.into(),
            size: 1,
            sha256: sha256_hex(b"x"),
        });
        let text = m.to_json();
        assert!(!text.contains("erofs_utils_version") && !text.contains("system_disk"));
        let back = Manifest::parse(&text).unwrap();
        assert!(!back.is_current_layout());
        assert_eq!(back.artifacts().len(), 3);
        let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(
            "../tests/fixtures/image-cache/voidbox/images/\
             4a8f3e3322e79964582038bb71a4241fd1ffc7316eb5f41606bc036b101e825e",
        );
        let old = Manifest::load(&fixture).unwrap();
        assert_eq!(old.format, LEGACY_FORMAT);
        assert!(!old.is_current_layout());
    }
}
