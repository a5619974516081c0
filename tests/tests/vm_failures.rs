//! Boot failures are reported with what the VMM saw. The seccomp kill itself is also
//! covered at the VMM level by `vmm/tests/vm_process.rs` (tiny hand-assembled guests).

use voidbox::sandbox::{Sandbox, SandboxError};
const VOIDBOX: &str = env!("CARGO_BIN_EXE_voidbox-under-test");

use voidbox_tests::vm::{guest_image, sandbox_config};

#[test]
fn guest_kernel_panic_is_reported_with_the_console_tail() {
    let Some(image) = guest_image() else { return };
    let mut cfg = sandbox_config(image, VOIDBOX);
    // An init that is not on the system disk: the kernel panics ("Requested init … failed").
    cfg.extra_cmdline = vec!["init=/nonexistent".into()];
    match Sandbox::start(&cfg) {
        Err(SandboxError::BootFailed(exit)) => {
            assert_eq!(exit.code, Some(10), "{exit}");
            assert_eq!(exit.reason.as_deref(), Some("kernel_panic"), "{exit}");
            assert!(
                exit.console_tail.iter().any(|l| l.contains("Kernel panic")),
                "{exit}"
            );
            let msg = SandboxError::BootFailed(exit).to_string();
            assert!(
                msg.contains("guest console") && msg.contains("Kernel panic"),
                "{msg}"
            );
        }
        Err(e) => panic!("expected a kernel panic, got: {e}"),
        Ok(_) => panic!("the guest booted despite init=/nonexistent"),
    }
}

#[test]
fn a_syscall_outside_the_seccomp_filter_kills_the_vmm() {
    let Some(image) = guest_image() else { return };
    let mut cfg = sandbox_config(image, VOIDBOX);
    cfg.test_forbidden_syscall = true;
    match Sandbox::start(&cfg) {
        Err(SandboxError::BootFailed(exit)) => {
            assert_eq!(exit.signal, Some(libc_sigsys()), "{exit}");
            assert!(exit.to_string().contains("SIGSYS"), "{exit}");
        }
        Err(e) => panic!("expected a SIGSYS kill, got: {e}"),
        Ok(_) => panic!("the VMM survived a forbidden syscall"),
    }
}

fn libc_sigsys() -> i32 {
    31 // SIGSYS on x86_64
}

/// Hostile guests (#34 §5): what the host sees when a guest turns against it — a fork bomb,
/// a memory hog past the VM's size, a full `/tmp` and disk, an output flood past
/// `--max-output`, a uid-1000 process trying AF_VSOCK to the host and the agent's port.
/// The exit code and reason, the deadline held, the host process's memory bounded, no VMM
/// or temporary directory left, and the other VMs of the same run unaffected.
mod hostile {
    use std::io::{BufRead, BufReader};
    use std::path::Path;
    use std::process::{Child, Command, Stdio};
    use std::time::{Duration, Instant};

    use serde_json::Value;
    use voidbox_tests::vm::guest_image;
    use voidbox_tests::{assert_no_leftovers, assert_tmp_clean, write_file};

    use super::VOIDBOX;

    /// What the deadline may overshoot by on this slow emulated host (the host kills the
    /// VM 1 s after the timeout; the rest is slack for a loaded CI machine).
    const OVERSHOOT_MAX: Duration = Duration::from_secs(4);
    /// The voidbox process's peak RSS (VmHWM) bound: it holds the capped output, never the
    /// flood, and never the guest's memory (that is the VMM's).
    const HOST_HWM_MAX_KIB: u64 = 200 * 1024;

    fn tag(what: &str) -> String {
        format!("VOIDBOX_TEST_TAG=hostile-{what}-{}", std::process::id())
    }

