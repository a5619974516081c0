#!/usr/bin/env bash
# Boots voidbox's `plain` guest image (the one every host with hardware KVM gets) on a machine
# without VMX/SVM, by emulating the whole stack (see ../shared/notes/hw-kvm-tcg.md):
#
#   this host ── QEMU, pure TCG, -cpu EPYC-Rome,+svm,+npt
#                  └─ L1: Debian's stock kernel with kvm_amd → a /dev/kvm that is "hardware"
#                       └─ voidbox (the probe says plain) → micro-VMs of the plain image (L2)
#
# Usage: scripts/tcg-l1.sh VOIDBOX IMAGE_DIR [SPEC]
#   VOIDBOX    the voidbox binary to run in L1 (dynamically linked is fine: the libraries `ldd`
#              lists and their loader go along)
#   IMAGE_DIR  a cached plain image: ~/.cache/voidbox/images/<hash>/ (manifest profile "plain")
#   SPEC       the spec `voidbox apply` runs (default examples/fan-out.yaml, whose merged output
#              is checked)
# Environment:
#   TCG_L1_TIMEOUT  seconds the whole QEMU session may take (default 600, at most 600); on a
#                   timeout, where the vCPUs were 10 s before it goes to stderr (QEMU monitor)
#   TCG_L1_CHECK_TIMEOUT  seconds one check may take inside L1 (default 90): a voidbox that
#                   hangs fails its check while the L1 lives on
#   TCG_L1_LOG      where the console log goes (default: console.log in the work directory)
#   TCG_L1_KEEP=1   keep the work directory (initramfs, /init) for inspection
#   TCG_L1_LAYERED_PROBE=PATH  the layered-probe binary (tests/src/bin/layered-probe.rs):
#                   adds the check `layered`, a layered (diff) snapshot over a golden base
#                   made, restored and refused when corrupt, through the voidbox library
#   TCG_L1_SMP      the L1's vCPUs (default 1: with 2, an L1 hang or an L2 triple fault came
#                   in 2 of 5 sessions on a 2-core host; with 1, none in 10)
#   TCG_L1_BENCH=N  instead of the checks, the cold-boot comparison (BENCHMARKS.md): N rounds,
#                   each booting IMAGE_DIR's vmlinux and system.erofs (1 vCPU, 128 MiB, a
#                   read-only disk and a vsock device, `voidbox.debug=1`) once per VMM, in an
#                   order that rotates per round, timing every console line with
#                   scripts/tcg-l1/boot-timer.c until the agent's `boot: listening`;
#                   scripts/tcg-l1/boot-compare.py prints the phase split and the ratios
#   TCG_L1_FIRECRACKER=PATH   the Firecracker binary the comparison also boots
#                   (../shared/vendor/firecracker/README.md: --no-seccomp --no-api)
#   TCG_L1_VOIDBOX_BEFORE=PATH  another voidbox binary the comparison also boots (the VMM of
#                   an earlier commit, to compare before/after)
#   TCG_L1_VOIDBOX_VMM=PATH  the standalone VMM binary (target/release/voidbox-vmm), booted
#                   too: the same VMM without the CLI around it
#   TCG_L1_BENCH_VERBOSE=1  every kernel message on the guest console (to see where boot time
#                   goes by the kernel's timestamps; slows every boot down)
#
# The L1 kernel and its modules come from the package Debian's `linux-image-amd64` depends
# on (apt-get download + dpkg-deb -x, nothing installed on this host), cached under
# ${XDG_CACHE_HOME:-~/.cache}/voidbox/tcg-l1/<package>_<version>/. Needs qemu-system-x86,
# busybox-static, cpio, binutils (strip) and dnsmasq-base (the L1's DNS for the network check).
#
# In L1, /init runs each check and prints `CHECK <name> PASS <secs>s` or
# `CHECK <name> FAIL <secs>s <detail>`, then `ALL DONE`, and powers off. Checks: probe, doctor,
# cold, snapshot-create, snapshot-restore, layered (with TCG_L1_LAYERED_PROBE), network,
# apply. The console is unbuffered (tee).
#
# Exit status: 0 every check passed; 1 a check failed (voidbox's fault); 3 the L1 session
# broke (an L1 kernel oops/panic, or the timeout or no `ALL DONE` without a failed check);
# 2 usage or setup error.
set -euo pipefail

