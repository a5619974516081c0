//! The VMM child process: launching (the standalone `voidbox-vmm` next to this binary when
//! it is there and from the same build, else a re-exec of this binary in its hidden VMM
//! mode, or an explicit program), configuration over a pipe, status and log readers, reaping.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use voidbox_vmm::config::VmConfig;

use super::error::{SandboxError, VmmExit};
use super::status::{self, SharedLog, StatusLog, TimedEvent, VmmEvent};

/// Hidden `voidbox` subcommand that runs the VMM in the current process.
pub const VMM_SUBCOMMAND: &str = "__vmm";
/// Environment variable naming a `voidbox-vmm` binary to use instead of re-exec.
pub const VMM_ENV: &str = "VOIDBOX_VMM";
/// VMM stderr lines kept for error messages.
const STDERR_TAIL_LINES: usize = 20;
/// Console lines read back from the log when the VMM did not report any.
const CONSOLE_TAIL_LINES: usize = 64;

/// Appended to the running executable's file name to name its standalone VMM: `voidbox`
/// runs `voidbox-vmm` from its own directory (the test build `voidbox-under-test` runs
/// `voidbox-under-test-vmm`).
pub const STANDALONE_SUFFIX: &str = "-vmm";

/// How the VMM process is started.
#[derive(Debug, Clone, Default)]
pub enum VmmLauncher {
    /// The program [`vmm_program`] picks: `$VOIDBOX_VMM`, else the standalone VMM next to
    /// this executable, else this executable with [`VMM_SUBCOMMAND`] (its `main` must
    /// dispatch it, as `voidbox` does). A standalone VMM from another build is refused
    /// ([`check_same_build`]).
    #[default]
    CurrentExe,
    /// An explicit program and leading arguments (e.g. `voidbox __vmm`, `voidbox-vmm`),
    /// started as given (no build check).
    Program {
        /// Executable.
        path: PathBuf,
        /// Arguments before `--parent-pid`.
        args: Vec<String>,
    },
}

/// The VMM program a [`VmmLauncher::CurrentExe`] launch runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VmmProgram {
    /// A standalone `voidbox-vmm` binary.
    Standalone {
        /// Its path.
        path: PathBuf,
        /// Named by `$VOIDBOX_VMM` (else found next to this executable).
        from_env: bool,
    },
    /// This executable in its hidden [`VMM_SUBCOMMAND`] mode (no standalone VMM next to it).
    Embedded {
        /// What is executed: `/proc/self/exe` where there is one.
        exe: PathBuf,
    },
}

impl VmmProgram {
    /// One line for `voidbox doctor`: which program and why.
    pub fn describe(&self) -> String {
        match self {
            VmmProgram::Standalone {
                path,
                from_env: true,
            } => format!("{} (from ${VMM_ENV})", path.display()),
            VmmProgram::Standalone { path, .. } => {
                format!(
                    "{} (the standalone VMM next to this binary)",
                    path.display()
                )
            }
            VmmProgram::Embedded { .. } => {
                format!("`voidbox {VMM_SUBCOMMAND}` (no standalone VMM next to this binary)")
            }
        }
    }
}

/// Picks the VMM program, by one rule with no fallback: `$VOIDBOX_VMM` when set; else
/// `<dir>/<name>-vmm` when that file exists, where `<dir>/<name>` is this executable (its
/// real path, symlinks resolved); else this executable's hidden [`VMM_SUBCOMMAND`] mode.
pub fn vmm_program() -> Result<VmmProgram, SandboxError> {
    if let Some(p) = std::env::var_os(VMM_ENV) {
        return Ok(VmmProgram::Standalone {
            path: PathBuf::from(p),
            from_env: true,
        });
    }
    let exe = std::env::current_exe().map_err(|e| {
        SandboxError::Environment(format!("cannot locate the voidbox executable: {e}"))
    })?;
    if let Some(sibling) = standalone_next_to(&exe) {
        if sibling.is_file() {
            return Ok(VmmProgram::Standalone {
                path: sibling,
                from_env: false,
            });
        }
    }
    // This very executable, even when its file was replaced or removed since it started (an
    // upgrade, or a rebuild, during a run): the forked child execs `/proc/self/exe`, its
    // parent's inode. Elsewhere: the path it was run from.
    let proc_exe = Path::new("/proc/self/exe");
    Ok(VmmProgram::Embedded {
        exe: if proc_exe.exists() {
            proc_exe.to_path_buf()
        } else {
            exe
        },
    })
}

