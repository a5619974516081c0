//! Round-trip tests: every message type survives encode → decode unchanged, through every
//! entry point (buffer, exact, incremental, blocking I/O, frames).

use std::io::Cursor;

use crate::common;
use proptest::prelude::*;
use voidbox_protocol::blocking::{read_frame, read_message, write_message};
use voidbox_protocol::*;

#[test]
fn samples_cover_every_message_type() {
    let types: Vec<MessageType> = common::samples::samples()
        .iter()
        .map(Message::message_type)
        .collect();
    assert_eq!(types, MessageType::ALL.to_vec());
    for t in MessageType::ALL {
        assert_eq!(MessageType::from_u8(t.as_u8()), Some(*t));
    }
}

#[test]
fn samples_round_trip() {
    for m in common::samples::samples() {
        let bytes = m.encode().expect("encode");
        assert_eq!(bytes[4], m.message_type().as_u8());
        assert_eq!(
            u32::from_le_bytes(bytes[..4].try_into().unwrap()) as usize,
            bytes.len() - HEADER_LEN
        );
        assert_eq!(Message::decode_exact(&bytes).expect("decode"), m);
    }
}

#[test]
fn json_payloads_are_json_and_binary_ones_are_not() {
    for m in common::samples::samples() {
        let payload = m.encode_payload().unwrap();
        let is_json = serde_json::from_slice::<serde_json::Value>(&payload).is_ok();
        assert_eq!(
            is_json,
            !m.message_type().is_binary(),
            "{:?}",
            m.message_type()
        );
    }
}

#[test]
fn exec_request_json_shape() {
    let m = &common::samples::sample(MessageType::ExecRequest);
    let v: serde_json::Value = serde_json::from_slice(&m.encode_payload().unwrap()).unwrap();
    assert_eq!(v["id"], 4);
    assert_eq!(v["program"], "sh");
    assert_eq!(v["stdin"], "aW5wdXQK"); // base64("input\n")
    assert_eq!(v["env"][0][0], "PATH");
    assert!(v.get("uid").is_none());
}

#[test]
fn optional_json_fields_default() {
    let m = Message::decode_payload(
        MessageType::ExecRequest.as_u8(),
        br#"{"id":7,"program":"true"}"#,
    )
    .unwrap();
    let Message::ExecRequest(r) = m else {
        panic!("wrong type")
    };
    assert_eq!(r.id, RequestId(7));
    assert!(r.args.is_empty() && r.env.is_empty() && r.stdin.is_empty() && !r.stdin_stream);
    // A `uid` field from a hostile or confused host is ignored, not honoured.
    let m = Message::decode_payload(
        MessageType::ExecRequest.as_u8(),
        br#"{"id":7,"program":"id","uid":0}"#,
    );
    assert!(m.is_ok());
    // Unknown error codes map to `Unknown` for forward compatibility.
    let m = Message::decode_payload(
        MessageType::Error.as_u8(),
        br#"{"id":1,"code":"brand_new","message":"x"}"#,
    );
    assert!(matches!(
        m,
        Ok(Message::Error(ErrorResponse {
            code: ErrorCode::Unknown,
            ..
        }))
    ));
}

