//! Regenerates the seed corpus of the `decode` fuzz target:
//! `cargo run -p voidbox-protocol --example gen_fuzz_corpus [DIR]`
//! (default `protocol/fuzz/corpus/decode`). File-name prefixes state the expected outcome
//! (`valid-`, `truncated-`, `oversized-`, `unknown-`, `malformed-`, `trailing-`,
//! `garbage-`), which `tests/fuzz_corpus.rs` checks.

#[path = "../tests/common/samples.rs"]
mod samples;

use std::path::PathBuf;

use voidbox_protocol::{
    Message, MessageType, MAX_MESSAGE_SIZE, REKEY_ENTROPY_MAX, REKEY_ENTROPY_MIN,
};

fn frame(ty: u8, payload: &[u8]) -> Vec<u8> {
    let mut v = (payload.len() as u32).to_le_bytes().to_vec();
    v.push(ty);
    v.extend_from_slice(payload);
    v
}

fn header(len: u32, ty: u8) -> Vec<u8> {
    let mut v = len.to_le_bytes().to_vec();
    v.push(ty);
    v
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/decode"));
    std::fs::create_dir_all(&dir)?;
    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    let samples = samples::samples();

    let mut all = Vec::new();
    for m in &samples {
        let b = m.encode()?;
        all.extend_from_slice(&b);
        files.push((format!("valid-{}", m.message_type().name()), b));
    }
    files.push(("valid-stream-all-types".into(), all));
    let ack = |id| {
        frame(
            MessageType::Ack.as_u8(),
            format!("{{\"id\":{id}}}").as_bytes(),
        )
    };
    files.push(("valid-min-ack".into(), ack(1)));
    files.push((
        "valid-empty-pty-data".into(),
        frame(MessageType::PtyData.as_u8(), &[0; 8]),
    ));
    let ping_no_policy = frame(
        MessageType::Ping.as_u8(),
        &[[0u8; 8].as_slice(), &1u32.to_le_bytes(), &[9; 32]].concat(),
    );
    files.push(("valid-ping-no-policy".into(), ping_no_policy));

    for n in 1..5 {
        files.push((
            format!("truncated-header-{n}"),
            samples::sample(MessageType::Ack).encode()?[..n].to_vec(),
        ));
    }
    for t in [
        MessageType::Ping,
        MessageType::Rekey,
        MessageType::ExecRequest,
        MessageType::ExecOutputChunk,
        MessageType::FileChunk,
    ] {
        let m = samples::sample(t);
        let b = m.encode()?;
        files.push((
            format!("truncated-payload-{}", m.message_type().name()),
            b[..b.len() / 2].to_vec(),
        ));
    }
    files.push((
        "truncated-announces-max".into(),
        header(MAX_MESSAGE_SIZE, MessageType::PtyData.as_u8()),
    ));

    files.push((
        "oversized-max-plus-one".into(),
        header(MAX_MESSAGE_SIZE + 1, MessageType::FileChunk.as_u8()),
    ));
    files.push((
        "oversized-u32-max".into(),
        header(u32::MAX, MessageType::ExecRequest.as_u8()),
    ));
    files.push((
        "oversized-after-valid".into(),
        [ack(1), header(u32::MAX, 0)].concat(),
    ));

    for ty in [0x00u8, 0x07, 0x7f, 0xff] {
        files.push((format!("unknown-type-{ty:02x}"), frame(ty, b"{\"id\":1}")));
    }

    let json = MessageType::ExecRequest.as_u8();
    for (name, p) in [
        ("malformed-json-empty", &b""[..]),
        ("malformed-json-open-brace", b"{"),
        ("malformed-json-array", b"[1,\"sh\"]"),
        ("malformed-json-missing-id", b"{\"program\":\"sh\"}"),
        ("malformed-json-wrong-type", b"{\"id\":1,\"program\":7}"),
        (
            "malformed-json-bad-base64",
            b"{\"id\":1,\"program\":\"sh\",\"stdin\":\"!!\"}",
        ),
        (
            "malformed-json-trailing",
            b"{\"id\":1,\"program\":\"sh\"} junk",
        ),
        (
            "malformed-json-invalid-utf8",
            b"{\"id\":1,\"program\":\"\xff\"}",
        ),
    ] {
        files.push((name.into(), frame(json, p)));
    }
    files.push((
        "malformed-bin-short-ping".into(),
        frame(MessageType::Ping.as_u8(), &[1; 20]),
    ));
    files.push((
        "malformed-bin-short-chunk".into(),
        frame(MessageType::FileChunk.as_u8(), &[1; 16]),
    ));
    let mut bad_stream = vec![0u8; 8];
    bad_stream.push(7);
    bad_stream.extend([0; 8]);
    files.push((
        "malformed-bin-bad-stream".into(),
        frame(MessageType::ExecOutputChunk.as_u8(), &bad_stream),
    ));
    files.push((
        "malformed-bin-bad-flags".into(),
        frame(
            MessageType::ExecStdin.as_u8(),
            &[0, 0, 0, 0, 0, 0, 0, 0, 0xf0],
        ),
    ));
    let rekey = |entropy_len: usize| {
        let mut p = 12u64.to_le_bytes().to_vec();
        p.extend([0x42; 32]);
        p.extend(1_700_000_000_000_000_000u64.to_le_bytes());
        p.extend(vec![7u8; entropy_len]);
        frame(MessageType::Rekey.as_u8(), &p)
    };
    files.push(("valid-rekey-min-entropy".into(), rekey(REKEY_ENTROPY_MIN)));
    files.push(("valid-rekey-max-entropy".into(), rekey(REKEY_ENTROPY_MAX)));
    files.push(("malformed-rekey-no-entropy".into(), rekey(0)));
    files.push((
        "malformed-rekey-short-entropy".into(),
        rekey(REKEY_ENTROPY_MIN - 1),
    ));
    files.push((
        "malformed-rekey-long-entropy".into(),
        rekey(REKEY_ENTROPY_MAX + 1),
    ));
    files.push((
        "malformed-pong-no-info".into(),
        frame(MessageType::Pong.as_u8(), &[0; 12]),
    ));

    files.push((
        "trailing-garbage".into(),
        [ack(5), b"\x01\x02".to_vec()].concat(),
    ));

    // Deterministic pseudo-random garbage (xorshift).
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for n in [0usize, 1, 7, 64, 512] {
        let bytes: Vec<u8> = (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 24) as u8
            })
            .collect();
        files.push((format!("garbage-{n}"), bytes));
    }

    for (name, bytes) in &files {
        std::fs::write(dir.join(name), bytes)?;
    }
    // Sanity: every valid seed decodes.
    for (name, bytes) in &files {
        if name.starts_with("valid-") {
            let mut pos = 0;
            while pos < bytes.len() {
                let (_, used) = Message::decode(&bytes[pos..])?.ok_or("incomplete valid seed")?;
                pos += used;
            }
        }
    }
    println!("wrote {} files to {}", files.len(), dir.display());
    Ok(())
}
