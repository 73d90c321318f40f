#!/usr/bin/env bash
# setup.sh - idempotent install of what the netns test VM needs, on a Debian bookworm host (root).
#
# Installs only what is missing; runs `apt-get update` only when something is missing.
# INITRD=No skips two ~27 s update-initramfs runs: vmrun.sh builds its own tiny initramfs.
# Fails with a message naming every package that could not be installed.
set -euo pipefail

# Package -> why it is needed.
PKGS=(
  qemu-system-x86          # the VM (q35, TCG or KVM)
  linux-image-amd64        # stock Debian kernel 6.1 (VRF, seg6local, nftables, cgroup BPF)
  linux-image-6.12-amd64   # stock Debian kernel 6.12 (the second kernel the tests run on)
  busybox-static           # the VM's initramfs userland
  nftables                 # nft, used by tests inside the VM (host / is the VM's /)
  iproute2                 # ip (netns, vrf, seg6 routes)
  iputils-ping             # ping
  bpftool                  # inspecting cgroup BPF programs
  tcpdump                  # looking at the fabric
  socat                    # ad-hoc TCP exchanges
  iperf3                   # throughput checks
  ethtool                  # NIC-like fabrics (TSO off, GRO on): throughput bench, link-local netns test
  python3                  # vmrun.sh: vmlinuz -> vmlinux; netns-tests/run: cargo JSON output
  cpio                     # vmrun.sh: initramfs archive
  kmod                     # vmrun.sh: modprobe --show-depends for the initramfs modules
  containernetworking-plugins  # bench-cni.sh: the reference plugins (ptp, bridge, host-local in /usr/lib/cni)
  containerd               # netns test containerd: containerd 1.6 (its CRI, ctr), run in the VM
  runc                     # the OCI runtime containerd runs the pod sandboxes with
  buildah                  # tests/cluster/images.sh: the test images (pause, CoreDNS, agnhost), built without a registry
  util-linux               # nsenter (the containerd test looks into a sandbox's namespace)
  curl                     # tests/cluster/images.sh: curl in the agnhost image, as upstream's has
  netcat-openbsd           # tests/cluster/images.sh: nc with UDP in the agnhost image, as upstream's has
)

if [ "$(id -u)" != 0 ]; then
  echo "setup.sh: must run as root (apt-get install)" >&2
  exit 1
fi

installed() { dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null | grep -qx installed; }

missing=()
for p in "${PKGS[@]}"; do installed "$p" || missing+=("$p"); done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup.sh: all ${#PKGS[@]} packages already installed"
  exit 0
fi

echo "setup.sh: installing: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive INITRD=No
apt-get update -qq || echo "setup.sh: warning: apt-get update failed; trying the install anyway" >&2

# Drop names apt does not know (so one unknown package does not block the others), but remember them.
unknown=() installable=()
for p in "${missing[@]}"; do
  if apt-cache show "$p" >/dev/null 2>&1; then installable+=("$p"); else unknown+=("$p"); fi
done
if [ ${#installable[@]} -gt 0 ]; then
  apt-get install -y -q --no-install-recommends "${installable[@]}" || true
fi

failed=()
for p in "${missing[@]}"; do installed "$p" || failed+=("$p"); done
if [ ${#failed[@]} -gt 0 ]; then
  echo "setup.sh: FAILED to install: ${failed[*]}" >&2
  [ ${#unknown[@]} -eq 0 ] || echo "setup.sh: unknown to apt (not in the configured suites): ${unknown[*]}" >&2
  exit 1
fi
echo "setup.sh: installed ${missing[*]}"
