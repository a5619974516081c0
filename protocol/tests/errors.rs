//! Every decoder error path: oversized, truncated, unknown type, malformed payloads,
//! trailing garbage, and the fatal / recoverable classification.

use std::io::{self, Cursor, Read};

use crate::common;
use voidbox_protocol::blocking::{read_frame, read_message, write_message};
use voidbox_protocol::*;

fn frame(ty: u8, payload: &[u8]) -> Vec<u8> {
    let mut v = (payload.len() as u32).to_le_bytes().to_vec();
    v.push(ty);
    v.extend_from_slice(payload);
    v
}

/// A reader that serves `data` and panics if anyone reads past it: proves the decoder
/// rejected a header without touching (or allocating for) the payload.
struct NoReadPast(Cursor<Vec<u8>>);

impl Read for NoReadPast {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.0.read(buf)?;
        assert!(
            n > 0 || buf.is_empty(),
            "decoder tried to read past the header"
        );
        Ok(n)
    }
}

#[test]
fn oversized_header_rejected_before_reading_payload() {
    for len in [MAX_MESSAGE_SIZE + 1, u32::MAX] {
        let mut hdr = len.to_le_bytes().to_vec();
        hdr.push(MessageType::PtyData.as_u8());
        let err = read_frame(&mut NoReadPast(Cursor::new(hdr.clone()))).unwrap_err();
        assert!(
            matches!(err, ProtocolError::Oversized { len: l, max } if l == len as u64 && max == MAX_MESSAGE_SIZE)
        );
        assert!(err.is_fatal());
        // The incremental decoder fails on the header alone instead of asking for more.
        assert!(matches!(
            Frame::decode(&hdr),
            Err(ProtocolError::Oversized { .. })
        ));
        assert!(matches!(
            Message::decode(&hdr),
            Err(ProtocolError::Oversized { .. })
        ));
        assert!(matches!(
            Frame::decode_exact(&hdr),
            Err(ProtocolError::Oversized { .. })
        ));
    }
}

#[test]
fn max_size_header_is_accepted_and_waits_for_data() {
    let mut hdr = MAX_MESSAGE_SIZE.to_le_bytes().to_vec();
    hdr.push(MessageType::PtyData.as_u8());
    assert!(Frame::decode(&hdr).unwrap().is_none());
    // A peer announcing 64 MiB and hanging up is reported as truncated, not as OOM.
    let err = read_frame(&mut Cursor::new(hdr)).unwrap_err();
    assert!(
        matches!(err, ProtocolError::Truncated { needed, got: 5 } if needed == 5 + MAX_MESSAGE_SIZE as u64)
    );
}

#[test]
fn oversized_messages_refused_on_encode() {
    let big = Message::PtyData(PtyData {
        id: RequestId(1),
        data: vec![0; MAX_MESSAGE_SIZE as usize],
    });
    assert!(matches!(big.encode(), Err(ProtocolError::Oversized { .. })));
    // base64 inflation pushes a 50 MB inline WriteFile over the limit.
    let wf = Message::WriteFile(WriteFile {
        id: RequestId(1),
        contents: vec![0; 50 << 20],
        ..Default::default()
    });
    assert!(matches!(
        wf.encode_payload(),
        Err(ProtocolError::Oversized { .. })
    ));
    assert!(matches!(
        Frame::new(1, vec![0; MAX_MESSAGE_SIZE as usize + 1]),
        Err(ProtocolError::Oversized { .. })
    ));
    let mut sink = Vec::new();
    assert!(write_message(&mut sink, &big).is_err());
    assert!(sink.is_empty(), "nothing written for a refused message");
}

#[test]
fn clean_eof_is_closed_and_partial_header_is_truncated() {
    assert!(matches!(
        read_frame(&mut Cursor::new(Vec::new())),
        Err(ProtocolError::Closed)
    ));
    for n in 1..HEADER_LEN {
        let err = read_frame(&mut Cursor::new(vec![1u8; n])).unwrap_err();
        assert!(
            matches!(err, ProtocolError::Truncated { needed: 5, got } if got == n as u64),
            "{err}"
        );
        assert!(err.is_fatal());
        assert!(matches!(
            Frame::decode_exact(&vec![1u8; n]),
            Err(ProtocolError::Truncated { .. })
        ));
    }
}

