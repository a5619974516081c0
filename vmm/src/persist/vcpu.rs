//! Snapshot state of one vCPU: CPUID, MP state, registers, FPU/extended state (XSAVE, XCRs),
//! debug registers, local APIC, MSRs and pending events.
//!
//! Capture runs on the vCPU's own thread while it is paused (outside KVM_RUN, with any pending
//! I/O completed). Restore runs on a freshly created vCPU before its first KVM_RUN, in the
//! order that works on an interpreting KVM host (see `shared/notes/kvm-host.md`): MP state,
//! REGS, SREGS, XSAVE, XCRS, DEBUGREGS, LAPIC **before** MSRs (otherwise KVM drops the
//! TSC-deadline write and a sleeping guest never wakes), MSRs (TSC before TSC_DEADLINE), and
//! vCPU events last. The FPU comes from XSAVE, never KVM_SET_FPU.

use std::collections::BTreeSet;

use kvm_bindings::{
    kvm_cpuid_entry2, kvm_debugregs, kvm_lapic_state, kvm_mp_state, kvm_msr_entry, kvm_regs,
    kvm_sregs, kvm_vcpu_events, kvm_xcrs, kvm_xsave, CpuId, Msrs, KVM_MAX_CPUID_ENTRIES,
    KVM_MAX_MSR_ENTRIES,
};
use kvm_ioctls::{Cap, Kvm, VcpuFd};
use serde::{Deserialize, Serialize};

use super::raw::Raw;
use super::PersistError;

/// `MSR_IA32_TSC`.
pub const MSR_IA32_TSC: u32 = 0x10;
/// `MSR_IA32_APICBASE`.
pub const MSR_IA32_APICBASE: u32 = 0x1b;
/// `MSR_IA32_CR_PAT`.
pub const MSR_IA32_CR_PAT: u32 = 0x277;
/// `MSR_IA32_TSC_DEADLINE`.
pub const MSR_IA32_TSC_DEADLINE: u32 = 0x6e0;
/// `MSR_EFER`.
pub const MSR_EFER: u32 = 0xc000_0080;
/// Most MSRs a snapshot may carry per vCPU (KVM's save list is ≈100–200).
pub const MAX_MSRS: usize = 1024;
/// Most XCRs KVM knows (`KVM_MAX_XCRS`).
pub const MAX_XCRS: u32 = 16;
/// Highest `KVM_MP_STATE_*` value.
pub const MAX_MP_STATE: u32 = 10;
/// Size of the (non-extended) `kvm_xsave` area, the only one this VMM saves.
pub const XSAVE_SIZE: usize = std::mem::size_of::<kvm_xsave>();
/// MSRs per KVM_GET/SET_MSRS call (the `Msrs` wrapper's limit).
const MSR_BATCH: usize = KVM_MAX_MSR_ENTRIES;
const NAME: &str = "vcpu";

/// Host facts snapshot capture and restore depend on, probed before seccomp.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VcpuCaps {
    /// MSRs to save, in restore order (see [`order_msrs`]).
    pub msr_indices: Vec<u32>,
    /// KVM_CAP_XCRS.
    pub xcrs: bool,
}

impl VcpuCaps {
    /// Probes `kvm`: the MSR index list (plus APIC base, PAT and EFER), XCRS support, and that
    /// the XSAVE state fits the 4 KiB `kvm_xsave` (true unless the VMM enabled AMX).
    pub fn probe(kvm: &Kvm) -> Result<Self, String> {
        if !kvm.check_extension(Cap::Xsave) {
            return Err("KVM lacks KVM_CAP_XSAVE".into());
        }
        let xsave2 = kvm.check_extension_int(Cap::Xsave2);
        if usize::try_from(xsave2).unwrap_or(0) > XSAVE_SIZE {
            return Err(format!(
                "XSAVE state is {xsave2} bytes; only {XSAVE_SIZE} are supported"
            ));
        }
        let list = kvm
            .get_msr_index_list()
            .map_err(|e| format!("KVM_GET_MSR_INDEX_LIST: {e}"))?;
        let mut msr_indices: Vec<u32> = list.as_slice().to_vec();
        for extra in [MSR_IA32_APICBASE, MSR_IA32_CR_PAT, MSR_EFER] {
            if !msr_indices.contains(&extra) {
                msr_indices.push(extra);
            }
        }
        let mut seen = BTreeSet::new();
        msr_indices.retain(|i| seen.insert(*i));
        msr_indices.truncate(MAX_MSRS);
        order_msrs(&mut msr_indices);
        Ok(Self {
            msr_indices,
            xcrs: kvm.check_extension(Cap::Xcrs),
        })
    }
}

