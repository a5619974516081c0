//! Host-side tests of the block device: requests over real guest memory (GuestMemoryMmap)
//! against real temporary files — reads, writes, flush, read-only refusal, range checks,
//! GET_ID, hostile chains, the MMIO transport, opening and locking, snapshot round trips.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use vm_memory::{Bytes, GuestAddress};

use super::disk::{Disk, DiskError};
use super::persist::BlockState;
use super::request::{req_type, status, MAX_REQUEST_BYTES};
use super::*;
use crate::bus::BusDevice;
use crate::config::DiskConfig;
use crate::devices::virtio::mmio::{reg, MmioTransport};
use crate::devices::virtio::status as dev_status;
use crate::devices::virtio::test_driver::{
    bring_up, irq, read_reg as r32, write_reg as w32, DriverQueue, F_NEXT, F_WRITE,
};
use crate::devices::virtio::{INT_CONFIG, INT_VRING};
use crate::memory::create_guest_memory;
use crate::persist::PersistError;

const MEM_SIZE: u64 = 16 << 20;
const QBASE: u64 = 0x1_0000;
const DATA: u64 = 0x10_0000;
const SECTORS: u64 = 256;

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 % 251) as u8).collect()
}

/// A disk file in a temporary directory, filled with [`pattern`].
struct File {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl File {
    fn new(bytes: usize) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk.img");
        std::fs::write(&path, pattern(bytes)).unwrap();
        Self { _dir: dir, path }
    }

    fn read(&self) -> Vec<u8> {
        std::fs::read(&self.path).unwrap()
    }

    fn open(&self, read_only: bool) -> Disk {
        Disk::open(&DiskConfig {
            path: self.path.clone(),
            read_only,
        })
        .unwrap()
    }
}

struct H {
    mem: GuestMem,
    b: Block,
    irq: Arc<Interrupt>,
    q: DriverQueue,
    file: File,
    next: u64,
}

impl H {
    fn new(read_only: bool) -> Self {
        Self::with_queue(read_only, 16)
    }

    fn with_queue(read_only: bool, size: u16) -> Self {
        let file = File::new(SECTORS as usize * 512);
        let mem = create_guest_memory(MEM_SIZE).unwrap();
        let irq = irq();
        let mut b = Block::new(file.open(read_only), 0, irq.clone(), None);
        let f = b.features();
        let q = DriverQueue::new(QBASE, size);
        b.activate(mem.clone(), vec![q.queue(QUEUE_SIZE)], f)
            .unwrap();
        Self {
            mem,
            b,
            irq,
            q,
            file,
            next: DATA,
        }
    }

    fn alloc(&mut self, len: u64) -> u64 {
        let a = self.next;
        self.next += (len + 0xfff) & !0xfff;
        a
    }

    fn header(&mut self, kind: u32, sector: u64) -> u64 {
        let a = self.alloc(16);
        self.mem.write_obj(kind, GuestAddress(a)).unwrap();
        self.mem.write_obj(0u32, GuestAddress(a + 4)).unwrap();
        self.mem.write_obj(sector, GuestAddress(a + 8)).unwrap();
        a
    }

    /// Submits header + data buffers (`lens`, writable for reads) + status and processes the
    /// queue. Returns (status, used len, data buffer addresses).
    fn request(&mut self, kind: u32, sector: u64, lens: &[u32]) -> (u8, u32, Vec<u64>) {
        let h = self.header(kind, sector);
        let writable = kind != req_type::OUT;
        let mut bufs = vec![(h, 16, false)];
        let mut addrs = Vec::new();
        for &len in lens {
            let a = self.alloc(u64::from(len));
            addrs.push(a);
            bufs.push((a, len, writable));
        }
        let st = self.alloc(1);
        self.mem.write_obj(0xffu8, GuestAddress(st)).unwrap();
        bufs.push((st, 1, true));
        let head = self.q.add_chain(&self.mem, &bufs);
        assert!(self.b.process_queue());
        let used = self.q.used(&self.mem);
        assert_eq!(used.len(), 1, "{used:?}");
        assert_eq!(used[0].0, head);
        let s: u8 = self.mem.read_obj(GuestAddress(st)).unwrap();
        (s, used[0].1, addrs)
    }