usage() {
  sed -n '9,26p' "$0" >&2
  exit 2
}
[ "$#" -ge 2 ] && [ "$#" -le 3 ] || usage
repo="$(cd "$(dirname "$0")/.." && pwd)"
voidbox="$(realpath "$1")"
image="$(realpath "$2")"
spec="$(realpath "${3:-$repo/examples/fan-out.yaml}")"
timeout_s="${TCG_L1_TIMEOUT:-600}"
[ "$timeout_s" -le 600 ] || timeout_s=600
check_timeout_s="${TCG_L1_CHECK_TIMEOUT:-90}"

die() {
  echo "tcg-l1: $*" >&2
  exit 2
}
for tool in qemu-system-x86_64:qemu-system-x86 cpio:cpio strip:binutils \
  /bin/busybox:busybox-static /usr/sbin/dnsmasq:dnsmasq-base apt-get:apt dpkg-deb:dpkg; do
  bin="${tool%%:*}"
  command -v "$bin" >/dev/null 2>&1 || die "$bin missing: apt-get install -y ${tool#*:}"
done
[ -x "$voidbox" ] || die "$1: not an executable"
layered_probe="${TCG_L1_LAYERED_PROBE:-}"
if [ -n "$layered_probe" ]; then
  layered_probe="$(realpath "$layered_probe")"
  [ -x "$layered_probe" ] || die "TCG_L1_LAYERED_PROBE=$TCG_L1_LAYERED_PROBE: not an executable"
fi
[ -f "$spec" ] || die "$spec: no such spec"
grep -q '"profile": *"plain"' "$image/manifest.json" 2>/dev/null ||
  die "$2: not a plain guest image (build one: voidbox image build --profile plain --no-runtimes)"
hash="$(basename "$image")"

# --- the L1 kernel and modules (cached) ------------------------------------------------------
cache="${XDG_CACHE_HOME:-$HOME/.cache}/voidbox/tcg-l1"
mkdir -p "$cache"
MODULES="virt/lib/irqbypass.ko arch/x86/kvm/kvm.ko drivers/crypto/ccp/ccp.ko arch/x86/kvm/kvm-amd.ko
  drivers/net/ethernet/intel/e1000/e1000.ko"
l1_package() {
  apt-cache depends linux-image-amd64 2>/dev/null |
    sed -n 's/^ *Depends: \(linux-image-[0-9].*-amd64\)$/\1/p' | head -n 1
}
fetch_l1() {
  exec 9>"$cache/lock"
  flock 9
  local pkg ver
  pkg="$(l1_package)"
  if [ -z "$pkg" ]; then
    # No package lists: use what is cached, else update them once.
    l1="$(find "$cache" -mindepth 2 -maxdepth 2 -name .complete -printf '%h\n' | sort -V | tail -n 1)"
    if [ -n "$l1" ]; then return; fi
    apt-get update -qq >&2
    pkg="$(l1_package)"
    [ -n "$pkg" ] || die "apt-cache depends linux-image-amd64 names no kernel package"
  fi
  ver="$(apt-cache policy "$pkg" | sed -n 's/^ *Candidate: //p')"
  [ -n "$ver" ] && [ "$ver" != "(none)" ] || die "no candidate version of $pkg"
  l1="$cache/${pkg}_$ver"
  [ -f "$l1/.complete" ] && return
  echo "tcg-l1: fetching the L1 kernel $pkg $ver" >&2
  local tmp
  tmp="$(mktemp -d "$cache/.fetch.XXXXXX")"
  (cd "$tmp" && apt-get download -q "$pkg=$ver" >/dev/null 2>&1) || {
    rm -rf "$tmp"
    die "apt-get download $pkg=$ver failed"
  }
  dpkg-deb -x "$tmp"/*.deb "$tmp/x"
  mkdir -p "$tmp/out/modules"
  cp "$tmp"/x/boot/vmlinuz-* "$tmp/out/vmlinuz"
  local m
  for m in $MODULES; do
    cp "$tmp"/x/lib/modules/*/kernel/"$m" "$tmp/out/modules/" || die "$pkg has no $m"
  done
  echo "$pkg $ver" >"$tmp/out/.complete"
  rm -rf "$l1"
  mv "$tmp/out" "$l1"
  rm -rf "$tmp"
}
fetch_l1
exec 9>&-

