use super::*;
use std::os::unix::net::UnixListener;
use voidbox_protocol::blocking::server_handshake;
use voidbox_protocol::{Ack, ExecOutputChunk, GuestInfo, CAP_REKEY_SECRET_ONLY};

/// A fake hybrid-vsock endpoint + agent on a Unix socket.
fn fake_guest(
    secret: SessionSecret,
    serve: impl FnOnce(&mut UnixStream) + Send + 'static,
) -> (tempfile::TempDir, std::thread::JoinHandle<()>) {
    fake_guest_with(secret, GuestInfo::default(), serve)
}

/// [`fake_guest`] reporting `info` in its handshake.
fn fake_guest_with(
    secret: SessionSecret,
    info: GuestInfo,
    serve: impl FnOnce(&mut UnixStream) + Send + 'static,
) -> (tempfile::TempDir, std::thread::JoinHandle<()>) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v.sock");
    let l = UnixListener::bind(&path).unwrap();
    let t = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut line = [0u8; 13];
        s.read_exact(&mut line).unwrap();
        assert_eq!(&line, b"CONNECT 1234\n");
        s.write_all(b"OK 1073741824\n").unwrap();
        if server_handshake(&mut s, &secret, info).is_ok() {
            serve(&mut s);
        }
    });
    (dir, t)
}

#[test]
fn exec_streams_output_and_skips_strays() {
    let secret = SessionSecret::random().unwrap();
    let (dir, t) = fake_guest(secret.clone(), |s| {
        let Message::ExecRequest(r) = read_message(s).unwrap() else {
            panic!("expected exec")
        };
        assert_eq!(r.program, "echo");
        let chunk = |stream, data: &[u8]| {
            Message::ExecOutputChunk(ExecOutputChunk {
                id: r.id,
                stream,
                seq: 0,
                data: data.to_vec(),
            })
        };
        write_message(s, &chunk(OutputStream::Stdout, b"hi\n")).unwrap();
        write_message(s, &Message::Ack(voidbox_protocol::Ack { id: 999.into() })).unwrap();
        write_message(s, &chunk(OutputStream::Stderr, b"err\n")).unwrap();
        let resp = ExecResponse {
            id: r.id,
            exit_code: Some(3),
            ..ExecResponse::default()
        };
        write_message(s, &Message::ExecResponse(resp)).unwrap();
    });
    let s = try_connect(
        &dir.path().join("v.sock"),
        AGENT_PORT,
        Duration::from_secs(5),
    )
    .unwrap()
    .unwrap();
    let (mut g, _) = GuestConn::handshake(s, &secret, None, Duration::from_secs(5)).unwrap();
    let mut got = Vec::new();
    let r = g
        .exec(
            ExecRequest {
                program: "echo".into(),
                ..ExecRequest::default()
            },
            &mut |st, d| got.push((st, d.to_vec())),
        )
        .unwrap();
    assert_eq!(r.exit_code, Some(3));
    assert_eq!(
        got,
        vec![
            (OutputStream::Stdout, b"hi\n".to_vec()),
            (OutputStream::Stderr, b"err\n".to_vec())
        ]
    );
    t.join().unwrap();
}

#[test]
fn wrong_secret_is_auth_rejected() {
    let secret = SessionSecret::random().unwrap();
    let (dir, t) = fake_guest(secret, |_| {});
    let s = try_connect(
        &dir.path().join("v.sock"),
        AGENT_PORT,
        Duration::from_secs(5),
    )
    .unwrap()
    .unwrap();
    let other = SessionSecret::random().unwrap();
    assert!(matches!(
        GuestConn::handshake(s, &other, None, Duration::from_secs(5)),
        Err(SandboxError::AuthRejected)
    ));
    t.join().unwrap();
}

fn connect(dir: &tempfile::TempDir, secret: &SessionSecret) -> GuestConn {
    let s = try_connect(
        &dir.path().join("v.sock"),
        AGENT_PORT,
        Duration::from_secs(5),
    )
    .unwrap()
    .unwrap();
    GuestConn::handshake(s, secret, None, Duration::from_secs(5))
        .unwrap()
        .0
}

