//! The real agent runtimes in real micro-VMs through `voidbox apply`, the real credential
//! gateway, and the scripted LLM server (`voidbox-llm-script`: the only stand-in, for the
//! remote model API). One pipeline fans out to two Claude Code boxes of one configuration
//! (`provider: claude`, different prompts) and a Codex box (`provider: codex`), each with a
//! staged `file:` skill and its own scripted server on loopback: a shell tool call, then a
//! final text. Every box restores its runtime already running (issue 35: a warm-runtime
//! snapshot, a diff over the base golden snapshot): the two Claude Code boxes restore one
//! snapshot, made by one of them, and reach their model as two sessions, each with its own
//! prompt only; the time from `apply`'s start to each box's first model request is printed.
//!
//! Both boxes run with an OCI image as their root filesystem (issue 25: agents in any image;
//! `examples/agents-local.yaml`, run by `scripts/test.sh`, covers the guest image's own
//! root). The image — built with umoci, served by a real local registry — is busybox plus a
//! program that exists nowhere else, in a directory only the image's `PATH` names; it has no
//! bash, no musl loader and no passwd entry for the command user, and lacks its `WorkingDir`.
//!
//! It proves:
//! - each runtime's shell tool (Claude Code's Bash, with the runtimes disk's bash; Codex's
//!   shell) ran in its guest's image root as uid 1000 and its output reached the model: the
//!   request after the tool turn carries the image program's `only-in-the-image-42`,
//!   `tool-ran-42-NODE`, the image's `Env` value, its created `WorkingDir` and `1000`, which
//!   only a shell in that image root computes;
//! - the gateway swapped the guest's placeholder for the real key: the servers answer only
//!   the real key, and every request they recorded carried exactly it;
//! - each runtime read the spec's prompt file (`prompt_files`) where the kit put it and sent
//!   it to its model;
//! - the report: each node's runtime and tool calls, Claude Code's init listing the staged
//!   skill (Codex reports none: its request instructions name it), the gateway's counters
//!   (every request it forwarded reached the server, none refused), the gateway-only
//!   network, and the kit's redaction of the key planted in the skill;
//! - the key never enters the guest (issue 13, item 3): while the VMs run — from the
//!   server's hook, when the request after the tool turn arrives and before it is answered —
//!   every VMM's guest RAM (its mapping in `/proc/PID/maps`, read through `/proc/PID/mem`)
//!   is scanned whole: no key (ASCII or UTF-16), and the positive control — a marker in the
//!   node's prompt, which its runtime holds in guest RAM — is found, so the scan cannot pass
//!   by reading the wrong memory or none. Guest environments, files (all guest disks are
//!   read-only: writes live in guest RAM) and processes are in that RAM. The kept console
//!   logs, every file the run wrote on the host, the JSON report and the CLI's output hold
//!   no key either.
//!
//! Without VMs: a key variable that is not set, and a `sandbox.env` entry that would copy
//! the key into the guest, are refused with exit 3 and the spec's line, nothing started.

use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use voidbox_llm_script::{Recorded, Script, Server, Turn};
use voidbox_oci::testing::{ImageBuilder, Layer, Registry};
use voidbox_tests::vm::{child_pids, guest_image};
use voidbox_tests::Run;

const VOIDBOX: &str = env!("CARGO_BIN_EXE_voidbox-under-test");
/// Guest memory of each agent VM (Claude Code needs about this much).
const MEMORY_MB: u64 = 2048;
/// The host variable holding the key in the spec.
const KEY_VAR: &str = "VBX_TEST_KEY";
/// The staged skill.
const SKILL: &str = "vbx-probe";
/// The tool command: `tool-ran-42-NODE` exists only once a shell in NODE's guest ran it.
/// (`~/.voidbox/node.env` has the node's `VOIDBOX_NODE`: a warm runtime, shared by every node
/// of its configuration, does not have it in its environment.)
const TOOL_COMMAND: &str = ". ~/.voidbox/node.env && vbx-image-tool && echo tool-ran-$((6*7))-$VOIDBOX_NODE && echo \"$VBX_IMAGE_VAR\" && pwd && id -u";
/// What the image program, the image's `Env` and `WorkingDir` add to the tool's output.
const IMAGE_TOOL_OUTPUT: &str = "only-in-the-image-42";
const IMAGE_ENV_AND_DIR: &str = "from-image-env\n/project";
/// The agent boxes: two Claude Code boxes of one configuration (they share one warm-runtime
/// snapshot) and a Codex box.
const NODES: [&str; 3] = ["claude", "claude2", "codex"];
/// Bytes read from `/proc/PID/mem` at a time.
const CHUNK: usize = 8 << 20;

