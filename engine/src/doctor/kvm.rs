//! The `kvm` check (`/dev/kvm` present, the KVM character device, read-write for this
//! user, API 12 with the capabilities the VMM needs) and the `kvm-speed` check (hardware
//! or a nested software KVM that interprets guest kernel code, from [`probe`]).

use voidbox_vmm::probe::{self, HostKvm, ProbeError};

use super::{Check, HostProfile};
use crate::image::profile_for;
use crate::sandbox::kvm_access::this_user;
pub use crate::sandbox::kvm_access::{
    access, group_entry, missing_fix, permission_fix, user_name, AccessProblem, CpuFacts, Vendor,
    KVM_DEVICE, UDEV_RULE_FIX,
};

/// Name of the device check.
pub const DEVICE: &str = "kvm";
/// Name of the hardware-or-emulated check.
pub const SPEED: &str = "kvm-speed";

/// Checks `/dev/kvm`; the flag says whether VMs can be created with it.
pub fn device_check() -> (Check, bool) {
    if let Err(p) = access() {
        return (Check::fail(DEVICE, p.detail, p.fix), false);
    }
    let user = this_user();
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
        Err(e) => (
            Check::fail(
                DEVICE,
                format!("/dev/kvm opens but is not a usable KVM device: {e}"),
                format!(
                    "the node is not KVM's (it must be character device 10:232) or this kernel's KVM is \
                     too old for voidbox (KVM API 12, in-kernel irqchip, PIT2, irqfd); {}",
                    missing_fix(&CpuFacts::read())
                ),
            ),
            false,
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
