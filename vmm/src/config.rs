//! VMM configuration (JSON, read from a pipe or inherited fd) and kernel command-line building.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Largest guest memory we accept (64 GiB: 3 GiB below the 32-bit MMIO gap, the rest from
/// 4 GiB up); the spec schema's maximum.
pub const MAX_MEMORY_MB: u32 = 65536;
/// Smallest guest memory we accept; the spec schema's minimum.
pub const MIN_MEMORY_MB: u32 = 64;
/// Most vCPUs we accept (the spec schema's maximum; the MP table fits up to 37).
pub const MAX_VCPUS: u8 = 32;
/// x86 `COMMAND_LINE_SIZE`, including the terminating NUL.
pub const MAX_CMDLINE_LEN: usize = 2048;
/// Longest caller-supplied command-line suffix.
pub const MAX_CMDLINE_EXTRA_LEN: usize = 1024;
/// Longest [`VmConfig::image_hash`].
pub const MAX_IMAGE_HASH_LEN: usize = 256;
/// Most virtio-blk disks per VM (`/dev/vda` … `/dev/vdm`): the legacy IRQs 5..=23 hold
/// every virtio device, and the disks share them with net, vsock and the [`SHARE_SLOTS`]
/// share slots.
pub const MAX_DISKS: usize = 13;
/// virtio-9p share slots of every VM (tags `voidbox0` … `voidbox3`), present whether bound
/// or not, so that golden snapshots hold them ([`crate::devices::p9`]).
pub const SHARE_SLOTS: usize = 4;
/// Default guest uid/gid the VMM's own user appears as in a share (the guest's sandbox user).
pub const DEFAULT_SHARE_GUEST_ID: u32 = 1000;

const _: () = assert!(
    MAX_DISKS + 2 + SHARE_SLOTS
        <= (crate::memory::IRQ_MAX - crate::memory::VIRTIO_IRQ_BASE + 1) as usize,
    "every virtio device needs its own IRQ"
);

/// One file-backed virtio-blk disk. The guest sees the disks as `/dev/vda`, `/dev/vdb`, …
/// in the order of [`VmConfig::disks`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiskConfig {
    /// Backing file (a raw image; its size must be a multiple of 512 bytes).
    pub path: PathBuf,
    /// Offer the disk read-only (`VIRTIO_BLK_F_RO`) and open the file `O_RDONLY`.
    #[serde(default = "default_true")]
    pub read_only: bool,
}

fn default_true() -> bool {
    true
}

/// A host directory bound to a virtio-9p share slot (the guest mounts tag `voidbox<slot>`).
/// Served by the VMM as the VMM's user: what the guest creates belongs to that user.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShareConfig {
    /// The host directory (absolute; resolved when the VM is built).
    pub path: PathBuf,
    /// Refuse every modifying request (enforced by the VMM, whatever the guest mounts).
    #[serde(default = "default_true")]
    pub read_only: bool,
    /// The guest uid that files of the VMM's own uid appear as (the guest's command user).
    #[serde(default = "default_share_guest_id")]
    pub guest_uid: u32,
    /// The guest gid that files of the VMM's own gid appear as.
    #[serde(default = "default_share_guest_id")]
    pub guest_gid: u32,
}

fn default_share_guest_id() -> u32 {
    DEFAULT_SHARE_GUEST_ID
}

/// Flags every guest gets.
pub const BASE_CMDLINE: &str = "console=ttyS0 reboot=k panic=-1 pci=off";
/// Flags a guest kernel needs on a host whose KVM interprets guest kernel code
/// (see `shared/notes/kvm-host.md`); added when [`VmConfig::compat`] is set.
pub const COMPAT_CMDLINE: &str = "noxsave clearcpuid=popcnt,cx16,smap,rdtscp,clwb,erms,fsrm \
     mitigations=off rodata=off noreplace-smp quiet clocksource=kvm-clock";