#[test]
fn truncated_payload() {
    let full = Message::Ack(Ack { id: RequestId(9) }).encode().unwrap();
    for cut in HEADER_LEN..full.len() {
        let err = read_message(&mut Cursor::new(full[..cut].to_vec())).unwrap_err();
        assert!(
            matches!(err, ProtocolError::Truncated { got, .. } if got == cut as u64),
            "{err}"
        );
        assert!(Message::decode(&full[..cut]).unwrap().is_none());
        assert!(matches!(
            Message::decode_exact(&full[..cut]),
            Err(ProtocolError::Truncated { .. })
        ));
    }
}

#[test]
fn unknown_type_is_recoverable_and_stream_stays_in_sync() {
    for ty in [0x00u8, 0x07, 0x0f, 0x18, 0x29, 0x34, 0x44, 0xff] {
        assert!(MessageType::from_u8(ty).is_none());
        let mut wire = frame(ty, b"whatever payload");
        wire.extend(Message::Ack(Ack { id: RequestId(3) }).encode().unwrap());
        let mut r = Cursor::new(wire);
        let err = read_message(&mut r).unwrap_err();
        assert!(matches!(err, ProtocolError::UnknownType(t) if t == ty));
        assert!(!err.is_fatal());
        assert_eq!(
            read_message(&mut r).unwrap(),
            Message::Ack(Ack { id: RequestId(3) })
        );
        assert!(matches!(
            Message::decode_payload(ty, b""),
            Err(ProtocolError::UnknownType(_))
        ));
    }
}

fn malformed(ty: MessageType, payload: &[u8]) -> ProtocolError {
    let err = Message::decode_payload(ty.as_u8(), payload).unwrap_err();
    match &err {
        ProtocolError::Malformed { ty: name, .. } => assert_eq!(*name, ty.name()),
        other => panic!("{ty:?} {payload:?}: expected Malformed, got {other:?}"),
    }
    assert!(!err.is_fatal());
    err
}