/// Puts MSR indices in restore order: TSC first, TSC_DEADLINE last (a deadline is relative
/// to the TSC), the rest in their original order.
pub fn order_msrs(indices: &mut [u32]) {
    indices.sort_by_key(|&i| match i {
        MSR_IA32_TSC => 0,
        MSR_IA32_TSC_DEADLINE => 2,
        _ => 1,
    });
}

/// Why capturing or restoring vCPU state failed.
#[derive(Debug, thiserror::Error)]
pub enum VcpuStateError {
    /// A KVM ioctl failed.
    #[error("vCPU {vcpu}: {what} failed: {source}")]
    Ioctl {
        /// vCPU index.
        vcpu: u32,
        /// The ioctl.
        what: &'static str,
        /// The error.
        source: kvm_ioctls::Error,
    },
    /// KVM_SET_MSRS stopped early.
    #[error("vCPU {vcpu}: KVM_SET_MSRS accepted {set} of {total} MSRs (refused MSR {index:#x})")]
    MsrsPartial {
        /// vCPU index.
        vcpu: u32,
        /// Accepted entries.
        set: usize,
        /// Entries given.
        total: usize,
        /// The first refused MSR.
        index: u32,
    },
    /// The state is not usable (bounds, sizes).
    #[error(transparent)]
    Invalid(#[from] PersistError),
}

/// Serializable state of one vCPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VcpuState {
    /// vCPU index (equals its position in the snapshot).
    pub id: u32,
    /// CPUID as set on the vCPU (KVM_GET_CPUID2).
    pub cpuid: Vec<Raw<kvm_cpuid_entry2>>,
    /// KVM_GET_MP_STATE.
    pub mp_state: Raw<kvm_mp_state>,
    /// General-purpose registers.
    pub regs: Raw<kvm_regs>,
    /// Segment, control and descriptor-table registers.
    pub sregs: Raw<kvm_sregs>,
    /// The 4 KiB `kvm_xsave` region (x87/SSE/AVX state; also the FPU state).
    pub xsave: Raw<[u32; 1024]>,
    /// Extended control registers (with KVM_CAP_XCRS).
    pub xcrs: Option<Raw<kvm_xcrs>>,
    /// Debug registers.
    pub debugregs: Raw<kvm_debugregs>,
    /// Local APIC registers.
    pub lapic: Raw<kvm_lapic_state>,
    /// `(index, value)` of every MSR KVM returned, in restore order.
    pub msrs: Vec<(u32, u64)>,
    /// Pending exceptions, interrupts, NMIs, SMM and interrupt shadow.
    pub events: Raw<kvm_vcpu_events>,
}

fn io(vcpu: u32, what: &'static str) -> impl Fn(kvm_ioctls::Error) -> VcpuStateError {
    move |source| VcpuStateError::Ioctl { vcpu, what, source }
}

