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
