//! Held execs against the real agent (a host process on a Unix socket): a held program
//! outlives the connection that started it, buffers its output (bounded), and a later
//! connection attaches to it.

use std::time::{Duration, Instant};

use crate::common::*;
use voidbox_protocol::*;

/// Holds `req` as `name` and expects the `Ack`.
fn hold(c: &mut Client, name: &str, req: ExecRequest) {
    let id = c.id();
    let reply = c.request(Message::ExecRequest(ExecRequest {
        id,
        hold: Some(name.into()),
        ..req
    }));
    assert!(matches!(reply, Message::Ack(_)), "{reply:?}");
}

/// Holds `req` as `name` and returns the refusal.
fn hold_refused(c: &mut Client, name: &str, req: ExecRequest) -> Message {
    let id = c.id();
    c.request(Message::ExecRequest(ExecRequest {
        id,
        hold: Some(name.into()),
        ..req
    }))
}

fn info(c: &mut Client, name: &str) -> Result<HeldInfo, ErrorResponse> {
    let id = c.id();
    match c.request(Message::HeldQuery(HeldQuery {
        id,
        name: name.into(),
    })) {
        Message::HeldInfo(i) => Ok(i),
        Message::Error(e) => Err(e),
        other => panic!("{other:?}"),
    }
}

/// Sends an attach; the caller collects its messages.
fn send_attach(
    c: &mut Client,
    name: &str,
    stdin: &[u8],
    stream: bool,
    timeout: Option<u64>,
) -> RequestId {
    let id = c.id();
    c.send(&Message::ExecAttach(ExecAttach {
        id,
        name: name.into(),
        stdin: stdin.to_vec(),
        stdin_stream: stream,
        timeout_secs: timeout,
    }));
    id
}

fn attach(c: &mut Client, name: &str, stdin: &[u8], timeout: Option<u64>) -> ExecResult {
    send_attach(c, name, stdin, false, timeout);
    c.collect_one()
}

/// Attaches to `name` and kills it (cleanup: held programs outlive the agent's connections).
fn kill_held(c: &mut Client, name: &str) -> ExecResponse {
    let id = send_attach(c, name, b"", true, None);
    c.send(&Message::ExecSignal(ExecSignal { id, signal: 9 }));
    loop {
        match c.recv() {
            Message::ExecResponse(r) if r.id == id => return r,
            Message::ExecOutputChunk(_) => {}
            other => panic!("{other:?}"),
        }
    }
}