/// `n` random bytes from the kernel, in hex.
fn random_hex(n: usize) -> String {
    let mut b = vec![0u8; n];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .expect("/dev/urandom");
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A pattern looked for in memory and files.
#[derive(Debug, Clone)]
struct Needle {
    name: String,
    bytes: Vec<u8>,
}

impl Needle {
    fn new(name: impl Into<String>, bytes: impl Into<Vec<u8>>) -> Needle {
        Needle {
            name: name.into(),
            bytes: bytes.into(),
        }
    }

    /// `text` as ASCII and as UTF-16LE (how a JavaScript engine may hold a string), named
    /// `name` and `name (UTF-16)`.
    fn both(name: &str, text: &str) -> [Needle; 2] {
        let wide: Vec<u8> = text.encode_utf16().flat_map(u16::to_le_bytes).collect();
        [
            Needle::new(name, text),
            Needle::new(format!("{name} (UTF-16)"), wide),
        ]
    }
}

/// Scans `len` bytes at `start` of `f` (read with `pread`, in chunks overlapping by the
/// longest needle) for `needles`; returns which were found and the bytes that could not be
/// read.
fn scan_range(f: &std::fs::File, start: u64, len: u64, needles: &[Needle]) -> (Vec<bool>, u64) {
    let finders: Vec<memchr::memmem::Finder<'_>> = needles
        .iter()
        .map(|n| memchr::memmem::Finder::new(&n.bytes))
        .collect();
    let overlap = needles.iter().map(|n| n.bytes.len()).max().unwrap_or(1) - 1;
    let mut found = vec![false; needles.len()];
    let mut unreadable = 0u64;
    let mut buf = vec![0u8; overlap + CHUNK];
    let mut kept = 0usize; // bytes of the previous chunk kept at the front of `buf`
    let mut pos = 0u64;
    while pos < len {
        let want = usize::try_from((len - pos).min(CHUNK as u64)).unwrap_or(CHUNK);
        let mut got = 0usize;
        let mut failed = false;
        while got < want {
            match f.read_at(&mut buf[kept + got..kept + want], start + pos + got as u64) {
                Ok(0) => {
                    failed = true;
                    break;
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => {
                    failed = true;
                    break;
                }
            }
        }
        let data = &buf[..kept + got];
        for (i, fi) in finders.iter().enumerate() {
            found[i] |= fi.find(data).is_some();
        }
        if failed {
            unreadable += (want - got) as u64;
            kept = 0;
        } else {
            let keep = overlap.min(data.len());
            let end = kept + got;
            buf.copy_within(end - keep..end, 0);
            kept = keep;
        }
        pos += want as u64;
    }
    (found, unreadable)
}

/// What one scan of one VMM process found.
#[derive(Debug, Clone, Default)]
struct VmmScan {
    pid: u32,
    /// Guest RAM mappings found (mappings of exactly [`MEMORY_MB`]).
    ram_mappings: usize,
    /// Guest RAM bytes scanned.
    ram_bytes: u64,
    /// Guest RAM bytes `/proc/PID/mem` would not give.
    unreadable: u64,
    /// Needles found in guest RAM.
    in_ram: Vec<String>,
    /// The VMM's own environment holds the key (host side, outside the guest).
    key_in_vmm_environ: bool,
    /// Regular files the VMM holds open for writing, and whether the key is in each.
    writable_files: Vec<(String, bool)>,
    /// What went wrong reading the process.
    error: Option<String>,
}

/// `voidbox __vmm` children of `parent`.
fn vmm_pids(parent: u32) -> Vec<u32> {
    child_pids(parent)
        .into_iter()
        .filter(|p| {
            std::fs::read(format!("/proc/{p}/cmdline"))
                .map(|c| {
                    c.split(|&b| b == 0).any(|a| a == b"__vmm")
                        || c.split(|&b| b == 0)
                            .next()
                            .is_some_and(|a0| a0.ends_with(b"voidbox-vmm"))
                })
                .unwrap_or(false)
        })
        .collect()
}

/// The guest RAM of VMM `pid`: (start, length) of every stretch exactly [`MEMORY_MB`]
/// long — one anonymous mapping after a cold boot; after a restore, the snapshot's memory
/// file mapped private, with a layered snapshot's diff mapped over parts of it (adjacent
/// mappings of `memory.bin` / `memory.diff`, taken together).
fn ram_mappings(pid: u32) -> Result<Vec<(u64, u64)>, String> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .map_err(|e| format!("/proc/{pid}/maps: {e}"))?;
    let mut out = Vec::new();
    // The snapshot-file stretch being gathered: (start, end).
    let mut run: Option<(u64, u64)> = None;
    let want = MEMORY_MB << 20;
    for line in maps.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let Some((a, b)) = fields.first().and_then(|r| r.split_once('-')) else {
            continue;
        };
        let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) else {
            continue;
        };
        let rw = fields.get(1).is_some_and(|p| p.starts_with("rw"));
        let path = fields.get(5).copied().unwrap_or("");
        let snapshot_file = path.ends_with("/memory.bin") || path.ends_with("/memory.diff");
        if rw && snapshot_file {
            run = match run {
                Some((s, e)) if e == a => Some((s, b)),
                other => {
                    if let Some((s, e)) = other.filter(|(s, e)| e - s == want) {
                        out.push((s, e - s));
                    }
                    Some((a, b))
                }
            };
            continue;
        }
        if let Some((s, e)) = run.take().filter(|(s, e)| e - s == want) {
            out.push((s, e - s));
        }
        if rw && b - a == want {
            out.push((a, b - a));
        }
    }
    if let Some((s, e)) = run.filter(|(s, e)| e - s == want) {
        out.push((s, e - s));
    }
    Ok(out)
}

