#!/usr/bin/env bash
# vmrun.sh - run a command as root inside a throw-away QEMU VM booting a stock Debian kernel.
#
# The host's / is the VM's root, read-only (9p) under a tmpfs overlay: the VM sees every host
# binary (cargo-built test executables included) and its writes outside the shared dirs vanish at
# exit. The shared dirs (default: $PWD; add more with -w) are read-write at the same path. The
# command's output (stdout and stderr, merged) comes back on stdout; the exit status is the
# command's.
#
# usage: vmrun.sh [--kernel K] [-t SECS] [-m MEM] [-c CPUS] [-w DIR]... [--tap IF] [--accel A] -- CMD [ARG...]
#   --kernel K  6.1 | 6.12 | a full version string such as 6.12.117+deb12-amd64
#               (default: $LACE_VM_KERNEL, else 6.1)
#   -t SECS     hard timeout for the whole VM run (default: $LACE_VM_TIMEOUT, else 600)
#   -m MEM      guest memory (default 2G);  -c CPUS  guest CPUs (default 2)
#   -w DIR      host dir shared read-write at the same path (repeatable; default $PWD)
#   --tap IF    give the VM a NIC (eth0, virtio) on the existing tap device IF of qemu's network
#               namespace (run vmrun.sh in the namespace that holds IF); without it the VM has
#               no network at all
#   --accel A   auto | kvm | tcg (default: $LACE_VM_ACCEL, else auto). auto uses KVM only if a
#               probe boot under KVM finishes within 10 s; the verdict is cached per kernel in
#               ${XDG_CACHE_HOME:-~/.cache}/lace-vm/<kernel>/accel (delete it to re-probe). Some
#               hosts expose a paravirtual /dev/kvm on which a stock kernel dies or crawls: TCG.
#               The accel used (and why) is printed on stderr.
# env: LACE_VM_PASSENV="VAR ..." host variables exported into the VM (PATH, CI, RUST_BACKTRACE,
#      RUST_TEST_THREADS, RUST_LOG are always passed); LACE_VM_DEBUG=1 shows the kernel log;
#      LACE_VM_CPU=MODEL the guest CPU under TCG (default max; e.g. Nehalem, without AVX and
#      5-level paging: no clear gain measured, in the cluster or the netns tests).
# exit: the command's status; 124 on timeout (the line before names the test that was running
#       and how long the run had taken); 125 if the VM died without a status (or could not
#       start: missing kernel, qemu, busybox-static...); 2 on a usage error.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
say() { echo "vmrun: $*" >&2; }
die() { say "ERROR: $*"; exit 125; }
usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }

KERNEL=${LACE_VM_KERNEL:-6.1} TIMEOUT=${LACE_VM_TIMEOUT:-600} MEM=2G CPUS=2
ACCEL=${LACE_VM_ACCEL:-auto} RWDIRS=() QUIET_ACCEL=0 NET=()
while [ $# -gt 0 ]; do
  case $1 in
    --kernel) KERNEL=${2:?--kernel needs a value}; shift 2;;
    -t|--timeout) TIMEOUT=${2:?-t needs seconds}; shift 2;;
    -m) MEM=${2:?-m needs a size}; shift 2;;
    -c) CPUS=${2:?-c needs a count}; shift 2;;
    -w) [ -d "${2:?-w needs a dir}" ] || die "-w $2: not a directory"; RWDIRS+=("$(realpath "$2")"); shift 2;;
    --accel) ACCEL=${2:?--accel needs auto|kvm|tcg}; shift 2;;
    --tap) [ -e "/sys/class/net/${2:?--tap needs a device}/tun_flags" ] || die "--tap $2: no tap device $2 in this network namespace (ip tuntap add dev $2 mode tap)"
           NET=(-netdev "tap,id=n0,ifname=$2,script=no,downscript=no" -device virtio-net-pci,netdev=n0); shift 2;;
    --quiet-accel) QUIET_ACCEL=1; shift;;   # internal: used by the KVM probe
    --) shift; break;;
    -h|--help) usage;;
    *) say "unknown argument: $1"; usage;;
  esac
