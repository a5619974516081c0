//! The voidbox host ⇄ guest wire protocol (frame codec, message types, limits, handshake).
//!
//! Implemented by issue #3; this crate is the shared contract of the host engine and the guest agent.
