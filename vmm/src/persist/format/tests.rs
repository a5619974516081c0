use super::*;
use crate::memory::create_guest_memory;

const MEM: u64 = 1 << 20;

fn key() -> SnapshotKey {
    SnapshotKey {
        memory_size: MEM,
        vcpus: 1,
        devices: vec!["serial".into(), "vsock".into()],
        image_hash: "abc123".into(),
    }
}

fn sample() -> Vec<u8> {
    encode(&key(), b"{\"x\":1}", MEM, &[7u8; 32]).unwrap()
}

fn header_len(data: &[u8]) -> usize {
    le_u32(&data[12..16]) as usize
}

#[test]
fn round_trip() {
    let data = sample();
    let (h, state) = decode(&data, Some(&key())).unwrap();
    assert_eq!(state, b"{\"x\":1}");
    assert_eq!(h.key, key());
    assert_eq!(h.memory_sha256, hex(&[7u8; 32]));
    assert_eq!(h.state_len, 7);
}

#[test]
fn bad_magic_and_version() {
    let mut data = sample();
    data[0] ^= 1;
    assert!(matches!(decode(&data, None), Err(SnapshotError::BadMagic)));
    // Version 1 (whole-file memory digest), 2 (one memory region), 3 (no disks), 4 (no
    // network device), 5 (no share slots) and a future version are all refused.
    for v in [1u32, 2, 3, 4, 5, FORMAT_VERSION + 1] {
        let mut data = sample();
        data[8..12].copy_from_slice(&v.to_le_bytes());
        assert!(matches!(
            decode(&data, None),
            Err(SnapshotError::UnsupportedVersion {
                found,
                supported: FORMAT_VERSION
            }) if found == v
        ));
    }
}

#[test]
fn every_truncation_is_refused() {
    let data = sample();
    for n in 0..data.len() {
        let r = decode(&data[..n], None);
        assert!(
            matches!(
                r,
                Err(SnapshotError::Truncated(_)) | Err(SnapshotError::Checksum(_))
            ),
            "truncated to {n}: {r:?}"
        );
    }
    let mut long = data.clone();
    long.push(0);
    assert!(matches!(
        decode(&long, None),
        Err(SnapshotError::TrailingData)
    ));
}

#[test]
fn every_bit_flip_is_refused() {
    let data = sample();
    for i in 0..data.len() {
        for bit in [0u8, 3, 7] {
            let mut d = data.clone();
            d[i] ^= 1 << bit;
            assert!(
                decode(&d, Some(&key())).is_err(),
                "flip at byte {i} bit {bit}"
            );
        }
    }
}

#[test]
fn corrupt_state_and_header_checksums() {
    let mut data = sample();
    let last = data.len() - 1;
    data[last] ^= 0x20;
    assert!(matches!(
        decode(&data, None),
        Err(SnapshotError::Checksum("state"))
    ));
    let mut data = sample();
    data[PREFIX_LEN + 2] ^= 0x01;
    assert!(matches!(
        decode(&data, None),
        Err(SnapshotError::Checksum("header"))
    ));
}

#[test]
fn huge_lengths_are_refused_before_allocation() {
    let mut data = sample();
    data[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(
        decode(&data, None),
        Err(SnapshotError::TooLarge { what: "header", .. })
    ));
    // A header that claims a giant state, with a valid header checksum.
    let mut h = sample_header();
    h.state_len = u64::MAX;
    let d = encode_header(&h);
    assert!(matches!(
        decode(&d, None),
        Err(SnapshotError::TooLarge { what: "state", .. })
    ));
}

/// The header of [`sample`].
fn sample_header() -> SnapshotHeader {
    let data = sample();
    let hl = header_len(&data);
    serde_json::from_slice(&data[16..16 + hl]).unwrap()
}

/// Magic, version, `h` and a valid header checksum: a state file up to its state.
fn encode_header(h: &SnapshotHeader) -> Vec<u8> {
    let hb = serde_json::to_vec(h).unwrap();
    let mut d = Vec::new();
    d.extend_from_slice(&MAGIC);
    d.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    d.extend_from_slice(&(hb.len() as u32).to_le_bytes());
    d.extend_from_slice(&hb);
    let dg = Sha256::digest(&d);
    d.extend_from_slice(&dg);
    d
}

/// A state file whose header was changed by `f`, with valid checksums.
fn with_header(f: impl FnOnce(&mut SnapshotHeader)) -> Vec<u8> {
    let mut h = sample_header();
    f(&mut h);
    let state = b"{\"x\":1}";
    h.state_len = state.len() as u64;
    let mut d = encode_header(&h);
    d.extend_from_slice(state);
    d
}

