#!/usr/bin/env python3
"""Writes the seed corpus of the `p9_message` fuzz target (corpus/p9_message/).

Entry format (see voidbox_vmm::devices::p9::fuzz::fuzz_messages): byte 0 = flags (bit 0: the
share is read-only, bit 1: the slot is unbound), then requests, each `len[2 LE]` + a 9P2000.L
message. The share holds `file`, `sub/inner` and a symlink `out -> ../outside`. Run from
anywhere: `python3 vmm/fuzz/gen_p9_corpus.py`.
"""
import os
import struct

TVERSION, TATTACH, TWALK, TLOPEN, TLCREATE, TREAD, TWRITE = 100, 104, 110, 12, 14, 116, 118
TMKDIR, TRENAMEAT, TUNLINKAT, TSETATTR, TCLUNK, TREADDIR = 72, 74, 76, 26, 120, 40
TSYMLINK, TLINK, TREADLINK, TGETATTR, TXATTRCREATE = 16, 70, 22, 24, 32
NOFID = 0xFFFFFFFF


def s(text):
    b = text.encode() if isinstance(text, str) else text
    return struct.pack("<H", len(b)) + b


def msg(ty, body, tag=1):
    return struct.pack("<IBH", 7 + len(body), ty, tag) + body


def version(msize=8192):
    return msg(TVERSION, struct.pack("<I", msize) + s("9P2000.L"))


def attach(fid=0):
    return msg(TATTACH, struct.pack("<II", fid, NOFID) + s("u") + s("") + struct.pack("<I", 1000))


def walk(fid, newfid, *names):
    return msg(TWALK, struct.pack("<IIH", fid, newfid, len(names)) + b"".join(s(n) for n in names))


def lopen(fid, flags):
    return msg(TLOPEN, struct.pack("<II", fid, flags))


def lcreate(fid, name, flags=2):
    return msg(TLCREATE, struct.pack("<I", fid) + s(name) + struct.pack("<III", flags, 0o644, 0))


def read(fid, off, count):
    return msg(TREAD, struct.pack("<IQI", fid, off, count))


def readdir(fid, off, count):
    return msg(TREADDIR, struct.pack("<IQI", fid, off, count))


def write(fid, off, data):
    return msg(TWRITE, struct.pack("<IQI", fid, off, len(data)) + data)


def mkdir(fid, name):
    return msg(TMKDIR, struct.pack("<I", fid) + s(name) + struct.pack("<II", 0o755, 0))


def renameat(od, old, nd, new):
    return msg(TRENAMEAT, struct.pack("<I", od) + s(old) + struct.pack("<I", nd) + s(new))


def unlinkat(fid, name):
    return msg(TUNLINKAT, struct.pack("<I", fid) + s(name) + struct.pack("<I", 0))


def setattr(fid, valid, mode=0, uid=0, gid=0, size=0):
    return msg(TSETATTR, struct.pack("<IIIIIQQQQQ", fid, valid, mode, uid, gid, size, 0, 0, 0, 0))


def clunk(fid):
    return msg(TCLUNK, struct.pack("<I", fid))


def entry(flags, *msgs):
    return bytes([flags]) + b"".join(struct.pack("<H", len(m)) + m for m in msgs)


START = (version(), attach())
SEEDS = {
    "read_file": entry(1, *START, walk(0, 1, "file"), lopen(1, 0), read(1, 0, 4096)),
    "list_dir": entry(1, *START, walk(0, 1, "sub"), lopen(1, 0o200000), readdir(1, 0, 4096)),
    "dotdot_walk": entry(0, *START, walk(0, 1, ".."), walk(0, 2, "sub", "..", "..")),
    "slash_names": entry(0, *START, walk(0, 1, "../outside"), lcreate(0, "/tmp/x"),
                         mkdir(0, "a/b"), renameat(0, "file", 0, "../stolen")),
    "symlink_out": entry(0, *START, walk(0, 1, "out", "secret"), walk(0, 2, "out"),
                         lopen(2, 0), msg(TREADLINK, struct.pack("<I", 2)),
                         walk(2, 3, "secret")),
    "create_write": entry(0, *START, walk(0, 1), lcreate(1, "new"), write(1, 0, b"data"),
                          clunk(1), mkdir(0, "d"), walk(0, 2, "d"),
                          renameat(0, "new", 2, "moved"), unlinkat(2, "moved")),
    "ro_refusals": entry(1, *START, walk(0, 1, "file"), lcreate(0, "x"), mkdir(0, "d"),
                         lopen(1, 2), lopen(1, 0o1000), write(1, 0, b"x"),
                         setattr(1, 8, size=0), unlinkat(0, "file"),
                         renameat(0, "file", 0, "y"),
                         msg(TSYMLINK, struct.pack("<I", 0) + s("l") + s("/etc") + b"\0\0\0\0"),
                         msg(TLINK, struct.pack("<II", 0, 1) + s("h")),
                         msg(TXATTRCREATE, struct.pack("<I", 1) + s("user.a") + struct.pack("<QI", 1, 0))),
    "chown": entry(0, *START, walk(0, 1, "file"), setattr(1, 2, uid=0),
                   setattr(1, 6, 0, 1000, 1000), setattr(1, 0x40)),
    "unbound": entry(2, *START, walk(0, 1), lopen(0, 0), msg(108, struct.pack("<H", 1))),
    "msize": entry(0, version(1 << 30), version(100), version(512000), attach()),
    "short_and_bad": entry(0, b"\x01\x02", struct.pack("<IBH", 1000, TWALK, 3),
                           msg(TWALK, struct.pack("<IIH", 0, 1, 60) + s("x")),
                           msg(255, b"junk"), msg(TGETATTR, b"")),
    "big_read": entry(0, *START, walk(0, 1, "file"), lopen(1, 0), read(1, 0, 0xFFFFFFFF)),
    "fid_reuse": entry(0, *START, walk(0, 0, "sub"), walk(0, 0, "inner"), clunk(0), clunk(0),
                       attach(0), attach(0)),
}


def main():
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "p9_message")
    os.makedirs(out, exist_ok=True)
    for name, data in SEEDS.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
    print(f"{len(SEEDS)} seeds in {out}")


if __name__ == "__main__":
    main()