/// Scans VMM `pid`: its guest RAM for `needles`, its environment and the files it writes
/// for the key.
fn scan_vmm(pid: u32, key: &str, needles: &[Needle]) -> VmmScan {
    let mut s = VmmScan {
        pid,
        ..VmmScan::default()
    };
    let key_finder = memchr::memmem::Finder::new(key.as_bytes());
    let maps = match ram_mappings(pid) {
        Ok(m) => m,
        Err(e) => {
            s.error = Some(e);
            return s;
        }
    };
    s.ram_mappings = maps.len();
    let mem = match std::fs::File::open(format!("/proc/{pid}/mem")) {
        Ok(f) => f,
        Err(e) => {
            s.error = Some(format!("/proc/{pid}/mem: {e}"));
            return s;
        }
    };
    for (start, len) in maps {
        let (found, unreadable) = scan_range(&mem, start, len, needles);
        s.ram_bytes += len;
        s.unreadable += unreadable;
        for (n, f) in needles.iter().zip(found) {
            if f && !s.in_ram.contains(&n.name) {
                s.in_ram.push(n.name.clone());
            }
        }
    }
    s.key_in_vmm_environ = std::fs::read(format!("/proc/{pid}/environ"))
        .map(|e| key_finder.find(&e).is_some())
        .unwrap_or(false);
    if let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
        for fd in fds.flatten() {
            let fdinfo = std::fs::read_to_string(format!(
                "/proc/{pid}/fdinfo/{}",
                fd.file_name().to_string_lossy()
            ))
            .unwrap_or_default();
            let flags = fdinfo
                .lines()
                .find_map(|l| l.strip_prefix("flags:"))
                .and_then(|f| u32::from_str_radix(f.trim(), 8).ok())
                .unwrap_or(0);
            let writable = flags & 0o3 != 0;
            let is_file = std::fs::metadata(fd.path()).is_ok_and(|m| m.is_file());
            if writable && is_file {
                let target = std::fs::read_link(fd.path())
                    .map_or_else(|_| "?".into(), |p| p.display().to_string());
                let has = std::fs::read(fd.path()).is_ok_and(|d| key_finder.find(&d).is_some());
                s.writable_files.push((target, has));
            }
        }
    }
    s
}

/// All VMMs of the run, scanned once when a node's request after its tool turn arrived.
#[derive(Debug)]
struct Scan {
    node: &'static str,
    vmms: Vec<VmmScan>,
    took: Duration,
}

/// The positive control of `node`: a marker in its prompt, which is in its guest's RAM
/// (the runtime's arguments and memory) while it runs.
fn control(node: &str) -> String {
    format!("vbx-prompt-{node}")
}

/// What `node`'s shell tool prints in its guest.
fn tool_output(node: &str) -> String {
    format!("tool-ran-42-{node}")
}

