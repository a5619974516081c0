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
use voidbox_protocol::{ExecRequest, OutputStream, SessionSecret};
use voidbox_tests::vm::{guest_image, sandbox_config};

const VOIDBOX: &str = env!("CARGO_BIN_EXE_voidbox-under-test");

fn sh(sb: &mut Sandbox, script: &str) -> String {
    let mut out = Vec::new();
    let r = sb
        .exec(
            ExecRequest {
                program: "sh".into(),
                args: vec!["-c".into(), script.into()],
                ..ExecRequest::default()
            },
            &mut |s, d| {
                if s == OutputStream::Stdout {
                    out.extend_from_slice(d)
                }
            },
        )
        .unwrap_or_else(|e| panic!("exec {script:?}: {e}"));
    assert_eq!(r.exit_code, Some(0), "{script:?}: {r:?}");
    String::from_utf8_lossy(&out).into_owned()
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