/// `<dir>/<name>-vmm` for the executable `<dir>/<name>` (a removed executable's
/// ` (deleted)` suffix, as `/proc/self/exe` shows it, dropped).
pub fn standalone_next_to(exe: &Path) -> Option<PathBuf> {
    let name = exe.file_name()?.to_str()?;
    let name = name.strip_suffix(" (deleted)").unwrap_or(name);
    Some(exe.with_file_name(format!("{name}{STANDALONE_SUFFIX}")))
}

/// Refuses (an environment error: exit code 3) a standalone VMM whose build id is not this
/// binary's: the two could disagree on the config, control, status and snapshot formats.
/// Reads the id from the file's ELF section ([`voidbox_vmm::build_id`]); runs nothing.
pub fn check_same_build(path: &Path, from_env: bool) -> Result<(), SandboxError> {
    let ours = voidbox_vmm::build_id::build_id();
    let theirs = voidbox_vmm::build_id::read_from_file(path);
    if matches!(&theirs, Ok(Some(id)) if id == ours) {
        return Ok(());
    }
    let what = match &theirs {
        Ok(Some(id)) => format!("build id {id}"),
        Ok(None) => "no build id: older than the same-build check, or not a voidbox VMM".into(),
        Err(e) => format!("no readable build id: {e}"),
    };
    let remove = if from_env {
        format!("or unset ${VMM_ENV}")
    } else {
        format!(
            "or remove {} to run the VMM inside this binary (`{VMM_SUBCOMMAND}`)",
            path.display()
        )
    };
    Err(SandboxError::Environment(format!(
        "the standalone VMM {} is not from this voidbox's build ({what}; this voidbox is \
         build {ours}): install voidbox and voidbox-vmm from one release or one \
         `cargo build --release`, {remove}",
        path.display()
    )))
}

/// The only variables a VMM process inherits: it needs none of the rest, and the rest may
/// hold secrets (an LLM API key for the credential gateway, registry credentials).
/// `VOIDBOX_TEST_TAG` labels processes so the test suite can find leaked VMMs.
const VMM_ENV_KEEP: [&str; 6] = [
    "PATH",
    "VOIDBOX_TEST_TAG",
    "VOIDBOX_VMM_LOG",
    "RUST_BACKTRACE",
    "RUST_LIB_BACKTRACE",
    "TZ",
];

impl VmmLauncher {
    fn command(&self) -> Result<Command, SandboxError> {
        let mut c = self.program()?;
        c.env_clear();
        for k in VMM_ENV_KEEP {
            if let Some(v) = std::env::var_os(k) {
                c.env(k, v);
            }
        }
        Ok(c)
    }

    fn program(&self) -> Result<Command, SandboxError> {
        match self {
            VmmLauncher::Program { path, args } => {
                let mut c = Command::new(path);
                c.args(args);
                Ok(c)
            }
            VmmLauncher::CurrentExe => {
                let mut c = match vmm_program()? {
                    VmmProgram::Standalone { path, from_env } => {
                        check_same_build(&path, from_env)?;
                        Command::new(path)
                    }
                    VmmProgram::Embedded { exe } => Command::new(exe),
                };
                // The standalone VMM takes (and ignores) the marker too, so every VMM process
                // shows it in its command line (`kill_vmm_children` finds them by it).
                c.arg(VMM_SUBCOMMAND);
                Ok(c)
            }
        }
    }
}

/// Runs the VMM in this process (the hidden `voidbox __vmm` mode); never returns.
pub fn run_vmm_mode(args: Vec<String>) -> ! {
    voidbox_vmm::entry::main_with_args(args)
}

type SpawnJob = (Command, mpsc::Sender<std::io::Result<Child>>);

/// Spawns children from one long-lived thread: the VMM's `PR_SET_PDEATHSIG` fires when
/// the *thread* that forked it exits, so forking from short-lived (e.g. blocking-pool)
/// threads would kill healthy VMs.
fn spawn_from_stable_thread(cmd: Command) -> std::io::Result<Child> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnJob>>> = OnceLock::new();
    let tx = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnJob>();
        let _ = std::thread::Builder::new()
            .name("voidbox-vmm-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
            });
        Mutex::new(tx)
    });
    let (rtx, rrx) = mpsc::channel();
    let sent = tx
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .send((cmd, rtx));
    if sent.is_err() {
        return Err(std::io::Error::other("VMM spawner thread is gone"));
    }
    rrx.recv()
        .unwrap_or_else(|_| Err(std::io::Error::other("VMM spawner thread is gone")))
}

