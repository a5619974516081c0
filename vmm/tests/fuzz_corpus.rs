//! Replays the cargo-fuzz seed corpora (`vmm/fuzz/corpus/vsock_packet`,
//! `vmm/fuzz/corpus/block_request`, `vmm/fuzz/corpus/net_frame`) through the same code the
//! fuzz targets exercise, so regressions show up in a plain `cargo test`.

use std::path::{Path, PathBuf};

use voidbox_vmm::devices::block::fuzz::{
    fuzz_disk_byte, fuzz_requests, FuzzReport, FUZZ_DISK_BYTES,
};
use voidbox_vmm::devices::block::request::status;
use voidbox_vmm::devices::net::frame::NET_HDR_LEN;
use voidbox_vmm::devices::net::fuzz::{fuzz_frames, FuzzReport as NetReport, FUZZ_RX_QUEUE};
use voidbox_vmm::devices::net::{ETH_HLEN, MAX_FRAME_LEN};
use voidbox_vmm::devices::vsock::{fuzz_queues, packet::parse_packet, packet::MAX_PKT_PAYLOAD};

fn corpus(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(name)
}

#[test]
fn replay_vsock_packet_corpus() {
    let dir = corpus("vsock_packet");
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
    let dir = corpus("vsock_packet");
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

fn original_disk() -> Vec<u8> {
    (0..FUZZ_DISK_BYTES).map(fuzz_disk_byte).collect()
}

#[test]
fn replay_block_request_corpus() {
    let mut n = 0;
    for entry in std::fs::read_dir(corpus("block_request")).expect("corpus directory") {
        let path = entry.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        let r = fuzz_requests(&data).unwrap_or_else(|| panic!("{}: no report", path.display()));
        assert_eq!(r.disk.len(), FUZZ_DISK_BYTES);
        if data[0] & 1 != 0 {
            assert_eq!(
                r.disk,
                original_disk(),
                "{}: read-only disk written",
                path.display()
            );
        }
        n += 1;
    }
    assert!(n >= 20, "corpus too small: {n}");
}

#[test]
fn block_request_outcomes_for_named_seeds() {
    let run = |name: &str| -> FuzzReport {
        let data = std::fs::read(corpus("block_request").join(name)).unwrap();
        fuzz_requests(&data).unwrap()
    };
    let answered = |name: &str, want: &[u8]| {
        let r = run(name);
        assert!(!r.broken, "{name}: device broke");
        assert_eq!(r.statuses, want, "{name}");
        r
    };
    let broken = |name: &str| {
        let r = run(name);
        assert!(r.broken, "{name}: device did not break");
        assert!(r.statuses.is_empty(), "{name}: {:?}", r.statuses);
        assert_eq!(r.disk, original_disk(), "{name}");
    };
    let orig = original_disk();

    let r = answered("in_valid", &[status::OK]);
    assert_eq!(r.stats.reads, 1);
    answered("in_any_layout", &[status::OK]);
    answered("zero_length_data", &[status::OK]);
    let r = answered("out_valid", &[status::OK]);
    assert_eq!(r.disk[4 * 512..5 * 512], [0xab; 512]);
    assert_eq!(r.disk[..4 * 512], orig[..4 * 512]);
    assert_eq!(r.disk[5 * 512..], orig[5 * 512..]);
    let r = answered("flush", &[status::OK]);
    assert_eq!(r.stats.flushes, 1);
    answered("get_id", &[status::OK]);
    answered("unsupported_type", &[status::UNSUPP]);
    for name in [
        "out_of_range_sector",
        "range_crosses_end",
        "overflowing_sector",
        "overflowing_sector_bytes",
        "unaligned_length",
        "write_to_ro",
    ] {
        let r = answered(name, &[status::IOERR]);
        assert_eq!(r.disk, orig, "{name} changed the disk");
        assert_eq!(r.stats.errors, 1, "{name}");
    }
    let r = answered("write_read_flush", &[status::OK; 3]);
    assert_eq!(r.disk[5 * 512..6 * 512], [0x5a; 512]);
    assert_eq!((r.stats.writes, r.stats.reads, r.stats.flushes), (1, 1, 1));
    for name in [
        "self_loop",
        "chain_longer_than_queue",
        "next_out_of_table",
        "zero_length_only",
        "status_read_only",
        "status_outside_memory",
        "huge_length",
        "avail_index_jump",
    ] {
        broken(name);
    }
}

/// RFC 1071 ones'-complement sum, folded (0xffff over a span with a valid checksum).
fn ones_sum(data: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for c in data.chunks(2) {
        sum += u32::from(u16::from_be_bytes([c[0], c.get(1).copied().unwrap_or(0)]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

fn net_seed(name: &str) -> NetReport {
    let data = std::fs::read(corpus("net_frame").join(name)).unwrap();
    fuzz_frames(&data).unwrap_or_else(|| panic!("{name}: no report"))
}

#[test]
fn replay_net_frame_corpus() {
    let mut n = 0;
    for entry in std::fs::read_dir(corpus("net_frame")).expect("corpus directory") {
        let path = entry.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        let r = fuzz_frames(&data).unwrap_or_else(|| panic!("{}: no report", path.display()));
        for f in &r.tx_frames {
            assert!(
                (ETH_HLEN..=MAX_FRAME_LEN).contains(&f.len()),
                "{}: {}-byte frame",
                path.display(),
                f.len()
            );
        }
        for &(head, len) in &r.rx_used {
            let len = len as usize;
            assert!(head < FUZZ_RX_QUEUE.0);
            assert!(
                len == 0 || (NET_HDR_LEN + ETH_HLEN..=NET_HDR_LEN + MAX_FRAME_LEN).contains(&len),
                "{}: used length {len}",
                path.display()
            );
        }
        n += 1;
    }
    assert!(n >= 20, "corpus too small: {n}");
}

#[test]
fn net_frame_outcomes_for_named_seeds() {
    let ok = |name: &str| {
        let r = net_seed(name);
        assert!(!r.broken, "{name}: device broke");
        r
    };
    // Well-formed frames in any layout reach the NAT and come back whole.
    for (name, len) in [
        ("tx_valid", 60),
        ("tx_split", 300),
        ("tx_split_mid_header", 60),
        ("tx_max_frame", MAX_FRAME_LEN),
        ("tx_min_frame", ETH_HLEN),
    ] {
        let r = ok(name);
        assert_eq!(r.tx_frames.len(), 1, "{name}");
        assert_eq!(r.tx_frames[0].len(), len, "{name}");
        assert_eq!(
            r.tx_frames[0][12..14],
            [8, 0],
            "{name}: header not stripped"
        );
        assert_eq!(r.rx_used, vec![(0, (NET_HDR_LEN + len) as u32)], "{name}");
        assert_eq!((r.stats.rx_frames, r.stats.rx_dropped), (1, 0), "{name}");
    }
    // Bad sizes are dropped and counted; the device carries on.
    for name in ["tx_too_short", "tx_too_long", "tx_header_only"] {
        let r = ok(name);
        assert!(r.tx_frames.is_empty(), "{name}");
        assert_eq!(r.stats.tx_dropped, 1, "{name}");
    }
    // Checksum offload (NEEDS_CSUM): completed inside the frame, dropped when the field
    // lies outside it.
    for (name, field) in [("tx_csum_valid", 34 + 16), ("tx_csum_last_bytes", 58)] {
        let r = ok(name);
        assert_eq!(r.tx_frames.len(), 1, "{name}");
        let f = &r.tx_frames[0];
        assert_ne!(
            f[field..field + 2],
            [0x42, 0x42],
            "{name}: checksum not written"
        );
        // The seed's field held 0x4242 as the "pseudo-header sum": add it back to verify.
        let sum = u32::from(ones_sum(&f[34..])) + 0x4242;
        assert_eq!(sum % 0xffff, 0, "{name}: checksum does not verify");
    }
    for name in [
        "tx_csum_start_past_end",
        "tx_csum_field_straddles_end",
        "tx_csum_huge_offsets",
    ] {
        let r = ok(name);
        assert!(r.tx_frames.is_empty(), "{name}");
        assert_eq!(r.stats.tx_dropped, 1, "{name}");
    }
    // A frame bigger than the receive buffer is dropped; the buffer comes back empty.
    let r = ok("rx_too_small");
    assert_eq!(r.rx_used, vec![(0, 0)]);
    assert_eq!(r.stats.rx_dropped, 1);
    // No receive buffer: the frame waits (nothing used, nothing dropped).
    let r = ok("rx_none_posted");
    assert_eq!(r.tx_frames.len(), 1);
    assert!(r.rx_used.is_empty());
    assert_eq!(r.stats.rx_dropped, 0);
    let r = ok("more_frames_than_buffers");
    assert_eq!(r.tx_frames.len(), 3);
    assert_eq!(r.rx_used, vec![(0, 12 + 61), (1, 12 + 62)]);
    let r = ok("deliver_max_frame");
    assert_eq!(r.rx_used, vec![(0, (NET_HDR_LEN + MAX_FRAME_LEN) as u32)]);
    let r = ok("deliver_oversized");
    assert_eq!(
        r.rx_used,
        vec![(0, 0)],
        "an over-long frame is never delivered"
    );
    ok("empty");
    // Malformed chains break the device, are never followed, and deliver nothing.
    for name in [
        "tx_writable",
        "tx_self_loop",
        "tx_huge_length",
        "tx_next_out_of_table",
        "tx_avail_jump",
        "rx_readable",
        "rx_self_loop",
        "rx_huge_length",
    ] {
        let r = net_seed(name);
        assert!(r.broken, "{name}: device did not break");
        assert!(
            r.rx_used.iter().all(|&(_, len)| len == 0),
            "{name}: {:?}",
            r.rx_used
        );
    }
}
