//! Fuzzes the NAT with arbitrary sequences of guest frames, clock steps, polls and pops
//! (format: `voidbox_net::fuzz`): nothing may panic, and every frame toward the guest must be
//! well-formed in size and addressing.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let report = voidbox_net::fuzz::nat_frames(data);
    assert!(report.stats.queued_to_guest as usize <= voidbox_net::TO_GUEST_QUEUE);
});
