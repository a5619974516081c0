//! `Rekey` against the agent as a host process over a Unix socket: secret rotation for new
//! connections, the current connection staying authenticated, refusals (before the
//! handshake, malformed, disabled, unprivileged) that keep the old secret.
//!
//! The host's RNG and clock are never touched: rotation is tested with
//! `--rekey secret-only`, and `--rekey system` only where it must fail (unprivileged).

use std::os::unix::net::UnixStream;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::common::*;
use voidbox_protocol::blocking::{client_handshake, read_message, write_message};
use voidbox_protocol::*;

fn now_ns() -> u64 {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
    u64::try_from(d.as_nanos()).unwrap()
}

fn rekey(id: RequestId, secret: &SessionSecret) -> Message {
    Message::Rekey(
        Rekey::new(id, secret.clone(), now_ns(), Zeroizing::new(vec![0x5c; 64])).unwrap(),
    )
}

/// A `Rekey` frame built by hand, so that it can break the rules the encoder enforces.
fn raw_rekey(id: u64, entropy_len: usize) -> Vec<u8> {
    let mut p = id.to_le_bytes().to_vec();
    p.extend([0x77u8; 32]);
    p.extend(now_ns().to_le_bytes());
    p.extend(vec![1u8; entropy_len]);
    let mut f = (p.len() as u32).to_le_bytes().to_vec();
    f.push(MessageType::Rekey.as_u8());
    f.extend(p);
    f
}

fn expect_error(m: Message, id: RequestId, code: ErrorCode) -> ErrorResponse {
    match m {
        Message::Error(e) if e.id == id && e.code == code => e,
        other => panic!("expected {code:?} for {id}, got {other:?}"),
    }
}

/// A fresh connection presenting `secret` is refused with `unauthorized` and closed.
fn assert_refused(agent: &Agent, secret: &SessionSecret) {
    let mut s = agent.raw();
    write_message(&mut s, &Message::Ping(Ping::new(secret.clone(), None))).unwrap();
    expect_error(
        read_message(&mut s).unwrap(),
        RequestId::RESERVED,
        ErrorCode::Unauthorized,
    );
    assert!(closed_by_peer(&mut s));
}

/// A fresh connection presenting `secret` is accepted and served.
fn assert_accepted(agent: &Agent, secret: &SessionSecret) -> Pong {
    let mut s: UnixStream = agent.raw();
    let pong = client_handshake(&mut s, secret, None).expect("handshake with the secret");
    let mut c = Client {
        stream: s,
        next: 1,
        pong: pong.clone(),
    };
    let id = c.id();
    assert!(matches!(
        c.request(Message::TelemetryRequest(TelemetryRequest { id })),
        Message::Telemetry(_)
    ));
    pong
}

#[test]
fn rekey_rotates_the_secret_for_new_connections_only() {
    let mut agent = Agent::start_with(&["--rekey", "secret-only"]);
    let mut c = agent.connect();
    let caps = &c.pong.info.capabilities;
    assert!(
        caps.iter().any(|c| c == CAP_REKEY_SECRET_ONLY) && !caps.iter().any(|c| c == CAP_REKEY),
        "{caps:?}"
    );
    let new = SessionSecret::random().unwrap();
    let id = c.id();
    assert_eq!(
        c.request(rekey(id, &new)),
        Message::Ack(Ack { id }),
        "Rekey answered with Ack"
    );
    // New connections: the old secret is refused, the new one accepted.
    assert_refused(&agent, &secret());
    let pong = assert_accepted(&agent, &new);
    assert!(pong
        .info
        .capabilities
        .iter()
        .any(|c| c == CAP_REKEY_SECRET_ONLY));
    // The re-keying connection stays authenticated.
    assert_eq!(c.exec(sh("echo still")).out(), "still\n");
    // A Ping on it is checked against the new secret (and narrows the policy, as ever).
    let id = c.id();
    let mut ping = Ping::new(
        new.clone(),
        Some(GuestPolicy {
            allowlist: Some(vec!["echo".into()]),
            ..Default::default()
        }),
    );
    ping.id = id;
    assert!(matches!(c.request(Message::Ping(ping)), Message::Pong(p) if p.id == id));
    let r = c.exec(sh("true"));
    assert!(refusal(&r).contains("`sh`"), "sh narrowed away");
    let id = c.id();
    let mut old_ping = Ping::new(secret(), None);
    old_ping.id = id;
    expect_error(
        c.request(Message::Ping(old_ping)),
        id,
        ErrorCode::Unauthorized,
    );
    // A second rotation, from a connection authenticated with the first new secret.
    let mut s = agent.raw();
    let pong = client_handshake(&mut s, &new, None).unwrap();
    let mut c2 = Client {
        stream: s,
        next: 1,
        pong,
    };
    let third = SessionSecret::random().unwrap();
    let id = c2.id();
    assert_eq!(c2.request(rekey(id, &third)), Message::Ack(Ack { id }));
    assert_refused(&agent, &new);
    assert_refused(&agent, &secret());
    assert_accepted(&agent, &third);
    agent.assert_alive();
}

