#!/usr/bin/env python3
"""Writes the seed corpus of the `net_frame` fuzz target (corpus/net_frame/).

Entry format (see voidbox_vmm::devices::net::fuzz::fuzz_frames): byte 0 = flags (bit 0: also
deliver a frame of the largest size (MTU 65520 + 14), bit 1: also deliver an over-long
frame), then guest memory from address 0 (256 KiB at most). Two 16-entry queues: receive (descriptors 0x0, available ring
0x100, used ring 0x200) and transmit (0x400, 0x500, 0x600). Transmitted frames are looped
back into receive buffers. Run from anywhere: `python3 vmm/fuzz/gen_net_corpus.py`.
"""
import os
import struct

SIZE = 16
RX = (0x0, 0x100, 0x200)
TX = (0x400, 0x500, 0x600)
F_NEXT, F_WRITE = 1, 2
HDR = 12
MAX_FRAME = 65520 + 14
F_NEEDS_CSUM = 1


def frame(length, fill):
    """An Ethernet frame: gateway MAC, guest MAC, IPv4 ethertype, then `fill` bytes."""
    head = bytes([0x52, 0x55, 0x0A, 0x00, 0x02, 0x02, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x08, 0x00])
    return (head + bytes([fill]) * length)[:length]


class Image:
    def __init__(self, flags=0):
        self.flags = flags
        self.mem = bytearray(0x1000)
        self.heads = {RX: [], TX: []}
        self.next_desc = {RX: 0, TX: 0}
        self.next_buf = 0x1000

    def put(self, addr, data):
        end = addr + len(data)
        if end > len(self.mem):
            self.mem.extend(bytes(end - len(self.mem)))
        self.mem[addr:end] = data

    def desc(self, q, i, addr, length, flags, nxt=0):
        self.put(q[0] + 16 * i, struct.pack("<QIHH", addr, length, flags, nxt))

    def buf(self, data=b"", length=None):
        addr = self.next_buf
        length = len(data) if length is None else length
        self.put(addr, data)
        self.next_buf += (max(length, 1) + 0xFFF) & ~0xFFF
        return addr

    def chain(self, q, bufs):
        """bufs: (addr, len, writable); uses the next descriptors of queue q."""
        first = self.next_desc[q]
        for k, (addr, length, w) in enumerate(bufs):
            last = k == len(bufs) - 1
            flags = (0 if last else F_NEXT) | (F_WRITE if w else 0)
            self.desc(q, first + k, addr, length, flags, (first + k + 1) % SIZE)
        self.next_desc[q] = first + len(bufs)
        self.heads[q].append(first)

    def transmit(self, data, pieces=None, hdr=bytes(HDR)):
        """Header + data as one descriptor, or split at the offsets in `pieces`."""
        raw = hdr + data
        cuts = [0] + (pieces or []) + [len(raw)]
        bufs = []
        for a, b in zip(cuts, cuts[1:]):
            bufs.append((self.buf(raw[a:b]), b - a, False))
        self.chain(TX, bufs)

    def receive_buffer(self, lengths):
        self.chain(RX, [(self.buf(length=n), n, True) for n in lengths])

    def bytes(self, avail_idx=None):
        for q in (RX, TX):
            heads = self.heads[q]
            idx = len(heads) if avail_idx is None or q not in avail_idx else avail_idx[q]
            ring = b"".join(struct.pack("<H", h) for h in heads)
            self.put(q[1], struct.pack("<HH", 0, idx) + ring)
        # Memory past the image is zero: trailing zeros are left out.
        return bytes([self.flags]) + bytes(self.mem).rstrip(b"\0")


def echo(frame_len, rx_lengths, pieces=None, flags=0):
    img = Image(flags)
    img.transmit(frame(frame_len, 0x42), pieces)
    img.receive_buffer(rx_lengths)
    return img


