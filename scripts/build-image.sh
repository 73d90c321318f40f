#!/usr/bin/env bash
# build-image.sh - builds the Lace image from ./Containerfile here, without any image registry,
# and writes it as an OCI archive that `kind load image-archive` and `ctr images import` accept.
#
#   scripts/build-image.sh [--arch amd64|arm64] [--out FILE]
#
# The Containerfile's `build` and `rootfs` stages need base images from a registry; here their
# outputs are made on the host by scripts/image-parts.sh (the same script those stages run:
# cargo build --release, and mmdebstrap from Debian's packages) and handed to buildah as build
# contexts named after the stages, so buildah runs only the final stage. The image is tagged
# <chart image.repository>:<chart appVersion>, the chart's default image, and the archive
# defaults to .cache/image/lace-cni-<version>-<arch>.oci.tar. Prints the tag and the archive.
#
# arm64 needs the aarch64 Rust standard library and linker (see scripts/image-parts.sh): build
# it on a machine that has them, or on an arm64 machine.
set -euo pipefail
cd "$(dirname "$0")/.."

arch=amd64 out=
while [ $# -gt 0 ]; do
  case $1 in
    --arch) arch=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "build-image: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case $arch in amd64|arm64) ;; *) echo "build-image: --arch amd64 or arm64, not $arch" >&2; exit 2 ;; esac

need=()
command -v buildah >/dev/null || need+=(buildah)
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
if [ ${#need[@]} -gt 0 ]; then
  [ "$(id -u)" = 0 ] || { echo "build-image: needs ${need[*]} (apt-get install ${need[*]})" >&2; exit 1; }
  { apt-get install -y -q "${need[@]}" >/dev/null 2>&1 ||
    { apt-get update -q >/dev/null && apt-get install -y -q "${need[@]}" >/dev/null; }; } ||
    { echo "build-image: could not apt-get install ${need[*]}" >&2; exit 1; }
fi

# The image's tag is the chart's default image: one version for the binaries and the charts.
yaml_value() { sed -n "s/^$2: *\"\{0,1\}\([^\"]*\)\"\{0,1\} *$/\1/p" "$1" | head -1; }
version=$(yaml_value chart/Chart.yaml appVersion)
crate_version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
repository=$(sed -n '/^image:/,/^[a-z]/s/^  repository: *//p' chart/values.yaml)
source_url=$(sed -n '/^\[workspace.package\]/,/^\[/s/^repository = "\(.*\)"/\1/p' Cargo.toml)
if [ -z "$version" ] || [ "$version" != "$crate_version" ]; then
  echo "build-image: chart appVersion ($version) and the crates' version ($crate_version) differ;" \
       "the image tag must be both" >&2
  exit 1
fi
tag=$repository:$version
work=.cache/image/$arch
out=${out:-.cache/image/lace-cni-$version-$arch.oci.tar}
mkdir -p "$work" "$(dirname "$out")"

revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
# Reproducible timestamps: the commit's time, not the build's.
epoch=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}
created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)

scripts/image-parts.sh binaries "$arch" "$work/build/out"
scripts/image-parts.sh rootfs "$arch" "$work/rootfs/out"

buildah build --quiet --platform "linux/$arch" --identity-label=false --timestamp "$epoch" \
  --build-context build="$work/build" --build-context rootfs="$work/rootfs" \
  --build-arg VERSION="$version" --build-arg REVISION="$revision" \
  --build-arg CREATED="$created" --build-arg SOURCE="$source_url" \
  -f Containerfile -t "$tag" . >/dev/null
rm -f "$out"
buildah push --quiet "$tag" "oci-archive:$out:$tag"
echo "$tag"
echo "$out"