    fn read_guest(&self, addr: u64, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        self.mem.read_slice(&mut v, GuestAddress(addr)).unwrap();
        v
    }

    fn broken(&self) -> bool {
        self.b.broken_reason().is_some()
    }
}

#[test]
fn reads_land_in_guest_memory() {
    let mut h = H::new(true);
    let (s, used, addrs) = h.request(req_type::IN, 3, &[512, 1024]);
    assert_eq!(s, status::OK);
    assert_eq!(used, 1536 + 1);
    let disk = pattern(SECTORS as usize * 512);
    assert_eq!(h.read_guest(addrs[0], 512), disk[3 * 512..4 * 512]);
    assert_eq!(h.read_guest(addrs[1], 1024), disk[4 * 512..6 * 512]);
    assert_eq!(h.b.stats().reads, 1);
    // The interrupt was raised.
    assert_eq!(h.irq.status() & INT_VRING, INT_VRING);
    assert_eq!(h.irq.eventfd().read().unwrap(), 1);
    // The last sector is readable; zero-length reads succeed.
    assert_eq!(h.request(req_type::IN, SECTORS - 1, &[512]).0, status::OK);
    assert_eq!(h.request(req_type::IN, SECTORS, &[]).0, status::OK);
}

#[test]
fn writes_and_flush_reach_the_file() {
    let mut h = H::new(false);
    let data: Vec<u8> = (0..1024).map(|i| (i % 13) as u8 + 1).collect();
    let h0 = h.header(req_type::OUT, 10);
    let a = h.alloc(1024);
    h.mem.write_slice(&data, GuestAddress(a)).unwrap();
    let st = h.alloc(1);
    // Two segments out of one buffer.
    h.q.add_chain(
        &h.mem,
        &[
            (h0, 16, false),
            (a, 512, false),
            (a + 512, 512, false),
            (st, 1, true),
        ],
    );
    assert!(h.b.process_queue());
    assert_eq!(h.q.used(&h.mem)[0].1, 1);
    assert_eq!(h.mem.read_obj::<u8>(GuestAddress(st)).unwrap(), status::OK);
    let f = h.file.read();
    assert_eq!(f[10 * 512..12 * 512], data[..]);
    let orig = pattern(SECTORS as usize * 512);
    assert_eq!(f[..10 * 512], orig[..10 * 512]);
    assert_eq!(f[12 * 512..], orig[12 * 512..]);
    let (s, used, _) = h.request(req_type::FLUSH, 0, &[]);
    assert_eq!((s, used), (status::OK, 1));
    assert_eq!(h.b.stats().writes, 1);
    assert_eq!(h.b.stats().flushes, 1);
    // Read it back through the device.
    let (s, _, addrs) = h.request(req_type::IN, 10, &[1024]);
    assert_eq!(s, status::OK);
    assert_eq!(h.read_guest(addrs[0], 1024), data);
}

#[test]
fn read_only_disks_refuse_writes_without_touching_the_file() {
    let mut h = H::new(true);
    assert_ne!(h.b.features() & (1 << features::RO), 0);
    let before = h.file.read();
    let (s, used, _) = h.request(req_type::OUT, 0, &[512]);
    assert_eq!((s, used), (status::IOERR, 1));
    assert_eq!(h.file.read(), before);
    assert_eq!(h.b.stats().errors, 1);
    // The file is opened read-only: even a direct write through the device's disk fails.
    let mem = h.mem.clone();
    assert!(h
        .b
        .disk()
        .write_from_guest(
            &mem,
            &[request::Segment {
                addr: GuestAddress(DATA),
                len: 512
            }],
            0
        )
        .is_err());
    // Flush is harmless on a read-only disk; reads still work.
    assert_eq!(h.request(req_type::FLUSH, 0, &[]).0, status::OK);
    assert_eq!(h.request(req_type::IN, 0, &[512]).0, status::OK);
    assert!(!h.broken());
}

