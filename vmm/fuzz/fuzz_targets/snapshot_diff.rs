//! Fuzzes the memory diff of a layered snapshot (`voidbox_vmm::persist::format::diff`):
//! parsing and verifying an untrusted diff file must never panic, and whatever it accepts
//! must be safe to map (runs in order, inside one RAM region each, data page-aligned and
//! within the file). Byte 0 bit 7 set instead turns the rest into memory-file page indices
//! (u16 LE each, sorted and deduplicated) for the run coalescing, whose runs must pass the
//! same checks and cover every page. `gen_diff_corpus.py` writes the seeds.
#![no_main]

use libfuzzer_sys::fuzz_target;
use voidbox_vmm::persist::format::diff::{check_runs, coalesce, decode_diff};
use voidbox_vmm::persist::format::PAGE_SIZE;

const PAGE: u64 = PAGE_SIZE as u64;

fuzz_target!(|data: &[u8]| {
    if data.first().is_some_and(|f| f & 0x80 != 0) {
        let max_runs = usize::from(data[0] & 0x7f) + 1;
        let mut pages: Vec<u64> = data[1..]
            .chunks_exact(2)
            .map(|c| u64::from(u16::from_le_bytes([c[0], c[1]])))
            .collect();
        pages.sort_unstable();
        pages.dedup();
        let size = 1u64 << 28; // 64 Ki pages: every u16 index is in range
        let runs = coalesce(&pages, size, max_runs).expect("sorted in-range pages coalesce");
        assert!(runs.len() <= max_runs);
        check_runs(&runs, size).expect("coalesced runs are valid");
        for p in pages {
            assert!(runs.iter().any(|r| (r.page..r.page + r.pages).contains(&p)));
        }
        return;
    }
    let Ok(diff) = decode_diff(data) else { return };
    let h = &diff.header;
    assert_eq!(diff.data_offset % PAGE, 0);
    assert_eq!(diff.data_offset + h.data_len, data.len() as u64);
    let pages = check_runs(&h.runs, h.base.memory_size).expect("accepted runs are valid");
    assert_eq!(pages * PAGE, h.data_len);
    let mut end = diff.data_offset;
    for (mem_off, len, file_off) in diff.extents() {
        assert!(mem_off + len <= h.base.memory_size);
        assert_eq!(file_off, end);
        end += len;
    }
    assert_eq!(end, data.len() as u64);
});
