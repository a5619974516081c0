use super::*;
use crate::memory::{create_guest_memory, map_guest_memory_file, overlay_file_runs};

const MEM: u64 = 1 << 20;
const NPAGES: u64 = MEM / PAGE;

fn key() -> SnapshotKey {
    SnapshotKey {
        memory_size: MEM,
        vcpus: 1,
        devices: vec!["serial".into(), "vsock".into()],
        image_hash: "abc123".into(),
    }
}

/// A guest memory with some non-zero pages (the rest zero, as holes in the memory file).
fn base_mem() -> GuestMem {
    let m = create_guest_memory(MEM).unwrap();
    for p in (0..NPAGES).filter(|p| p % 3 != 0) {
        m.write_slice(&[p as u8 ^ 0x5a; 64], GuestAddress(p * PAGE + 100))
            .unwrap();
    }
    m
}

fn all(m: &GuestMem) -> Vec<u8> {
    let mut v = vec![0u8; MEM as usize];
    m.read_slice(&mut v, GuestAddress(0)).unwrap();
    v
}

fn base_id(dir: &Path) -> BaseId {
    load(dir, &key(), MemoryCheck::Full).unwrap().id
}

/// A base snapshot in `root/base` and a layered one over it in `root/diff`; returns the
/// guest memory the layered one was taken of.
fn layered(root: &Path, written: &[u64]) -> GuestMem {
    let mem = base_mem();
    save(&root.join("base"), &key(), b"{\"base\":1}", &mem).unwrap();
    for &p in written {
        mem.write_slice(&[0xc3; 8], GuestAddress(p * PAGE + 8))
            .unwrap();
    }
    let id = base_id(&root.join("base"));
    save_layered(
        &root.join("diff"),
        &key(),
        b"{\"diff\":1}",
        &mem,
        &id,
        written,
    )
    .unwrap();
    mem
}

/// Guest memory as a restore of `root/diff` over `root/base` builds it.
fn restored(root: &Path) -> Vec<u8> {
    let l = load_layered(&root.join("diff"), &root.join("base"), &key()).unwrap();
    let m = map_guest_memory_file(l.base.memory_file.try_clone().unwrap(), MEM).unwrap();
    overlay_file_runs(&m, &l.diff.file, &l.diff.diff.extents()).unwrap();
    all(&m)
}

#[test]
fn base_plus_diff_restores_byte_identical_memory() {
    let root = tempfile::tempdir().unwrap();
    // Written pages: scattered, adjacent, a zero page of the base, the first and last.
    let written = [0, 1, 2, 9, 30, 31, 100, 255];
    let mem = layered(root.path(), &written);
    let l = load_layered(&root.path().join("diff"), &root.path().join("base"), &key()).unwrap();
    assert_eq!(l.state, b"{\"diff\":1}");
    let h = &l.diff.diff.header;
    assert_eq!(
        h.runs,
        [
            DiffRun { page: 0, pages: 3 },
            DiffRun { page: 9, pages: 1 },
            DiffRun { page: 30, pages: 2 },
            DiffRun {
                page: 100,
                pages: 1
            },
            DiffRun {
                page: 255,
                pages: 1
            },
        ]
    );
    assert_eq!(h.data_len, 8 * PAGE);
    assert_eq!(l.diff.diff.data_offset % PAGE, 0);
    let want = all(&mem);
    assert_eq!(restored(root.path()), want);
    // The check can fail: the base alone differs from the snapshotted memory.
    let base_only = map_guest_memory_file(l.base.memory_file.try_clone().unwrap(), MEM).unwrap();
    assert_ne!(all(&base_only), want);
    // The diff is small and private; only the diff's files are in its directory.
    let diff = root.path().join("diff").join(DIFF_FILE);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        fs::metadata(&diff).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert_eq!(
        fs::metadata(&diff).unwrap().len(),
        l.diff.diff.data_offset + 8 * PAGE
    );
    assert!(!root.path().join("diff").join(MEMORY_FILE).exists());
    // A full load of the layered directory says what it is.
    let e = load(&root.path().join("diff"), &key(), MemoryCheck::Full).unwrap_err();
    assert!(e.to_string().contains("layered"), "{e}");
}

#[test]
fn empty_diff_round_trips() {
    let root = tempfile::tempdir().unwrap();
    let mem = layered(root.path(), &[]);
    assert_eq!(restored(root.path()), all(&mem));
}

