//! Fuzzes virtio-blk request handling: descriptor-chain walking, request parsing and
//! processing against a small guest memory (rings, descriptors, headers and buffers all from
//! the input) and an in-memory disk. Input format: see `fuzz_requests`
//! (`gen_block_corpus.py` writes the seeds).
#![no_main]

use libfuzzer_sys::fuzz_target;
use voidbox_vmm::devices::block::fuzz::{fuzz_disk_byte, fuzz_requests, FUZZ_DISK_BYTES};

fuzz_target!(|data: &[u8]| {
    if let Some(report) = fuzz_requests(data) {
        assert_eq!(report.disk.len(), FUZZ_DISK_BYTES);
        // A read-only disk is never written.
        if data.first().is_some_and(|f| f & 1 != 0) {
            assert_eq!(report.stats.writes, 0);
            assert!(report
                .disk
                .iter()
                .enumerate()
                .all(|(i, b)| *b == fuzz_disk_byte(i)));
        }
    }
});