#[test]
fn out_of_range_overflowing_and_unaligned_requests_fail() {
    let mut h = H::new(false);
    let before = h.file.read();
    for (kind, sector, lens) in [
        (req_type::IN, SECTORS, vec![512]),
        (req_type::IN, SECTORS - 1, vec![1024]),
        (req_type::OUT, SECTORS, vec![512]),
        (req_type::OUT, u64::MAX, vec![512]),
        (req_type::IN, u64::MAX / 512, vec![512]),
        (req_type::IN, u64::MAX - 1, vec![1024]),
        (req_type::IN, SECTORS + 1, vec![]),
        (req_type::IN, 0, vec![100]),
        (req_type::OUT, 0, vec![511]),
    ] {
        let (s, used, _) = h.request(kind, sector, &lens);
        assert_eq!((s, used), (status::IOERR, 1), "{kind} {sector} {lens:?}");
    }
    assert_eq!(h.file.read(), before);
    assert!(!h.broken());
    assert_eq!(h.b.stats().errors, 9);
}

#[test]
fn oversized_requests_fail() {
    // A file large enough that only the per-request cap refuses it.
    let mut h = H::new(true);
    let big = (MAX_REQUEST_BYTES + 512) as u32;
    let (s, _, _) = h.request(req_type::IN, 0, &[big]);
    assert_eq!(s, status::IOERR);
    assert!(!h.broken());
}

#[test]
fn get_id_and_unsupported_types() {
    let mut h = H::new(true);
    let (s, used, addrs) = h.request(req_type::GET_ID, 0, &[20]);
    assert_eq!((s, used), (status::OK, 21));
    let mut want = b"voidbox-vda".to_vec();
    want.resize(20, 0);
    assert_eq!(h.read_guest(addrs[0], 20), want);
    // A short buffer gets what fits.
    let (s, used, addrs) = h.request(req_type::GET_ID, 0, &[4]);
    assert_eq!((s, used), (status::OK, 5));
    assert_eq!(h.read_guest(addrs[0], 4), b"void");
    for t in [2u32, 11, 13, 0xffff_ffff] {
        let (s, used, _) = h.request(t, 0, &[]);
        assert_eq!((s, used), (status::UNSUPP, 1), "type {t}");
    }
    assert_eq!(disk_id(1)[..11], *b"voidbox-vdb");
    assert_eq!(disk_name(25), "vdz");
    assert_eq!(disk_name(26), "vdaa");
}

#[test]
fn malformed_but_answerable_chains_fail_the_request() {
    let mut h = H::new(false);
    // Header too short, status present.
    let a = h.alloc(16);
    let st = h.alloc(1);
    h.q.add_chain(&h.mem, &[(a, 8, false), (st, 1, true)]);
    assert!(h.b.process_queue());
    assert_eq!(
        h.mem.read_obj::<u8>(GuestAddress(st)).unwrap(),
        status::IOERR
    );
    // A read whose data is device-readable.
    let hd = h.header(req_type::IN, 0);
    let d = h.alloc(512);
    h.q.add_chain(&h.mem, &[(hd, 16, false), (d, 512, false), (st, 1, true)]);
    assert!(h.b.process_queue());
    assert_eq!(
        h.mem.read_obj::<u8>(GuestAddress(st)).unwrap(),
        status::IOERR
    );
    assert_eq!(h.q.used(&h.mem).len(), 2);
    assert!(!h.broken());
}

/// Sets up a chain with raw descriptors (index, addr, len, flags, next), publishes `head`,
/// processes the queue, and returns whether the device broke.
fn hostile(descs: &[(u16, u64, u32, u16, u16)], head: u16) -> (bool, Arc<Interrupt>, Vec<u8>) {
    let mut h = H::new(false);
    let before = h.file.read();
    let hd = h.header(req_type::OUT, 0);
    for &(i, addr, len, flags, next) in descs {
        let addr = if addr == u64::MAX - 1 { hd } else { addr };
        h.q.write_desc(&h.mem, i, addr, len, flags, next);
    }
    h.q.publish(&h.mem, head);
    h.b.process_queue();
    let broken = h.broken();
    if broken {
        // The driver is told: configuration interrupt.
        assert_ne!(h.irq.status() & INT_CONFIG, 0);
        // Nothing more is processed.
        h.q.publish(&h.mem, head);
        assert!(!h.b.process_queue());
    }
    let after = h.file.read();
    assert_eq!(after, before, "a hostile chain changed the disk");
    (broken, h.irq.clone(), after)
}

