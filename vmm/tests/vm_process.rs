//! Runs the `voidbox-vmm` binary on tiny hand-assembled 64-bit "kernels" (raw ELF images that
//! write to the serial port and then reset, panic, fault or hang). Needs /dev/kvm; each test
//! is skipped (passes with a note) when KVM is unavailable.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

const ENTRY: u64 = 0x100_0000;

fn kvm_available() -> bool {
    if std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_ok()
    {
        true
    } else {
        eprintln!("skipping: /dev/kvm not available");
        false
    }
}

/// A minimal ELF64 executable with one PT_LOAD segment at ENTRY.
fn elf(code: &[u8]) -> Vec<u8> {
    let mut e = Vec::new();
    e.extend_from_slice(b"\x7fELF\x02\x01\x01\x00");
    e.extend_from_slice(&[0; 8]);
    e.extend_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    e.extend_from_slice(&0x3eu16.to_le_bytes()); // x86-64
    e.extend_from_slice(&1u32.to_le_bytes());
    e.extend_from_slice(&ENTRY.to_le_bytes());
    e.extend_from_slice(&64u64.to_le_bytes()); // phoff
    e.extend_from_slice(&0u64.to_le_bytes()); // shoff
    e.extend_from_slice(&0u32.to_le_bytes());
    e.extend_from_slice(&64u16.to_le_bytes());
    e.extend_from_slice(&56u16.to_le_bytes());
    e.extend_from_slice(&1u16.to_le_bytes());
    e.extend_from_slice(&64u16.to_le_bytes());
    e.extend_from_slice(&0u16.to_le_bytes());
    e.extend_from_slice(&0u16.to_le_bytes());
    assert_eq!(e.len(), 64);
    let off = 64 + 56;
    e.extend_from_slice(&1u32.to_le_bytes()); // PT_LOAD
    e.extend_from_slice(&5u32.to_le_bytes()); // R+X
    e.extend_from_slice(&(off as u64).to_le_bytes());
    e.extend_from_slice(&ENTRY.to_le_bytes()); // vaddr
    e.extend_from_slice(&ENTRY.to_le_bytes()); // paddr
    e.extend_from_slice(&(code.len() as u64).to_le_bytes());
    e.extend_from_slice(&(code.len() as u64).to_le_bytes());
    e.extend_from_slice(&0x1000u64.to_le_bytes());
    e.extend_from_slice(code);
    e
}

fn print(s: &str) -> Vec<u8> {
    let mut c = vec![0x66, 0xba, 0xf8, 0x03]; // mov dx, 0x3f8
    for b in s.bytes() {
        c.extend_from_slice(&[0xb0, b, 0xee]); // mov al, b; out dx, al
    }
    c
}

const RESET: &[u8] = &[0xb0, 0xfe, 0xe6, 0x64, 0xf4, 0xeb, 0xfd]; // out 0x64, 0xfe; hlt; jmp
const HANG: &[u8] = &[0xfa, 0xf4, 0xeb, 0xfd]; // cli; hlt; jmp

struct Run {
    status: std::process::ExitStatus,
    events: Vec<Value>,
    console: String,
}

impl Run {
    fn code(&self) -> Option<i32> {
        self.status.code()
    }
    fn exited(&self) -> &Value {
        self.events
            .iter()
            .find(|e| e["event"] == "exited")
            .expect("no exited event")
    }
}

struct Guest {
    dir: tempfile::TempDir,
}

impl Guest {
    fn new(code: &[u8]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("vmlinux"), elf(code)).unwrap();
        Self { dir }
    }
    fn path(&self, n: &str) -> PathBuf {
        self.dir.path().join(n)
    }
    fn config(&self, extra: Value) -> Value {
        let mut c = json!({
            "kernel": self.path("vmlinux"),
            "console_log": self.path("console.log"),
            "memory_mb": 64,
            "wall_limit_ms": 20000,
        });
        if let (Some(c), Some(e)) = (c.as_object_mut(), extra.as_object()) {
            for (k, v) in e {
                c.insert(k.clone(), v.clone());
            }
        }
        c
    }
    fn run(&self, cfg: &Value) -> Run {
        run_raw(&cfg.to_string(), &self.path("console.log"))
    }
}

