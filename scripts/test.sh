#!/usr/bin/env bash
# Sets up everything the test suite needs on a fresh machine, then runs it:
#   1. system packages for the tests (Graphviz, gcc + libc6-dev, erofs-utils, fakeroot, a real
#      OCI registry and the tools that build its fixture images),
#   2. a release build of `voidbox`,
#   3. the guest image (kernel + read-only system disk; built from Debian packages on first use and
#      cached under ~/.cache/voidbox/images — the first build takes several minutes),
#   4. `cargo test --workspace` (host tests, end-to-end CLI tests and real-VM tests).
# VM tests fail loudly without /dev/kvm unless VOIDBOX_SKIP_VM_TESTS=1.
set -euo pipefail
cd "$(dirname "$0")/.."

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
apt_install() {
  local missing=()
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "==> installing ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}
# graphviz renders the DOT output; gcc + libc6-dev build the static guest-side checker of
# tests/tests/vm_xstate.rs; erofs-utils + fakeroot make the guest's system disk and the OCI
# image disks; docker-registry (a real OCI registry), skopeo, umoci, busybox-static and
# python3 build and serve the OCI fixture images of the registry tests; dnsmasq-base is the
# real resolver the network tests point the NAT's DNS upstream at.
apt_install graphviz gcc libc6-dev erofs-utils fakeroot musl docker-registry skopeo umoci \
  busybox-static python3 dnsmasq-base

echo "==> building voidbox"
cargo build --release -p voidbox

if [ "${VOIDBOX_SKIP_VM_TESTS:-0}" != "1" ]; then
  echo "==> guest image (cached after the first build; the first build takes minutes)"
  target/release/voidbox image build
  target/release/voidbox image verify
fi

echo "==> cargo test"
cargo test --workspace --release
