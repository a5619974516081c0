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
//!
//! A layered snapshot (a `base` given) writes, instead of the whole memory, only the pages
//! written since the VM was restored from the full snapshot in `base`
//! ([`crate::persist::format::diff`]). The restored memory is a `MAP_PRIVATE` mapping of the
//! base's memory file, so a page written since then (by the guest, or by the VMM's devices:
//! virtio and the restore page write guest memory through the same mapping) is an anonymous
//! copy-on-write page, and an unwritten one is a page of the file or not present at all.
//! `/proc/self/pagemap` tells them apart without reading any memory (readable unprivileged:
//! only the PFNs are hidden, not the flags we use); it is opened while the VM is restored,
//! before seccomp, and read with `lseek` + `read`, which the snapshot filter allows already.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Sender};
use std::sync::MutexGuard;
use std::time::{Duration, Instant};

use super::devices::VirtioBackend;
use super::Running;
use crate::config::VmConfig;
use crate::devices::block::Block;
use crate::devices::net::NetBackend;
use crate::devices::p9::P9;
use crate::devices::virtio::mmio::MmioTransport;
use crate::devices::vsock::VsockBackend;
use crate::memory::GuestMem;
use crate::persist::format::diff::{save_layered, BaseId};
use crate::persist::format::{
    encode_state, read_state_file, save, LoadedSnapshot, MEMORY_FILE, PAGE_SIZE, STATE_FILE,
};
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
    /// For a layered snapshot: the pages in its memory diff.
    pub diff_pages: Option<u64>,
}

/// What a restored VM's memory was mapped from: a layered snapshot of it may be taken over
/// exactly that full snapshot.
pub(crate) struct Origin {
    /// The snapshot directory restored from.
    dir: PathBuf,
    /// Device and inode of the memory file mapped (the base's, for a layered snapshot).
    memory_file: Option<(u64, u64)>,
    /// The identity of the full snapshot whose memory file is mapped.
    id: BaseId,
    /// Restored from a layered snapshot (its diff pages are file pages too, so the written
    /// pages are not what differs from the base: no layered snapshot of it).
    layered: bool,
    /// `/proc/self/pagemap`, opened before seccomp (only for VMs that take snapshots).
    pagemap: Option<File>,
}

impl Origin {
    /// The origin of a VM configured by `cfg`, restored from `dir` with `memory` mapped.
    pub(crate) fn of(cfg: &VmConfig, dir: &Path, memory: &LoadedSnapshot, layered: bool) -> Self {
        let pagemap = if cfg.snapshot_control && !layered {
            File::open("/proc/self/pagemap")
                .map_err(|e| log::warn!("no layered snapshots: /proc/self/pagemap: {e}"))
                .ok()
        } else {
            None
        };
        Self {
            dir: dir.to_path_buf(),
            memory_file: memory
                .memory_file
                .metadata()
                .ok()
                .map(|m| (m.dev(), m.ino())),
            id: memory.id.clone(),
            layered,
            pagemap,
        }
    }

    /// Checks that `base` is the full snapshot this VM's memory was mapped from, unchanged;
    /// returns the pagemap to find the written pages with.
    fn check_base(&self, base: &Path) -> Result<&File, String> {
        if self.layered {
            return Err(format!(
                "this VM was restored from the layered snapshot {}: a layered snapshot is only \
                 taken of a VM restored from a full snapshot",
                self.dir.display()
            ));
        }
        let other = || {
            format!(
                "this VM was restored from {}, not from the base {}",
                self.dir.display(),
                base.display()
            )
        };
        let mem = base.join(MEMORY_FILE);
        let m = std::fs::metadata(&mem).map_err(|e| format!("base {}: {e}", mem.display()))?;
        if self.memory_file != Some((m.dev(), m.ino())) {
            return Err(other());
        }
        let state = read_state_file(&base.join(STATE_FILE)).map_err(|e| e.to_string())?;
        if hex_sha256(&state) != self.id.state_sha256 {
            return Err(format!(
                "the base {} changed since this VM was restored from it",
                base.display()
            ));
        }
        self.pagemap.as_ref().ok_or_else(|| {
            "cannot find the written pages: /proc/self/pagemap was not opened \
             (the VM was not started with snapshot_control, or the open failed)"
                .to_string()
        })
    }
}

fn hex_sha256(data: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    crate::persist::format::hex(&Sha256::digest(data))
}

/// pagemap entry bits: page present, swapped, file-backed (or shared anonymous).
const PM_PRESENT: u64 = 1 << 63;
const PM_SWAPPED: u64 = 1 << 62;
const PM_FILE: u64 = 1 << 61;
/// Entries read per `read` (256 MiB of guest memory).
const PM_CHUNK: usize = 64 * 1024;

/// Whether the page a pagemap entry describes was written since it was mapped from its
/// file: an anonymous (copy-on-write) page, present or swapped out. A page of the file, or
/// one never touched, was not.
pub(crate) fn written(entry: u64) -> bool {
    entry & PM_SWAPPED != 0 || (entry & PM_PRESENT != 0 && entry & PM_FILE == 0)
}