#[test]
fn hostile_chains_break_the_device_and_never_loop() {
    const HDR: u64 = u64::MAX - 1; // replaced by the header's address
    let nw = F_NEXT | F_WRITE;
    // Self loop.
    assert!(hostile(&[(0, HDR, 16, F_NEXT, 0)], 0).0);
    // Two-descriptor loop.
    assert!(hostile(&[(0, HDR, 16, F_NEXT, 1), (1, DATA, 512, nw, 0)], 0).0);
    // next beyond the queue.
    assert!(hostile(&[(0, HDR, 16, F_NEXT, 200)], 0).0);
    // Head beyond the queue.
    assert!(hostile(&[(0, HDR, 16, 0, 0)], 40).0);
    // Status descriptor read-only: nowhere to report.
    assert!(hostile(&[(0, HDR, 16, F_NEXT, 1), (1, DATA, 1, 0, 0)], 0).0);
    // Buffer outside guest memory, and a huge length.
    assert!(hostile(&[(0, HDR, 16, F_NEXT, 1), (1, 1 << 40, 1, F_WRITE, 0)], 0).0);
    assert!(
        hostile(
            &[(0, HDR, 16, F_NEXT, 1), (1, DATA, u32::MAX, F_WRITE, 0)],
            0
        )
        .0
    );
    // Address overflow.
    assert!(
        hostile(
            &[(0, HDR, 16, F_NEXT, 1), (1, u64::MAX - 4, 16, F_WRITE, 0)],
            0
        )
        .0
    );
    // Readable after writable.
    assert!(hostile(&[(0, DATA, 1, F_WRITE | F_NEXT, 1), (1, HDR, 16, 0, 0)], 0).0);
    // A zero-length-only chain.
    assert!(hostile(&[(0, DATA, 0, 0, 0)], 0).0);
}

#[test]
fn chains_longer_than_the_bound_break_the_device() {
    // A queue of 256 entries, a chain of MAX_CHAIN_DESCS + 1 descriptors, all valid.
    let mut h = H::with_queue(false, 256);
    let hd = h.header(req_type::IN, 0);
    let mut bufs = vec![(hd, 16, false)];
    for _ in 0..MAX_CHAIN_DESCS - 1 {
        bufs.push((DATA + 0x10_0000, 512, true));
    }
    bufs.push((DATA + 0x20_0000, 1, true));
    assert_eq!(bufs.len(), MAX_CHAIN_DESCS + 1);
    h.q.add_chain(&h.mem, &bufs);
    h.b.process_queue();
    assert!(h.broken());
    // Exactly at the bound works (after a reset).
    let mut h = H::with_queue(false, 256);
    let hd = h.header(req_type::IN, 0);
    let mut bufs = vec![(hd, 16, false)];
    for i in 0..MAX_CHAIN_DESCS as u64 - 2 {
        bufs.push((DATA + 0x10_0000 + i * 512, 512, true));
    }
    bufs.push((DATA + 0x20_0000, 1, true));
    h.q.add_chain(&h.mem, &bufs);
    assert!(h.b.process_queue());
    assert!(!h.broken());
    assert_eq!(
        h.mem
            .read_obj::<u8>(GuestAddress(DATA + 0x20_0000))
            .unwrap(),
        status::OK
    );
}