/// Configuration of one micro-VM, as sent by the engine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmConfig {
    /// Guest kernel: an ELF `vmlinux` or a `bzImage`.
    pub kernel: PathBuf,
    /// Optional uncompressed (or kernel-decompressible) initramfs.
    #[serde(default)]
    pub initramfs: Option<PathBuf>,
    /// Appended to the generated kernel command line (e.g. `voidbox.secret=<hex>`).
    #[serde(default)]
    pub cmdline_extra: String,
    /// Guest memory in MiB ([`MIN_MEMORY_MB`]..=[`MAX_MEMORY_MB`]).
    #[serde(default = "default_memory_mb")]
    pub memory_mb: u32,
    /// Number of vCPUs (1..=[`MAX_VCPUS`]).
    #[serde(default = "default_vcpus")]
    pub vcpus: u8,
    /// Host Unix socket of the hybrid vsock device; `None` means no vsock device.
    #[serde(default)]
    pub vsock_uds: Option<PathBuf>,
    /// Guest CID of the vsock device.
    #[serde(default = "default_cid")]
    pub vsock_cid: u64,
    /// File receiving the guest's serial console output (created, mode 0600).
    pub console_log: PathBuf,
    /// Add the command-line flags needed on an interpreting (nested software) KVM host.
    #[serde(default)]
    pub compat: bool,
    /// Exit with [`crate::exit::ExitCode::BootTimeout`] when no guest vsock listener
    /// accepted a host connection within this many milliseconds.
    #[serde(default)]
    pub boot_timeout_ms: Option<u64>,
    /// Hard wall-clock limit for the whole VM lifetime in milliseconds.
    #[serde(default)]
    pub wall_limit_ms: Option<u64>,
    /// Test hook: issue a syscall outside the seccomp filter right after installing it.
    #[serde(default)]
    pub test_forbidden_syscall: bool,
    /// Identifies the guest image (kernel, initramfs, command line); recorded in a snapshot's
    /// key on save and required to match on restore.
    #[serde(default)]
    pub image_hash: String,
    /// Keep reading newline-delimited control commands (`{"snapshot":{"dir":…}}`) from the
    /// config fd after the config line. Also allows the file syscalls a snapshot needs after
    /// seccomp; the engine sets it only for golden-snapshot creator VMs, which never run user
    /// workloads.
    #[serde(default)]
    pub snapshot_control: bool,
    /// Restore from this snapshot directory instead of booting `kernel`/`initramfs` (which
    /// are then not read).
    #[serde(default)]
    pub restore: Option<PathBuf>,
    /// With `restore`: `restore` is a layered snapshot (a memory diff) over the full snapshot
    /// in this directory, whose memory file is mapped with the diff's pages over it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_base: Option<PathBuf>,
    /// What a restored guest gets on its restore page before it resumes: a new session
    /// secret, host entropy and its policy (see [`crate::restore_page`]). Required to restore
    /// a snapshot that reserves a restore page; only valid with `restore`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_grant: Option<voidbox_protocol::restore_page::RestoreGrant>,
    /// virtio-blk disks, in guest order (`/dev/vda` first). On restore they must match the
    /// snapshot's disks in number, size and mode.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disks: Vec<DiskConfig>,
    /// The virtio-net device and its user-mode NAT (policy, DNS upstreams, guest MAC);
    /// `None` means the VM has no network device at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<voidbox_net::NatConfig>,
    /// Host directories bound to the share slots, slot `i` = `shares[i]` (at most
    /// [`SHARE_SLOTS`]; the other slots stay unbound). Not part of a snapshot: a restored VM
    /// binds its own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shares: Vec<ShareConfig>,
    /// Announce the [`SHARE_SLOTS`] virtio-9p share slots. Required with `shares`; set
    /// without them for a VM whose snapshot will be restored with shares. Without it the
    /// guest gets no 9p devices to probe at boot. Part of the snapshot key (the device set).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub share_slots: bool,
}