#[test]
fn memory_regions_must_be_the_layout_of_the_memory_size() {
    let (h, _) = decode(&sample(), None).unwrap();
    assert_eq!(
        h.memory_regions,
        [SavedRegion {
            guest_addr: 0,
            size: MEM
        }]
    );
    decode(&with_header(|_| {}), None).unwrap();
    for bad in [
        vec![],
        vec![SavedRegion {
            guest_addr: 0,
            size: MEM / 2,
        }],
        vec![SavedRegion {
            guest_addr: 1 << 32,
            size: MEM,
        }],
        vec![
            SavedRegion {
                guest_addr: 0,
                size: MEM,
            },
            SavedRegion {
                guest_addr: 1 << 32,
                size: 0,
            },
        ],
    ] {
        let d = with_header(|h| h.memory_regions = bad.clone());
        assert!(
            matches!(decode(&d, None), Err(SnapshotError::BadHeader(_))),
            "{bad:?}"
        );
    }
    // A key whose size has no layout (not page-aligned) is refused too.
    let d = with_header(|h| {
        h.key.memory_size = MEM + 1;
        h.memory_len = MEM + 1;
    });
    assert!(matches!(decode(&d, None), Err(SnapshotError::BadHeader(_))));
}

#[test]
fn guest_above_the_mmio_gap_saves_and_restores_both_regions() {
    use crate::memory::{map_guest_memory_file, HIGH_RAM_START, MMIO_GAP_START};
    const SIZE: u64 = 4 << 30;
    let dir = tempfile::tempdir().unwrap();
    let k = SnapshotKey {
        memory_size: SIZE,
        ..key()
    };
    let mem = create_guest_memory(SIZE).unwrap();
    mem.write_slice(b"low", GuestAddress(0x2000)).unwrap();
    mem.write_slice(b"below gap", GuestAddress(MMIO_GAP_START - 9))
        .unwrap();
    mem.write_slice(b"above gap", GuestAddress(HIGH_RAM_START))
        .unwrap();
    mem.write_slice(b"top", GuestAddress(HIGH_RAM_START + (1 << 30) - 3))
        .unwrap();
    let saved = save(dir.path(), &k, b"{}", &mem).unwrap();
    assert_eq!(saved.header.memory_len, SIZE);
    assert_eq!(saved.header.memory_regions.len(), 2);
    assert!(saved.disk_bytes < 1 << 20, "{}", saved.disk_bytes);
    // In the file the high region follows the low one.
    let mp = dir.path().join(MEMORY_FILE);
    let f = File::open(&mp).unwrap();
    let mut b = [0u8; 9];
    f.read_exact_at(&mut b, MMIO_GAP_START).unwrap();
    assert_eq!(&b, b"above gap");
    // Verified and mapped back at the right guest addresses.
    let snap = load(dir.path(), &k, MemoryCheck::Full).unwrap();
    let m = map_guest_memory_file(snap.memory_file, SIZE).unwrap();
    for (at, want) in [
        (0x2000, &b"low"[..]),
        (MMIO_GAP_START - 9, b"below gap"),
        (HIGH_RAM_START, b"above gap"),
        (HIGH_RAM_START + (1 << 30) - 3, b"top"),
    ] {
        let mut got = vec![0u8; want.len()];
        m.read_slice(&mut got, GuestAddress(at)).unwrap();
        assert_eq!(got, want, "at {at:#x}");
    }
    // A changed byte in the high region is caught; a smaller guest is refused.
    let fw = OpenOptions::new().write(true).open(&mp).unwrap();
    fw.write_all_at(b"A", MMIO_GAP_START).unwrap();
    assert!(matches!(
        load(dir.path(), &k, MemoryCheck::Full),
        Err(SnapshotError::Checksum("memory"))
    ));
    let small = SnapshotKey {
        memory_size: 3 << 30,
        ..key()
    };
    assert!(matches!(
        load(dir.path(), &small, MemoryCheck::LengthOnly),
        Err(SnapshotError::Mismatch { .. })
    ));
}

#[test]
fn mismatched_configuration_is_refused() {
    let data = sample();
    for (k, field) in [
        (
            SnapshotKey {
                memory_size: 2 * MEM,
                ..key()
            },
            "memory size",
        ),
        (SnapshotKey { vcpus: 2, ..key() }, "vCPU count"),
        (
            SnapshotKey {
                devices: vec!["serial".into()],
                ..key()
            },
            "device set",
        ),
        (
            SnapshotKey {
                image_hash: "other".into(),
                ..key()
            },
            "guest image",
        ),
    ] {
        match decode(&data, Some(&k)) {
            Err(SnapshotError::Mismatch { field: f, .. }) => assert_eq!(f, field),
            other => panic!("{field}: {other:?}"),
        }
    }
}