# --- the initramfs ----------------------------------------------------------------------------
work="$(mktemp -d "${TMPDIR:-/tmp}/tcg-l1.XXXXXX")"
cleanup() { if [ "${TCG_L1_KEEP:-0}" != 1 ]; then rm -rf "$work"; else echo "tcg-l1: kept $work" >&2; fi; }
trap cleanup EXIT
log="${TCG_L1_LOG:-$work/console.log}"
root="$work/root"
mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,etc,proc,sys,dev,tmp,root,www,spec,modules} \
  "$root/cache/voidbox/images"
cp /bin/busybox "$root/bin/busybox"
strip --strip-all -o "$root/bin/voidbox" "$voidbox"
cp /usr/sbin/dnsmasq "$root/usr/sbin/dnsmasq"
# Shared libraries of the dynamic programs, at the paths the loader looks for them.
if [ -n "$layered_probe" ]; then strip --strip-all -o "$root/bin/layered-probe" "$layered_probe"; fi
for lib in $( (ldd "$voidbox" && ldd /usr/sbin/dnsmasq && if [ -n "$layered_probe" ]; then ldd "$layered_probe"; fi) |
  grep -o '/[^ ]*' | sort -u); do
  mkdir -p "$root$(dirname "$lib")"
  cp -L "$lib" "$root$lib"
done
cp -r "$image" "$root/cache/voidbox/images/$hash"
cp "$spec" "$root/spec/spec.yaml"
for m in $MODULES; do cp "$l1/modules/$(basename "$m")" "$root/modules/"; done
echo 'root:x:0:0:root:/root:/bin/sh' >"$root/etc/passwd"
echo 'root:x:0:' >"$root/etc/group"
echo 'nameserver 10.0.2.3' >"$root/etc/resolv.conf"
echo '127.0.0.1 localhost' >"$root/etc/hosts"
token="tcg-net-$(od -An -N8 -tx8 /dev/urandom | tr -d ' ')"
echo "$token" >"$root/www/token"

bench="${TCG_L1_BENCH:-}"
if [ -n "$bench" ]; then
  [ "$bench" -ge 1 ] 2>/dev/null || die "TCG_L1_BENCH must be a number of rounds"
  gcc -static -O2 -o "$root/bin/boot-timer" "$repo/scripts/tcg-l1/boot-timer.c" ||
    die "cannot build boot-timer (needs gcc and libc6-dev)"
  vmms="voidbox"
  if [ -n "${TCG_L1_VOIDBOX_BEFORE:-}" ]; then
    strip --strip-all -o "$root/bin/voidbox-before" "$TCG_L1_VOIDBOX_BEFORE"
    vmms="$vmms voidbox-before"
  fi
  if [ -n "${TCG_L1_VOIDBOX_VMM:-}" ]; then
    strip --strip-all -o "$root/bin/voidbox-vmm" "$TCG_L1_VOIDBOX_VMM"
    vmms="$vmms voidbox-vmm"
  fi
  if [ -n "${TCG_L1_FIRECRACKER:-}" ]; then
    strip --strip-all -o "$root/bin/firecracker" "$TCG_L1_FIRECRACKER"
    for lib in $(ldd "$TCG_L1_FIRECRACKER" | grep -o '/[^ ]*' | sort -u); do
      mkdir -p "$root$(dirname "$lib")"
      cp -L "$lib" "$root$lib"
    done
    vmms="$vmms firecracker"
  fi
  img="/cache/voidbox/images/$hash"
  secret="$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n')"
  # The image's own flags beyond the VMM's generated ones, as the engine passes them.
  extra="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["cmdline"])' "$image/manifest.json" |
    sed 's/console=ttyS0 reboot=k panic=-1 pci=off //') voidbox.debug=1 voidbox.secret=$secret"
  # TCG_L1_BENCH_VERBOSE=1: every kernel message on the console (slower boots; for finding
  # where the time goes, by the kernel's own timestamps).
  if [ "${TCG_L1_BENCH_VERBOSE:-0}" = 1 ]; then extra="${extra/quiet/ignore_loglevel}"; fi
  cat >"$root/bench-voidbox.json" <<JSON
{"kernel":"$img/vmlinux","cmdline_extra":"$extra","memory_mb":128,"vcpus":1,
 "vsock_uds":"/tmp/vb.vsock","vsock_cid":3,"console_log":"/tmp/console.log","compat":false,
 "image_hash":"bench","disks":[{"path":"$img/system.erofs","read_only":true}]}
