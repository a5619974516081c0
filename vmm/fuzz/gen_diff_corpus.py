#!/usr/bin/env python3
"""Writes the seed corpus of the `snapshot_diff` fuzz target (corpus/snapshot_diff/).

Valid memory diffs (see voidbox_vmm::persist::format::diff): `VBXDIFF\\0`, version (u32 LE),
header length (u32 LE), the JSON header, SHA-256 of all that, zero padding to a page
boundary, the runs' pages. Plus coalescing inputs (byte 0 bit 7 set: max runs - 1 in the low
bits, then u16 LE page indices). Run from anywhere: `python3 vmm/fuzz/gen_diff_corpus.py`.
"""
import hashlib
import json
import os
import struct

PAGE = 4096
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "snapshot_diff")


def diff(runs, memory_size=1 << 20, fill=0x11):
    pages = sum(n for _, n in runs)
    data = bytes([fill]) * (pages * PAGE)
    header = json.dumps(
        {
            "base": {"memory_size": memory_size, "memory_sha256": "a" * 64, "state_sha256": "b" * 64},
            "runs": [{"page": p, "pages": n} for p, n in runs],
            "data_len": len(data),
            "data_sha256": hashlib.sha256(data).hexdigest(),
        },
        separators=(",", ":"),
    ).encode()
    head = b"VBXDIFF\0" + struct.pack("<II", 1, len(header)) + header
    head += hashlib.sha256(head).digest()
    head += bytes(-len(head) % PAGE)
    return head + data


def main():
    os.makedirs(OUT, exist_ok=True)
    seeds = {
        "empty": diff([]),
        "one_page": diff([(0, 1)]),
        "runs": diff([(1, 2), (9, 1), (255, 1)]),
        "two_regions": diff([((3 << 30) // PAGE - 1, 1), ((3 << 30) // PAGE, 2)], memory_size=4 << 30),
        "coalesce": bytes([0x80 | 3]) + b"".join(struct.pack("<H", p) for p in [1, 2, 3, 9, 40, 41, 500, 9000]),
    }
    for name, data in seeds.items():
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
