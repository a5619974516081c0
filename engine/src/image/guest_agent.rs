//! Finding (or building) the static guest agent binary that becomes `/init`.
//!
//! Order: an explicit path (`--guest-agent`), `$VOIDBOX_GUEST_AGENT`, a build from
//! the voidbox source tree this binary was compiled from, when it runs from that tree's
//! `target/` ([`source_tree`]; `cargo build -p
//! voidbox-guest-agent --release --target x86_64-unknown-linux-gnu`, statically linked,
//! size-optimised with [`AGENT_PROFILE`], into `target/guest` so host builds are not
//! invalidated), and finally `voidbox-guest-agent` next to the running executable.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::error::ImageError;

/// Environment variable naming a prebuilt guest agent.
pub const AGENT_ENV: &str = "VOIDBOX_GUEST_AGENT";
/// Package and target of the guest agent.
pub const AGENT_PACKAGE: &str = "voidbox-guest-agent";
/// Target triple the agent is built for.
pub const AGENT_TARGET: &str = "x86_64-unknown-linux-gnu";
/// The offline mock LLM runtime (a second binary of the guest-agent package, behind its
/// `mock-llm` feature), shipped in the image for `llm.provider: mock`.
pub const MOCK_LLM_BIN: &str = "voidbox-mock-llm";
/// Where the mock runtime lives in the guest.
pub const MOCK_LLM_GUEST_PATH: &str = "opt/voidbox/runtimes/mock/bin/voidbox-mock-llm";

/// Release-profile overrides for the guest build (`cargo --config`; they apply to that
/// build only): the guest reads every page of the agent it runs from the system disk at
/// boot, which costs ≈0.7 s per MiB where guest kernel code is interpreted, so the agent
/// is built for size — fat LTO, `opt-level = "s"`, one codegen unit, no debug info (it is
/// stripped anyway): ≈1.7 instead of ≈1.9 MiB stripped, ≈0.2 s of boot. (`panic` stays
/// `unwind`: a panicking connection thread must not take PID 1 down with it.)
pub const AGENT_PROFILE: &[&str] = &[
    "profile.release.lto=true",
    "profile.release.opt-level=\"s\"",
    "profile.release.codegen-units=1",
    "profile.release.debug=false",
];

/// The mock LLM runtime built beside `agent` (same directory), if there is one.
pub fn mock_llm_beside(agent: &Path) -> Option<PathBuf> {
    agent
        .parent()
        .map(|d| d.join(MOCK_LLM_BIN))
        .filter(|p| p.is_file())
}

/// The voidbox source tree this binary was built from, when it runs from that tree's
/// `target/` (a development build); `None` for a relocated binary (a release tarball, a
/// wheel, `cargo install`), which never looks at its build machine's paths.
pub fn source_tree() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    source_tree_of(&exe, Path::new(env!("CARGO_MANIFEST_DIR")))
}

/// The workspace above `manifest_dir` (the engine crate's directory at build time) when
/// `exe` lies inside its `target/` directory and the workspace still has the guest agent.
pub fn source_tree_of(exe: &Path, manifest_dir: &Path) -> Option<PathBuf> {
    let ws = manifest_dir.parent()?.to_path_buf();
    let ws = ws.canonicalize().unwrap_or(ws);
    let exe = exe.canonicalize().unwrap_or_else(|_| exe.to_path_buf());
    (exe.starts_with(ws.join("target")) && ws.join("guest-agent/Cargo.toml").is_file())
        .then_some(ws)
}

/// Resolves the guest agent binary; `log` gets progress lines.
pub fn resolve(explicit: Option<&Path>, log: &mut dyn FnMut(&str)) -> Result<PathBuf, ImageError> {
    let given = explicit
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os(AGENT_ENV).map(PathBuf::from));
    let path = match given {
        Some(p) => p,
        None => match source_tree() {
            Some(ws) => build_from_source(&ws, log)?,
            None => std::env::current_exe()
                .ok()
                .and_then(|e| e.parent().map(|d| d.join(AGENT_PACKAGE)))
                .filter(|p| p.is_file())
                .ok_or_else(|| {
                    ImageError::Environment(format!(
                        "no guest agent binary ({AGENT_PACKAGE} is not beside this voidbox): \
                         pass --guest-agent PATH or set {AGENT_ENV}"
                    ))
                })?,
        },
    };
    check_agent(&path)?;
    Ok(path)
}

/// The agent must be a static ELF (there is no dynamic loader in the image) or a
/// `#!` script (test inits).
pub fn check_agent(path: &Path) -> Result<(), ImageError> {
    let bytes = std::fs::read(path).map_err(ImageError::io(path))?;
    if bytes.starts_with(b"#!") {
        return Ok(());
    }
    match has_interpreter(&bytes) {
        Ok(false) => Ok(()),
        Ok(true) => Err(ImageError::Environment(format!(
            "{} is dynamically linked; the guest agent must be static (RUSTFLAGS='-C target-feature=+crt-static')",
            path.display()
        ))),
        Err(e) => Err(ImageError::Environment(format!("{}: {e}", path.display()))),
    }
}

