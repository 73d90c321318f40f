#!/usr/bin/env bash
# images.sh - the container images the test cluster's nodes run besides Lace's own, built
# locally from the binaries scripts/k8s-components.sh made (no registry is reachable or
# needed), as OCI archives that `ctr images import` takes. Cached beside the binaries, keyed by
# version and a hash of this script and what goes in (uncompressed: the VM unpacks them under
# emulation): ${LACE_K8S_CACHE:-~/.cache/lace-k8s}/images/NAME-VERSION-HASH.oci.tar. Each is tagged with
# the upstream name, as an air-gapped mirror would, so manifests (kubeadm's CoreDNS, the e2e
# suites) use them unchanged:
#   pause    registry.k8s.io/pause:3.10.1           Kubernetes' own pause.c (the sandbox image)
#   coredns  registry.k8s.io/coredns/coredns:VER    CoreDNS, as the upstream image: binary only
#   agnhost  registry.k8s.io/e2e-test-images/agnhost:2.66.1   agnhost + a static busybox + bash (sh), curl, nc
#
# usage: tests/cluster/images.sh [NAME...]   prints "NAME REF ARCHIVE" per image (default: all)
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
CACHE=${LACE_K8S_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/lace-k8s}
say() { echo "images: $*" >&2; }
die() { say "ERROR: $*"; exit 1; }
for c in buildah; do command -v $c >/dev/null || die "$c not found (apt-get install $c)"; done
case "$(ldd /bin/busybox 2>&1 || true)" in
  *"not a dynamic"*) ;;
  *) die "/bin/busybox is missing or not the static one (apt-get install busybox-static)";;
esac

version_of() { awk -v k="$1" '$1 == k { print $2; exit }' "$ROOT/scripts/k8s-versions"; }
K8S=$(version_of kubernetes) COREDNS=$(version_of coredns)
[ $# -gt 0 ] || set -- pause coredns agnhost
wanted() { local n; for n in "${NAMES[@]}"; do [ "$n" = "$1" ] && return 0; done; return 1; }
NAMES=("$@") COMPONENTS=()
for n in "${NAMES[@]}"; do
  case $n in
    pause) COMPONENTS+=(pause);; coredns) COMPONENTS+=(coredns);; agnhost) COMPONENTS+=(kubernetes);;
    *) die "unknown image '$n' (pause, coredns, agnhost)";;
  esac
done
PATH=$("$ROOT/scripts/k8s-components.sh" --path "${COMPONENTS[@]}"):$PATH
mkdir -p "$CACHE/images"
# key FILE...: a hash of this script and FILEs (a new binary or script makes a new archive).
key() { cat "${BASH_SOURCE[0]}" "$@" | md5sum | cut -c1-8; }
export BUILDAH_ISOLATION=chroot STORAGE_DRIVER=vfs

# image NAME REF ARCHIVE ENTRYPOINT-JSON FILE:DEST...
image() {
  local name=$1 ref=$2 out=$3 entry=$4 c f; shift 4
  if [ ! -s "$out" ]; then
    say "building $ref"
    c=$(buildah from scratch)
    for f in "$@"; do buildah copy --quiet "$c" "${f%%:*}" "${f#*:}" >/dev/null; done
    buildah config --entrypoint "$entry" --cmd '[]' --os linux --arch amd64 "$c"
    rm -f "$out.tmp"
    buildah commit --quiet --rm --disable-compression "$c" "oci-archive:$out.tmp:$ref" >/dev/null
    mv "$out.tmp" "$out"
  fi
  echo "$name $ref $out"
}
! wanted pause || image pause registry.k8s.io/pause:3.10.1 "$CACHE/images/pause-$K8S-$(key "$(command -v pause)").oci.tar" '["/pause"]' \
  "$(command -v pause):/pause"
! wanted coredns || image coredns "registry.k8s.io/coredns/coredns:$COREDNS" "$CACHE/images/coredns-$COREDNS-$(key "$(command -v coredns)").oci.tar" \
  '["/coredns"]' "$(command -v coredns):/coredns"
wanted agnhost || exit 0
# agnhost's tests exec `sh -c ...` in it: a static busybox with its applets as /bin/*.
ROOTFS=$(mktemp -d); trap 'rm -rf "$ROOTFS"' EXIT
mkdir -p "$ROOTFS/bin"; cp /bin/busybox "$ROOTFS/bin/"
for a in $(/bin/busybox --list); do [ -e "$ROOTFS/bin/$a" ] || ln -s busybox "$ROOTFS/bin/$a"; done
# And what upstream's agnhost image (Alpine) has and the conformance tests exec there, which
# busybox lacks: curl (`curl ... http://<pod>:8083/hostName` from a hostNetwork pod) and
# OpenBSD's netcat (`nc -w 1 -u`: busybox's nc has no UDP). Debian's, with the shared
# libraries and loader they link, at their paths. /bin/sh is Debian's bash (POSIX mode), not
# busybox's: Debian's static busybox is built to prefer its own applets, so its `sh -c 'nc …'`
# ran busybox's nc whatever the PATH held (Alpine's busybox, upstream's sh, is not).
TOOLS=(/usr/bin/curl:/usr/bin/curl:curl /bin/nc.openbsd:/usr/bin/nc:netcat-openbsd /bin/bash:/bin/bash:bash)
mkdir -p "$ROOTFS/usr/bin"
for t in "${TOOLS[@]}"; do
  IFS=: read -r bin dest pkg <<<"$t"
  [ -x "$bin" ] || die "$bin not found (apt-get install $pkg)"
  rm -f "$ROOTFS$dest"; cp "$bin" "$ROOTFS$dest"
  for lib in $(ldd "$bin" | grep -o '/[^ ]*'); do
    mkdir -p "$ROOTFS$(dirname "$lib")"; cp -L "$lib" "$ROOTFS$lib"
  done
done
ln -sf /usr/bin/nc "$ROOTFS/bin/nc"
ln -sf bash "$ROOTFS/bin/sh"
cp "$(command -v agnhost)" "$ROOTFS/agnhost"
image agnhost registry.k8s.io/e2e-test-images/agnhost:2.66.1 "$CACHE/images/agnhost-$K8S-$(key "$(command -v agnhost)" /bin/busybox /usr/bin/curl /bin/nc.openbsd /bin/bash).oci.tar" \
  '["/agnhost"]' "$ROOTFS:/"
