//! Replays the cargo-fuzz seed corpus (`vmm/fuzz/corpus/vsock_packet`) through the same code the
//! fuzz target exercises, so regressions show up in a plain `cargo test`.

use voidbox_vmm::devices::vsock::{fuzz_queues, packet::parse_packet, packet::MAX_PKT_PAYLOAD};

#[test]
fn replay_vsock_packet_corpus() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/vsock_packet");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).expect("corpus directory") {
        let path = entry.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        if let Ok((hdr, payload)) = parse_packet(&data) {
            assert!(payload.len() <= MAX_PKT_PAYLOAD);
            assert_eq!(payload.len() as u32, hdr.payload_len());
        }
        fuzz_queues(&data);
        n += 1;
    }
    assert!(n >= 10, "corpus too small: {n}");
}

#[test]
fn parse_results_for_named_seeds() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/vsock_packet");
    let read = |n: &str| std::fs::read(dir.join(n)).unwrap();
    let rw = read("rw_hello");
    let (_, p) = parse_packet(&rw).unwrap();
    assert_eq!(p, b"hello");
    assert!(parse_packet(&read("short_header")).is_err());
    assert!(parse_packet(&read("len_exceeds")).is_err());
    assert!(parse_packet(&read("len_too_large")).is_err());
    assert!(
        parse_packet(&read("unknown_op")).is_ok(),
        "validated later, not a parse error"
    );
}
