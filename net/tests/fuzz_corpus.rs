//! Replays the cargo-fuzz seed corpus (`net/fuzz/corpus/nat_frames`) through the code the
//! fuzz target runs, so regressions show up in a plain `cargo test`; checks what the named
//! seeds must do. `VOIDBOX_WRITE_NET_CORPUS=1 cargo test -p voidbox-net --test net --
//! fuzz_corpus::write_corpus --ignored` rewrites the seeds.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use crate::common::*;
use hickory_proto::rr::RecordType;
use smoltcp::wire::TcpControl;
use voidbox_net::fuzz::{nat_frames, FuzzReport};
use voidbox_net::testing::query_message;
use voidbox_net::{reasons, DNS_IP, GATEWAY_IP};

fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/nat_frames")
}

fn run(name: &str) -> FuzzReport {
    let data = std::fs::read(corpus().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    nat_frames(&data)
}

fn decoded(r: &FuzzReport) -> Vec<Out> {
    r.frames_out.iter().map(|f| decode(f)).collect()
}

#[test]
fn replay_nat_frames_corpus() {
    let mut n = 0;
    for entry in std::fs::read_dir(corpus()).expect("corpus directory") {
        let path = entry.unwrap().path();
        let data = std::fs::read(&path).unwrap();
        let r = nat_frames(&data);
        assert!(r.stats.queued_to_guest as usize <= voidbox_net::TO_GUEST_QUEUE);
        n += 1;
    }
    assert!(n >= 12, "corpus too small: {n}");
}

#[test]
fn named_seeds() {
    let r = run("arp_gateway");
    assert!(
        matches!(decoded(&r).as_slice(), [Out::ArpReply { sender_ip, .. }] if *sender_ip == GATEWAY_IP)
    );

    let r = run("icmp_gateway");
    assert!(decoded(&r)
        .iter()
        .any(|o| matches!(o, Out::EchoReply { src, .. } if *src == GATEWAY_IP)));

    let r = run("icmp_public_denied");
    assert!(decoded(&r)
        .iter()
        .any(|o| matches!(o, Out::Unreachable { code: 13, .. })));
    assert_eq!(r.denials[0].reason, reasons::DENY_LIST);

    let r = run("tcp_syn_denied");
    assert!(decoded(&r).iter().any(|o| matches!(
        o,
        Out::Tcp {
            control: TcpControl::Rst,
            ..
        }
    )));
    assert_eq!(r.denials[0].reason, reasons::HOST_PORT_NOT_ALLOWED);

    let r = run("tcp_syn_port9");
    assert_eq!(r.stats.tcp_connects, 1);
    assert!(decoded(&r).iter().any(|o| matches!(
        o,
        Out::Tcp {
            control: TcpControl::Rst,
            ..
        }
    )));

    let r = run("tcp_ack_unknown");
    assert!(decoded(&r).iter().any(|o| matches!(
        o,
        Out::Tcp {
            control: TcpControl::Rst,
            ..
        }
    )));

    let r = run("tcp_dns_syn");
    assert!(decoded(&r)
        .iter()
        .any(|o| matches!(o, Out::Tcp { control: TcpControl::Syn, src, .. } if *src == DNS_IP)));

    let r = run("udp_dns_query");
    assert_eq!(r.stats.dns_queries, 1);
    assert!(
        decoded(&r)
            .iter()
            .any(|o| matches!(o, Out::Udp { sport: 53, .. })),
        "SERVFAIL reaches the guest"
    );

    let r = run("arp_spoofed_sender_mac");
    assert!(r.stats.dropped_bad_source >= 1);

    let r = run("malformed");
    assert!(r.frames_out.is_empty());
    assert_eq!(r.stats.dropped_from_guest(), r.stats.frames_from_guest);
}

// ---------------------------------------------------------------- seed writer

fn frame(f: &[u8]) -> Vec<u8> {
    let mut v = vec![0];
    v.extend_from_slice(&(f.len() as u16).to_le_bytes());
    v.extend_from_slice(f);
    v
}

const POLL: [u8; 1] = [3];
const POP: [u8; 2] = [2, 255];

fn advance(steps: u8) -> Vec<u8> {
    vec![1, steps]
}

fn seq(parts: &[Vec<u8>]) -> Vec<u8> {
    parts.concat()
}

#[test]
#[ignore = "rewrites the seed corpus"]
fn write_corpus() {
    if std::env::var_os("VOIDBOX_WRITE_NET_CORPUS").is_none() {
        return;
    }
    let arp = frame(&arp_request(GATEWAY_IP));
    let public = Ipv4Addr::new(93, 184, 216, 34);
    let query = query_message(0x4242, "example.com", RecordType::A).unwrap();
    let good = tcp_syn(GATEWAY_IP, 1234, 22);
    let mut wrong_mac = good.clone();
    wrong_mac[0] = 0x02;
    let mut bad_sum = good.clone();
    bad_sum[24] ^= 0xff;
    let seeds: Vec<(&str, Vec<u8>)> = vec![
        ("arp_gateway", seq(&[arp.clone(), POP.to_vec()])),
        ("arp_dns", seq(&[frame(&arp_request(DNS_IP)), POP.to_vec()])),
        (
            "arp_other",
            seq(&[
                frame(&arp_request(Ipv4Addr::new(10, 0, 2, 50))),
                POP.to_vec(),
            ]),
        ),
        (
            "icmp_gateway",
            seq(&[
                arp.clone(),
                frame(&icmp_echo(GATEWAY_IP, 1, 1, b"abcdefgh")),
                POP.to_vec(),
            ]),
        ),
        (
            "icmp_public_denied",
            seq(&[frame(&icmp_echo(public, 1, 1, b"x")), POP.to_vec()]),
        ),
        (
            "icmp_private",
            seq(&[
                frame(&icmp_echo(Ipv4Addr::new(10, 9, 9, 9), 2, 1, b"x")),
                POP.to_vec(),
            ]),
        ),
        (
            "tcp_syn_denied",
            seq(&[
                arp.clone(),
                frame(&tcp_syn(GATEWAY_IP, 1000, 22)),
                POP.to_vec(),
            ]),
        ),
        (
            "tcp_syn_port9",
            seq(&[
                arp.clone(),
                frame(&tcp_syn(GATEWAY_IP, 1001, 9)),
                POLL.to_vec(),
                advance(2),
                POP.to_vec(),
            ]),
        ),
        (
            "tcp_syn_public",
            seq(&[
                arp.clone(),
                frame(&tcp_syn(public, 1002, 443)),
                POP.to_vec(),
            ]),
        ),
        (
            "tcp_ack_unknown",
            seq(&[
                arp.clone(),
                frame(&tcp_segment(
                    GATEWAY_IP,
                    1003,
                    9,
                    TcpControl::None,
                    5,
                    Some(77),
                    b"data",
                )),
                POP.to_vec(),
            ]),
        ),
        (
            "tcp_dns_syn",
            seq(&[
                arp.clone(),
                frame(&tcp_syn(DNS_IP, 1004, 53)),
                POLL.to_vec(),
                POP.to_vec(),
                frame(&tcp_segment(
                    DNS_IP,
                    1004,
                    53,
                    TcpControl::None,
                    1001,
                    Some(1),
                    b"\x00\x05hello",
                )),
                advance(10),
                POP.to_vec(),
            ]),
        ),
        (
            "udp_dns_query",
            seq(&[
                arp.clone(),
                frame(&udp(DNS_IP, 5353, 53, &query)),
                POLL.to_vec(),
                advance(40),
                advance(40),
                advance(40),
                POP.to_vec(),
            ]),
        ),
        (
            "udp_dns_garbage",
            seq(&[
                frame(&udp(DNS_IP, 5354, 53, b"\x12\x34\x01\x00\x00\x01garbage")),
                POP.to_vec(),
            ]),
        ),
        (
            "udp_gateway_9",
            seq(&[
                frame(&udp(GATEWAY_IP, 4000, 9, b"hi")),
                POLL.to_vec(),
                advance(1),
                POP.to_vec(),
            ]),
        ),
        (
            "udp_denied",
            seq(&[frame(&udp(public, 4001, 123, b"ntp")), POP.to_vec()]),
        ),
        (
            "udp_broadcast",
            seq(&[
                frame(&udp(Ipv4Addr::BROADCAST, 68, 67, b"dhcp")),
                POP.to_vec(),
            ]),
        ),
        (
            "malformed",
            seq(&[
                frame(&[]),
                frame(&[0xff; 7]),
                frame(&good[..30]),
                frame(&wrong_mac),
                frame(&bad_sum),
                frame(&vec![0u8; 1600]),
            ]),
        ),
        (
            "time_only",
            seq(&[advance(255), POLL.to_vec(), POP.to_vec()]),
        ),
    ];
    let dir = corpus();
    std::fs::create_dir_all(&dir).unwrap();
    for (name, data) in seeds {
        std::fs::write(dir.join(name), data).unwrap();
    }
}
