//! Regression test for random SIGSEGVs of guest processes under load (issue #10, item 0).
//!
//! Root cause: the compat guest kernel runs with `noxsave` and context-switches only the
//! FXSAVE state (x87, XMM0-15), while on a host that runs guest user code natively that code
//! ran under the host's XCR0 — AVX and AVX-512 enabled. glibc then used its AVX2/EVEX string
//! functions, and the upper YMM halves, XMM/YMM16-31 and opmask registers leaked from one
//! guest process to the next: a process preempted between a vector load and its store wrote
//! another process's bytes. The fix (kernel patch 0007 + the VMM's boot XCR0) makes the
//! hypervisor load the vCPU's own XCR0 = x87|SSE for the guest.
//!
//! `tests/guest/xstate-check.c` holds distinct patterns in the widest vector registers user
//! mode may use, in several processes at once, and fails if any changes under it. Before the
//! fix it failed in every process (XCR0 0xe7, AVX-512 registers overwritten).

use std::path::Path;
use std::process::Command;

use voidbox::sandbox::Sandbox;
use voidbox_protocol::{ExecRequest, OutputStream};
use voidbox_tests::vm::{guest_image, sandbox_config};

const VOIDBOX: &str = env!("CARGO_BIN_EXE_voidbox-under-test");

/// Compiles the checker as a static binary (no -mavx: only its asm touches the registers).
fn build_checker(dir: &Path) -> Vec<u8> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("guest/xstate-check.c");
    let out = dir.join("xstate-check");
    let st = Command::new("gcc")
        .args(["-O1", "-static", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .expect("gcc is needed to build the guest-side checker");
    assert!(st.success(), "gcc failed on {}", src.display());
    std::fs::read(&out).unwrap()
}

#[test]
fn guest_processes_keep_their_own_vector_registers() {
    let Some(image) = guest_image() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let checker = build_checker(tmp.path());
    let mut cfg = sandbox_config(image, VOIDBOX);
    cfg.runtime_dir = Some(tmp.path().to_path_buf());
    let mut sb = Sandbox::start(&cfg).expect("VM starts");
    sb.write_file("/workspace/xstate-check", &checker, Some(0o755))
        .expect("checker copied in");
    let mut out = Vec::new();
    let resp = sb
        .exec(
            ExecRequest {
                program: "/workspace/xstate-check".into(),
                args: vec!["3".into(), "20000000".into()],
                timeout_secs: Some(300),
                ..ExecRequest::default()
            },
            &mut |s, d| {
                if s == OutputStream::Stdout {
                    out.extend_from_slice(d)
                }
            },
        )
        .expect("exec");
    sb.stop();
    let out = String::from_utf8_lossy(&out);
    assert_eq!(
        (resp.exit_code, resp.signal),
        (Some(0), None),
        "vector registers leaked between guest processes:\n{out}{}",
        resp.error.unwrap_or_default()
    );
    assert!(out.contains("corrupted=0 died=0 of 3"), "{out}");
}
