//! Helpers for the real-VM tests (`tests/tests/vm_*.rs`).
//!
//! They need a usable `/dev/kvm` and the guest image. Without KVM they fail loudly unless
//! `VOIDBOX_SKIP_VM_TESTS=1`; a missing image is built on first use (minutes; CI builds it
//! before `cargo test`).

use std::path::PathBuf;
use std::time::Duration;

use voidbox::image::ProgressMode;
use voidbox::sandbox::{check_kvm, GuestImage, Sandbox, SandboxConfig, SandboxError};
use voidbox::sandbox::{VmmLauncher, VMM_SUBCOMMAND};
use voidbox_protocol::{ExecRequest, OutputStream};

/// The guest image, or `None` when VM tests are skipped (`VOIDBOX_SKIP_VM_TESTS=1`).
/// Panics when KVM is unusable or the image cannot be built.
pub fn guest_image() -> Option<GuestImage> {
    if std::env::var("VOIDBOX_SKIP_VM_TESTS").as_deref() == Ok("1") {
        eprintln!("VOIDBOX_SKIP_VM_TESTS=1: skipping a real-VM test");
        return None;
    }
    if let Err(e) = check_kvm() {
        panic!("real-VM tests need KVM: {e}\n(set VOIDBOX_SKIP_VM_TESTS=1 to skip them)");
    }
    match GuestImage::ensure(ProgressMode::Plain) {
        Ok(i) => Some(i),
        Err(e) => panic!("real-VM tests need the guest image: {e}"),
    }
}

/// A sandbox config that starts the VMM as `<voidbox> __vmm` (pass
/// `env!("CARGO_BIN_EXE_voidbox-under-test")`; the test binary itself has no VMM mode), with generous deadlines for a loaded, interpreting host.
pub fn sandbox_config(image: GuestImage, voidbox: &str) -> SandboxConfig {
    let mut c = SandboxConfig::new(image);
    c.memory_mb = 128;
    c.launcher = VmmLauncher::Program {
        path: PathBuf::from(voidbox),
        args: vec![VMM_SUBCOMMAND.to_string()],
    };
    c.boot_timeout = Duration::from_secs(180);
    c.wall_limit = Some(Duration::from_secs(600));
    c
}

/// Pids of this process's children (from `/proc`).
pub fn child_pids(parent: u32) -> Vec<u32> {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| {
                    // `pid (comm) state ppid …`; comm may contain spaces.
                    let rest = &s[s.rfind(')')? + 2..];
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(parent)
        })
        .collect()
}

/// Open file descriptors of this process.
pub fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// Runs `sh -c SCRIPT` in `sb`: its (stdout, stderr, exit code), or why it could not run.
pub fn sh(sb: &mut Sandbox, script: &str) -> Result<(String, String, Option<i32>), SandboxError> {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let r = sb.exec(
        ExecRequest {
            program: "sh".into(),
            args: vec!["-c".into(), script.into()],
            ..ExecRequest::default()
        },
        &mut |s, d| match s {
            OutputStream::Stdout => out.extend_from_slice(d),
            OutputStream::Stderr => err.extend_from_slice(d),
        },
    )?;
    Ok((
        String::from_utf8_lossy(&out).into_owned(),
        String::from_utf8_lossy(&err).into_owned(),
        r.exit_code,
    ))
}
