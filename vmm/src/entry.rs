//! The VMM process entry point ([`main_with_args`]), shared by the `voidbox-vmm` binary and
//! the engine's hidden `voidbox __vmm` mode (so an installed `voidbox` is self-contained).
//!
//! Reads a JSON [`VmConfig`] as the first line of `--config-fd` (default: stdin; up to `\n`
//! or EOF), reports progress as JSON lines on `--status-fd` (default: stdout) and exits with
//! a code from [`ExitCode`] (see `vmm/README.md`). With `snapshot_control`, the rest of the
//! config fd is the control channel ([`crate::control`]).

use std::fs::File;
use std::os::unix::io::FromRawFd;
use std::time::{Duration, Instant};

use crate::config::VmConfig;
use crate::control::{Line, LineReader};
use crate::exit::ExitCode;
use crate::status::StatusWriter;
use crate::vm::{Deadlines, Vm};
use serde_json::json;

const MAX_CONFIG_BYTES: usize = 1 << 20;

struct Args {
    config_fd: i32,
    status_fd: i32,
    parent_pid: Option<i32>,
}

fn parse_args(args: Vec<String>) -> Result<Args, String> {
    let mut a = Args {
        config_fd: 0,
        status_fd: 1,
        parent_pid: None,
    };
    let mut it = args.into_iter();
    while let Some(flag) = it.next() {
        let mut num = |name: &str| -> Result<i32, String> {
            it.next()
                .and_then(|v| v.parse::<i32>().ok())
                .filter(|v| *v >= 0)
                .ok_or_else(|| format!("{name} needs a non-negative integer"))
        };
        match flag.as_str() {
            "--config-fd" => a.config_fd = num("--config-fd")?,
            "--status-fd" => a.status_fd = num("--status-fd")?,
            "--parent-pid" => a.parent_pid = Some(num("--parent-pid")?),
            // The engine's marker: every VMM process it starts, `voidbox __vmm` or this
            // standalone binary, has it in its command line (how it finds its VMM children).
            "__vmm" => {}
            "--build-id" => {
                println!("{}", crate::build_id::build_id());
                std::process::exit(0);
            }
            "--version" => {
                println!("voidbox-vmm {}", env!("CARGO_PKG_VERSION"));
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    Ok(a)
}

/// Takes ownership of an inherited fd, checking that it is open.
fn take_fd(fd: i32) -> Option<File> {
    // SAFETY: F_GETFD only queries the descriptor flags; it has no side effects.
    if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return None;
    }
    // SAFETY: the fd is open (checked above) and was handed to us by the parent; nothing
    // else in this process owns it.
    Some(unsafe { File::from_raw_fd(fd) })
}

/// Closes every inherited fd except stdio and `keep`.
fn close_other_fds(keep: &[i32]) {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    let fds: Vec<i32> = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|fd| *fd > 2 && !keep.contains(fd))
        .collect();
    for fd in fds {
        // SAFETY: closing descriptors inherited from the parent that no Rust object owns
        // (the read_dir fd is already closed when the iterator is dropped; EBADF is harmless).
        unsafe { libc::close(fd) };
    }
}

fn die_with_parent(expected: Option<i32>) -> Result<(), String> {
    // SAFETY: getppid has no preconditions.
    let before = unsafe { libc::getppid() };
    // SAFETY: PR_SET_PDEATHSIG with a valid signal number.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) } != 0 {
        return Err(format!(
            "PR_SET_PDEATHSIG: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: getppid has no preconditions.
    let now = unsafe { libc::getppid() };
    let want = expected.unwrap_or(before);
    if now != want || now == 1 {
        return Err("parent process is gone".into());
    }
    Ok(())
}

fn no_new_privs() -> Result<(), String> {
    // SAFETY: PR_SET_NO_NEW_PRIVS with the documented arguments.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(format!(
            "PR_SET_NO_NEW_PRIVS: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

fn finish(
    status: &StatusWriter,
    code: ExitCode,
    reason: &str,
    detail: Option<String>,
    tail: Vec<String>,
) -> ! {
    status.emit(&json!({
        "event": "exited",
        "reason": reason,
        "code": code.code(),
        "detail": detail,
        "console_tail": tail,
    }));
    std::process::exit(code.code());
}

/// Runs one VM in this process and exits: the whole `voidbox-vmm` program. `args` are the
/// arguments after the program name (`--config-fd`, `--status-fd`, `--parent-pid`).
/// Call it from a single-threaded process (seccomp and fd closing assume nothing else runs).
pub fn main_with_args(args: Vec<String>) -> ! {
    let t0 = Instant::now();
    let level = match std::env::var("VOIDBOX_VMM_LOG").as_deref() {
        Ok("debug") => log::LevelFilter::Debug,
        Ok("info") => log::LevelFilter::Info,
        Ok("error") => log::LevelFilter::Error,
        _ => log::LevelFilter::Warn,
    };
    crate::logger::init(level);

    let args = match parse_args(args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("voidbox-vmm: {e}");
            std::process::exit(ExitCode::Config.code());
        }
    };
    let Some(status_file) = take_fd(args.status_fd) else {
        eprintln!("voidbox-vmm: status fd {} is not open", args.status_fd);
        std::process::exit(ExitCode::Config.code());
    };
    let status = StatusWriter::new(status_file);

    if let Err(e) = die_with_parent(args.parent_pid) {
        finish(&status, ExitCode::Internal, "parent_gone", Some(e), vec![]);
    }
    if let Err(e) = no_new_privs() {
        finish(&status, ExitCode::Internal, "prctl_failed", Some(e), vec![]);
    }

    let (cfg, reader) = read_config(args.config_fd, &status);
    // Without a control channel the config fd is done with (the engine may keep its end open).
    let control = cfg.snapshot_control.then_some(reader);
    let mut keep = vec![args.status_fd];
    if control.is_some() {
        keep.push(args.config_fd);
    }
    close_other_fds(&keep);
    // SAFETY: getpid has no preconditions.
    status.emit(&json!({"event": "started", "pid": unsafe { libc::getpid() }}));

    let vm = build_vm(&cfg, &status);
    if let Some(r) = vm.restored {
        status.emit(&json!({
            "event": "restored",
            "restore_us": r.restore.as_micros() as u64,
            "verify_us": r.verify.as_micros() as u64,
        }));
    }
    status.emit(&json!({
        "event": "configured",
        "setup_us": vm.setup_time.as_micros() as u64,
        "cmdline_len": vm.cmdline.len(),
    }));
    let running = match vm.spawn(control, &status) {
        Ok(r) => r,
        Err(e) => finish(
            &status,
            e.exit_code(),
            "setup_error",
            Some(e.to_string()),
            vec![],
        ),
    };
    if let Err(e) = running.install_seccomp(cfg.snapshot_control) {
        finish(
            &status,
            ExitCode::Setup,
            "seccomp_error",
            Some(e.to_string()),
            vec![],
        );
    }
    if cfg.test_forbidden_syscall {
        // Test hook: socket(2) is outside the main thread's filter — even the very call the
        // net thread of a VM with network may make — so the kernel kills us with SIGSYS.
        // SAFETY: plain syscall with constant arguments; it is expected never to return.
        unsafe {
            libc::socket(
                libc::AF_INET,
                libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                libc::IPPROTO_TCP,
            )
        };
    }
    status.emit(&json!({"event": "booting", "ms": t0.elapsed().as_millis() as u64}));
    running.release();

    let deadlines = Deadlines {
        boot: cfg.boot_timeout_ms.map(Duration::from_millis),
        wall: cfg.wall_limit_ms.map(Duration::from_millis),
    };
    let outcome = running.wait_outcome(deadlines, &status);
    running.kick_all();
    running.flush_console();
    running.close_net_report();
    let tail = running.console_tail();
    let code = outcome.exit_code();
    let tail = if code == ExitCode::Clean {
        vec![]
    } else {
        tail
    };
    finish(&status, code, outcome.reason(), outcome.detail(), tail);
}

/// Reads the VM config (one JSON line) from `config_fd`; anything wrong with it ends the
/// process with a `config_error` status. Returns the config and the reader (the snapshot
/// control channel, when the config asks for one).
fn read_config(config_fd: i32, status: &StatusWriter) -> (VmConfig, LineReader<std::fs::File>) {
    let Some(cfg_file) = take_fd(config_fd) else {
        finish(
            status,
            ExitCode::Config,
            "config_error",
            Some(format!("config fd {config_fd} is not open")),
            vec![],
        );
    };
    let mut reader = LineReader::new(cfg_file);
    let text = match reader.read_line(MAX_CONFIG_BYTES) {
        Ok(Line::Text(t)) => match String::from_utf8(t) {
            Ok(t) => t,
            Err(_) => finish(
                status,
                ExitCode::Config,
                "config_error",
                Some("config is not UTF-8".into()),
                vec![],
            ),
        },
        Ok(Line::Eof) => String::new(),
        Ok(Line::TooLong) => finish(
            status,
            ExitCode::Config,
            "config_error",
            Some(format!("config line longer than {MAX_CONFIG_BYTES} bytes")),
            vec![],
        ),
        Err(e) => finish(
            status,
            ExitCode::Config,
            "config_error",
            Some(format!("reading config: {e}")),
            vec![],
        ),
    };
    let cfg = match VmConfig::from_json(&text) {
        Ok(c) => c,
        Err(e) => finish(
            status,
            ExitCode::Config,
            "config_error",
            Some(e.to_string()),
            vec![],
        ),
    };
    (cfg, reader)
}

/// Builds the VM (or restores it); a failure ends the process with its status.
fn build_vm(cfg: &VmConfig, status: &StatusWriter) -> Vm {
    match Vm::build(cfg) {
        Ok(vm) => vm,
        Err(e) => {
            let code = e.exit_code();
            let reason = match code {
                ExitCode::KvmUnavailable => "kvm_unavailable",
                ExitCode::Config => "config_error",
                ExitCode::Snapshot => "snapshot_refused",
                _ => "setup_error",
            };
            finish(status, code, reason, Some(e.to_string()), vec![]);
        }
    }
}