#[test]
fn save_and_load_directory() {
    let dir = tempfile::tempdir().unwrap();
    let mem = create_guest_memory(MEM).unwrap();
    mem.write_slice(b"hello guest", GuestAddress(0x3000))
        .unwrap();
    mem.write_slice(&[0xff; 10], GuestAddress(MEM - 10))
        .unwrap();
    let state = encode_state(&vec![1u32, 2, 3]).unwrap();
    save(dir.path(), &key(), &state, &mem).unwrap();

    let snap = load(dir.path(), &key(), MemoryCheck::Full).unwrap();
    let v: Vec<u32> = decode_state(&snap.state).unwrap();
    assert_eq!(v, vec![1, 2, 3]);
    let bytes = fs::read(&snap.memory_path).unwrap();
    assert_eq!(bytes.len() as u64, MEM);
    assert_eq!(&bytes[0x3000..0x3000 + 11], b"hello guest");
    assert_eq!(&bytes[(MEM - 10) as usize..], &[0xff; 10]);
    assert!(bytes[..0x3000].iter().all(|&b| b == 0));

    // Mismatched configuration.
    let k2 = SnapshotKey { vcpus: 4, ..key() };
    assert!(matches!(
        load(dir.path(), &k2, MemoryCheck::LengthOnly),
        Err(SnapshotError::Mismatch { .. })
    ));

    // Corrupt memory: caught by the full check only; truncated memory by both.
    let mp = dir.path().join(MEMORY_FILE);
    let f = OpenOptions::new().write(true).open(&mp).unwrap();
    f.write_all_at(b"X", 0x3000).unwrap();
    assert!(load(dir.path(), &key(), MemoryCheck::LengthOnly).is_ok());
    assert!(matches!(
        load(dir.path(), &key(), MemoryCheck::Full),
        Err(SnapshotError::Checksum("memory"))
    ));
    f.set_len(MEM - 4096).unwrap();
    assert!(matches!(
        load(dir.path(), &key(), MemoryCheck::LengthOnly),
        Err(SnapshotError::Mismatch { .. })
    ));

    // Truncated and missing state files.
    let sp = dir.path().join(STATE_FILE);
    let data = fs::read(&sp).unwrap();
    fs::write(&sp, &data[..data.len() - 1]).unwrap();
    assert!(matches!(
        load(dir.path(), &key(), MemoryCheck::LengthOnly),
        Err(SnapshotError::Truncated(_))
    ));
    fs::remove_file(&sp).unwrap();
    assert!(matches!(
        load(dir.path(), &key(), MemoryCheck::LengthOnly),
        Err(SnapshotError::Io { .. })
    ));
}

#[test]
fn memory_digest_covers_data_pages_only() {
    let dir = tempfile::tempdir().unwrap();
    let mem = create_guest_memory(MEM).unwrap();
    mem.write_slice(b"page one", GuestAddress(0x1000)).unwrap();
    mem.write_slice(b"page nine", GuestAddress(0x9ff0)).unwrap();
    let hdr = save(dir.path(), &key(), b"{}", &mem).unwrap();
    let mp = dir.path().join(MEMORY_FILE);
    let f = File::open(&mp).unwrap();
    // The digest of the file equals the one computed while writing, and equals a digest
    // over the two non-zero pages (index-prefixed) computed by hand.
    let from_file = digest_memory_file(&f, MEM).unwrap();
    assert_eq!(hex(&from_file), hdr.header.memory_sha256);
    let mut by_hand = Sha256::new();
    let bytes = fs::read(&mp).unwrap();
    for idx in [1u64, 9] {
        by_hand.update(idx.to_le_bytes());
        let at = idx as usize * PAGE_SIZE;
        by_hand.update(&bytes[at..at + PAGE_SIZE]);
    }
    assert_eq!(from_file, <[u8; 32]>::from(by_hand.finalize()));
    // Sparse: only the two data pages are allocated (file systems may round up).
    assert!(hdr.disk_bytes < MEM / 2, "{}", hdr.disk_bytes);
    // Zeros written into a hole change nothing (the content is the same).
    let fw = OpenOptions::new().write(true).open(&mp).unwrap();
    fw.write_all_at(&[0u8; PAGE_SIZE], 0x20000).unwrap();
    load(dir.path(), &key(), MemoryCheck::Full).unwrap();
    // Same bytes moved to another page: refused (page indices are hashed).
    fw.write_all_at(&[0u8; PAGE_SIZE], 0x9000).unwrap();
    fw.write_all_at(&bytes[0x9000..0xa000], 0xa000).unwrap();
    assert!(matches!(
        load(dir.path(), &key(), MemoryCheck::Full),
        Err(SnapshotError::Checksum("memory"))
    ));
}

