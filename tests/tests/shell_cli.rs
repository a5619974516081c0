//! `voidbox shell` end to end on real micro-VMs, driven through a real terminal: a detached
//! `tmux` session (its own server socket) types into the host shell that starts voidbox
//! and reads the pane back. Each VM is restored from the 128 MiB golden snapshot (the
//! interactive agent's from a 2 GiB one with the runtimes disk). Needs `tmux`
//! (`apt-get install -y tmux`); see `voidbox_tests::vm` for skipping without KVM.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use voidbox_llm_script::{Script, Server, Turn};
use voidbox_oci::testing::{ImageBuilder, Registry};
use voidbox_tests::vm::{child_pids, guest_image};

const VOIDBOX: &str = env!("CARGO_BIN_EXE_voidbox-under-test");
/// A restore takes seconds here; a golden snapshot made on first use, a minute or more.
const GUEST_UP: Duration = Duration::from_secs(240);
const STEP: Duration = Duration::from_secs(60);
/// The guest shell's prompt (set with `-e PS1=…`).
const GUEST_PROMPT: &str = "vb>";

/// A tmux server of its own with one session `t`, running `sh` with a known prompt.
struct Tmux {
    dir: tempfile::TempDir,
    sock: PathBuf,
}

impl Tmux {
    fn start(cols: u16, rows: u16) -> Tmux {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("tmux.sock");
        let t = Tmux { dir, sock };
        let (x, y) = (cols.to_string(), rows.to_string());
        t.tmux(&[
            "-f",
            "/dev/null",
            "new-session",
            "-d",
            "-s",
            "t",
            "-x",
            &x,
            "-y",
            &y,
            "PS1='host$ ' exec sh",
        ]);
        t.wait_line(STEP, |l| l.starts_with("host$"));
        t
    }

