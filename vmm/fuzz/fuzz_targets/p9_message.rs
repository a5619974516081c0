//! Fuzzes the share slots' 9P request handling: the filter in front of the `p9` server
//! (names, read-only refusal, ownership, fid tracking, msize and count caps) and the server
//! itself, over a scratch directory with a symlink pointing out of the share. Input format:
//! see `fuzz_messages` (`gen_p9_corpus.py` writes the seeds).
#![no_main]

use libfuzzer_sys::fuzz_target;
use voidbox_vmm::devices::p9::fuzz::fuzz_messages;

fuzz_target!(|data: &[u8]| {
    if let Some(r) = fuzz_messages(data) {
        // Every reply is a whole message for its request, within the room given.
        assert!(r.replies_well_formed, "{r:?}");
        // Nothing beside the share is ever changed; a read-only share is never changed.
        assert!(r.outside_untouched, "{r:?}");
        assert!(r.read_only_untouched, "{r:?}");
    }
});
