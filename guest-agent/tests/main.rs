//! The guest agent's integration tests: one test binary with a module per area, each test
//! running the real agent binary as a host process on a Unix socket (no VM needed). Run one
//! area with `cargo test --release -p voidbox-guest-agent --test guest-agent -- rekey::`.

mod common;

mod agent;
mod held;
mod policy;
mod rekey;
mod restore_page;