/// The memory-file page indices (regions back to back, as in the memory file) of the guest
/// pages written since `mem` was mapped from its file, ascending.
pub(crate) fn written_pages(mem: &GuestMem, pagemap: &File) -> Result<Vec<u64>, String> {
    use vm_memory::{GuestMemoryBackend, GuestMemoryRegion, MemoryRegionAddress};
    let page = PAGE_SIZE as u64;
    let mut out = Vec::new();
    let mut buf = vec![0u8; PM_CHUNK * 8];
    let mut file_page = 0u64;
    let mut pm = pagemap;
    for region in mem.iter() {
        let host = region
            .get_host_address(MemoryRegionAddress(0))
            .map_err(|e| format!("guest memory: {e}"))? as u64;
        if !host.is_multiple_of(page) || !region.len().is_multiple_of(page) {
            return Err("guest memory is not page-aligned".into());
        }
        let pages = region.len() / page;
        let mut done = 0u64;
        while done < pages {
            let n = usize::try_from((pages - done).min(PM_CHUNK as u64)).unwrap_or(PM_CHUNK);
            let chunk = &mut buf[..n * 8];
            pm.seek(SeekFrom::Start((host / page + done) * 8))
                .and_then(|_| pm.read_exact(chunk))
                .map_err(|e| format!("reading /proc/self/pagemap: {e}"))?;
            for (i, e) in chunk.chunks_exact(8).enumerate() {
                let mut b = [0u8; 8];
                b.copy_from_slice(e);
                if written(u64::from_le_bytes(b)) {
                    out.push(file_page + done + i as u64);
                }
            }
            done += n as u64;
        }
        file_page += pages;
    }
    Ok(out)
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
    /// Pauses the guest, writes a snapshot into `dir`, resumes the guest. With `base`, a
    /// layered snapshot over the full snapshot in `base`, which must be the one this VM was
    /// restored from.
    pub fn snapshot(&self, dir: &Path, base: Option<&Path>) -> Result<SnapshotReport, String> {
        let t0 = Instant::now();
        let layered = match base {
            Some(b) => {
                let origin = self.origin.as_ref().ok_or_else(|| {
                    format!(
                        "this VM was booted, not restored from {}: a layered snapshot needs \
                         the full snapshot its VM was restored from",
                        b.display()
                    )
                })?;
                Some((origin, origin.check_base(b)?))
            }
            None => None,
        };
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
        let (state_bytes, memory_bytes, disk_bytes, diff_pages) = match layered {
            None => {
                let s = save(dir, &self.key, &blob, &self.mem).map_err(|e| e.to_string())?;
                (s.state_file_bytes, s.header.memory_len, s.disk_bytes, None)
            }
            Some((origin, pagemap)) => {
                let pages = written_pages(&self.mem, pagemap)?;
                let s = save_layered(dir, &self.key, &blob, &self.mem, &origin.id, &pages)
                    .map_err(|e| e.to_string())?;
                log::info!(
                    "layered snapshot: {} written pages, {} in {} runs",
                    pages.len(),
                    s.diff_pages,
                    s.runs
                );
                let h = s.header.memory_len;
                (s.state_file_bytes, h, s.disk_bytes, Some(s.diff_pages))
            }
        };
        drop(slots);
        drop(serial);
        drop(guard);
        let pause = t0.elapsed();
        Ok(SnapshotReport {
            pause,
            vcpu_pause,
            total: t0.elapsed(),
            state_bytes,
            memory_bytes,
            disk_bytes,
            diff_pages,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::map_guest_memory_file;
    use std::os::unix::fs::FileExt;
    use vm_memory::{Bytes, GuestAddress};

    #[test]
    fn pagemap_finds_exactly_the_written_pages() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("mem");
        let size = 4u64 << 20;
        let f = File::create(&p).unwrap();
        f.set_len(size).unwrap();
        // Data in some pages, holes elsewhere.
        for page in [0u64, 3, 4, 700] {
            f.write_all_at(b"file data", page * 4096).unwrap();
        }
        drop(f);
        let mem = map_guest_memory_file(File::open(&p).unwrap(), size).unwrap();
        let pagemap = File::open("/proc/self/pagemap").unwrap();
        assert_eq!(written_pages(&mem, &pagemap).unwrap(), Vec::<u64>::new());
        // Reads (of data and of holes) are not writes.
        let mut b = [0u8; 9];
        for page in [0u64, 3, 5, 700, 1023] {
            mem.read_slice(&mut b, GuestAddress(page * 4096 + 10))
                .unwrap();
        }
        assert_eq!(written_pages(&mem, &pagemap).unwrap(), Vec::<u64>::new());
        // Writes are, over data or holes, whole pages or one byte, as a device makes them.
        for page in [3u64, 5, 6, 1023] {
            mem.write_obj(1u8, GuestAddress(page * 4096 + 4095))
                .unwrap();
        }
        assert_eq!(written_pages(&mem, &pagemap).unwrap(), [3, 5, 6, 1023]);
        // The entry decoding: present anonymous or swapped is written; file or absent is not.
        assert!(written(PM_PRESENT));
        assert!(written(PM_SWAPPED));
        assert!(!written(PM_PRESENT | PM_FILE));
        assert!(!written(0));
    }
}