    fn tmux(&self, args: &[&str]) -> String {
        let out = Command::new("tmux")
            .arg("-S")
            .arg(&self.sock)
            .args(args)
            .output()
            .unwrap_or_else(|e| {
                panic!("cannot run tmux ({e}); the shell tests need it: apt-get install -y tmux")
            });
        assert!(
            out.status.success(),
            "tmux {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Types `text` and Enter.
    fn line(&self, text: &str) {
        self.tmux(&["send-keys", "-t", "t", "-l", text]);
        self.tmux(&["send-keys", "-t", "t", "Enter"]);
    }

    /// The pane's lines (wrapped lines joined, trailing blanks trimmed).
    fn pane(&self) -> Vec<String> {
        self.tmux(&["capture-pane", "-p", "-J", "-t", "t"])
            .lines()
            .map(|l| l.trim_end().to_string())
            .collect()
    }

    /// Waits until a pane line matches `pred`; panics with the pane after `limit`.
    fn wait_line(&self, limit: Duration, pred: impl Fn(&str) -> bool) {
        self.wait(limit, |pane| pane.iter().any(|l| pred(l)));
    }

    /// Waits until the pane satisfies `pred`; panics with the pane after `limit`.
    fn wait(&self, limit: Duration, pred: impl Fn(&[String]) -> bool) {
        let t0 = Instant::now();
        loop {
            let pane = self.pane();
            if pred(&pane) {
                return;
            }
            if t0.elapsed() > limit {
                panic!("timed out after {limit:?}; pane:\n{}", pane.join("\n"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until a line equals `want`.
    fn wait_for(&self, want: &str) {
        self.wait_line(STEP, |l| l == want);
    }

    /// Starts `voidbox shell ARGS` from the host shell; its exit status goes to `rc`, the
    /// terminal's settings afterwards to `stty`. Waits for the guest prompt.
    fn start_shell(&self, args: &str) {
        let d = self.dir.path().display();
        self.line(&format!(
            "{VOIDBOX} shell --memory-mb 128 -e 'PS1={GUEST_PROMPT} ' {args}; echo rc=$? > {d}/rc; stty -a > {d}/stty"
        ));
        self.wait_line(GUEST_UP, |l| l.starts_with(GUEST_PROMPT));
    }

    /// Waits for voidbox to end; returns its exit status and checks that the host
    /// terminal is back in canonical mode with echo.
    fn shell_status(&self) -> i32 {
        self.shell_status_within(STEP)
    }

    /// [`Tmux::shell_status`], waiting up to `limit` for voidbox to end.
    fn shell_status_within(&self, limit: Duration) -> i32 {
        let rc = self.dir.path().join("rc");
        let t0 = Instant::now();
        let text = loop {
            match std::fs::read_to_string(&rc) {
                Ok(t) if t.ends_with('\n') => break t,
                _ if t0.elapsed() > limit => {
                    panic!("voidbox did not end; pane:\n{}", self.pane().join("\n"))
                }
                _ => std::thread::sleep(Duration::from_millis(100)),
            }
        };
        self.wait_line(STEP, |l| l.starts_with("host$"));
        let stty = std::fs::read_to_string(self.dir.path().join("stty")).unwrap_or_default();
        let flags: Vec<&str> = stty.split_whitespace().collect();
        for f in ["icanon", "echo", "isig", "icrnl", "opost"] {
            assert!(flags.contains(&f), "terminal not restored ({f}): {stty}");
        }
        let code = text.trim().strip_prefix("rc=").unwrap_or_default();
        code.parse()
            .unwrap_or_else(|_| panic!("bad status {text:?}"))
    }

    /// The voidbox process the pane's shell started, and its VMM.
    fn voidbox_and_vmm(&self) -> (u32, u32) {
        let sh: u32 = self
            .tmux(&["display", "-p", "-t", "t", "#{pane_pid}"])
            .trim()
            .parse()
            .unwrap();
        let vb = child_pids(sh);
        assert_eq!(
            vb.len(),
            1,
            "expected voidbox under the pane's shell: {vb:?}"
        );
        let vmm = child_pids(vb[0]);
        assert_eq!(vmm.len(), 1, "expected one VMM under voidbox: {vmm:?}");
        (vb[0], vmm[0])
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .arg("-S")
            .arg(&self.sock)
            .arg("kill-server")
            .status();
    }
}

fn gone(pid: u32) -> bool {
    let t0 = Instant::now();
    while Path::new(&format!("/proc/{pid}")).exists() {
        if t0.elapsed() > Duration::from_secs(10) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    true
}

#[test]
fn shell_runs_commands_follows_resizes_and_returns_the_exit_code() {
    if guest_image().is_none() {
        return;
    }
    let t = Tmux::start(100, 30);
    t.start_shell("");
    t.line("echo $((6*7))");
    t.wait_for("42");
    t.line("stty size");
    t.wait_for("30 100");
    t.tmux(&["resize-window", "-t", "t", "-x", "120", "-y", "40"]);
    // SIGWINCH → PtyResize reaches the guest well before the next keystrokes.
    std::thread::sleep(Duration::from_millis(500));
    t.line("stty size");
    t.wait_for("40 120");
    // Ctrl-C is a byte for the guest: it interrupts the guest's `sleep`, not voidbox.
    t.line("sleep 60");
    std::thread::sleep(Duration::from_secs(3));
    let interrupted = Instant::now();
    t.tmux(&["send-keys", "-t", "t", "C-c"]);
    t.line("echo after-$((1+1))");
    t.wait_for("after-2");
    assert!(
        interrupted.elapsed() < Duration::from_secs(30),
        "Ctrl-C did not reach the guest"
    );
    t.line("exit 3");
    assert_eq!(t.shell_status(), 3);
}

#[test]
fn sigterm_hangs_the_session_up_and_restores_the_terminal() {
    if guest_image().is_none() {
        return;
    }
    let t = Tmux::start(100, 30);
    t.start_shell("");
    let (vb, vmm) = t.voidbox_and_vmm();
    let st = Command::new("kill")
        .args(["-TERM", &vb.to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    assert_eq!(t.shell_status(), 128 + 15);
    assert!(gone(vmm), "the VMM {vmm} outlived voidbox");
    assert!(
        t.pane()
            .iter()
            .any(|l| l.contains("session hung up on SIGTERM")),
        "{}",
        t.pane().join("\n")
    );
}

#[test]
fn a_dying_vm_is_reported_and_the_terminal_restored() {
    if guest_image().is_none() {
        return;
    }
    let t = Tmux::start(100, 30);
    t.start_shell("");
    let (_, vmm) = t.voidbox_and_vmm();
    let st = Command::new("kill")
        .args(["-9", &vmm.to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    assert_eq!(t.shell_status(), 125);
    let pane = t.pane().join("\n");
    assert!(
        pane.contains("the VM died during pty") && pane.contains("SIGKILL"),
        "{pane}"
    );
}

#[test]
fn without_a_terminal_a_spec_sandbox_runs_piped_input() {
    if guest_image().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let spec = voidbox_tests::write_file(
        dir.path(),
        "dev.yaml",
        "api_version: v1\nkind: sandbox\nname: dev\nsandbox:\n  memory_mb: 128\n  env: {GREETING: from-spec}\n",
    );
    let (code, stdout, stderr) =
        piped_shell(&[&spec], "echo \"$GREETING $((2+3))\"; stty size\nexit 5\n");
    assert_eq!(code, Some(5), "stdout: {stdout}\nstderr: {stderr}");
    // The guest terminal echoes the input; the expansions show only in the output.
    assert!(stdout.contains("from-spec 5"), "stdout: {stdout}");
    assert!(stdout.contains("24 80"), "default size; stdout: {stdout}");
}

/// Runs `voidbox shell ARGS` with `input` piped to it; returns (exit code, stdout, stderr).
fn piped_shell(args: &[&str], input: &str) -> (Option<i32>, String, String) {
    let mut child = Command::new(VOIDBOX)
        .arg("shell")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.as_bytes()).unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn mounts_share_host_directories_read_only_and_read_write() {
    if guest_image().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("in")).unwrap();
    std::fs::write(dir.path().join("in/hello.txt"), "hello-from-host\n").unwrap();
    let ro = format!("{}/in:/workspace/in", dir.path().display());
    // Missing on the host: created because it is `rw`.
    let rw = format!("{}/out:/workspace/out:rw", dir.path().display());
    let (code, stdout, stderr) = piped_shell(
        &["--memory-mb", "128", "--mount", &ro, "--mount", &rw],
        "cat /workspace/in/hello.txt; echo from-guest > /workspace/out/f; \
         touch /workspace/in/x 2>/dev/null || echo ro-$((6*7))\nexit 0\n",
    );
    assert_eq!(code, Some(0), "stdout: {stdout}\nstderr: {stderr}");
    assert!(stdout.contains("hello-from-host"), "stdout: {stdout}");
    assert!(
        stdout.contains("ro-42"),
        "the ro share was writable: {stdout}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("out/f")).unwrap_or_default(),
        "from-guest\n",
        "stdout: {stdout}\nstderr: {stderr}"
    );
    assert!(!dir.path().join("in/x").exists());
}

#[test]
fn bad_mounts_are_usage_errors_before_a_vm_starts() {
    let out = Command::new(VOIDBOX)
        .args(["shell", "--mount", "relative-only"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("HOST:GUEST"));
    let out = Command::new(VOIDBOX)
        .args(["shell", "--mount", "/nonexistent-5e1c:/workspace/x"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("/nonexistent-5e1c"), "{stderr}");
}

/// `n` random bytes from the kernel, in hex.
fn random_hex(n: usize) -> String {
    use std::io::Read;
    let mut b = vec![0u8; n];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .expect("/dev/urandom");
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Claude Code's terminal UI in an interactive agent's VM, through the real credential
/// gateway to the scripted model (`voidbox-llm-script`) on host loopback: the agent runs in
/// an OCI image (busybox from a local registry) and starts in the image's `WorkingDir`, as
/// `apply` starts it (issue 34, 4.5: Claude Code tells the model its working directory),
/// the spec's prompt is its first message, the model's answer shows on the terminal, every request reached
/// the model with the real key (the guest only ever held the gateway's placeholder), the
/// kit's prompt file reached the model, `/exit` ends voidbox with the runtime's status, the
/// gateway's counters are printed and the host terminal is restored.
#[test]
fn an_interactive_agent_opens_claude_code_through_the_gateway() {
    if guest_image().is_none() {
        return;
    }
    // Claude Code's TUI starts in minutes where guest kernel code is interpreted; a golden
    // snapshot of this VM size (with the runtimes warmed up) is made on first use.
    const UP: Duration = Duration::from_secs(1500);
    const ANSWER: &str = "vbx-interactive-ok";
    /// The image's `WorkingDir` (not in the image: made at start, as Docker does).
    const IMAGE_WORKDIR: &str = "/srv/vbx-shell-project";
    let registry = Registry::start().expect("registry");
    // Reproducible: the golden snapshot of its VM is made once, not once per run.
    ImageBuilder::busybox()
        .expect("busybox image")
        .reproducible()
        .working_dir(IMAGE_WORKDIR)
        .push(&registry, "shell-agent:1")
        .expect("push the image");
    let t0 = Instant::now();
    let key = format!("sk-ant-vbxshell-{}", random_hex(16));
    let nonce = random_hex(6);
    let server = Server::start(Script {
        expect_key: Some(key.clone()),
        ..Script::new([Turn::text(ANSWER)])
    });
    let t = Tmux::start(120, 40);
    let d = t.dir.path().to_path_buf();
    std::fs::write(d.join("key"), &key).unwrap();
    std::fs::write(
        d.join("AGENTS.md"),
        format!("# Rules\n\nProject rule vbx-rule-{nonce}: answer briefly.\n"),
    )
    .unwrap();
    let spec = voidbox_tests::write_file(
        &d,
        "agent.yaml",
        &format!(
            "api_version: v1\nkind: agent\nname: helper\nsandbox:\n  memory_mb: 2048\n  image: '{}'\n\
             llm: {{provider: claude, base_url: '{}', api_key_env: VBX_SHELL_KEY, model: claude-vbx-test}}\n\
             agent:\n  prompt: 'Say the marker (vbx-prompt-{nonce}).'\n  prompt_files: [AGENTS.md]\n  mode: interactive\n",
            registry.reference("shell-agent:1"),
            server.base_url()
        ),
    );
    // The key reaches voidbox through its environment only (never typed on the pane).
    t.line(&format!(
        "env VBX_SHELL_KEY=\"$(cat {dir}/key)\" {VOIDBOX} shell --boot-timeout 600 {spec}; echo rc=$? > {dir}/rc; stty -a > {dir}/stty",
        dir = d.display()
    ));
    t.wait_line(UP, |l| l.contains(ANSWER));
    let answered = t0.elapsed();
    let calls = server.model_calls();
    assert!(!calls.is_empty(), "no model call reached the server");
    for c in &calls {
        // The server answers only the real key: the gateway swapped the placeholder.
        assert_eq!(
            c.credential(),
            Some(key.as_str()),
            "a request without the key"
        );
        assert_eq!(c.status, 200);
    }
    assert!(
        calls
            .iter()
            .any(|c| c.body_contains(&format!("vbx-prompt-{nonce}"))),
        "the spec's prompt did not reach the model"
    );
    assert!(
        calls
            .iter()
            .any(|c| c.body_contains(&format!("vbx-rule-{nonce}"))),
        "the kit's prompt file did not reach the model"
    );
    assert!(
        calls.iter().any(|c| c.body_contains(IMAGE_WORKDIR)),
        "the runtime did not start in the image's WorkingDir {IMAGE_WORKDIR}"
    );
    t.tmux(&["send-keys", "-t", "t", "-l", "/exit"]);
    std::thread::sleep(Duration::from_secs(2));
    t.tmux(&["send-keys", "-t", "t", "Enter"]);
    let code = t.shell_status_within(Duration::from_secs(300));
    let pane = t.pane().join("\n");
    eprintln!(
        "shell_cli: answer after {answered:?}, ended after {:?}\n{pane}",
        t0.elapsed()
    );
    assert_eq!(code, 0, "{pane}");
    // Every request the server saw went through the gateway, and it counted them.
    let forwarded = server.requests().len();
    assert!(
        pane.contains(&format!("voidbox: gateway: {forwarded} request")),
        "{pane}"
    );
    assert!(!pane.contains(&key), "the key showed on the terminal");
}

#[test]
fn an_agent_on_the_mock_runtime_or_with_a_program_is_refused_before_a_vm_starts() {
    let dir = tempfile::tempdir().unwrap();
    let spec = |name: &str, llm: &str| {
        voidbox_tests::write_file(
            dir.path(),
            name,
            &format!("api_version: v1\nkind: agent\nname: a\nllm: {llm}\nagent:\n  prompt: hi\n  mode: interactive\n"),
        )
    };
    let mock = spec("mock.yaml", "{provider: mock}");
    let claude = spec(
        "claude.yaml",
        "{provider: claude, api_key_env: VBX_SHELL_UNSET_KEY}",
    );
    let run = |args: &[&str]| {
        let out = Command::new(VOIDBOX)
            .arg("shell")
            .args(args)
            .env_remove("VBX_SHELL_UNSET_KEY")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = run(&[&mock]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("no interactive mode"), "{err}");
    let (code, err) = run(&[&claude]);
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("VBX_SHELL_UNSET_KEY"), "{err}");
    let (code, err) = run(&[&claude, "--program", "/bin/sh"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--program"), "{err}");
}

/// Runs `voidbox shell ARGS` with no input and `env` set; returns (exit code, stderr).
fn shell_refused(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let out = Command::new(VOIDBOX)
        .arg("shell")
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// An interactive agent spec with `extra` lines under `agent:`.
fn agent_spec(dir: &Path, name: &str, llm: &str, extra: &str) -> String {
    voidbox_tests::write_file(
        dir,
        name,
        &format!("api_version: v1\nkind: agent\nname: a\nllm: {llm}\nagent:\n  prompt: hi\n  mode: interactive\n{extra}"),
    )
}

#[test]
fn shell_refuses_what_apply_refuses_at_its_line_before_a_vm_starts() {
    let dir = tempfile::tempdir().unwrap();
    let key = [("VBX_SHELL_KEY", "sk-test-not-a-key")];
    let claude = "{provider: claude, api_key_env: VBX_SHELL_KEY}";
    // `messaging` is refused as `apply` refuses it; `mode: interactive` is what shell opens.
    let spec = agent_spec(
        dir.path(),
        "msg.yaml",
        claude,
        "  messaging: {enabled: true}\n",
    );
    let (code, err) = shell_refused(&[&spec], &key);
    assert_eq!(code, Some(3), "{err}");
    assert!(
        err.contains(&format!("{spec}:8:3")) && err.contains("messaging"),
        "{err}"
    );
    assert!(!err.contains("mode: interactive"), "{err}");
    // An unknown `agent:` runtime only warns in `validate`; shell refuses it, as apply does.
    let spec = agent_spec(
        dir.path(),
        "rt.yaml",
        claude,
        "  skills: [\"agent:nosuch\"]\n",
    );
    let (code, err) = shell_refused(&[&spec], &key);
    assert_eq!(code, Some(3), "{err}");
    assert!(err.contains("agent:` runtime is unknown"), "{err}");
    // A model endpoint that is down is found before a VM boots (`--no-endpoint-check` skips).
    let port = voidbox_tests::free_port();
    let local = format!("{{provider: ollama, base_url: \"http://127.0.0.1:{port}\"}}");
    let spec = agent_spec(dir.path(), "down.yaml", &local, "");
    let (code, err) = shell_refused(&[&spec], &[]);
    assert_eq!(code, Some(3), "{err}");
    assert!(
        err.contains("llm.base_url") && err.contains("unreachable"),
        "{err}"
    );
    // A sandbox spec gets the same checks: a mount apply refuses (a host file where a
    // directory is shared) is refused at its line.
    let spec = voidbox_tests::write_file(
        dir.path(),
        "mnt.yaml",
        "api_version: v1\nkind: sandbox\nname: s\nsandbox:\n  mounts:\n    - {host: /etc/passwd, guest: /srv/x}\n",
    );
    let (code, err) = shell_refused(&[&spec], &[]);
    assert_eq!(code, Some(3), "{err}");
    assert!(
        err.contains(&format!("{spec}:6:")) && err.contains("not a directory"),
        "{err}"
    );
}

#[test]
fn shell_checks_cli_programs_against_the_guest_image_and_keeps_the_spec_s_timeout_and_telemetry() {
    if guest_image().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // `cli:` programs are checked against the guest image, as `apply` checks them (exit 3
    // in both commands; validation never looks at the image).
    let spec = agent_spec(
        dir.path(),
        "cli.yaml",
        "{provider: claude, api_key_env: VBX_SHELL_KEY}",
        "  skills: [\"cli:nosuchtool-4e1f\"]\n",
    );
    let key = [("VBX_SHELL_KEY", "sk-test-not-a-key")];
    let (code, err) = shell_refused(&["--no-endpoint-check", &spec], &key);
    assert_eq!(code, Some(3), "{err}");
    assert!(
        err.contains("`nosuchtool-4e1f` is not on the guest image's PATH"),
        "{err}"
    );
    // `apply` refuses `mode: interactive` first: the same agent as a task.
    let text = std::fs::read_to_string(&spec).unwrap();
    let task = voidbox_tests::write_file(
        dir.path(),
        "cli-task.yaml",
        &text.replace("  mode: interactive\n", ""),
    );
    let apply = Command::new(VOIDBOX)
        .args(["apply", "--dry-run", "--no-endpoint-check", &task])
        .envs(key)
        .output()
        .unwrap();
    let apply_err = String::from_utf8_lossy(&apply.stderr);
    assert_eq!(apply.status.code(), code, "{apply_err}");
    assert!(
        apply_err.contains("`nosuchtool-4e1f` is not on"),
        "{apply_err}"
    );
    // The spec's `timeout_secs` ends the session (124), and its `observe` records it.
    let (_sink, port, out) = voidbox_tests::otlp_sink(dir.path());
    let spec = voidbox_tests::write_file(
        dir.path(),
        "timed.yaml",
        &format!("api_version: v1\nkind: sandbox\nname: timed\ntimeout_secs: 4\nobserve: {{otlp_endpoint: \"http://127.0.0.1:{port}\"}}\nsandbox: {{memory_mb: 128}}\n"),
    );
    let t0 = Instant::now();
    let (code, stdout, stderr) = piped_shell(&[&spec], "sleep 60\n");
    assert_eq!(code, Some(124), "stdout: {stdout}\nstderr: {stderr}");
    assert!(t0.elapsed() < Duration::from_secs(55), "{:?}", t0.elapsed());
    let traces = std::fs::read_to_string(&out).unwrap_or_default();
    let names: Vec<String> = traces
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["signal"] == "traces")
        .flat_map(|v| {
            let mut names = Vec::new();
            for rs in v["body"]["resourceSpans"].as_array().into_iter().flatten() {
                for ss in rs["scopeSpans"].as_array().into_iter().flatten() {
                    for s in ss["spans"].as_array().into_iter().flatten() {
                        names.push(s["name"].as_str().unwrap_or_default().to_string());
                    }
                }
            }
            names
        })
        .collect();
    assert!(
        names.iter().any(|n| n == "voidbox shell timed") && names.iter().any(|n| n == "node timed"),
        "spans: {names:?}\nstderr: {stderr}"
    );
}
