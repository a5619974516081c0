"""Prints THIRD-PARTY.md for the release bundle: every crate linked into the shipped binaries
(`voidbox` and `voidbox-guest-agent`: normal dependencies, transitively, for x86_64 Linux)
with its version and license, read from `cargo metadata` on stdin."""
import json
import sys

m = json.load(sys.stdin)
workspace = set(m["workspace_members"])
nodes = {n["id"]: n for n in m["resolve"]["nodes"]}
todo = [p["id"] for p in m["packages"] if p["name"] in ("voidbox", "voidbox-guest-agent")]
seen = set()
while todo:
    i = todo.pop()
    if i in seen:
        continue
    seen.add(i)
    for d in nodes[i]["deps"]:
        if any(k["kind"] is None for k in d["dep_kinds"]):
            todo.append(d["pkg"])
pkgs = sorted(
    (p for p in m["packages"] if p["id"] in seen and p["id"] not in workspace),
    key=lambda p: (p["name"], p["version"]),
)
print("# Third-party software in voidbox\n")
print("The guest images contain Linux (Debian's linux-source-6.1) and BusyBox (Debian's")
print("busybox-static), both under the GNU GPL version 2 (licenses/GPL-2); their sources are")
print("Debian's packages of the versions each image's manifest.json records.\n")
print("The binaries link these Rust crates:\n")
print("| crate | version | license |")
print("|---|---|---|")
for p in pkgs:
    lic = p["license"] or p.get("license_file") or "see the crate"
    print(f"| {p['name']} | {p['version']} | {lic} |")