#[test]
fn opening_locks_and_sizes() {
    let f = File::new(4096);
    let cfg = |read_only| DiskConfig {
        path: f.path.clone(),
        read_only,
    };
    // Read-only disks share; a writer excludes everyone.
    let r1 = Disk::open(&cfg(true)).unwrap();
    let r2 = Disk::open(&cfg(true)).unwrap();
    assert_eq!(r1.capacity(), 8);
    let e = Disk::open(&cfg(false)).unwrap_err();
    assert!(matches!(e, DiskError::Locked { .. }), "{e}");
    assert!(e.to_string().contains("disk.img"), "{e}");
    drop((r1, r2));
    let w = Disk::open(&cfg(false)).unwrap();
    assert!(!w.read_only());
    for ro in [true, false] {
        let e = Disk::open(&cfg(ro)).unwrap_err();
        assert!(matches!(e, DiskError::Locked { .. }), "{e}");
    }
    drop(w);
    Disk::open(&cfg(false)).unwrap();

    // Sizes: empty, not a sector multiple.
    for (len, ok) in [(0usize, false), (511, false), (513, false), (512, true)] {
        std::fs::write(&f.path, vec![0u8; len]).unwrap();
        let r = Disk::open(&cfg(true));
        assert_eq!(r.is_ok(), ok, "{len}");
        if let Err(e) = r {
            assert!(
                matches!(e, DiskError::BadSize { .. }) && e.is_config(),
                "{e}"
            );
            assert!(e.to_string().contains(f.path.to_str().unwrap()), "{e}");
        }
    }
    // Missing file, a directory.
    let missing = DiskConfig {
        path: f.path.with_file_name("missing"),
        read_only: true,
    };
    assert!(matches!(Disk::open(&missing), Err(DiskError::Open { .. })));
    let dir = DiskConfig {
        path: f.path.parent().unwrap().to_path_buf(),
        read_only: true,
    };
    assert!(matches!(
        Disk::open(&dir),
        Err(DiskError::NotRegular { .. })
    ));
    // Descriptors are close-on-exec.
    let d = Disk::open(&cfg(true)).unwrap();
    // SAFETY: F_GETFD only reads descriptor flags.
    let flags = unsafe { libc::fcntl(d.fd(), libc::F_GETFD) };
    assert_ne!(flags & libc::FD_CLOEXEC, 0);
}

/// A transport around a block device over `file`, driven to DRIVER_OK.
fn running_transport(file: &File, read_only: bool) -> (MmioTransport, Arc<Mutex<Block>>, GuestMem) {
    let mem = create_guest_memory(MEM_SIZE).unwrap();
    let irq = irq();
    let block = Arc::new(Mutex::new(Block::new(
        file.open(read_only),
        0,
        irq.clone(),
        None,
    )));
    let mut t = MmioTransport::new(Box::new(BlockDevice::new(block.clone())), mem.clone(), irq);
    bring_up(
        &mut t,
        offered_features(read_only),
        &[&DriverQueue::new(QBASE, 16)],
    );
    assert!(t.is_activated());
    (t, block, mem)
}

#[test]
fn through_the_mmio_transport() {
    let file = File::new(SECTORS as usize * 512);
    let (mut t, block, mem) = running_transport(&file, true);
    assert_eq!(r32(&mut t, reg::DEVICE_ID), BLOCK_DEVICE_ID);
    w32(&mut t, reg::DEVICE_FEATURES_SEL, 0);
    let lo = r32(&mut t, reg::DEVICE_FEATURES);
    assert_ne!(lo & (1 << features::RO), 0);
    assert_ne!(lo & (1 << features::FLUSH), 0);
    // Config space: capacity (two 32-bit reads, as Linux does), seg_max, blk_size.
    assert_eq!(r32(&mut t, reg::CONFIG) as u64, SECTORS);
    assert_eq!(r32(&mut t, reg::CONFIG + 4), 0);
    assert_eq!(r32(&mut t, reg::CONFIG + 8), request::SIZE_MAX);
    assert_eq!(r32(&mut t, reg::CONFIG + 12), request::SEG_MAX);
    assert_eq!(r32(&mut t, reg::CONFIG + 20), BLOCK_SIZE);
    let mut b = [0u8; 1];
    t.read(reg::CONFIG + 0x1000, &mut b);
    assert_eq!(b, [0]);
    // A read request, notified through QueueNotify.
    let mut q = DriverQueue::new(QBASE, 16);
    mem.write_obj(req_type::IN, GuestAddress(DATA)).unwrap();
    mem.write_obj(2u64, GuestAddress(DATA + 8)).unwrap();
    q.add_chain(
        &mem,
        &[
            (DATA, 16, false),
            (DATA + 0x1000, 512, true),
            (DATA + 0x2000, 1, true),
        ],
    );
    w32(&mut t, reg::QUEUE_NOTIFY, 0);
    assert_eq!(q.used(&mem), vec![(0, 513)]);
    let mut got = vec![0u8; 512];
    mem.read_slice(&mut got, GuestAddress(DATA + 0x1000))
        .unwrap();
    assert_eq!(got, pattern(SECTORS as usize * 512)[1024..1536]);
    assert_eq!(r32(&mut t, reg::INTERRUPT_STATUS) & INT_VRING, INT_VRING);
    // A self loop: DEVICE_NEEDS_RESET, then a reset clears it.
    q.write_desc(&mem, 5, DATA, 16, F_NEXT, 5);
    q.publish(&mem, 5);
    w32(&mut t, reg::QUEUE_NOTIFY, 0);
    assert_ne!(r32(&mut t, reg::STATUS) & dev_status::DEVICE_NEEDS_RESET, 0);
    w32(&mut t, reg::STATUS, 0);
    assert_eq!(r32(&mut t, reg::STATUS), 0);
    assert!(!lock(&block).is_active());
    assert!(lock(&block).broken_reason().is_none());
}