/// A scripted server for `node` (tool turn, then `final_text`) that answers only `key`
/// and, the first time the request after the tool turn arrives, scans every VMM of the
/// `voidbox apply` process in `apply_pid` before answering it.
fn scanning_server(
    node: &'static str,
    final_text: &str,
    key: &str,
    apply_pid: Arc<AtomicU32>,
    scans: Arc<Mutex<Vec<Scan>>>,
    arrivals: Arc<Mutex<Vec<(&'static str, Instant)>>>,
) -> Server {
    let script = Script {
        expect_key: Some(key.to_string()),
        ..Script::new([Turn::shell(TOOL_COMMAND), Turn::text(final_text)])
    };
    let mut needles: Vec<Needle> = Needle::both("key", key).into();
    for n in NODES {
        needles.extend(Needle::both(&control(n), &control(n)));
    }
    let key = key.to_string();
    let done = AtomicBool::new(false);
    Server::start_with_hook(script, move |r: &Recorded| {
        if r.is_model_call() {
            let mut a = arrivals.lock().unwrap_or_else(|e| e.into_inner());
            a.push((node, Instant::now()));
        }
        if r.turn != Some(1) || r.status != 200 || done.swap(true, Ordering::SeqCst) {
            return;
        }
        let t0 = Instant::now();
        let vmms = vmm_pids(apply_pid.load(Ordering::SeqCst))
            .into_iter()
            .map(|p| scan_vmm(p, &key, &needles))
            .collect();
        let scan = Scan {
            node,
            vmms,
            took: t0.elapsed(),
        };
        eprintln!("vm_agents: scan at {node}'s request after its tool turn: {scan:?}");
        scans.lock().unwrap_or_else(|e| e.into_inner()).push(scan);
    })
}

/// The agents' image: busybox (no bash, no musl loader, no passwd entry for uid 1000) with a
/// program only it has, on a `PATH` only its `Env` names, and a `WorkingDir` it lacks.
fn toolchain_image(registry: &Registry) {
    // Reproducible: its golden and warm snapshots are made by the first run and restored by
    // later ones (as a user's are), so the suite pays the runtimes' start-up once per guest
    // image, not once per run.
    ImageBuilder::busybox()
        .unwrap()
        .reproducible()
        .layer(
            Layer::new()
                .dir("opt", 0o755)
                .dir("opt/imagetools", 0o755)
                .dir("opt/imagetools/bin", 0o755)
                .file(
                    "opt/imagetools/bin/vbx-image-tool",
                    "#!/bin/sh\necho only-in-the-image-$((6*7))\n",
                    0o755,
                ),
        )
        .unwrap()
        .env("PATH=/opt/imagetools/bin:/bin")
        .env("VBX_IMAGE_VAR=from-image-env")
        .working_dir("/project")
        .push(registry, "toolchain:1")
        .unwrap();
}

fn write(root: &Path, rel: &str, text: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
    std::fs::write(p, text).expect("write");
}

/// Every file under `dir` (recursively) whose bytes contain `needle`.
fn files_containing(dir: &Path, needle: &[u8]) -> Vec<PathBuf> {
    let finder = memchr::memmem::Finder::new(needle);
    let mut hits = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(p),
                Ok(t)
                    if t.is_file()
                        && std::fs::read(&p).is_ok_and(|data| finder.find(&data).is_some()) =>
                {
                    hits.push(p)
                }
                _ => {}
            }
        }
    }
    hits
}

/// The first answered model call at conversation position `pos`.
fn call_at(calls: &[Recorded], pos: usize) -> Option<&Recorded> {
    calls
        .iter()
        .find(|r| r.is_model_call() && r.position == Some(pos) && r.status == 200)
}

/// Failed expectations, collected so that one (long) VM run reports all of them.
#[derive(Default)]
struct Checks(Vec<String>);

impl Checks {
    fn check(&mut self, ok: bool, what: impl FnOnce() -> String) {
        if !ok {
            self.0.push(what());
        }
    }
}

/// Keeps what the run left for a failure's diagnosis under the test target directory, the
/// key replaced by `<KEY>`.
fn keep(dir: &Path, name: &str, text: &str, key: &str) {
    let _ = std::fs::create_dir_all(dir);
    let _ = std::fs::write(dir.join(name), text.replace(key, "<KEY>"));
}

