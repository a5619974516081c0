//! Decoder invariants checked on arbitrary input. Shared by the cargo-fuzz target `decode`
//! and by `tests/fuzz_corpus.rs`, which replays the checked-in corpus under `cargo test`.
#![allow(dead_code)]

use std::io::Cursor;

use voidbox_protocol::blocking::read_message;
use voidbox_protocol::{Frame, Message, ProtocolError, HEADER_LEN, MAX_MESSAGE_SIZE};

/// Feeds `data` through every decoding entry point, asserting the invariants, and returns
/// the results of reading it as a stream of messages (stopping after a fatal error).
pub fn check(data: &[u8]) -> Vec<Result<Message, ProtocolError>> {
    // 1. Blocking stream decoding; recoverable errors skip exactly one frame.
    let mut cursor = Cursor::new(data);
    let mut results = Vec::new();
    loop {
        let before = cursor.position();
        let r = read_message(&mut cursor);
        let fatal = matches!(&r, Err(e) if e.is_fatal());
        if let Ok(m) = &r {
            check_round_trip(m);
        }
        if let Err(ProtocolError::Oversized { len, max }) = &r {
            assert!(*len > u64::from(*max) && *max == MAX_MESSAGE_SIZE);
        }
        if matches!(r, Err(ProtocolError::Closed)) {
            assert_eq!(before, data.len() as u64, "Closed only at the end of input");
            break;
        }
        assert!(
            cursor.position() > before || fatal,
            "no progress without a fatal error"
        );
        results.push(r);
        if fatal {
            break;
        }
    }

    // 2. The incremental buffer decoder agrees with the stream decoder.
    let mut pos = 0;
    let mut i = 0;
    while pos < data.len() {
        match Frame::decode(&data[pos..]) {
            Ok(Some((frame, used))) => {
                assert!(used >= HEADER_LEN && used == HEADER_LEN + frame.payload.len());
                let m = Message::from_frame(&frame);
                match (&m, results.get(i)) {
                    (Ok(a), Some(Ok(b))) => assert_eq!(a, b),
                    (Err(_), Some(Err(_))) => {}
                    (a, b) => panic!("decoders disagree: {a:?} vs {b:?}"),
                }
                pos += used;
                i += 1;
            }
            Ok(None) => {
                assert!(matches!(
                    results.last(),
                    Some(Err(ProtocolError::Truncated { .. }))
                ));
                break;
            }
            Err(e) => {
                assert!(matches!(e, ProtocolError::Oversized { .. }));
                break;
            }
        }
    }

    // 3. Direct payload decoding with the first byte as the type.
    if let Some((&ty, payload)) = data.split_first() {
        if let Ok(m) = Message::decode_payload(ty, payload) {
            check_round_trip(&m);
        }
    }

    // 4. Exact decoding never panics.
    let _ = Message::decode_exact(data);
    results
}

/// A decoded message re-encodes, and decodes back to itself; `Debug` never panics.
fn check_round_trip(m: &Message) {
    let bytes = m.encode().expect("a decoded message re-encodes");
    let back = Message::decode_exact(&bytes).expect("re-encoded message decodes");
    assert_eq!(&back, m);
    let _ = format!("{m:?}");
}