#[test]
fn snapshot_round_trip_keeps_serving() {
    let file = File::new(SECTORS as usize * 512);
    let (mut t, block, mem) = running_transport(&file, false);
    let mut q = DriverQueue::new(QBASE, 16);
    // One write before the snapshot.
    mem.write_obj(req_type::OUT, GuestAddress(DATA)).unwrap();
    mem.write_obj(5u64, GuestAddress(DATA + 8)).unwrap();
    mem.write_slice(&[0xaa; 512], GuestAddress(DATA + 0x1000))
        .unwrap();
    q.add_chain(
        &mem,
        &[
            (DATA, 16, false),
            (DATA + 0x1000, 512, false),
            (DATA + 0x2000, 1, true),
        ],
    );
    w32(&mut t, reg::QUEUE_NOTIFY, 0);
    assert_eq!(q.used(&mem).len(), 1);

    let ts = t.save();
    let bs = lock(&block).save();
    assert_eq!(bs.capacity, SECTORS);
    assert!(!bs.read_only);
    assert_eq!(bs.writes, 1);
    assert_eq!(bs.queue.unwrap().next_avail, 1);
    let bs: BlockState = serde_json::from_str(&serde_json::to_string(&bs).unwrap()).unwrap();
    drop(t);
    drop(block); // releases the write lock

    // Restore into "new" memory holding the same contents (as a memory file would).
    let mem2 = create_guest_memory(MEM_SIZE).unwrap();
    let mut all = vec![0u8; MEM_SIZE as usize];
    mem.read_slice(&mut all, GuestAddress(0)).unwrap();
    mem2.write_slice(&all, GuestAddress(0)).unwrap();
    let irq = irq();
    let b2 = Block::restore(&bs, file.open(false), 0, mem2.clone(), irq.clone(), None).unwrap();
    assert_eq!(b2.save(), bs);
    let b2 = Arc::new(Mutex::new(b2));
    let mut t2 = MmioTransport::restore(
        Box::new(BlockDevice::new(b2.clone())),
        mem2.clone(),
        irq,
        &ts,
    )
    .unwrap();
    // The next request is served from the restored indices, and the earlier write is there.
    mem2.write_obj(req_type::IN, GuestAddress(DATA)).unwrap();
    q.add_chain(
        &mem2,
        &[
            (DATA, 16, false),
            (DATA + 0x3000, 512, true),
            (DATA + 0x2000, 1, true),
        ],
    );
    w32(&mut t2, reg::QUEUE_NOTIFY, 0);
    assert_eq!(q.used(&mem2), vec![(3, 513)]);
    let mut got = [0u8; 512];
    mem2.read_slice(&mut got, GuestAddress(DATA + 0x3000))
        .unwrap();
    assert_eq!(got, [0xaa; 512]);
    assert_eq!(lock(&b2).stats().reads, 1);
    assert_eq!(lock(&b2).stats().writes, 1);
}

