//! Taking a snapshot of a running VM and resuming it.
//!
//! 1. Every vCPU gets [`VcpuCommand::Pause`] and a kick; it leaves KVM_RUN, completes any
//!    pending I/O exit, captures its own state and replies, then waits.
//! 2. The main thread locks the serial port and every virtio transport and backend. The vsock
//!    muxer and the net thread touch their backend and guest memory only under the backend
//!    lock, and disk
//!    requests run inside a vCPU's MMIO exit (completed before it paused), so the devices
//!    and guest memory are quiescent while the locks are held.
//! 3. VM state (irqchip, PIT, clock) and device state are captured, the state blob and the
//!    memory file written ([`crate::persist::format::save`]).
//! 4. The locks are released and every vCPU gets [`VcpuCommand::Resume`], on every path.

use std::path::Path;
use std::sync::mpsc::{channel, Sender};
use std::sync::MutexGuard;
use std::time::{Duration, Instant};

use super::devices::VirtioBackend;
use super::Running;
use crate::devices::block::Block;
use crate::devices::net::NetBackend;
use crate::devices::p9::P9;
use crate::devices::virtio::mmio::MmioTransport;
use crate::devices::vsock::VsockBackend;
use crate::persist::format::{encode_state, save};
use crate::persist::state::{DevicesState, SnapshotState, VirtioDeviceState, VirtioSlotState};
use crate::persist::vcpu::VcpuState;
use crate::persist::vm_state::VmState;
use crate::vcpu::VcpuCommand;

/// How long the vCPUs may take to pause.
pub const PAUSE_TIMEOUT: Duration = Duration::from_secs(5);

/// What a snapshot cost and produced.
#[derive(Debug, Clone, Copy)]
pub struct SnapshotReport {
    /// Request until the guest was resumed (the guest did not run meanwhile).
    pub pause: Duration,
    /// Request until every vCPU had paused and captured its state.
    pub vcpu_pause: Duration,
    /// Request until the files were written and the guest resumed.
    pub total: Duration,
    /// Size of the state file.
    pub state_bytes: u64,
    /// Guest memory size (logical size of the memory file).
    pub memory_bytes: u64,
    /// Bytes allocated on disk by both files.
    pub disk_bytes: u64,
}

/// Sends [`VcpuCommand::Resume`] to every vCPU that was asked to pause, when dropped.
struct ResumeGuard<'a> {
    cmds: &'a [Sender<VcpuCommand>],
    sent: usize,
}

impl Drop for ResumeGuard<'_> {
    fn drop(&mut self) {
        for c in &self.cmds[..self.sent] {
            // A vCPU thread that has exited needs no resume.
            let _ = c.send(VcpuCommand::Resume);
        }
    }
}

/// A virtio slot's locks, transport first (the order the vCPU threads take them in).
enum SlotGuard<'a> {
    Block(MutexGuard<'a, MmioTransport>, MutexGuard<'a, Block>),
    Net(MutexGuard<'a, MmioTransport>, MutexGuard<'a, NetBackend>),
    Vsock(MutexGuard<'a, MmioTransport>, MutexGuard<'a, VsockBackend>),
    P9(MutexGuard<'a, MmioTransport>, MutexGuard<'a, P9>),
}

impl Running {
    /// Pauses the guest, writes a snapshot into `dir`, resumes the guest.
    pub fn snapshot(&self, dir: &Path) -> Result<SnapshotReport, String> {
        let t0 = Instant::now();
        let n = self.vcpu_cmds.len();
        let mut guard = ResumeGuard {
            cmds: &self.vcpu_cmds,
            sent: 0,
        };
        let (tx, rx) = channel();
        for (i, c) in self.vcpu_cmds.iter().enumerate() {
            c.send(VcpuCommand::Pause(tx.clone()))
                .map_err(|_| format!("vCPU {i} is not running"))?;
            guard.sent += 1;
        }
        drop(tx);
        self.kick_vcpus();
        let mut states: Vec<Option<VcpuState>> = (0..n).map(|_| None).collect();
        for _ in 0..n {
            let left = (t0 + PAUSE_TIMEOUT).saturating_duration_since(Instant::now());
            let reply = rx
                .recv_timeout(left)
                .map_err(|_| "the vCPUs did not pause in time".to_string())?;
            let state = reply.state?;
            let slot = states
                .get_mut(usize::from(reply.id))
                .ok_or_else(|| format!("reply from unknown vCPU {}", reply.id))?;
            *slot = Some(state);
        }
        let vcpus: Vec<VcpuState> = states
            .into_iter()
            .collect::<Option<_>>()
            .ok_or("a vCPU did not report its state")?;
        let vcpu_pause = t0.elapsed();

        let serial = self.serial.lock().unwrap_or_else(|p| p.into_inner());
        let slots: Vec<SlotGuard<'_>> = self
            .virtio
            .iter()
            .map(|s| match &s.backend {
                VirtioBackend::Block(b) => SlotGuard::Block(
                    s.transport.lock().unwrap_or_else(|p| p.into_inner()),
                    crate::devices::block::lock(b),
                ),
                VirtioBackend::Net(b) => SlotGuard::Net(
                    s.transport.lock().unwrap_or_else(|p| p.into_inner()),
                    crate::devices::net::lock(b),
                ),
                VirtioBackend::Vsock(b) => SlotGuard::Vsock(
                    s.transport.lock().unwrap_or_else(|p| p.into_inner()),
                    crate::devices::vsock::lock(b),
                ),
                VirtioBackend::P9(b) => SlotGuard::P9(
                    s.transport.lock().unwrap_or_else(|p| p.into_inner()),
                    crate::devices::p9::lock(b),
                ),
            })
            .collect();
        let vm = VmState::capture(&self.vm_fd).map_err(|e| e.to_string())?;
        let devices = DevicesState {
            serial: serial.save(),
            virtio: slots
                .iter()
                .map(|g| {
                    Ok(match g {
                        SlotGuard::Block(t, b) => VirtioSlotState {
                            transport: t.save(),
                            device: VirtioDeviceState::Block(b.save()),
                        },
                        SlotGuard::Net(t, b) => VirtioSlotState {
                            transport: t.save(),
                            device: VirtioDeviceState::Net(b.save()),
                        },
                        SlotGuard::Vsock(t, b) => VirtioSlotState {
                            transport: t.save(),
                            device: VirtioDeviceState::Vsock(b.save()),
                        },
                        // Refused while a share is mounted (see `devices::p9::persist`).
                        SlotGuard::P9(t, b) => VirtioSlotState {
                            transport: t.save(),
                            device: VirtioDeviceState::P9(b.save()?),
                        },
                    })
                })
                .collect::<Result<_, String>>()?,
        };
        let blob = encode_state(&SnapshotState {
            vm,
            vcpus,
            devices,
            restore_page: crate::restore_page::is_armed(&self.mem),
        })
        .map_err(|e| e.to_string())?;
        let saved = save(dir, &self.key, &blob, &self.mem).map_err(|e| e.to_string())?;
        drop(slots);
        drop(serial);
        drop(guard);
        let pause = t0.elapsed();
        Ok(SnapshotReport {
            pause,
            vcpu_pause,
            total: t0.elapsed(),
            state_bytes: saved.state_file_bytes,
            memory_bytes: saved.header.memory_len,
            disk_bytes: saved.disk_bytes,
        })
    }
}