fn default_memory_mb() -> u32 {
    256
}
fn default_vcpus() -> u8 {
    1
}
fn default_cid() -> u64 {
    3
}

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    /// Not valid JSON or not the expected shape.
    #[error("invalid config JSON: {0}")]
    Json(String),
    /// Memory size out of range.
    #[error("memory_mb must be within {MIN_MEMORY_MB}..={MAX_MEMORY_MB}, got {0}")]
    Memory(u32),
    /// vCPU count out of range.
    #[error("vcpus must be within 1..={MAX_VCPUS}, got {0}")]
    Vcpus(u8),
    /// Command-line suffix too long or containing forbidden characters.
    #[error("cmdline_extra is invalid: {0}")]
    CmdlineExtra(&'static str),
    /// The generated command line exceeds the kernel's limit.
    #[error("kernel command line is {0} bytes, limit {MAX_CMDLINE_LEN}")]
    CmdlineTooLong(usize),
    /// Reserved or invalid guest CID.
    #[error("vsock_cid {0} is reserved (must be >= 3 and < 2^32 - 1)")]
    Cid(u64),
    /// A path is empty.
    #[error("{0} must not be empty")]
    EmptyPath(&'static str),
    /// `image_hash` too long or not printable ASCII.
    #[error("image_hash must be at most {MAX_IMAGE_HASH_LEN} printable ASCII characters")]
    ImageHash,
    /// More than [`MAX_DISKS`] disks.
    #[error("at most {MAX_DISKS} disks per VM, got {0}")]
    TooManyDisks(usize),
    /// A disk's backing file cannot be a disk (not a regular file, or its size is not a
    /// non-empty multiple of 512 bytes); the message names the path.
    #[error("{0}")]
    Disk(String),
    /// More than [`SHARE_SLOTS`] shares, a relative share path, or a share that is not a
    /// directory (the message names the path).
    #[error("{0}")]
    Share(String),
    /// A restore grant without `restore`, or one that does not fit the restore page.
    #[error("restore_grant: {0}")]
    RestoreGrant(String),
    /// A restore base without `restore`.
    #[error("restore_base: only a restore (of a layered snapshot) takes a base")]
    RestoreBase,
}

impl VmConfig {
    /// Parses and validates a JSON document.
    pub fn from_json(text: &str) -> Result<Self, ConfigError> {
        let cfg: VmConfig =
            serde_json::from_str(text).map_err(|e| ConfigError::Json(e.to_string()))?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Checks ranges and the command-line suffix.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(MIN_MEMORY_MB..=MAX_MEMORY_MB).contains(&self.memory_mb) {
            return Err(ConfigError::Memory(self.memory_mb));
        }
        if self.vcpus == 0 || self.vcpus > MAX_VCPUS {
            return Err(ConfigError::Vcpus(self.vcpus));
        }
        if self.cmdline_extra.len() > MAX_CMDLINE_EXTRA_LEN {
            return Err(ConfigError::CmdlineExtra("too long"));
        }
        if !self
            .cmdline_extra
            .bytes()
            .all(|b| b == b' ' || b.is_ascii_graphic())
        {
            return Err(ConfigError::CmdlineExtra(
                "only printable ASCII and spaces are allowed",
            ));
        }
        if self.vsock_cid < 3 || self.vsock_cid >= u64::from(u32::MAX) {
            return Err(ConfigError::Cid(self.vsock_cid));
        }
        if self.kernel.as_os_str().is_empty() {
            return Err(ConfigError::EmptyPath("kernel"));
        }
        if self.console_log.as_os_str().is_empty() {
            return Err(ConfigError::EmptyPath("console_log"));
        }
        if self.image_hash.len() > MAX_IMAGE_HASH_LEN
            || !self.image_hash.bytes().all(|b| b.is_ascii_graphic())
        {
            return Err(ConfigError::ImageHash);
        }
        if self
            .restore
            .as_ref()
            .is_some_and(|p| p.as_os_str().is_empty())
        {
            return Err(ConfigError::EmptyPath("restore"));
        }
        match (&self.restore_base, &self.restore) {
            (Some(b), _) if b.as_os_str().is_empty() => {
                return Err(ConfigError::EmptyPath("restore_base"))
            }
            (Some(_), None) => return Err(ConfigError::RestoreBase),
            _ => {}
        }
        if let Some(g) = &self.restore_grant {
            if self.restore.is_none() {
                return Err(ConfigError::RestoreGrant(
                    "only a restore takes a restore grant".into(),
                ));
            }
            voidbox_protocol::restore_page::RestoreGrant::new(
                g.secret.clone(),
                g.entropy.clone(),
                g.policy.clone(),
            )
            .map_err(|e| ConfigError::RestoreGrant(e.to_string()))?;
        }
        if self.disks.len() > MAX_DISKS {
            return Err(ConfigError::TooManyDisks(self.disks.len()));
        }
        if self.disks.iter().any(|d| d.path.as_os_str().is_empty()) {
            return Err(ConfigError::EmptyPath("disks[].path"));
        }
        if !self.shares.is_empty() && !self.share_slots {
            return Err(ConfigError::Share(
                "shares need share_slots (the 9p devices they are bound to)".into(),
            ));
        }
        if self.shares.len() > SHARE_SLOTS {
            return Err(ConfigError::Share(format!(
                "at most {SHARE_SLOTS} shares per VM, got {}",
                self.shares.len()
            )));
        }
        if let Some(s) = self.shares.iter().find(|s| !s.path.is_absolute()) {
            return Err(ConfigError::Share(format!(
                "share path `{}` is not absolute",
                s.path.display()
            )));
        }
        Ok(())
    }
}

/// A virtio-mmio device as announced on the kernel command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MmioAnnouncement {
    /// Guest-physical base of the 4 KiB register window.
    pub base: u64,
    /// Legacy IRQ (GSI) number.
    pub irq: u32,
}

