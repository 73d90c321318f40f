#!/usr/bin/env bash
# image-parts.sh - the two inputs of the Lace image, built the same way by the Containerfile's
# stages (on a machine with registry access) and by scripts/build-image.sh (here, from Debian
# packages and the host's Rust toolchain only):
#
#   image-parts.sh binaries ARCH OUT   release builds of lace-agent, lace-controller and lace
#                                      (the CNI plugin, static) into OUT/usr/local/bin
#   image-parts.sh rootfs ARCH OUT     a minimal Debian root filesystem with nft and ip (and
#                                      the libraries they and the binaries link) into OUT
#
# ARCH is amd64 or arm64 (the image's platforms).
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { echo "usage: $0 binaries|rootfs amd64|arm64 OUT" >&2; exit 2; }
[ $# = 3 ] || usage
part=$1 arch=$2 out=$3
case $arch in
  amd64) target=x86_64-unknown-linux-gnu ;;
  arm64) target=aarch64-unknown-linux-gnu ;;
  *) usage ;;
esac
# Debian bookworm: the binaries are built against its glibc (2.36) and run on its libraries.
SUITE=${LACE_DEBIAN_SUITE:-bookworm}
# What the image holds besides Lace's binaries: nft (the agent applies its ruleset with
# `nft -j -f -`) and ip (operators inspect with it; `kubectl exec ... ip vrf`). Their
# dependencies (libc6, libgcc-s1, libnftables1, libmnl0, ...) come with them.
PACKAGES=nftables,iproute2

binaries() {
  local args=(--release --locked)
  local dir=${CARGO_TARGET_DIR:-$PWD/target}/release
  if [ "$(uname -m)" != "${target%%-*}" ]; then
    # Cross build (e.g. arm64 on amd64): needs the target's standard library
    # (`rustup target add $target`) and a linker for it (Debian: gcc-aarch64-linux-gnu).
    if [ ! -d "$(rustc --print sysroot)/lib/rustlib/$target/lib" ]; then
      echo "image-parts: no Rust standard library for $target in $(rustc --print sysroot);" \
           "run 'rustup target add $target' on a machine that can reach the Rust toolchain" \
           "servers (it cannot be installed from the package registries)" >&2
      exit 1
    fi
    local cc=${target%%-*}-linux-gnu-gcc
    command -v "$cc" >/dev/null ||
      { echo "image-parts: no linker $cc: apt-get install gcc-${target%%-*}-linux-gnu" >&2; exit 1; }
    local var
    var=CARGO_TARGET_$(echo "$target" | tr 'a-z-' 'A-Z_')_LINKER
    export "$var=$cc"
    args+=(--target "$target")
    dir=${CARGO_TARGET_DIR:-$PWD/target}/$target/release
  fi
  cargo build "${args[@]}" -p lace --bin lace-agent -p lace-controller --bin lace-controller
  # The CNI plugin runs on the host, not in the image (the agent installs it into the host's CNI
  # bin dir): linked statically, like the reference plugins, it needs no particular glibc there,
  # and the runtime's exec of it skips the dynamic loader (measured in netns-tests/bench-cni.sh).
  # `cargo rustc` gives the flag to this one binary only (as a build-wide RUSTFLAGS it would
  # also reach the proc-macros, which cannot be static).
  cargo rustc "${args[@]}" -p lace-cni --bin lace -- -C target-feature=+crt-static
  install -d "$out/usr/local/bin"
  install -m 0755 "$dir/lace-agent" "$dir/lace-controller" "$dir/lace" "$out/usr/local/bin/"
}

rootfs() {
  command -v mmdebstrap >/dev/null ||
    { echo "image-parts: mmdebstrap missing: apt-get install mmdebstrap" >&2; exit 1; }
  rm -rf "${out:?}"
  mkdir -p "$(dirname "$out")"
  # `extract` unpacks the packages and their dependencies without running maintainer scripts:
  # no shell, no dpkg or apt in the image, and any architecture can be made without emulation.
  # The hook (while the .debs are at hand) records each package for image scanners, the way
  # distroless images do (/var/lib/dpkg/status.d).
  # shellcheck disable=SC2016 # the hook's $1 is expanded by mmdebstrap's shell
  mmdebstrap --quiet --variant=extract --architectures="$arch" --include="$PACKAGES" \
    --extract-hook='
      set -e
      mkdir -p "$1/var/lib/dpkg/status.d"
      for deb in "$1"/var/cache/apt/archives/*.deb; do
        pkg=$(dpkg-deb -f "$deb" Package)
        { dpkg-deb -f "$deb" Package Version Architecture Source Depends Pre-Depends
          echo "Status: install ok installed"; } > "$1/var/lib/dpkg/status.d/$pkg"
        dpkg-deb -c "$deb" | awk "{print \$6}" | sed "s|^\./|/|; /\/$/d" \
          > "$1/var/lib/dpkg/status.d/$pkg.list"
      done' \
    "$SUITE" "$out"
  # debconf comes only as iproute2's dependency and is Perl, which the image has not: drop it
  # (files and record).
  local status=$out/var/lib/dpkg/status.d
  sed "s|^|$out|" "$status/debconf.list" | xargs -d '\n' rm -f
  rm -f "$status/debconf" "$status/debconf.list"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/nonexistent:/sbin/nologin\n' \
    > "$out/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' > "$out/etc/group"
  # Nothing at run time reads these; /dev is the runtime's.
  rm -rf "$out"/var/cache/apt "$out"/var/lib/apt "$out"/etc/apt "$out"/var/log/* \
    "$out"/usr/share/doc "$out"/usr/share/man "$out"/usr/share/info "$out"/usr/share/locale \
    "$out"/usr/share/lintian "$out"/usr/include "${out:?}"/dev/* "$out"/var/lib/dpkg/info \
    "$out"/var/lib/dpkg/status "$out"/var/lib/dpkg/available "$out"/var/lib/dpkg/triggers \
    "$out"/var/lib/dpkg/updates "$out"/var/lib/dpkg/alternatives "$out"/etc/dpkg
  find "$out" -depth -mindepth 1 -type d -empty -delete
  install -d -m 0755 "$out/dev" "$out/proc" "$out/sys" "$out/run"
  install -d -m 1777 "$out/tmp"
}

case $part in
  binaries) binaries ;;
  rootfs) rootfs ;;
  *) usage ;;
esac
