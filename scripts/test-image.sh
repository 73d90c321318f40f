#!/usr/bin/env bash
# Image tier: builds the image for real (scripts/build-image.sh: buildah, mmdebstrap, release
# binaries) and checks what is inside it by mounting it (buildah mount) and chroot'ing into its
# root: podman cannot start containers in these sandboxes. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "test-image: run as root (buildah, chroot)" >&2; exit 1; }
need=()
python3 -c 'import pytest' 2>/dev/null || need+=(pytest)
python3 -c 'import yaml' 2>/dev/null || need+=(pyyaml)
if [ ${#need[@]} -gt 0 ]; then
  python3 -m pip install -q --disable-pip-version-check "${need[@]}" ||
    { echo "test-image: could not pip install ${need[*]}" >&2; exit 1; }
fi
./scripts/install-helm.sh >/dev/null
start=$EPOCHREALTIME
mapfile -t built < <(scripts/build-image.sh)
echo "test-image: built ${built[0]} as ${built[1]} in $(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.0f", b-a}') s"
export LACE_IMAGE=${built[0]} LACE_IMAGE_ARCHIVE=${built[1]}
exec python3 -m pytest -q -s tests/image "$@"