#[test]
fn guest_writes_to_a_restored_overlay_stay_private() {
    let root = tempfile::tempdir().unwrap();
    layered(root.path(), &[5]);
    let l = load_layered(&root.path().join("diff"), &root.path().join("base"), &key()).unwrap();
    let m = map_guest_memory_file(l.base.memory_file.try_clone().unwrap(), MEM).unwrap();
    overlay_file_runs(&m, &l.diff.file, &l.diff.diff.extents()).unwrap();
    m.write_slice(b"clone", GuestAddress(5 * PAGE)).unwrap();
    // The diff (shared by every clone) is untouched: it still verifies.
    drop(m);
    load_diff(&root.path().join("diff").join(DIFF_FILE)).unwrap();
    // Misaligned or out-of-region overlays are refused.
    let m = map_guest_memory_file(l.base.memory_file.try_clone().unwrap(), MEM).unwrap();
    for bad in [
        (1, PAGE, 0),
        (0, 100, 0),
        (0, PAGE, 7),
        (MEM, PAGE, 0),
        (0, 0, 0),
    ] {
        assert!(
            overlay_file_runs(&m, &l.diff.file, &[bad]).is_err(),
            "{bad:?}"
        );
    }
}

fn diff_bytes(root: &Path) -> Vec<u8> {
    fs::read(root.join("diff").join(DIFF_FILE)).unwrap()
}