JSON
  tr -d '\n' <"$root/bench-voidbox.json" >"$root/bench-voidbox.line" && echo >>"$root/bench-voidbox.line"
  cat >"$root/bench-firecracker.json" <<JSON
{"boot-source":{"kernel_image_path":"$img/vmlinux",
  "boot_args":"console=ttyS0 reboot=k panic=-1 pci=off $extra"},
 "drives":[{"drive_id":"system","path_on_host":"$img/system.erofs","is_root_device":false,
  "is_read_only":true}],
 "machine-config":{"vcpu_count":1,"mem_size_mib":128},
 "vsock":{"guest_cid":3,"uds_path":"/tmp/fc.vsock"}}
JSON
  cat >"$root/init" <<INIT
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin:/sbin:/usr/bin:/usr/sbin HOME=/root
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs -o size=1g tmpfs /tmp
for m in irqbypass kvm ccp kvm-amd; do insmod /modules/\$m.ko || echo "insmod \$m failed"; done
set -- $vmms
n=\$#
for round in \$(seq $bench); do
  i=0
  while [ \$i -lt \$n ]; do
    k=\$(( (i + round - 1) % n + 1 ))
    eval vmm=\\\$\$k
    rm -f /tmp/vb.vsock /tmp/fc.vsock
    case \$vmm in
      firecracker) boot-timer -u 'boot: listening' -t 120 -- firecracker --no-seccomp --no-api \\
                     --config-file /bench-firecracker.json </dev/null >/tmp/t 2>&1 ;;
      voidbox-vmm) boot-timer -f /tmp/console.log -u 'boot: listening' -t 120 -- voidbox-vmm \\
           </bench-voidbox.line >/tmp/t 2>&1 ;;
      *) boot-timer -f /tmp/console.log -u 'boot: listening' -t 120 -- \$vmm __vmm \\
           </bench-voidbox.line >/tmp/t 2>&1 ;;
    esac
    echo "BENCH \$vmm \$round rc=\$?"
    sed 's/^/T /' /tmp/t
    i=\$((i + 1))
  done
done
echo "ALL DONE"
sync
poweroff -f
INIT
else
cat >"$root/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin:/sbin:/usr/bin:/usr/sbin HOME=/root XDG_CACHE_HOME=/cache NO_COLOR=1
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs -o size=1g tmpfs /tmp
now() { read -r up _ </proc/uptime; echo "$up"; }
echo "L1 INIT at $(now) s"
T_MOD=$(now)
for m in irqbypass kvm ccp kvm-amd e1000; do insmod /modules/$m.ko || echo "insmod $m failed"; done
ip link set lo up
ip addr add 10.0.2.15/24 dev eth0 && ip link set eth0 up && ip route add default via 10.0.2.2
# a heartbeat: when it stops, the L1 itself is stuck (not voidbox)
(while sleep 20; do echo "L1 alive at $(now) s"; done) &
echo "L1 modules+net in $(awk -v a="$T_MOD" -v b="$(now)" 'BEGIN{printf "%.2f", b-a}') s; /dev/kvm: $(ls -l /dev/kvm 2>&1)"

