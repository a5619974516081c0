//! Restore-page parser invariants on arbitrary input. Shared by the cargo-fuzz target
//! `restore_page` and by `tests/fuzz_corpus.rs`, which replays the checked-in corpus.
#![allow(dead_code)]

use voidbox_protocol::restore_page::{self, PageError, Reading, HEADER_LEN, LEN, NONCE_LEN};

/// The nonce the corpus pages are armed with (the first 16 bytes of a seed may override it:
/// see [`split`]).
pub const NONCE: [u8; NONCE_LEN] = [0x5a; NONCE_LEN];

/// Reads `data` as a guest would (with [`NONCE`]) and as the VMM would, asserting the
/// invariants; returns the guest's reading.
pub fn check(data: &[u8]) -> Result<Reading, PageError> {
    let guest = restore_page::read(data, &NONCE);
    let vmm = restore_page::armed_nonce(data);
    // The VMM accepts exactly the well-formed armed pages; the guest agrees on those it armed.
    if let Ok(n) = &vmm {
        assert!(data.len() >= HEADER_LEN);
        if *n == NONCE {
            assert!(matches!(guest, Ok(Reading::Armed)), "{guest:?}");
        } else {
            assert!(matches!(guest, Err(PageError::Nonce)), "{guest:?}");
        }
    }
    match &guest {
        Ok(Reading::Filled(d)) => {
            // A delivered grant re-encodes to exactly the page it came from.
            let armed = restore_page::armed(&NONCE);
            let again = restore_page::fill(&armed, &d.grant, d.unix_time_ns)
                .expect("an accepted grant fits again");
            assert_eq!(&data[..again.len()], &again[..]);
            assert!(again.len() <= LEN);
        }
        Ok(Reading::Armed) => assert!(vmm.is_ok()),
        Err(e) => assert!(!e.to_string().is_empty()),
    }
    guest
}