/// Whether an ELF64 file has a `PT_INTERP` program header (is dynamically linked).
pub fn has_interpreter(b: &[u8]) -> Result<bool, String> {
    if b.get(..4) != Some(b"\x7fELF") || b.get(4) != Some(&2) {
        return Err("not an ELF64 executable".into());
    }
    let rd = |o: usize, n: usize| -> Result<u64, String> {
        let s = b.get(o..o + n).ok_or("truncated ELF")?;
        let mut v = [0u8; 8];
        v[..n].copy_from_slice(s);
        Ok(u64::from_le_bytes(v))
    };
    let phoff = rd(32, 8)? as usize;
    let phentsize = rd(54, 2)? as usize;
    let phnum = rd(56, 2)? as usize;
    for i in 0..phnum {
        if rd(phoff + i * phentsize, 4)? == 3 {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Builds the agent from the workspace at `ws`; returns the binary's path.
pub fn build_from_source(ws: &Path, log: &mut dyn FnMut(&str)) -> Result<PathBuf, ImageError> {
    log(&format!(
        "building {AGENT_PACKAGE} (static, release) in {}",
        ws.join("target/guest").display()
    ));
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut child = Command::new(cargo)
        .current_dir(ws)
        .args([
            "build",
            "--release",
            "--message-format=json-render-diagnostics",
            "-p",
            AGENT_PACKAGE,
            "--features",
            "mock-llm",
        ])
        .args(AGENT_PROFILE.iter().flat_map(|c| ["--config", c]))
        .args(["--target", AGENT_TARGET])
        .env("CARGO_TARGET_DIR", ws.join("target/guest"))
        .env("RUSTFLAGS", "-C target-feature=+crt-static")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| ImageError::Environment(format!("running cargo: {e}")))?;
    let stderr = child
        .stderr
        .take()
        .map(|s| std::thread::spawn(move || std::io::read_to_string(s).unwrap_or_default()));
    let mut exe = None;
    if let Some(out) = child.stdout.take() {
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            let is_bin = v["target"]["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == "bin"));
            // The package has two binaries (the agent and the mock runtime): pick the agent.
            let ours = v["target"]["name"].as_str() == Some(AGENT_PACKAGE);
            if v["reason"] == "compiler-artifact" && is_bin && ours {
                if let Some(e) = v["executable"].as_str() {
                    exe = Some(PathBuf::from(e));
                }
            }
        }
    }
    let err = stderr.and_then(|t| t.join().ok()).unwrap_or_default();
    let status = child
        .wait()
        .map_err(|e| ImageError::Environment(format!("cargo: {e}")))?;
    if !status.success() {
        return Err(ImageError::Step {
            step: format!("cargo build -p {AGENT_PACKAGE}"),
            log_tail: super::deps::tail(&err, 30),
            log: None,
        });
    }
    exe.ok_or_else(|| {
        ImageError::Environment(format!(
            "{AGENT_PACKAGE} has no binary target yet; pass --guest-agent PATH (a static binary or a #! script)"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_dynamic_binaries() {
        let sh = std::fs::read("/bin/sh").unwrap();
        assert_eq!(has_interpreter(&sh), Ok(true));
        if let Ok(bb) = std::fs::read(super::super::deps::BUSYBOX_PATH) {
            assert_eq!(has_interpreter(&bb), Ok(false), "busybox-static is static");
        }
        assert!(has_interpreter(b"#!/bin/sh").is_err());
        assert!(has_interpreter(b"\x7fELF\x02").is_err());
    }

    #[test]
    fn the_source_tree_is_used_only_from_its_own_target_dir() {
        let ws = tempfile::tempdir().unwrap();
        let root = ws.path().canonicalize().unwrap();
        std::fs::create_dir_all(root.join("guest-agent")).unwrap();
        std::fs::write(root.join("guest-agent/Cargo.toml"), "").unwrap();
        let engine = root.join("engine");
        let inside = root.join("target/release/voidbox");
        assert_eq!(source_tree_of(&inside, &engine), Some(root.clone()));
        // A relocated binary (a release tarball, `cargo install`) never uses it.
        for elsewhere in ["/opt/voidbox/bin/voidbox", "/usr/local/bin/voidbox"] {
            assert_eq!(source_tree_of(Path::new(elsewhere), &engine), None);
        }
        assert_eq!(source_tree_of(&root.join("engine/voidbox"), &engine), None);
        // A tree without the guest agent is not a voidbox source tree.
        std::fs::remove_file(root.join("guest-agent/Cargo.toml")).unwrap();
        assert_eq!(source_tree_of(&inside, &engine), None);
    }

    #[test]
    fn scripts_are_accepted_as_test_inits() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("init");
        std::fs::write(&p, "#!/bin/sh\necho ready\n").unwrap();
        check_agent(&p).unwrap();
        assert!(check_agent(Path::new("/bin/sh")).is_err());
    }
}
