//! The image recipe kept in `guest-agent/image/`, embedded in the binary so that
//! `voidbox image build` works from any directory: config fragments, kernel patches,
//! profiles, the kernel command line each profile wants and where the system disk puts
//! the guest agent.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Bumped whenever the builder changes what it produces from the same inputs (2: a system
/// disk instead of an initramfs; the crypto self-tests off; 3: `/lib` with the musl loader link
/// and the runtimes disk's mount point).
pub const BUILDER_VERSION: u32 = 3;

/// Fragment merged into every profile.
pub const BASE_CONFIG: &str = include_str!("../../../guest-agent/image/config/base.config");
/// Fragment merged after [`BASE_CONFIG`] for [`Profile::Compat`].
pub const COMPAT_CONFIG: &str =
    include_str!("../../../guest-agent/image/config/compat-emulated-kvm.config");

macro_rules! patch {
    ($name:literal) => {
        (
            $name,
            include_str!(concat!("../../../guest-agent/image/patches/", $name)),
        )
    };
}

/// Kernel patches, applied in this order with `patch -p1` (in both profiles: each is
/// guarded by its own Kconfig option, off in the plain profile).
pub const PATCHES: &[(&str, &str)] = &[
    patch!("0001-voidbox-kconfig-emulated-kvm.patch"),
    patch!("0002-voidbox-skip-int3-selftest.patch"),
    patch!("0003-voidbox-syscall-fixup.patch"),
    patch!("0004-voidbox-fpu-drop-no-fwait.patch"),
    patch!("0005-voidbox-rep-string-ops.patch"),
    patch!("0006-voidbox-fast-free-initmem.patch"),
    patch!("0007-voidbox-pv-xstate.patch"),
    patch!("0008-voidbox-clear-page-rep.patch"),
];

/// Debian package providing the kernel source tarball.
pub const KERNEL_SOURCE_PACKAGE: &str = "linux-source-6.1";
/// The tarball that package installs.
pub const KERNEL_SOURCE_TARBALL: &str = "/usr/src/linux-source-6.1.tar.xz";
/// Top directory inside the tarball.
pub const KERNEL_SOURCE_DIR: &str = "linux-source-6.1";

/// Fixed kbuild identity, for reproducible kernels.
pub const KBUILD_ENV: &[(&str, &str)] = &[
    ("KBUILD_BUILD_TIMESTAMP", "Thu Jan  1 00:00:00 UTC 1970"),
    ("KBUILD_BUILD_USER", "voidbox"),
    ("KBUILD_BUILD_HOST", "voidbox"),
    ("KBUILD_BUILD_VERSION", "1"),
];

/// Fixed mtime of every entry of the guest's root tree.
pub const FILE_MTIME: u32 = 0;

/// Where the guest agent lives on the system disk; the kernel runs it as PID 1.
pub const AGENT_GUEST_PATH: &str = "sbin/voidbox-agent";

/// Kernel parameters that boot the system disk: `/dev/vda` (the first virtio-blk disk),
/// read-only erofs as the root, the guest agent as init. No initramfs is unpacked.
pub const SYSTEM_DISK_CMDLINE: &str = "root=/dev/vda rootfstype=erofs ro init=/sbin/voidbox-agent";

/// Which guest kernel to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Profile {
    /// A stock kernel, for hardware virtualisation (VMX/SVM).
    Plain,
    /// The patched kernel for hosts whose KVM emulates guest kernel mode.
    Compat,
}

impl Profile {
    /// `plain` / `compat`.
    pub fn as_str(self) -> &'static str {
        match self {
            Profile::Plain => "plain",
            Profile::Compat => "compat",
        }
    }

    /// The config fragments of this profile, in merge order.
    pub fn fragments(self) -> Vec<(&'static str, &'static str)> {
        let mut v = vec![("base.config", BASE_CONFIG)];
        if self == Profile::Compat {
            v.push(("compat-emulated-kvm.config", COMPAT_CONFIG));
        }
        v
    }

    /// Extra compiler flags (`KCFLAGS`).
    pub fn kcflags(self) -> Option<&'static str> {
        match self {
            // gcc would otherwise inline byte-wise `rep stosb`, each iteration emulated.
            Profile::Compat => Some("-mstringop-strategy=libcall"),
            Profile::Plain => None,
        }
    }

    /// The kernel command line this image expects (the VMM appends `virtio_mmio.device=`
    /// entries, `voidbox.*` parameters and, for more than one vCPU on a compat host,
    /// `nopv tsc_early_khz=<KVM_GET_TSC_KHZ> tsc=reliable`).
    pub fn cmdline(self) -> &'static str {
        match self {
            Profile::Plain => "console=ttyS0 reboot=k panic=-1 pci=off quiet",
            Profile::Compat => {
                "console=ttyS0 reboot=k panic=-1 pci=off quiet noxsave \
                 clearcpuid=popcnt,cx16,smap,rdtscp,clwb,erms,fsrm mitigations=off rodata=off \
                 noreplace-smp clocksource=kvm-clock"
            }
        }
    }
}

/// The kernel command line an image of `profile` records: the profile's flags and
/// [`SYSTEM_DISK_CMDLINE`].
pub fn image_cmdline(profile: Profile) -> String {
    format!("{} {SYSTEM_DISK_CMDLINE}", profile.cmdline())
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Busybox applets the image must provide (the build fails if the installed busybox
/// lacks one); every other applet of the binary is linked too.
pub const REQUIRED_APPLETS: &[&str] = &[
    "sh", "ash", "awk", "basename", "cat", "chmod", "cp", "cut", "date", "dirname", "echo", "env",
    "expr", "false", "find", "grep", "head", "id", "kill", "ln", "ls", "mkdir", "mktemp", "mv",
    "printf", "ps", "pwd", "rm", "sed", "seq", "sleep", "sort", "stat", "tail", "tee", "test",
    "touch", "tr", "true", "uname", "uniq", "wc", "xargs",
];

/// Applets never linked: the agent is PID 1, nothing else may pose as init.
pub const EXCLUDED_APPLETS: &[&str] = &["init", "linuxrc"];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patch_list_matches_directory() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest-agent/image/patches");
        let mut on_disk: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".patch"))
            .collect();
        on_disk.sort();
        let listed: Vec<&str> = PATCHES.iter().map(|(n, _)| *n).collect();
        assert_eq!(
            on_disk, listed,
            "recipe::PATCHES must list guest-agent/image/patches/*.patch in order"
        );
    }

    #[test]
    fn every_patch_is_a_unified_diff_guarded_by_a_voidbox_option() {
        for (name, text) in PATCHES {
            assert!(
                text.contains("\n--- a/") || text.contains("\n--- /dev/null"),
                "{name}"
            );
            assert!(text.contains("+++ b/"), "{name}");
            assert!(
                text.contains("VOIDBOX_"),
                "{name} is not guarded by a CONFIG_VOIDBOX_* option"
            );
        }
    }

    #[test]
    fn compat_options_exist_in_kconfig_patch() {
        let kconfig = PATCHES[0].1;
        for (sym, _) in crate::image::kconfig::parse_fragment("compat", COMPAT_CONFIG).unwrap() {
            if sym.starts_with("VOIDBOX_") {
                assert!(
                    kconfig.contains(&format!("config {sym}")),
                    "{sym} missing from 0001"
                );
            }
        }
    }
}
