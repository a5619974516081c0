//! Helpers shared by the end-to-end tests in `tests/tests/`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A tool `scripts/wheel.sh --tools-only` installs into its venv (`actionlint`, `pre-commit`,
/// …): its path, or a panic saying how to get it.
pub fn wheel_tool(name: &str) -> PathBuf {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .expect("HOME");
    let tool = cache.join("voidbox/wheel-tools/bin").join(name);
    assert!(
        tool.is_file(),
        "{} missing: run scripts/wheel.sh --tools-only (scripts/test.sh does)",
        tool.display()
    );
    tool
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(".."))
}

/// The result of one CLI run.
#[derive(Debug)]
pub struct Run {
    /// Exit code (`None` when killed by a signal).
    pub code: Option<i32>,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
}

impl From<Output> for Run {
    fn from(o: Output) -> Self {
        Run {
            code: o.status.code(),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }
}

/// Writes `text` to `dir/name` (making its directories) and returns the path as a string (for CLI arguments).
pub fn write_file(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    if let Some(parent) = p.parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    std::fs::write(&p, text).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
    p.to_string_lossy().into_owned()
}

/// Runs the `voidbox` binary at `bin` with `args` in `cwd` (no colors).
pub fn run_in(bin: &str, cwd: &Path, args: &[&str]) -> Run {
    Command::new(bin)
        .args(args)
        .current_dir(cwd)
        .env("NO_COLOR", "1")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {bin}: {e}"))
        .into()
}

/// Runs the `voidbox` binary at `bin` with `args` in a private environment: no colors,
/// `XDG_CACHE_HOME` = `xdg`, `HOME` = `home` (Docker's config in `home/.docker`), none of the
/// caller's registry settings (`VOIDBOX_REGISTRY_USERNAME`, `VOIDBOX_REGISTRY_PASSWORD`,
/// `VOIDBOX_INSECURE_REGISTRIES`) nor the variables in `unset`; then `env` on top.
pub fn run_isolated(
    bin: &str,
    xdg: &Path,
    home: &Path,
    args: &[&str],
    unset: &[&str],
    env: &[(&str, &str)],
) -> Run {
    let mut cmd = Command::new(bin);
    cmd.args(args)
        .env("NO_COLOR", "1")
        .env("XDG_CACHE_HOME", xdg)
        .env("HOME", home)
        .env("DOCKER_CONFIG", home.join(".docker"));
    for var in [
        "VOIDBOX_REGISTRY_USERNAME",
        "VOIDBOX_REGISTRY_PASSWORD",
        "VOIDBOX_INSECURE_REGISTRIES",
    ]
    .iter()
    .chain(unset)
    {
        cmd.env_remove(var);
    }
    cmd.envs(env.iter().copied());
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {bin}: {e}"))
        .into()
}

pub mod vm;

/// A child process (a test server) killed and reaped when dropped.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A loopback TCP port that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// `scripts/otlp_sink.py` (a real OTLP/HTTP receiver, run with the Phoenix venv's Python) on a
/// free port, up and accepting: (the server, its port, the file it appends what it receives
/// to, one JSON object per line).
pub fn otlp_sink(dir: &Path) -> (KillOnDrop, u16, PathBuf) {
    let port = free_port();
    let out = dir.join("sink.jsonl");
    let root = repo_root();
    let child = Command::new(root.join("scripts/phoenix.sh"))
        .arg("python")
        .arg(root.join("scripts/otlp_sink.py"))
        .arg(port.to_string())
        .arg(&out)
        .spawn()
        .expect("scripts/phoenix.sh (install with `scripts/phoenix.sh install`)");
    let server = KillOnDrop(child);
    let t0 = std::time::Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(60),
            "the OTLP sink did not come up"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    (server, port, out)
}

/// Pids of live (non-zombie) processes whose environment carries `tag` (`KEY=VALUE`): the
/// VM tests put a tag in the environment of what they start, to find leftovers.
pub fn tagged(tag: &str) -> Vec<u32> {
    let Ok(rd) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let env = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            let live = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| {
                    s.rfind(')')
                        .and_then(|i| s.get(i + 2..i + 3))
                        .map(|c| c != "Z")
                })
                .unwrap_or(false);
            live && env.split(|b| *b == 0).any(|kv| kv == tag.as_bytes())
        })
        .collect()
}

/// Fails when processes tagged `tag` are still alive 5 s from now (VMMs are killed before
/// the CLI exits; the kernel may take a moment to reap them).
pub fn assert_no_leftovers(tag: &str) {
    let t0 = std::time::Instant::now();
    while !tagged(tag).is_empty() && t0.elapsed() < std::time::Duration::from_secs(5) {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(tagged(tag), Vec::<u32>::new(), "processes left behind");
}

/// Reads lines from `r` until the text read so far satisfies `done` or the stream ends;
/// returns that text.
pub fn read_until(r: &mut impl std::io::BufRead, done: impl Fn(&str) -> bool) -> String {
    let mut seen = String::new();
    while !done(&seen) {
        let mut line = String::new();
        if r.read_line(&mut line).expect("reading the stream") == 0 {
            break;
        }
        seen.push_str(&line);
    }
    seen
}

/// For a test that counts its process's own children or file descriptors, which the other
/// tests of the one `suite` binary would disturb: in the test run, re-runs the test `name`
/// (its path, `module::test`) alone in a fresh process of this binary, fails with that run's
/// output unless it passed, and returns `false`; in that fresh process, returns `true` (go on
/// with the test).
pub fn in_own_process(name: &str) -> bool {
    const VAR: &str = "VOIDBOX_TEST_OWN_PROCESS";
    if std::env::var(VAR).as_deref() == Ok(name) {
        return true;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let out = Command::new(&exe)
        .args([name, "--exact", "--test-threads", "1", "--nocapture"])
        .env(VAR, name)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", exe.display()));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("test result: ok. 1 passed"),
        "{name} in its own process: {}\n{stdout}\n{stderr}",
        out.status
    );
    false
}

/// Nothing of a run is left in the `TMPDIR` it was given: no `voidbox-*` directory (VM
/// dirs, sockets); anything else there (a logs dir the test asked for) may stay.
pub fn assert_tmp_clean(dir: &Path) {
    let left: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("voidbox-"))
        .collect();
    assert!(left.is_empty(), "temporary directories left: {left:?}");
}