fn run_raw(cfg: &str, console: &Path) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_voidbox-vmm"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(cfg.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let events = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad status line {l}: {e}")))
        .collect();
    Run {
        status: out.status,
        events,
        console: std::fs::read_to_string(console).unwrap_or_default(),
    }
}

#[test]
fn hello_then_reset_exits_cleanly() {
    if !kvm_available() {
        return;
    }
    let g = Guest::new(&[print("hello from guest\r\n"), RESET.to_vec()].concat());
    let r = g.run(&g.config(json!({})));
    assert_eq!(r.code(), Some(0), "{:?}", r.events);
    assert_eq!(r.console, "hello from guest\r\n");
    let names: Vec<&str> = r
        .events
        .iter()
        .filter_map(|e| e["event"].as_str())
        .collect();
    assert_eq!(names, ["started", "configured", "booting", "exited"]);
    assert_eq!(r.exited()["reason"], "guest_reset");
    let mode = std::fs::metadata(g.path("console.log")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(mode.permissions().mode() & 0o777, 0o600);
}

#[test]
fn two_vcpus_with_compat_flags_boot_and_reset() {
    if !kvm_available() {
        return;
    }
    let g = Guest::new(&[print("smp\n"), RESET.to_vec()].concat());
    let r = g.run(&g.config(json!({"vcpus": 2, "compat": true, "memory_mb": 128})));
    assert_eq!(r.code(), Some(0), "{:?}", r.events);
    assert_eq!(r.console, "smp\n");
}

#[test]
fn kernel_panic_on_console_is_reported() {
    if !kvm_available() {
        return;
    }
    let g = Guest::new(
        &[
            print("booting\nKernel panic - not syncing: voidbox test voidbox.secret=abcd\n"),
            RESET.to_vec(),
        ]
        .concat(),
    );
    let r = g.run(&g.config(json!({})));
    assert_eq!(r.code(), Some(10), "{:?}", r.events);
    let ex = r.exited();
    assert_eq!(ex["reason"], "kernel_panic");
    let tail: Vec<&str> = ex["console_tail"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert_eq!(
        tail,
        [
            "booting",
            "Kernel panic - not syncing: voidbox test voidbox.secret=<redacted>"
        ]
    );
    assert!(
        !r.console.contains("abcd"),
        "secret leaked into console log"
    );
}

#[test]
fn triple_fault_is_reported() {
    if !kvm_available() {
        return;
    }
    // ud2 with an empty IDT: #UD → #GP → #DF → shutdown.
    let g = Guest::new(&[print("x"), vec![0x0f, 0x0b]].concat());
    let r = g.run(&g.config(json!({})));
    let ex = r.exited();
    match r.code() {
        Some(11) => {
            assert_eq!(ex["reason"], "triple_fault");
            assert!(ex["detail"].as_str().unwrap().contains("rip"));
        }
        // An interpreting KVM may refuse to emulate the fault path instead.
        Some(12) => assert_eq!(ex["reason"], "emulation_failure"),
        other => panic!("unexpected exit {other:?}: {:?}", r.events),
    }
}

#[test]
fn emulation_failure_reports_instruction_bytes() {
    if !kvm_available() {
        return;
    }
    // popcnt rax, rax: interpreted KVM hosts cannot emulate it; hardware KVM runs it.
    let g = Guest::new(
        &[
            vec![0xf3, 0x48, 0x0f, 0xb8, 0xc0],
            print("ran\n"),
            RESET.to_vec(),
        ]
        .concat(),
    );
    let r = g.run(&g.config(json!({})));
    match r.code() {
        Some(12) => {
            let ex = r.exited();
            assert_eq!(ex["reason"], "emulation_failure");
            let d = ex["detail"].as_str().unwrap();
            assert!(d.contains("f3 48 0f b8 c0") && d.contains("popcnt"), "{d}");
        }
        Some(0) => assert_eq!(r.console, "ran\n"),
        other => panic!("unexpected exit {other:?}: {:?}", r.events),
    }
}

#[test]
fn wall_clock_limit_stops_a_hung_guest() {
    if !kvm_available() {
        return;
    }
    let g = Guest::new(HANG);
    let r = g.run(&g.config(json!({"wall_limit_ms": 700})));
    assert_eq!(r.code(), Some(15), "{:?}", r.events);
    assert_eq!(r.exited()["reason"], "wall_limit");
}

#[test]
fn boot_timeout_without_guest_listener_and_vsock_socket_refuses_early_connects() {
    if !kvm_available() {
        return;
    }
    let g = Guest::new(HANG);
    let sock = g.path("v.sock");
    let cfg = g.config(json!({"vsock_uds": sock, "boot_timeout_ms": 1500}));
    let console = g.path("console.log");
    let t = std::thread::spawn(move || run_raw(&cfg.to_string(), &console));
    // Wait for the socket, then try the hybrid handshake: the guest driver never came up,
    // so the VMM closes the connection.
    let mut s = None;
    for _ in 0..100 {
        if let Ok(c) = UnixStream::connect(&sock) {
            s = Some(c);
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut s = s.expect("vsock socket never appeared");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(b"CONNECT 1234\n").unwrap();
    let mut b = [0u8; 16];
    assert_eq!(s.read(&mut b).unwrap(), 0);
    let r = t.join().unwrap();
    assert_eq!(r.code(), Some(14), "{:?}", r.events);
    assert_eq!(r.exited()["reason"], "boot_timeout");
}

#[test]
fn syscall_outside_seccomp_filter_kills_the_vmm() {
    if !kvm_available() {
        return;
    }
    let g = Guest::new(RESET);
    let r = g.run(&g.config(json!({"test_forbidden_syscall": true})));
    assert_eq!(r.status.signal(), Some(libc::SIGSYS), "{:?}", r.status);
    assert!(r.events.iter().all(|e| e["event"] != "booting"));
}

#[test]
fn config_and_setup_errors_have_distinct_codes() {
    let dir = tempfile::tempdir().unwrap();
    let console = dir.path().join("c.log");
    let r = run_raw("{not json", &console);
    assert_eq!(r.code(), Some(2));
    assert_eq!(r.exited()["reason"], "config_error");
    let r = run_raw(
        &json!({"kernel": "/k", "console_log": console, "vcpus": 99}).to_string(),
        &console,
    );
    assert_eq!(r.code(), Some(2));
    if !kvm_available() {
        return;
    }
    let r = run_raw(
        &json!({"kernel": dir.path().join("missing"), "console_log": console}).to_string(),
        &console,
    );
    assert_eq!(r.code(), Some(4));
    assert_eq!(r.exited()["reason"], "setup_error");
    // A garbage kernel.
    std::fs::write(dir.path().join("junk"), vec![0u8; 4096]).unwrap();
    let r = run_raw(
        &json!({"kernel": dir.path().join("junk"), "console_log": console}).to_string(),
        &console,
    );
    assert_eq!(r.code(), Some(4));
}

#[test]
fn config_from_an_inherited_fd() {
    if !kvm_available() {
        return;
    }
    let g = Guest::new(&[print("fd\n"), RESET.to_vec()].concat());
    let cfg = g.path("cfg.json");
    std::fs::write(&cfg, g.config(json!({})).to_string()).unwrap();
    let f = std::fs::File::open(&cfg).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_voidbox-vmm"))
        .args(["--config-fd", "0"])
        .stdin(Stdio::from(f))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
}