/// Reads `indices` on `fd`, skipping MSRs KVM refuses: KVM_GET_MSRS stops at the first MSR it
/// cannot read and returns how many it read, so the refused one is dropped and the rest
/// retried.
pub fn read_msrs(
    fd: &VcpuFd,
    vcpu: u32,
    indices: &[u32],
) -> Result<Vec<(u32, u64)>, VcpuStateError> {
    let mut out = Vec::with_capacity(indices.len());
    for batch in indices.chunks(MSR_BATCH) {
        let mut rest = batch;
        while !rest.is_empty() {
            let entries: Vec<kvm_msr_entry> = rest
                .iter()
                .map(|&index| kvm_msr_entry {
                    index,
                    ..Default::default()
                })
                .collect();
            let mut msrs = Msrs::from_entries(&entries)
                .map_err(|e| PersistError::invalid(NAME, format!("MSR list: {e:?}")))?;
            let n = fd
                .get_msrs(&mut msrs)
                .map_err(io(vcpu, "KVM_GET_MSRS"))?
                .min(rest.len());
            out.extend(msrs.as_slice()[..n].iter().map(|e| (e.index, e.data)));
            if let Some(skipped) = rest.get(n) {
                log::debug!("vCPU {vcpu}: MSR {skipped:#x} is not readable; not saved");
            }
            rest = rest.get(n + 1..).unwrap_or(&[]);
        }
    }
    Ok(out)
}

impl VcpuState {
    /// Captures vCPU `id` (which must be outside KVM_RUN with no I/O pending). MP state is read
    /// first: KVM_GET_MP_STATE may deliver pending APIC events into the state read after it.
    pub fn capture(fd: &VcpuFd, id: u32, caps: &VcpuCaps) -> Result<Self, VcpuStateError> {
        let cpuid = fd
            .get_cpuid2(KVM_MAX_CPUID_ENTRIES)
            .map_err(io(id, "KVM_GET_CPUID2"))?;
        let mp_state = fd.get_mp_state().map_err(io(id, "KVM_GET_MP_STATE"))?;
        let regs = fd.get_regs().map_err(io(id, "KVM_GET_REGS"))?;
        let sregs = fd.get_sregs().map_err(io(id, "KVM_GET_SREGS"))?;
        let xsave = fd.get_xsave().map_err(io(id, "KVM_GET_XSAVE"))?;
        let xcrs = if caps.xcrs {
            Some(Raw(fd.get_xcrs().map_err(io(id, "KVM_GET_XCRS"))?))
        } else {
            None
        };
        let debugregs = fd.get_debug_regs().map_err(io(id, "KVM_GET_DEBUGREGS"))?;
        let lapic = fd.get_lapic().map_err(io(id, "KVM_GET_LAPIC"))?;
        let msrs = read_msrs(fd, id, &caps.msr_indices)?;
        let events = fd
            .get_vcpu_events()
            .map_err(io(id, "KVM_GET_VCPU_EVENTS"))?;
        Ok(Self {
            id,
            cpuid: cpuid.as_slice().iter().copied().map(Raw).collect(),
            mp_state: Raw(mp_state),
            regs: Raw(regs),
            sregs: Raw(sregs),
            xsave: Raw(xsave.region),
            xcrs,
            debugregs: Raw(debugregs),
            lapic: Raw(lapic),
            msrs,
            events: Raw(events),
        })
    }

    /// Checks the bounds of a state read from an untrusted snapshot (everything KVM does not
    /// check itself, plus what this host cannot restore).
    pub fn validate(&self, expected_id: u32, caps: &VcpuCaps) -> Result<(), PersistError> {
        let bad = |what: String| PersistError::invalid(NAME, format!("vCPU {expected_id}: {what}"));
        if self.id != expected_id {
            return Err(bad(format!("saved as vCPU {}", self.id)));
        }
        if self.cpuid.is_empty() || self.cpuid.len() > KVM_MAX_CPUID_ENTRIES {
            return Err(bad(format!("{} CPUID entries", self.cpuid.len())));
        }
        if self.mp_state.0.mp_state > MAX_MP_STATE {
            return Err(bad(format!("MP state {}", self.mp_state.0.mp_state)));
        }
        if self.msrs.len() > MAX_MSRS {
            return Err(bad(format!("{} MSRs (max {MAX_MSRS})", self.msrs.len())));
        }
        let mut seen = BTreeSet::new();
        if let Some((i, _)) = self.msrs.iter().find(|(i, _)| !seen.insert(*i)) {
            return Err(bad(format!("MSR {i:#x} saved twice")));
        }
        match &self.xcrs {
            Some(x) if x.0.nr_xcrs > MAX_XCRS => {
                return Err(bad(format!("{} XCRs", x.0.nr_xcrs)));
            }
            Some(_) if !caps.xcrs => {
                return Err(PersistError::mismatch(
                    NAME,
                    "snapshot has XCRs but this host lacks KVM_CAP_XCRS",
                ));
            }
            _ => {}
        }
        Ok(())
    }