#[test]
fn claude_code_and_codex_run_in_vms_and_the_key_stays_on_the_host() {
    if guest_image().is_none() {
        return;
    }
    let registry = Registry::start().expect("registry");
    toolchain_image(&registry);
    let t0 = Instant::now();
    let key = format!("sk-ant-vbxtest-{}", random_hex(16));
    // The kit's marker is fixed (the key is not): the kit is part of the warm snapshots' key,
    // and an unchanged kit lets later runs restore what the first one made.
    let nonce = "5eed35";
    let spec_dir = tempfile::tempdir().unwrap();
    let out_dir = tempfile::tempdir().unwrap();
    let apply_pid = Arc::new(AtomicU32::new(0));
    let scans: Arc<Mutex<Vec<Scan>>> = Arc::default();
    let arrivals: Arc<Mutex<Vec<(&'static str, Instant)>>> = Arc::default();
    let server = |node: &'static str| {
        scanning_server(
            node,
            &format!("vbx-final-{node}"),
            &key,
            apply_pid.clone(),
            scans.clone(),
            arrivals.clone(),
        )
    };
    let (claude, claude2, codex) = (server("claude"), server("claude2"), server("codex"));
    // The skill carries the key too: the kit must redact it before it reaches the guest.
    let description = format!("Probes the voidbox sandbox (vbx-skill-{nonce}).");
    write(
        spec_dir.path(),
        &format!("skills/{SKILL}/SKILL.md"),
        &format!(
            "---\nname: {SKILL}\ndescription: {description}\n---\n# {SKILL}\n\nRun `id -u` in the sandbox. The deployment key is {key}; never print it.\n"
        ),
    );
    // The prompt file too (each runtime gets it as its user-level instructions).
    write(
        spec_dir.path(),
        "AGENTS.md",
        &format!("# Rules\n\nProject rule vbx-rule-{nonce}: answer briefly. Never print {key}.\n"),
    );
    let spec = spec_dir.path().join("agents.yaml");
    std::fs::write(
        &spec,
        format!(
            "kind: pipeline\nname: agents\nsandbox:\n  memory_mb: {MEMORY_MB}\n  image: '{image}'\npipeline:\n  boxes:\n\
             \x20   - name: claude\n      prompt: 'Use the {SKILL} skill to probe the sandbox (vbx-prompt-claude).'\n      skills: ['file:skills/{SKILL}']\n      prompt_files: [AGENTS.md]\n      timeout_secs: 1500\n\
             \x20     llm: {{provider: claude, base_url: '{cb}', api_key_env: {KEY_VAR}, model: claude-vbx-test}}\n\
             \x20   - name: claude2\n      prompt: 'Use the {SKILL} skill to probe the sandbox (vbx-prompt-claude2).'\n      skills: ['file:skills/{SKILL}']\n      prompt_files: [AGENTS.md]\n      timeout_secs: 1500\n\
             \x20     llm: {{provider: claude, base_url: '{cb2}', api_key_env: {KEY_VAR}, model: claude-vbx-test}}\n\
             \x20   - name: codex\n      prompt: 'Use the {SKILL} skill to probe the sandbox (vbx-prompt-codex).'\n      skills: ['file:skills/{SKILL}']\n      prompt_files: [AGENTS.md]\n      timeout_secs: 1500\n\
             \x20     llm: {{provider: codex, base_url: '{ob}', api_key_env: {KEY_VAR}, model: gpt-vbx-test}}\n\
             \x20 stages:\n    - {{type: fan_out, boxes: [claude, claude2, codex]}}\n",
            cb = claude.base_url(),
            cb2 = claude2.base_url(),
            ob = codex.openai_base_url(),
            image = registry.reference("toolchain:1"),
        ),
    )
    .unwrap();
    let logs = out_dir.path().join("logs");
    let tmp = out_dir.path().join("tmp");
    std::fs::create_dir_all(&tmp).unwrap();
    let child = Command::new(VOIDBOX)
        .arg("apply")
        .arg(&spec)
        .args([
            "--output",
            "json",
            "--max-parallel",
            "3",
            "--boot-timeout",
            "600",
        ])
        .arg("--logs-dir")
        .arg(&logs)
        .env("NO_COLOR", "1")
        .env("TMPDIR", &tmp)
        .env("XDG_STATE_HOME", out_dir.path().join("state"))
        .env(KEY_VAR, &key)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start voidbox apply");
    apply_pid.store(child.id(), Ordering::SeqCst);
    let out = child.wait_with_output().expect("voidbox apply");
    let wall = t0.elapsed();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    eprintln!("vm_agents: voidbox apply took {wall:?}\n--- stderr ---\n{stderr}");
    let scans = std::mem::take(&mut *scans.lock().unwrap_or_else(|e| e.into_inner()));
    let (claude_calls, claude2_calls, codex_calls) =
        (claude.requests(), claude2.requests(), codex.requests());
    drop((claude, claude2, codex));
    {
        let a = arrivals.lock().unwrap_or_else(|e| e.into_inner());
        for n in NODES {
            if let Some((_, at)) = a.iter().find(|(x, _)| *x == n) {
                eprintln!(
                    "vm_agents: {n}: first model request {:?} after apply started",
                    at.duration_since(t0)
                );
            }
        }
    }
    let kept = Path::new(env!("CARGO_TARGET_TMPDIR")).join("vm_agents");
    keep(&kept, "report.json", &stdout, &key);
    keep(&kept, "stderr.txt", &stderr, &key);
    for (name, calls) in [
        ("claude", &claude_calls),
        ("claude2", &claude2_calls),
        ("codex", &codex_calls),
    ] {
        let dump = serde_json::to_string_pretty(calls).unwrap_or_default();
        keep(&kept, &format!("{name}-requests.json"), &dump, &key);
    }

    let mut c = Checks::default();
    c.check(out.status.code() == Some(0), || {
        format!("voidbox apply exit {:?}", out.status.code())
    });
    let doc: Value = serde_json::from_str(&stdout).unwrap_or(Value::Null);
    c.check(doc.is_object(), || format!("no JSON report: {stdout}"));
    let outputs: Vec<String> = doc["output"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| v.as_str().unwrap_or_default().trim().to_string())
        .collect();
    c.check(
        outputs == ["vbx-final-claude", "vbx-final-claude2", "vbx-final-codex"],
        || format!("merged output {:#}", doc["output"]),
    );

    let nodes = doc["nodes"].as_array().cloned().unwrap_or_default();
    let node = |name: &str| {
        nodes
            .iter()
            .find(|n| n["name"] == name)
            .cloned()
            .unwrap_or(Value::Null)
    };
    for (name, runtime, tool, calls) in [
        ("claude", "claude-code", "Bash", &claude_calls),
        ("claude2", "claude-code", "Bash", &claude2_calls),
        ("codex", "codex", "shell", &codex_calls),
    ] {
        let n = node(name);
        eprintln!(
            "vm_agents: {name}: vm_start {} boot_ms {} exec_ms {} duration_ms {}",
            n["vm_start"], n["boot_ms"], n["exec_ms"], n["duration_ms"]
        );
        c.check(n["status"] == "succeeded", || {
            format!("{name}: status {} error {}", n["status"], n["error"])
        });
        let agent = &n["agent"];
        c.check(agent["runtime"] == runtime, || {
            format!("{name}: agent.runtime {}", agent["runtime"])
        });
        let tools: Vec<&str> = agent["tool_calls"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        c.check(tools.contains(&tool), || {
            format!("{name}: no `{tool}` in agent.tool_calls {tools:?}")
        });
        // The gateway forwarded exactly what the server received, and refused nothing.
        let gw = &n["gateway"];
        c.check(
            gw["requests"].as_u64().unwrap_or(0) >= 2 && gw["requests"] == json!(calls.len()),
            || {
                format!(
                    "{name}: gateway.requests {} (the server received {})",
                    gw["requests"],
                    calls.len()
                )
            },
        );
        c.check(gw["refused"] == 0 && gw["upstream_errors"] == 0, || {
            format!("{name}: gateway {gw}")
        });
        c.check(
            n["network"]["gateway_only"] == true && n["network"]["policy"].is_null(),
            || format!("{name}: network {}", n["network"]),
        );
        let kit = &n["kit"]["skills"][0];
        c.check(
            kit["name"] == SKILL && kit["redactions"].as_u64().unwrap_or(0) >= 1,
            || format!("{name}: kit {}", n["kit"]),
        );

        // Every request reached the server with the real key, swapped in by the gateway.
        for r in calls.iter() {
            c.check(r.credential() == Some(key.as_str()), || {
                format!(
                    "{name}: {} {} reached the server without the real key (status {})",
                    r.method, r.path, r.status
                )
            });
        }
        let first = call_at(calls, 0);
        let after_tool = call_at(calls, 1);
        c.check(
            first.is_some_and(|r| !r.body_contains("tool-ran-42")),
            || format!("{name}: no first model call, or it already carries a tool result"),
        );
        // The shell tool ran in its guest as uid 1000 and its output reached the model.
        let result = format!(
            "{IMAGE_TOOL_OUTPUT}\n{}\n{IMAGE_ENV_AND_DIR}\n1000",
            tool_output(name)
        );
        let ran = after_tool.is_some_and(|r| r.body_contains(&result));
        c.check(ran, || {
            format!(
                "{name}: the request after the tool turn lacks {result:?} (kept in {})",
                kept.display()
            )
        });
        match n["console_log"].as_str().map(std::fs::read) {
            Some(Ok(log)) => c.check(memchr::memmem::find(&log, key.as_bytes()).is_none(), || {
                format!("{name}: THE KEY IS IN THE CONSOLE LOG")
            }),
            other => c.check(false, || format!("{name}: no console log: {other:?}")),
        }
    }
    // Issue 35: every agent box restored its runtime already running; the two Claude Code
    // boxes of one configuration restored one warm snapshot (made by one of them), and each
    // went to its model as its own session.
    for name in NODES {
        let r = &node(name)["runtime"];
        c.check(r["start"] == "warm", || format!("{name}: runtime {r}"));
    }
    let (r1, r2) = (&node("claude")["runtime"], &node("claude2")["runtime"]);
    c.check(
        r1["snapshot"].is_string()
            && r1["snapshot"] == r2["snapshot"]
            && r1["snapshot"] != node("codex")["runtime"]["snapshot"],
        || {
            format!(
                "warm snapshots: claude {r1}, claude2 {r2}, codex {}",
                node("codex")["runtime"]
            )
        },
    );
    // Made by one of them, or by an earlier run (the image is reproducible), never by both.
    c.check(!(r1["created"] == true && r2["created"] == true), || {
        format!("both Claude Code boxes made the snapshot: {r1} {r2}")
    });
    eprintln!(
        "vm_agents: warm snapshots made by this run: claude {}, claude2 {}, codex {}",
        r1["created"],
        r2["created"],
        node("codex")["runtime"]["created"]
    );
    let sessions = |calls: &[Recorded]| -> Vec<String> {
        let mut s: Vec<String> = calls
            .iter()
            .filter(|r| r.is_model_call())
            .map(|r| {
                r.header("x-claude-code-session-id")
                    .unwrap_or("")
                    .to_string()
            })
            .collect();
        s.dedup();
        s
    };
    let (s1, s2) = (sessions(&claude_calls), sessions(&claude2_calls));
    c.check(
        s1.len() == 1 && s2.len() == 1 && !s1[0].is_empty() && s1 != s2,
        || format!("Claude Code session ids: claude {s1:?}, claude2 {s2:?}"),
    );
    for (name, calls, other) in [
        ("claude", &claude_calls, "claude2"),
        ("claude2", &claude2_calls, "claude"),
    ] {
        c.check(
            call_at(calls, 0).is_some_and(|r| {
                r.body_contains(&control(name)) && !r.body_contains(&format!("{})", control(other)))
            }),
            || format!("{name}'s first request does not carry its own prompt only"),
        );
    }
    let claude_agent = &node("claude")["agent"];
    c.check(
        claude_agent["skills"]
            .as_array()
            .is_some_and(|s| s.iter().any(|x| x == SKILL)),
        || {
            format!(
                "Claude Code's init does not list {SKILL}: {}",
                claude_agent["skills"]
            )
        },
    );
    // Each runtime read the prompt file from where the kit put it (Claude Code
    // `~/.claude/CLAUDE.md`, Codex `~/.codex/AGENTS.md`) and sent it to its model, redacted.
    for (name, calls, path) in [
        ("claude", &claude_calls, "/home/sandbox/.claude/CLAUDE.md"),
        ("claude2", &claude2_calls, "/home/sandbox/.claude/CLAUDE.md"),
        ("codex", &codex_calls, "/home/sandbox/.codex/AGENTS.md"),
    ] {
        let rule = format!("vbx-rule-{nonce}");
        c.check(
            call_at(calls, 0).is_some_and(|r| r.body_contains(&rule)),
            || format!("{name}'s first request lacks the prompt file's {rule}"),
        );
        let i = &node(name)["kit"]["instructions"];
        c.check(
            i["path"] == path && i["redactions"].as_u64().unwrap_or(0) >= 1,
            || format!("{name}: kit instructions {i}"),
        );
    }
    // Codex reports no skills: its instructions to the model name the staged one.
    c.check(
        call_at(&codex_calls, 0).is_some_and(|r| {
            r.body_contains(SKILL) && r.body_contains(&format!("vbx-skill-{nonce}"))
        }),
        || "Codex's first request does not name the staged skill".into(),
    );

    // Key isolation: the guest RAM of every VM, scanned while they ran.
    for node_name in NODES {
        let mine: Vec<&Scan> = scans.iter().filter(|s| s.node == node_name).collect();
        let Some(scan) = mine.first() else {
            c.check(false, || {
                format!("no guest RAM scan at {node_name}'s request")
            });
            continue;
        };
        c.check(!scan.vmms.is_empty(), || {
            format!("{node_name}: no VMM process found to scan")
        });
        for v in &scan.vmms {
            c.check(
                v.error.is_none()
                    && v.ram_mappings == 1
                    && v.ram_bytes == MEMORY_MB << 20
                    && v.unreadable == 0,
                || {
                    format!(
                        "{node_name}: guest RAM of VMM {} not scanned whole: {v:?}",
                        v.pid
                    )
                },
            );
            c.check(!v.in_ram.iter().any(|n| n.starts_with("key")), || {
                format!(
                    "{node_name}: THE KEY IS IN THE GUEST RAM of VMM {}: {v:?}",
                    v.pid
                )
            });
            c.check(v.writable_files.iter().all(|(_, has)| !has), || {
                format!(
                    "{node_name}: a file VMM {} writes holds the key: {v:?}",
                    v.pid
                )
            });
        }
        c.check(
            scan.vmms
                .iter()
                .any(|v| v.in_ram.iter().any(|n| n.starts_with(&control(node_name)))),
            || {
                format!(
                    "{node_name}: the positive control {} is in no guest's RAM: {scan:?}",
                    control(node_name)
                )
            },
        );
        eprintln!(
            "vm_agents: {node_name}: {} VMM(s), {} MiB of guest RAM scanned in {:?}",
            scan.vmms.len(),
            scan.vmms.iter().map(|v| v.ram_bytes).sum::<u64>() >> 20,
            scan.took
        );
        // The VMM process (host side, where a guest escape would land) does not inherit it.
        c.check(!scan.vmms.iter().any(|v| v.key_in_vmm_environ), || {
            format!("{node_name}: THE KEY IS IN A VMM PROCESS'S ENVIRONMENT")
        });
    }
    // Nothing the run wrote on the host, and nothing it printed, holds the key.
    let leaked = files_containing(out_dir.path(), key.as_bytes());
    c.check(leaked.is_empty(), || {
        format!("files holding the key: {leaked:?}")
    });
    c.check(!stdout.contains(&key), || {
        "THE JSON REPORT HOLDS THE KEY".into()
    });
    c.check(!stderr.contains(&key), || {
        "VOIDBOX'S STDERR HOLDS THE KEY".into()
    });
    eprintln!("vm_agents: test wall time {:?}", t0.elapsed());
    assert!(
        c.0.is_empty(),
        "{} failed expectation(s) (report, stderr and requests kept in {}):\n- {}",
        c.0.len(),
        kept.display(),
        c.0.join("\n- ")
    );
}

#[test]
fn the_memory_scan_finds_what_straddles_its_chunks() {
    // Memory of this process, read the way the VMMs' guest RAM is: through /proc/PID/mem.
    let mut mem = vec![0u8; 2 * CHUNK + 100];
    let marker = format!("vbx-marker-{}", random_hex(8));
    let at = CHUNK - 5; // across the first chunk boundary
    mem[at..at + marker.len()].copy_from_slice(marker.as_bytes());
    let wide = Needle::both("m", &marker)[1].bytes.clone();
    let end = mem.len() - wide.len();
    mem[end..].copy_from_slice(&wide);
    let mut needles: Vec<Needle> = Needle::both("m", &marker).into();
    needles.push(Needle::new(
        "absent",
        format!("vbx-absent-{}", random_hex(8)),
    ));
    let f = std::fs::File::open("/proc/self/mem").unwrap();
    let (found, unreadable) = scan_range(&f, mem.as_ptr() as u64, mem.len() as u64, &needles);
    assert_eq!((found, unreadable), (vec![true, true, false], 0));
    // An address range that is not mapped is counted, not skipped silently.
    let (_, unreadable) = scan_range(&f, 8, 4096, &needles);
    assert_eq!(unreadable, 4096);
    std::hint::black_box(&mem);
}

/// Runs `voidbox apply SPEC` with state and temp under `home` and `env` added.
fn apply_in(home: &Path, spec: &str, env: &[(&str, &str)], unset: &[&str]) -> Run {
    let mut c = Command::new(VOIDBOX);
    c.args(["apply", spec])
        .env("NO_COLOR", "1")
        .env("XDG_STATE_HOME", home.join("state"))
        .env("TMPDIR", home.join("tmp"));
    for (k, v) in env {
        c.env(k, v);
    }
    for k in unset {
        c.env_remove(k);
    }
    c.output().expect("run voidbox").into()
}

/// Exit 3 naming `field` at `spec:line`, `words` in the message, nothing started or left.
fn assert_refused(home: &Path, r: &Run, spec: &str, field: &str, line: usize, words: &[&str]) {
    assert_eq!(r.code, Some(3), "{}", r.stderr);
    assert!(r.stdout.is_empty(), "{}", r.stdout);
    let at = format!("{spec}:{line}:");
    let refusal = r
        .stderr
        .lines()
        .find(|l| l.contains(&at) && l.contains(&format!("`{field}`")))
        .unwrap_or_else(|| panic!("no refusal of `{field}` at {at}\n{}", r.stderr));
    for w in words {
        assert!(r.stderr.contains(w), "no {w:?} in: {refusal}\n{}", r.stderr);
    }
    assert!(r.stderr.contains("nothing was started"), "{}", r.stderr);
    assert!(!home.join("state").exists(), "a run directory was created");
    let left: Vec<_> = std::fs::read_dir(home.join("tmp")).unwrap().collect();
    assert!(left.is_empty(), "temp files left: {left:?}");
}

#[test]
fn a_missing_or_copied_key_is_refused_before_anything_starts() {
    let key = format!("sk-ant-vbxtest-{}", random_hex(16));
    // `api_key_env` names a variable the host does not have.
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(home.path().join("tmp")).unwrap();
    let unset = format!("VBX_TEST_UNSET_{}", random_hex(4).to_uppercase());
    let spec = voidbox_tests::write_file(
        home.path(),
        "missing.yaml",
        &format!("kind: agent\nname: a\nllm:\n  provider: claude\n  api_key_env: {unset}\nagent:\n  prompt: hi\n"),
    );
    let r = apply_in(home.path(), &spec, &[], &[&unset]);
    assert_refused(
        home.path(),
        &r,
        &spec,
        "llm.provider",
        4,
        &[&unset, "not set"],
    );

    // `sandbox.env: {VBX_TEST_KEY: ""}` would copy the key into the guest.
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(home.path().join("tmp")).unwrap();
    let spec = voidbox_tests::write_file(
        home.path(),
        "copied.yaml",
        &format!("kind: pipeline\nname: p\npipeline:\n  boxes:\n    - name: ok\n      prompt: hi\n      llm: {{provider: codex, api_key_env: {KEY_VAR}}}\n    - name: leaky\n      prompt: hi\n      llm: {{provider: claude, api_key_env: {KEY_VAR}}}\n      sandbox:\n        env: {{{KEY_VAR}: \"\", OTHER: \"\"}}\n"),
    );
    let r = apply_in(home.path(), &spec, &[(KEY_VAR, &key)], &[]);
    assert_refused(
        home.path(),
        &r,
        &spec,
        "pipeline.boxes[1].sandbox.env",
        12,
        &[KEY_VAR, "API key"],
    );
    assert!(!r.stderr.contains(&key), "the refusal prints the key");
    let errors = r
        .stderr
        .lines()
        .filter(|l| l.starts_with(&format!("error: {spec}:")))
        .count();
    assert_eq!(errors, 1, "only the leaky box is refused: {}", r.stderr);
}