#[test]
fn rekey_before_the_handshake_is_refused() {
    let mut agent = Agent::start_with(&["--rekey", "secret-only"]);
    let new = SessionSecret::random().unwrap();
    let mut s = agent.raw();
    write_message(&mut s, &rekey(RequestId(5), &new)).unwrap();
    let e = expect_error(
        read_message(&mut s).unwrap(),
        RequestId(5),
        ErrorCode::Unauthorized,
    );
    assert!(e.message.contains("handshake required"), "{}", e.message);
    assert!(closed_by_peer(&mut s));
    // Not rotated.
    assert_refused(&agent, &new);
    assert_accepted(&agent, &secret());
    agent.assert_alive();
}

#[test]
fn malformed_or_invalid_rekey_is_refused_and_keeps_the_secret() {
    let mut agent = Agent::start_with(&["--rekey", "secret-only"]);
    let mut c = agent.connect();
    for (id, len) in [
        (10u64, 0usize),
        (11, REKEY_ENTROPY_MIN - 1),
        (12, REKEY_ENTROPY_MAX + 1),
    ] {
        write_raw(&mut c.stream, &raw_rekey(id, len));
        let e = expect_error(c.recv(), RequestId(id), ErrorCode::Malformed);
        assert!(e.message.contains("entropy"), "{}", e.message);
    }
    // A clock before 2020 is a broken host clock: refused before anything changes.
    let new = SessionSecret::random().unwrap();
    let id = c.id();
    let stale = Rekey::new(id, new.clone(), 0, Zeroizing::new(vec![3; 32])).unwrap();
    let e = expect_error(
        c.request(Message::Rekey(stale)),
        id,
        ErrorCode::InvalidRequest,
    );
    assert!(e.message.contains("2020"), "{}", e.message);
    // The connection carries on and nothing was rotated.
    assert_eq!(c.exec(sh("echo ok")).out(), "ok\n");
    assert_refused(&agent, &SessionSecret::from_bytes([0x77; 32]));
    assert_refused(&agent, &new);
    assert_accepted(&agent, &secret());
    agent.assert_alive();
}

#[test]
fn rekey_is_off_unless_asked_for_in_host_mode() {
    let agent = Agent::start();
    let mut c = agent.connect();
    let caps = &c.pong.info.capabilities;
    assert!(
        !caps
            .iter()
            .any(|c| c == CAP_REKEY || c == CAP_REKEY_SECRET_ONLY),
        "{caps:?}"
    );
    let new = SessionSecret::random().unwrap();
    let id = c.id();
    let e = expect_error(c.request(rekey(id, &new)), id, ErrorCode::Unsupported);
    assert!(e.message.contains("--rekey"), "{}", e.message);
    assert_refused(&agent, &new);
    assert_accepted(&agent, &secret());
}

/// `--rekey system` without `CAP_SYS_ADMIN` / `CAP_SYS_TIME` (as a PID 1 that somehow
/// lacked them would be): the reseed fails, the host is told why, the secret stays.
#[test]
fn failed_reseed_refuses_the_rekey_and_keeps_the_secret() {
    // As root, run the agent as nobody so the host's RNG and clock stay untouched.
    let uid = is_root().then_some(65534);
    let mut agent = Agent::start_as(&["--rekey", "system"], uid);
    let mut c = agent.connect();
    assert!(
        c.pong.info.capabilities.iter().any(|c| c == CAP_REKEY),
        "{:?}",
        c.pong.info.capabilities
    );
    let new = SessionSecret::random().unwrap();
    let id = c.id();
    let e = expect_error(c.request(rekey(id, &new)), id, ErrorCode::PermissionDenied);
    assert!(
        e.message.contains("RNDADDENTROPY") && e.message.contains("not rotated"),
        "{}",
        e.message
    );
    assert_eq!(c.exec(sh("echo ok")).out(), "ok\n");
    assert_refused(&agent, &new);
    assert_accepted(&agent, &secret());
    agent.assert_alive();
}