done
[ $# -gt 0 ] || { say "no command given"; usage; }
[ ${#RWDIRS[@]} -gt 0 ] || RWDIRS=("$PWD")
case $ACCEL in auto|kvm|tcg) ;; *) say "--accel must be auto, kvm or tcg, not '$ACCEL'"; exit 2;; esac

# shellcheck source=kernel.sh
. "$HERE/kernel.sh"
KVER=$(lace_kernel_resolve "$KERNEL") || exit 125
command -v qemu-system-x86_64 >/dev/null || die "qemu-system-x86_64 not found; run netns-tests/vm/setup.sh (apt-get install qemu-system-x86)"

CACHE=${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/lace-vm/$KVER
mkdir -p "$CACHE" 2>/dev/null && [ -w "$CACHE" ] || { CACHE=/tmp/lace-vm-$(id -u)/$KVER; mkdir -p "$CACHE"; }
# The initramfs depends on this script (its /init is written below): rebuilt when it changes.
INITRD=$CACHE/initrd-$(md5sum < "${BASH_SOURCE[0]}" | cut -c1-8).cpio.gz

# ---- one-time per kernel: initramfs = static busybox + 9p/virtio/overlay modules + /init
build_initrd() {
  local bb=/bin/busybox t
  case "$(ldd "$bb" 2>&1 || true)" in
    *"not a dynamic"*) ;;
    *) die "$bb is not static; apt-get install busybox-static";;
  esac
  command -v cpio >/dev/null || die "cpio not found; apt-get install cpio"
  t=$(mktemp -d)
  mkdir -p "$t"/{bin,mods,proc,sys,dev,host,rw,newroot,ctl}
  cp "$bb" "$t/bin/busybox"
  local m ko
  for m in virtio_mmio virtio_pci 9pnet_virtio 9p overlay; do
    modprobe -S "$KVER" --show-depends "$m" || die "modprobe cannot resolve module $m for $KVER"
  done | awk '$1=="insmod"{print $2}' | awk '!seen[$0]++' | while read -r ko; do
    # Modules may be xz/zstd compressed (6.12); busybox insmod wants plain .ko files.
    local base; base=$(basename "$ko"); base=${base%.xz}; base=${base%.zst}
    case $ko in
      *.xz) xz -dc "$ko" > "$t/mods/$base";;
      *.zst) zstd -qdc "$ko" > "$t/mods/$base";;
      *) cp "$ko" "$t/mods/$base";;
    esac
    echo "$base" >> "$t/mods/order"
  done
  [ -s "$t/mods/order" ] || die "no 9p/overlay modules found for $KVER"
  cat > "$t/init" <<'EOF'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
for m in $(cat /mods/order); do insmod /mods/$m; done
stty -F /dev/console -onlcr 2>/dev/null
die() { echo "vmrun-init: $*"; poweroff -f; reboot -f; }
mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=512000 hostroot /host || die "9p root"
mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 vmctl /ctl || die "9p ctl"
mount -t tmpfs -o mode=755 rw /rw; mkdir -p /rw/u /rw/w
mount -t overlay -o lowerdir=/host,upperdir=/rw/u,workdir=/rw/w overlay /newroot || die overlay
R=/newroot
mount -t proc proc $R/proc; mount -t sysfs sys $R/sys; mount -t devtmpfs dev $R/dev
mkdir -p $R/dev/pts $R/dev/shm; mount -t devpts -o ptmxmode=666 devpts $R/dev/pts; mount -t tmpfs shm $R/dev/shm
ln -sf /proc/self/fd $R/dev/fd; ln -sf fd/0 $R/dev/stdin; ln -sf fd/1 $R/dev/stdout; ln -sf fd/2 $R/dev/stderr
mount -t tmpfs -o mode=755 run $R/run; mkdir -p $R/run/vmctl $R/run/netns; mount --bind /ctl $R/run/vmctl
mount -t tmpfs -o mode=1777 tmp $R/tmp
mount -t cgroup2 cgroup2 $R/sys/fs/cgroup; mount -t bpf bpf $R/sys/fs/bpf
mount -t debugfs debugfs $R/sys/kernel/debug 2>/dev/null; mount -t tracefs tracefs $R/sys/kernel/tracing 2>/dev/null
i=0; while read -r d; do mkdir -p "$R$d"; mount -t 9p -o trans=virtio,version=9p2000.L,msize=512000 rw$i "$R$d" || die "9p rw$i"; i=$((i+1)); done < /ctl/rwdirs
mkdir -p $R/run/vmrun; cp /stage2 $R/run/vmrun/stage2; cp /bin/busybox $R/run/vmrun/busybox
# switch_root (not chroot): kernel usermode helpers (module autoload) must see the real root
exec switch_root $R /bin/sh /run/vmrun/stage2
EOF
  cat > "$t/stage2" <<'EOF'