#[test]
fn held_exec_messages_json_shape_and_defaults() {
    // `hold` is left out when unset (older guests see the same request as before) and
    // round-trips when set.
    let m = &common::samples::sample(MessageType::ExecRequest);
    let v: serde_json::Value = serde_json::from_slice(&m.encode_payload().unwrap()).unwrap();
    assert!(v.get("hold").is_none(), "{v}");
    let held = Message::ExecRequest(ExecRequest {
        id: RequestId(3),
        program: "claude".into(),
        hold: Some("warm-1".into()),
        ..Default::default()
    });
    let back = Message::decode_exact(&held.encode().unwrap()).unwrap();
    assert_eq!(back, held);
    let Message::ExecRequest(r) = back else {
        panic!("wrong type")
    };
    assert_eq!(r.hold.as_deref(), Some("warm-1"));
    // An attach needs only id and name; stdin is base64 on the wire.
    let m = Message::decode_payload(
        MessageType::ExecAttach.as_u8(),
        br#"{"id":9,"name":"warm-1"}"#,
    )
    .unwrap();
    assert_eq!(
        m,
        Message::ExecAttach(ExecAttach {
            id: RequestId(9),
            name: "warm-1".into(),
            ..Default::default()
        })
    );
    let v: serde_json::Value = serde_json::from_slice(
        &common::samples::sample(MessageType::ExecAttach)
            .encode_payload()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(v["stdin"], "eyJ0eXBlIjoidXNlciJ9Cg=="); // base64 of {"type":"user"}\n
    assert_eq!(MessageType::ExecAttach.as_u8(), 0x15);
    assert_eq!(MessageType::HeldQuery.as_u8(), 0x16);
    assert_eq!(MessageType::HeldInfo.as_u8(), 0x17);
    // HeldInfo ends its exchange; an attach's end is its ExecResponse.
    assert!(common::samples::sample(MessageType::HeldInfo).is_terminal());
    let m = Message::decode_payload(MessageType::HeldInfo.as_u8(), br#"{"id":2,"pid":7}"#).unwrap();
    assert_eq!(
        m,
        Message::HeldInfo(HeldInfo {
            id: RequestId(2),
            pid: 7,
            ..Default::default()
        })
    );
}

#[test]
fn held_names() {
    assert!(valid_held_name("claude-code.v1_2"));
    assert!(valid_held_name(&"a".repeat(MAX_HELD_NAME)));
    for bad in [
        "",
        "Claude",
        "a b",
        "a/b",
        "é",
        "a\0",
        &"a".repeat(MAX_HELD_NAME + 1),
    ] {
        assert!(!valid_held_name(bad), "{bad:?}");
    }
}

#[test]
fn mount_share_json_shape_and_read_only_default() {
    let m = Message::decode_payload(
        MessageType::MountShare.as_u8(),
        br#"{"id":3,"slot":2,"path":"/workspace/src"}"#,
    )
    .unwrap();
    assert_eq!(
        m,
        Message::MountShare(MountShare {
            id: RequestId(3),
            slot: 2,
            path: "/workspace/src".into(),
            read_only: true,
        })
    );
    assert!(m.is_terminal_for(MessageType::MountShare) == m.is_terminal());
    let bytes = Message::MountShare(MountShare {
        id: RequestId(4),
        slot: 0,
        path: "/data".into(),
        read_only: false,
    })
    .encode_payload()
    .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"id": 4, "slot": 0, "path": "/data", "read_only": false})
    );
    // A slot beyond a byte, or a missing path, is malformed.
    for bad in [
        &br#"{"id":1,"slot":256,"path":"/a"}"#[..],
        br#"{"id":1,"slot":0}"#,
        br#"[1,0,"/a",true]"#,
    ] {
        assert!(
            Message::decode_payload(MessageType::MountShare.as_u8(), bad).is_err(),
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn encode_decode_round_trip(m in common::message()) {
        let bytes = m.encode().unwrap();
        prop_assert_eq!(&Message::decode_exact(&bytes).unwrap(), &m);
        prop_assert_eq!(Message::decode(&bytes).unwrap(), Some((m.clone(), bytes.len())));
        let frame = m.to_frame().unwrap();
        prop_assert_eq!(&frame.encode().unwrap(), &bytes);
        prop_assert_eq!(&Message::from_frame(&frame).unwrap(), &m);
        prop_assert_eq!(m.id(), Message::decode_exact(&bytes).unwrap().id());
    }

    #[test]
    fn incremental_decode_needs_whole_frame(m in common::message(), cut in any::<prop::sample::Index>()) {
        let bytes = m.encode().unwrap();
        let cut = cut.index(bytes.len());
        prop_assert!(Message::decode(&bytes[..cut]).unwrap().is_none());
        let truncated = matches!(Message::decode_exact(&bytes[..cut]), Err(ProtocolError::Truncated { .. }));
        prop_assert!(truncated);
    }

    #[test]
    fn blocking_stream_round_trip(msgs in prop::collection::vec(common::message(), 1..8)) {
        let mut wire = Vec::new();
        for m in &msgs {
            write_message(&mut wire, m).unwrap();
        }
        let mut r = Cursor::new(wire);
        for m in &msgs {
            prop_assert_eq!(&read_message(&mut r).unwrap(), m);
        }
        let closed = matches!(read_frame(&mut r), Err(ProtocolError::Closed));
        prop_assert!(closed);
    }

    #[test]
    fn concatenated_buffer_decodes_in_order(msgs in prop::collection::vec(common::message(), 1..8)) {
        let mut wire = Vec::new();
        for m in &msgs {
            wire.extend(m.encode().unwrap());
        }
        let mut pos = 0;
        for m in &msgs {
            let (got, used) = Message::decode(&wire[pos..]).unwrap().unwrap();
            prop_assert_eq!(&got, m);
            pos += used;
        }
        prop_assert_eq!(pos, wire.len());
    }

    #[test]
    fn secret_hex_round_trip(b in any::<[u8; 32]>()) {
        let s = SessionSecret::from_bytes(b);
        prop_assert_eq!(SessionSecret::from_hex(&s.to_hex()).unwrap(), s);
    }
}

#[test]
fn write_file_chunking() {
    let small: Vec<Message> =
        WriteFile::chunked(RequestId(1), "/workspace/s", Some(0o600), b"abc", 16).collect();
    assert_eq!(small.len(), 1);
    assert!(
        matches!(&small[0], Message::WriteFile(w) if !w.more && w.contents == b"abc" && w.mode == Some(0o600))
    );

    let data: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
    for size in [1usize, 7, 100, 999, 1000, 1001] {
        let msgs: Vec<Message> =
            WriteFile::chunked(RequestId(2), "/workspace/b", None, &data, size).collect();
        let Message::WriteFile(head) = &msgs[0] else {
            panic!()
        };
        if size >= data.len() {
            assert_eq!(msgs.len(), 1);
            assert_eq!(head.contents, data);
            continue;
        }
        assert!(head.more && head.contents.is_empty());
        let mut rebuilt = Vec::new();
        for (i, m) in msgs[1..].iter().enumerate() {
            let Message::FileChunk(c) = m else { panic!() };
            assert_eq!(c.offset as usize, rebuilt.len());
            assert_eq!(c.last, i == msgs.len() - 2);
            assert!(c.data.len() <= size);
            rebuilt.extend_from_slice(&c.data);
        }
        assert_eq!(rebuilt, data);
    }
    let empty: Vec<Message> =
        WriteFile::chunked(RequestId(3), "/workspace/e", None, b"", 0).collect();
    assert!(matches!(&empty[..], [Message::WriteFile(w)] if !w.more && w.contents.is_empty()));
}
