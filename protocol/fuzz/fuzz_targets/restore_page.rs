//! Fuzz the restore-page parser (guest and VMM sides) on arbitrary bytes:
//! `cargo +nightly fuzz run restore_page`.
#![no_main]

#[path = "restore_page_harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = harness::check(data);
});