    /// `voidbox ARGS` with `TMPDIR=tmp` and `tag` in its environment (so its VMMs are found).
    fn spawn(tmp: &Path, tag: &str, args: &[&str]) -> Child {
        let (k, v) = tag.split_once('=').unwrap();
        Command::new(VOIDBOX)
            .args(args)
            .env("NO_COLOR", "1")
            .env("TMPDIR", tmp)
            .env(k, v)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    /// Samples the peak RSS (VmHWM, KiB) of `pid` until it exits; the last sample is its
    /// peak over its whole life.
    fn watch_hwm(pid: u32) -> std::thread::JoinHandle<u64> {
        std::thread::spawn(move || {
            let mut peak = 0;
            while let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
                if let Some(v) = s
                    .lines()
                    .find_map(|l| l.strip_prefix("VmHWM:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
                {
                    peak = v;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            peak
        })
    }

    /// `timed out: … (after N ms)` on stderr: N.
    fn after_ms(stderr: &str) -> u64 {
        let i = stderr.find("(after ").expect("a timeout line") + "(after ".len();
        stderr[i..]
            .split(' ')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no duration in: {stderr}"))
    }

    /// `voidbox run --timeout 5` of a fork bomb exits 124 within the deadline and a few
    /// seconds, its VM killed when the guest does not answer in time; nothing is left.
    #[test]
    fn a_fork_bomb_loses_its_vm_at_the_deadline() {
        if guest_image().is_none() {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let tag = tag("bomb");
        let cli = spawn(
            tmp.path(),
            &tag,
            &[
                "run",
                "--memory-mb",
                "128",
                "--timeout",
                "5",
                "--",
                "sh",
                "-c",
                "f(){ f|f& }; f; sleep 60",
            ],
        );
        let hwm = watch_hwm(cli.id());
        let out = cli.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(124), "stderr: {stderr}");
        let ms = after_ms(&stderr);
        eprintln!("fork bomb: timeout 5000 ms, the command ended after {ms} ms");
        assert!(
            Duration::from_millis(ms) <= Duration::from_secs(5) + OVERSHOOT_MAX,
            "the deadline did not hold: {stderr}"
        );
        let peak = hwm.join().unwrap();
        assert!(peak < HOST_HWM_MAX_KIB, "voidbox peaked at {peak} KiB");
        assert_no_leftovers(&tag);
        assert_tmp_clean(tmp.path());
    }

    /// SIGTERM to `voidbox run` while its guest runs a fork bomb: exit 143 at once (the VM is
    /// killed, not asked), no VMM and no temporary directory left.
    #[test]
    fn sigterm_during_a_fork_bomb_exits_143_and_leaves_nothing() {
        if guest_image().is_none() {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let tag = tag("sigterm");
        let mut cli = spawn(
            tmp.path(),
            &tag,
            &[
                "run",
                "--memory-mb",
                "128",
                "--timeout",
                "600",
                "--",
                "sh",
                "-c",
                "echo started; f(){ f|f& }; f; sleep 600",
            ],
        );
        let mut line = String::new();
        BufReader::new(cli.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line, "started\n");
        std::thread::sleep(Duration::from_secs(2));
        assert!(!voidbox_tests::tagged(&tag).is_empty(), "no VMM is running");
        let t0 = Instant::now();
        let st = Command::new("kill")
            .args(["-TERM", &cli.id().to_string()])
            .status()
            .unwrap();
        assert!(st.success());
        let out = cli.wait_with_output().unwrap();
        let took = t0.elapsed();
        let stderr = String::from_utf8_lossy(&out.stderr);
        eprintln!("SIGTERM during a fork bomb: voidbox run exited after {took:?}");
        assert_eq!(out.status.code(), Some(143), "stderr: {stderr}");
        assert!(stderr.contains("stopped by SIGTERM"), "stderr: {stderr}");
        assert!(took < Duration::from_secs(2) + OVERSHOOT_MAX, "{took:?}");
        assert_no_leftovers(&tag);
        assert_tmp_clean(tmp.path());
    }

    /// One `apply` fan-out, one VM per hostile behaviour, with a well-behaved sibling
    /// (`on_failure: continue`): each hostile node fails (or survives) alone, with its reason;
    /// the sibling succeeds; the host process stays small; nothing is left.
    #[test]
    fn hostile_nodes_fail_alone_and_the_host_holds() {
        if guest_image().is_none() {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let probe_dir = tmp.path().join("probe");
        std::fs::create_dir(&probe_dir).unwrap();
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("guest/vsock-probe.c");
        let st = Command::new("gcc")
            .args(["-O1", "-static", "-o"])
            .arg(probe_dir.join("vsock-probe"))
            .arg(&src)
            .status()
            .expect("gcc is needed to build the guest-side probe");
        assert!(st.success(), "gcc failed on {}", src.display());
        let run_tmp = tmp.path().join("tmp");
        std::fs::create_dir(&run_tmp).unwrap();
        let spec = write_file(
            tmp.path(),
            "hostile.yaml",
            r#"api_version: v1
kind: pipeline
name: hostile
on_failure: continue
sandbox: {memory_mb: 128}
pipeline:
  boxes:
    - name: bomb
      run: {program: sh, args: [-c, "f(){ f|f& }; f; sleep 60"]}
      timeout_secs: 5
    - name: hog
      run: {program: sh, args: [-c, "tail /dev/zero"]}
      timeout_secs: 15
    - name: fill
      run: {program: sh, args: [-c, "dd if=/dev/zero of=/tmp/fill bs=1M; t=$?; dd if=/dev/zero of=/workspace/fill bs=1M; w=$?; rm -f /tmp/fill /workspace/fill; echo tmp=$t disk=$w"]}
      timeout_secs: 20
    - name: flood
      run: {program: sh, args: [-c, "yes out | head -c 1500000; yes err | head -c 1500000 >&2"]}
      timeout_secs: 120
    - name: vsock
      run: {program: /workspace/probe/vsock-probe}
      sandbox: {mounts: [{host: probe, guest: /workspace/probe, mode: ro}]}
      timeout_secs: 60
    - name: sibling
      run: {program: sh, args: [-c, "echo '{\"fine\": true}'"]}
  stages:
    - {type: fan_out, boxes: [bomb, hog, fill, flood, vsock, sibling]}
"#,
        );
        let tag = tag("apply");
        let t0 = Instant::now();
        let cli = spawn(
            &run_tmp,
            &tag,
            &[
                "apply",
                &spec,
                "--max-output",
                "1MiB",
                "--max-parallel",
                "6",
                "--boot-timeout",
                "400",
                "--output",
                "json",
                "--logs-dir",
                tmp.path().join("logs").to_str().unwrap(),
            ],
        );
        let hwm = watch_hwm(cli.id());
        let out = cli.wait_with_output().unwrap();
        let took = t0.elapsed();
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        eprintln!("hostile apply: {took:?}");
        assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
        let doc: Value = serde_json::from_str(&stdout)
            .unwrap_or_else(|e| panic!("{e}: {stdout}\nstderr: {stderr}"));
        let node = |name: &str| {
            doc["nodes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|n| n["name"] == name)
                .cloned()
                .unwrap_or_else(|| panic!("no node {name}: {doc}"))
        };
        // The well-behaved sibling is unaffected.
        let sibling = node("sibling");
        assert_eq!(sibling["status"], "succeeded", "{sibling}");
        // The fork bomb times out within its deadline and a few seconds.
        let bomb = node("bomb");
        assert_eq!(bomb["status"], "timed_out", "{bomb}");
        let exec_ms = bomb["exec_ms"].as_u64().unwrap_or(u64::MAX);
        eprintln!("apply fork bomb: timeout 5000 ms, exec ended after {exec_ms} ms");
        assert!(
            Duration::from_millis(exec_ms) <= Duration::from_secs(5) + OVERSHOOT_MAX,
            "{bomb}"
        );
        // The memory hog is killed by the guest's OOM killer, or, where the emulated guest
        // thrashes too long for that, its VM is killed at the deadline: either way it ends.
        let hog = node("hog");
        let why = hog["error"].as_str().unwrap_or_default();
        let hog_ms = hog["exec_ms"].as_u64().unwrap_or(u64::MAX);
        eprintln!("memory hog: {} after {hog_ms} ms", hog["status"]);
        match hog["status"].as_str() {
            Some("failed") => assert!(why.contains("SIGKILL"), "{hog}"),
            Some("timed_out") => assert!(
                Duration::from_millis(hog_ms) <= Duration::from_secs(15) + OVERSHOOT_MAX,
                "{hog}"
            ),
            _ => panic!("the memory hog did not end: {hog}"),
        }
        // Full /tmp and a full disk: the writer gets ENOSPC, the node goes on and reports.
        // (/tmp is memory: on this emulated host, filling it can wedge a 128 MiB guest until
        // its deadline, where the host kills the VM on time.)
        let fill = node("fill");
        let fill_ms = fill["exec_ms"].as_u64().unwrap_or(u64::MAX);
        eprintln!("full /tmp and disk: {} after {fill_ms} ms", fill["status"]);
        match fill["status"].as_str() {
            Some("succeeded") => {}
            Some("timed_out") => assert!(
                Duration::from_millis(fill_ms) <= Duration::from_secs(20) + OVERSHOOT_MAX,
                "{fill}"
            ),
            _ => panic!("filling /tmp and the disk: {fill}"),
        }
        // The flood past --max-output fails the node, not the host.
        let flood = node("flood");
        assert_eq!(flood["status"], "failed", "{flood}");
        // AF_VSOCK as uid 1000 reaches neither the host nor the agent's port.
        let vsock = node("vsock");
        assert_eq!(vsock["status"], "succeeded", "{vsock}");
        let peak = hwm.join().unwrap();
        eprintln!("hostile apply: voidbox peaked at {peak} KiB");
        assert!(peak < HOST_HWM_MAX_KIB, "voidbox peaked at {peak} KiB");
        assert_no_leftovers(&tag);
        assert_tmp_clean(&run_tmp);
    }
}
