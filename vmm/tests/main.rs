//! The VMM's integration tests: one test binary with a module per area. Run one area with
//! `cargo test --release -p voidbox-vmm --test vmm -- vm_process::`.

mod fuzz_corpus;
mod p9_fuzz_corpus;
mod vm_process;
