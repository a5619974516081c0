//! The `kvm` check (`/dev/kvm` present, the KVM character device, read-write for this
//! user, API 12 with the capabilities the VMM needs) and the `kvm-speed` check (hardware
//! or a nested software KVM that interprets guest kernel code, from [`probe`]).

use std::fs::OpenOptions;
use std::io::ErrorKind;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use voidbox_vmm::probe::{self, HostKvm, ProbeError};

use super::{Check, HostProfile};
use crate::image::profile_for;

/// Name of the device check.
pub const DEVICE: &str = "kvm";
/// Name of the hardware-or-emulated check.
pub const SPEED: &str = "kvm-speed";
/// The device voidbox opens (there is no override: the VMM opens this path).
pub const KVM_DEVICE: &str = "/dev/kvm";

/// The udev rule that gives every user access to `/dev/kvm`; GitHub Actions runners and
/// other hosts with a root-only device node need it.
pub const UDEV_RULE_FIX: &str =
    "echo 'KERNEL==\"kvm\", GROUP=\"kvm\", MODE=\"0666\", OPTIONS+=\"static_node=kvm\"' \
     | sudo tee /etc/udev/rules.d/99-kvm.rules && sudo udevadm control --reload-rules \
     && sudo udevadm trigger --name-match=kvm";

/// CPU facts that decide how to get a missing `/dev/kvm`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CpuFacts {
    /// `GenuineIntel` → Intel, `AuthenticAMD` → AMD, else unknown.
    pub vendor: Vendor,
    /// The CPU advertises VMX or SVM.
    pub virt_flag: bool,
    /// The `hypervisor` flag: this machine is itself a VM.
    pub in_vm: bool,
    /// `/sys/module/kvm` exists.
    pub module_loaded: bool,
    /// This process runs in a container (`/.dockerenv` or `/run/.containerenv`).
    pub in_container: bool,
}

/// CPU vendor.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Vendor {
    /// Intel (VT-x, `kvm_intel`).
    Intel,
    /// AMD (AMD-V/SVM, `kvm_amd`).
    Amd,
    /// Anything else.
    #[default]
    Unknown,
}

impl Vendor {
    fn module(self) -> &'static str {
        match self {
            Vendor::Intel => "kvm_intel",
            Vendor::Amd => "kvm_amd",
            Vendor::Unknown => "kvm_intel (Intel) / kvm_amd (AMD)",
        }
    }

    fn firmware_feature(self) -> &'static str {
        match self {
            Vendor::Intel => "Intel VT-x",
            Vendor::Amd => "AMD-V (SVM)",
            Vendor::Unknown => "Intel VT-x / AMD-V (SVM)",
        }
    }
}

impl CpuFacts {
    /// Parses the first CPU of `/proc/cpuinfo`.
    pub fn parse(cpuinfo: &str) -> CpuFacts {
        let field = |name: &str| {
            cpuinfo.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == name).then(|| v.trim().to_string())
            })
        };
        let flags = field("flags").unwrap_or_default();
        let has = |f: &str| flags.split_whitespace().any(|x| x == f);
        CpuFacts {
            vendor: match field("vendor_id").as_deref() {
                Some("GenuineIntel") => Vendor::Intel,
                Some("AuthenticAMD") => Vendor::Amd,
                _ => Vendor::Unknown,
            },
            virt_flag: has("vmx") || has("svm"),
            in_vm: has("hypervisor"),
            module_loaded: false,
            in_container: false,
        }
    }

    /// This host's facts.
    pub fn read() -> CpuFacts {
        let mut f = CpuFacts::parse(&std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default());
        f.module_loaded = Path::new("/sys/module/kvm").exists();
        f.in_container =
            Path::new("/.dockerenv").exists() || Path::new("/run/.containerenv").exists();
        f
    }
}