# Runs "$@" (bounded), shows its output indented, leaves stdout/stderr in /tmp/out /tmp/err.
# (QUIET=1: stdout is not shown.)
run() {
  T0=$(now)
  timeout @CHECK_TIMEOUT@ "$@" >/tmp/out 2>/tmp/err
  RC=$?
  [ "${QUIET:-0}" = 1 ] || sed 's/^/  | /' /tmp/out
  sed 's/^/  ! /' /tmp/err
}
# verdict NAME OK-CONDITION-EXIT-STATUS DETAIL
verdict() {
  el=$(awk -v a="$T0" -v b="$(now)" 'BEGIN{printf "%.2f", b-a}')
  if [ "$2" = 0 ]; then echo "CHECK $1 PASS ${el}s"; else echo "CHECK $1 FAIL ${el}s $3 (exit $RC)"; fi
}
has() { grep -q -- "$1" "$2"; }

run voidbox image probe
has 'hardware.*profile plain' /tmp/out; verdict probe $? "probe did not say hardware → plain: $(head -c 200 /tmp/out)"

run voidbox doctor
[ "$RC" = 0 ]; verdict doctor $? "doctor reported a failure"

run voidbox run --no-snapshot -- echo cold-ok
[ "$RC" = 0 ] && [ "$(cat /tmp/out)" = cold-ok ]; verdict cold $? "no cold-ok on stdout"

run voidbox run -- echo snap-ok
[ "$RC" = 0 ] && [ "$(cat /tmp/out)" = snap-ok ] && has 'creating the golden snapshot' /tmp/err
verdict snapshot-create $? "no snap-ok, or no golden snapshot made"

run voidbox run -- echo snap-ok
cp /tmp/err /tmp/err.restore
ok=1
if [ "$RC" = 0 ] && [ "$(cat /tmp/out)" = snap-ok ] && ! grep -Eq 'golden snapshot|cold' /tmp/err.restore; then
  voidbox snapshot ls >/tmp/ls 2>&1
  sed 's/^/  | /' /tmp/ls
  # exactly one golden snapshot, the one just restored
  [ "$(grep -Ec '^[0-9a-f]{12} ' /tmp/ls)" = 1 ] && ok=0
fi
verdict snapshot-restore $ok "no snap-ok, a cold boot or a new snapshot instead of a restore"

# A layered snapshot (TCG_L1_LAYERED_PROBE): a golden base, a marker written in a restore of
# it, a diff over the base; base + diff restored in a new VM has the marker, the base alone
# not; a corrupt diff and one without its base are refused (tests/src/bin/layered-probe.rs).
if [ -x /bin/layered-probe ]; then
  run layered-probe /bin/voidbox
  [ "$RC" = 0 ] && has '^layered-probe: ok$' /tmp/out
  verdict layered $? "$(grep -m1 'FAILED' /tmp/out | head -c 400)"
fi

# The network: the NAT's gateway reaches this L1's loopback (an allowed host port) and the
# NAT's DNS forwards to a dnsmasq on this L1, which alone knows tcg.test (a public address:
# the NAT drops answers in the special-purpose ranges, 203.0.113.0/24 among them; only the
# answer is checked, nothing is sent there).
httpd -p 127.0.0.1:8080 -h /www
dnsmasq --conf-file=/dev/null --no-resolv --no-hosts --listen-address=127.0.0.1 \
  --bind-interfaces --user=root --pid-file --port=5353 --address=/tcg.test/93.184.216.34
