#!/usr/bin/env bash
# Writes the release bundle dist/voidbox-VERSION-x86_64-linux.tar.gz:
#
#   voidbox-VERSION-x86_64-linux/
#     bin/voidbox                     the CLI (stripped)
#     bin/voidbox-vmm                 the standalone VMM the CLI starts VMs with (same build,
#                                     checked at every launch; see docs/cli.md, "Standalone VMM")
#     bin/voidbox-guest-agent         the static guest agent (PID 1 of every VM; what
#                                     `voidbox image build` puts on a system disk)
#     bin/voidbox-mock-llm            the offline mock agent runtime built beside it
#     share/voidbox/images/<hash>/    the guest images of both kernel profiles (plain: hardware
#                                     KVM; compat: KVM that emulates guest kernel mode), each
#                                     with its manifest.json; voidbox boots them from here after
#                                     re-hashing them against it, so no kernel is compiled
#     share/doc/voidbox/              README.md, CHANGELOG.md, docs/, BENCHMARKS.md, LICENSE (Apache-2.0),
#                                     THIRD-PARTY.md (every Rust crate linked, with its license),
#                                     licenses/GPL-2 (the guest's Linux kernel and busybox)
#
# Usage: scripts/release.sh    (prints the tarball's path)
#   Builds voidbox and both guest images first (a kernel compile per profile the first time:
#   minutes each, then cached; needs what `voidbox image build` needs: root, Debian packages).
#   Also leaves the unpacked tree in dist/voidbox-VERSION-x86_64-linux/ and dist/wheel-data/
#   for the Python wheel (scripts/wheel.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

echo "==> building voidbox and voidbox-vmm" >&2
cargo build --release -p voidbox -p voidbox-vmm >&2
voidbox=target/release/voidbox
version="$("$voidbox" --version | awk '{print $2}')"
name="voidbox-${version}-x86_64-linux"
stage="dist/${name}"
rm -rf "$stage" dist/wheel-data "dist/${name}.tar.gz"
mkdir -p "$stage/bin" "$stage/share/voidbox/images" "$stage/share/doc/voidbox/licenses"

image_dir() { # PROFILE → the directory of that profile's current image (built when missing)
  "$voidbox" image build --profile "$1" --no-runtimes --format json \
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["dir"])'
}

for profile in plain compat; do
  echo "==> guest image: $profile" >&2
  dir="$(image_dir "$profile")"
  "$voidbox" image verify "$(basename "$dir")" >&2
  mkdir -p "$stage/share/voidbox/images/$(basename "$dir")"
  for f in manifest.json vmlinux system.erofs voidbox-agent config; do
    cp "$dir/$f" "$stage/share/voidbox/images/$(basename "$dir")/$f"
  done
  chmod -R a+rX,go-w "$stage/share/voidbox/images"
done

echo "==> binaries" >&2
strip -o "$stage/bin/voidbox" "$voidbox"
strip -o "$stage/bin/voidbox-vmm" target/release/voidbox-vmm
guest="target/guest/x86_64-unknown-linux-gnu/release"
for b in voidbox-guest-agent voidbox-mock-llm; do
  if [ ! -f "$guest/$b" ]; then
    echo "error: $guest/$b missing (the image build makes it)" >&2
    exit 1
  fi
  strip -o "$stage/bin/$b" "$guest/$b"
done

echo "==> documents and licenses" >&2
doc="$stage/share/doc/voidbox"
cp -r README.md CHANGELOG.md docs BENCHMARKS.md LICENSE "$doc/"
cp /usr/share/common-licenses/GPL-2 "$doc/licenses/GPL-2"
cargo metadata --format-version 1 --locked --filter-platform x86_64-unknown-linux-gnu \
  | python3 scripts/third_party.py >"$doc/THIRD-PARTY.md"

echo "==> wheel data (scripts/wheel.sh packs it)" >&2
mkdir -p dist/wheel-data/data/share dist/wheel-data/scripts
cp -r "$stage/share/voidbox" dist/wheel-data/data/share/voidbox
cp -r "$stage/share/doc" dist/wheel-data/data/share/doc
cp "$stage/bin/voidbox-vmm" "$stage/bin/voidbox-guest-agent" "$stage/bin/voidbox-mock-llm" \
  dist/wheel-data/scripts/

echo "==> tarball" >&2
tar -C dist --owner=0 --group=0 --sort=name -czf "dist/${name}.tar.gz" "$name"
echo "dist/${name}.tar.gz"
