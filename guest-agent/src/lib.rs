//! The voidbox guest agent: PID 1 inside every micro-VM.
//!
//! It will own guest init (mounts, reaping), the authenticated vsock server, exec with
//! resource limits and a watchdog, and file RPCs confined to the workspace (issue #3).