export VOIDBOX_DNS_UPSTREAMS=127.0.0.1:5353
run voidbox run --no-snapshot --allow-host-port 8080 -- sh -c \
  'ip -4 addr show eth0 | grep -o "inet [0-9./]*"; timeout 30 wget -q -O- http://10.0.2.2:8080/token; nslookup tcg.test 10.0.2.3 | grep -o "93\.184\.216\.34" | head -n 1'
unset VOIDBOX_DNS_UPSTREAMS
[ "$RC" = 0 ] && has 'inet 10.0.2.15/24' /tmp/out && has "$(cat /www/token)" /tmp/out && has '93.184.216.34' /tmp/out
verdict network $? "no address, no token through the gateway, or tcg.test unresolved"

# The report goes to the console as one line (REPORT …) for the caller to check too.
QUIET=1 run voidbox apply --output json /spec/spec.yaml
merged=1
tr -d ' \n' </tmp/out | grep -q '"output":\[9,"THEQUICKBROWNFOX\\nJUMPSOVERTHELAZYDOG",2\]' && merged=0
printf 'REPORT %s\n' "$(tr -d '\n' </tmp/out)"
[ "$RC" = 0 ] && [ "$merged" = 0 ]; verdict apply $? "the merged output is not [9,\"THE QUICK…\",2]"

echo "ALL DONE at $(now) s"
sync
poweroff -f
INIT
fi
sed -i "s/@CHECK_TIMEOUT@/$check_timeout_s/" "$root/init"
chmod +x "$root/init"
(cd "$root" && find . | LC_ALL=C sort | cpio -o -H newc --quiet) >"$work/initrd.cpio"
echo "tcg-l1: initramfs $(du -m "$work/initrd.cpio" | cut -f1) MiB; L1 kernel $(cat "$l1/.complete"); session limit ${timeout_s}s" >&2