/// Fake guest side: reads a `Rekey` and checks that it carries `expect`.
fn read_rekey(s: &mut UnixStream, expect: &SessionSecret) -> voidbox_protocol::Rekey {
    let Message::Rekey(r) = read_message(s).unwrap() else {
        panic!("expected Rekey")
    };
    assert_eq!(&r.secret, expect);
    r
}

/// Reads the Rekey, acknowledges it and returns the Ping that follows.
fn ack_rekey(s: &mut UnixStream, expect: &SessionSecret) -> voidbox_protocol::Ping {
    let r = read_rekey(s, expect);
    write_message(s, &Message::Ack(Ack { id: r.id })).unwrap();
    let Message::Ping(p) = read_message(s).unwrap() else {
        panic!("expected Ping")
    };
    p
}

fn pong_with(id: voidbox_protocol::RequestId, cap: &str) -> Message {
    let info = GuestInfo {
        capabilities: vec!["exec".into(), cap.into()],
        ..GuestInfo::default()
    };
    Message::Pong(Pong::new(id, info))
}

#[test]
fn rekey_sends_entropy_and_time_then_pings_with_the_new_secret() {
    let boot = SessionSecret::random().unwrap();
    let new = SessionSecret::random().unwrap();
    let policy = GuestPolicy {
        allowlist: Some(vec!["sh".into()]),
        ..GuestPolicy::default()
    };
    let (expect, want_policy) = (new.clone(), policy.clone());
    let (dir, t) = fake_guest(boot.clone(), move |s| {
        let r = read_rekey(s, &expect);
        assert_eq!(r.entropy.len(), REKEY_ENTROPY_LEN);
        assert!(r.entropy.iter().any(|&b| b != 0), "entropy is random");
        let now = unix_time_ns().unwrap();
        assert!(
            now.abs_diff(r.unix_time_ns) < 60_000_000_000,
            "host time sent"
        );
        // A reply for another request is skipped.
        write_message(s, &Message::Ack(Ack { id: 999.into() })).unwrap();
        write_message(s, &Message::Ack(Ack { id: r.id })).unwrap();
        let Message::Ping(p) = read_message(s).unwrap() else {
            panic!("expected Ping")
        };
        assert_eq!(p.secret, expect, "the Ping presents the new secret");
        assert_eq!(p.policy, Some(want_policy));
        assert_ne!(p.id, r.id);
        write_message(s, &pong_with(p.id, CAP_REKEY)).unwrap();
    });
    let mut g = connect(&dir, &boot);
    let pong = g.rekey(&new, Some(policy), Duration::from_secs(5)).unwrap();
    assert!(pong.info.capabilities.iter().any(|c| c == CAP_REKEY));
    t.join().unwrap();
}