fn wait_info(
    c: &mut Client,
    name: &str,
    what: &str,
    mut cond: impl FnMut(&HeldInfo) -> bool,
) -> HeldInfo {
    let start = Instant::now();
    loop {
        let i = info(c, name).expect("held");
        if cond(&i) {
            return i;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "{what}: {i:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn held_exec_outlives_its_connection_and_a_new_one_attaches() {
    let agent = Agent::start();
    let mut c1 = agent.connect();
    assert!(c1.pong.info.capabilities.iter().any(|c| c == CAP_HELD));
    hold(
        &mut c1,
        "warm",
        ExecRequest {
            stdin: b"one\n".to_vec(),
            ..sh("read a; echo \"first $a\"; echo warn >&2; read b; echo \"second $b\"; read c; echo \"third $c\"; exit 3")
        },
    );
    // Output before the attach is buffered (the first line needs the initial stdin).
    let i = wait_info(&mut c1, "warm", "first line buffered", |i| {
        i.buffered_bytes == 15
    });
    assert!(!i.exited && i.pid > 0, "{i:?}");
    drop(c1);
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        process_alive(i.pid as i32),
        "the held program died with its connection"
    );

    let mut c2 = agent.connect();
    assert_eq!(info(&mut c2, "warm").unwrap().pid, i.pid);
    // Attached with streamed stdin: replay (seq from 0, checked by collect_one), prompt,
    // more stdin, then the response of the attaching request.
    let id = send_attach(&mut c2, "warm", b"two\n", true, Some(30));
    c2.send(&Message::ExecStdin(ExecStdin {
        id,
        eof: true,
        data: b"three\n".to_vec(),
    }));
    let r = c2.collect_one();
    assert_eq!(r.out(), "first one\nsecond two\nthird three\n");
    assert_eq!(String::from_utf8_lossy(&r.stderr), "warn\n");
    let resp = r.resp();
    assert_eq!(
        (resp.id, resp.exit_code, resp.timed_out),
        (id, Some(3), false),
        "{resp:?}"
    );
    assert_eq!((resp.stdout_bytes, resp.stderr_bytes), (33, 5));
    // Its status went to the attach: the name is free again, and the connection still works.
    let e = info(&mut c2, "warm").unwrap_err();
    assert_eq!(e.code, ErrorCode::NotFound);
    assert_eq!(c2.exec(sh("echo after")).out(), "after\n");
    hold(&mut c2, "warm", sh("exit 0"));
    assert_eq!(attach(&mut c2, "warm", b"", None).resp().exit_code, Some(0));
}

#[test]
fn refusals_not_found_busy_already_exists_and_limits() {
    let agent = Agent::start_with(&["--boot-params", "voidbox.allow=sh,cat"]);
    let mut c = agent.connect();
    // Unknown names, for an attach and a query.
    let r = attach(&mut c, "nobody", b"", None);
    assert_eq!(
        r.error.as_ref().map(|e| e.code),
        Some(ErrorCode::NotFound),
        "{r:?}"
    );
    assert_eq!(
        info(&mut c, "nobody").unwrap_err().code,
        ErrorCode::NotFound
    );
    // Invalid names.
    for bad in ["", "Upper", "a/b", &"x".repeat(65)] {
        match hold_refused(&mut c, bad, sh("true")) {
            Message::Error(e) => assert_eq!(e.code, ErrorCode::InvalidRequest, "{bad:?}"),
            other => panic!("{bad:?}: {other:?}"),
        }
    }
    // Outside the allowlist: refused like any exec, nothing held.
    match hold_refused(
        &mut c,
        "echo",
        ExecRequest {
            program: "echo".into(),
            ..Default::default()
        },
    ) {
        Message::ExecResponse(r) => assert_eq!(r.exit_code, Some(EXIT_NOT_ALLOWED), "{r:?}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(info(&mut c, "echo").unwrap_err().code, ErrorCode::NotFound);
    // A taken name; at most MAX_HELD.
    hold(&mut c, "h0", sh("cat"));
    match hold_refused(&mut c, "h0", sh("cat")) {
        Message::Error(e) => assert_eq!(e.code, ErrorCode::AlreadyExists, "{e:?}"),
        other => panic!("{other:?}"),
    }
    for i in 1..MAX_HELD {
        hold(&mut c, &format!("h{i}"), sh("cat"));
    }
    match hold_refused(&mut c, "one-more", sh("cat")) {
        Message::Error(e) => assert_eq!(e.code, ErrorCode::ResourceLimit, "{e:?}"),
        other => panic!("{other:?}"),
    }
    // Attached already: Busy, on this connection and on another.
    let id = send_attach(&mut c, "h0", b"", true, None);
    let mut other = agent.connect();
    let r = attach(&mut other, "h0", b"", None);
    assert_eq!(
        r.error.as_ref().map(|e| e.code),
        Some(ErrorCode::Busy),
        "{r:?}"
    );
    // The attach owns it now: its stdin and signals go by the attach's id.
    c.send(&Message::ExecStdin(ExecStdin {
        id,
        eof: true,
        data: b"echoed\n".to_vec(),
    }));
    let r = c.collect_one();
    assert_eq!(r.out(), "echoed\n");
    assert_eq!(r.resp().exit_code, Some(0));
    for i in 1..MAX_HELD {
        assert_eq!(kill_held(&mut c, &format!("h{i}")).signal, Some(9));
    }
}

#[test]
fn output_is_buffered_up_to_the_bound_then_the_program_waits() {
    const TOTAL: usize = 3_000_000;
    let agent = Agent::start();
    let mut c = agent.connect();
    hold(
        &mut c,
        "big",
        sh(&format!("head -c {TOTAL} /dev/zero; echo done >&2")),
    );
    let full = wait_info(&mut c, "big", "buffer full", |i| {
        i.buffered_bytes == HELD_BUFFER_BYTES as u64
    });
    // Backpressure: the program is stuck on its writes, not finished, and nothing more
    // is taken in.
    std::thread::sleep(Duration::from_millis(300));
    let later = info(&mut c, "big").unwrap();
    assert!(
        !later.exited && later.buffered_bytes == full.buffered_bytes,
        "{later:?}"
    );
    assert_eq!(later.running_threads, 0, "{later:?}");
    let r = attach(&mut c, "big", b"", None);
    assert_eq!(r.stdout.len(), TOTAL);
    assert!(r.stdout.iter().all(|&b| b == 0));
    assert_eq!(String::from_utf8_lossy(&r.stderr), "done\n");
    assert_eq!(r.resp().exit_code, Some(0));
    assert_eq!(r.resp().stdout_bytes, TOTAL as u64);
}

#[test]
fn a_program_that_exits_while_held_keeps_its_status_for_the_attach() {
    let agent = Agent::start();
    let mut c = agent.connect();
    hold(&mut c, "brief", sh("echo bye; exit 7"));
    drop(c);
    let mut c = agent.connect();
    let i = wait_info(&mut c, "brief", "exited", |i| i.exited);
    assert_eq!(i.buffered_bytes, 4, "{i:?}");
    assert!(
        wait_for(Duration::from_secs(3), || zombies_of(agent.pid())
            .is_empty()),
        "the held program was not reaped"
    );
    let r = attach(&mut c, "brief", b"ignored\n", Some(5));
    assert_eq!(r.out(), "bye\n");
    assert_eq!(r.resp().exit_code, Some(7));
    assert_eq!(info(&mut c, "brief").unwrap_err().code, ErrorCode::NotFound);
}

#[test]
fn cpu_time_grows_for_a_busy_program_and_not_for_a_blocked_one() {
    let agent = Agent::start();
    let mut c = agent.connect();
    hold(&mut c, "busy", sh("while :; do :; done"));
    hold(&mut c, "idle", sh("read x"));
    std::thread::sleep(Duration::from_millis(300));
    let (b0, i0) = (info(&mut c, "busy").unwrap(), info(&mut c, "idle").unwrap());
    std::thread::sleep(Duration::from_millis(700));
    let (b1, i1) = (info(&mut c, "busy").unwrap(), info(&mut c, "idle").unwrap());
    assert!(b1.cpu_ms >= b0.cpu_ms + 100, "{b0:?} → {b1:?}");
    assert_eq!(i1.cpu_ms, i0.cpu_ms, "{i0:?} → {i1:?}");
    assert_eq!((i0.running_threads, i1.running_threads), (0, 0));
    // The busy loop runs (or waits for a CPU) at some sampling point.
    assert!(
        wait_for(Duration::from_secs(5), || info(&mut c, "busy")
            .unwrap()
            .running_threads
            >= 1),
        "the busy program is never seen running"
    );
    assert_eq!(kill_held(&mut c, "busy").signal, Some(9));
    assert_eq!(kill_held(&mut c, "idle").signal, Some(9));
}

#[test]
fn the_deadline_starts_at_the_attach_and_the_attach_ends_with_its_connection() {
    // A 1 s default timeout: a held program is not subject to it while held.
    let agent = Agent::start_with(&["--boot-params", "voidbox.timeout=1"]);
    let mut c = agent.connect();
    hold(&mut c, "slow", sh("sleep 60"));
    hold(&mut c, "doomed", sh("sleep 60"));
    std::thread::sleep(Duration::from_millis(1500));
    let i = info(&mut c, "slow").unwrap();
    assert!(!i.exited, "{i:?}");
    let t0 = Instant::now();
    let r = attach(&mut c, "slow", b"", Some(1));
    let took = t0.elapsed();
    let resp = r.resp();
    assert!(resp.timed_out && resp.signal == Some(9), "{resp:?}");
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(5),
        "{took:?}"
    );
    // Attached on a connection that then closes: killed, like an exec.
    let pid = info(&mut c, "doomed").unwrap().pid as i32;
    let mut c2 = agent.connect();
    send_attach(&mut c2, "doomed", b"", true, Some(60));
    std::thread::sleep(Duration::from_millis(200));
    drop(c2);
    assert!(
        wait_for(Duration::from_secs(5), || !process_alive(pid)),
        "an attached program outlived its connection"
    );
    assert!(
        wait_for(Duration::from_secs(5), || info(&mut c, "doomed").is_err()),
        "its name was not released"
    );
}