#[test]
fn malformed_json_payloads() {
    for t in MessageType::ALL.iter().filter(|t| !t.is_binary()) {
        malformed(*t, b"");
        malformed(*t, b"{");
        malformed(*t, b"not json");
        malformed(*t, b"[1,2,3]");
        malformed(*t, b"{}"); // every JSON message requires `id`
        malformed(*t, b"{\"id\":-1}");
        malformed(*t, b"{\"id\":\"1\"}");
        malformed(*t, b"\xff\xfe");
    }
    // Wrong field types, bad enum values, bad base64.
    malformed(MessageType::ExecRequest, br#"{"id":1,"program":3}"#);
    malformed(
        MessageType::ExecRequest,
        br#"{"id":1,"program":"x","stdin":"***"}"#,
    );
    malformed(
        MessageType::ExecRequest,
        br#"{"id":1,"program":"x","env":[["A"]]}"#,
    );
    malformed(MessageType::Shutdown, br#"{"id":1,"action":"explode"}"#);
    malformed(
        MessageType::FileStatResponse,
        br#"{"id":1,"kind":"socket"}"#,
    );
    malformed(MessageType::PtyResize, br#"{"id":1,"rows":70000,"cols":1}"#);
}

#[test]
fn malformed_reports_the_request_id_when_recoverable() {
    let err = malformed(
        MessageType::ExecRequest,
        br#"{"id":42,"program":["not","a","string"]}"#,
    );
    assert_eq!(err.request_id(), Some(RequestId(42)));
    let err = malformed(MessageType::ExecRequest, b"{");
    assert_eq!(err.request_id(), None);
    let mut p = 77u64.to_le_bytes().to_vec();
    p.push(9); // invalid stream byte
    p.extend(0u64.to_le_bytes());
    let err = malformed(MessageType::ExecOutputChunk, &p);
    assert_eq!(err.request_id(), Some(RequestId(77)));
}

#[test]
fn malformed_binary_payloads() {
    // Too short for the fixed part of every binary layout.
    let fixed = [
        (MessageType::Ping, 8 + 4 + 32),
        (MessageType::Pong, 8 + 4),
        (MessageType::Rekey, 8 + 32 + 8 + REKEY_ENTROPY_MIN),
        (MessageType::ExecOutputChunk, 8 + 1 + 8),
        (MessageType::ExecStdin, 8 + 1),
        (MessageType::FileChunk, 8 + 8 + 1),
        (MessageType::PtyData, 8),
    ];
    for (t, n) in fixed {
        for len in 0..n {
            malformed(t, &vec![0u8; len]);
        }
    }
    let id = 5u64.to_le_bytes();
    // Invalid stream byte.
    for s in [0u8, 3, 255] {
        let mut p = id.to_vec();
        p.push(s);
        p.extend(1u64.to_le_bytes());
        malformed(MessageType::ExecOutputChunk, &p);
    }
    // Unknown flag bits.
    let mut p = id.to_vec();
    p.push(0x02);
    malformed(MessageType::ExecStdin, &p);
    let mut p = id.to_vec();
    p.extend(0u64.to_le_bytes());
    p.push(0x81);
    malformed(MessageType::FileChunk, &p);
    // Pong requires guest info JSON; Ping's policy tail must be valid JSON.
    let mut pong = id.to_vec();
    pong.extend(PROTOCOL_VERSION.to_le_bytes());
    malformed(MessageType::Pong, &pong);
    let mut ping = id.to_vec();
    ping.extend(PROTOCOL_VERSION.to_le_bytes());
    ping.extend([7u8; 32]);
    ping.extend(b"{\"allowlist\":");
    malformed(MessageType::Ping, &ping);
}

#[test]
fn rekey_entropy_length_is_bounded_on_decode_and_encode() {
    let payload = |len: usize| {
        let mut p = 42u64.to_le_bytes().to_vec();
        p.extend([9u8; 32]);
        p.extend(1_700_000_000_000_000_000u64.to_le_bytes());
        p.extend(vec![0xeeu8; len]);
        p
    };
    for len in [REKEY_ENTROPY_MIN, 64, REKEY_ENTROPY_MAX] {
        let m = Message::decode_payload(MessageType::Rekey.as_u8(), &payload(len)).unwrap();
        let Message::Rekey(r) = &m else {
            panic!("{m:?}")
        };
        assert_eq!(
            (r.id, r.entropy.len(), r.unix_time_ns),
            (RequestId(42), len, 1_700_000_000_000_000_000)
        );
        assert_eq!(r.secret, SessionSecret::from_bytes([9; 32]));
        assert_eq!(m.encode_payload().unwrap(), payload(len));
    }
    for len in [0, 1, REKEY_ENTROPY_MIN - 1, REKEY_ENTROPY_MAX + 1, 4096] {
        let err = malformed(MessageType::Rekey, &payload(len));
        // The id is recovered so the guest can answer the request with an error.
        assert_eq!(err.request_id(), Some(RequestId(42)), "{len}");
        assert!(err.to_string().contains("entropy"), "{err}");
        let bad = Rekey {
            id: RequestId(42),
            secret: SessionSecret::from_bytes([9; 32]),
            unix_time_ns: 0,
            entropy: Zeroizing::new(vec![0; len]),
        };
        assert!(matches!(
            Rekey::new(bad.id, bad.secret.clone(), 0, bad.entropy.clone()),
            Err(ProtocolError::Malformed { .. })
        ));
        let bad = Message::Rekey(bad);
        assert!(matches!(
            bad.encode(),
            Err(ProtocolError::Malformed { ty: "Rekey", .. })
        ));
        let mut sink = Vec::new();
        assert!(write_message(&mut sink, &bad).is_err());
        assert!(sink.is_empty(), "nothing written for a refused Rekey");
    }
    // Truncated inside the secret or the clock: malformed with the id, never a panic.
    for cut in [8, 20, 40, 47] {
        let err = malformed(MessageType::Rekey, &payload(64)[..cut]);
        assert_eq!(err.request_id(), Some(RequestId(42)));
    }
}

#[test]
fn trailing_garbage() {
    // After a complete frame, where exactly one frame is expected.
    let mut b = Message::Ack(Ack { id: RequestId(1) }).encode().unwrap();
    b.extend_from_slice(b"xyz");
    assert!(matches!(
        Message::decode_exact(&b),
        Err(ProtocolError::TrailingBytes { extra: 3 })
    ));
    assert!(matches!(
        Frame::decode_exact(&b),
        Err(ProtocolError::TrailingBytes { extra: 3 })
    ));
    // Inside JSON payloads.
    malformed(MessageType::Ack, br#"{"id":1} xyz"#);
    malformed(MessageType::Ack, br#"{"id":1}{"id":2}"#);
    // Inside the JSON tail of binary payloads.
    for m in common::samples::samples() {
        if matches!(m.message_type(), MessageType::Ping | MessageType::Pong) {
            let mut p = m.encode_payload().unwrap();
            p.extend_from_slice(b"}garbage");
            malformed(m.message_type(), &p);
        }
    }
}

#[test]
fn json_whitespace_is_tolerated() {
    let m = Message::decode_payload(MessageType::Ack.as_u8(), b" {\"id\" : 1}\n").unwrap();
    assert_eq!(m, Message::Ack(Ack { id: RequestId(1) }));
}

#[test]
fn malformed_frame_does_not_desync_the_stream() {
    let mut wire = frame(MessageType::ExecRequest.as_u8(), b"{\"id\":1,");
    wire.extend(frame(MessageType::PtyData.as_u8(), b"short"));
    wire.extend(Message::Ack(Ack { id: RequestId(2) }).encode().unwrap());
    let mut r = Cursor::new(wire);
    assert!(matches!(
        read_message(&mut r),
        Err(ProtocolError::Malformed { .. })
    ));
    assert!(matches!(
        read_message(&mut r),
        Err(ProtocolError::Malformed { .. })
    ));
    assert_eq!(read_message(&mut r).unwrap().id(), RequestId(2));
    assert!(matches!(read_message(&mut r), Err(ProtocolError::Closed)));
}

/// A reader that returns `Interrupted` before every successful read, and delivers one
/// byte at a time.
struct Stuttering {
    data: Cursor<Vec<u8>>,
    interrupt: bool,
}

impl Read for Stuttering {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.interrupt = !self.interrupt;
        if self.interrupt {
            return Err(io::Error::from(io::ErrorKind::Interrupted));
        }
        let n = buf.len().min(1);
        self.data.read(&mut buf[..n])
    }
}

#[test]
fn short_reads_and_eintr_are_handled() {
    for m in common::samples::samples() {
        let mut r = Stuttering {
            data: Cursor::new(m.encode().unwrap()),
            interrupt: false,
        };
        assert_eq!(read_message(&mut r).unwrap(), m);
        assert!(matches!(read_message(&mut r), Err(ProtocolError::Closed)));
    }
}

#[test]
fn io_errors_propagate_and_are_fatal() {
    struct Broken;
    impl Read for Broken {
        fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
            Err(io::Error::from(io::ErrorKind::ConnectionReset))
        }
    }
    let err = read_frame(&mut Broken).unwrap_err();
    assert!(matches!(&err, ProtocolError::Io(e) if e.kind() == io::ErrorKind::ConnectionReset));
    assert!(err.is_fatal());
}

#[test]
fn error_display_is_informative() {
    let e = Message::decode_payload(MessageType::ExecRequest.as_u8(), b"{").unwrap_err();
    let s = e.to_string();
    assert!(s.contains("ExecRequest") && s.contains("EOF"), "{s}");
    assert_eq!(
        ProtocolError::UnknownType(0xab).to_string(),
        "unknown message type 0xab"
    );
}
