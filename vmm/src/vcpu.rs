//! vCPU setup for 64-bit Linux entry (CPUID from [`crate::cpuid`], MSRs, registers, segments,
//! paging, FPU, LAPIC) and the run loop that dispatches exits and pauses for snapshots
//! ([`VcpuCommand`]).

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Barrier};

use kvm_bindings::{kvm_fpu, kvm_msr_entry, kvm_regs, kvm_run, CpuId, Msrs};
use kvm_ioctls::{VcpuExit, VcpuFd};
use vm_memory::GuestAddress;

use crate::boot::{gdt, BOOT_GDT_START, BOOT_IDT_START, BOOT_STACK_POINTER, ZERO_PAGE_START};
use crate::bus::Bus;
use crate::exit::{Outcome, VmEvent};
use crate::memory::GuestMem;
use crate::persist::vcpu::{VcpuCaps, VcpuState};
use crate::xstate;

/// Errors configuring a vCPU.
#[derive(Debug, thiserror::Error)]
pub enum VcpuError {
    /// A KVM vCPU ioctl failed.
    #[error("vCPU {0}: {1} failed: {2}")]
    Ioctl(u8, &'static str, kvm_ioctls::Error),
    /// Building the MSR list failed.
    #[error("vCPU {0}: cannot build MSR list")]
    Msrs(u8),
    /// The normalised CPUID table could not be built.
    #[error("vCPU {0}: CPUID: {1}")]
    Cpuid(u8, String),
    /// KVM accepted fewer MSRs than given.
    #[error("vCPU {0}: KVM set only {1} of {2} boot MSRs")]
    MsrsPartial(u8, usize, usize),
}

const X86_CR0_PE: u64 = 0x1;
const X86_CR0_PG: u64 = 0x8000_0000;
const X86_CR4_PAE: u64 = 0x20;
const EFER_LME: u64 = 0x100;
const EFER_LMA: u64 = 0x400;

const MSR_IA32_TSC: u32 = 0x10;
const MSR_IA32_SYSENTER_CS: u32 = 0x174;
const MSR_IA32_SYSENTER_ESP: u32 = 0x175;
const MSR_IA32_SYSENTER_EIP: u32 = 0x176;
const MSR_IA32_MISC_ENABLE: u32 = 0x1a0;
const MSR_MTRR_DEF_TYPE: u32 = 0x2ff;
const MSR_STAR: u32 = 0xc000_0081;
const MSR_LSTAR: u32 = 0xc000_0082;
const MSR_CSTAR: u32 = 0xc000_0083;
const MSR_SYSCALL_MASK: u32 = 0xc000_0084;
const MSR_KERNEL_GS_BASE: u32 = 0xc000_0102;
const MISC_ENABLE_FAST_STRING: u64 = 1;
const MTRR_ENABLE: u64 = 1 << 11;
const MTRR_MEM_TYPE_WB: u64 = 6;

const APIC_LVT0: usize = 0x350;
const APIC_LVT1: usize = 0x360;
const APIC_MODE_NMI: u32 = 0x4;
const APIC_MODE_EXTINT: u32 = 0x7;

/// The MSRs a 64-bit Linux boot expects.
pub fn boot_msr_entries() -> Vec<kvm_msr_entry> {
    [
        (MSR_IA32_SYSENTER_CS, 0),
        (MSR_IA32_SYSENTER_ESP, 0),
        (MSR_IA32_SYSENTER_EIP, 0),
        (MSR_STAR, 0),
        (MSR_CSTAR, 0),
        (MSR_KERNEL_GS_BASE, 0),
        (MSR_SYSCALL_MASK, 0),
        (MSR_LSTAR, 0),
        (MSR_IA32_TSC, 0),
        (MSR_IA32_MISC_ENABLE, MISC_ENABLE_FAST_STRING),
        (MSR_MTRR_DEF_TYPE, MTRR_ENABLE | MTRR_MEM_TYPE_WB),
    ]
    .into_iter()
    .map(|(index, data)| kvm_msr_entry {
        index,
        data,
        ..Default::default()
    })
    .collect()
}

fn lapic_reg(regs: &[std::os::raw::c_char], off: usize) -> u32 {
    let b = |i: usize| regs[off + i] as u8;
    u32::from_le_bytes([b(0), b(1), b(2), b(3)])
}

fn set_lapic_reg(regs: &mut [std::os::raw::c_char], off: usize, v: u32) {
    for (i, byte) in v.to_le_bytes().iter().enumerate() {
        regs[off + i] = *byte as std::os::raw::c_char;
    }
}

fn delivery_mode(reg: u32, mode: u32) -> u32 {
    (reg & !0x700) | (mode << 8)
}

/// Configures vCPU `id` to enter the kernel at `entry` in 64-bit mode with the boot GDT,
/// identity page tables at `cr3` and `rsi` pointing at the zero page.
pub fn configure_vcpu(
    vcpu: &VcpuFd,
    id: u8,
    num_cpus: u8,
    entry: GuestAddress,
    cr3: u64,
    supported_cpuid: &CpuId,
    tsc_deadline: bool,
) -> Result<(), VcpuError> {
    let io = |what: &'static str| move |e| VcpuError::Ioctl(id, what, e);

    let cpuid = crate::cpuid::for_vcpu(supported_cpuid, id, num_cpus, tsc_deadline)
        .map_err(|e| VcpuError::Cpuid(id, e))?;
    vcpu.set_cpuid2(&cpuid).map_err(io("KVM_SET_CPUID2"))?;

    let entries = boot_msr_entries();
    let msrs = Msrs::from_entries(&entries).map_err(|_| VcpuError::Msrs(id))?;
    let n = vcpu.set_msrs(&msrs).map_err(io("KVM_SET_MSRS"))?;
    if n != entries.len() {
        return Err(VcpuError::MsrsPartial(id, n, entries.len()));
    }

    let regs = kvm_regs {
        rflags: 0x2,
        rip: entry.0,
        rsp: BOOT_STACK_POINTER,
        rbp: BOOT_STACK_POINTER,
        rsi: ZERO_PAGE_START,
        ..Default::default()
    };
    vcpu.set_regs(&regs).map_err(io("KVM_SET_REGS"))?;

    let mut sregs = vcpu.get_sregs().map_err(io("KVM_GET_SREGS"))?;
    let table = gdt::boot_gdt();
    sregs.gdt.base = BOOT_GDT_START;
    sregs.gdt.limit = (std::mem::size_of_val(&table) - 1) as u16;
    sregs.idt.base = BOOT_IDT_START;
    sregs.idt.limit = 7;
    let code = gdt::segment_from_gdt(table[1], 1);
    let data = gdt::segment_from_gdt(table[2], 2);
    let tss = gdt::segment_from_gdt(table[3], 3);
    sregs.cs = code;
    sregs.ds = data;
    sregs.es = data;
    sregs.fs = data;
    sregs.gs = data;
    sregs.ss = data;
    sregs.tr = tss;
    sregs.cr0 |= X86_CR0_PE | X86_CR0_PG;
    sregs.cr3 = cr3;
    sregs.cr4 |= X86_CR4_PAE;
    sregs.efer |= EFER_LME | EFER_LMA;
    vcpu.set_sregs(&sregs).map_err(io("KVM_SET_SREGS"))?;

    let fpu = kvm_fpu {
        fcw: 0x37f,
        mxcsr: 0x1f80,
        ..Default::default()
    };
    vcpu.set_fpu(&fpu).map_err(io("KVM_SET_FPU"))?;

    let mut lapic = vcpu.get_lapic().map_err(io("KVM_GET_LAPIC"))?;
    let lvt0 = lapic_reg(&lapic.regs, APIC_LVT0);
    set_lapic_reg(
        &mut lapic.regs,
        APIC_LVT0,
        delivery_mode(lvt0, APIC_MODE_EXTINT),
    );
    let lvt1 = lapic_reg(&lapic.regs, APIC_LVT1);
    set_lapic_reg(
        &mut lapic.regs,
        APIC_LVT1,
        delivery_mode(lvt1, APIC_MODE_NMI),
    );
    vcpu.set_lapic(&lapic).map_err(io("KVM_SET_LAPIC"))?;
    Ok(())
}

thread_local! {
    static KVM_RUN: Cell<*mut kvm_run> = const { Cell::new(std::ptr::null_mut()) };
}

extern "C" fn kick_handler(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {
    let p = KVM_RUN.with(|c| c.get());
    if !p.is_null() {
        // SAFETY: `p` points at this thread's mmapped kvm_run, set by the run loop before its
        // first KVM_RUN and valid for the thread's lifetime; immediate_exit is a plain u8 that
        // KVM reads on the next KVM_RUN entry.
        unsafe { (*p).immediate_exit = 1 };
    }
}

/// The signal used to kick vCPUs out of KVM_RUN.
pub fn kick_signal() -> libc::c_int {
    libc::SIGRTMIN()
}

/// Installs the (process-wide) vCPU kick handler.
pub fn install_kick_handler() -> std::io::Result<()> {
    // SAFETY: a zeroed sigaction is a valid starting point; we set a handler with the
    // SA_SIGINFO signature and an empty mask, and pass valid pointers to sigaction.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = kick_handler as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut sa.sa_mask);
        if libc::sigaction(kick_signal(), &sa, std::ptr::null_mut()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

enum Action {
    Continue,
    /// KVM_RUN returned EINTR/EAGAIN (a kick, or immediate_exit was set).
    Interrupted,
    Stop(Outcome),
    InternalError,
    Shutdown,
}

/// Most KVM_RUN rounds a pause may take to complete pending (string) I/O.
const MAX_PAUSE_ROUNDS: u32 = 1024;

/// A request from the main thread to a vCPU thread (sent before kicking the thread).
#[derive(Debug)]
pub enum VcpuCommand {
    /// Leave KVM_RUN, complete any pending I/O exit, capture the vCPU state, send it on the
    /// given channel, then wait for [`VcpuCommand::Resume`].
    Pause(Sender<PauseReply>),
    /// Continue running after a pause.
    Resume,
}

/// A vCPU's answer to [`VcpuCommand::Pause`].
#[derive(Debug)]
pub struct PauseReply {
    /// vCPU index.
    pub id: u8,
    /// The captured state, or why the vCPU could not pause.
    pub state: Result<VcpuState, String>,
}

/// Dispatches the result of one KVM_RUN.
fn dispatch(
    id: u8,
    pio: &Bus,
    mmio: &Bus,
    result: Result<VcpuExit<'_>, kvm_ioctls::Error>,
) -> Action {
    match result {
        Ok(exit) => match exit {
            VcpuExit::IoIn(port, data) => {
                pio.read(u64::from(port), data);
                Action::Continue
            }
            VcpuExit::IoOut(port, data) => {
                pio.write(u64::from(port), data);
                Action::Continue
            }
            VcpuExit::MmioRead(addr, data) => {
                mmio.read(addr, data);
                Action::Continue
            }
            VcpuExit::MmioWrite(addr, data) => {
                mmio.write(addr, data);
                Action::Continue
            }
            VcpuExit::Hlt => Action::Stop(Outcome::GuestHalted),
            VcpuExit::Shutdown => Action::Shutdown,
            VcpuExit::FailEntry(reason, _cpu) => {
                Action::Stop(Outcome::FailEntry { vcpu: id, reason })
            }
            VcpuExit::InternalError => Action::InternalError,
            VcpuExit::SystemEvent(ty, _) => match ty {
                kvm_bindings::KVM_SYSTEM_EVENT_RESET => Action::Stop(Outcome::GuestReset),
                kvm_bindings::KVM_SYSTEM_EVENT_SHUTDOWN => Action::Stop(Outcome::GuestHalted),
                kvm_bindings::KVM_SYSTEM_EVENT_CRASH => Action::Stop(Outcome::KernelPanic),
                other => Action::Stop(Outcome::UnexpectedExit {
                    vcpu: id,
                    what: format!("system event {other}"),
                }),
            },
            VcpuExit::Intr | VcpuExit::IrqWindowOpen => Action::Continue,
            other => Action::Stop(Outcome::UnexpectedExit {
                vcpu: id,
                what: format!("{other:?}"),
            }),
        },
        Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => Action::Interrupted,
        Err(e) => Action::Stop(Outcome::Internal(format!("vcpu {id}: KVM_RUN failed: {e}"))),
    }
}

/// A vCPU thread's state.
pub struct VcpuRunner {
    /// vCPU index.
    pub id: u8,
    /// The vCPU.
    pub fd: VcpuFd,
    /// Port I/O bus.
    pub pio: Arc<Bus>,
    /// MMIO bus.
    pub mmio: Arc<Bus>,
    /// Outcome channel.
    pub events: Sender<VmEvent>,
    /// Set to stop the loop (together with a kick).
    pub stop: Arc<AtomicBool>,
    /// Pause/resume requests (each followed by a kick).
    pub commands: Receiver<VcpuCommand>,
    /// What snapshot capture needs to know about the host.
    pub caps: Arc<VcpuCaps>,
    /// Guest memory (for the paravirtual extended-state requests, [`crate::xstate`]).
    pub mem: GuestMem,
    /// Whether a refused extended-state request has been reported already.
    pub xstate_reported: bool,
    /// The thread's own seccomp filter, stacked after `start` (VMs with network).
    pub seccomp: Arc<crate::seccomp::ThreadSeccomp>,
}

impl VcpuRunner {
    /// Rendezvous on `arrived` (start-up done), waits on `start` (seccomp installed), narrows
    /// its own filter to the base one, then runs the guest until an outcome and reports it on
    /// `events`.
    pub fn run(mut self, arrived: Arc<Barrier>, start: Arc<Barrier>) {
        let run_ptr: *mut kvm_run = self.fd.get_kvm_run();
        KVM_RUN.with(|c| c.set(run_ptr));
        arrived.wait();
        start.wait();
        if let Err(e) = self.seccomp.narrow(crate::seccomp::FilterKind::Base) {
            let _ = self.events.send(VmEvent::Stopped(Outcome::Internal(format!(
                "vCPU {}: {e}",
                self.id
            ))));
            return;
        }
        let outcome = self.run_loop();
        KVM_RUN.with(|c| c.set(std::ptr::null_mut()));
        if let Some(o) = outcome {
            let _ = self.events.send(VmEvent::Stopped(o));
        }
    }

    /// One KVM_RUN and its dispatch.
    fn run_once(&mut self) -> Action {
        let result = self.fd.run();
        let xstate_op = match &result {
            Ok(VcpuExit::IoOut(port, data)) if *port == xstate::XSTATE_PORT => {
                Some(data.first().copied().unwrap_or(0))
            }
            _ => None,
        };
        match xstate_op {
            Some(op) => {
                self.xstate(op);
                Action::Continue
            }
            None => dispatch(self.id, &self.pio, &self.mmio, result),
        }
    }

    /// Serves a paravirtual extended-state request ([`crate::xstate`]); a refused one is
    /// logged once and otherwise ignored (it can only concern the guest's own registers).
    fn xstate(&mut self, op: u8) {
        let r = self
            .fd
            .get_regs()
            .map_err(|e| xstate::XstateError::Kvm(format!("KVM_GET_REGS: {e}")))
            .and_then(|regs| xstate::handle(&self.fd, &self.caps, &self.mem, op, regs.rsi));
        if let Err(e) = r {
            if !self.xstate_reported {
                self.xstate_reported = true;
                log::warn!("vcpu {}: {e}", self.id);
            }
        }
    }

    /// The outcome an action ends the loop with, if any.
    fn outcome(&mut self, action: Action) -> Option<Outcome> {
        match action {
            Action::Continue | Action::Interrupted => None,
            Action::Stop(o) => Some(o),
            Action::Shutdown => Some(Outcome::TripleFault {
                vcpu: self.id,
                rip: self.fd.get_regs().ok().map(|r| r.rip),
            }),
            Action::InternalError => Some(self.internal_error()),
        }
    }

    fn run_loop(&mut self) -> Option<Outcome> {
        loop {
            if self.stop.load(Ordering::Acquire) {
                return None;
            }
            // Commands are sent before the kick, so after any EINTR this sees them (even when
            // the kick landed while immediate_exit was being reset).
            if let Ok(VcpuCommand::Pause(reply)) = self.commands.try_recv() {
                if let Some(o) = self.pause(reply) {
                    return Some(o);
                }
                continue;
            }
            match self.run_once() {
                Action::Continue => {}
                Action::Interrupted => self.fd.set_kvm_immediate_exit(0),
                other => return self.outcome(other),
            }
        }
    }

    /// Pauses: completes a pending I/O exit (KVM_RUN with immediate_exit=1 finishes the
    /// emulation of the instruction that exited, then returns EINTR without entering the
    /// guest), captures the state, replies, and waits for [`VcpuCommand::Resume`]. Returns
    /// an outcome when the VM stopped instead.
    fn pause(&mut self, reply: Sender<PauseReply>) -> Option<Outcome> {
        let id = self.id;
        let mut rounds = 0;
        loop {
            self.fd.set_kvm_immediate_exit(1);
            match self.run_once() {
                Action::Interrupted => break,
                Action::Continue if rounds < MAX_PAUSE_ROUNDS => rounds += 1,
                Action::Continue => {
                    self.fd.set_kvm_immediate_exit(0);
                    let _ = reply.send(PauseReply {
                        id,
                        state: Err(format!("vCPU {id}: pending I/O did not complete")),
                    });
                    return None;
                }
                other => {
                    self.fd.set_kvm_immediate_exit(0);
                    let _ = reply.send(PauseReply {
                        id,
                        state: Err(format!("vCPU {id} stopped while pausing")),
                    });
                    return self.outcome(other);
                }
            }
        }
        self.fd.set_kvm_immediate_exit(0);
        let state =
            VcpuState::capture(&self.fd, u32::from(id), &self.caps).map_err(|e| e.to_string());
        let _ = reply.send(PauseReply { id, state });
        drop(reply);
        loop {
            match self.commands.recv() {
                Ok(VcpuCommand::Resume) | Err(_) => return None,
                Ok(VcpuCommand::Pause(again)) => {
                    let _ = again.send(PauseReply {
                        id,
                        state: Err(format!("vCPU {id} is already paused")),
                    });
                }
            }
        }
    }

    fn internal_error(&mut self) -> Outcome {
        let run = self.fd.get_kvm_run();
        // SAFETY: exit_reason was KVM_EXIT_INTERNAL_ERROR, so the `internal` member of the
        // union is the one KVM filled; `emulation_failure` shares its first fields and, for
        // suberror KVM_INTERNAL_ERROR_EMULATION, carries the instruction bytes. Both are plain
        // integer data, so reading them is valid whatever KVM wrote.
        let (suberror, insn) = unsafe {
            let internal = run.__bindgen_anon_1.internal;
            let mut insn = Vec::new();
            if internal.suberror == kvm_bindings::KVM_INTERNAL_ERROR_EMULATION {
                let ef = run.__bindgen_anon_1.emulation_failure;
                let bytes = ef.__bindgen_anon_1.__bindgen_anon_1;
                let n = usize::from(bytes.insn_size).min(bytes.insn_bytes.len());
                insn.extend_from_slice(&bytes.insn_bytes[..n]);
            }
            (internal.suberror, insn)
        };
        Outcome::EmulationFailure {
            vcpu: self.id,
            suberror,
            insn,
            rip: self.fd.get_regs().ok().map(|r| r.rip),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn msr_list() {
        let m = boot_msr_entries();
        assert_eq!(m.len(), 11);
        let mtrr = m.iter().find(|e| e.index == MSR_MTRR_DEF_TYPE).unwrap();
        assert_eq!(mtrr.data, 0x806);
    }

    #[test]
    fn lapic_helpers() {
        let mut regs = [0 as std::os::raw::c_char; 1024];
        set_lapic_reg(&mut regs, APIC_LVT0, 0x1_0000);
        let v = lapic_reg(&regs, APIC_LVT0);
        assert_eq!(delivery_mode(v, APIC_MODE_EXTINT), 0x1_0700);
        assert_eq!(delivery_mode(0x700, APIC_MODE_NMI), 0x400);
    }
}
