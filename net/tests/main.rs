//! The NAT's integration tests: one test binary with a module per area, over the shared
//! smoltcp "guest" harness (`common`). Run one area with
//! `cargo test --release -p voidbox-net --test net -- dns::`.

mod common;

mod dns;
mod egress;
mod frames;
mod fuzz_corpus;
mod inbound;
mod services;
mod tcp;
