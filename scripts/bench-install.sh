#!/usr/bin/env bash
# Benchmark: from an installed release with empty caches to the first result of
# `voidbox apply examples/fan-out.yaml` — the tarball unpacked into an empty directory, and the
# wheel `pip install`ed into a fresh venv — then a second apply (golden snapshot cached).
# Each run gets an empty HOME and no XDG_* variables, so nothing is cached. Prints a table.
# Needs dist/ from scripts/release.sh and scripts/wheel.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
tarball="$(ls dist/voidbox-*-x86_64-linux.tar.gz)"
wheel="$(ls dist/voidbox-*.whl)"
spec="$PWD/examples/fan-out.yaml"
work="$(mktemp -d /tmp/voidbox-bench-XXXXXX)"
trap 'rm -rf "$work"' EXIT
now() { date +%s.%N; }
secs() { python3 -c "print(f'{$2 - $1:.1f}')"; }
apply() { # BIN HOME → seconds of one apply, checking its merged output
  local t0 t1 out
  t0="$(now)"
  out="$(env -i HOME="$2" PATH=/usr/bin:/bin "$1" apply --output json "$spec")"
  t1="$(now)"
  python3 -c 'import json,sys; o=json.loads(sys.argv[1])["output"]; assert o[0]==9 and o[2]==2, o' "$out"
  secs "$t0" "$t1"
}
printf '| install | install s | first apply s (empty cache) | install + first apply s | second apply s |\n|---|---|---|---|---|\n'

mkdir -p "$work/tar/home" "$work/tar/opt"
t0="$(now)"; tar -xzf "$tarball" -C "$work/tar/opt" --strip-components=1; t1="$(now)"
inst="$(secs "$t0" "$t1")"
first="$(apply "$work/tar/opt/bin/voidbox" "$work/tar/home")"
second="$(apply "$work/tar/opt/bin/voidbox" "$work/tar/home")"
printf '| tarball | %s | %s | %s | %s |\n' "$inst" "$first" "$(python3 -c "print(f'{$inst + $first:.1f}')")" "$second"

mkdir -p "$work/whl/home"
t0="$(now)"
python3 -m venv "$work/whl/venv"
"$work/whl/venv/bin/pip" install -q --no-index --no-deps "$wheel"
t1="$(now)"
inst="$(secs "$t0" "$t1")"
first="$(apply "$work/whl/venv/bin/voidbox" "$work/whl/home")"
second="$(apply "$work/whl/venv/bin/voidbox" "$work/whl/home")"
printf '| wheel (venv + pip) | %s | %s | %s | %s |\n' "$inst" "$first" "$(python3 -c "print(f'{$inst + $first:.1f}')")" "$second"