# PID 1 on the overlay root
hostname vm; echo 1 > /proc/sys/kernel/sysrq; ip link set lo up
/bin/bash /run/vmctl/cmd </dev/null
echo $? > /run/vmctl/rc; sync
# How busy the guest's CPUs were: a run that left them idle could run more at once.
awk '/^cpu /{ printf "vmrun: the guest CPUs were busy %.0f s and idle %.0f s\n", ($2+$3+$4+$7+$8+$9)/100, ($5+$6)/100 }' /proc/stat
/run/vmrun/busybox poweroff -f; echo o > /proc/sysrq-trigger; sleep 10
EOF
  chmod +x "$t/init"
  (cd "$t" && find . | cpio -o -H newc --quiet | gzip -1) > "$INITRD.$$"
  # Initramfs of older versions of this script (another checkout may still use a recent one).
  find "$CACHE" -maxdepth 1 -name 'initrd-*.cpio.gz' -mtime +7 -delete 2>/dev/null || true
  mv "$INITRD.$$" "$INITRD"
  rm -rf "$t"
}
[ -s "$INITRD" ] || build_initrd

# ---- one-time per kernel: the uncompressed vmlinux (booted through its PVH entry). Skips the
# in-guest decompression, which costs ~2.5 s for an xz kernel (6.1) under TCG. Any failure here
# just means booting the compressed bzImage.
KIMAGE=/boot/vmlinuz-$KVER
if [ ! -s "$CACHE/vmlinux" ] && [ ! -e "$CACHE/vmlinux.none" ] && command -v python3 >/dev/null; then
  if python3 - "$KIMAGE" "$CACHE/vmlinux.$$" <<'PY' 2>/dev/null; then
import lzma, subprocess, sys
data = open(sys.argv[1], "rb").read()
i = data.find(b"\xfd7zXZ\x00")
if i >= 0:
    out = lzma.LZMADecompressor(format=lzma.FORMAT_XZ).decompress(data[i:])
else:
    i = data.find(b"\x28\xb5\x2f\xfd")  # zstd frame magic
    if i < 0:
        sys.exit(1)
    out = subprocess.run(["zstd", "-qdc"], input=data[i:], capture_output=True).stdout
if out[:4] != b"\x7fELF":
    sys.exit(1)
open(sys.argv[2], "wb").write(out)
PY
    mv "$CACHE/vmlinux.$$" "$CACHE/vmlinux"
  else
    rm -f "$CACHE/vmlinux.$$"; touch "$CACHE/vmlinux.none"
  fi
fi
[ -s "$CACHE/vmlinux" ] && KIMAGE=$CACHE/vmlinux

