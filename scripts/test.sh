#!/usr/bin/env bash
# Sets up everything the test suite needs on a fresh machine, then runs it:
#   1. system packages for the tests (Graphviz, gcc + libc6-dev, erofs-utils, fakeroot, a real
#      OCI registry and the tools that build its fixture images),
#   2. a release build of `voidbox`,
#   3. the guest image (kernel + read-only system disk; built from Debian packages on first use and
#      cached under ~/.cache/voidbox/images — the first build takes several minutes),
#   4. `cargo test --workspace` (host tests, end-to-end CLI tests and real-VM tests),
#   5. the real agent runtimes against a real local model: scripts/local-model.sh builds (first
#      time ~5-8 min, cached under ~/.cache/voidbox/local-model) and starts llama-server with
#      Gemma 3 270M on 127.0.0.1:8091, then `voidbox apply examples/agents-local.yaml` runs a
#      Claude Code box and a Codex box in VMs and merges their replies (checked below).
# VM tests fail loudly without /dev/kvm unless VOIDBOX_SKIP_VM_TESTS=1, which also skips 5.
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
# real resolver the network tests point the NAT's DNS upstream at; acl (setfacl) grants the
# release tests' fresh user /dev/kvm; neovim is the real editor of `voidbox lsp`'s end-to-end
# test.
apt_install graphviz gcc libc6-dev erofs-utils fakeroot musl bash-static docker-registry skopeo umoci tmux \
  busybox-static python3 dnsmasq-base acl neovim

# Arize Phoenix (pinned, in a venv under ~/.cache/voidbox) is the real OTLP receiver of
# tests/tests/vm_observe.rs; python3-venv creates the venv.
echo "==> Arize Phoenix (OTLP receiver for the observability tests)"
apt_install python3-venv
./scripts/phoenix.sh install

# maturin, twine, auditwheel (the wheel) and actionlint (docs/install.md's workflow), pinned.
echo "==> packaging tools"
./scripts/wheel.sh --tools-only

echo "==> building voidbox and its standalone VMM (used when beside it; one build)"
cargo build --release -p voidbox -p voidbox-vmm

if [ "${VOIDBOX_SKIP_VM_TESTS:-0}" != "1" ]; then
  echo "==> guest image (cached after the first build; the first build takes minutes)"
  target/release/voidbox image build
  target/release/voidbox image verify
  # --- BEGIN plain profile under emulated SVM (owner: tests/tests/vm_plain_tcg.rs) ---
  # QEMU (pure TCG, SVM CPU) runs Debian's stock kernel with kvm_amd as a "hardware" KVM
  # host, where the test boots the `plain` image (the one hosts with VMX/SVM get) through
  # scripts/tcg-l1.sh; dnsmasq-base is the L1's resolver, cpio packs its initramfs.
  apt_install qemu-system-x86 cpio dnsmasq-base busybox-static
  target/release/voidbox image build --profile plain --no-runtimes
  # --- END plain profile under emulated SVM ---
fi

if [ "${VOIDBOX_SKIP_VM_TESTS:-0}" != "1" ]; then
  # The release tarball and the Python wheel (both profiles' images bundled), which
  # tests/tests/release_bundle.rs installs and runs as a fresh unprivileged user.
  echo "==> release bundle and wheel"
  ./scripts/release.sh >/dev/null
  ./scripts/wheel.sh >/dev/null
fi

echo "==> cargo test"
cargo test --workspace --release

if [ "${VOIDBOX_SKIP_VM_TESTS:-0}" = "1" ]; then
  echo "==> agents example skipped (VOIDBOX_SKIP_VM_TESTS=1)"
  exit 0
fi

echo "==> local model (llama-server + Gemma 3 270M; built once, cached)"
./scripts/local-model.sh build
# Stop the server on exit only if this script started it (a developer's own stays up).
started_model=0
./scripts/local-model.sh status >/dev/null 2>&1 || started_model=1
report="$(mktemp)"
cleanup() {
  rm -f "$report"
  if [ "$started_model" = 1 ]; then ./scripts/local-model.sh stop; fi
}
trap cleanup EXIT
./scripts/local-model.sh start 8091 # a no-op when it already runs on 8091

echo "==> examples/agents-local.yaml: Claude Code and Codex in VMs against the local model"
rc=0
target/release/voidbox apply --output json examples/agents-local.yaml >"$report" || rc=$?
if [ "$rc" -ne 0 ]; then
  echo "voidbox apply examples/agents-local.yaml exited $rc; report:" >&2
  cat "$report" >&2
  exit 1
fi
python3 - "$report" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["status"] == "succeeded", f"run status {r['status']}"
out = r["output"]
assert isinstance(out, list) and len(out) == 2, f"merged output is not two results: {out!r}"
assert all(isinstance(s, str) and s.strip() for s in out), f"an empty result: {out!r}"
nodes = {n["name"]: n for n in r["nodes"]}
for name, runtime in (("claude", "claude-code"), ("codex", "codex")):
    n = nodes[name]
    assert n["status"] == "succeeded", f"{name}: {n['status']} {n['error']}"
    assert n["agent"]["runtime"] == runtime, f"{name}: runtime {n['agent']['runtime']}"
    assert n["gateway"]["requests"] >= 1, f"{name}: no model request went through the gateway"
    print(f"{name} ({runtime}): {n['agent']['result']!r} in {n['duration_ms'] / 1000:.0f} s, "
          f"{n['gateway']['requests']} model request(s)")
print(f"merged: {json.dumps(out)}")
PY