#[test]
fn restore_refuses_mismatched_disks_and_invalid_state() {
    let file = File::new(SECTORS as usize * 512);
    let (_t, block, mem) = running_transport(&file, true);
    let good = lock(&block).save();
    let restore = |s: &BlockState, disk: Disk| {
        Block::restore(s, disk, 0, mem.clone(), irq(), None).map(|_| ())
    };
    restore(&good, file.open(true)).unwrap();
    // Another size.
    let other = File::new(SECTORS as usize * 512 + 512);
    let e = restore(&good, other.open(true)).unwrap_err();
    assert!(matches!(e, PersistError::Mismatch { .. }), "{e}");
    assert!(e.to_string().contains("sectors"), "{e}");
    // Another mode.
    let e = restore(&good, other_mode(&other.path)).unwrap_err();
    assert!(matches!(e, PersistError::Mismatch { .. }), "{e}");
    // Invalid: features never offered, a queue outside memory, acked while inactive, a
    // huge reason.
    let bad = |f: &dyn Fn(&mut BlockState)| {
        let mut s = good.clone();
        f(&mut s);
        restore(&s, file.open(true)).unwrap_err()
    };
    assert!(matches!(
        bad(&|s| s.acked_features |= 1 << 40),
        PersistError::Invalid { .. }
    ));
    assert!(matches!(
        bad(&|s| s.queue.as_mut().unwrap().desc_table = 1 << 40),
        PersistError::Invalid { .. }
    ));
    assert!(matches!(
        bad(&|s| s.queue.as_mut().unwrap().max_size = 128),
        PersistError::Mismatch { .. }
    ));
    assert!(matches!(
        bad(&|s| s.queue = None),
        PersistError::Invalid { .. }
    ));
    assert!(matches!(
        bad(&|s| s.broken = Some("x".repeat(MAX_REASON_LEN + 1))),
        PersistError::Invalid { .. }
    ));
    // A fresh (never activated) device round-trips.
    let irq2 = irq();
    let fresh = Block::new(other.open(true), 1, irq2, None).save();
    assert_eq!(fresh.queue, None);
    restore(&fresh, other.open(true)).unwrap();
}

/// `path` opened read-write (the mode the tests' read-only snapshot did not have).
fn other_mode(path: &Path) -> Disk {
    Disk::open(&DiskConfig {
        path: path.to_path_buf(),
        read_only: false,
    })
    .unwrap()
}

#[test]
fn fuzz_entry_point_survives_junk() {
    assert!(fuzz::fuzz_requests(&[]).is_none());
    for len in [1usize, 17, 300, 0x1_0001, 0x2_0000] {
        let data: Vec<u8> = (0..len).map(|i| (i * 31 % 256) as u8).collect();
        let r = fuzz::fuzz_requests(&data).unwrap();
        assert_eq!(r.disk.len(), fuzz::FUZZ_DISK_BYTES);
    }
}

#[test]
fn used_ring_reports_statuses_in_order() {
    // Three requests in one notify: read OK, write on RO → IOERR, unknown → UNSUPP.
    let mut h = H::new(true);
    let mut st = Vec::new();
    for (kind, writable) in [(req_type::IN, true), (req_type::OUT, false), (99, true)] {
        let hd = h.header(kind, 0);
        let d = h.alloc(512);
        let s = h.alloc(1);
        st.push(s);
        let mut bufs = vec![(hd, 16, false)];
        if kind != 99 {
            bufs.push((d, 512, writable));
        }
        bufs.push((s, 1, true));
        h.q.add_chain(&h.mem, &bufs);
    }
    assert!(h.b.process_queue());
    assert_eq!(h.q.used(&h.mem).len(), 3);
    let got: Vec<u8> = st
        .iter()
        .map(|&s| h.mem.read_obj(GuestAddress(s)).unwrap())
        .collect();
    assert_eq!(got, [status::OK, status::IOERR, status::UNSUPP]);
    // The file was opened read-only: its content is intact.
    let f = std::fs::File::open(&h.file.path).unwrap();
    let mut first = [0u8; 512];
    f.read_exact_at(&mut first, 0).unwrap();
    assert_eq!(first[..], pattern(512)[..]);
}
