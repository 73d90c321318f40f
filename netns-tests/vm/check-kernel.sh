#!/usr/bin/env bash
# check-kernel.sh - can this kernel run Lace's netns tests? Run as root, on the host or in the VM.
#
# Checks, in a throw-away network namespace: a VRF device can be created; net.vrf.strict_mode=1
# can be set; seg6local End.DT46 and End.DT4 with vrftable and a seg6 encap route are accepted;
# nftables works (a table with a counter loads and lists). Then that cgroup2 and bpffs can be
# mounted. Prints one line per capability and names each missing one; exit 0 only if all pass.
#
# usage: check-kernel.sh [-q]     -q: print nothing, only the exit status (used for probing)
set -uo pipefail
QUIET=0; [ "${1:-}" = -q ] && QUIET=1
missing=()
ok()  { [ $QUIET = 1 ] || echo "check-kernel: ok       $1"; }
bad() { missing+=("$1"); [ $QUIET = 1 ] || echo "check-kernel: MISSING  $1: $2"; }
# check NAME CMD...: ok if CMD succeeds, else MISSING with the command's last stderr line.
check() {
  local name=$1 out; shift
  if out=$("$@" 2>&1); then ok "$name"; else bad "$name" "$(echo "$out" | tail -1) [$*]"; fi
}

if [ "$(id -u)" != 0 ]; then
  [ $QUIET = 1 ] || echo "check-kernel: MISSING  root: must run as root (uid is $(id -u))"
  exit 1
fi
for tool in ip nft; do
  command -v $tool >/dev/null || { bad "$tool binary" "not in PATH (apt-get install iproute2 nftables)"; }
done
[ ${#missing[@]} -eq 0 ] || exit 1

NS=lace-chk-$$
cleanup() {
  ip netns del "$NS" 2>/dev/null
  [ -z "${MNT:-}" ] || { umount "$MNT/cg" "$MNT/bpf" 2>/dev/null; rm -rf "$MNT"; }
}
trap cleanup EXIT
if ! out=$(ip netns add "$NS" 2>&1); then bad "network namespaces" "$out"; exit 1; fi
N() { ip -n "$NS" "$@"; }
X() { ip netns exec "$NS" "$@"; }
N link set lo up

check "VRF device (ip link add type vrf table 100)" N link add lace-chk-vrf type vrf table 100
N link set lace-chk-vrf up 2>/dev/null
check "sysctl net.vrf.strict_mode=1" X sysctl -qw net.vrf.strict_mode=1
check "seg6local End.DT46 vrftable" N -6 route add fc00:c::46/128 encap seg6local action End.DT46 vrftable 100 dev lace-chk-vrf
check "seg6local End.DT4 vrftable" N -6 route add fc00:c::4/128 encap seg6local action End.DT4 vrftable 100 dev lace-chk-vrf
N link add lace-chk-d type dummy 2>/dev/null && N link set lace-chk-d up 2>/dev/null
check "seg6 encap route in a VRF" N route add 10.99.0.0/24 vrf lace-chk-vrf encap seg6 mode encap segs fc00:d::4 dev lace-chk-d
check "nftables (table + counter)" X nft -f - <<'NFT'
table inet lace_chk {
  counter c { }
  chain pre { type filter hook prerouting priority 0; policy accept; ip6 daddr fc00:c::/48 counter name "c"; }
}
NFT
check "nftables list" X nft list counter inet lace_chk c

MNT=$(mktemp -d /tmp/lace-chk.XXXXXX); mkdir -p "$MNT/cg" "$MNT/bpf"
if grep -q ' cgroup2 ' /proc/mounts; then ok "cgroup2 (mounted)"; else check "cgroup2 mountable" mount -t cgroup2 none "$MNT/cg"; fi
if grep -q ' bpf ' /proc/mounts; then ok "bpffs (mounted)"; else check "bpffs mountable" mount -t bpf bpf "$MNT/bpf"; fi

if [ ${#missing[@]} -gt 0 ]; then
  [ $QUIET = 1 ] || echo "check-kernel: kernel $(uname -r) lacks: $(IFS=';'; echo "${missing[*]}")"
  exit 1
fi
[ $QUIET = 1 ] || echo "check-kernel: kernel $(uname -r) has everything the netns tests need"
