//! Tokio adapter: async frame I/O, codecs, and request-id multiplexing of interleaved
//! responses over one connection.

use std::sync::Arc;
use std::time::Duration;

use crate::common;
use bytes::BytesMut;
use futures_like::collect_all;
use tokio::io::{duplex, split};
use tokio_util::codec::{Decoder, Encoder};
use voidbox_protocol::tokio_io::{
    client_handshake, read_message, server_handshake, write_message, Client, Demux, Dispatch,
    FrameCodec, MessageCodec,
};
use voidbox_protocol::*;

mod futures_like {
    /// Awaits every join handle in order.
    pub async fn collect_all<T>(hs: Vec<tokio::task::JoinHandle<T>>) -> Vec<T> {
        let mut out = Vec::new();
        for h in hs {
            out.push(h.await.expect("task"));
        }
        out
    }
}

fn chunk(id: u64, seq: u64, data: &str) -> Message {
    Message::ExecOutputChunk(ExecOutputChunk {
        id: RequestId(id),
        stream: OutputStream::Stdout,
        seq,
        data: data.as_bytes().to_vec(),
    })
}

fn done(id: u64, code: i32) -> Message {
    Message::ExecResponse(ExecResponse {
        id: RequestId(id),
        exit_code: Some(code),
        ..Default::default()
    })
}

#[tokio::test]
async fn async_round_trip_all_samples() {
    let (mut a, mut b) = duplex(1 << 16);
    let samples = common::samples::samples();
    let expected = samples.clone();
    let w = tokio::spawn(async move {
        for m in &samples {
            write_message(&mut a, m).await.unwrap();
        }
    });
    for m in &expected {
        assert_eq!(&read_message(&mut b).await.unwrap(), m);
    }
    w.await.unwrap();
    assert!(matches!(
        read_message(&mut b).await,
        Err(ProtocolError::Closed)
    ));
}

#[tokio::test]
async fn async_oversized_and_truncated() {
    let mut hdr = (MAX_MESSAGE_SIZE + 1).to_le_bytes().to_vec();
    hdr.push(MessageType::PtyData.as_u8());
    assert!(matches!(
        read_message(&mut hdr.as_slice()).await,
        Err(ProtocolError::Oversized { .. })
    ));
    let full = Message::Ack(Ack { id: RequestId(1) }).encode().unwrap();
    assert!(matches!(
        read_message(&mut &full[..3]).await,
        Err(ProtocolError::Truncated { .. })
    ));
    assert!(matches!(
        read_message(&mut &full[..full.len() - 1]).await,
        Err(ProtocolError::Truncated { .. })
    ));
}

#[tokio::test]
async fn async_handshake() {
    let (mut host, mut guest) = duplex(4096);
    let s = SessionSecret::from_bytes([3; 32]);
    let s2 = s.clone();
    let g =
        tokio::spawn(async move { server_handshake(&mut guest, &s2, GuestInfo::default()).await });
    client_handshake(&mut host, &s, None).await.unwrap();
    g.await.unwrap().unwrap();

    let (mut host, mut guest) = duplex(4096);
    let g =
        tokio::spawn(async move { server_handshake(&mut guest, &s, GuestInfo::default()).await });
    let wrong = SessionSecret::from_bytes([4; 32]);
    assert!(matches!(
        client_handshake(&mut host, &wrong, None).await,
        Err(ProtocolError::AuthFailed)
    ));
    assert!(matches!(g.await.unwrap(), Err(ProtocolError::AuthFailed)));
}

#[test]
fn codecs_decode_byte_by_byte_and_encode_identically() {
    let mut wire = Vec::new();
    for m in common::samples::samples() {
        wire.extend(m.encode().unwrap());
    }
    let mut buf = BytesMut::new();
    let mut got = Vec::new();
    for b in &wire {
        buf.extend_from_slice(&[*b]);
        while let Some(m) = MessageCodec.decode(&mut buf).unwrap() {
            got.push(m);
        }
    }
    assert_eq!(got, common::samples::samples());
    assert!(MessageCodec.decode_eof(&mut buf).unwrap().is_none());

    let mut out = BytesMut::new();
    for m in &got {
        MessageCodec.encode(m, &mut out).unwrap();
    }
    assert_eq!(&out[..], &wire[..]);

    let mut out = BytesMut::new();
    for m in &got {
        FrameCodec.encode(m.to_frame().unwrap(), &mut out).unwrap();
    }
    assert_eq!(&out[..], &wire[..]);
}