    /// Sets the saved CPUID (right after the vCPU is created).
    pub fn restore_cpuid(&self, fd: &VcpuFd) -> Result<(), VcpuStateError> {
        let entries: Vec<kvm_cpuid_entry2> = self.cpuid.iter().map(|e| e.0).collect();
        let cpuid = CpuId::from_entries(&entries)
            .map_err(|e| PersistError::invalid(NAME, format!("CPUID: {e:?}")))?;
        fd.set_cpuid2(&cpuid).map_err(io(self.id, "KVM_SET_CPUID2"))
    }

    /// Restores everything but CPUID, in the order given in the module documentation.
    /// Call after the VM-level state (PIT, clock, irqchip) was restored.
    pub fn restore(&self, fd: &VcpuFd) -> Result<(), VcpuStateError> {
        let id = self.id;
        fd.set_mp_state(self.mp_state.0)
            .map_err(io(id, "KVM_SET_MP_STATE"))?;
        fd.set_regs(&self.regs.0).map_err(io(id, "KVM_SET_REGS"))?;
        fd.set_sregs(&self.sregs.0)
            .map_err(io(id, "KVM_SET_SREGS"))?;
        let xsave = kvm_xsave {
            region: self.xsave.0,
            ..Default::default()
        };
        // SAFETY: `xsave` is a complete 4 KiB kvm_xsave, and VcpuCaps::probe (run before any
        // restore) checked that KVM_CAP_XSAVE2 needs no more than that, so KVM reads only
        // this struct.
        unsafe { fd.set_xsave(&xsave) }.map_err(io(id, "KVM_SET_XSAVE"))?;
        if let Some(x) = &self.xcrs {
            fd.set_xcrs(&x.0).map_err(io(id, "KVM_SET_XCRS"))?;
        }
        fd.set_debug_regs(&self.debugregs.0)
            .map_err(io(id, "KVM_SET_DEBUGREGS"))?;
        fd.set_lapic(&self.lapic.0)
            .map_err(io(id, "KVM_SET_LAPIC"))?;
        self.restore_msrs(fd)?;
        fd.set_vcpu_events(&self.events.0)
            .map_err(io(id, "KVM_SET_VCPU_EVENTS"))?;
        Ok(())
    }