#[test]
fn refused_rekey_is_a_guest_error_and_sends_no_ping() {
    let boot = SessionSecret::random().unwrap();
    let new = SessionSecret::random().unwrap();
    let expect = new.clone();
    let (dir, t) = fake_guest(boot.clone(), move |s| {
        let r = read_rekey(s, &expect);
        let refusal = Message::error(
            r.id,
            ErrorCode::PermissionDenied,
            "re-key refused: reseeding the kernel RNG failed",
        );
        write_message(s, &refusal).unwrap();
        // Nothing follows: the host must not present the new secret.
        assert!(matches!(read_message(s), Err(ProtocolError::Closed)));
    });
    let mut g = connect(&dir, &boot);
    match g.rekey(&new, None, Duration::from_secs(5)) {
        Err(SandboxError::Guest {
            what,
            code,
            message,
        }) => {
            assert_eq!(
                (what.as_str(), code),
                ("rekey", ErrorCode::PermissionDenied)
            );
            assert!(message.contains("RNG"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    drop(g);
    t.join().unwrap();
}

#[test]
fn rekey_without_reseed_and_clock_is_rejected() {
    let boot = SessionSecret::random().unwrap();
    let new = SessionSecret::random().unwrap();
    let expect = new.clone();
    let (dir, t) = fake_guest(boot.clone(), move |s| {
        let p = ack_rekey(s, &expect);
        write_message(s, &pong_with(p.id, CAP_REKEY_SECRET_ONLY)).unwrap();
    });
    let mut g = connect(&dir, &boot);
    match g.rekey(&new, None, Duration::from_secs(5)) {
        Err(SandboxError::Guest { code, message, .. }) => {
            assert_eq!(code, ErrorCode::Unsupported);
            assert!(message.contains("reseed"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    t.join().unwrap();
}

#[test]
fn rekey_ping_refused_is_auth_rejected() {
    let boot = SessionSecret::random().unwrap();
    let new = SessionSecret::random().unwrap();
    let expect = new.clone();
    let (dir, t) = fake_guest(boot.clone(), move |s| {
        let p = ack_rekey(s, &expect);
        let no = Message::error(p.id, ErrorCode::Unauthorized, "authentication failed");
        write_message(s, &no).unwrap();
    });
    let mut g = connect(&dir, &boot);
    assert!(matches!(
        g.rekey(&new, None, Duration::from_secs(5)),
        Err(SandboxError::AuthRejected)
    ));
    t.join().unwrap();
}

#[test]
fn unanswered_rekey_times_out() {
    let boot = SessionSecret::random().unwrap();
    let new = SessionSecret::random().unwrap();
    let expect = new.clone();
    let (dir, t) = fake_guest(boot.clone(), move |s| {
        read_rekey(s, &expect);
        // Silent until the host gives up and closes.
        assert!(read_message(s).is_err());
    });
    let mut g = connect(&dir, &boot);
    let limit = Duration::from_millis(200);
    match g.rekey(&new, None, limit) {
        Err(SandboxError::Timeout(what, after)) => {
            assert_eq!((what.as_str(), after), ("rekey", limit))
        }
        other => panic!("{other:?}"),
    }
    drop(g);
    t.join().unwrap();
}

/// Deterministic bytes that differ at every offset of a frame.
fn pattern(len: usize) -> Vec<u8> {
    let mut x: u32 = 0x2545_f491;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

#[test]
fn inputs_above_one_frame_are_streamed_whole_as_file_and_stdin() {
    // Larger than MAX_MESSAGE_SIZE: it cannot travel in any single frame.
    let size = voidbox_protocol::MAX_MESSAGE_SIZE as usize + (5 << 20) + 3;
    let data = std::sync::Arc::new(pattern(size));
    let want = std::sync::Arc::clone(&data);
    let secret = SessionSecret::random().unwrap();
    let (dir, t) = fake_guest(secret.clone(), move |s| {
        // input.json: a chunked WriteFile, reassembled and compared.
        let Message::WriteFile(w) = read_message(s).unwrap() else {
            panic!("expected WriteFile")
        };
        assert!(w.more && w.create_parents);
        let mut file = w.contents.clone();
        loop {
            let Message::FileChunk(c) = read_message(s).unwrap() else {
                panic!("expected FileChunk")
            };
            assert_eq!(c.offset, file.len() as u64);
            file.extend_from_slice(&c.data);
            if c.last {
                break;
            }
        }
        assert!(file == *want, "file arrives whole");
        write_message(s, &Message::Ack(Ack { id: w.id })).unwrap();
        // stdin: streamed, echoed back as output while it arrives (a child that writes
        // as it reads, like `tr`), so the host must read and write at once.
        let Message::ExecRequest(r) = read_message(s).unwrap() else {
            panic!("expected exec")
        };
        assert!(r.stdin_stream && r.stdin.is_empty());
        let (mut seq, mut total) = (0, 0usize);
        loop {
            let Message::ExecStdin(c) = read_message(s).unwrap() else {
                panic!("expected ExecStdin")
            };
            assert!(c.data.len() <= STDIN_CHUNK);
            for piece in c.data.chunks(voidbox_protocol::OUTPUT_CHUNK_SIZE) {
                let out = Message::ExecOutputChunk(ExecOutputChunk {
                    id: r.id,
                    stream: OutputStream::Stdout,
                    seq,
                    data: piece.to_vec(),
                });
                write_message(s, &out).unwrap();
                seq += 1;
            }
            total += c.data.len();
            if c.eof {
                break;
            }
        }
        let resp = ExecResponse {
            id: r.id,
            exit_code: Some(0),
            stdout_bytes: total as u64,
            ..ExecResponse::default()
        };
        write_message(s, &Message::ExecResponse(resp)).unwrap();
    });
    let mut g = connect(&dir, &secret);
    g.write_file("/workspace/input.json", &data, Some(0o644))
        .unwrap();
    let mut echoed = Vec::with_capacity(size);
    let r = g
        .exec(
            ExecRequest {
                program: "cat".into(),
                stdin: data.to_vec(),
                ..ExecRequest::default()
            },
            &mut |_, d| echoed.extend_from_slice(d),
        )
        .unwrap();
    assert_eq!(r.exit_code, Some(0));
    assert_eq!(r.stdout_bytes, size as u64);
    assert!(echoed == *data, "stdin arrives whole");
    t.join().unwrap();
}

#[test]
fn pty_session_forwards_both_ways_and_survives_refusals() {
    let secret = SessionSecret::random().unwrap();
    let (dir, t) = fake_guest(secret.clone(), |s| {
        let Message::PtyOpen(o) = read_message(s).unwrap() else {
            panic!("expected PtyOpen")
        };
        assert_eq!((o.program.as_str(), o.rows, o.cols), ("/bin/sh", 30, 100));
        write_message(s, &Message::Ack(Ack { id: o.id })).unwrap();
        let out = |data: &[u8]| {
            Message::PtyData(PtyData {
                id: o.id,
                data: data.to_vec(),
            })
        };
        write_message(s, &out(b"$ ")).unwrap();
        let Message::PtyData(d) = read_message(s).unwrap() else {
            panic!("expected input")
        };
        assert_eq!(d.data, b"exit 3\r");
        let Message::PtyResize(r) = read_message(s).unwrap() else {
            panic!("expected a resize")
        };
        assert_eq!((r.rows, r.cols), (40, 120));
        // Dropped input does not end the session; data for other ids is skipped.
        let full = Message::error(o.id, ErrorCode::ResourceLimit, "queue is full");
        write_message(s, &full).unwrap();
        let stray = Message::PtyData(PtyData {
            id: 999.into(),
            data: b"other".to_vec(),
        });
        write_message(s, &stray).unwrap();
        write_message(s, &out(b"bye\r\n")).unwrap();
        let Message::PtyClose(c) = read_message(s).unwrap() else {
            panic!("expected PtyClose")
        };
        assert_eq!(c.id, o.id);
        let end = ExecResponse {
            id: o.id,
            exit_code: Some(3),
            ..ExecResponse::default()
        };
        write_message(s, &Message::ExecResponse(end)).unwrap();
    });
    let mut g = connect(&dir, &secret);
    let open = PtyOpen {
        program: "/bin/sh".into(),
        rows: 30,
        cols: 100,
        ..PtyOpen::default()
    };
    let input = std::cell::OnceCell::new();
    let (mut output, mut refused) = (Vec::new(), Vec::new());
    let r = g
        .pty(
            open,
            &mut |i| {
                i.data(b"exit 3\r").unwrap();
                i.resize(40, 120).unwrap();
                assert!(input.set(i).is_ok());
            },
            &mut |e| match e {
                PtyEvent::Output(d) => {
                    output.extend_from_slice(d);
                    if output.ends_with(b"bye\r\n") {
                        input.get().unwrap().close().unwrap();
                    }
                }
                PtyEvent::Refused { code, message } => refused.push((code, message.to_string())),
            },
        )
        .unwrap();
    assert_eq!(r.exit_code, Some(3));
    assert_eq!(output, b"$ bye\r\n");
    assert_eq!(
        refused,
        [(ErrorCode::ResourceLimit, "queue is full".to_string())]
    );
    t.join().unwrap();
}

#[test]
fn refused_pty_open_is_a_guest_error() {
    let secret = SessionSecret::random().unwrap();
    let (dir, t) = fake_guest(secret.clone(), |s| {
        let Message::PtyOpen(o) = read_message(s).unwrap() else {
            panic!("expected PtyOpen")
        };
        let no = Message::error(o.id, ErrorCode::NotAllowed, "PTY sessions are not allowed");
        write_message(s, &no).unwrap();
    });
    let mut g = connect(&dir, &secret);
    let mut opened = false;
    let r = g.pty(PtyOpen::default(), &mut |_| opened = true, &mut |_| {});
    assert!(
        matches!(
            r,
            Err(SandboxError::Guest {
                code: ErrorCode::NotAllowed,
                ..
            })
        ),
        "{r:?}"
    );
    assert!(!opened);
    t.join().unwrap();
}

#[test]
fn missing_socket_means_retry() {
    let dir = tempfile::tempdir().unwrap();
    assert!(
        try_connect(&dir.path().join("nope"), 1, Duration::from_millis(10))
            .unwrap()
            .is_none()
    );
}

/// A resumed guest's connection: `CONNECT`, the `Ping` under the page's secret and the
/// first request arrive before the guest has said a word (the endpoint below reads all three
/// before it answers anything, so a host that waited for a reply would hang here), and the
/// request's reply comes after the `OK` and the `Pong`.
#[test]
fn resume_sends_the_first_request_behind_the_handshake() {
    let secret = SessionSecret::random().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v.sock");
    let l = UnixListener::bind(&path).unwrap();
    let expect = secret.clone();
    let t = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut line = [0u8; 13];
        s.read_exact(&mut line).unwrap();
        assert_eq!(&line, b"CONNECT 1234\n");
        let Message::Ping(ping) = read_message(&mut s).unwrap() else {
            panic!("the first frame is not the handshake")
        };
        assert_eq!(ping.secret, expect);
        let Message::ExecRequest(r) = read_message(&mut s).unwrap() else {
            panic!("the exec did not follow the handshake at once")
        };
        assert_eq!(r.program, "true");
        s.write_all(b"OK 1073741824\n").unwrap();
        let pong = voidbox_protocol::Pong::new(ping.id, GuestInfo::default());
        write_message(&mut s, &Message::Pong(pong)).unwrap();
        let resp = ExecResponse {
            id: r.id,
            exit_code: Some(0),
            ..ExecResponse::default()
        };
        write_message(&mut s, &Message::ExecResponse(resp)).unwrap();
    });
    let mut g = GuestConn::resume(&path, AGENT_PORT, &secret, Duration::from_secs(5)).unwrap();
    assert!(
        g.guest_info().is_none(),
        "nothing was read before the request"
    );
    let r = g
        .exec(
            ExecRequest {
                program: "true".into(),
                ..ExecRequest::default()
            },
            &mut |_, _| {},
        )
        .unwrap();
    assert_eq!(r.exit_code, Some(0));
    assert!(g.guest_info().is_some());
    t.join().unwrap();
}

/// A guest that refuses the resumed connection (here: its restore page) fails the first
/// request with the guest's reason, not a generic protocol error; a guest that never
/// answers is a timeout.
#[test]
fn resume_reports_the_guests_refusal_and_times_out() {
    let secret = SessionSecret::random().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("v.sock");
    let l = UnixListener::bind(&path).unwrap();
    let t = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut line = [0u8; 13];
        s.read_exact(&mut line).unwrap();
        s.write_all(b"OK 1073741824\n").unwrap();
        let why = "restore page refused: restore page checksum mismatch; this VM accepts no secret";
        let m = Message::error(
            voidbox_protocol::RequestId::RESERVED,
            ErrorCode::Unauthorized,
            why,
        );
        write_message(&mut s, &m).unwrap();
        // The second connection: accepted, then silence.
        let (s2, _) = l.accept().unwrap();
        std::thread::sleep(Duration::from_secs(2));
        drop(s2);
    });
    let mut g = GuestConn::resume(&path, AGENT_PORT, &secret, Duration::from_secs(5)).unwrap();
    match g.telemetry() {
        Err(SandboxError::Guest { code, message, .. }) => {
            assert_eq!(code, ErrorCode::Unauthorized);
            assert!(message.contains("checksum mismatch"), "{message}");
        }
        other => panic!("expected the guest's refusal, got {other:?}"),
    }
    let mut g = GuestConn::resume(&path, AGENT_PORT, &secret, Duration::from_millis(300)).unwrap();
    assert!(matches!(
        g.telemetry(),
        Err(SandboxError::Timeout(_, d)) if d == Duration::from_millis(300)
    ));
    t.join().unwrap();
}

fn held_guest_info() -> GuestInfo {
    GuestInfo {
        capabilities: vec![CAP_HELD.to_string()],
        ..GuestInfo::default()
    }
}

fn out_chunk(id: voidbox_protocol::RequestId, seq: u64, data: &[u8]) -> Message {
    Message::ExecOutputChunk(ExecOutputChunk {
        id,
        stream: OutputStream::Stdout,
        seq,
        data: data.to_vec(),
    })
}

#[test]
fn attach_writes_what_the_callback_asks_and_finish_stops_without_waiting() {
    let secret = SessionSecret::random().unwrap();
    let (dir, t) = fake_guest_with(secret.clone(), held_guest_info(), |s| {
        let Message::ExecAttach(a) = read_message(s).unwrap() else {
            panic!("expected an attach")
        };
        assert_eq!((a.name.as_str(), a.stdin_stream), ("warm", true));
        assert_eq!(a.stdin, b"prompt\n");
        assert_eq!(a.timeout_secs, Some(30));
        write_message(s, &out_chunk(a.id, 0, b"ready\n")).unwrap();
        match read_message(s).unwrap() {
            Message::ExecStdin(i) => {
                assert_eq!(
                    (i.id, i.eof, i.data.as_slice()),
                    (a.id, false, &b"reply\n"[..])
                )
            }
            other => panic!("{other:?}"),
        }
        write_message(s, &out_chunk(a.id, 1, b"done\n")).unwrap();
        match read_message(s).unwrap() {
            Message::ExecSignal(sig) => assert_eq!((sig.id, sig.signal), (a.id, libc::SIGSTOP)),
            other => panic!("{other:?}"),
        }
        // Output that crossed the stop: the next request skips it.
        write_message(s, &out_chunk(a.id, 2, b"late\n")).unwrap();
        // The connection serves the next request.
        let Message::TelemetryRequest(r) = read_message(s).unwrap() else {
            panic!("expected telemetry")
        };
        let tel = voidbox_protocol::Telemetry {
            id: r.id,
            processes: 7,
            ..Default::default()
        };
        write_message(s, &Message::Telemetry(tel)).unwrap();
    });
    let mut g = connect(&dir, &secret);
    let mut seen = Vec::new();
    let r = g
        .exec_attach(
            "warm",
            b"prompt\n".to_vec(),
            Some(30),
            &mut |_, d| {
                seen.push(d.to_vec());
                match d {
                    b"ready\n" => Attach::Write(b"reply\n".to_vec()),
                    b"done\n" => Attach::Finish,
                    _ => Attach::Continue,
                }
            },
            None,
        )
        .unwrap();
    assert!(matches!(r, Attached::Finished { .. }), "{r:?}");
    assert_eq!(seen, vec![b"ready\n".to_vec(), b"done\n".to_vec()]);
    assert_eq!(g.telemetry().unwrap().processes, 7);
    t.join().unwrap();
}

#[test]
fn hold_query_and_attach_replies_and_refusals() {
    let secret = SessionSecret::random().unwrap();
    let (dir, t) = fake_guest_with(secret.clone(), held_guest_info(), |s| {
        let next = |s: &mut UnixStream| match read_message(s).unwrap() {
            Message::ExecRequest(r) => {
                assert_eq!(r.hold.as_deref(), Some("warm"));
                r.id
            }
            Message::HeldQuery(q) => q.id,
            Message::ExecAttach(a) => a.id,
            other => panic!("{other:?}"),
        };
        let replies: Vec<Box<dyn Fn(voidbox_protocol::RequestId) -> Vec<Message>>> = vec![
            // The allowlist refuses the program: an exec's refusal.
            Box::new(|id| {
                vec![Message::ExecResponse(ExecResponse {
                    id,
                    exit_code: Some(voidbox_protocol::EXIT_NOT_ALLOWED),
                    error: Some("`nope` is not allowed".into()),
                    ..ExecResponse::default()
                })]
            }),
            Box::new(|id| vec![Message::Ack(Ack { id })]),
            Box::new(|id| {
                vec![Message::HeldInfo(voidbox_protocol::HeldInfo {
                    id,
                    pid: 42,
                    cpu_ms: 1500,
                    ..Default::default()
                })]
            }),
            Box::new(|id| vec![Message::error(id, ErrorCode::Busy, "attached already")]),
            Box::new(|id| {
                vec![
                    out_chunk(id, 0, b"bye\n"),
                    Message::ExecResponse(ExecResponse {
                        id,
                        exit_code: Some(0),
                        ..ExecResponse::default()
                    }),
                ]
            }),
            // A guest that answers an attach with something else breaks the protocol.
            Box::new(|id| vec![Message::Ack(Ack { id })]),
        ];
        for reply in replies {
            let id = next(s);
            for m in reply(id) {
                write_message(s, &m).unwrap();
            }
        }
    });
    let mut g = connect(&dir, &secret);
    let req = |program: &str| ExecRequest {
        program: program.into(),
        ..ExecRequest::default()
    };
    match g.exec_hold("warm", req("nope")) {
        Err(SandboxError::Guest { code, message, .. }) => {
            assert_eq!(code, ErrorCode::NotAllowed);
            assert!(message.contains("nope"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    g.exec_hold("warm", req("claude")).unwrap();
    let i = g.held_info("warm").unwrap();
    assert_eq!((i.pid, i.cpu_ms), (42, 1500));
    let mut cont = |_: OutputStream, _: &[u8]| Attach::Continue;
    assert!(matches!(
        g.exec_attach("warm", Vec::new(), None, &mut cont, None),
        Err(SandboxError::Guest {
            code: ErrorCode::Busy,
            ..
        })
    ));
    let mut out = Vec::new();
    let r = g
        .exec_attach(
            "warm",
            Vec::new(),
            None,
            &mut |_, d| {
                out.extend_from_slice(d);
                Attach::Continue
            },
            None,
        )
        .unwrap();
    assert!(
        matches!(&r, Attached::Exited(resp) if resp.exit_code == Some(0)),
        "{r:?}"
    );
    assert_eq!(out, b"bye\n");
    assert!(matches!(
        g.exec_attach("warm", Vec::new(), None, &mut cont, None),
        Err(SandboxError::Protocol { .. })
    ));
    t.join().unwrap();
}

#[test]
fn hold_on_a_guest_without_held_execs_is_unsupported() {
    let secret = SessionSecret::random().unwrap();
    // The guest reads nothing after the handshake: the host must not send the request.
    let (dir, t) = fake_guest(secret.clone(), |s| {
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        assert!(read_message(s).is_err());
    });
    let mut g = connect(&dir, &secret);
    match g.exec_hold("warm", ExecRequest::default()) {
        Err(SandboxError::Guest { code, message, .. }) => {
            assert_eq!(code, ErrorCode::Unsupported);
            assert!(message.contains("voidbox image build"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    t.join().unwrap();
}