#[test]
fn codec_errors() {
    let mut hdr = BytesMut::from(&u32::MAX.to_le_bytes()[..]);
    hdr.extend_from_slice(&[0x11]);
    assert!(matches!(
        FrameCodec.decode(&mut hdr),
        Err(ProtocolError::Oversized { .. })
    ));
    let mut partial =
        BytesMut::from(&Message::Ack(Ack { id: RequestId(1) }).encode().unwrap()[..7]);
    assert!(FrameCodec.decode(&mut partial).unwrap().is_none());
    assert!(matches!(
        FrameCodec.decode_eof(&mut partial),
        Err(ProtocolError::Truncated { .. })
    ));
    // FrameCodec passes unknown types through; MessageCodec rejects them.
    let mut unk = BytesMut::from(&[1, 0, 0, 0, 0xee, 0][..]);
    let f = FrameCodec.decode(&mut unk.clone()).unwrap().unwrap();
    assert_eq!(f.ty, 0xee);
    assert!(matches!(
        MessageCodec.decode(&mut unk),
        Err(ProtocolError::UnknownType(0xee))
    ));
    let big = Frame {
        ty: 1,
        payload: vec![0; MAX_MESSAGE_SIZE as usize + 1],
    };
    assert!(matches!(
        FrameCodec.encode(&big, &mut BytesMut::new()),
        Err(ProtocolError::Oversized { .. })
    ));
}

#[tokio::test]
async fn demux_routes_interleaved_responses() {
    let demux = Demux::new(16);
    let mut r1 = demux
        .register(RequestId(1), MessageType::ExecRequest)
        .unwrap();
    let mut r2 = demux
        .register(RequestId(2), MessageType::ExecRequest)
        .unwrap();
    let mut r3 = demux.register(RequestId(3), MessageType::ReadFile).unwrap();
    assert!(demux
        .register(RequestId(2), MessageType::ExecRequest)
        .is_err());
    assert_eq!(demux.len(), 3);

    let incoming = vec![
        chunk(2, 0, "b0"),
        chunk(1, 0, "a0"),
        Message::FileChunk(FileChunk {
            id: RequestId(3),
            offset: 0,
            last: false,
            data: b"f0".to_vec(),
        }),
        chunk(2, 1, "b1"),
        done(2, 0),
        chunk(1, 1, "a1"),
        Message::FileChunk(FileChunk {
            id: RequestId(3),
            offset: 2,
            last: true,
            data: b"f1".to_vec(),
        }),
        chunk(9, 0, "stray"),
        done(1, 7),
    ];
    let mut outcomes = Vec::new();
    for m in incoming {
        outcomes.push(match demux.dispatch(m).await {
            Dispatch::Delivered => "d",
            Dispatch::Finished => "F",
            Dispatch::Unrouted(m) => {
                assert_eq!(m.id(), RequestId(9));
                "u"
            }
            Dispatch::ReceiverGone => "g",
        });
    }
    assert_eq!(outcomes.join(""), "ddddFdFuF");
    assert!(demux.is_empty());

    async fn drain(rx: &mut tokio::sync::mpsc::Receiver<Message>) -> Vec<Message> {
        let mut v = Vec::new();
        while let Some(m) = rx.recv().await {
            v.push(m);
        }
        v
    }
    assert_eq!(
        drain(&mut r1).await,
        vec![chunk(1, 0, "a0"), chunk(1, 1, "a1"), done(1, 7)]
    );
    assert_eq!(
        drain(&mut r2).await,
        vec![chunk(2, 0, "b0"), chunk(2, 1, "b1"), done(2, 0)]
    );
    let f = drain(&mut r3).await;
    assert_eq!(f.len(), 2);
    assert!(f.iter().all(|m| m.id() == RequestId(3)));
    // A late message after completion is unrouted, not misdelivered.
    assert!(matches!(
        demux.dispatch(chunk(1, 2, "late")).await,
        Dispatch::Unrouted(_)
    ));
}

#[tokio::test]
async fn demux_pty_session_survives_its_ack() {
    let demux = Demux::default();
    let mut rx = demux.register(RequestId(5), MessageType::PtyOpen).unwrap();
    assert!(matches!(
        demux.dispatch(Message::Ack(Ack { id: RequestId(5) })).await,
        Dispatch::Delivered
    ));
    let data = Message::PtyData(PtyData {
        id: RequestId(5),
        data: b"$ ".to_vec(),
    });
    assert!(matches!(demux.dispatch(data).await, Dispatch::Delivered));
    assert!(matches!(
        demux.dispatch(done(5, 0)).await,
        Dispatch::Finished
    ));
    let mut n = 0;
    while rx.recv().await.is_some() {
        n += 1;
    }
    assert_eq!(n, 3);
}

#[tokio::test]
async fn demux_receiver_gone_and_close_all() {
    let demux = Demux::default();
    drop(
        demux
            .register(RequestId(1), MessageType::ExecRequest)
            .unwrap(),
    );
    assert!(matches!(
        demux.dispatch(chunk(1, 0, "x")).await,
        Dispatch::ReceiverGone
    ));
    assert!(demux.is_empty());
    let mut rx = demux
        .register(RequestId(2), MessageType::ExecRequest)
        .unwrap();
    assert!(demux.unregister(RequestId(2)));
    assert!(rx.recv().await.is_none());
    let mut rx = demux
        .register(RequestId(3), MessageType::ExecRequest)
        .unwrap();
    demux.close_all();
    assert!(rx.recv().await.is_none());
}

