//! The wire protocol's integration tests: one test binary with a module per area, over the
//! shared proptest strategies and sample messages (`common`). Run one area with
//! `cargo test --release -p voidbox-protocol --test protocol -- roundtrip::`.

mod common;

mod errors;
mod fuzz_corpus;
mod handshake_redaction;
mod roundtrip;
#[cfg(feature = "tokio")]
mod tokio_mux;
