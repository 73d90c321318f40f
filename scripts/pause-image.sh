#!/usr/bin/env bash
# pause-image.sh - builds the pod sandbox ("pause") image the containerd tests import with
# `ctr -n k8s.io images import`: Debian's static busybox (busybox-static) running `sleep`, made
# with buildah from scratch (no registry), saved as a docker-archive whose tag is the image
# reference. Cached outside the repository, keyed by the busybox binary and this script:
#   ${XDG_CACHE_HOME:-~/.cache}/lace-k8s/pause-<hash>.tar
# Idempotent; prints "REFERENCE ARCHIVE" on stdout. Needs root (buildah's storage), buildah and
# busybox-static (netns-tests/vm/setup.sh installs both).
# env: LACE_K8S_CACHE overrides the cache directory.
set -euo pipefail
CACHE=${LACE_K8S_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/lace-k8s}
REF=lace.test/pause:busybox
BUSYBOX=/bin/busybox
say() { echo "pause-image: $*" >&2; }

command -v buildah >/dev/null || { say "buildah not found: apt-get install buildah (netns-tests/vm/setup.sh)"; exit 1; }
case "$(ldd "$BUSYBOX" 2>&1 || true)" in
  *"not a dynamic"*) ;;
  *) say "$BUSYBOX is not static: apt-get install busybox-static"; exit 1;;
esac
key=$(cat "$BUSYBOX" "${BASH_SOURCE[0]}" | sha256sum | cut -c1-16)
out=$CACHE/pause-$key.tar
if [ -s "$out" ]; then
  say "cached at $out"
  echo "$REF $out"
  exit 0
fi
mkdir -p "$CACHE"
ctr=$(buildah from scratch)
trap 'buildah rm "$ctr" >/dev/null 2>&1 || true' EXIT
buildah copy --quiet "$ctr" "$BUSYBOX" /bin/busybox >/dev/null
# PID 1 of the sandbox: sleeps until containerd kills it (StopPodSandbox sends SIGKILL).
buildah config --entrypoint '["/bin/busybox", "sleep", "2147483647"]' --cmd '[]' \
  --os linux --arch amd64 --label org.opencontainers.image.title="Lace test pause image" "$ctr"
image=$(buildah commit --quiet --rm --timestamp 0 "$ctr" "$REF")
trap - EXIT
buildah push --quiet "$image" "docker-archive:$out.$$:$REF"
buildah rmi "$image" >/dev/null 2>&1 || true
mv "$out.$$" "$out"
say "built $REF from $BUSYBOX, cached at $out"
echo "$REF $out"