/// End to end: 16 concurrent execs share one connection; a fake guest answers them with
/// output chunks interleaved across requests (and completes them in reverse order).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_multiplexes_concurrent_requests() {
    const N: u64 = 16;
    const CHUNKS: u64 = 20;
    let (host, guest) = duplex(1 << 12);
    let (host_r, host_w) = split(host);
    let (mut guest_r, mut guest_w) = split(guest);

    // Fake guest: collect N exec requests, then emit interleaved chunks, then responses.
    let guest_task = tokio::spawn(async move {
        let mut ids = Vec::new();
        while ids.len() < N as usize {
            match read_message(&mut guest_r).await.unwrap() {
                Message::ExecRequest(r) => ids.push(r.id),
                other => panic!("unexpected {other:?}"),
            }
        }
        // An unsolicited message and a malformed frame with a recoverable id are mixed in.
        write_message(&mut guest_w, &Message::Telemetry(Telemetry::default()))
            .await
            .unwrap();
        for seq in 0..CHUNKS {
            for id in &ids {
                let m = chunk(id.0, seq, &format!("{}:{seq};", id.0));
                write_message(&mut guest_w, &m).await.unwrap();
            }
        }
        for id in ids.iter().rev() {
            write_message(&mut guest_w, &done(id.0, id.0 as i32))
                .await
                .unwrap();
        }
    });

    let demux = Arc::new(Demux::new(4));
    let client = Arc::new(Client::new(host_w, demux.clone()));
    let unrouted = Arc::new(std::sync::Mutex::new(Vec::new()));
    let unrouted2 = unrouted.clone();
    let mut host_r = host_r;
    let pump = tokio::spawn(async move {
        demux
            .pump(&mut host_r, |m| unrouted2.lock().unwrap().push(m))
            .await
    });

    let mut tasks = Vec::new();
    for _ in 0..N {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let id = client.next_id();
            let req = Message::ExecRequest(ExecRequest {
                id,
                program: "echo".into(),
                ..Default::default()
            });
            let mut rx = client.request(&req).await.unwrap();
            let mut out = String::new();
            let mut next_seq = 0;
            let mut resp = None;
            while let Some(m) = rx.recv().await {
                match m {
                    Message::ExecOutputChunk(c) => {
                        assert_eq!(c.id, id);
                        assert_eq!(c.seq, next_seq, "sequence gap");
                        next_seq += 1;
                        out.push_str(std::str::from_utf8(&c.data).unwrap());
                    }
                    Message::ExecResponse(r) => resp = Some(r),
                    other => panic!("misrouted {other:?}"),
                }
            }
            (id, out, resp.expect("final response"))
        }));
    }
    let results = tokio::time::timeout(Duration::from_secs(20), collect_all(tasks))
        .await
        .expect("deadlock");
    for (id, out, resp) in results {
        let expected: String = (0..CHUNKS).map(|s| format!("{}:{s};", id.0)).collect();
        assert_eq!(out, expected);
        assert_eq!(resp.exit_code, Some(id.0 as i32));
    }
    guest_task.await.unwrap();
    assert!(client.demux().is_empty());
    drop(client);
    pump.await.unwrap().unwrap();
    assert_eq!(unrouted.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn pump_turns_recoverable_decode_errors_into_error_replies() {
    let demux = Demux::default();
    let mut rx = demux
        .register(RequestId(4), MessageType::ExecRequest)
        .unwrap();
    let mut wire = Vec::new();
    // Malformed ExecResponse for id 4 (bad JSON type), then an unknown type, then a real chunk.
    let bad = br#"{"id":4,"exit_code":"zero"}"#;
    wire.extend((bad.len() as u32).to_le_bytes());
    wire.push(MessageType::ExecResponse.as_u8());
    wire.extend(bad);
    wire.extend([0, 0, 0, 0, 0xee]);
    wire.extend(chunk(4, 0, "ok").encode().unwrap());
    let mut unrouted = Vec::new();
    demux
        .pump(&mut wire.as_slice(), |m| unrouted.push(m))
        .await
        .unwrap();
    let first = rx.recv().await.unwrap();
    assert!(matches!(
        first,
        Message::Error(ErrorResponse {
            code: ErrorCode::Malformed,
            ..
        })
    ));
    // The synthetic Error is final for request 4: its channel ends, and the later chunk
    // (now without a route) is reported as unrouted rather than lost silently. The
    // unknown-type frame was skipped without ending the pump.
    assert!(rx.recv().await.is_none());
    assert_eq!(unrouted, vec![chunk(4, 0, "ok")]);
}
