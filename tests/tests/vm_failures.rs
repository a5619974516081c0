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
