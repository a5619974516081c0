#!/usr/bin/env bash
# Builds the Python wheel dist/voidbox-VERSION-py3-none-manylinux_*_x86_64.whl (maturin,
# `bindings = "bin"`, packaging/python/pyproject.toml) from the tree scripts/release.sh left in
# dist/wheel-data, then checks it with `twine check` and `auditwheel show`. Prints its path.
# maturin, twine and auditwheel are installed pinned into a venv under ~/.cache/voidbox.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -d dist/wheel-data/data/share/voidbox/images ]; then
  echo "error: dist/wheel-data is missing: run scripts/release.sh first" >&2
  exit 1
fi
tools="${XDG_CACHE_HOME:-$HOME/.cache}/voidbox/wheel-tools"
if [ ! -x "$tools/bin/auditwheel" ]; then
  echo "==> maturin, twine, auditwheel (into $tools)" >&2
  python3 -m venv "$tools"
  "$tools/bin/pip" install -q "maturin==1.16.0" "twine==7.0.0" "auditwheel==6.8.2" >&2
fi
rm -f dist/voidbox-*.whl
"$tools/bin/maturin" build --release -m packaging/python/pyproject.toml --out dist >&2
wheel="$(ls dist/voidbox-*.whl)"
"$tools/bin/twine" check --strict "$wheel" >&2
"$tools/bin/auditwheel" show "$wheel" >&2
echo "$wheel"