fn refused(root: &Path) -> String {
    match load_layered(&root.join("diff"), &root.join("base"), &key()) {
        Ok(_) => panic!("a bad layered snapshot loaded"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn every_corruption_of_the_diff_is_refused() {
    let root = tempfile::tempdir().unwrap();
    layered(root.path(), &[3, 4, 77]);
    let good = diff_bytes(root.path());
    let path = root.path().join("diff").join(DIFF_FILE);
    decode_diff(&good).unwrap();
    let off = parse_head(&good, good.len() as u64).unwrap().data_offset as usize;
    // Every bit of the magic, version, length, header and checksum; bytes of the padding
    // and of the data.
    let head_end = PREFIX_LEN + le_u32(&good[12..16]) as usize + DIGEST_LEN;
    let positions = (0..head_end * 8)
        .map(|b| (b / 8, 1u8 << (b % 8)))
        .chain([(head_end, 1), (off - 1, 0x80)])
        .chain((off..good.len()).step_by(997).map(|i| (i, 0x10)));
    for (k, (i, bit)) in positions.enumerate() {
        let mut d = good.clone();
        d[i] ^= bit;
        assert!(decode_diff(&d).is_err(), "flip at {i}");
        // The file-reading path too, on a sample.
        if k % 97 == 0 || i >= head_end {
            fs::write(&path, &d).unwrap();
            refused(root.path());
        }
    }
    // Every truncation, and trailing data.
    for n in 0..good.len() {
        assert!(decode_diff(&good[..n]).is_err(), "truncated to {n}");
        if n % 509 == 0 || n == good.len() - 1 {
            fs::write(&path, &good[..n]).unwrap();
            refused(root.path());
        }
    }
    let mut long = good.clone();
    long.push(0);
    assert!(decode_diff(&long).is_err());
    fs::write(&path, &long).unwrap();
    assert!(refused(root.path()).contains("length"));
    // A data flip is a checksum mismatch.
    let mut d = good.clone();
    d[off + 10] ^= 1;
    fs::write(&path, &d).unwrap();
    assert!(refused(root.path()).contains("checksum"));
    fs::write(&path, &good).unwrap();
    load_layered(&root.path().join("diff"), &root.path().join("base"), &key()).unwrap();
}

/// A diff with `header` (checksummed, so only its meaning is wrong) and `data`.
fn encode_raw(header: &DiffHeader, data: &[u8]) -> Vec<u8> {
    let hbytes = serde_json::to_vec(header).unwrap();
    let mut out = Vec::new();
    out.extend_from_slice(&DIFF_MAGIC);
    out.extend_from_slice(&DIFF_VERSION.to_le_bytes());
    out.extend_from_slice(&(hbytes.len() as u32).to_le_bytes());
    out.extend_from_slice(&hbytes);
    let d = Sha256::digest(&out);
    out.extend_from_slice(&d);
    out.resize(data_offset(hbytes.len() as u64) as usize, 0);
    out.extend_from_slice(data);
    out
}

fn header(runs: Vec<DiffRun>, memory_size: u64) -> (DiffHeader, Vec<u8>) {
    let pages: u64 = runs.iter().map(|r| r.pages.min(1 << 20)).sum();
    let data = vec![0x11u8; (pages * PAGE) as usize];
    (
        DiffHeader {
            base: BaseId {
                memory_size,
                memory_sha256: "a".repeat(64),
                state_sha256: "b".repeat(64),
            },
            runs,
            data_len: pages * PAGE,
            data_sha256: hex(&Sha256::digest(&data)),
        },
        data,
    )
}

fn run(page: u64, pages: u64) -> DiffRun {
    DiffRun { page, pages }
}

#[test]
fn bad_runs_and_lengths_are_refused() {
    let (h, data) = header(vec![run(1, 2), run(5, 1)], MEM);
    decode_diff(&encode_raw(&h, &data)).unwrap();
    let gib = 1u64 << 30;
    let cases: Vec<(&str, Vec<DiffRun>, u64)> = vec![
        ("empty run", vec![run(1, 0)], MEM),
        ("out of order", vec![run(5, 1), run(1, 1)], MEM),
        ("overlap", vec![run(1, 3), run(3, 1)], MEM),
        ("same page twice", vec![run(2, 1), run(2, 1)], MEM),
        ("past the end", vec![run(NPAGES - 1, 2)], MEM),
        ("beyond memory", vec![run(NPAGES, 1)], MEM),
        ("overflow", vec![run(u64::MAX, 2)], MEM),
        // 4 GiB: the low region ends at page 3 GiB / 4 KiB.
        ("across regions", vec![run(3 * gib / PAGE - 1, 2)], 4 * gib),
        ("bad memory size", vec![run(0, 1)], 12345),
        ("no memory", vec![run(0, 1)], 0),
    ];
    for (what, runs, size) in cases {
        let (h, data) = header(runs, size);
        assert!(decode_diff(&encode_raw(&h, &data)).is_err(), "{what}");
    }
    // Too many runs.
    let runs: Vec<DiffRun> = (0..=MAX_RUNS as u64).map(|i| run(2 * i, 1)).collect();
    let (h, data) = header(runs, 64 << 20);
    assert!(matches!(
        decode_diff(&encode_raw(&h, &data)),
        Err(SnapshotError::TooLarge { .. })
    ));
    // Data length and data that do not match the runs.
    let (mut h, data) = header(vec![run(1, 2)], MEM);
    h.data_len += PAGE;
    assert!(decode_diff(&encode_raw(&h, &data)).is_err());
    let (h, mut data) = header(vec![run(1, 2)], MEM);
    assert!(decode_diff(&encode_raw(&h, &data[..PAGE as usize])).is_err());
    data[0] ^= 1;
    assert!(matches!(
        decode_diff(&encode_raw(&h, &data)),
        Err(SnapshotError::Checksum(_))
    ));
    // An unknown header field, another version, a huge header length.
    let (h, data) = header(vec![run(1, 1)], MEM);
    let mut v = serde_json::to_value(&h).unwrap();
    v["extra"] = 1.into();
    let hb = serde_json::to_vec(&v).unwrap();
    let mut raw = DIFF_MAGIC.to_vec();
    raw.extend_from_slice(&DIFF_VERSION.to_le_bytes());
    raw.extend_from_slice(&(hb.len() as u32).to_le_bytes());
    raw.extend_from_slice(&hb);
    let d = Sha256::digest(&raw);
    raw.extend_from_slice(&d);
    raw.resize(data_offset(hb.len() as u64) as usize, 0);
    raw.extend_from_slice(&data);
    assert!(decode_diff(&raw).is_err());
    let mut other = encode_raw(&h, &data);
    other[8..12].copy_from_slice(&2u32.to_le_bytes());
    assert!(decode_diff(&other)
        .unwrap_err()
        .to_string()
        .contains("version 2"));
    let mut huge = encode_raw(&h, &data);
    huge[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(
        decode_diff(&huge),
        Err(SnapshotError::TooLarge { .. })
    ));
}

#[test]
fn arbitrary_bytes_never_panic() {
    let root = tempfile::tempdir().unwrap();
    layered(root.path(), &[7, 8, 200]);
    let good = diff_bytes(root.path());
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for i in 0..3000 {
        let mut d = if i % 3 == 0 {
            (0..rnd() % 300).map(|_| rnd() as u8).collect::<Vec<u8>>()
        } else {
            good.clone()
        };
        if !d.is_empty() {
            for _ in 0..1 + rnd() % 4 {
                let at = (rnd() % d.len() as u64) as usize;
                d[at] = rnd() as u8;
            }
            if i % 5 == 0 {
                d.truncate((rnd() % d.len() as u64) as usize);
            }
        }
        if decode_diff(&d).is_ok() {
            assert_eq!(d, good, "only the untouched diff decodes");
        }
    }
}

#[test]
fn wrong_base_or_state_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let mem = layered(root.path(), &[10, 11]);
    // Another full snapshot in the base's place (one page differs).
    let base = root.path().join("base");
    let keep = root.path().join("keep");
    fs::rename(&base, &keep).unwrap();
    mem.write_slice(b"x", GuestAddress(0)).unwrap();
    save(&base, &key(), b"{\"base\":1}", &mem).unwrap();
    let why = refused(root.path());
    assert!(why.contains("base snapshot"), "{why}");
    // The same memory under another state is another base too.
    fs::remove_dir_all(&base).unwrap();
    let orig = map_guest_memory_file(File::open(keep.join(MEMORY_FILE)).unwrap(), MEM).unwrap();
    save(&base, &key(), b"{\"base\":2}", &orig).unwrap();
    assert!(refused(root.path()).contains("base snapshot"));
    // A missing base.
    fs::remove_dir_all(&base).unwrap();
    let why = refused(root.path());
    assert!(
        why.contains("base") && why.contains("cannot be read"),
        "{why}"
    );
    // A corrupt base memory file.
    fs::rename(&keep, &base).unwrap();
    let mut m = fs::read(base.join(MEMORY_FILE)).unwrap();
    let i = m.iter().position(|&b| b != 0).unwrap();
    m[i] ^= 1;
    fs::write(base.join(MEMORY_FILE), &m).unwrap();
    assert!(refused(root.path()).contains("checksum"));
    m[i] ^= 1;
    fs::write(base.join(MEMORY_FILE), &m).unwrap();
    load_layered(&root.path().join("diff"), &base, &key()).unwrap();
    // A state file of another layered snapshot over the same base.
    let other = root.path().join("other");
    let id = base_id(&base);
    save_layered(&other, &key(), b"{\"diff\":1}", &mem, &id, &[10, 12]).unwrap();
    let diff_state = root.path().join("diff").join(STATE_FILE);
    let saved = fs::read(&diff_state).unwrap();
    fs::copy(other.join(STATE_FILE), &diff_state).unwrap();
    assert!(refused(root.path()).contains("not of one snapshot"));
    fs::write(&diff_state, &saved).unwrap();
    // A layered snapshot as a base, a full one as a diff, a missing diff, another key.
    let e = load_layered(&root.path().join("diff"), &other, &key()).unwrap_err();
    assert!(e.to_string().contains("itself a layered"), "{e}");
    let e = load_layered(&base, &base, &key()).unwrap_err();
    assert!(e.to_string().contains("full snapshot"), "{e}");
    fs::remove_file(other.join(DIFF_FILE)).unwrap();
    assert!(load_layered(&other, &base, &key()).is_err());
    let mut k = key();
    k.image_hash = "other".into();
    assert!(load_layered(&root.path().join("diff"), &base, &k).is_err());
    // A full save over a layered directory leaves it a full snapshot.
    save(&root.path().join("diff"), &key(), b"{}", &mem).unwrap();
    assert!(!root.path().join("diff").join(DIFF_FILE).exists());
    load(&root.path().join("diff"), &key(), MemoryCheck::Full).unwrap();
}

#[test]
fn coalescing_bounds_the_runs_and_keeps_every_page() {
    let size = 64u64 << 20;
    let pages: Vec<u64> = (0..size / PAGE).filter(|p| p % 3 == 0).collect();
    let runs = coalesce(&pages, size, 100).unwrap();
    assert!(runs.len() <= 100, "{}", runs.len());
    check_runs(&runs, size).unwrap();
    for p in &pages {
        assert!(runs.iter().any(|r| (r.page..r.page + r.pages).contains(p)));
    }
    // Adjacent pages make one run; no merging when under the bound.
    assert_eq!(
        coalesce(&[1, 2, 3, 7], size, MAX_RUNS).unwrap(),
        [run(1, 3), run(7, 1)]
    );
    // Never across the RAM regions (4 GiB: the low one ends at page 3 GiB / 4 KiB).
    let b = (3u64 << 30) / PAGE;
    let runs = coalesce(&[b - 1, b, b + 5], 4 << 30, 1).unwrap();
    assert_eq!(runs, [run(b - 1, 1), run(b, 6)]);
    check_runs(&runs, 4 << 30).unwrap();
    // Unsorted or out-of-range pages are an error.
    assert!(coalesce(&[5, 4], size, 10).is_err());
    assert!(coalesce(&[size / PAGE], size, 10).is_err());
}

#[test]
fn fuzz_seeds_are_valid_diffs() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/snapshot_diff");
    let mut n = 0;
    for e in fs::read_dir(&dir).unwrap() {
        let data = fs::read(e.unwrap().path()).unwrap();
        if data.first().is_some_and(|b| b & 0x80 == 0) {
            decode_diff(&data).unwrap();
            n += 1;
        }
    }
    assert!(n >= 4, "{n} diff seeds in {}", dir.display());
}
