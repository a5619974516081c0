//! Regenerates the seed corpus of the `restore_page` fuzz target:
//! `cargo run -p voidbox-protocol --example gen_restore_page_corpus [DIR]`
//! (default `protocol/fuzz/corpus/restore_page`). File-name prefixes state the expected
//! outcome for a guest armed with the harness's nonce (`0x5a` × 16): `armed-`, `filled-`,
//! `refused-`, which `tests/fuzz_corpus.rs` checks.

use std::path::PathBuf;

use voidbox_protocol::restore_page::{self, RestoreGrant, LEN};
use voidbox_protocol::{GuestPolicy, SessionSecret, Zeroizing};

const NONCE: [u8; 16] = [0x5a; 16];
const NOW: u64 = 1_764_000_000_000_000_000;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/restore_page")
        });
    std::fs::create_dir_all(&dir)?;
    let armed = restore_page::armed(&NONCE);
    let grant = |policy| {
        RestoreGrant::new(
            SessionSecret::from_bytes([0x11; 32]),
            Zeroizing::new(vec![0x22; 64]),
            policy,
        )
    };
    let policy = GuestPolicy {
        allowlist: Some(vec!["sh".into(), "/usr/bin/python3".into()]),
        max_output_bytes: Some(1 << 20),
        ..GuestPolicy::default()
    };
    let filled = restore_page::fill(&armed, &grant(None)?, NOW)?;
    let filled_policy = restore_page::fill(&armed, &grant(Some(policy))?, NOW)?;
    let mut files: Vec<(String, Vec<u8>)> = vec![
        ("armed-header".into(), armed.to_vec()),
        ("armed-page".into(), pad(&armed)),
        ("filled-no-policy".into(), pad(&filled)),
        ("filled-policy".into(), pad(&filled_policy)),
        ("filled-exact".into(), filled.to_vec()),
        ("refused-empty".into(), Vec::new()),
        ("refused-zero-page".into(), vec![0; LEN]),
        (
            "refused-truncated".into(),
            filled[..filled.len() - 1].to_vec(),
        ),
        (
            "refused-other-nonce".into(),
            pad(&restore_page::armed(&[1; 16])),
        ),
    ];
    for (i, at) in [0usize, 9, 13, 20, 33, 37, 50, 80, 110, 150]
        .into_iter()
        .enumerate()
    {
        let mut p = pad(&filled_policy);
        p[at] ^= 0x10;
        files.push((format!("refused-flipped-{i}"), p));
    }
    for (name, bytes) in &files {
        std::fs::write(dir.join(name), bytes)?;
    }
    println!("wrote {} files to {}", files.len(), dir.display());
    Ok(())
}

fn pad(b: &[u8]) -> Vec<u8> {
    let mut p = vec![0u8; LEN];
    p[..b.len()].copy_from_slice(b);
    p
}
