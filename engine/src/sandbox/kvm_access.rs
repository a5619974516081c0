//! Access to `/dev/kvm`: whether this user can open it read-write and, when not, what was
//! found and the fix, from the device node's real type, owner group and mode. The one
//! source of that advice: `voidbox doctor`'s `kvm` check and every command that starts a
//! VM ([`super::check_kvm`]) give the same words.

use std::fs::OpenOptions;
use std::io::ErrorKind;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

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

/// This process's user name (`/etc/passwd`, else `$USER`, else the uid).
pub fn this_user() -> String {
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

/// Why `/dev/kvm` cannot be opened read-write by this user, and the fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessProblem {
    /// One line: what was found (with the device's real group and mode when it is there).
    pub detail: String,
    /// What to do about it.
    pub fix: String,
}

impl std::fmt::Display for AccessProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}\n  help: {}", self.detail, self.fix)
    }
}

/// Whether this user can open `/dev/kvm` read-write: the one source of the advice `doctor`,
/// `apply`, `run` and `shell` give, computed from the device node's real type, owner group
/// and mode (and whether the account is in that group).
pub fn access() -> Result<(), AccessProblem> {
    let path = Path::new(KVM_DEVICE);
    let problem = |detail: String, fix: String| Err(AccessProblem { detail, fix });
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == ErrorKind::NotFound => {
            return problem(
                "/dev/kvm does not exist: no KVM on this host, so no VM can start".into(),
                missing_fix(&CpuFacts::read()),
            )
        }
        Err(e) => {
            return problem(
                format!("cannot stat /dev/kvm: {e}"),
                missing_fix(&CpuFacts::read()),
            )
        }
    };
    if !meta.file_type().is_char_device() {
        return problem(
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
    match OpenOptions::new().read(true).write(true).open(path) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == ErrorKind::PermissionDenied => {
            let user = this_user();
            let groups = std::fs::read_to_string("/etc/group").unwrap_or_default();
            let entry = group_entry(&groups, meta.gid());
            let name = entry.as_ref().map(|(n, _)| n.as_str());
            let member = entry.as_ref().is_some_and(|(_, m)| m.contains(&user));
            problem(
                format!(
                    "no permission to open /dev/kvm read-write as {user} (group {}, mode {:o})",
                    name.map_or_else(|| meta.gid().to_string(), str::to_string),
                    meta.mode() & 0o7777
                ),
                permission_fix(name, member),
            )
        }
        Err(e) => problem(
            format!("cannot open /dev/kvm read-write: {e}"),
            missing_fix(&CpuFacts::read()),
        ),
    }
}