/// A running (or exited, not yet dropped) VMM child process.
pub struct VmmProcess {
    child: Child,
    spawned_at: Instant,
    status: SharedLog,
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
    threads: Vec<JoinHandle<()>>,
    exit: Option<ExitStatus>,
    console_log: PathBuf,
    control: Option<ChildStdin>,
}

impl VmmProcess {
    /// Starts the VMM and hands it `config` as the first line of its stdin pipe. With
    /// `config.snapshot_control` the pipe stays open for [`VmmProcess::send_control`];
    /// otherwise it is closed at once.
    pub fn spawn(launcher: &VmmLauncher, config: &VmConfig) -> Result<VmmProcess, SandboxError> {
        let json = serde_json::to_vec(config)
            .map_err(|e| SandboxError::Environment(format!("VMM config: {e}")))?;
        let mut cmd = launcher.command()?;
        cmd.arg("--parent-pid")
            .arg(std::process::id().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let spawned_at = Instant::now();
        let mut child = spawn_from_stable_thread(cmd)
            .map_err(|e| SandboxError::Environment(format!("cannot start the VMM process: {e}")))?;
        let status = Arc::new(StatusLog::default());
        let stderr_tail = Arc::new(Mutex::new(VecDeque::new()));
        let mut threads = Vec::new();
        if let Some(out) = child.stdout.take() {
            let log = Arc::clone(&status);
            threads.push(std::thread::spawn(move || status::pump(out, &log)));
        } else {
            status.close();
        }
        if let Some(err) = child.stderr.take() {
            let tail = Arc::clone(&stderr_tail);
            threads.push(std::thread::spawn(move || pump_stderr(err, &tail)));
        }
        let mut vmm = VmmProcess {
            child,
            spawned_at,
            status,
            stderr_tail,
            threads,
            exit: None,
            console_log: config.console_log.clone(),
            control: None,
        };
        if let Some(mut stdin) = vmm.child.stdin.take() {
            // A VMM that dies before reading its config shows up as an exit below.
            let mut line = json;
            line.push(b'\n');
            if stdin.write_all(&line).is_ok() && config.snapshot_control {
                vmm.control = Some(stdin);
            }
        }
        Ok(vmm)
    }

    /// Sends one control command (a JSON value, written as one line) to a VMM started with
    /// `snapshot_control`.
    pub fn send_control(&mut self, command: &serde_json::Value) -> Result<(), SandboxError> {
        let Some(pipe) = self.control.as_mut() else {
            return Err(SandboxError::Environment(
                "this VMM was not started with a control channel".into(),
            ));
        };
        let mut line = serde_json::to_vec(command)
            .map_err(|e| SandboxError::Environment(format!("VMM control command: {e}")))?;
        line.push(b'\n');
        pipe.write_all(&line)
            .and_then(|()| pipe.flush())
            .map_err(SandboxError::io("writing to the VMM control channel"))
    }

    /// The status log (events so far and waiting for new ones).
    pub fn status(&self) -> &StatusLog {
        &self.status
    }

    /// The VMM's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// When the process was spawned.
    pub fn spawned_at(&self) -> Instant {
        self.spawned_at
    }

    /// Status events so far.
    pub fn events(&self) -> Vec<TimedEvent> {
        self.status.events()
    }

    /// The exit status, if the process has exited (reaps it).
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none() {
            self.exit = self.child.try_wait().ok().flatten();
        }
        self.exit
    }

    /// Waits up to `timeout` for the process to exit.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.try_wait() {
                return Some(s);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// SIGKILLs the process (if still running) and reaps it.
    pub fn kill(&mut self) -> Option<ExitStatus> {
        if self.try_wait().is_none() {
            let _ = self.child.kill();
            self.exit = self.child.wait().ok();
        }
        self.exit
    }

    /// Resident set size of the VMM process in KiB (from `/proc`), while it runs.
    pub fn rss_kib(&self) -> Option<u64> {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).ok()?;
        s.lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
    }

    /// What the exited process reported: status, `exited` event, console and log tails.
    /// Call after the process has exited (it waits briefly for the status stream).
    pub fn exit_report(&mut self) -> VmmExit {
        let status = self.try_wait();
        self.status.wait_closed(Duration::from_millis(500));
        let mut exit = VmmExit {
            code: status.and_then(|s| s.code()),
            signal: status.and_then(|s| std::os::unix::process::ExitStatusExt::signal(&s)),
            ..VmmExit::default()
        };
        if let Some(VmmEvent::Exited {
            reason,
            detail,
            console_tail,
            ..
        }) = self.status.exited()
        {
            exit.reason = Some(reason);
            exit.detail = detail;
            exit.console_tail = console_tail;
        }
        if exit.console_tail.is_empty() {
            exit.console_tail = console_tail(&self.console_log, CONSOLE_TAIL_LINES);
        }
        exit.net_denials = self.status.net_denials();
        exit.net_inbound = self.status.net_inbound();
        exit.stderr_tail = self
            .stderr_tail
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .cloned()
            .collect();
        exit
    }
}

