#!/usr/bin/env bash
# k8s-components.sh - builds Kubernetes test components from Go modules at the versions pinned in
# scripts/k8s-versions, into a cache outside the repository, and prints where they are:
#   ${XDG_CACHE_HOME:-~/.cache}/lace-k8s/NAME-VERSION/NAME
# Idempotent: a component already built whose `--version` says the pinned version is not built
# again (a build that does not say it is refused, and nothing is cached). Built with
# `GOFLAGS=-trimpath go install MODULE/PKG@VERSION` at nice 10, with the version stamped in
# through -ldflags as the component's own release build does. Needs Go (1.26; the Go module
# proxy); Go's module and build caches stay where Go keeps them (outside the repository).
#
# usage: scripts/k8s-components.sh [--path] NAME...
#   prints "NAME PATH" per component (with --path: just PATH) on stdout; progress on stderr
# components: crictl (sigs.k8s.io/cri-tools/cmd/crictl)
# env: LACE_K8S_CACHE overrides the cache directory.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VERSIONS=$ROOT/scripts/k8s-versions
CACHE=${LACE_K8S_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/lace-k8s}
say() { echo "k8s-components: $*" >&2; }

ONLY_PATH=0
[ "${1:-}" != --path ] || { ONLY_PATH=1; shift; }
[ $# -gt 0 ] || { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }

version_of() { # NAME: its pinned version
  awk -v n="$1" '$1 == n { print $2; found = 1; exit } END { exit !found }' "$VERSIONS" ||
    { say "scripts/k8s-versions has no line for '$1': add 'NAME VERSION' there"; return 1; }
}

# recipe NAME VERSION: sets PKG (the Go package to install), LDFLAGS (the version stamp),
# WANT (what `NAME --version` prints for this version) and TOOLCHAIN (GOTOOLCHAIN: `local`
# unless the module needs a newer Go than the machine's, then e.g. go1.27.3 from the proxy).
recipe() {
  TOOLCHAIN=local
  case $1 in
    crictl)
      PKG=sigs.k8s.io/cri-tools/cmd/crictl
      # cri-tools' Makefile stamps the tag without its "v".
      LDFLAGS="-X sigs.k8s.io/cri-tools/pkg/version.Version=${2#v}"
      WANT="crictl version ${2#v}";;
    *) say "unknown component '$1' (known: crictl): add its recipe to ${BASH_SOURCE[0]} and its version to scripts/k8s-versions"
       return 1;;
  esac
}

GO=$(command -v go || true)
[ -n "$GO" ] || [ ! -x /usr/local/go/bin/go ] || GO=/usr/local/go/bin/go

for name in "$@"; do
  version=$(version_of "$name")
  recipe "$name" "$version"
  dir=$CACHE/$name-$version
  bin=$dir/$name
  if [ -x "$bin" ] && "$bin" --version 2>/dev/null | grep -qxF "$WANT"; then
    say "$name $version: cached at $bin"
  else
    [ -n "$GO" ] || { say "cannot build $name $version: no 'go' in PATH (nor /usr/local/go/bin): install Go 1.26 or newer"; exit 1; }
    mkdir -p "$CACHE"
    tmp=$(mktemp -d "$CACHE/.$name-$version.XXXXXX")
    trap 'rm -rf "$tmp"' EXIT
    say "$name $version: building $PKG@$version with $("$GO" version | cut -d' ' -f3) (nice 10; a first build downloads its modules from the Go module proxy)"
    start=$EPOCHREALTIME
    # Outside any module, so no go.mod around it takes part.
    if ! (cd "$tmp" && GOFLAGS=-trimpath GOBIN="$tmp" GOTOOLCHAIN=$TOOLCHAIN \
          nice -n 10 "$GO" install -ldflags "$LDFLAGS" "$PKG@$version" >&2); then
      say "FAILED to build $name $version ($PKG@$version): see go's messages above (module proxy unreachable? a Go older than the module needs: set its TOOLCHAIN in the recipe)"
      exit 1
    fi
    got=$("$tmp/$name" --version 2>&1 || true)
    [ "$got" = "$WANT" ] || { say "the $name just built says '$got' to --version, not '$WANT': not cached"; exit 1; }
    rm -rf "$dir"; mkdir -p "$dir"; mv "$tmp/$name" "$bin"; rm -rf "$tmp"; trap - EXIT
    say "$name $version: built in $(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.0f", b-a}')s, cached at $bin"
  fi
  if [ "$ONLY_PATH" = 1 ]; then echo "$bin"; else echo "$name $bin"; fi
done
