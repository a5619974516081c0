//! Host KVM capability probe.
//!
//! Some hosts expose a `/dev/kvm` that is a nested, *software* KVM (for example
//! `kvm_pvm` in "native guest" mode): guest user mode runs natively but guest kernel
//! mode (CPL0) is interpreted by KVM's instruction emulator, which cannot execute
//! several instructions at all (`popcnt`, `xsave`, `int3`, …). A Linux guest needs a
//! patched kernel there (the image's `compat` profile).
//!
//! [`probe`] tells the two apart in a few milliseconds with a tiny real-mode guest
//! (real mode is CPL0):
//!
//! 1. a `dec ecx; jnz` loop of [`LOOP_ITERATIONS`] iterations, then `out 0x10` —
//!    timed, so callers can tell users how slow guest kernel code is;
//! 2. `popcnt ax, bx`, then `out 0x11`; `hlt`.
//!
//! On hardware virtualisation (VMX/SVM) the guest reaches `out 0x11`. On an emulating
//! host `popcnt` ends `KVM_RUN` with `KVM_EXIT_INTERNAL_ERROR` (suberror 1, emulation
//! failure). A CPU without `popcnt` raises #UD, whose real-mode handler reports on port
//! 0x12; the loop timing then decides.

use std::fmt;
use std::io;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use kvm_bindings::kvm_userspace_memory_region;
use kvm_ioctls::{Kvm, VcpuExit};

/// Iterations of the timed CPL0 loop (two instructions each).
pub const LOOP_ITERATIONS: u32 = 20_000;

/// A CPL0 instruction slower than this (ns) means kernel mode is interpreted.
/// Hardware runs the loop at < 1 ns per instruction; the emulator at ≈ 500 ns.
pub const EMULATED_NS_PER_INSN: f64 = 50.0;

/// How long the probe guest may run before the probe gives up.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

const KVM_INTERNAL_ERROR_EMULATION: u32 = 1;
const GUEST_MEM_SIZE: usize = 0x2000;
const CODE_ADDR: usize = 0x1000;
const UD_HANDLER_ADDR: usize = 0x0800;
const PORT_LOOP_DONE: u16 = 0x10;
const PORT_POPCNT_OK: u16 = 0x11;
const PORT_UD: u16 = 0x12;

/// The probe guest's code, loaded at [`CODE_ADDR`] and run in real mode.
const CODE: [u8; 20] = {
    let n = LOOP_ITERATIONS.to_le_bytes();
    [
        0x66, 0xb9, n[0], n[1], n[2], n[3], // mov ecx, LOOP_ITERATIONS
        0x66, 0x49, // L: dec ecx
        0x75, 0xfc, // jnz L
        0xe6, 0x10, // out 0x10, al        (loop done)
        0xf3, 0x0f, 0xb8, 0xc3, // popcnt ax, bx   (the emulator cannot run this)
        0xe6, 0x11, // out 0x11, al        (popcnt executed)
        0xf4, // hlt
        0xf4,
    ]
};

/// #UD handler (vector 6 of the real-mode IVT): `out 0x12, al; hlt`.
const UD_HANDLER: [u8; 3] = [0xe6, 0x12, 0xf4];

/// What kind of KVM this host has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HostKvm {
    /// Guest kernel code runs on VMX/SVM hardware virtualisation.
    Hardware,
    /// Guest kernel mode is interpreted by KVM's instruction emulator (a nested,
    /// software KVM); the guest kernel needs the compatibility profile.
    EmulatedKernelMode,
}

impl fmt::Display for HostKvm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HostKvm::Hardware => "hardware",
            HostKvm::EmulatedKernelMode => "emulated-kernel-mode",
        })
    }
}

/// The probe's findings.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeReport {
    /// The verdict.
    pub kind: HostKvm,
    /// Wall time of the CPL0 loop, from the first `KVM_RUN` to the loop-done exit
    /// (includes one vCPU entry and one PIO exit).
    pub loop_time: Duration,
    /// `loop_time` per loop instruction, in nanoseconds.
    pub cpl0_ns_per_insn: f64,
    /// The instruction bytes KVM reported on an emulation failure, if any.
    pub failed_insn: Option<Vec<u8>>,
    /// Whether the `popcnt` test ran to a conclusion (false: the CPU raised #UD and the
    /// verdict comes from the loop timing alone).
    pub popcnt_conclusive: bool,
}

