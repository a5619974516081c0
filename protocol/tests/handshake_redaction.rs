//! Handshake (blocking, over a real socket pair), secret handling and `Debug` redaction.

use std::os::unix::net::UnixStream;
use std::thread;

use voidbox_protocol::blocking::{client_handshake, read_message, server_handshake, write_message};
use voidbox_protocol::*;

fn secret(b: u8) -> SessionSecret {
    SessionSecret::from_bytes([b; 32])
}

fn info() -> GuestInfo {
    GuestInfo {
        agent_version: "test".into(),
        ..Default::default()
    }
}

#[test]
fn handshake_succeeds_and_delivers_policy() {
    let (mut host, mut guest) = UnixStream::pair().unwrap();
    let policy = GuestPolicy {
        allowlist: Some(vec!["sh".into()]),
        ..Default::default()
    };
    let g = thread::spawn(move || server_handshake(&mut guest, &secret(1), info()));
    let pong = client_handshake(&mut host, &secret(1), Some(policy.clone())).unwrap();
    assert_eq!(pong.version, PROTOCOL_VERSION);
    assert_eq!(pong.info.agent_version, "test");
    let ping = g.join().unwrap().unwrap();
    assert_eq!(ping.policy, Some(policy));
}

#[test]
fn wrong_secret_is_rejected_with_unauthorized() {
    let (mut host, mut guest) = UnixStream::pair().unwrap();
    let g = thread::spawn(move || server_handshake(&mut guest, &secret(1), info()));
    let err = client_handshake(&mut host, &secret(2), None).unwrap_err();
    assert!(matches!(err, ProtocolError::AuthFailed), "{err:?}");
    assert!(matches!(g.join().unwrap(), Err(ProtocolError::AuthFailed)));
}

#[test]
fn version_mismatch_is_reported() {
    let (mut host, mut guest) = UnixStream::pair().unwrap();
    let g = thread::spawn(move || server_handshake(&mut guest, &secret(1), info()));
    let mut ping = Ping::new(secret(1), None);
    ping.version = PROTOCOL_VERSION + 1;
    write_message(&mut host, &Message::Ping(ping)).unwrap();
    let reply = read_message(&mut host).unwrap();
    assert!(matches!(
        reply,
        Message::Error(ErrorResponse {
            code: ErrorCode::VersionMismatch,
            ..
        })
    ));
    assert!(
        matches!(g.join().unwrap(), Err(ProtocolError::VersionMismatch { theirs, .. }) if theirs == PROTOCOL_VERSION + 1)
    );
}

#[test]
fn wrong_secret_and_wrong_version_reports_only_auth() {
    let mut ping = Ping::new(secret(9), None);
    ping.version = 99;
    let (err, reply) = ping.verify(&secret(1)).unwrap_err();
    assert!(matches!(err, ProtocolError::AuthFailed));
    assert!(matches!(
        reply,
        Message::Error(ErrorResponse {
            code: ErrorCode::Unauthorized,
            ..
        })
    ));
}

#[test]
fn first_message_must_be_ping() {
    let (mut host, mut guest) = UnixStream::pair().unwrap();
    let g = thread::spawn(move || server_handshake(&mut guest, &secret(1), info()));
    let exec = ExecRequest {
        id: RequestId(5),
        program: "sh".into(),
        ..Default::default()
    };
    write_message(&mut host, &Message::ExecRequest(exec)).unwrap();
    let reply = read_message(&mut host).unwrap();
    assert_eq!(reply.id(), RequestId(5));
    assert!(matches!(
        reply,
        Message::Error(ErrorResponse {
            code: ErrorCode::Unauthorized,
            ..
        })
    ));
    assert!(matches!(
        g.join().unwrap(),
        Err(ProtocolError::UnexpectedMessage {
            expected: "Ping",
            ..
        })
    ));
}

#[test]
fn check_pong_classifies_replies() {
    assert!(handshake::check_pong(Message::Pong(Pong::new(RequestId(0), info()))).is_ok());
    let mut p = Pong::new(RequestId(0), info());
    p.version = 7;
    assert!(matches!(
        handshake::check_pong(Message::Pong(p)),
        Err(ProtocolError::VersionMismatch { .. })
    ));
    let e = Message::error(RequestId(0), ErrorCode::Internal, "boom");
    assert!(matches!(
        handshake::check_pong(e),
        Err(ProtocolError::Remote {
            code: ErrorCode::Internal,
            ..
        })
    ));
    let a = Message::Ack(Ack { id: RequestId(0) });
    assert!(matches!(
        handshake::check_pong(a),
        Err(ProtocolError::UnexpectedMessage { .. })
    ));
}