def seeds():
    s = {}
    s["tx_valid"] = echo(60, [HDR + MAX_FRAME]).bytes()
    s["tx_split"] = echo(300, [10, HDR + MAX_FRAME - 10], pieces=[HDR, HDR + 100]).bytes()
    s["tx_split_mid_header"] = echo(60, [HDR + MAX_FRAME], pieces=[5]).bytes()
    s["tx_max_frame"] = echo(MAX_FRAME, [HDR + MAX_FRAME]).bytes()
    s["tx_min_frame"] = echo(14, [HDR + MAX_FRAME]).bytes()
    s["tx_too_short"] = echo(13, [HDR + MAX_FRAME]).bytes()
    s["tx_too_long"] = echo(MAX_FRAME + 1, [HDR + MAX_FRAME]).bytes()

    img = Image()
    img.transmit(b"")
    s["tx_header_only"] = img.bytes()

    img = Image()
    a = img.buf(bytes(HDR) + frame(60, 1))
    img.chain(TX, [(a, HDR, False), (a + HDR, 60, True)])
    s["tx_writable"] = img.bytes()

    img = Image()
    img.buf(bytes(HDR) + frame(60, 1))
    img.desc(TX, 0, 0x1000, HDR + 60, F_NEXT, 0)  # points at itself
    img.heads[TX].append(0)
    s["tx_self_loop"] = img.bytes()

    img = Image()
    img.desc(TX, 0, 0x1000, 0xFFFFFFFF, 0)
    img.heads[TX].append(0)
    s["tx_huge_length"] = img.bytes()

    img = Image()
    img.desc(TX, 0, 0x1000, HDR + 60, F_NEXT, 40)  # next beyond the table
    img.heads[TX].append(0)
    s["tx_next_out_of_table"] = img.bytes()

    s["tx_avail_jump"] = echo(60, [HDR + MAX_FRAME]).bytes(avail_idx={TX: 0xFFFF})

    img = Image()
    img.transmit(frame(60, 1))
    img.chain(RX, [(img.buf(length=HDR + MAX_FRAME), HDR + MAX_FRAME, False)])
    s["rx_readable"] = img.bytes()

    img = Image()
    img.transmit(frame(60, 1))
    img.desc(RX, 0, 0x8000, HDR + MAX_FRAME, F_NEXT | F_WRITE, 0)
    img.heads[RX].append(0)
    s["rx_self_loop"] = img.bytes()

    img = Image()
    img.transmit(frame(60, 1))
    img.desc(RX, 0, 0x8000, 0xFFFFFFFF, F_WRITE, 0)
    img.heads[RX].append(0)
    s["rx_huge_length"] = img.bytes()

    # Checksum offload: NEEDS_CSUM with the field inside the frame (completed), at its last
    # two bytes, and outside it (dropped).
    for name, (start, offset) in {
        "tx_csum_valid": (34, 16),
        "tx_csum_last_bytes": (34, 24),
        "tx_csum_start_past_end": (60, 0),
        "tx_csum_field_straddles_end": (34, 25),
        "tx_csum_huge_offsets": (0xFFFF, 0xFFFF),
    }.items():
        img = Image()
        hdr = struct.pack("<BBHHHHH", F_NEEDS_CSUM, 0, 0, 0, start, offset, 0)
        img.transmit(frame(60, 0x42), pieces=[5], hdr=hdr)
        img.receive_buffer([HDR + MAX_FRAME])
        s[name] = img.bytes()

    s["rx_too_small"] = echo(60, [40]).bytes()
    s["empty"] = Image().bytes()

    img = Image()
    img.transmit(frame(60, 1))
    s["rx_none_posted"] = img.bytes()

    img = Image()
    for fill in (1, 2, 3):
        img.transmit(frame(60 + fill, fill))
    img.receive_buffer([HDR + MAX_FRAME])
    img.receive_buffer([HDR + MAX_FRAME])
    s["more_frames_than_buffers"] = img.bytes()

    img = Image(flags=1)
    img.receive_buffer([HDR + MAX_FRAME])
    s["deliver_max_frame"] = img.bytes()

    img = Image(flags=2)
    img.receive_buffer([0x4000])
    s["deliver_oversized"] = img.bytes()
    return s


def main():
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "net_frame")
    os.makedirs(out, exist_ok=True)
    for name, data in seeds().items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)


if __name__ == "__main__":
    main()