# ---- accelerator: KVM only where a stock kernel really boots under it
kvm_usable_device() { [ -c /dev/kvm ] && [ -r /dev/kvm ] && [ -w /dev/kvm ]; }
ACCEL_WHY=
if [ "$ACCEL" = auto ]; then
  if [ -s "$CACHE/accel" ]; then
    ACCEL=$(cat "$CACHE/accel"); ACCEL_WHY="cached probe verdict in $CACHE/accel"
  elif ! kvm_usable_device; then
    ACCEL=tcg; ACCEL_WHY="no usable /dev/kvm"
  else
    # A healthy KVM boots this VM in 1-3 s; a paravirtual /dev/kvm makes qemu abort at once or
    # the guest crawl. TCG boots it in ~3-6 s, so KVM is used only if the probe boot finished
    # within 10 s; 20 s bounds the probe.
    probe_start=$EPOCHREALTIME
    if "${BASH_SOURCE[0]}" --kernel "$KVER" --accel kvm --quiet-accel -t 20 -w "$CACHE" -- true >"$CACHE/accel-probe.log" 2>&1; then
      probe=$(awk -v a="$probe_start" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.1f", b-a}')
      if awk -v t="$probe" 'BEGIN{exit !(t < 10)}'; then
        ACCEL=kvm ACCEL_WHY="KVM probe boot took ${probe}s"
      else
        ACCEL=tcg ACCEL_WHY="KVM probe boot took ${probe}s: too slow"
      fi
    else
      ACCEL=tcg ACCEL_WHY="KVM probe boot failed"
    fi
    echo "$ACCEL" > "$CACHE/accel.$$" && mv "$CACHE/accel.$$" "$CACHE/accel"
    ACCEL_WHY="$ACCEL_WHY; verdict cached in $CACHE/accel, probe log in $CACHE/accel-probe.log"
  fi
else
  ACCEL_WHY="requested"
fi
[ "$ACCEL" != kvm ] || kvm_usable_device || die "--accel kvm but /dev/kvm is missing or not accessible"
[ "$QUIET_ACCEL" = 1 ] || say "kernel $KVER, accel $ACCEL ($ACCEL_WHY), timeout ${TIMEOUT}s"
if [ "$ACCEL" = kvm ]; then CPU=host; else CPU=${LACE_VM_CPU:-max}; fi

# ---- per run: control dir with the command script
CTL=$(mktemp -d /tmp/lace-vmrun.XXXXXX)
trap 'rm -rf "$CTL"' EXIT
printf '%s\n' "${RWDIRS[@]}" > "$CTL/rwdirs"
{
  # Debian's own tools first (what setup.sh installs), then the host's PATH: a version
  # manager's shims (pyenv, asdf) are scripts that fork a dozen processes per call, which costs
  # ~10 s per `python3` under TCG instead of ~1 s.
  echo "export PATH=/usr/sbin:/usr/bin:/sbin:/bin:$(printf %q "$PATH") HOME=/root TERM=dumb LANG=C.UTF-8"
  for v in CI RUST_BACKTRACE RUST_TEST_THREADS RUST_LOG ${LACE_VM_PASSENV:-}; do
    [ -z "${!v+x}" ] || echo "export $v=$(printf %q "${!v}")"
  done
  echo "cd $(printf %q "$PWD") || exit 126"
  printf 'exec'; printf ' %q' "$@"; echo
} > "$CTL/cmd"

DEV=virtio-9p-pci
FS=(-fsdev "local,id=f0,path=/,security_model=none,readonly=on,multidevs=remap" -device "$DEV,fsdev=f0,mount_tag=hostroot"
    -fsdev "local,id=f1,path=$CTL,security_model=none" -device "$DEV,fsdev=f1,mount_tag=vmctl")
i=0
for d in "${RWDIRS[@]}"; do
  FS+=(-fsdev "local,id=r$i,path=$d,security_model=none,multidevs=remap" -device "$DEV,fsdev=r$i,mount_tag=rw$i")
  i=$((i+1))
done
# Quiet, but a panic or an oops (emergency and alert levels) still reaches the console: a guest
# kernel that dies otherwise leaves only "exited without a status". softlockup_panic: a CPU
# stuck in the kernel panics (with its trace) instead of hanging the run until its limit (a CI
# run's 6.1 VM did, both CPUs stuck for over an hour).
LOG="quiet loglevel=2"; [ "${LACE_VM_DEBUG:-}" = 1 ] && LOG="loglevel=7"

# q35, not microvm: microvm hangs intermittently in timer calibration under TCG.
RUN_START=$EPOCHREALTIME
# timebox.py: on timeout it names the test running on the console (and for how long).
set +e
"$HERE/timebox.py" -t "$TIMEOUT" --label "vmrun (kernel $KVER, accel $ACCEL)" -- \
  qemu-system-x86_64 -M "q35,accel=$ACCEL" -cpu "$CPU" -smp "$CPUS" -m "$MEM" \
  -nodefaults -no-user-config -display none -no-reboot -serial stdio -monitor none \
  -kernel "$KIMAGE" -initrd "$INITRD" \
  -append "console=ttyS0 $LOG panic=-1 softlockup_panic=1 rdinit=/init mitigations=off tsc=reliable" \
  "${FS[@]}" "${NET[@]}" </dev/null
QRC=$?
set -e
[ $QRC -ne 124 ] || exit 124
[ -s "$CTL/rc" ] || { say "VM exited (qemu rc=$QRC) without a status; rerun with LACE_VM_DEBUG=1"; exit 125; }
RC=$(cat "$CTL/rc")
say "$(awk -v a="$RUN_START" -v b="$EPOCHREALTIME" -v t="$TIMEOUT" -v rc="$RC" \
  'BEGIN{printf "the VM run took %.1fs of its %ss limit, exit status %s", b-a, t, rc}')"
exit "$RC"