/// How to get a `/dev/kvm` on a host that has none.
pub fn missing_fix(cpu: &CpuFacts) -> String {
    let module = cpu.vendor.module();
    if cpu.in_container {
        return format!(
            "this process runs in a container: pass the host's device in (`docker run --device /dev/kvm …`, \
             podman likewise); the host itself needs KVM (module {module})"
        );
    }
    match (cpu.virt_flag, cpu.module_loaded, cpu.in_vm) {
        (true, false, _) => format!("load KVM: `sudo modprobe {module}` (add it to /etc/modules to keep it)"),
        (true, true, _) => "the kvm module is loaded but the device node is missing: \
             `sudo udevadm trigger --name-match=kvm`, or `sudo mknod -m 660 /dev/kvm c 10 232 && sudo chgrp kvm /dev/kvm`"
            .to_string(),
        (false, _, true) => format!(
            "this machine is a VM without nested virtualization: enable it on its host (a KVM host: \
             module option `nested=1` of {module}; clouds: an instance type with nested \
             virtualization, or bare metal), then `sudo modprobe {module}` here"
        ),
        (false, _, false) => format!(
            "enable {} in the firmware (BIOS/UEFI) settings, reboot, then `sudo modprobe {module}`",
            cpu.vendor.firmware_feature()
        ),
    }
}

/// How to get read-write access to a `/dev/kvm` owned by group `group` (`None`: a group
/// without a name); `member` is whether the account is listed in that group in
/// `/etc/group` (so only this login session lacks it).
pub fn permission_fix(group: Option<&str>, member: bool) -> String {
    match group {
        Some(g) if g != "root" && member => format!(
            "your account is in group `{g}` but this login session is not: log out and back in \
             (or run `newgrp {g}`)"
        ),
        Some(g) if g != "root" => format!(
            "`sudo usermod -aG {g} $USER`, then log out and back in; or, for every user (CI runners \
             such as GitHub Actions need this), a udev rule: {UDEV_RULE_FIX}"
        ),
        _ => format!(
            "/dev/kvm is root-only here: add a udev rule giving group kvm access (CI runners such as \
             GitHub Actions need exactly this): {UDEV_RULE_FIX}; then, if it is not world-writable, \
             `sudo usermod -aG kvm $USER` and log in again"
        ),
    }
}

/// `(name, members)` of group `gid` in `/etc/group` text.
pub fn group_entry(etc_group: &str, gid: u32) -> Option<(String, Vec<String>)> {
    etc_group.lines().find_map(|l| {
        let mut f = l.split(':');
        let name = f.next()?;
        let _pw = f.next()?;
        let id: u32 = f.next()?.trim().parse().ok()?;
        let members = f.next().unwrap_or_default();
        (id == gid).then(|| {
            (
                name.to_string(),
                members
                    .split(',')
                    .map(str::trim)
                    .filter(|m| !m.is_empty())
                    .map(str::to_string)
                    .collect(),
            )
        })
    })
}

/// The user name of `uid` in `/etc/passwd` text.
pub fn user_name(etc_passwd: &str, uid: u32) -> Option<String> {
    etc_passwd.lines().find_map(|l| {
        let mut f = l.split(':');
        let name = f.next()?;
        let _pw = f.next()?;
        let id: u32 = f.next()?.trim().parse().ok()?;
        (id == uid).then(|| name.to_string())
    })
}

fn this_user() -> String {
    let uid = rustix::process::getuid().as_raw();
    std::fs::read_to_string("/etc/passwd")
        .ok()
        .and_then(|p| user_name(&p, uid))
        .or_else(|| std::env::var("USER").ok())
        .unwrap_or_else(|| format!("uid {uid}"))
}

/// What a non-device file is, for the finding.
fn kind_of(ft: std::fs::FileType) -> &'static str {
    if ft.is_dir() {
        "directory"
    } else if ft.is_file() {
        "regular file"
    } else if ft.is_symlink() {
        "symbolic link"
    } else if ft.is_block_device() {
        "block device"
    } else {
        "special file"
    }
}