#[test]
fn secret_parsing_and_comparison() {
    let hex = "00112233445566778899aabbccddeeff00112233445566778899AABBCCDDEEFF";
    let s = SessionSecret::from_hex(hex).unwrap();
    assert_eq!(s.as_bytes()[1], 0x11);
    assert_eq!(s.to_hex(), hex.to_lowercase());
    assert_eq!(SessionSecret::from_hex(&format!(" {hex}\n")).unwrap(), s);
    for bad in [
        "",
        "00",
        &hex[1..],
        &format!("{hex}00"),
        &hex.replace('a', "g"),
    ] {
        assert_eq!(SessionSecret::from_hex(bad), Err(InvalidSecret), "{bad}");
    }
    assert!(s.ct_eq_bytes(s.as_bytes()));
    assert!(!s.ct_eq_bytes(&s.as_bytes()[..31]));
    assert!(!s.ct_eq_bytes(&[0; 32]));
    assert!(ct_eq(b"abc", b"abc") && !ct_eq(b"abc", b"abd") && !ct_eq(b"abc", b"ab"));
    let r1 = SessionSecret::random().unwrap();
    let r2 = SessionSecret::random().unwrap();
    assert_ne!(r1, r2);
}

#[test]
fn secret_never_appears_in_debug() {
    let s = SessionSecret::from_hex(&"ab".repeat(32)).unwrap();
    let hex = s.to_hex();
    let ping = Message::Ping(Ping::new(s.clone(), Some(GuestPolicy::default())));
    let frame = ping.to_frame().unwrap();
    let rekey = Message::Rekey(
        Rekey::new(
            RequestId(3),
            s.clone(),
            1_700_000_000_000_000_000,
            Zeroizing::new(vec![0xab; 64]),
        )
        .unwrap(),
    );
    let rekey_frame = rekey.to_frame().unwrap();
    for text in [
        format!("{s:?}"),
        format!("{ping:?}"),
        format!("{ping:#?}"),
        format!("{frame:?}"),
        format!("{rekey:?}"),
        format!("{rekey:#?}"),
        format!("{rekey_frame:?}"),
    ] {
        assert!(!text.contains(&hex), "{text}");
        assert!(!text.contains("171, 171"), "{text}"); // 0xab as decimal bytes
        assert!(
            !text.contains("0xab, 0xab") && !text.contains("ab, ab"),
            "{text}"
        );
    }
    assert!(format!("{ping:?}").contains("<redacted>"));
    let text = format!("{rekey:?}");
    assert!(
        text.contains("<redacted>") && text.contains("<64 bytes>") && text.contains("unix_time_ns"),
        "{text}"
    );
}

#[test]
fn exec_and_pty_debug_redact_sensitive_env_values() {
    let env = vec![
        ("PATH".to_string(), "/usr/bin".to_string()),
        ("OPENAI_API_KEY".to_string(), "sk-live-1".to_string()),
        ("aws_secret_access_key".to_string(), "s3cr3t-2".to_string()),
        ("GitHub_Token".to_string(), "ghp-3".to_string()),
        ("DB_PASSWORD".to_string(), "pw-4".to_string()),
        ("MONKEY".to_string(), "banana-5".to_string()), // contains KEY: redacted too (conservative)
        ("HOME".to_string(), "/home/user".to_string()),
    ];
    let exec = Message::ExecRequest(ExecRequest {
        id: RequestId(1),
        program: "env".into(),
        env: env.clone(),
        stdin: b"stdin-secret".to_vec(),
        ..Default::default()
    });
    let pty = Message::PtyOpen(PtyOpen {
        id: RequestId(2),
        program: "sh".into(),
        env,
        rows: 1,
        cols: 1,
        ..Default::default()
    });
    for m in [&exec, &pty] {
        for text in [format!("{m:?}"), format!("{m:#?}")] {
            for leaked in [
                "sk-live-1",
                "s3cr3t-2",
                "ghp-3",
                "pw-4",
                "banana-5",
                "stdin-secret",
            ] {
                assert!(!text.contains(leaked), "{leaked} leaked in {text}");
            }
            for kept in [
                "OPENAI_API_KEY",
                "DB_PASSWORD",
                "/usr/bin",
                "/home/user",
                "<redacted>",
            ] {
                assert!(text.contains(kept), "{kept} missing in {text}");
            }
        }
    }
    // The wire still carries the real values.
    let back = Message::decode_exact(&exec.encode().unwrap()).unwrap();
    let Message::ExecRequest(r) = back else {
        panic!()
    };
    assert_eq!(r.env[1].1, "sk-live-1");
}

#[test]
fn bulk_data_is_not_dumped_in_debug() {
    let data = vec![b'Z'; 1000];
    for m in [
        Message::PtyData(PtyData {
            id: RequestId(1),
            data: data.clone(),
        }),
        Message::FileChunk(FileChunk {
            id: RequestId(1),
            offset: 0,
            last: false,
            data: data.clone(),
        }),
        Message::ExecStdin(ExecStdin {
            id: RequestId(1),
            eof: false,
            data: data.clone(),
        }),
        Message::ExecOutputChunk(ExecOutputChunk {
            id: RequestId(1),
            stream: OutputStream::Stderr,
            seq: 0,
            data: data.clone(),
        }),
        Message::WriteFile(WriteFile {
            id: RequestId(1),
            contents: data.clone(),
            ..Default::default()
        }),
    ] {
        let text = format!("{m:?}");
        assert!(text.contains("<1000 bytes>") && text.len() < 300, "{text}");
    }
}
