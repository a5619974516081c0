//! Paravirtual switching of the guest's extended (AVX, AVX-512) register state.
//!
//! On a host whose KVM interprets guest kernel code (see `../shared/notes/kvm-host.md`), the
//! compat guest kernel must run with `noxsave` — the emulator cannot execute XSAVE/XRSTOR —
//! so it saves and restores only the FXSAVE state (x87, XMM0-15) when it switches tasks. But
//! guest *user* code runs natively under the host's XCR0, with AVX and AVX-512 usable, and
//! such a host neither loads the vCPU's XCR0 nor lets the guest trap CPUID. Without help the
//! upper YMM halves, XMM/YMM16-31 and the opmask registers therefore leak from one guest
//! process into the next, and a process preempted between a vector load and its store
//! writes another process's bytes: the random SIGSEGVs of issue #10.
//!
//! The compat kernel (guest-agent/image/patches/0007) asks the VMM to do what it cannot: on
//! every FXSAVE of a task's state it writes [`OP_SAVE`] to [`XSTATE_PORT`] with RSI holding the
//! guest-physical address of that task's 4 KiB XSAVE-layout buffer, and on every FXRSTOR
//! [`OP_LOAD`]. The VMM answers with `KVM_GET_XSAVE` / `KVM_SET_XSAVE`, moving only the XSAVE
//! header and the extended components (bytes 512..4096); the legacy area stays the kernel's.
//!
//! Everything here comes from the guest and is untrusted: the address is bounds-checked
//! against guest memory, the buffer's header is sanitised (only components this vCPU's
//! state already knows are taken, the compaction and reserved fields are zeroed), and a
//! state KVM refuses only fails that one request — the guest can only ever change its own
//! registers.

use kvm_ioctls::VcpuFd;
use vm_memory::{Bytes, GuestAddress};
use zerocopy::{FromBytes, IntoBytes};

use crate::memory::GuestMem;
use crate::persist::vcpu::VcpuCaps;

/// The I/O port of the paravirtual extended-state requests ("voidbox" 0x510).
pub const XSTATE_PORT: u16 = 0x510;
/// Save the extended state of the running task into the buffer at RSI.
pub const OP_SAVE: u8 = 1;
/// Load the extended state from the buffer at RSI.
pub const OP_LOAD: u8 = 2;

/// Size of the XSAVE area exchanged (the `kvm_xsave` region).
pub const AREA: usize = 4096;
/// Start of the XSAVE header: everything before it is the FXSAVE legacy area.
const HEADER: usize = 512;
/// Start of the extended components.
const EXTENDED: usize = 576;
/// XSTATE_BV bits of the legacy components (x87, SSE), which the kernel handles itself.
const LEGACY_BITS: u64 = 0x3;
/// XSTATE_BV bits of the components moved here: YMM_Hi128 (2), opmask (5), ZMM_Hi256 (6)
/// and Hi16_ZMM (7) — the user-mode vector state of AVX and AVX-512. A hostile header's
/// other bits are dropped.
const EXTENDED_BITS: u64 = 0xe4;

/// Why a request was not served (reported once, then the request is ignored).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum XstateError {
    /// Not [`OP_SAVE`] or [`OP_LOAD`].
    #[error("unknown extended-state request {0}")]
    UnknownOp(u8),
    /// The buffer is not inside guest memory.
    #[error("extended-state buffer at {0:#x} is outside guest memory")]
    BadAddress(u64),
    /// A KVM ioctl failed.
    #[error("{0}")]
    Kvm(String),
}

fn xstate_bv(area: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&area[HEADER..HEADER + 8]);
    u64::from_le_bytes(b)
}

/// The state to load: `current`'s legacy area and legacy XSTATE_BV bits, the extended
/// components `saved` holds (only [`EXTENDED_BITS`]), and a clean header (standard format,
/// reserved bytes zero). A component whose bit is clear in `saved` is loaded in its initial
/// state.
pub fn merge(current: &[u8; AREA], saved: &[u8; AREA]) -> [u8; AREA] {
    let mut out = *current;
    let bv = (xstate_bv(current) & LEGACY_BITS) | (xstate_bv(saved) & EXTENDED_BITS);
    out[HEADER..EXTENDED].fill(0);
    out[HEADER..HEADER + 8].copy_from_slice(&bv.to_le_bytes());
    out[EXTENDED..].copy_from_slice(&saved[EXTENDED..]);
    out
}

