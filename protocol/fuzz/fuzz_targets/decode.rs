//! Fuzz the frame/message decoder on arbitrary bytes: `cargo +nightly fuzz run decode`.
#![no_main]

#[path = "harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    harness::check(data);
});