/// Why the probe could not decide.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// `/dev/kvm` is missing or not accessible.
    #[error("KVM is not available (/dev/kvm: {0}); voidbox needs a Linux host with KVM and access to /dev/kvm")]
    Unavailable(#[source] io::Error),
    /// A KVM ioctl failed.
    #[error("KVM {op} failed: {source}")]
    Kvm {
        /// The operation.
        op: &'static str,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// Allocating guest memory failed.
    #[error("allocating probe guest memory: {0}")]
    Memory(#[source] io::Error),
    /// The probe guest did not finish in time.
    #[error("the KVM probe guest did not finish within {0:?}")]
    Timeout(Duration),
    /// The probe guest stopped in an unexpected way.
    #[error("unexpected exit from the KVM probe guest: {0}")]
    Unexpected(String),
}

fn kvm_err(op: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> ProbeError {
    move |e| ProbeError::Kvm {
        op,
        source: io::Error::from_raw_os_error(e.errno()),
    }
}

/// Anonymous, page-aligned guest memory, unmapped on drop.
struct GuestMem {
    ptr: *mut u8,
    len: usize,
}

impl GuestMem {
    fn new(len: usize) -> Result<Self, ProbeError> {
        // SAFETY: a fresh private anonymous mapping; no existing memory is affected.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(ProbeError::Memory(io::Error::last_os_error()));
        }
        Ok(GuestMem {
            ptr: ptr.cast(),
            len,
        })
    }

    fn write(&mut self, offset: usize, bytes: &[u8]) {
        assert!(
            offset + bytes.len() <= self.len,
            "probe image out of bounds"
        );
        // SAFETY: the range was checked to lie inside the mapping, which we own
        // exclusively (`&mut self`); source and destination cannot overlap.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr.add(offset), bytes.len()) };
    }
}

impl Drop for GuestMem {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly the mapping created in `new`; the VM that
        // used it has been dropped before (field/local drop order in `run_probe`).
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// Runs the probe guest; see the module docs. Takes a few ms on hardware, ≈ 30 ms on
/// an emulating host.
pub fn probe() -> Result<ProbeReport, ProbeError> {
    let kvm =
        Kvm::new().map_err(|e| ProbeError::Unavailable(io::Error::from_raw_os_error(e.errno())))?;
    let (tx, rx) = mpsc::channel();
    // KVM_RUN cannot be interrupted without signals; a guest that never exits only
    // costs a parked thread, and the caller gets a Timeout.
    std::thread::Builder::new()
        .name("kvm-probe".into())
        .spawn(move || {
            let _ = tx.send(run_probe(&kvm));
        })
        .map_err(|e| ProbeError::Unexpected(format!("spawning the probe thread: {e}")))?;
    match rx.recv_timeout(PROBE_TIMEOUT) {
        Ok(result) => result,
        Err(_) => Err(ProbeError::Timeout(PROBE_TIMEOUT)),
    }
}

fn run_probe(kvm: &Kvm) -> Result<ProbeReport, ProbeError> {
    let mut mem = GuestMem::new(GUEST_MEM_SIZE)?;
    // Real-mode IVT entry 6 (#UD) → 0000:UD_HANDLER_ADDR.
    let ivt6 = [
        (UD_HANDLER_ADDR & 0xff) as u8,
        (UD_HANDLER_ADDR >> 8) as u8,
        0,
        0,
    ];
    mem.write(6 * 4, &ivt6);
    mem.write(UD_HANDLER_ADDR, &UD_HANDLER);
    mem.write(CODE_ADDR, &CODE);

    let vm = kvm.create_vm().map_err(kvm_err("create VM"))?;
    // Needed by VMX hosts without unrestricted-guest support for real mode; harmless elsewhere.
    let _ = vm.set_tss_address(0xfffb_d000);
    let region = kvm_userspace_memory_region {
        slot: 0,
        guest_phys_addr: 0,
        memory_size: GUEST_MEM_SIZE as u64,
        userspace_addr: mem.ptr as u64,
        flags: 0,
    };
    // SAFETY: `mem` is a valid mapping of `GUEST_MEM_SIZE` bytes that outlives `vm`
    // (declared before it, so dropped after it).
    unsafe { vm.set_user_memory_region(region) }.map_err(kvm_err("set memory region"))?;
    let mut vcpu = vm.create_vcpu(0).map_err(kvm_err("create vCPU"))?;

    let mut sregs = vcpu.get_sregs().map_err(kvm_err("get sregs"))?;
    sregs.cs.base = 0;
    sregs.cs.selector = 0;
    vcpu.set_sregs(&sregs).map_err(kvm_err("set sregs"))?;
    let mut regs = vcpu.get_regs().map_err(kvm_err("get regs"))?;
    regs.rip = CODE_ADDR as u64;
    regs.rflags = 2;
    regs.rbx = 0xffff;
    vcpu.set_regs(&regs).map_err(kvm_err("set regs"))?;

    let start = Instant::now();
    let mut loop_time = None;
    for _ in 0..8 {
        let exit = vcpu.run();
        let elapsed = start.elapsed();
        let verdict = match exit {
            Ok(VcpuExit::IoOut(PORT_LOOP_DONE, _)) => {
                loop_time = Some(elapsed);
                continue;
            }
            Ok(VcpuExit::IoOut(PORT_POPCNT_OK, _)) => Some((HostKvm::Hardware, None, true)),
            Ok(VcpuExit::IoOut(PORT_UD, _)) => None,
            Ok(VcpuExit::InternalError) => {
                let run = vcpu.get_kvm_run();
                // SAFETY: after KVM_EXIT_INTERNAL_ERROR the kernel filled the `internal`
                // member of the exit union; `emulation_failure` shares its first fields
                // and only its plain-byte tail is read, bounds-checked by insn_size.
                let (suberror, insn) = unsafe {
                    let u = &run.__bindgen_anon_1;
                    let ef = &u.emulation_failure.__bindgen_anon_1.__bindgen_anon_1;
                    let n = usize::from(ef.insn_size);
                    let insn = (1..=ef.insn_bytes.len())
                        .contains(&n)
                        .then(|| ef.insn_bytes[..n].to_vec());
                    (u.internal.suberror, insn)
                };
                if suberror != KVM_INTERNAL_ERROR_EMULATION {
                    return Err(ProbeError::Unexpected(format!(
                        "KVM internal error, suberror {suberror}"
                    )));
                }
                Some((HostKvm::EmulatedKernelMode, insn, true))
            }
            Ok(other) => return Err(ProbeError::Unexpected(format!("{other:?}"))),
            Err(e) => return Err(kvm_err("run vCPU")(e)),
        };
        let loop_time = loop_time.unwrap_or(elapsed);
        let ns = loop_time.as_nanos() as f64 / (2.0 * f64::from(LOOP_ITERATIONS));
        let (kind, failed_insn, popcnt_conclusive) = verdict.unwrap_or_else(|| {
            let kind = if ns > EMULATED_NS_PER_INSN {
                HostKvm::EmulatedKernelMode
            } else {
                HostKvm::Hardware
            };
            (kind, None, false)
        });
        return Ok(ProbeReport {
            kind,
            loop_time,
            cpl0_ns_per_insn: ns,
            failed_insn,
            popcnt_conclusive,
        });
    }
    Err(ProbeError::Unexpected("too many exits".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_code_layout() {
        // jnz must land on `dec ecx` (offset 6): rel8 counted from the end of jnz.
        let jnz_end = 10i32;
        assert_eq!(jnz_end + i32::from(CODE[9] as i8), 6);
        assert_eq!(&CODE[12..16], &[0xf3, 0x0f, 0xb8, 0xc3]);
    }

    /// Runs the real probe where `/dev/kvm` exists (it takes milliseconds).
    #[test]
    fn probe_this_host() {
        match probe() {
            Ok(r) => {
                eprintln!("probe: {r:?}");
                assert!(r.cpl0_ns_per_insn > 0.0);
                if r.kind == HostKvm::EmulatedKernelMode && r.popcnt_conclusive {
                    assert!(r
                        .failed_insn
                        .is_none_or(|b| b.starts_with(&[0xf3, 0x0f, 0xb8])));
                }
            }
            Err(ProbeError::Unavailable(e)) => eprintln!("no KVM here, probe skipped: {e}"),
            Err(e) => panic!("probe failed: {e}"),
        }
    }
}