/// Serves one request: `op` from the port write, `gpa` from the vCPU's RSI.
///
/// `_caps` is the proof that [`VcpuCaps::probe`] ran: the vCPU's XSAVE state fits the 4 KiB
/// `kvm_xsave`.
pub fn handle(
    fd: &VcpuFd,
    _caps: &VcpuCaps,
    mem: &GuestMem,
    op: u8,
    gpa: u64,
) -> Result<(), XstateError> {
    if op != OP_SAVE && op != OP_LOAD {
        return Err(XstateError::UnknownOp(op));
    }
    // The buffer's header and extended part; vm-memory refuses a range outside guest RAM.
    let start = GuestAddress(
        gpa.checked_add(HEADER as u64)
            .ok_or(XstateError::BadAddress(gpa))?,
    );
    let mut x = fd
        .get_xsave()
        .map_err(|e| XstateError::Kvm(format!("KVM_GET_XSAVE: {e}")))?;
    // kvm-bindings derives zerocopy for the KVM structs (as crate::persist::raw relies on).
    let area: &mut [u8; AREA] = <[u8; AREA]>::mut_from_bytes(x.region.as_mut_bytes())
        .map_err(|_| XstateError::Kvm("kvm_xsave is not 4 KiB".into()))?;
    if op == OP_SAVE {
        return mem
            .write_slice(&area[HEADER..], start)
            .map_err(|_| XstateError::BadAddress(gpa));
    }
    let mut saved = [0u8; AREA];
    mem.read_slice(&mut saved[HEADER..], start)
        .map_err(|_| XstateError::BadAddress(gpa))?;
    *area = merge(area, &saved);
    // SAFETY: `x` is a complete 4 KiB kvm_xsave and VcpuCaps::probe checked that
    // KVM_CAP_XSAVE2 needs no more than that, so KVM reads only this struct.
    unsafe { fd.set_xsave(&x) }.map_err(|e| XstateError::Kvm(format!("KVM_SET_XSAVE: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn area(bv: u64, fill: u8) -> [u8; AREA] {
        let mut a = [fill; AREA];
        a[HEADER..EXTENDED].fill(0);
        a[HEADER..HEADER + 8].copy_from_slice(&bv.to_le_bytes());
        a
    }

    #[test]
    fn merge_keeps_the_legacy_area_and_takes_extended_components() {
        let current = area(0x3 | 0x4, 0xaa);
        let saved = area(0x1 | 0x4 | 0xe0, 0x55);
        let m = merge(&current, &saved);
        assert_eq!(
            &m[..HEADER],
            &current[..HEADER],
            "legacy area is the kernel's"
        );
        assert_eq!(xstate_bv(&m), 0x3 | 0x4 | 0xe0);
        assert!(m[EXTENDED..].iter().all(|&b| b == 0x55));
    }

    #[test]
    fn merge_sanitises_a_hostile_header() {
        let current = area(0x7, 0xaa);
        let mut saved = area(!0, 0x55);
        saved[HEADER + 8..EXTENDED].fill(0xff); // xcomp_bv and reserved bytes
        let m = merge(&current, &saved);
        assert_eq!(
            xstate_bv(&m),
            EXTENDED_BITS | 0x3,
            "only AVX/AVX-512 components taken"
        );
        assert!(
            m[HEADER + 8..EXTENDED].iter().all(|&b| b == 0),
            "compaction/reserved zeroed"
        );
    }

    #[test]
    fn a_never_saved_buffer_loads_initial_extended_state() {
        let current = area(0x7, 0xaa);
        let m = merge(&current, &[0u8; AREA]);
        assert_eq!(xstate_bv(&m), 0x3, "AVX state back to its initial value");
        assert!(m[EXTENDED..].iter().all(|&b| b == 0));
    }
}