# --- the L1 session ---------------------------------------------------------------------------
# Where the vCPUs are when the session is about to time out: the watchdog saves QEMU
# monitor's `info registers -a` to regs.txt; after the session each RIP is named with the
# L1 kernel's symbols (the L1 runs with nokaslr; Debian ships its System.map only in the
# -dbg package, 860 MB, so it is fetched on the first hang and only System.map is kept) and
# with the plain guest kernel's (in case that vCPU was in L2).
save_registers() {
  command -v python3 >/dev/null 2>&1 || return 0
  python3 - "$work/monitor.sock" >"$work/regs.txt" <<'PY' || true
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(5)
s.connect(sys.argv[1])
def read():  # up to the next prompt
    buf = b""
    try:
        while not buf.endswith(b"(qemu) "):
            d = s.recv(65536)
            if not d:
                break
            buf += d
    except socket.timeout:
        pass
    return buf.decode(errors="replace")
read()
s.sendall(b"info registers -a\n")
print(read())
PY
}
l1_system_map() {
  [ -s "$l1/System.map" ] && return
  local pkg tmp
  pkg="$(cut -d' ' -f1 "$l1/.complete")-dbg=$(cut -d' ' -f2 "$l1/.complete")"
  tmp="$(mktemp -d "$cache/.dbg.XXXXXX")"
  echo "tcg-l1: fetching $pkg for the L1 kernel's System.map (once)" >&2
  if (cd "$tmp" && apt-get download -q "$pkg" >/dev/null 2>&1); then
    dpkg-deb --fsys-tarfile "$tmp"/*.deb 2>/dev/null |
      tar -xO --occurrence=1 --wildcards './usr/lib/debug/boot/System.map-*' >"$tmp/System.map" || true
    [ -s "$tmp/System.map" ] && mv "$tmp/System.map" "$l1/System.map"
  fi
  rm -rf "$tmp"
}
show_registers() {
  grep -q 'RIP=' "$work/regs.txt" 2>/dev/null || return 0
  l1_system_map
  python3 - "$work/regs.txt" "$l1/System.map" "$image/vmlinux" <<'PY' >&2 || true
import bisect, os, re, subprocess, sys
regs, l1_map, l2_vmlinux = sys.argv[1:]
def table(lines):
    syms = sorted((int(f[0], 16), f[2]) for f in (l.split() for l in lines)
                  if len(f) >= 3 and f[1] in ("t", "T", "w", "W"))
    return [a for a, _ in syms], [n for _, n in syms]
def near(tab, rip):
    addrs, names = tab
    i = bisect.bisect_right(addrs, rip) - 1
    return f"{names[i]}+{rip - addrs[i]:#x}" if i >= 0 and rip - addrs[i] < 0x10000 else "?"
l1 = table(open(l1_map).read().splitlines()) if os.path.exists(l1_map) else ([], [])
l2 = table(subprocess.run(["nm", "-n", l2_vmlinux], capture_output=True, text=True).stdout.splitlines())
print("tcg-l1: vCPUs shortly before the timeout (QEMU monitor):")
text = open(regs).read()
for m in re.finditer(r"RIP=([0-9a-f]+) .*?CPL=(\d).*?HLT=(\d)", text):
    rip = int(m.group(1), 16)
    print(f"tcg-l1:   RIP {rip:#x} CPL {m.group(2)} HLT {m.group(3)}: "
          f"L1 {near(l1, rip)}, or if in L2 {near(l2, rip)}")
PY
}

start=$(date +%s.%N)
(
  for _ in $(seq "$((timeout_s > 20 ? timeout_s - 10 : timeout_s / 2))"); do sleep 1; done
  [ -S "$work/monitor.sock" ] && save_registers
) &
watchdog=$!
set +e
timeout -k 10 "$timeout_s" qemu-system-x86_64 -accel tcg,thread=multi -smp "${TCG_L1_SMP:-1}" -m 4096 \
  -cpu EPYC-Rome,+svm,+npt -kernel "$l1/vmlinuz" -initrd "$work/initrd.cpio" \
  -append 'console=ttyS0 loglevel=5 panic=-1 softlockup_panic=1 nokaslr' -nographic -no-reboot \
  -monitor "unix:$work/monitor.sock,server=on,wait=off" \
  -netdev user,id=net0 -device e1000,netdev=net0,romfile= </dev/null 2>&1 | tee "$log"
qrc=${PIPESTATUS[0]}
set -e
kill "$watchdog" 2>/dev/null || true
wait "$watchdog" 2>/dev/null || true
wall=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}')
echo "tcg-l1: QEMU session ${wall}s (exit $qrc)" >&2
if [ "$qrc" = 124 ] || [ "$qrc" = 137 ]; then show_registers; fi

# L1 kernel lines carry a timestamp; a guest console quoted by voidbox is indented.
if grep -Eq '^\[ *[0-9]+\.[0-9]+\] .*(Kernel panic|Oops|BUG: |stack guard page was hit|general protection fault)' "$log"; then
  echo "tcg-l1: L1 CRASH: the L1 kernel oopsed or panicked" >&2
  exit 3
fi
# A failed check is voidbox's (a hung one fails after TCG_L1_CHECK_TIMEOUT), even if the L1
# broke later.
if [ -n "$bench" ]; then
  grep -q '^ALL DONE' "$log" || {
    echo "tcg-l1: L1 CRASH: the comparison did not finish" >&2
    exit 3
  }
  python3 "$repo/scripts/tcg-l1/boot-compare.py" "$log"
  exit $?
fi
if grep -q '^CHECK [^ ]* FAIL' "$log"; then
  echo "tcg-l1: FAILED: $(grep -c '^CHECK [^ ]* FAIL' "$log") check(s)" >&2
  exit 1
fi
if [ "$qrc" = 124 ] || [ "$qrc" = 137 ]; then
  echo "tcg-l1: L1 CRASH: timed out after ${timeout_s}s" >&2
  exit 3
fi
if ! grep -q '^ALL DONE' "$log"; then
  echo "tcg-l1: L1 CRASH: no ALL DONE and no FAIL line" >&2
  exit 3
fi
echo "tcg-l1: every check passed" >&2