/// Checks `/dev/kvm`; the flag says whether VMs can be created with it.
pub fn device_check() -> (Check, bool) {
    let path = Path::new(KVM_DEVICE);
    let fail = |detail: String, fix: String| (Check::fail(DEVICE, detail, fix), false);
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == ErrorKind::NotFound => {
            return fail(
                "/dev/kvm does not exist: no KVM on this host, so no VM can start".into(),
                missing_fix(&CpuFacts::read()),
            )
        }
        Err(e) => {
            return fail(
                format!("cannot stat /dev/kvm: {e}"),
                missing_fix(&CpuFacts::read()),
            )
        }
    };
    if !meta.file_type().is_char_device() {
        return fail(
            format!(
                "/dev/kvm is a {}, not the KVM character device (10:232)",
                kind_of(meta.file_type())
            ),
            format!(
                "something replaced the device node (a bind mount?): remove it, then {}",
                missing_fix(&CpuFacts::read())
            ),
        );
    }
    let user = this_user();
    match OpenOptions::new().read(true).write(true).open(path) {
        Ok(_) => {}
        Err(e) if e.kind() == ErrorKind::PermissionDenied => {
            let groups = std::fs::read_to_string("/etc/group").unwrap_or_default();
            let entry = group_entry(&groups, meta.gid());
            let name = entry.as_ref().map(|(n, _)| n.as_str());
            let member = entry.as_ref().is_some_and(|(_, m)| m.contains(&user));
            return fail(
                format!(
                    "no permission to open /dev/kvm read-write as {user} (group {}, mode {:o})",
                    name.map_or_else(|| meta.gid().to_string(), str::to_string),
                    meta.mode() & 0o7777
                ),
                permission_fix(name, member),
            );
        }
        Err(e) => {
            return fail(
                format!("cannot open /dev/kvm read-write: {e}"),
                missing_fix(&CpuFacts::read()),
            )
        }
    }
    match voidbox_vmm::vm::open_kvm() {
        Ok(kvm) => (
            Check::ok(
                DEVICE,
                format!(
                    "/dev/kvm: read-write for {user}, KVM API {}, the capabilities the VMM needs",
                    kvm.get_api_version()
                ),
            ),
            true,
        ),
        Err(e) => fail(
            format!("/dev/kvm opens but is not a usable KVM device: {e}"),
            format!(
                "the node is not KVM's (it must be character device 10:232) or this kernel's KVM is \
                 too old for voidbox (KVM API 12, in-kernel irqchip, PIT2, irqfd); {}",
                missing_fix(&CpuFacts::read())
            ),
        ),
    }
}

/// The `kvm-speed` check when `/dev/kvm` is unusable.
pub fn speed_skipped() -> Check {
    Check::warn(
        SPEED,
        "not probed: /dev/kvm is not usable (see the kvm check)",
        "fix the kvm check first",
    )
}

/// Runs the KVM probe (a few ms): hardware virtualization, or a nested software KVM that
/// interprets guest kernel code; with the image profile the host needs.
pub fn speed_check() -> (Check, HostProfile) {
    match probe::probe() {
        Ok(r) => (
            speed_finding(r.kind, r.cpl0_ns_per_insn),
            Some(profile_for(r.kind)),
        ),
        Err(e @ (ProbeError::Kvm { .. } | ProbeError::Memory(_))) => (
            Check::fail(
                SPEED,
                format!("KVM cannot run even a tiny probe guest: {e}"),
                "check `dmesg` for KVM errors; another hypervisor (VirtualBox, VMware) holding \
                 VT-x/AMD-V blocks KVM: stop it",
            ),
            None,
        ),
        Err(e) => (
            Check::warn(
                SPEED,
                format!("the KVM probe did not finish: {e}"),
                "run `voidbox image probe` to retry; `voidbox image build --profile compat` forces \
                 the profile for an emulating KVM",
            ),
            None,
        ),
    }
}

/// What the probe's verdict means for speed.
pub fn speed_finding(kind: HostKvm, ns_per_insn: f64) -> Check {
    match kind {
        HostKvm::Hardware => Check::ok(
            SPEED,
            format!(
                "hardware virtualization: guest kernel code ≈{ns_per_insn:.1} ns/instruction (image profile plain)"
            ),
        ),
        // Figures measured on such a host (nested kvm_pvm): /work/shared/notes/kvm-host.md.
        HostKvm::EmulatedKernelMode => Check::warn(
            SPEED,
            format!(
                "nested software KVM: guest kernel code is interpreted (≈{ns_per_insn:.0} ns/instruction): \
                 expect cold boots of 25–36 s and snapshot restores of ≈0.5 s per VM (image profile compat)"
            ),
            "voidbox works here, slowly: keep golden snapshots on (no `--no-snapshot`) so VMs restore \
             instead of booting; for hardware speed use bare metal or a VM with nested VMX/SVM",
        ),
    }
}
