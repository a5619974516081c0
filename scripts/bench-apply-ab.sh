#!/usr/bin/env bash
# Times `voidbox apply SPEC` end to end for two voidbox binaries, interleaved (A B A B …), so
# both see the same host state; prints a Markdown table (min, median, max wall seconds) and
# the ratio of the medians. Each binary uses its own cached guest image and golden snapshots
# (made before the timed runs by one untimed apply each); every timed run's exit status and
# merged output must match the first one's.
#
# Usage: scripts/bench-apply-ab.sh A_BINARY B_BINARY [SPEC] [RUNS]
#   SPEC defaults to examples/fan-out.yaml, RUNS (per binary) to 5.
set -euo pipefail
[ "$#" -ge 2 ] && [ "$#" -le 4 ] || { sed -n '2,9p' "$0" >&2; exit 2; }
a="$(realpath "$1")"
b="$(realpath "$2")"
spec="$(realpath "${3:-$(dirname "$0")/../examples/fan-out.yaml}")"
runs="${4:-5}"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
for bin in "$a" "$b"; do
  "$bin" apply --output json "$spec" >"$out/ref.json" 2>/dev/null ||
    { echo "bench-apply-ab: $bin apply $spec failed" >&2; exit 1; }
done
python3 - "$out/ref.json" >"$out/ref" <<'PY'
import json, sys
print(json.dumps(json.load(open(sys.argv[1]))["output"]))
PY
for i in $(seq "$runs"); do
  for tag in a b; do
    bin="$a"; [ "$tag" = b ] && bin="$b"
    t0=$(date +%s.%N)
    "$bin" apply --output json "$spec" >"$out/run.json" 2>/dev/null
    t1=$(date +%s.%N)
    python3 - "$out/run.json" "$out/ref" <<'PY'
import json, sys
got = json.dumps(json.load(open(sys.argv[1]))["output"])
want = open(sys.argv[2]).read().strip()
assert got == want, f"output {got} != {want}"
PY
    echo "$tag $(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.3f", b-a}')" >>"$out/times"
  done
done
python3 - "$out/times" "$a" "$b" "$spec" <<'PY'
import statistics, sys
times = {"a": [], "b": []}
for line in open(sys.argv[1]):
    tag, t = line.split()
    times[tag].append(float(t))
print(f"`voidbox apply {sys.argv[4]}`, {len(times['a'])} runs each, interleaved")
print()
print("| binary | min (s) | median (s) | max (s) |")
print("|---|---:|---:|---:|")
for tag, path in (("a", sys.argv[2]), ("b", sys.argv[3])):
    v = times[tag]
    print(f"| {tag}: `{path}` | {min(v):.2f} | {statistics.median(v):.2f} | {max(v):.2f} |")
print()
print(f"b / a (medians): {statistics.median(times['b']) / statistics.median(times['a']):.2f}")
PY
