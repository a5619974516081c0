//! Golden snapshots on real micro-VMs: one cold boot creates the snapshot, then every VM is
//! a private restore of it with its own secret, RNG state and clock; a corrupt or
//! mismatched snapshot is refused before any vCPU runs.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use voidbox::sandbox::guest::{try_connect, AGENT_PORT};
use voidbox::sandbox::{GuestConn, RestoreFrom, Sandbox, SandboxConfig, SandboxError};
use voidbox::snapshot::{ensure_golden, CreateOptions, GoldenSpec, Snapshots, Store};
use voidbox_protocol::SessionSecret;
use voidbox_tests::vm::{guest_image, sandbox_config};

const VOIDBOX: &str = env!("CARGO_BIN_EXE_voidbox-under-test");

fn sh(sb: &mut Sandbox, script: &str) -> String {
    let (out, err, code) =
        voidbox_tests::vm::sh(sb, script).unwrap_or_else(|e| panic!("exec {script:?}: {e}"));
    assert_eq!(code, Some(0), "{script:?}: {err}");
    out
}

fn refused(sb: &Sandbox, secret: &SessionSecret) -> bool {
    let s = try_connect(sb.vsock_path(), AGENT_PORT, Duration::from_secs(30))
        .unwrap()
        .expect("the restored guest accepts connections");
    matches!(
        GuestConn::handshake(s, secret, None, Duration::from_secs(60)),
        Err(SandboxError::AuthRejected)
    )
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

fn start_err(cfg: &SandboxConfig) -> String {
    match Sandbox::start(cfg) {
        Err(SandboxError::SnapshotRefused(why)) => why,
        Err(e) => panic!("expected a refused snapshot, got: {e}"),
        Ok(_) => panic!("a bad snapshot was restored"),
    }
}

#[test]
fn restores_are_fresh_private_vms_and_bad_snapshots_are_refused() {
    let Some(image) = guest_image() else { return };
    let cache = tempfile::tempdir().unwrap();
    let runtime = tempfile::tempdir().unwrap();
    let store = Store::open(Some(cache.path())).unwrap();
    let mut cfg = sandbox_config(image, VOIDBOX);
    cfg.runtime_dir = Some(runtime.path().to_path_buf());
    let opts = CreateOptions {
        launcher: cfg.launcher.clone(),
        boot_timeout: cfg.boot_timeout,
        runtime_dir: cfg.runtime_dir.clone(),
    };
    let notices = Arc::new(Mutex::new(Vec::<String>::new()));
    let n = notices.clone();
    let spec = GoldenSpec::of(&cfg);
    let lease = ensure_golden(&store, &spec, &opts, u64::MAX, &move |m: &str| {
        n.lock().unwrap().push(m.to_string())
    })
    .unwrap_or_else(|e| panic!("creating the golden snapshot: {e}"));
    assert!(
        notices.lock().unwrap()[0].contains("creating the golden snapshot"),
        "{notices:?}"
    );
    let dir = lease.entry.dir.clone();
    let mem = dir.join("memory.bin");
    let meta = std::fs::metadata(&mem).unwrap();
    assert_eq!(meta.len(), 128 << 20);
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    use std::os::unix::fs::MetadataExt;
    assert!(
        meta.blocks() * 512 < meta.len() / 2,
        "the memory file is sparse"
    );
    let golden = lease.restore.secret.clone();

    // The snapshot's guest clock stops at the snapshot: let the host's run ahead of it, so a
    // restored guest that kept it would be seconds off.
    std::thread::sleep(Duration::from_secs(4));
    let host_ns = || {
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as i128
    };

    // Two restores of the one snapshot: both run commands, each with its own secret, RNG and
    // clock, all delivered on the restore page before the guest resumed.
    cfg.restore = Some(lease.restore.clone());
    let before = host_ns();
    let mut a = Sandbox::start(&cfg).unwrap_or_else(|e| panic!("restore a: {e}"));
    let mut b = Sandbox::start(&cfg).unwrap_or_else(|e| panic!("restore b: {e}"));
    assert!(a.timings().restore.is_some(), "{:?}", a.timings());
    // Ready without a word from the guest: no handshake, re-key or policy round trip came
    // before the first request, which goes out behind the connection's `Ping` (under the
    // page's secret) and brings the guest's first answer.
    assert!(a.guest_info().is_none() && b.guest_info().is_none());
    let script = "echo hello from a restored VM; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n'; echo; date +%s";
    let out_a = sh(&mut a, script);
    let out_b = sh(&mut b, script);
    let after = host_ns();
    assert!(a.guest_info().is_some_and(|i| i.kernel.is_some()));
    let la: Vec<&str> = out_a.lines().collect();
    let lb: Vec<&str> = out_b.lines().collect();
    assert_eq!(la[0], "hello from a restored VM");
    assert_eq!(lb[0], "hello from a restored VM");
    assert_eq!(la[1].len(), 64, "{out_a}");
    assert_ne!(la[1], lb[1], "restored clones must not share RNG output");
    // Each guest clock was set from the host's at its restore, not left at the snapshot's.
    // (The guest's `date` has whole seconds; the snapshot's clock is 4 s behind.)
    for (name, l) in [("a", &la), ("b", &lb)] {
        let guest = l[2].trim().parse::<i128>().unwrap() * 1_000_000_000;
        assert!(
            guest >= before - 1_000_000_000 && guest <= after,
            "{name}: guest clock {guest}, host between {before} and {after}"
        );
    }
    // Secrets were rotated: the snapshot's secret and the sibling's are refused.
    assert_ne!(a.secret(), b.secret());
    assert_ne!(a.secret(), &golden);
    assert!(
        refused(&a, &golden),
        "the golden secret still opens a restored VM"
    );
    assert!(
        refused(&a, b.secret()),
        "a sibling's secret opens a restored VM"
    );
    // Files and the authenticated connection work after the restore.
    a.write_file("/workspace/x.txt", b"restored\n", None)
        .unwrap();
    assert_eq!(
        a.read_file("/workspace/x.txt", 1024).unwrap(),
        b"restored\n"
    );
    drop(a);
    drop(b);

    let t = std::time::Instant::now();
    layered_round_trip(&cfg, &lease.restore, cache.path());
    println!("layered snapshot checks: {:?}", t.elapsed());

    // A corrupt memory page is refused before any vCPU runs.
    let bad = cache.path().join("corrupt");
    copy_dir(&dir, &bad);
    let mut data = std::fs::read(bad.join("memory.bin")).unwrap();
    let i = data.iter().position(|&x| x != 0).expect("non-zero memory");
    data[i] ^= 0xff;
    std::fs::write(bad.join("memory.bin"), &data).unwrap();
    drop(data);
    let mut c = cfg.clone();
    c.restore = Some(RestoreFrom {
        dir: bad.clone(),
        secret: golden.clone(),
        base: None,
    });
    let why = start_err(&c);
    assert!(why.contains("checksum"), "{why}");
    // A flipped byte in the state file too.
    copy_dir(&dir, &bad);
    let mut st = std::fs::read(bad.join("state.snap")).unwrap();
    let last = st.len() - 10;
    st[last] ^= 0x01;
    std::fs::write(bad.join("state.snap"), &st).unwrap();
    let why = start_err(&c);
    assert!(why.contains("checksum"), "{why}");
    // A snapshot of another VM size is a mismatch.
    let mut m = cfg.clone();
    m.memory_mb = 256;
    let why = start_err(&m);
    assert!(why.contains("memory"), "{why}");

    // A golden snapshot that went bad in the cache cannot serve: the VMM refuses it, the
    // engine deletes it and cold-boots this VM, saying so in one line.
    drop(lease);
    let mut mem = std::fs::read(&mem).unwrap();
    let i = mem.iter().rposition(|&x| x != 0).expect("non-zero memory");
    mem[i] ^= 0x55;
    std::fs::write(dir.join("memory.bin"), &mem).unwrap();
    drop(mem);
    notices.lock().unwrap().clear();
    let n = notices.clone();
    let snapshots = Snapshots {
        store: Some(store.clone()),
        create: opts,
        max_bytes: u64::MAX,
        base: cache.path().to_path_buf(),
        notice: Arc::new(move |m: &str| n.lock().unwrap().push(m.to_string())),
    };
    let mut cold_cfg = cfg.clone();
    cold_cfg.restore = None;
    let mut c = snapshots
        .start(&cold_cfg, None, &|| false)
        .unwrap_or_else(|e| panic!("fallback cold boot: {e}"));
    assert!(c.timings().restore.is_none(), "{:?}", c.timings());
    assert_eq!(sh(&mut c, "echo cold"), "cold\n");
    let said = notices.lock().unwrap().join("\n");
    assert!(
        said.contains("cannot be used") && said.contains("checksum") && said.contains("cold"),
        "{said}"
    );
    assert!(!dir.exists(), "the broken golden snapshot was removed");
}

/// Guest memory of a layered snapshot in `dir` over the full snapshot `base`, rebuilt here
/// from the files (the diff format read independently of the VMM: header, runs, page data).
fn rebuild_memory(base: &Path, dir: &Path) -> Vec<u8> {
    let mut mem = std::fs::read(base.join("memory.bin")).unwrap();
    let diff = std::fs::read(dir.join("memory.diff")).unwrap();
    assert_eq!(&diff[..8], b"VBXDIFF\0");
    let hlen = u32::from_le_bytes(diff[12..16].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&diff[16..16 + hlen]).unwrap();
    let mut at = (16 + hlen + 32).div_ceil(4096) * 4096;
    for run in header["runs"].as_array().unwrap() {
        let page = run["page"].as_u64().unwrap() as usize * 4096;
        let len = run["pages"].as_u64().unwrap() as usize * 4096;
        mem[page..page + len].copy_from_slice(&diff[at..at + len]);
        at += len;
    }
    assert_eq!(at, diff.len());
    mem
}

fn differing_pages(a: &[u8], b: &[u8]) -> usize {
    assert_eq!(a.len(), b.len());
    a.chunks(4096)
        .zip(b.chunks(4096))
        .filter(|(x, y)| x != y)
        .count()
}

/// A layered snapshot of a VM restored from `base`: it holds only the pages written since
/// the restore, its restore sees what the guest wrote, and base + diff is the VM's memory.
/// Also: one over anything but the VM's own base, or a corrupt one, is refused.
fn layered_round_trip(cfg: &SandboxConfig, base: &RestoreFrom, root: &Path) {
    let mut c = cfg.clone();
    c.restore = Some(base.clone());
    c.snapshot_control = true;
    let t0 = std::time::Instant::now();
    let lap = |what: &str| println!("  {what}: {:?}", t0.elapsed());
    let mut w = Sandbox::start(&c).unwrap_or_else(|e| panic!("restore for the diff: {e}"));
    // ~2 MB in the guest's tmpfs (the root's upper layer), every page different: ~490 fresh
    // pages (made in user space: the guest's kernel code is slow here).
    let sum = sh(
        &mut w,
        "seq 1 300000 > /tmp/big && sha256sum /tmp/big > /tmp/big.sum && \
         echo layered-42 > /tmp/marker && cat /tmp/big.sum",
    );
    lap("restored and written");
    let (diff_dir, full_dir) = (root.join("layered"), root.join("full-of-same"));
    let d = w
        .snapshot_diff_to(&diff_dir, &base.dir, Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("diff snapshot: {e}"));
    let f = w
        .snapshot_to(&full_dir, Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("full snapshot: {e}"));
    let pages = d.diff_pages.expect("a layered snapshot reports its pages");
    assert_eq!(f.diff_pages, None);
    println!(
        "layered snapshot: {pages} pages, {} KiB on disk, in {:?} (pause {:?}); full snapshot \
         of the same VM: {} KiB on disk, in {:?}",
        d.disk_bytes >> 10,
        d.vmm_total,
        d.pause,
        f.disk_bytes >> 10,
        f.vmm_total
    );
    assert!(pages >= 1_990_000 / 4096, "{pages} pages");
    assert!(pages * 4096 < d.memory_bytes / 4, "{pages} pages");
    assert!(d.disk_bytes * 2 < f.disk_bytes, "{d:?} vs {f:?}");
    // Not over another snapshot than the one the VM was restored from.
    let err = w
        .snapshot_diff_to(&root.join("x"), &full_dir, Duration::from_secs(60))
        .unwrap_err();
    assert!(err.to_string().contains("not from the base"), "{err}");
    let secret = w.secret().clone();
    drop(w);
    lap("snapshots");

    // base + diff is the VM's memory at the diff: the full snapshot taken right after
    // differs in the few pages the guest touched in between, not in the ~490 it wrote.
    let rebuilt = rebuild_memory(&base.dir, &diff_dir);
    let full = std::fs::read(full_dir.join("memory.bin")).unwrap();
    let base_mem = std::fs::read(base.dir.join("memory.bin")).unwrap();
    let (after, before) = (
        differing_pages(&rebuilt, &full),
        differing_pages(&base_mem, &full),
    );
    println!("pages differing from the full snapshot: base+diff {after}, base alone {before}");
    assert!(before >= 480 && after * 10 < before, "{after} vs {before}");
    drop((rebuilt, full, base_mem));
    lap("memory compared");

    // Restores of the layered snapshot see what the guest wrote; timed against the full one.
    let layered = RestoreFrom {
        dir: diff_dir.clone(),
        secret: secret.clone(),
        base: Some(base.dir.clone()),
    };
    let mut r = cfg.clone();
    r.restore = Some(layered.clone());
    let t = std::time::Instant::now();
    let mut l = Sandbox::start(&r).unwrap_or_else(|e| panic!("restore of the diff: {e}"));
    let t_layered = (t.elapsed(), l.timings().restore);
    assert_eq!(
        sh(&mut l, "cat /tmp/marker; cat /tmp/big.sum; sha256sum -c /tmp/big.sum >/dev/null && echo intact"),
        format!("layered-42\n{sum}intact\n")
    );
    drop(l);
    lap("layered restore checked");
    let mut r2 = cfg.clone();
    r2.restore = Some(RestoreFrom {
        dir: full_dir.clone(),
        secret,
        base: None,
    });
    let t = std::time::Instant::now();
    let mut g = Sandbox::start(&r2).unwrap_or_else(|e| panic!("restore of the full: {e}"));
    let t_full = (t.elapsed(), g.timings().restore);
    assert_eq!(sh(&mut g, "cat /tmp/marker"), "layered-42\n");
    drop(g);
    println!("restore (start, VMM restore): layered {t_layered:?}, full {t_full:?}");
    lap("full restore checked");

    // Refused: a layered snapshot without its base, over another base, or corrupt.
    let mut no_base = r.clone();
    no_base.restore.as_mut().unwrap().base = None;
    let why = start_err(&no_base);
    assert!(why.contains("layered"), "{why}");
    let mut other_base = r.clone();
    other_base.restore.as_mut().unwrap().base = Some(full_dir.clone());
    let why = start_err(&other_base);
    assert!(why.contains("base snapshot"), "{why}");
    let bad = root.join("layered-corrupt");
    copy_dir(&diff_dir, &bad);
    let mut data = std::fs::read(bad.join("memory.diff")).unwrap();
    let n = data.len();
    data[n - 100] ^= 0x01;
    std::fs::write(bad.join("memory.diff"), &data).unwrap();
    let mut corrupt = r.clone();
    corrupt.restore.as_mut().unwrap().dir = bad;
    let why = start_err(&corrupt);
    assert!(why.contains("checksum"), "{why}");
    lap("refusals");
}
