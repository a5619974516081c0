//! `voidbox-guest-agent`: PID 1 of a voidbox micro-VM, or a host process for tests.

use std::process::ExitCode;

use voidbox_guest_agent::reaper::Reaper;
use voidbox_guest_agent::server::Agent;
use voidbox_guest_agent::{cli, init, log};

fn main() -> ExitCode {
    // SAFETY: getpid has no preconditions.
    let is_init = unsafe { libc::getpid() } == 1;
    if is_init {
        init::boot_mark("agent started");
        init::ensure_stdio();
        // A panic must never end PID 1 (the kernel would panic): log it; the thread dies.
        std::panic::set_hook(Box::new(|info| log!("panic: {info}")));
        // Before anything else touches the file system: on the system disk, `/` stays
        // read-only or becomes an overlay.
        init::prepare_root();
        init::boot_mark("root prepared");
    }
    // Before any other thread exists: every thread inherits the blocked SIGCHLD.
    if let Err(e) = Reaper::start() {
        log!("cannot start the reaper: {e}");
        if !is_init {
            return ExitCode::FAILURE;
        }
    }
    let config = if is_init {
        init::boot_mark("reaper started");
        let config = cli::guest_config();
        init::boot_mark("mounted, boot parameters read");
        voidbox_guest_agent::disks::attach(config)
    } else {
        let flags = match cli::parse_flags(std::env::args().skip(1)) {
            Ok(f) => f,
            Err(msg) => {
                eprintln!("{msg}");
                return ExitCode::from(2);
            }
        };
        voidbox_guest_agent::set_debug(flags.debug);
        // SAFETY: prctl with integer arguments: become the reaper of orphaned descendants
        // and die with the parent (tests must not leave agents behind).
        unsafe {
            libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0);
        }
        match cli::host_config(flags) {
            Ok(c) => c,
            Err(msg) => {
                log!("{msg}");
                return ExitCode::from(2);
            }
        }
    };
    let agent = Agent::new(config);
    if is_init {
        init::boot_mark("listening");
        init::log_boot_marks();
    }
    let Err(err) = agent.serve();
    log!("listener failed: {err}");
    if is_init {
        init::power_off(voidbox_guest_agent::cmdline::ShutdownMode::Reboot);
    }
    ExitCode::FAILURE
}