    fn restore_msrs(&self, fd: &VcpuFd) -> Result<(), VcpuStateError> {
        // Restore order does not trust the file's order.
        let mut order: Vec<u32> = self.msrs.iter().map(|(i, _)| *i).collect();
        order_msrs(&mut order);
        let by_index: std::collections::BTreeMap<u32, u64> = self.msrs.iter().copied().collect();
        let entries: Vec<kvm_msr_entry> = order
            .iter()
            .map(|&index| kvm_msr_entry {
                index,
                data: by_index.get(&index).copied().unwrap_or_default(),
                ..Default::default()
            })
            .collect();
        let mut done = 0;
        for batch in entries.chunks(MSR_BATCH) {
            let msrs = Msrs::from_entries(batch)
                .map_err(|e| PersistError::invalid(NAME, format!("MSR list: {e:?}")))?;
            let n = fd.set_msrs(&msrs).map_err(io(self.id, "KVM_SET_MSRS"))?;
            if n != batch.len() {
                return Err(VcpuStateError::MsrsPartial {
                    vcpu: self.id,
                    set: done + n,
                    total: entries.len(),
                    index: batch.get(n).map_or(0, |e| e.index),
                });
            }
            done += n;
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn caps() -> VcpuCaps {
        VcpuCaps {
            msr_indices: vec![MSR_IA32_TSC, MSR_EFER],
            xcrs: true,
        }
    }

    /// A plausible state without KVM.
    pub(crate) fn sample(id: u32) -> VcpuState {
        let entry = kvm_cpuid_entry2 {
            function: 1,
            eax: 0x00a6_0f12,
            ..Default::default()
        };
        VcpuState {
            id,
            cpuid: vec![Raw(entry); 3],
            mp_state: Raw(kvm_mp_state { mp_state: 0 }),
            regs: Raw(kvm_regs {
                rip: 0xffff_ffff_8100_0000 + u64::from(id),
                rflags: 2,
                ..Default::default()
            }),
            sregs: Raw(kvm_sregs::default()),
            xsave: Raw([0x1f80; 1024]),
            xcrs: Some(Raw(kvm_xcrs {
                nr_xcrs: 1,
                ..Default::default()
            })),
            debugregs: Raw(kvm_debugregs::default()),
            lapic: Raw(kvm_lapic_state::default()),
            msrs: vec![(MSR_IA32_TSC, 12345), (MSR_EFER, 0xd01)],
            events: Raw(kvm_vcpu_events::default()),
        }
    }

    #[test]
    fn round_trip_through_json() {
        let s = sample(1);
        let json = serde_json::to_vec(&s).unwrap();
        let back: VcpuState = serde_json::from_slice(&json).unwrap();
        assert_eq!(back, s);
        assert_eq!(back.regs.0.rip, 0xffff_ffff_8100_0001);
        assert_eq!(back.xsave.0[1023], 0x1f80);
        back.validate(1, &caps()).unwrap();
    }

    #[test]
    fn hostile_values_are_refused() {
        let c = caps();
        assert!(sample(0).validate(1, &c).is_err());
        let mut s = sample(0);
        s.cpuid.clear();
        assert!(s.validate(0, &c).is_err());
        let mut s = sample(0);
        s.cpuid = vec![s.cpuid[0]; KVM_MAX_CPUID_ENTRIES + 1];
        assert!(s.validate(0, &c).is_err());
        let mut s = sample(0);
        s.msrs = (0..=MAX_MSRS as u32).map(|i| (i, 0)).collect();
        assert!(s.validate(0, &c).is_err());
        let mut s = sample(0);
        s.msrs.push((MSR_IA32_TSC, 1));
        assert!(s.validate(0, &c).is_err());
        let mut s = sample(0);
        s.mp_state.0.mp_state = 99;
        assert!(s.validate(0, &c).is_err());
        let mut s = sample(0);
        if let Some(x) = s.xcrs.as_mut() {
            x.0.nr_xcrs = 17;
        }
        assert!(s.validate(0, &c).is_err());
        let no_xcrs = VcpuCaps {
            xcrs: false,
            ..caps()
        };
        assert!(matches!(
            sample(0).validate(0, &no_xcrs),
            Err(PersistError::Mismatch { .. })
        ));
    }

    #[test]
    fn unknown_fields_and_bad_sizes_are_refused() {
        let s = sample(0);
        let mut v: serde_json::Value = serde_json::to_value(&s).unwrap();
        v["extra"] = serde_json::json!(1);
        assert!(serde_json::from_value::<VcpuState>(v).is_err());
        let mut v: serde_json::Value = serde_json::to_value(&s).unwrap();
        v["lapic"] = serde_json::json!("00");
        assert!(serde_json::from_value::<VcpuState>(v).is_err());
        let mut v: serde_json::Value = serde_json::to_value(&s).unwrap();
        v["msrs"] = serde_json::json!([[16]]);
        assert!(serde_json::from_value::<VcpuState>(v).is_err());
    }

    #[test]
    fn msr_order_puts_tsc_first_and_deadline_last() {
        let mut v = vec![MSR_IA32_TSC_DEADLINE, 0x174, MSR_IA32_TSC, MSR_EFER, 0x175];
        order_msrs(&mut v);
        assert_eq!(
            v,
            [MSR_IA32_TSC, 0x174, MSR_EFER, 0x175, MSR_IA32_TSC_DEADLINE]
        );
    }
}
