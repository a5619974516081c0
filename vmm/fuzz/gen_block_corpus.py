#!/usr/bin/env python3
"""Writes the seed corpus of the `block_request` fuzz target (corpus/block_request/).

Entry format (see voidbox_vmm::devices::block::fuzz::fuzz_requests): byte 0 = flags (bit 0: the
disk is read-only), then guest memory from address 0 (64 KiB at most). The request queue has
16 entries: descriptor table at 0x0, available ring at 0x100, used ring at 0x200. The disk has
64 sectors. Run from anywhere: `python3 vmm/fuzz/gen_block_corpus.py`.
"""
import os
import struct

SIZE, DESC, AVAIL, USED = 16, 0x0, 0x100, 0x200
F_NEXT, F_WRITE = 1, 2
IN, OUT, FLUSH, GET_ID = 0, 1, 4, 8


class Image:
    def __init__(self, read_only=False):
        self.flags = 1 if read_only else 0
        self.mem = bytearray(0x2000)
        self.heads = []

    def put(self, addr, data):
        end = addr + len(data)
        if end > len(self.mem):
            self.mem.extend(bytes(end - len(self.mem)))
        self.mem[addr:end] = data

    def desc(self, i, addr, length, flags, nxt=0):
        self.put(DESC + 16 * i, struct.pack("<QIHH", addr, length, flags, nxt))

    def header(self, addr, kind, sector):
        self.put(addr, struct.pack("<IIQ", kind, 0, sector))

    def chain(self, first, bufs):
        """bufs: (addr, len, writable); uses descriptors first, first+1, ..."""
        for k, (addr, length, w) in enumerate(bufs):
            last = k == len(bufs) - 1
            flags = (0 if last else F_NEXT) | (F_WRITE if w else 0)
            self.desc(first + k, addr, length, flags, (first + k + 1) % SIZE)
        self.heads.append(first)

    def bytes(self, avail_idx=None):
        idx = len(self.heads) if avail_idx is None else avail_idx
        ring = b"".join(struct.pack("<H", h) for h in self.heads)
        self.put(AVAIL, struct.pack("<HH", 0, idx) + ring)
        # Memory past the image is zero: trailing zeros are left out.
        return bytes([self.flags]) + bytes(self.mem).rstrip(b"\0")


def request(kind, sector, data, read_only=False, data_writable=None, status_writable=True):
    """One request: header at 0x400, data buffers from 0x1000, status at 0x800."""
    img = Image(read_only)
    img.header(0x400, kind, sector)
    w = kind != OUT if data_writable is None else data_writable
    bufs = [(0x400, 16, False)]
    addr = 0x1000
    for length, fill in data:
        if fill is not None:
            img.put(addr, bytes([fill]) * length)
        bufs.append((addr, length, w))
        addr += max(length, 0x200)
    bufs.append((0x800, 1, status_writable))
    img.chain(0, bufs)
    return img


def seeds():
    s = {}
    s["in_valid"] = request(IN, 2, [(512, None), (512, None)]).bytes()
    s["out_valid"] = request(OUT, 4, [(512, 0xAB)]).bytes()
    s["flush"] = request(FLUSH, 0, []).bytes()
    s["get_id"] = request(GET_ID, 0, [(20, None)]).bytes()
    s["unsupported_type"] = request(11, 0, []).bytes()
    s["out_of_range_sector"] = request(IN, 64, [(512, None)]).bytes()
    s["range_crosses_end"] = request(IN, 63, [(1024, None)]).bytes()
    s["overflowing_sector"] = request(IN, 2**64 - 1, [(512, None)]).bytes()
    s["overflowing_sector_bytes"] = request(OUT, 2**55, [(512, 1)]).bytes()
    s["unaligned_length"] = request(IN, 0, [(100, None)]).bytes()
    s["zero_length_data"] = request(IN, 1, [(0, None)]).bytes()
    s["write_to_ro"] = request(OUT, 0, [(512, 0xCD)], read_only=True).bytes()
    s["status_read_only"] = request(IN, 0, [(512, None)], status_writable=False).bytes()
    s["huge_length"] = request(IN, 0, [(0xFFFFFFFF, None)]).bytes()

    img = Image()
    img.header(0x400, IN, 0)
    img.desc(0, 0x400, 16, F_NEXT, 0)  # points at itself
    img.heads.append(0)
    s["self_loop"] = img.bytes()

    img = Image()
    img.header(0x400, IN, 0)
    for i in range(SIZE):  # 0 -> 1 -> ... -> 15 -> 0: longer than the queue
        img.desc(i, 0x400 if i == 0 else 0x1000, 16 if i == 0 else 512, F_NEXT | (F_WRITE if i else 0), (i + 1) % SIZE)
    img.heads.append(0)
    s["chain_longer_than_queue"] = img.bytes()

    img = Image()
    img.header(0x400, IN, 0)
    img.desc(0, 0x400, 16, F_NEXT, 40)  # next beyond the table
    img.heads.append(0)
    s["next_out_of_table"] = img.bytes()

    img = Image()
    img.desc(0, 0x1000, 0, 0)
    img.heads.append(0)
    s["zero_length_only"] = img.bytes()

    img = request(IN, 0, [(512, None)])
    s["avail_index_jump"] = img.bytes(avail_idx=0xFFFF)

    img = Image()
    img.header(0x400, IN, 0)
    img.chain(0, [(0x400, 16, False), (0x1000, 512, True), (0x2_0000, 1, True)])
    s["status_outside_memory"] = img.bytes()

    # Three requests in one notification: a write, a read of it, a flush.
    img = Image()
    img.header(0x400, OUT, 5)
    img.put(0x1000, b"\x5a" * 512)
    img.chain(0, [(0x400, 16, False), (0x1000, 512, False), (0x800, 1, True)])
    img.header(0x440, IN, 5)
    img.chain(3, [(0x440, 16, False), (0x1400, 512, True), (0x801, 1, True)])
    img.header(0x480, FLUSH, 0)
    img.chain(6, [(0x480, 16, False), (0x802, 1, True)])
    s["write_read_flush"] = img.bytes()

    # Header and data in one descriptor, data and status in one (any layout).
    img = Image()
    img.header(0x400, IN, 3)
    img.chain(0, [(0x400, 16, False), (0x1000, 513, True)])
    s["in_any_layout"] = img.bytes()
    return s


def main():
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "block_request")
    os.makedirs(out, exist_ok=True)
    for name, data in seeds().items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
