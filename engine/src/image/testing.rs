//! Test fixtures: synthetic but structurally complete guest images, for the tests of this
//! crate and of others (`voidbox image` against temporary caches and real registries).
//!
//! Hidden from the docs and never called by the CLI: nothing here is built from a real
//! kernel or busybox, and every failure panics.

use std::path::Path;

use super::build::{kernel_inputs, recipe_matches};
use super::deps::Toolchain;
use super::manifest::{
    content_hash, sha256_hex, Artifact, ImageInputs, KernelManifest, Manifest, AGENT_FILE,
    CONFIG_FILE, FORMAT, MANIFEST_FILE, SYSTEM_DISK_FILE, VMLINUX_FILE,
};
use super::{erofs, layout, recipe, Profile};

/// A fake `vmlinux`: an ELF64 x86-64 executable header, one PT_NOTE holding a Xen PVH entry
/// note (entry `0x1000500`), then 64 KiB of filler so that it is not trivially small.
pub fn fake_vmlinux() -> Vec<u8> {
    let mut b = vec![0u8; 64 + 56];
    b[..4].copy_from_slice(b"\x7fELF");
    b[4] = 2;
    b[5] = 1;
    b[16..18].copy_from_slice(&2u16.to_le_bytes());
    b[18..20].copy_from_slice(&62u16.to_le_bytes());
    b[24..32].copy_from_slice(&0x100_0000u64.to_le_bytes());
    b[32..40].copy_from_slice(&64u64.to_le_bytes());
    b[54..56].copy_from_slice(&56u16.to_le_bytes());
    b[56..58].copy_from_slice(&1u16.to_le_bytes());
    let mut note = Vec::new();
    for v in [4u32, 4, 18] {
        note.extend(v.to_le_bytes());
    }
    note.extend(b"Xen\0");
    note.extend(0x100_0500u32.to_le_bytes());
    let off = b.len() as u64;
    b[64..68].copy_from_slice(&4u32.to_le_bytes());
    b[72..80].copy_from_slice(&off.to_le_bytes());
    b[96..104].copy_from_slice(&(note.len() as u64).to_le_bytes());
    b.extend(note);
    b.extend((0..64 * 1024u32).map(|i| (i % 251) as u8));
    b
}

/// A synthetic guest image: the fake kernel of [`fake_vmlinux`], a real erofs system disk
/// (`mkfs.erofs`) holding `agent` and stand-in busybox applets, a kernel config and a
/// manifest. [`FakeImage::new`] gives an image of this build's recipe; set the fields to vary
/// it, then [`FakeImage::write`] it into a cache.
#[derive(Debug, Clone, Copy)]
pub struct FakeImage<'a> {
    /// The guest agent's bytes (also the image's `init`); distinct agents make distinct
    /// images.
    pub agent: &'a [u8],
    /// The image builder version recorded in the image and kernel inputs.
    pub builder_version: u32,
    /// The image's profile.
    pub profile: Profile,
    /// Whether the kernel inputs follow this build's recipe for `profile` (its fragments,
    /// patches and `KCFLAGS`), as pushing and booting require; if not, they name none.
    pub recipe_kernel: bool,
}

impl<'a> FakeImage<'a> {
    /// A compat image of this build's recipe (builder version and kernel inputs) for `agent`.
    pub fn new(agent: &'a [u8]) -> Self {
        FakeImage {
            agent,
            builder_version: recipe::BUILDER_VERSION,
            profile: Profile::Compat,
            recipe_kernel: true,
        }
    }

    /// Writes the image into cache root `root` (`root/images/<hash>`) and returns its hash.
    /// Panics on any failure (`mkfs.erofs` is needed: Debian `erofs-utils`).
    pub fn write(&self, root: &Path) -> String {
        let (agent, profile) = (self.agent, self.profile);
        let applets: Vec<String> = recipe::REQUIRED_APPLETS
            .iter()
            .map(|a| format!("bin/{a}"))
            .collect();
        let tree = layout::build(agent, b"\x7fELFbusybox", &applets).expect("root tree");
        let config = "CONFIG_64BIT=y\nCONFIG_VOIDBOX_EMULATED_KVM=y\n";
        let toolchain = Toolchain {
            kernel_source_version: "test".into(),
            busybox_version: super::busybox::VERSION.into(),
            gcc: "gcc test".into(),
            strip: "test".into(),
            erofs_utils_version: "test".into(),
            source_tarball: Default::default(),
            busybox: Default::default(),
        };
        let mut kin = kernel_inputs(profile, &toolchain);
        kin.builder_version = self.builder_version;
        if !self.recipe_kernel {
            kin.kcflags = None;
            kin.fragments.clear();
            kin.patches.clear();
        }
        assert_eq!(
            recipe_matches(&kin),
            self.recipe_kernel && self.builder_version == recipe::BUILDER_VERSION,
            "kernel inputs of the fake image"
        );
        let inputs = ImageInputs {
            builder_version: self.builder_version,
            kernel_inputs_hash: content_hash(&kin),
            guest_agent_sha256: sha256_hex(agent),
            mock_llm_sha256: None,
            busybox_sha256: sha256_hex(b"bb"),
            busybox_version: toolchain.busybox_version.clone(),
            strip: toolchain.strip.clone(),
            erofs_utils_version: Some(toolchain.erofs_utils_version.clone()),
        };
        let hash = content_hash(&inputs);
        let dir = root.join("images").join(&hash);
        std::fs::create_dir_all(&dir).expect("image dir");
        std::fs::write(dir.join(VMLINUX_FILE), fake_vmlinux()).expect("vmlinux");
        let scratch = tempfile::tempdir().expect("scratch");
        erofs::build(&tree, scratch.path(), &dir.join(SYSTEM_DISK_FILE))
            .expect("mkfs.erofs is needed (Debian: erofs-utils)");
        std::fs::write(dir.join(AGENT_FILE), agent).expect("agent");
        std::fs::write(dir.join(CONFIG_FILE), config).expect("config");
        let art = |f: &str| Artifact::of(&dir, f).expect("artifact");
        let patches = if self.recipe_kernel {
            recipe::PATCHES.iter().map(|(n, _)| n.to_string()).collect()
        } else {
            vec![]
        };
        let m = Manifest {
            format: FORMAT,
            hash: hash.clone(),
            profile,
            cmdline: recipe::image_cmdline(profile),
            kernel: KernelManifest {
                release: "6.1.0-test".into(),
                source_package: kin.source_package.clone(),
                config_sha256: sha256_hex(config.as_bytes()),
                patches,
                compiler: kin.compiler.clone(),
                kcflags: kin.kcflags.clone(),
                inputs_hash: inputs.kernel_inputs_hash.clone(),
                build_seconds: 0.0,
            },
            guest_agent_sha256: inputs.guest_agent_sha256.clone(),
            init_sha256: sha256_hex(agent),
            busybox_version: inputs.busybox_version.clone(),
            path_programs: Some(layout::path_programs(&tree)),
            vmlinux: art(VMLINUX_FILE),
            initramfs: None,
            system_disk: Some(art(SYSTEM_DISK_FILE)),
            agent: Some(art(AGENT_FILE)),
            config: art(CONFIG_FILE),
            inputs,
            kernel_inputs: kin,
            build_seconds: 1.0,
            created_unix: 1_700_000_000,
        };
        std::fs::write(dir.join(MANIFEST_FILE), m.to_json() + "\n").expect("manifest");
        hash
    }
}
