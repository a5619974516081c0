//! Fuzzes the vsock packet parser: the flat header/length validation, and the whole TX/RX
//! queue path over guest memory (rings, descriptors, buffers) built from the input.
#![no_main]

use libfuzzer_sys::fuzz_target;
use voidbox_vmm::devices::vsock::{fuzz_queues, packet::parse_packet};

fuzz_target!(|data: &[u8]| {
    if let Ok((hdr, payload)) = parse_packet(data) {
        assert!(payload.len() <= voidbox_vmm::devices::vsock::packet::MAX_PKT_PAYLOAD);
        assert_eq!(payload.len() as u32, hdr.payload_len());
    }
    fuzz_queues(data);
});
