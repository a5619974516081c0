#!/usr/bin/env python3
"""Reads the console log of a `TCG_L1_BENCH` session of scripts/tcg-l1.sh and prints the cold
boot comparison as Markdown: per VMM, the phases of every boot (median, min-max) and the
ratios against Firecracker, per round (the runs are interleaved) and of the medians.

Phases, from the lines boot-timer timestamped on the host (ms since the VMM process was
started) and the guest agent's boot marks (printed with `voidbox.debug=1`):
  total        process start -> the agent's `boot: listening` line reached the host
  pre-kernel   process start -> the vCPUs run the kernel: voidbox's `booting` status event
               (its own clock), Firecracker's "Successfully started microvm" line (arrival)
  guest        the rest: kernel boot, devices, root mounted, init, the agent listening
  agent        of which `agent started` -> `listening` (PID 1's mounts, network, vsock
               listener; both marks on the guest's clock, so exact)
The guest's uptime is not used across VMMs: the kernel re-bases its clock during boot
("sched_clock: Marking stable"), by amounts that differ between VMMs.
For voidbox, the VMM's own status events split the pre-kernel phase further: process start ->
config read (`started`), KVM + memory + devices + kernel load (`configured`), vCPUs released
(`booting`, after seccomp).

Exit status 1 when any boot did not reach `listening`.
"""

import json
import re
import statistics
import sys

BOOT_MARK = re.compile(r"boot: (agent started|listening) at ([0-9.]+) s")


def parse(path):
    runs = []  # (vmm, round, rc, {phase: ms})
    cur = None
    for raw in open(path, errors="replace"):
        line = raw.rstrip("\r\n")
        m = re.match(r"^BENCH (\S+) (\d+) rc=(\d+)", line)
        if m:
            cur = {"vmm": m.group(1), "round": int(m.group(2)), "rc": int(m.group(3)), "marks": {}, "events": {}}
            runs.append(cur)
            continue
        if cur is None or not line.startswith("T "):
            continue
        parts = line.split(" ", 3)
        if len(parts) < 3:
            continue
        try:
            at = float(parts[1])
        except ValueError:
            continue
        if parts[2] == "UNTIL":
            cur["until"] = at
            continue
        text = parts[3] if len(parts) > 3 else ""
        for step, up in BOOT_MARK.findall(text):
            cur["marks"][step] = float(up) * 1e3
            if step == "listening":
                cur["listening_at"] = at
        if "Successfully started microvm" in text:
            cur["events"]["running"] = at
        if parts[2] == "o" and text.startswith("{"):
            try:
                ev = json.loads(text)
            except ValueError:
                continue
            if ev.get("event") == "started":
                cur["events"]["started"] = at
            elif ev.get("event") == "configured":
                cur["events"]["setup"] = ev.get("setup_us", 0) / 1e3
            elif ev.get("event") == "booting":
                cur["events"]["booting"] = float(ev.get("ms", 0))
                cur["events"]["running"] = float(ev.get("ms", 0))
    return runs


def phases(run):
    if run["rc"] != 0 or "listening_at" not in run or len(run["marks"]) < 2:
        return None
    if "running" not in run["events"]:
        return None
    total = run["listening_at"]
    running = run["events"]["running"]
    p = {
        "total": total,
        "pre-kernel": running,
        "guest": total - running,
        "agent": run["marks"]["listening"] - run["marks"]["agent started"],
    }
    p.update({f"vmm {k}": v for k, v in run["events"].items() if k != "running"})
    return p


def fmt(values):
    if not values:
        return "–"
    return f"{statistics.median(values):.0f} ({min(values):.0f}–{max(values):.0f})"


def main():
    runs = parse(sys.argv[1])
    if not runs:
        print("boot-compare: no BENCH runs in the log", file=sys.stderr)
        return 1
    failed = [r for r in runs if phases(r) is None]
    by_vmm = {}
    for r in runs:
        p = phases(r)
        if p is not None:
            by_vmm.setdefault(r["vmm"], []).append((r["round"], p))
    order = [v for v in ("voidbox", "voidbox-before", "firecracker") if v in by_vmm]
    order += [v for v in by_vmm if v not in order]
    cols = ["pre-kernel", "guest", "agent", "total"]
    print("| VMM | boots | process start → vCPUs run the kernel (ms) | kernel → agent listening (ms) | … of which init → listening (ms) | total (ms) |")
    print("|---|---:|---:|---:|---:|---:|")
    for v in order:
        ps = [p for _, p in by_vmm[v]]
        print(f"| {v} | {len(ps)} | " + " | ".join(fmt([p[c] for p in ps]) for c in cols) + " |")
    vmm_cols = ["vmm started", "vmm setup", "vmm booting"]
    if any(c in p for v in order for _, p in by_vmm[v] for c in vmm_cols):
        print()
        print("| VMM (its own status events) | process start → config read (ms) | KVM, memory, devices, kernel load (ms) | process start → vCPUs released (ms) |")
        print("|---|---:|---:|---:|")
        for v in order:
            ps = [p for _, p in by_vmm[v] if "vmm booting" in p]
            if ps:
                print(f"| {v} | " + " | ".join(fmt([p[c] for p in ps if c in p]) for c in vmm_cols) + " |")
    if "firecracker" in by_vmm:
        fc = dict(by_vmm["firecracker"])
        fc_med = statistics.median(p["total"] for p in fc.values())
        print()
        print("| ratio to Firecracker (total) | median of per-round ratios | ratio of medians |")
        print("|---|---:|---:|")
        for v in order:
            if v == "firecracker":
                continue
            pairs = [p["total"] / fc[r]["total"] for r, p in by_vmm[v] if r in fc]
            med = statistics.median(p["total"] for _, p in by_vmm[v])
            if pairs:
                print(f"| {v} | {statistics.median(pairs):.2f} ({min(pairs):.2f}–{max(pairs):.2f}) | {med / fc_med:.2f} |")
    if failed:
        for r in failed:
            print(f"boot-compare: {r['vmm']} round {r['round']} did not reach `listening` (rc {r['rc']})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