#[test]
fn corrupt_memory_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mem = create_guest_memory(MEM).unwrap();
    mem.write_slice(&[0xab; 100], GuestAddress(0x5000)).unwrap();
    save(dir.path(), &key(), b"{}", &mem).unwrap();
    let mp = dir.path().join(MEMORY_FILE);
    let pristine = fs::read(&mp).unwrap();
    let restore = || fs::write(&mp, &pristine).unwrap();
    let f = OpenOptions::new().write(true).open(&mp).unwrap();
    // A data page changed.
    f.write_all_at(&[0xac], 0x5010).unwrap();
    assert!(matches!(
        load(dir.path(), &key(), MemoryCheck::Full),
        Err(SnapshotError::Checksum("memory"))
    ));
    // A hole turned non-zero (first and last page too).
    for at in [0u64, 0x7000, MEM - 1] {
        restore();
        load(dir.path(), &key(), MemoryCheck::Full).unwrap();
        let f = OpenOptions::new().write(true).open(&mp).unwrap();
        f.write_all_at(&[1], at).unwrap();
        assert!(
            matches!(
                load(dir.path(), &key(), MemoryCheck::Full),
                Err(SnapshotError::Checksum("memory"))
            ),
            "non-zero byte at {at:#x} not detected"
        );
    }
    // A data page zeroed.
    restore();
    let f = OpenOptions::new().write(true).open(&mp).unwrap();
    f.write_all_at(&[0u8; 100], 0x5000).unwrap();
    assert!(load(dir.path(), &key(), MemoryCheck::Full).is_err());
    // Truncated or extended.
    restore();
    let f = OpenOptions::new().write(true).open(&mp).unwrap();
    f.set_len(MEM - PAGE_SIZE as u64).unwrap();
    assert!(matches!(
        load(dir.path(), &key(), MemoryCheck::Full),
        Err(SnapshotError::Mismatch { .. })
    ));
    f.set_len(MEM + PAGE_SIZE as u64).unwrap();
    assert!(load(dir.path(), &key(), MemoryCheck::Full).is_err());
    // Replaced by a directory.
    fs::remove_file(&mp).unwrap();
    fs::create_dir(&mp).unwrap();
    assert!(load(dir.path(), &key(), MemoryCheck::Full).is_err());
}

#[test]
fn snapshot_files_are_private_and_resaving_is_safe() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("a/b");
    let mem = create_guest_memory(MEM).unwrap();
    mem.write_slice(b"secret", GuestAddress(0)).unwrap();
    save(&snap, &key(), b"{}", &mem).unwrap();
    for f in [STATE_FILE, MEMORY_FILE] {
        let m = fs::metadata(snap.join(f)).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o600, "{f}");
    }
    let m = fs::metadata(&snap).unwrap();
    assert_eq!(m.permissions().mode() & 0o777, 0o700);
    // Saving again over an existing snapshot (with a stale temporary file) works and
    // leaves no temporary files.
    fs::write(snap.join("memory.tmp"), b"stale").unwrap();
    mem.write_slice(b"newer", GuestAddress(0)).unwrap();
    save(&snap, &key(), b"{}", &mem).unwrap();
    load(&snap, &key(), MemoryCheck::Full).unwrap();
    let mut names: Vec<String> = fs::read_dir(&snap)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, [MEMORY_FILE, STATE_FILE]);
    assert_eq!(&fs::read(snap.join(MEMORY_FILE)).unwrap()[..5], b"newer");
}

#[test]
fn zero_check() {
    assert!(is_zero(&[]));
    assert!(is_zero(&[0; 4097]));
    for i in [0usize, 1, 15, 16, 17, 4095, 4096] {
        let mut v = vec![0u8; 4097];
        v[i] = 1;
        assert!(!is_zero(&v), "{i}");
        assert!(!is_zero(&v[1..]) || i == 0, "{i}");
    }
}

#[test]
fn garbage_state_blob_is_a_typed_error() {
    let r: Result<Vec<u32>, _> = decode_state(b"\xff\x00not json");
    assert!(matches!(r, Err(SnapshotError::BadState(_))));
}
