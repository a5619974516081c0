//! Fuzzing entry point shared by `net/fuzz` (cargo-fuzz target `nat_frames`) and the seed
//! corpus replayed by `cargo test` (`net/tests/fuzz_corpus.rs`).
//!
//! The input is a sequence of records: a tag byte, then
//! - `0`: a frame, a little-endian `u16` length (taken modulo 2048) and that many bytes (fewer
//!   at the end of the input), handed to [`Nat::from_guest`];
//! - `1`: one byte `n`, the clock advances `n × 40` ms, then [`Nat::poll`];
//! - `2`: one byte `n`, up to `n` frames popped with [`Nat::to_guest`];
//! - anything else: [`Nat::poll`].
//!
//! The NAT's policy allows host port 9 only and denies every other address, and its DNS
//! upstream is `127.0.0.1:9`, so nothing leaves the host.

use std::time::{Duration, Instant};

use crate::{Nat, NatConfig, NatStats, NetworkPolicy, MTU};

/// What a run did.
#[derive(Debug, Clone)]
pub struct FuzzReport {
    /// Frames the NAT sent toward the guest.
    pub frames_out: Vec<Vec<u8>>,
    /// The NAT's counters at the end.
    pub stats: NatStats,
    /// Denials at the end.
    pub denials: Vec<crate::Denial>,
}

/// The NAT config of fuzz runs.
pub fn fuzz_config() -> NatConfig {
    NatConfig {
        policy: NetworkPolicy {
            allow_host_ports: vec![9],
            deny: vec![
                ipnet::IpNet::V4(ipnet::Ipv4Net::default()),
                ipnet::IpNet::V6(ipnet::Ipv6Net::default()),
            ],
            ..NetworkPolicy::default()
        },
        dns_upstreams: vec![std::net::SocketAddr::from(([127, 0, 0, 1], 9))],
        guest_mac: crate::DEFAULT_GUEST_MAC,
        publish: Vec::new(),
        publish_unix: Vec::new(),
        services: Vec::new(),
    }
}

/// Runs one input (see the module doc). Panics if the NAT broke an invariant: a frame toward
/// the guest shorter than 14 or longer than `MTU + 14` bytes, or sent to another MAC than the
/// guest's or broadcast.
pub fn nat_frames(data: &[u8]) -> FuzzReport {
    let Ok(mut nat) = Nat::new(fuzz_config()) else {
        panic!("fuzz NAT config rejected");
    };
    let start = Instant::now();
    let mut now = start;
    let mut out = Vec::new();
    let mut rest = data;
    let pop = |nat: &mut Nat, now: Instant, n: usize, out: &mut Vec<Vec<u8>>| {
        for _ in 0..n {
            let Some(f) = nat.to_guest(now) else { break };
            check_frame(&f);
            out.push(f);
        }
    };
    while let [tag, tail @ ..] = rest {
        rest = tail;
        match tag {
            0 => {
                let (len, tail) = match rest {
                    [a, b, tail @ ..] => (usize::from(u16::from_le_bytes([*a, *b])) % 2048, tail),
                    _ => (rest.len(), &[][..]),
                };
                let n = len.min(tail.len());
                nat.from_guest(&tail[..n], now);
                rest = &tail[n..];
            }
            1 => {
                let n = rest.first().copied().unwrap_or(0);
                rest = rest.get(1..).unwrap_or(&[]);
                now += Duration::from_millis(u64::from(n) * 40);
                nat.poll(now);
            }
            2 => {
                let n = rest.first().copied().unwrap_or(0);
                rest = rest.get(1..).unwrap_or(&[]);
                pop(&mut nat, now, usize::from(n), &mut out);
            }
            _ => nat.poll(now),
        }
        let mut fds = Vec::new();
        nat.poll_fds(&mut fds);
        let _ = nat.poll_timeout(now);
    }
    nat.poll(now);
    pop(&mut nat, now, usize::MAX, &mut out);
    FuzzReport {
        frames_out: out,
        stats: nat.stats(),
        denials: nat.denials(),
    }
}

fn check_frame(f: &[u8]) {
    assert!(
        f.len() >= 14 && f.len() <= MTU + 14,
        "frame of {} bytes",
        f.len()
    );
    let dst = &f[..6];
    assert!(
        dst == crate::DEFAULT_GUEST_MAC || dst == [0xff; 6],
        "frame to {dst:02x?}"
    );
}