impl MmioAnnouncement {
    /// The `virtio_mmio.device=` parameter for this device.
    pub fn param(&self) -> String {
        format!("virtio_mmio.device=4K@{:#x}:{}", self.base, self.irq)
    }
}

/// Builds the guest kernel command line.
///
/// `tsc_khz` is used only with more than one vCPU (where TSC calibration against the PIT fails
/// because PV features are off).
pub fn build_cmdline(
    cfg: &VmConfig,
    tsc_khz: Option<u32>,
    devices: &[MmioAnnouncement],
) -> Result<String, ConfigError> {
    let mut parts: Vec<String> = vec![BASE_CMDLINE.to_string()];
    if cfg.compat {
        parts.push(COMPAT_CMDLINE.to_string());
    }
    if cfg.vcpus > 1 {
        parts.push("nopv tsc=reliable".to_string());
        if let Some(khz) = tsc_khz.filter(|k| *k > 0) {
            parts.push(format!("tsc_early_khz={khz}"));
        }
    }
    parts.extend(devices.iter().map(MmioAnnouncement::param));
    let extra = cfg.cmdline_extra.trim();
    if !extra.is_empty() {
        parts.push(extra.to_string());
    }
    let line = parts.join(" ");
    if line.len() + 1 > MAX_CMDLINE_LEN {
        return Err(ConfigError::CmdlineTooLong(line.len() + 1));
    }
    Ok(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> VmConfig {
        VmConfig::from_json(r#"{"kernel":"/k","console_log":"/tmp/c.log"}"#).unwrap()
    }

    #[test]
    fn defaults_and_validation() {
        let c = cfg();
        assert_eq!(c.memory_mb, 256);
        assert_eq!(c.vcpus, 1);
        assert_eq!(c.vsock_cid, 3);
        assert!(!c.compat);
        for (mb, ok) in [
            (32, false),
            (63, false),
            (64, true),
            (3072, true),
            (4096, true),
            (16384, true),
            (65536, true),
            (65537, false),
        ] {
            let j = format!(r#"{{"kernel":"/k","console_log":"/c","memory_mb":{mb}}}"#);
            let r = VmConfig::from_json(&j);
            if ok {
                assert_eq!(r.unwrap().memory_mb, mb);
            } else {
                assert_eq!(r, Err(ConfigError::Memory(mb)));
            }
        }
        let bad = r#"{"kernel":"/k","console_log":"/c","vcpus":0}"#;
        assert_eq!(VmConfig::from_json(bad), Err(ConfigError::Vcpus(0)));
        let bad = r#"{"kernel":"/k","console_log":"/c","vcpus":33}"#;
        assert_eq!(VmConfig::from_json(bad), Err(ConfigError::Vcpus(33)));
        let ok = r#"{"kernel":"/k","console_log":"/c","vcpus":32}"#;
        assert_eq!(VmConfig::from_json(ok).unwrap().vcpus, 32);
        let bad = r#"{"kernel":"/k","console_log":"/c","cmdline_extra":"a\nb"}"#;
        assert!(matches!(
            VmConfig::from_json(bad),
            Err(ConfigError::CmdlineExtra(_))
        ));
        let bad = r#"{"kernel":"/k","console_log":"/c","vsock_cid":2}"#;
        assert_eq!(VmConfig::from_json(bad), Err(ConfigError::Cid(2)));
        let bad = r#"{"kernel":"/k","console_log":"/c","bogus":1}"#;
        assert!(matches!(
            VmConfig::from_json(bad),
            Err(ConfigError::Json(_))
        ));
        assert!(matches!(
            VmConfig::from_json("not json"),
            Err(ConfigError::Json(_))
        ));
    }

    #[test]
    fn restore_grant_only_with_a_restore() {
        let secret = "ab".repeat(32);
        let entropy = "cd".repeat(64);
        let grant = format!(r#""restore_grant":{{"secret":"{secret}","entropy":"{entropy}"}}"#);
        let j = format!(r#"{{"kernel":"/k","console_log":"/c","restore":"/s",{grant}}}"#);
        let c = VmConfig::from_json(&j).unwrap();
        let g = c.restore_grant.as_ref().unwrap();
        assert_eq!(g.entropy.len(), 64);
        // Its Debug (what a log could show) has neither the secret nor the entropy.
        let dbg = format!("{c:?}");
        assert!(!dbg.contains(&secret) && !dbg.contains(&entropy), "{dbg}");
        let j = format!(r#"{{"kernel":"/k","console_log":"/c",{grant}}}"#);
        assert!(matches!(
            VmConfig::from_json(&j),
            Err(ConfigError::RestoreGrant(m)) if m.contains("only a restore")
        ));
        // Too little entropy, and a secret that is not 64 hex digits.
        for bad in [
            format!(r#""restore_grant":{{"secret":"{secret}","entropy":"cd"}}"#),
            format!(r#""restore_grant":{{"secret":"ab","entropy":"{entropy}"}}"#),
        ] {
            let j = format!(r#"{{"kernel":"/k","console_log":"/c","restore":"/s",{bad}}}"#);
            assert!(
                matches!(VmConfig::from_json(&j), Err(ConfigError::Json(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn snapshot_fields() {
        let c = cfg();
        assert_eq!(c.image_hash, "");
        assert!(!c.snapshot_control);
        assert_eq!(c.restore, None);
        let c = VmConfig::from_json(
            r#"{"kernel":"/k","console_log":"/c","image_hash":"abc123",
                "snapshot_control":true,"restore":"/snaps/x"}"#,
        )
        .unwrap();
        assert_eq!(c.image_hash, "abc123");
        assert!(c.snapshot_control);
        assert_eq!(c.restore.as_deref(), Some(std::path::Path::new("/snaps/x")));
        // Round trip through serde (the engine serializes the struct).
        let back = VmConfig::from_json(&serde_json::to_string(&c).unwrap()).unwrap();
        assert_eq!(back, c);
        let c = VmConfig::from_json(
            r#"{"kernel":"/k","console_log":"/c","restore":"/snaps/d","restore_base":"/snaps/b"}"#,
        )
        .unwrap();
        assert_eq!(
            c.restore_base.as_deref(),
            Some(std::path::Path::new("/snaps/b"))
        );
        let back = VmConfig::from_json(&serde_json::to_string(&c).unwrap()).unwrap();
        assert_eq!(back, c);
        assert!(matches!(
            VmConfig::from_json(r#"{"kernel":"/k","console_log":"/c","restore_base":"/b"}"#),
            Err(ConfigError::RestoreBase)
        ));
        for bad in [
            r#"{"kernel":"/k","console_log":"/c","restore":""}"#,
            r#"{"kernel":"/k","console_log":"/c","restore":"/s","restore_base":""}"#,
            r#"{"kernel":"/k","console_log":"/c","image_hash":"a b"}"#,
            r#"{"kernel":"/k","console_log":"/c","snapshot_control":"yes"}"#,
        ] {
            assert!(VmConfig::from_json(bad).is_err(), "{bad}");
        }
        let long = format!(
            r#"{{"kernel":"/k","console_log":"/c","image_hash":"{}"}}"#,
            "a".repeat(MAX_IMAGE_HASH_LEN + 1)
        );
        assert_eq!(VmConfig::from_json(&long), Err(ConfigError::ImageHash));
    }

    #[test]
    fn shares_default_read_only_and_are_bounded() {
        let c = VmConfig::from_json(
            r#"{"kernel":"/k","console_log":"/c","share_slots":true,"shares":[{"path":"/srv/a"},
                {"path":"/srv/b","read_only":false,"guest_uid":1234,"guest_gid":1235}]}"#,
        )
        .unwrap();
        assert!(c.shares[0].read_only);
        assert_eq!((c.shares[0].guest_uid, c.shares[0].guest_gid), (1000, 1000));
        assert!(!c.shares[1].read_only);
        assert_eq!((c.shares[1].guest_uid, c.shares[1].guest_gid), (1234, 1235));
        let back = VmConfig::from_json(&serde_json::to_string(&c).unwrap()).unwrap();
        assert_eq!(back, c);
        // No `shares` key at all when there are none (older VMMs read the config too).
        let plain = serde_json::to_string(&cfg()).unwrap();
        assert!(
            !plain.contains("shares") && !plain.contains("share_slots") && !plain.contains("grant"),
            "{plain}"
        );
        // Shares without their slots.
        assert!(matches!(
            VmConfig::from_json(r#"{"kernel":"/k","console_log":"/c","shares":[{"path":"/x"}]}"#),
            Err(ConfigError::Share(m)) if m.contains("share_slots")
        ));
        let five = format!(
            r#"{{"kernel":"/k","console_log":"/c","share_slots":true,"shares":[{}]}}"#,
            [r#"{"path":"/x"}"#; SHARE_SLOTS + 1].join(",")
        );
        assert!(matches!(
            VmConfig::from_json(&five),
            Err(ConfigError::Share(_))
        ));
        for bad in [
            r#"{"kernel":"/k","console_log":"/c","shares":[{"path":"rel"}]}"#,
            r#"{"kernel":"/k","console_log":"/c","shares":[{"path":""}]}"#,
            r#"{"kernel":"/k","console_log":"/c","shares":[{"path":"/x","mode":"rw"}]}"#,
        ] {
            assert!(VmConfig::from_json(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn cmdline_always_has_base_flags() {
        let line = build_cmdline(&cfg(), Some(2_000_000), &[]).unwrap();
        assert_eq!(line, BASE_CMDLINE);
    }

    #[test]
    fn cmdline_compat_smp_devices_extra() {
        let mut c = cfg();
        c.compat = true;
        c.vcpus = 2;
        c.cmdline_extra = " voidbox.secret=abcd ".into();
        let dev = [MmioAnnouncement {
            base: 0xd000_0000,
            irq: 5,
        }];
        let line = build_cmdline(&c, Some(2_993_000), &dev).unwrap();
        for flag in [
            "console=ttyS0",
            "reboot=k",
            "panic=-1",
            "pci=off",
            "noxsave",
            "clearcpuid=popcnt,cx16,smap,rdtscp,clwb,erms,fsrm",
            "mitigations=off",
            "rodata=off",
            "noreplace-smp",
            "quiet",
            "clocksource=kvm-clock",
            "nopv",
            "tsc=reliable",
            "tsc_early_khz=2993000",
            "virtio_mmio.device=4K@0xd0000000:5",
            "voidbox.secret=abcd",
        ] {
            assert!(
                line.split(' ').any(|p| p == flag),
                "{flag} missing in {line}"
            );
        }
        assert!(line.ends_with("voidbox.secret=abcd"));
    }

    #[test]
    fn cmdline_single_vcpu_has_no_smp_flags() {
        let line = build_cmdline(&cfg(), Some(1000), &[]).unwrap();
        assert!(!line.contains("nopv"));
        assert!(!line.contains("tsc_early_khz"));
    }

    #[test]
    fn cmdline_too_long_is_rejected() {
        let mut c = cfg();
        c.cmdline_extra = "x".repeat(1000);
        let devs: Vec<_> = (0..40)
            .map(|i| MmioAnnouncement {
                base: 0xd000_0000 + i * 0x1000,
                irq: 5 + i as u32,
            })
            .collect();
        assert!(matches!(
            build_cmdline(&c, None, &devs),
            Err(ConfigError::CmdlineTooLong(_))
        ));
    }
}
