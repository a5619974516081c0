//! Outcomes of a VM run and the process exit codes they map to (documented in `vmm/README.md`).

use serde::Serialize;

/// Process exit status of `voidbox-vmm`. Each outcome has its own code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[repr(i32)]
pub enum ExitCode {
    /// The guest reset itself (`reboot`, `reboot=k` → port 0x64 ← 0xFE) or halted cleanly,
    /// or the VMM was asked to stop.
    Clean = 0,
    /// Internal VMM error after setup (a bug or an unexpected host failure).
    Internal = 1,
    /// The configuration was missing or invalid.
    Config = 2,
    /// `/dev/kvm` is missing, not accessible, or lacks a required capability.
    KvmUnavailable = 3,
    /// Building the VM failed (kernel/initramfs unreadable or invalid, memory, devices).
    Setup = 4,
    /// The snapshot to restore was refused (unreadable, corrupt, taken of a different
    /// configuration, or its state rejected by a device or KVM). No vCPU ran.
    Snapshot = 5,
    /// The guest kernel panicked ("Kernel panic" on the console).
    KernelPanic = 10,
    /// The guest triple-faulted (KVM_EXIT_SHUTDOWN) without a preceding panic.
    TripleFault = 11,
    /// KVM could not emulate a guest instruction (KVM_EXIT_INTERNAL_ERROR).
    EmulationFailure = 12,
    /// KVM refused to enter the guest (KVM_EXIT_FAIL_ENTRY) or another unexpected exit.
    FailEntry = 13,
    /// No guest vsock listener answered within `boot_timeout_ms`.
    BootTimeout = 14,
    /// The VM ran longer than `wall_limit_ms`.
    WallLimit = 15,
}

impl ExitCode {
    /// The numeric process exit status.
    pub fn code(self) -> i32 {
        self as i32
    }
}

/// Why the VM stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Guest wrote 0xFE to port 0x64 (keyboard-controller reset).
    GuestReset,
    /// A vCPU exited with HLT (only without an in-kernel irqchip).
    GuestHalted,
    /// The console showed a kernel panic.
    KernelPanic,
    /// KVM_EXIT_SHUTDOWN.
    TripleFault {
        /// vCPU index.
        vcpu: u8,
        /// Guest RIP at the time, when it could be read.
        rip: Option<u64>,
    },
    /// KVM_EXIT_INTERNAL_ERROR.
    EmulationFailure {
        /// vCPU index.
        vcpu: u8,
        /// KVM suberror (1 = emulation failure).
        suberror: u32,
        /// Instruction bytes reported by KVM (may be empty).
        insn: Vec<u8>,
        /// Guest RIP, when it could be read.
        rip: Option<u64>,
    },
    /// KVM_EXIT_FAIL_ENTRY.
    FailEntry {
        /// vCPU index.
        vcpu: u8,
        /// Hardware entry failure reason.
        reason: u64,
    },
    /// Any other exit reason we do not handle.
    UnexpectedExit {
        /// vCPU index.
        vcpu: u8,
        /// Description of the exit.
        what: String,
    },
    /// No guest listener answered in time.
    BootTimeout,
    /// Wall-clock limit reached.
    WallLimit,
    /// The VMM failed internally (e.g. KVM_RUN returned an unexpected error).
    Internal(String),
    /// Stopped on request (SIGTERM/SIGINT).
    Stopped,
}

impl Outcome {
    /// Short machine-readable reason, used in the `exited` status event.
    pub fn reason(&self) -> &'static str {
        match self {
            Outcome::GuestReset => "guest_reset",
            Outcome::GuestHalted => "guest_halted",
            Outcome::KernelPanic => "kernel_panic",
            Outcome::TripleFault { .. } => "triple_fault",
            Outcome::EmulationFailure { .. } => "emulation_failure",
            Outcome::FailEntry { .. } => "fail_entry",
            Outcome::UnexpectedExit { .. } => "unexpected_exit",
            Outcome::BootTimeout => "boot_timeout",
            Outcome::WallLimit => "wall_limit",
            Outcome::Internal(_) => "internal_error",
            Outcome::Stopped => "stopped",
        }
    }

    /// The process exit code for this outcome.
    pub fn exit_code(&self) -> ExitCode {
        match self {
            Outcome::GuestReset | Outcome::GuestHalted | Outcome::Stopped => ExitCode::Clean,
            Outcome::KernelPanic => ExitCode::KernelPanic,
            Outcome::TripleFault { .. } => ExitCode::TripleFault,
            Outcome::EmulationFailure { .. } => ExitCode::EmulationFailure,
            Outcome::FailEntry { .. } | Outcome::UnexpectedExit { .. } => ExitCode::FailEntry,
            Outcome::BootTimeout => ExitCode::BootTimeout,
            Outcome::WallLimit => ExitCode::WallLimit,
            Outcome::Internal(_) => ExitCode::Internal,
        }
    }

    /// Human-readable detail (instruction bytes, RIP, …).
    pub fn detail(&self) -> Option<String> {
        match self {
            Outcome::TripleFault { vcpu, rip } => Some(format!(
                "vcpu {vcpu} triple fault at rip {}",
                fmt_rip(*rip)
            )),
            Outcome::EmulationFailure {
                vcpu,
                suberror,
                insn,
                rip,
            } => Some(format!(
                "vcpu {vcpu}: KVM internal error suberror {suberror} at rip {}, instruction bytes [{}]{}",
                fmt_rip(*rip),
                insn.iter()
                    .map(|b| format!("{b:02x}"))
                    .collect::<Vec<_>>()
                    .join(" "),
                decode_hint(insn).map(|h| format!(" ({h})")).unwrap_or_default()
            )),
            Outcome::FailEntry { vcpu, reason } => Some(format!(
                "vcpu {vcpu}: KVM_EXIT_FAIL_ENTRY, hardware reason {reason:#x}"
            )),
            Outcome::UnexpectedExit { vcpu, what } => Some(format!("vcpu {vcpu}: {what}")),
            Outcome::Internal(m) => Some(m.clone()),
            _ => None,
        }
    }
}

