//! `voidbox run` end to end on real micro-VMs (each boot takes ~8–30 s on an
//! interpreting KVM host). See `voidbox_tests::vm` for skipping without KVM.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use voidbox_tests::vm::{child_pids, guest_image};

const VOIDBOX: &str = env!("CARGO_BIN_EXE_voidbox-under-test");

#[test]
fn run_streams_stdout_stderr_and_returns_the_exit_code() {
    if guest_image().is_none() {
        return;
    }
    let out = Command::new(VOIDBOX)
        .args(["run", "--memory-mb", "128", "--"])
        .args(["sh", "-c", "echo hi; echo oops >&2; exit 7"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(7),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    assert_eq!(stdout, "hi\n", "stderr: {stderr}");
    assert!(stderr.contains("oops"), "stderr: {stderr}");
}

#[test]
fn a_missing_program_exits_127() {
    if guest_image().is_none() {
        return;
    }
    let out = Command::new(VOIDBOX)
        .args(["run", "--memory-mb", "128", "--", "nosuchcmd", "-x"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(127), "stderr: {stderr}");
    assert!(
        stderr.contains("voidbox: cannot run nosuchcmd: program `nosuchcmd` not found"),
        "stderr: {stderr}"
    );
    assert!(!stderr.contains("guest refused"), "stderr: {stderr}");
}

#[test]
fn killing_the_vmm_mid_exec_is_reported() {
    if guest_image().is_none() {
        return;
    }
    let mut cli = Command::new(VOIDBOX)
        .args(["run", "--memory-mb", "128", "--"])
        .args(["sh", "-c", "echo started; sleep 120"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(cli.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line, "started\n");
    let vmm = child_pids(cli.id());
    assert_eq!(vmm.len(), 1, "expected exactly one VMM child: {vmm:?}");
    // The VMM is the standalone one next to the binary, carrying the `__vmm` marker.
    let exe = std::fs::read_link(format!("/proc/{}/exe", vmm[0])).unwrap();
    assert_eq!(
        exe,
        std::path::Path::new(&format!("{VOIDBOX}-vmm")),
        "the VMM is not the standalone one"
    );
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", vmm[0])).unwrap();
    assert!(cmdline.split(|b| *b == 0).any(|a| a == b"__vmm"));
    let st = Command::new("kill")
        .args(["-9", &vmm[0].to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let t0 = Instant::now();
    let out = cli.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "slow to notice: {:?}",
        t0.elapsed()
    );
    assert_eq!(out.status.code(), Some(125), "stderr: {stderr}");
    assert!(
        stderr.contains("the VM died during exec") && stderr.contains("SIGKILL"),
        "stderr: {stderr}"
    );
}

/// `voidbox run --publish`: busybox `httpd` in the guest, reached from the host through the
/// published loopback port while the command runs; without `--network` the guest itself
/// reaches nothing outside. SIGTERM ends it with no VMM left.
#[test]
fn a_published_port_is_reached_from_the_host() {
    if guest_image().is_none() {
        return;
    }
    let port = voidbox_tests::free_port();
    let mut cli = voidbox_tests::KillOnDrop(
        Command::new(VOIDBOX)
            .args(["run", "--memory-mb", "128", "--timeout", "300", "--publish"])
            .arg(format!("127.0.0.1:{port}:8080"))
            .args([
                "--",
                "sh",
                "-c",
                "mkdir -p /workspace/www && echo published-ok > /workspace/www/index.html && \
                 if wget -q -T 3 -O- http://1.1.1.1/ >/dev/null 2>&1; then echo EGRESS; fi; \
                 echo serving; exec httpd -f -p 8080 -h /workspace/www",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut out = BufReader::new(cli.0.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "serving\n", "the guest reached outside, or failed");
    // The server starts right after; the first request may race it.
    let deadline = Instant::now() + Duration::from_secs(60);
    let body = loop {
        let got = std::net::TcpStream::connect(("127.0.0.1", port)).and_then(|mut s| {
            use std::io::{Read, Write};
            s.set_read_timeout(Some(Duration::from_secs(20)))?;
            s.write_all(b"GET /index.html HTTP/1.0\r\nHost: x\r\n\r\n")?;
            let mut r = String::new();
            s.read_to_string(&mut r)?;
            Ok(r)
        });
        match got {
            Ok(r) if r.contains("200") => break r,
            _ if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(300)),
            other => panic!("no answer on the published port: {other:?}"),
        }
    };
    assert!(body.ends_with("published-ok\n"), "{body}");
    let vmm = child_pids(cli.0.id());
    assert_eq!(vmm.len(), 1, "{vmm:?}");
    let st = Command::new("kill")
        .args(["-TERM", &cli.0.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let t0 = Instant::now();
    let status = cli.0.wait().unwrap();
    assert!(t0.elapsed() < Duration::from_secs(30), "slow to stop");
    assert!(!status.success(), "{status:?}");
    // The VMM dies with it (its parent-death signal): gone, or a zombie awaiting reaping.
    let gone = || {
        std::fs::read_to_string(format!("/proc/{}/stat", vmm[0])).map_or(true, |st| {
            st.rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('Z'))
        })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !gone() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(gone(), "the VMM outlived voidbox run");
}

/// A SIGKILLed `voidbox run` leaves its temporary directory; `voidbox doctor` (as the next
/// `run` or `apply` would) removes it, since no live run holds its lock (#34 4.9).
#[test]
fn a_killed_runs_directory_is_swept_by_doctor() {
    if guest_image().is_none() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let mut cli = voidbox_tests::KillOnDrop(
        Command::new(VOIDBOX)
            .args(["run", "--memory-mb", "128", "--", "sleep", "60"])
            .env("TMPDIR", tmp.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let run_dirs = || -> Vec<std::path::PathBuf> {
        std::fs::read_dir(tmp.path())
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("voidbox-run-"))
            })
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while run_dirs().is_empty() {
        assert!(Instant::now() < deadline, "no run directory appeared");
        std::thread::sleep(Duration::from_millis(20));
    }
    // A live run's directory is never touched.
    let doctor = || {
        Command::new(VOIDBOX)
            .args(["doctor", "--format", "json"])
            .env("TMPDIR", tmp.path())
            .output()
            .unwrap()
    };
    doctor();
    assert_eq!(run_dirs().len(), 1, "doctor removed a live run's directory");
    cli.0.kill().unwrap();
    cli.0.wait().unwrap();
    let left = run_dirs();
    assert_eq!(left.len(), 1, "SIGKILL leaves the directory behind");
    let out = doctor();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let check = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "stale-run-dirs")
        .cloned()
        .unwrap();
    let detail = check["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("removed 1") && detail.contains(&*left[0].to_string_lossy()),
        "{check}"
    );
    assert!(
        run_dirs().is_empty(),
        "the dead run's directory is still there"
    );
}

/// A VM start that waits for a golden snapshot another process holds says so on stderr,
/// naming the snapshot and the holder (#34 6.9). The test holds every snapshot lock itself.
#[test]
fn a_wait_for_another_process_golden_snapshot_is_told() {
    if guest_image().is_none() {
        return;
    }
    // The golden snapshot of a 128 MiB VM exists after this.
    let warm = Command::new(VOIDBOX)
        .args(["run", "--memory-mb", "128", "--", "true"])
        .output()
        .unwrap();
    assert!(warm.status.success(), "{warm:?}");
    use voidbox::snapshot::store::{LockMode, Store};
    let store = Store::open(None).unwrap();
    let locks = voidbox::image::Cache::default_root()
        .unwrap()
        .join("snapshots/locks");
    let held: Vec<_> = std::fs::read_dir(&locks)
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let key = name.strip_suffix(".lock")?;
            let l = store.lock(key, LockMode::Exclusive, true).ok()??;
            l.record_holder();
            Some(l)
        })
        .collect();
    assert!(!held.is_empty(), "no snapshot lock in {}", locks.display());
    let mut cli = voidbox_tests::KillOnDrop(
        Command::new(VOIDBOX)
            .args(["run", "--memory-mb", "128", "--", "true"])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut err = BufReader::new(cli.0.stderr.take().unwrap());
    let seen = voidbox_tests::read_until(&mut err, |s| s.contains("waiting for snapshot"));
    drop(held);
    assert!(
        seen.contains(&format!("process {} (", std::process::id()))
            && seen.contains("holds its lock"),
        "{seen}"
    );
    assert!(cli.0.wait().unwrap().success());
}

/// A standalone VMM from another build next to the binary is refused before any VM starts:
/// exit 3, both build ids and the fix named. (A copy of the test binary and of its VMM, the
/// VMM's build id rewritten.)
#[test]
fn a_standalone_vmm_from_another_build_is_refused() {
    if guest_image().is_none() {
        return;
    }
    let ours = voidbox_vmm::build_id::BUILD_ID;
    let other: String = ours
        .chars()
        .rev()
        .enumerate()
        .map(|(i, c)| {
            if i < 4 {
                if c == '0' {
                    '1'
                } else {
                    '0'
                }
            } else {
                c
            }
        })
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    assert_eq!(other.len(), ours.len());
    assert_ne!(other, ours);
    let dir = tempfile::tempdir().unwrap();
    let voidbox = dir.path().join("voidbox");
    std::fs::copy(VOIDBOX, &voidbox).unwrap();
    let mut vmm = std::fs::read(format!("{VOIDBOX}-vmm")).unwrap();
    let mut n = 0;
    let mut i = 0;
    while let Some(at) = memchr::memmem::find(&vmm[i..], ours.as_bytes()) {
        vmm[i + at..i + at + ours.len()].copy_from_slice(other.as_bytes());
        i += at + ours.len();
        n += 1;
    }
    assert!(n >= 1, "build id not found in the VMM binary");
    let vmm_path = dir.path().join("voidbox-vmm");
    std::fs::write(&vmm_path, &vmm).unwrap();
    std::fs::set_permissions(
        &vmm_path,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    assert_eq!(
        voidbox_vmm::build_id::read_from_file(&vmm_path)
            .unwrap()
            .as_deref(),
        Some(other.as_str())
    );
    let t0 = Instant::now();
    let out = Command::new(&voidbox)
        .args(["run", "--memory-mb", "128", "--", "true"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "stderr: {stderr}");
    for needle in [
        ours,
        other.as_str(),
        &vmm_path.display().to_string(),
        "not from this voidbox's build",
        "install voidbox and voidbox-vmm from one release",
    ] {
        assert!(stderr.contains(needle), "{needle:?} not in: {stderr}");
    }
    eprintln!("refused in {:?}", t0.elapsed());
    // Without the standalone VMM the same binary runs its own `__vmm` mode.
    let doctor = Command::new(&voidbox)
        .args(["doctor", "--format", "json"])
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&doctor.stdout);
    assert!(report.contains("not from this voidbox's build"), "{report}");
    std::fs::remove_file(&vmm_path).unwrap();
    let doctor = Command::new(&voidbox)
        .args(["doctor", "--format", "json"])
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&doctor.stdout);
    assert!(
        report.contains("no standalone VMM next to this binary"),
        "{report}"
    );
}
