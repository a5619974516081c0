//! The engine's `Sandbox` on real micro-VMs: authentication, exec, files, and cleanup.
//! One test in this binary, so the fd and child-process counts are its own.

use std::time::Duration;

use voidbox::sandbox::guest::{try_connect, AGENT_PORT};
use voidbox::sandbox::{GuestConn, Sandbox, SandboxError};
use voidbox_protocol::{ExecRequest, OutputStream, SessionSecret};
const VOIDBOX: &str = env!("CARGO_BIN_EXE_voidbox-under-test");

use voidbox_tests::vm::{child_pids, guest_image, open_fds, sandbox_config};

fn echo(sb: &mut Sandbox, text: &str) -> (String, Option<i32>) {
    let mut out = Vec::new();
    let r = sb
        .exec(
            ExecRequest {
                program: "echo".into(),
                args: vec![text.into()],
                ..ExecRequest::default()
            },
            &mut |s, d| {
                if s == OutputStream::Stdout {
                    out.extend_from_slice(d)
                }
            },
        )
        .unwrap();
    (String::from_utf8_lossy(&out).into_owned(), r.exit_code)
}

#[test]
fn three_sequential_vms_authenticate_run_and_leave_nothing_behind() {
    // It counts this process's children and descriptors: alone in a process of its own.
    if !voidbox_tests::in_own_process(
        "vm_sandbox::three_sequential_vms_authenticate_run_and_leave_nothing_behind",
    ) {
        return;
    }
    let Some(image) = guest_image() else { return };
    let runtime = tempfile::tempdir().unwrap();
    let mut cfg = sandbox_config(image, VOIDBOX);
    cfg.runtime_dir = Some(runtime.path().to_path_buf());
    let fds_before = open_fds();
    let me = std::process::id();

    for round in 0..3 {
        let mut sb = Sandbox::start(&cfg).unwrap_or_else(|e| panic!("VM {round}: {e}"));
        assert_eq!(child_pids(me), vec![sb.vmm_pid()]);
        if round == 0 {
            // A second connection with another secret is refused by the guest agent…
            let s = try_connect(sb.vsock_path(), AGENT_PORT, Duration::from_secs(30))
                .unwrap()
                .expect("the guest accepts connections");
            let wrong = SessionSecret::random().unwrap();
            assert!(matches!(
                GuestConn::handshake(s, &wrong, None, Duration::from_secs(60)),
                Err(SandboxError::AuthRejected)
            ));
            // …while the authenticated one keeps working, files included.
            sb.write_file("/workspace/note.txt", b"hello file\n", None)
                .unwrap();
            let back = sb.read_file("/workspace/note.txt", 1 << 20).unwrap();
            assert_eq!(back, b"hello file\n");
            assert!(sb.ping().unwrap() < Duration::from_secs(10));
        }
        let (out, code) = echo(&mut sb, &format!("vm {round}"));
        assert_eq!(
            (out.as_str(), code),
            (format!("vm {round}\n").as_str(), Some(0))
        );
        let exit = sb.stop();
        assert!(exit.code.is_some() || exit.signal.is_some(), "{exit}");
    }

    assert!(
        child_pids(me).is_empty(),
        "VMM processes left: {:?}",
        child_pids(me)
    );
    assert_eq!(open_fds(), fds_before, "file descriptors leaked");
    let left: Vec<_> = std::fs::read_dir(runtime.path())
        .unwrap()
        .flatten()
        .collect();
    assert!(left.is_empty(), "per-VM dirs left: {left:?}");
}
