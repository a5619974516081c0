//! Runs the `voidbox-vmm` binary on tiny hand-assembled 64-bit "kernels" (raw ELF images that
//! write to the serial port and then reset, panic, fault, hang, or count for a snapshot).
//! Needs a usable /dev/kvm: without it every test that runs a guest fails, unless
//! `VOIDBOX_SKIP_VM_TESTS=1` (then they skip with a printed notice).

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

const ENTRY: u64 = 0x100_0000;

/// True when VM tests are to be skipped (`VOIDBOX_SKIP_VM_TESTS=1`, with a notice). Panics
/// when /dev/kvm is unusable otherwise: a test that could not run must not pass.
fn skip_vm_tests() -> bool {
    if std::env::var("VOIDBOX_SKIP_VM_TESTS").as_deref() == Ok("1") {
        eprintln!("VOIDBOX_SKIP_VM_TESTS=1: skipping a real-VM test");
        return true;
    }
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
    {
        panic!("VM tests need a usable /dev/kvm: {e}\n(set VOIDBOX_SKIP_VM_TESTS=1 to skip them)");
    }
    false
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
    if skip_vm_tests() {
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
    if skip_vm_tests() {
        return;
    }
    let g = Guest::new(&[print("smp\n"), RESET.to_vec()].concat());
    let r = g.run(&g.config(json!({"vcpus": 2, "compat": true, "memory_mb": 128})));
    assert_eq!(r.code(), Some(0), "{:?}", r.events);
    assert_eq!(r.console, "smp\n");
}

#[test]
fn kernel_panic_on_console_is_reported() {
    if skip_vm_tests() {
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
    if skip_vm_tests() {
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
    if skip_vm_tests() {
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
    if skip_vm_tests() {
        return;
    }
    let g = Guest::new(HANG);
    let r = g.run(&g.config(json!({"wall_limit_ms": 700})));
    assert_eq!(r.code(), Some(15), "{:?}", r.events);
    assert_eq!(r.exited()["reason"], "wall_limit");
}

#[test]
fn boot_timeout_without_guest_listener_and_vsock_socket_refuses_early_connects() {
    if skip_vm_tests() {
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
    if skip_vm_tests() {
        return;
    }
    let g = Guest::new(RESET);
    let r = g.run(&g.config(json!({"test_forbidden_syscall": true})));
    assert_eq!(r.status.signal(), Some(libc::SIGSYS), "{:?}", r.status);
    assert!(r.events.iter().all(|e| e["event"] != "booting"));
    // With network, the main thread narrows its filter to the base one: the net thread's
    // socket call (the hook's) still kills it.
    let net = json!({"dns_upstreams": ["127.0.0.1:9"]});
    let r = g.run(&g.config(json!({"test_forbidden_syscall": true, "network": net})));
    assert_eq!(r.status.signal(), Some(libc::SIGSYS), "{:?}", r.status);
    assert!(r.events.iter().all(|e| e["event"] != "booting"));
    // Without the hook every thread narrows and the guest runs to its reset.
    let r = g.run(&g.config(json!({"network": net})));
    assert_eq!(r.code(), Some(0), "{:?}", r.events);
    assert_eq!(r.exited()["reason"], "guest_reset");
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
    if skip_vm_tests() {
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
    if skip_vm_tests() {
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

/// A guest that prints a counter as 4 hex digits and a newline, then spins `delay` port reads
/// (`in al, 0x80`, each an exit to the VMM), forever. Its state lives in registers (r8) and
/// the serial port, so a restored copy prints the numbers after the snapshot point.
fn counter_guest(delay: u32) -> Vec<u8> {
    let mut c = vec![
        0x66, 0xba, 0xf8, 0x03, // mov dx, 0x3f8
        0x45, 0x31, 0xc0, // xor r8d, r8d
    ];
    // mov eax, r8d / inc r8d
    c.extend(counter_loop([0x44, 0x89, 0xc0], [0x41, 0xff, 0xc0], delay));
    c
}

/// The loop of [`counter_guest`] (`dx` = 0x3f8), with `load` (3 bytes: counter → eax) and
/// `inc` (3 bytes: counter += 1) choosing where the counter lives.
fn counter_loop(load: [u8; 3], inc: [u8; 3], delay: u32) -> Vec<u8> {
    let mut c = vec![0xb9, 0x0c, 0x00, 0x00, 0x00]; // tick: mov ecx, 12
    c.extend_from_slice(&load); // digit:
    c.extend_from_slice(&[
        0xd3, 0xe8, // shr eax, cl
        0x24, 0x0f, // and al, 0xf
        0x04, 0x30, // add al, '0'
        0x3c, 0x39, // cmp al, '9'
        0x76, 0x02, // jbe +2
        0x04, 0x07, // add al, 7
        0xee, // out dx, al
        0x83, 0xe9, 0x04, // sub ecx, 4
        0x79, 0xeb, // jns digit
        0xb0, 0x0a, // mov al, '\n'
        0xee, // out dx, al
    ]);
    c.extend_from_slice(&inc);
    c.push(0xbb); // mov ebx, delay
    c.extend_from_slice(&delay.to_le_bytes());
    c.extend_from_slice(&[
        0xe4, 0x80, // delay: in al, 0x80
        0xff, 0xcb, // dec ebx
        0x75, 0xfa, // jnz delay
        0xeb, 0xd3, // jmp tick
    ]);
    c
}

const GIB: u64 = 1 << 30;
/// A free page for the page directory of [`map_high`] (the VMM's boot page tables are at
/// 0x9000..0xc000 and map the first GiB only).
const HIGH_PD: u64 = 0xc000;

/// Maps the 2 MiB page holding guest-physical `addr` (≥ 1 GiB) at the same virtual address,
/// then `mov rdi, addr`.
fn map_high(addr: u64) -> Vec<u8> {
    assert!((GIB..512 * GIB).contains(&addr));
    let pd_entry = HIGH_PD + ((addr >> 21) & 511) * 8;
    let pdpt_entry = 0xa000 + (addr >> 30) * 8;
    let mut c = vec![0x48, 0xb8]; // mov rax, imm64: 2 MiB page, present, writable
    c.extend_from_slice(&((addr & !0x1f_ffff) | 0x83).to_le_bytes());
    c.extend_from_slice(&[0x48, 0x89, 0x04, 0x25]); // mov [disp32], rax
    c.extend_from_slice(&(pd_entry as u32).to_le_bytes());
    c.push(0xb8); // mov eax, imm32
    c.extend_from_slice(&((HIGH_PD | 3) as u32).to_le_bytes());
    c.extend_from_slice(&[0x48, 0x89, 0x04, 0x25]); // mov [disp32], rax
    c.extend_from_slice(&(pdpt_entry as u32).to_le_bytes());
    c.extend_from_slice(&[0x0f, 0x20, 0xd8, 0x0f, 0x22, 0xd8]); // mov rax, cr3; mov cr3, rax
    c.extend_from_slice(&[0x48, 0xbf]); // mov rdi, imm64
    c.extend_from_slice(&addr.to_le_bytes());
    c
}

/// A guest that writes "HIGH" at guest-physical `addr` (above 4 GiB), reads it back byte by
/// byte onto the console (unbacked memory would read as zeros), then `then`.
fn high_memory_guest(addr: u64, then: &[u8]) -> Vec<u8> {
    let mut c = map_high(addr);
    c.extend_from_slice(&[0xc7, 0x07]); // mov dword [rdi], imm32
    c.extend_from_slice(b"HIGH");
    c.extend_from_slice(&[0x66, 0xba, 0xf8, 0x03]); // mov dx, 0x3f8
    for i in 0..4 {
        c.extend_from_slice(&[0x8a, 0x47, i, 0xee]); // mov al, [rdi+i]; out dx, al
    }
    c.extend_from_slice(&[0xb0, b'\n', 0xee]); // mov al, '\n'; out dx, al
    c.extend_from_slice(then);
    c
}

/// [`counter_guest`] with its counter in guest memory at `addr` (above 4 GiB) instead of a
/// register: a restored copy continues from the saved memory, not from zero.
fn high_counter_guest(addr: u64, delay: u32) -> Vec<u8> {
    let mut c = map_high(addr);
    c.extend_from_slice(&[0x66, 0xba, 0xf8, 0x03]); // mov dx, 0x3f8
                                                    // mov eax, [rdi]; nop / inc dword [rdi]; nop
    c.extend(counter_loop([0x8b, 0x07, 0x90], [0xff, 0x07, 0x90], delay));
    c
}

/// A VMM process whose stdin stays open (config line, then control lines).
struct Vmm {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    events: std::sync::Arc<std::sync::Mutex<Vec<Value>>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Vmm {
    fn spawn(cfg: &Value) -> Vmm {
        let mut child = Command::new(env!("CARGO_BIN_EXE_voidbox-vmm"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(format!("{cfg}\n").as_bytes()).unwrap();
        let events = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let out = child.stdout.take().unwrap();
        let ev = events.clone();
        let reader = std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(out).lines() {
                let Ok(line) = line else { return };
                let v: Value = serde_json::from_str(&line)
                    .unwrap_or_else(|e| panic!("bad status line {line}: {e}"));
                ev.lock().unwrap().push(v);
            }
        });
        Vmm {
            child,
            stdin: Some(stdin),
            events,
            reader: Some(reader),
        }
    }

    fn send(&mut self, line: &str) {
        let s = self.stdin.as_mut().unwrap();
        s.write_all(format!("{line}\n").as_bytes()).unwrap();
        s.flush().unwrap();
    }

    /// Waits for the first event named one of `names`.
    fn wait_event(&self, names: &[&str], timeout: Duration) -> Value {
        let end = std::time::Instant::now() + timeout;
        loop {
            if let Some(e) = self
                .events
                .lock()
                .unwrap()
                .iter()
                .find(|e| names.iter().any(|n| e["event"] == *n))
            {
                return e.clone();
            }
            assert!(
                std::time::Instant::now() < end,
                "no {names:?} event: {:?}",
                self.events.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn events(&self) -> Vec<Value> {
        self.events.lock().unwrap().clone()
    }

    /// Waits (up to 240 s) until the console log `console` contains `marker`, then snapshots
    /// into `dir` and asserts the snapshot was saved.
    fn snapshot_after(&mut self, console: &Path, marker: &str, dir: &Path) {
        let end = std::time::Instant::now() + Duration::from_secs(240);
        while !std::fs::read_to_string(console)
            .unwrap_or_default()
            .contains(marker)
        {
            assert!(
                std::time::Instant::now() < end,
                "no {marker:?}: {}",
                std::fs::read_to_string(console).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        self.send(&json!({"snapshot": {"dir": dir}}).to_string());
        let saved = self.wait_event(
            &["snapshot_saved", "snapshot_failed", "exited"],
            Duration::from_secs(120),
        );
        assert_eq!(saved["event"], "snapshot_saved", "{:?}", self.events());
    }

    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        drop(self.stdin.take());
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

/// Complete counter values on a console, skipping the first segment (the snapshot may have
/// been taken in the middle of a line).
fn counter_lines(console: &str, skip_first: bool) -> Vec<u32> {
    let mut lines: Vec<&str> = console.split('\n').collect();
    lines.pop(); // after the last '\n': partial or empty
    if skip_first && !lines.is_empty() {
        lines.remove(0);
    }
    lines
        .iter()
        .map(|l| u32::from_str_radix(l, 16).unwrap_or_else(|_| panic!("bad line {l:?}")))
        .collect()
}

fn wait_for_lines(path: &Path, n: usize, timeout: Duration) -> String {
    let end = std::time::Instant::now() + timeout;
    loop {
        let c = std::fs::read_to_string(path).unwrap_or_default();
        if c.matches('\n').count() >= n {
            return c;
        }
        assert!(std::time::Instant::now() < end, "console has only {c:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn assert_consecutive(v: &[u32]) {
    for w in v.windows(2) {
        assert_eq!(w[1], w[0] + 1, "not consecutive: {v:?}");
    }
}

#[test]
fn snapshot_restore_and_snapshot_of_a_restored_vm() {
    if skip_vm_tests() {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let g = Guest::new(&counter_guest(1000));
    let snap = g.path("snap");
    let common = json!({"vcpus": 2, "image_hash": "counter-v1", "memory_mb": 64});
    let with = |extra: Value| {
        let mut c = g.config(common.clone());
        for (k, v) in extra.as_object().unwrap() {
            c[k] = v.clone();
        }
        c
    };

    // A: boot, snapshot through the control channel (after a malformed line), keep running.
    let a = with(json!({
        "snapshot_control": true,
        "vsock_uds": g.path("a.sock"),
        "console_log": g.path("a.log"),
        "wall_limit_ms": 120_000,
    }));
    let mut vmm = Vmm::spawn(&a);
    wait_for_lines(&g.path("a.log"), 3, Duration::from_secs(60));
    vmm.send("this is not json");
    // A directory that cannot be created: reported, and the guest resumes.
    vmm.send(&json!({"snapshot": {"dir": "/proc/voidbox-none/snap"}}).to_string());
    let failed = vmm.wait_event(&["snapshot_failed", "exited"], Duration::from_secs(120));
    assert_eq!(failed["event"], "snapshot_failed", "{:?}", vmm.events());
    assert!(
        failed["detail"].as_str().unwrap().contains("voidbox-none"),
        "{failed}"
    );
    vmm.send(&json!({"snapshot": {"dir": snap}}).to_string());
    let saved = vmm.wait_event(&["snapshot_saved", "exited"], Duration::from_secs(120));
    assert_eq!(saved["event"], "snapshot_saved", "{:?}", vmm.events());
    for f in [
        "pause_us",
        "total_ms",
        "state_bytes",
        "memory_bytes",
        "disk_bytes",
    ] {
        assert!(saved[f].is_u64(), "{f} missing: {saved}");
    }
    assert_eq!(saved["memory_bytes"], 64 << 20);
    assert!(saved["disk_bytes"].as_u64().unwrap() < 64 << 20, "{saved}");
    eprintln!("snapshot: {saved}");
    let names: Vec<String> = vmm
        .events()
        .iter()
        .filter_map(|e| e["event"].as_str().map(String::from))
        .collect();
    assert!(names.contains(&"control_rejected".to_string()), "{names:?}");
    for f in ["state.snap", "memory.bin"] {
        let m = std::fs::metadata(snap.join(f)).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o600, "{f}");
    }
    // The guest resumed after the snapshot.
    let before = std::fs::read_to_string(g.path("a.log")).unwrap();
    wait_for_lines(
        &g.path("a.log"),
        before.matches('\n').count() + 3,
        Duration::from_secs(60),
    );
    vmm.kill();
    let a_values = counter_lines(&std::fs::read_to_string(g.path("a.log")).unwrap(), false);
    assert_eq!(a_values[0], 0);
    assert_consecutive(&a_values);
    let a_last = *a_values.last().unwrap();

    // B: restore in a new process; it continues counting where A was at the snapshot. It is
    // snapshotted again into the same directory, whose memory file it has mapped.
    let b = with(json!({
        "restore": snap,
        "snapshot_control": true,
        "vsock_uds": g.path("b.sock"),
        "console_log": g.path("b.log"),
        "wall_limit_ms": 120_000,
    }));
    let mut vmm = Vmm::spawn(&b);
    let b_console = wait_for_lines(&g.path("b.log"), 4, Duration::from_secs(60));
    let b_first = counter_lines(&b_console, true)[0];
    assert!(
        (3..=a_last + 1).contains(&b_first),
        "restored guest printed {b_first:#x}; A printed up to {a_last:#x}"
    );
    let restored = vmm.wait_event(&["restored"], Duration::from_secs(5));
    assert!(restored["restore_us"].is_u64() && restored["verify_us"].is_u64());
    eprintln!("restore: {restored}");
    vmm.send(&json!({"snapshot": {"dir": snap}}).to_string());
    let saved = vmm.wait_event(
        &["snapshot_saved", "snapshot_failed", "exited"],
        Duration::from_secs(120),
    );
    assert_eq!(saved["event"], "snapshot_saved", "{:?}", vmm.events());
    let b_names: Vec<String> = vmm
        .events()
        .iter()
        .filter_map(|e| e["event"].as_str().map(String::from))
        .collect();
    assert_eq!(
        b_names[..4],
        ["started", "restored", "configured", "booting"],
        "{b_names:?}"
    );
    // Still running on the old mapping after its file was replaced.
    let before = std::fs::read_to_string(g.path("b.log")).unwrap();
    wait_for_lines(
        &g.path("b.log"),
        before.matches('\n').count() + 2,
        Duration::from_secs(60),
    );
    vmm.kill();
    let b_values = counter_lines(&std::fs::read_to_string(g.path("b.log")).unwrap(), true);
    assert_consecutive(&b_values);

    // C: restore the second-generation snapshot; the wall limit ends it.
    let c = with(json!({
        "restore": snap,
        "vsock_uds": g.path("c.sock"),
        "console_log": g.path("c.log"),
        "wall_limit_ms": 1500,
    }));
    let r = run_raw(&c.to_string(), &g.path("c.log"));
    assert_eq!(r.code(), Some(15), "{:?}", r.events);
    let c_values = counter_lines(&r.console, true);
    assert!(c_values.len() >= 2, "{:?}", r.console);
    assert_consecutive(&c_values);
    assert!(
        c_values[0] > b_first && c_values[0] <= b_values.last().unwrap() + 1,
        "C starts at {:#x}; B went {b_first:#x}..={:#x}",
        c_values[0],
        b_values.last().unwrap()
    );

    // Refused snapshots: exit 5 before any vCPU ran.
    let refused = |cfg: Value, what: &str| {
        let r = run_raw(&cfg.to_string(), &g.path("r.log"));
        assert_eq!(r.code(), Some(5), "{what}: {:?}", r.events);
        let ex = r.exited();
        assert_eq!(ex["reason"], "snapshot_refused", "{what}");
        assert!(
            r.events.iter().all(|e| e["event"] != "booting"),
            "{what}: {:?}",
            r.events
        );
        ex["detail"].as_str().unwrap_or_default().to_string()
    };
    let base =
        json!({"restore": snap, "vsock_uds": g.path("r.sock"), "console_log": g.path("r.log")});
    let with_base = |extra: Value| {
        let mut c = with(base.clone());
        for (k, v) in extra.as_object().unwrap() {
            c[k] = v.clone();
        }
        c
    };
    let d = refused(with_base(json!({"image_hash": "other"})), "image hash");
    assert!(d.contains("guest image"), "{d}");
    refused(with_base(json!({"memory_mb": 128})), "memory size");
    refused(with_base(json!({"vcpus": 1})), "vCPU count");
    refused(with_base(json!({"vsock_uds": null})), "device set");
    refused(with_base(json!({"vsock_cid": 9})), "vsock CID");
    refused(
        with_base(json!({"restore": g.path("missing")})),
        "missing dir",
    );
    // This guest never armed a restore page: a grant (a new secret it would never read) is
    // refused rather than ignored.
    let grant = json!({"secret": "ab".repeat(32), "entropy": "cd".repeat(64)});
    let d = refused(with_base(json!({"restore_grant": grant})), "restore grant");
    assert!(d.contains("no restore page"), "{d}");
    // Flip one byte of a data page of the memory file.
    let mp = snap.join("memory.bin");
    let mut bytes = std::fs::read(&mp).unwrap();
    let at = bytes.iter().position(|&b| b != 0).unwrap();
    bytes[at] ^= 0x40;
    std::fs::write(&mp, &bytes).unwrap();
    let d = refused(with_base(json!({})), "corrupt memory");
    assert!(d.contains("checksum"), "{d}");
}

#[test]
fn config_line_with_the_pipe_left_open() {
    if skip_vm_tests() {
        return;
    }
    // The engine writes `json + "\n"` and may keep stdin open: the VMM must not wait for EOF.
    let g = Guest::new(&[print("line\n"), RESET.to_vec()].concat());
    let vmm = Vmm::spawn(&g.config(json!({})));
    let ex = vmm.wait_event(&["exited"], Duration::from_secs(20));
    assert_eq!(ex["reason"], "guest_reset", "{:?}", vmm.events());
    vmm.kill();
}

#[test]
fn guests_above_the_mmio_gap_have_ram_from_4_gib() {
    if skip_vm_tests() {
        return;
    }
    // 4 GiB: RAM is [0, 3 GiB) + [4 GiB, 5 GiB); 16 GiB: [0, 3 GiB) + [4 GiB, 17 GiB). The
    // first and the last bytes above the gap hold what the guest wrote.
    for (mb, addr) in [
        (4096u32, 4 * GIB),
        (4096, 5 * GIB - 4),
        (16384, 17 * GIB - 4),
    ] {
        let g = Guest::new(&high_memory_guest(addr, RESET));
        let r = g.run(&g.config(json!({"memory_mb": mb})));
        assert_eq!(r.code(), Some(0), "{mb} MiB @ {addr:#x}: {:?}", r.events);
        assert_eq!(r.console, "HIGH\n", "{mb} MiB @ {addr:#x}");
    }
    // Past the end of RAM there is nothing (reads give zeros), so the check above means RAM.
    let g = Guest::new(&high_memory_guest(5 * GIB, RESET));
    let r = g.run(&g.config(json!({"memory_mb": 4096})));
    assert_eq!(r.code(), Some(0), "{:?}", r.events);
    assert_eq!(r.console, "\0\0\0\0\n");
}

/// Resident memory of process `pid` in bytes.
fn rss_bytes(pid: u64) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = s
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS in {s}"));
    kb * 1024
}

#[test]
fn a_16_gib_guest_costs_only_the_memory_it_touches() {
    if skip_vm_tests() {
        return;
    }
    let g = Guest::new(&high_memory_guest(16 * GIB, HANG));
    let vmm = Vmm::spawn(&g.config(json!({"memory_mb": 16384})));
    let pid = vmm.wait_event(&["started"], Duration::from_secs(10))["pid"]
        .as_u64()
        .unwrap();
    wait_for_lines(&g.path("console.log"), 1, Duration::from_secs(30));
    let rss = rss_bytes(pid);
    vmm.kill();
    assert_eq!(
        std::fs::read_to_string(g.path("console.log")).unwrap(),
        "HIGH\n"
    );
    assert!(
        rss < 256 << 20,
        "VMM of a 16 GiB guest has {rss} bytes resident"
    );
}

#[test]
fn snapshot_of_a_4_gib_guest_restores_memory_above_the_gap() {
    if skip_vm_tests() {
        return;
    }
    // The counter lives at 4 GiB + 4 MiB: in the memory file right after the 3 GiB below the
    // gap. A restored guest continues from the saved value.
    const COUNTER: u64 = 4 * GIB + (4 << 20);
    let g = Guest::new(&high_counter_guest(COUNTER, 1000));
    let snap = g.path("snap");
    let common = json!({"image_hash": "high-counter", "memory_mb": 4096, "wall_limit_ms": 120_000});
    let with = |extra: Value| {
        let mut c = g.config(common.clone());
        for (k, v) in extra.as_object().unwrap() {
            c[k] = v.clone();
        }
        c
    };
    let mut vmm = Vmm::spawn(&with(json!({
        "snapshot_control": true,
        "console_log": g.path("a.log"),
    })));
    wait_for_lines(&g.path("a.log"), 3, Duration::from_secs(60));
    vmm.send(&json!({"snapshot": {"dir": snap}}).to_string());
    let saved = vmm.wait_event(
        &["snapshot_saved", "snapshot_failed", "exited"],
        Duration::from_secs(120),
    );
    assert_eq!(saved["event"], "snapshot_saved", "{:?}", vmm.events());
    eprintln!("4 GiB snapshot: {saved}");
    assert_eq!(saved["memory_bytes"], 4u64 << 30);
    assert!(saved["disk_bytes"].as_u64().unwrap() < 64 << 20, "{saved}");
    vmm.kill();
    let a_values = counter_lines(&std::fs::read_to_string(g.path("a.log")).unwrap(), false);
    assert_consecutive(&a_values);
    let a_last = *a_values.last().unwrap();

    // The counter is in the memory file at its offset in the high region.
    use std::os::unix::fs::FileExt;
    let mem = std::fs::File::open(snap.join("memory.bin")).unwrap();
    assert_eq!(mem.metadata().unwrap().len(), 4 << 30);
    let mut word = [0u8; 4];
    mem.read_exact_at(&mut word, 3 * GIB + (4 << 20)).unwrap();
    let saved_counter = u32::from_le_bytes(word);
    assert!(
        (3..=a_last + 1).contains(&saved_counter),
        "saved counter {saved_counter:#x}; A printed up to {a_last:#x}"
    );

    // Restored in a new process: continues from the saved counter.
    let r = run_raw(
        &with(json!({"restore": snap, "console_log": g.path("b.log"), "wall_limit_ms": 1500}))
            .to_string(),
        &g.path("b.log"),
    );
    assert_eq!(r.code(), Some(15), "{:?}", r.events);
    let b_values = counter_lines(&r.console, true);
    assert!(b_values.len() >= 2, "{:?}", r.console);
    assert_consecutive(&b_values);
    assert!(
        b_values[0] > saved_counter - 1 && b_values[0] <= saved_counter + 1,
        "restored guest printed {:#x}, saved counter {saved_counter:#x}",
        b_values[0]
    );

    // A 3 GiB VM (one region) and a 5 GiB VM refuse it.
    for mb in [3072, 5120] {
        let r = run_raw(
            &with(json!({"restore": snap, "console_log": g.path("r.log"), "memory_mb": mb}))
                .to_string(),
            &g.path("r.log"),
        );
        assert_eq!(r.code(), Some(5), "{mb}: {:?}", r.events);
        let d = r.exited()["detail"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(d.contains("memory size"), "{d}");
    }
}

// ---- virtio-blk on the real guest kernel -------------------------------------------------

/// The cached guest kernel this host boots (`voidbox image build` puts it under
/// `$XDG_CACHE_HOME/voidbox/images/<hash>/`, or `VOIDBOX_TEST_KERNEL`) and whether it needs
/// the VMM's compat flags: the newest image of the profile the host's KVM probe asks for
/// (a `plain` kernel cannot boot where guest kernel code is emulated, nor `compat` one
/// well on hardware), built from this tree's recipe (config fragments and patches). Panics
/// when there is none: these tests must not pass unrun.
fn guest_kernel() -> (PathBuf, bool) {
    if let Some(k) = std::env::var_os("VOIDBOX_TEST_KERNEL") {
        let compat = std::env::var("VOIDBOX_TEST_KERNEL_COMPAT").as_deref() != Ok("0");
        return (PathBuf::from(k), compat);
    }
    let profile = match voidbox_vmm::probe::probe()
        .expect("the host KVM probe failed")
        .kind
    {
        voidbox_vmm::probe::HostKvm::Hardware => "plain",
        voidbox_vmm::probe::HostKvm::EmulatedKernelMode => "compat",
    };
    let recipe = Path::new(env!("CARGO_MANIFEST_DIR")).join("../guest-agent/image");
    let sha256 = |p: PathBuf| {
        use sha2::Digest;
        let text = std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        sha2::Sha256::digest(text)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    // Whether every recorded fragment/patch is this tree's and every patch of the tree is there.
    let current = |inputs: &Value| {
        let same = |key: &str, dir: &str| {
            inputs[key].as_array().is_some_and(|list| {
                list.iter().all(|f| {
                    f["name"].as_str().is_some_and(|n| {
                        let p = recipe.join(dir).join(n);
                        p.is_file() && f["sha256"].as_str() == Some(sha256(p).as_str())
                    })
                })
            })
        };
        let patches = std::fs::read_dir(recipe.join("patches")).map_or(0, |d| d.count());
        same("fragments", "config")
            && same("patches", "patches")
            && inputs["patches"].as_array().map(Vec::len) == Some(patches)
    };
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .expect("neither XDG_CACHE_HOME nor HOME is set")
        .join("voidbox/images");
    let mut found: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(&cache)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let m: Value =
                serde_json::from_slice(&std::fs::read(e.path().join("manifest.json")).ok()?)
                    .ok()?;
            if m["profile"] != profile || !current(&m["kernel_inputs"]) {
                return None;
            }
            let kernel = e.path().join(m["vmlinux"]["file"].as_str()?);
            let when = std::fs::metadata(&kernel).ok()?.modified().ok()?;
            Some((when, kernel))
        })
        .collect();
    found.sort();
    let (_, kernel) = found.pop().unwrap_or_else(|| {
        panic!(
            "no cached {profile} guest kernel of this tree's recipe under {}: run \
             `voidbox image build` first (or set VOIDBOX_TEST_KERNEL)",
            cache.display()
        )
    });
    (kernel, profile == "compat")
}

/// The host's busybox, which must be statically linked (Debian's `busybox-static`): it runs
/// alone in the test initramfs.
fn static_busybox() -> Vec<u8> {
    let b = std::fs::read("/bin/busybox")
        .expect("/bin/busybox missing: install busybox-static (scripts/test.sh does)");
    assert_eq!(&b[..4], b"\x7fELF", "/bin/busybox is not an ELF file");
    let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]) as usize;
    let phoff = u64::from_le_bytes(b[0x20..0x28].try_into().unwrap()) as usize;
    let (phentsize, phnum) = (u16_at(0x36), u16_at(0x38));
    const PT_INTERP: u32 = 3;
    let dynamic = (0..phnum).any(|i| {
        let o = phoff + i * phentsize;
        u32::from_le_bytes(b[o..o + 4].try_into().unwrap()) == PT_INTERP
    });
    assert!(
        !dynamic,
        "/bin/busybox is dynamically linked: install busybox-static"
    );
    b
}

/// One newc (SVR4 "070701") cpio entry.
fn cpio_entry(out: &mut Vec<u8>, ino: u32, name: &str, mode: u32, data: &[u8], rdev: (u32, u32)) {
    let fields = [
        ino,
        mode,
        0,
        0,
        1,
        0,
        data.len() as u32,
        0,
        0,
        rdev.0,
        rdev.1,
        name.len() as u32 + 1,
        0,
    ];
    out.extend_from_slice(b"070701");
    for f in fields {
        out.extend_from_slice(format!("{f:08x}").as_bytes());
    }
    out.extend_from_slice(name.as_bytes());
    out.push(0);
    while !out.len().is_multiple_of(4) {
        out.push(0);
    }
    out.extend_from_slice(data);
    while !out.len().is_multiple_of(4) {
        out.push(0);
    }
}

/// An uncompressed initramfs: static busybox, `/dev/console`, and `init` as `/init`.
fn test_initramfs(init: &str) -> Vec<u8> {
    let mut c = Vec::new();
    cpio_entry(&mut c, 1, "bin", 0o040755, &[], (0, 0));
    cpio_entry(&mut c, 2, "dev", 0o040755, &[], (0, 0));
    cpio_entry(&mut c, 3, "dev/console", 0o020600, &[], (5, 1));
    cpio_entry(&mut c, 4, "proc", 0o040755, &[], (0, 0));
    cpio_entry(
        &mut c,
        5,
        "bin/busybox",
        0o100755,
        &static_busybox(),
        (0, 0),
    );
    cpio_entry(&mut c, 6, "init", 0o100755, init.as_bytes(), (0, 0));
    cpio_entry(&mut c, 0, "TRAILER!!!", 0, &[], (0, 0));
    c
}

/// A guest booted from the real kernel with a test initramfs and disks.
struct DiskGuest {
    dir: tempfile::TempDir,
    kernel: PathBuf,
    compat: bool,
}

impl DiskGuest {
    fn new(init: &str) -> Self {
        let (kernel, compat) = guest_kernel();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("initramfs.cpio"), test_initramfs(init)).unwrap();
        Self {
            dir,
            kernel,
            compat,
        }
    }

    fn path(&self, n: &str) -> PathBuf {
        self.dir.path().join(n)
    }

    /// A disk file of `len` bytes starting with `content`.
    fn disk(&self, name: &str, content: &[u8], len: usize) -> PathBuf {
        let mut d = content.to_vec();
        d.resize(len, 0);
        std::fs::write(self.path(name), d).unwrap();
        self.path(name)
    }

    fn config(&self, disks: Value, extra: Value) -> Value {
        let mut c = json!({
            "kernel": self.kernel,
            "initramfs": self.path("initramfs.cpio"),
            "console_log": self.path("console.log"),
            "compat": self.compat,
            "memory_mb": 128,
            "wall_limit_ms": 300_000,
            "disks": disks,
        });
        for (k, v) in extra.as_object().unwrap() {
            c[k] = v.clone();
        }
        c
    }
}

const RO_CONTENT: &str = "voidbox-ro-disk-7c1e";

/// Init: mounts devtmpfs, reads the first line of the read-only /dev/vda, tries to write it,
/// writes `pattern` to /dev/vdb and flushes it (fsync: a FLUSH request), says whether it has
/// a network interface, then `then`.
fn disk_init(pattern: &str, then: &str) -> String {
    format!(
        r#"#!/bin/busybox sh
B=/bin/busybox
$B mount -t devtmpfs devtmpfs /dev
read -r ro < /dev/vda
echo "RO-CONTENT:$ro"
if $B dd if=/dev/zero of=/dev/vda bs=512 count=1 2>/dev/null; then echo RO-WRITE:accepted; else echo RO-WRITE:refused; fi
echo "{pattern}" > /dev/vdb
$B dd if=/dev/null of=/dev/vdb count=0 conv=notrunc,fsync 2>/dev/null && echo RW-FLUSHED
if $B ip link show eth0 >/dev/null 2>&1; then echo ETH0:present; else echo ETH0:absent; fi
{then}
"#
    )
}

#[test]
fn guest_reads_and_writes_virtio_blk_disks() {
    if skip_vm_tests() {
        return;
    }
    let pattern = format!("voidbox-rw-pattern-{}", std::process::id());
    let g = DiskGuest::new(&disk_init(&pattern, "echo BLK-TEST-DONE\n$B reboot -f"));
    let ro = g.disk("ro.img", format!("{RO_CONTENT}\n").as_bytes(), 64 << 10);
    let rw = g.disk("rw.img", b"", 128 << 10);
    let ro_before = std::fs::read(&ro).unwrap();
    let cfg = g.config(
        json!([{"path": ro, "read_only": true}, {"path": rw, "read_only": false}]),
        json!({}),
    );
    let t = std::time::Instant::now();
    let r = run_raw(&cfg.to_string(), &g.path("console.log"));
    eprintln!("disk guest ran {:?}; console:\n{}", t.elapsed(), r.console);
    assert_eq!(r.code(), Some(0), "{:?}", r.events);
    assert_eq!(r.exited()["reason"], "guest_reset");
    for marker in [
        format!("RO-CONTENT:{RO_CONTENT}"),
        "RO-WRITE:refused".to_string(),
        "RW-FLUSHED".to_string(),
        // No `network` in the config: no network device at all.
        "ETH0:absent".to_string(),
        "BLK-TEST-DONE".to_string(),
    ] {
        assert!(r.console.contains(&marker), "{marker} missing");
    }
    let written = std::fs::read(&rw).unwrap();
    assert_eq!(written.len(), 128 << 10);
    assert!(
        written.starts_with(format!("{pattern}\n").as_bytes()),
        "{:?}",
        String::from_utf8_lossy(&written[..64])
    );
    assert_eq!(std::fs::read(&ro).unwrap(), ro_before);
}

#[test]
fn disk_config_and_lock_errors() {
    let dir = tempfile::tempdir().unwrap();
    let console = dir.path().join("c.log");
    let disk = |name: &str, len: usize| {
        let p = dir.path().join(name);
        std::fs::write(&p, vec![0u8; len]).unwrap();
        p
    };
    let base = |disks: Value| {
        json!({"kernel": "/nonexistent", "console_log": console, "disks": disks}).to_string()
    };
    // Too many disks: rejected with the config.
    let many: Vec<Value> = (0..17)
        .map(|_| json!({"path": "/x", "read_only": true}))
        .collect();
    let r = run_raw(&base(json!(many)), &console);
    assert_eq!(r.code(), Some(2), "{:?}", r.events);
    if skip_vm_tests() {
        return;
    }
    // A size that is not a sector multiple: a config error naming the file.
    let odd = disk("odd.img", 1000);
    let r = run_raw(&base(json!([{"path": odd}])), &console);
    assert_eq!(r.code(), Some(2), "{:?}", r.events);
    let d = r.exited()["detail"].as_str().unwrap().to_string();
    assert!(d.contains("odd.img") && d.contains("512"), "{d}");
    let empty = disk("empty.img", 0);
    let r = run_raw(&base(json!([{"path": empty}])), &console);
    assert_eq!(r.code(), Some(2), "{:?}", r.events);
    // Missing: a setup error naming the file.
    let r = run_raw(
        &base(json!([{"path": dir.path().join("missing.img")}])),
        &console,
    );
    assert_eq!(r.code(), Some(4), "{:?}", r.events);
    assert!(r.exited()["detail"]
        .as_str()
        .unwrap()
        .contains("missing.img"));
    // Locked read-write by another VM (a held flock stands for it): a clear setup error.
    let held = disk("held.img", 4096);
    let f = std::fs::File::open(&held).unwrap();
    use std::os::unix::io::AsRawFd;
    // SAFETY: flock on a descriptor the test owns.
    assert_eq!(unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) }, 0);
    for ro in [true, false] {
        let r = run_raw(&base(json!([{"path": held, "read_only": ro}])), &console);
        assert_eq!(r.code(), Some(4), "{:?}", r.events);
        let d = r.exited()["detail"].as_str().unwrap().to_string();
        assert!(
            d.contains("held.img") && d.contains("in use by another VM"),
            "{d}"
        );
    }
}

#[test]
fn snapshot_of_a_vm_with_disks_restores_and_keeps_doing_io() {
    if skip_vm_tests() {
        return;
    }
    // After the disk checks the guest loops: drop the page cache, read /dev/vda again
    // (a device read), write `tick-N` to /dev/vdb and flush it, print `TICK N <ro line>`;
    // after tick 6 it reboots.
    let tick_loop = r#"$B mount -t proc proc /proc
n=0
while [ $n -lt 6 ]; do
  n=$((n+1))
  echo 3 > /proc/sys/vm/drop_caches
  read -r ro < /dev/vda
  echo "tick-$n" > /dev/vdb
  $B dd if=/dev/null of=/dev/vdb count=0 conv=notrunc,fsync 2>/dev/null
  echo "TICK $n $ro"
done
$B reboot -f"#;
    let g = DiskGuest::new(&disk_init("first", tick_loop));
    let ro = g.disk("ro.img", format!("{RO_CONTENT}\n").as_bytes(), 64 << 10);
    let rw = g.disk("rw.img", b"", 64 << 10);
    let disks = json!([{"path": ro, "read_only": true}, {"path": rw, "read_only": false}]);
    let snap = g.path("snap");
    let a = g.config(
        disks.clone(),
        json!({"snapshot_control": true, "console_log": g.path("a.log"), "image_hash": "blk"}),
    );
    let mut vmm = Vmm::spawn(&a);
    let a_log = g.path("a.log");
    vmm.snapshot_after(&a_log, "TICK 2 ", &snap);
    vmm.kill();
    let a_console = std::fs::read_to_string(&a_log).unwrap();
    let a_ticks = a_console.matches("TICK ").count();
    assert!(a_ticks < 6, "A finished before it was killed: {a_console}");

    // Refused: a disk missing, a disk of another mode, a disk of another size.
    let refused = |disks: Value, what: &str| {
        let cfg = g.config(
            disks,
            json!({"restore": snap, "console_log": g.path("r.log"), "image_hash": "blk"}),
        );
        let r = run_raw(&cfg.to_string(), &g.path("r.log"));
        assert_eq!(r.code(), Some(5), "{what}: {:?}", r.events);
        r.exited()["detail"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    refused(json!([{"path": ro, "read_only": true}]), "one disk");
    let d = refused(
        json!([{"path": ro, "read_only": true}, {"path": rw, "read_only": true}]),
        "mode",
    );
    assert!(d.contains("read-write in the snapshot"), "{d}");
    let bigger = g.disk("big.img", b"", 128 << 10);
    let d = refused(
        json!([{"path": ro, "read_only": true}, {"path": bigger, "read_only": false}]),
        "size",
    );
    assert!(d.contains("sectors"), "{d}");

    // B: restored; zero the RW file first, so what it holds afterwards was written by B.
    std::fs::write(&rw, vec![0u8; 64 << 10]).unwrap();
    let b = g.config(
        disks,
        json!({"restore": snap, "console_log": g.path("b.log"), "image_hash": "blk"}),
    );
    let r = run_raw(&b.to_string(), &g.path("b.log"));
    eprintln!("restored guest console:\n{}", r.console);
    assert_eq!(r.code(), Some(0), "{:?}", r.events);
    assert_eq!(r.exited()["reason"], "guest_reset");
    assert!(r.events.iter().any(|e| e["event"] == "restored"));
    // It went on from where A was snapshotted (tick 3, 4 or later), reading the RO disk.
    assert!(
        r.console.contains(&format!("TICK 6 {RO_CONTENT}")),
        "{}",
        r.console
    );
    assert!(!r.console.contains("TICK 1 "), "{}", r.console);
    let written = std::fs::read(&rw).unwrap();
    assert!(
        written.starts_with(b"tick-6\n"),
        "{:?}",
        String::from_utf8_lossy(&written[..16])
    );
}

// ---- virtio-net and the NAT on the real guest kernel -------------------------------------

/// A host HTTP server on 127.0.0.1 answering every request with `body`, for the rest of the
/// test process. Returns its port.
fn http_server(body: String) -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let body = body.clone();
            std::thread::spawn(move || {
                let mut req = Vec::new();
                let mut b = [0u8; 1024];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut b) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => req.extend_from_slice(&b[..n]),
                    }
                }
                let _ = write!(
                    s,
                    "HTTP/1.0 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            });
        }
    });
    port
}

/// Init: brings up eth0 as the guest agent would (10.0.2.15/24 via 10.0.2.2), pings the
/// gateway, then `then`.
fn net_init(then: &str) -> String {
    format!(
        r#"#!/bin/busybox sh
B=/bin/busybox
$B mount -t devtmpfs devtmpfs /dev
$B ip link set lo up
$B ip link set eth0 up && $B ip addr add 10.0.2.15/24 dev eth0 && $B ip route add default via 10.0.2.2 && echo NET-UP
if $B ping -c 1 -W 10 10.0.2.2 >/dev/null; then echo PING:ok; else echo PING:lost; fi
fetch() {{ r=$(printf 'GET / HTTP/1.0\r\n\r\n' | $B nc -w 20 10.0.2.2 "$1" | $B tail -n 1); [ -n "$r" ] && echo "$r" || echo refused; }}
{then}
"#
    )
}

fn network(allow_host_ports: &[u16]) -> Value {
    // The upstream is never asked (no DNS in these guests).
    json!({"policy": {"allow_host_ports": allow_host_ports}, "dns_upstreams": ["127.0.0.1:9"]})
}

#[test]
fn guest_reaches_an_allowed_host_port_and_is_refused_another() {
    if skip_vm_tests() {
        return;
    }
    let body = format!("voidbox-net-hello-{}", std::process::id());
    let allowed = http_server(body.clone());
    // A real service on the other port: only the policy keeps the guest out.
    let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let denied = other.local_addr().unwrap().port();
    let g = DiskGuest::new(&net_init(&format!(
        "echo \"FETCH:$(fetch {allowed})\"\necho \"DENIED-PORT:$(fetch {denied})\"\necho NET-TEST-DONE\n$B reboot -f"
    )));
    let cfg = g.config(json!([]), json!({"network": network(&[allowed])}));
    let t = std::time::Instant::now();
    let r = run_raw(&cfg.to_string(), &g.path("console.log"));
    eprintln!("net guest ran {:?}; console:\n{}", t.elapsed(), r.console);
    assert_eq!(r.code(), Some(0), "{:?}", r.events);
    for marker in [
        "NET-UP".to_string(),
        "PING:ok".to_string(),
        format!("FETCH:{body}"),
        "DENIED-PORT:refused".to_string(),
        "NET-TEST-DONE".to_string(),
    ] {
        assert!(r.console.contains(&marker), "{marker} missing");
    }
    other.set_nonblocking(true).unwrap();
    assert!(other.accept().is_err(), "the denied port was reached");
    // The denial reached the engine's status stream before the exit.
    let denials: Vec<&Value> = r
        .events
        .iter()
        .filter(|e| e["event"] == "net_denials")
        .collect();
    let last = denials.last().expect("no net_denials event");
    let entry = last["denials"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["port"] == denied)
        .unwrap_or_else(|| panic!("port {denied} not in {last}"));
    assert_eq!(entry["destination"], "10.0.2.2");
    assert_eq!(entry["protocol"], "tcp");
    assert!(entry["count"].as_u64().unwrap() >= 1);
    let pos = |name: &str| r.events.iter().position(|e| e["event"] == name).unwrap();
    assert!(pos("net_denials") < pos("exited"));
}

#[test]
fn snapshot_of_a_vm_with_network_restores_with_a_new_nat() {
    if skip_vm_tests() {
        return;
    }
    let one = http_server("one".into());
    let two = http_server("two".into());
    // After bringing up the network the guest fetches from both ports once per tick and
    // prints `NET n <first> <second>`; after tick 6 it reboots.
    let g = DiskGuest::new(&net_init(&format!(
        r#"n=0
while [ $n -lt 6 ]; do
  n=$((n+1))
  echo "NET $n $(fetch {one}) $(fetch {two})"
  $B sleep 1
done
$B reboot -f"#
    )));
    let snap = g.path("snap");
    // A allows only the first port.
    let a = g.config(
        json!([]),
        json!({"snapshot_control": true, "console_log": g.path("a.log"), "image_hash": "net",
               "network": network(&[one])}),
    );
    let mut vmm = Vmm::spawn(&a);
    let a_log = g.path("a.log");
    vmm.snapshot_after(&a_log, "NET 2 ", &snap);
    vmm.kill();
    let a_console = std::fs::read_to_string(&a_log).unwrap();
    assert!(a_console.contains("NET 1 one refused"), "{a_console}");
    assert!(!a_console.contains("NET 6 "), "A finished: {a_console}");

    // Refused: the same snapshot restored without a network device.
    let cfg = g.config(
        json!([]),
        json!({"restore": snap, "console_log": g.path("r.log"), "image_hash": "net"}),
    );
    let r = run_raw(&cfg.to_string(), &g.path("r.log"));
    assert_eq!(r.code(), Some(5), "{:?}", r.events);

    // B: restored with a policy allowing both ports. Its NAT is new and follows B's config.
    let b = g.config(
        json!([]),
        json!({"restore": snap, "console_log": g.path("b.log"), "image_hash": "net",
               "network": network(&[one, two])}),
    );
    let r = run_raw(&b.to_string(), &g.path("b.log"));
    eprintln!("restored net guest console:\n{}", r.console);
    assert_eq!(r.code(), Some(0), "{:?}", r.events);
    assert!(r.events.iter().any(|e| e["event"] == "restored"));
    assert!(r.console.contains("NET 6 one two"), "{}", r.console);
    assert!(!r.console.contains("NET 1 "), "{}", r.console);
}