fn fmt_rip(rip: Option<u64>) -> String {
    rip.map(|r| format!("{r:#x}")).unwrap_or_else(|| "?".into())
}

/// Names the instructions the notes list as not emulated by an interpreting KVM.
pub fn decode_hint(insn: &[u8]) -> Option<&'static str> {
    // Skip legacy/REX prefixes.
    let mut i = 0;
    while i < insn.len()
        && matches!(
            insn[i],
            0x66 | 0xf2 | 0xf3 | 0xf0 | 0x2e | 0x3e | 0x26 | 0x36 | 0x64 | 0x65
        )
    {
        i += 1;
    }
    let rex_w = insn
        .get(i)
        .is_some_and(|b| (0x40..=0x4f).contains(b) && b & 8 != 0);
    if insn.get(i).is_some_and(|b| (0x40..=0x4f).contains(b)) {
        i += 1;
    }
    let op = insn.get(i..).unwrap_or(&[]);
    match op {
        [0xcc, ..] => Some("int3"),
        [0xcd, ..] => Some("int n"),
        [0x9b, ..] => Some("fwait"),
        [0x0f, 0x01, 0xd0, ..] => Some("xgetbv"),
        [0x0f, 0x01, 0xc1, ..] => Some("vmcall"),
        [0x0f, 0x01, 0xd9, ..] => Some("vmmcall"),
        [0x0f, 0x01, 0xca, ..] => Some("clac"),
        [0x0f, 0x01, 0xcb, ..] => Some("stac"),
        [0x0f, 0x01, 0xf9, ..] => Some("rdtscp"),
        [0x0f, 0x05, ..] => Some("syscall"),
        [0x0f, 0xb8, ..] => Some("popcnt"),
        [0x0f, 0xc7, m, ..] if (m >> 3) & 7 == 1 && rex_w => Some("cmpxchg16b"),
        [0x0f, 0xae, m, ..] if (m >> 3) & 7 == 4 && *m < 0xc0 => Some("xsave"),
        [0x0f, 0xae, m, ..] if (m >> 3) & 7 == 5 && *m < 0xc0 => Some("xrstor"),
        [0x0f, 0xae, m, ..] if (m >> 3) & 7 == 2 && *m < 0xc0 => Some("ldmxcsr"),
        [0x0f, 0x00, m, ..] if (m >> 3) & 7 == 5 => Some("verw"),
        [0x0f, 0x77, ..] => Some("emms"),
        [0x0f, 0x38, 0xf0 | 0xf1, ..] => Some("crc32/movbe"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_distinct() {
        let all = [
            ExitCode::Clean,
            ExitCode::Internal,
            ExitCode::Config,
            ExitCode::KvmUnavailable,
            ExitCode::Setup,
            ExitCode::Snapshot,
            ExitCode::KernelPanic,
            ExitCode::TripleFault,
            ExitCode::EmulationFailure,
            ExitCode::FailEntry,
            ExitCode::BootTimeout,
            ExitCode::WallLimit,
        ];
        let mut codes: Vec<i32> = all.iter().map(|c| c.code()).collect();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), all.len());
        assert_eq!(ExitCode::KvmUnavailable.code(), 3);
        assert_eq!(ExitCode::Snapshot.code(), 5);
    }

    #[test]
    fn decode_known_instructions() {
        assert_eq!(decode_hint(&[0xcc]), Some("int3"));
        assert_eq!(decode_hint(&[0xf3, 0x0f, 0xb8, 0xc0]), Some("popcnt"));
        assert_eq!(
            decode_hint(&[0xf0, 0x48, 0x0f, 0xc7, 0x0e]),
            Some("cmpxchg16b")
        );
        assert_eq!(decode_hint(&[0x0f, 0xae, 0x27]), Some("xsave"));
        assert_eq!(decode_hint(&[0x0f, 0x01, 0xd0]), Some("xgetbv"));
        assert_eq!(decode_hint(&[0x90]), None);
        assert_eq!(decode_hint(&[]), None);
    }

    #[test]
    fn outcome_detail_includes_bytes() {
        let o = Outcome::EmulationFailure {
            vcpu: 0,
            suberror: 1,
            insn: vec![0x0f, 0x01, 0xd0],
            rip: Some(0xffff_ffff_8100_0000),
        };
        let d = o.detail().unwrap();
        assert!(d.contains("0f 01 d0"), "{d}");
        assert!(d.contains("xgetbv"), "{d}");
        assert_eq!(o.exit_code(), ExitCode::EmulationFailure);
        assert_eq!(o.reason(), "emulation_failure");
    }
}

/// Events the VM's threads report to the VMM's main thread.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VmEvent {
    /// The VM stopped (first outcome wins).
    Stopped(Outcome),
    /// A guest vsock listener accepted the first host connection.
    GuestReady,
    /// "Kernel panic" appeared on the console; a reset is expected next (`panic=-1`).
    PanicSeen,
    /// A virtio device was marked broken (device name, reason).
    DeviceBroken(String, String),
    /// A command arrived on the control channel.
    Control(crate::control::ControlCommand),
    /// A control line was malformed or unknown (why).
    ControlRejected(String),
}
