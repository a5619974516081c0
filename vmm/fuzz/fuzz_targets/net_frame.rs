//! Fuzzes virtio-net descriptor and frame handling: both queues of the device over a small
//! guest memory (rings, descriptors, headers and frames all from the input), transmitted
//! frames looped back into the receive queue. Input format: see `fuzz_frames`
//! (`gen_net_corpus.py` writes the seeds).
#![no_main]

use libfuzzer_sys::fuzz_target;
use voidbox_vmm::devices::net::frame::NET_HDR_LEN;
use voidbox_vmm::devices::net::fuzz::{fuzz_frames, FUZZ_RX_QUEUE};
use voidbox_vmm::devices::net::{ETH_HLEN, MAX_FRAME_LEN};

fuzz_target!(|data: &[u8]| {
    if let Some(r) = fuzz_frames(data) {
        // Only frames of a legal size ever reach the NAT.
        for f in &r.tx_frames {
            assert!((ETH_HLEN..=MAX_FRAME_LEN).contains(&f.len()), "{}", f.len());
        }
        assert_eq!(r.stats.tx_frames, r.tx_frames.len() as u64);
        // A used receive buffer holds a header and a whole frame, or nothing.
        for &(head, len) in &r.rx_used {
            assert!(head < FUZZ_RX_QUEUE.0, "{head}");
            let len = len as usize;
            assert!(
                len == 0 || (NET_HDR_LEN + ETH_HLEN..=NET_HDR_LEN + MAX_FRAME_LEN).contains(&len),
                "{len}"
            );
        }
    }
});