impl Drop for VmmProcess {
    fn drop(&mut self) {
        self.kill();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn pump_stderr(r: impl Read, tail: &Mutex<VecDeque<String>>) {
    let mut r = BufReader::new(r);
    let mut line = Vec::new();
    loop {
        line.clear();
        match r.by_ref().take(4096).read_until(b'\n', &mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        let text = String::from_utf8_lossy(&line).trim_end().to_string();
        let mut t = tail.lock().unwrap_or_else(|e| e.into_inner());
        if t.len() == STDERR_TAIL_LINES {
            t.pop_front();
        }
        t.push_back(text);
    }
}

/// The last `n` lines of a console log (reads at most its last 64 KiB).
pub fn console_tail(path: &Path, n: usize) -> Vec<String> {
    let Ok(mut f) = std::fs::File::open(path) else {
        return Vec::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let start = len.saturating_sub(64 * 1024);
    if f.seek(SeekFrom::Start(start)).is_err() {
        return Vec::new();
    }
    let mut buf = Vec::new();
    if f.take(64 * 1024).read_to_end(&mut buf).is_err() {
        return Vec::new();
    }
    let text = String::from_utf8_lossy(&buf);
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let skip = lines.len().saturating_sub(n);
    lines[skip..]
        .iter()
        .map(|l| l.trim_end_matches('\r').to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn console_tail_reads_last_lines() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("console.log");
        let text: String = (0..100).map(|i| format!("line {i}\r\n")).collect();
        std::fs::write(&p, text).unwrap();
        let t = console_tail(&p, 3);
        assert_eq!(t, vec!["line 97", "line 98", "line 99"]);
        assert!(console_tail(&dir.path().join("missing"), 3).is_empty());
    }

    #[test]
    fn the_standalone_vmm_is_named_after_the_executable() {
        let n = |p: &str| standalone_next_to(Path::new(p)).unwrap();
        assert_eq!(
            n("/opt/vb/bin/voidbox"),
            Path::new("/opt/vb/bin/voidbox-vmm")
        );
        assert_eq!(
            n("/t/voidbox-under-test"),
            Path::new("/t/voidbox-under-test-vmm")
        );
        assert_eq!(
            n("/usr/bin/voidbox (deleted)"),
            Path::new("/usr/bin/voidbox-vmm")
        );
    }

    #[test]
    fn the_same_build_check() {
        // This test binary links the VMM crate: it carries this build's id.
        let me = std::env::current_exe().unwrap();
        check_same_build(&me, false).unwrap();
        let Err(SandboxError::Environment(e)) = check_same_build(Path::new("/bin/sh"), false)
        else {
            panic!("a binary without a build id was accepted")
        };
        assert!(
            e.contains("no build id") && e.contains("remove /bin/sh"),
            "{e}"
        );
        assert!(e.contains(voidbox_vmm::build_id::BUILD_ID), "{e}");
        let Err(SandboxError::Environment(e)) = check_same_build(Path::new("/nonexistent"), true)
        else {
            panic!("a missing file was accepted")
        };
        assert!(e.contains("unset $VOIDBOX_VMM"), "{e}");
    }

    #[test]
    fn a_vmm_that_cannot_start_is_an_environment_error() {
        let cfg = VmConfig {
            kernel: "/nonexistent".into(),
            initramfs: None,
            cmdline_extra: String::new(),
            memory_mb: 64,
            vcpus: 1,
            vsock_uds: None,
            vsock_cid: 3,
            console_log: "/nonexistent/console.log".into(),
            compat: false,
            boot_timeout_ms: None,
            wall_limit_ms: None,
            test_forbidden_syscall: false,
            image_hash: String::new(),
            snapshot_control: false,
            restore: None,
            restore_base: None,
            restore_grant: None,
            disks: Vec::new(),
            network: None,
            shares: Vec::new(),
            share_slots: false,
        };
        let l = VmmLauncher::Program {
            path: "/nonexistent/voidbox".into(),
            args: vec![],
        };
        assert!(matches!(
            VmmProcess::spawn(&l, &cfg),
            Err(SandboxError::Environment(_))
        ));
    }
}
