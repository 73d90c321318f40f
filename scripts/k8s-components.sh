#!/usr/bin/env bash
# k8s-components.sh - builds the real Kubernetes components the tests run Lace with, from Go
# modules at the versions pinned in scripts/k8s-versions, and caches them outside the
# repository: ${LACE_K8S_CACHE:-${XDG_CACHE_HOME:-~/.cache}/lace-k8s}/NAME-VERSION/bin.
# Idempotent: a component whose binaries are there and report the pinned version (each one's
# own --version) is not built again. Go is only for these test components; Lace is Rust.
#
# usage: scripts/k8s-components.sh [--path] [NAME...]
#   NAME    kubernetes | e2e | etcd | containerd | crictl | coredns | pause
#           (default: all of them but e2e, the upstream e2e suites' binary)
#   --path  print nothing but a PATH fragment: the bin dirs of NAME..., colon-separated
#           (builds what is missing first; build output goes to stderr)
# A component's build log is NAME-VERSION/build.log beside its bin dir. Concurrent runs wait
# for each other per component (flock).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VERSIONS=$ROOT/scripts/k8s-versions
CACHE=${LACE_K8S_CACHE:-${XDG_CACHE_HOME:-${HOME:-/root}/.cache}/lace-k8s}
say() { echo "k8s-components: $*" >&2; }
die() { say "ERROR: $*"; exit 1; }

PRINT_PATH=0 NAMES=()
while [ $# -gt 0 ]; do
  case $1 in
    --path) PRINT_PATH=1; shift;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0;;
    -*) die "unknown option $1 (see --help)";;
    *) NAMES+=("$1"); shift;;
  esac
done
[ ${#NAMES[@]} -gt 0 ] || NAMES=(kubernetes etcd containerd crictl coredns pause)

version_of() { # the pinned version of $1 (the kubernetes line for e2e and pause)
  local key=$1 v
  case $key in e2e|pause) key=kubernetes;; esac
  v=$(awk -v k="$key" '$1 == k { print $2; exit }' "$VERSIONS")
  [ -n "$v" ] || die "no version for '$key' in $VERSIONS: add a line '$key vX.Y.Z'"
  echo "$v"
}
dir_of() { echo "$CACHE/$1-$(version_of "$1")"; }

# The binaries each component provides, and the command whose output must name the version.
binaries() {
  case $1 in
    kubernetes) echo kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl kubeadm agnhost;;
    e2e) echo e2e.test;;
    etcd) echo etcd;;
    containerd) echo containerd containerd-shim-runc-v2 ctr;;
    crictl) echo crictl;;
    coredns) echo coredns;;
    pause) echo pause;;
    *) die "unknown component '$1' (kubernetes, e2e, etcd, containerd, crictl, coredns, pause)";;
  esac
}
version_line() { # BIN DIR: what BIN says its version is
  local b=$1 d=$2
  case $b in
    kubectl) "$d/$b" version --client 2>&1;;
    kubeadm) "$d/$b" version -o short 2>&1;;
    agnhost) "$d/$b" --version 2>&1 || true;;
    e2e.test) "$d/$b" --version 2>&1;;
    containerd-shim-runc-v2) "$d/$b" -v 2>&1;;
    ctr|crictl) "$d/$b" --version 2>&1;;
    coredns) "$d/$b" -version 2>&1;;
    pause) "$d/$b" -v 2>&1;;
    *) "$d/$b" --version 2>&1;;
  esac
}
# agnhost prints its own release (not Kubernetes'); checked to run, not for the version.
expected_in() { case $1 in agnhost) echo "";; *) echo "${2#v}";; esac; }

# How a component is built (its builder and what that calls): a change rebuilds it.
recipe_of() {
  { declare -f "build_$1" k8s_ldflags k8s_module; echo "$GOFLAGS $CGO_ENABLED"; } | md5sum | cut -c1-12
}

# Is the component at DIR complete, at its version and built by today's recipe? Writes
# DIR/VERSIONS when it is.
verify() {
  local name=$1 dir=$2 v b line want
  v=$(version_of "$name")
  [ "$(cat "$dir/RECIPE" 2>/dev/null)" = "$(recipe_of "$name")" ] || return 1
  : > "$dir/VERSIONS.tmp"
  for b in $(binaries "$name"); do
    [ -x "$dir/bin/$b" ] || { rm -f "$dir/VERSIONS.tmp"; return 1; }
    line=$(version_line "$b" "$dir/bin" | head -3 | tr '\n' ' ')
    want=$(expected_in "$b" "$v")
    case $line in *"$want"*) ;; *) say "$dir/bin/$b reports '$line', not $v"; rm -f "$dir/VERSIONS.tmp"; return 1;; esac
    echo "$b: $line" >> "$dir/VERSIONS.tmp"
  done
  mv "$dir/VERSIONS.tmp" "$dir/VERSIONS"
}

command -v go >/dev/null || [ ! -x /usr/local/go/bin/go ] || PATH=$PATH:/usr/local/go/bin
command -v go >/dev/null || die "go not found (in PATH or /usr/local/go/bin): install Go 1.26 or newer (Debian's golang-go is too old)"
# Static binaries (as the upstream releases): agnhost and CoreDNS run in images without a libc.
# containerd keeps cgo (its btrfs and seccomp support); it runs on the VM's root filesystem.
export GOFLAGS="-trimpath -buildvcs=false" CGO_ENABLED=0 GOTOOLCHAIN=${GOTOOLCHAIN:-local}

# ---- builders: each fills $dir/bin; $src is a scratch dir for its Go module.
k8s_ldflags() {
  local v=$1 minor
  minor=$(echo "$v" | cut -d. -f2)
  local p
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    printf -- '-X %s.gitVersion=%s -X %s.gitMajor=1 -X %s.gitMinor=%s -X %s.gitTreeState=clean ' \
      "$p" "$v" "$p" "$p" "$minor" "$p"
  done
  echo "-s -w"
}
# A Go module that requires k8s.io/kubernetes at $v: its go.mod requires the staging modules
# at v0.0.0 (they live in its own tree), so each is routed to its published v0.<minor>.<patch>.
k8s_module() {
  local v=$1 src=$2 gomod m
  mkdir -p "$src"
  gomod=$(cd "$src" && GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@$v" |
    sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p')
  [ -f "$gomod" ] || die "could not download k8s.io/kubernetes@$v from the Go module proxy"
  {
    printf 'module lace.test/kubernetes\n\ngo %s\n\nrequire k8s.io/kubernetes %s\n\n' \
      "$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$gomod")" "$v"
    for m in $(awk '$2 == "=>" && $3 ~ /^\.\/staging\// { print $1 }' "$gomod"); do
      echo "replace $m => $m v0.${v#v1.}"
    done
  } > "$src/go.mod"
  printf '//go:build tools\n\npackage tools\n\nimport (\n' > "$src/tools.go"
  for m in cmd/kube-apiserver cmd/kube-controller-manager cmd/kube-scheduler cmd/kubelet \
           cmd/kube-proxy cmd/kubectl cmd/kubeadm test/images/agnhost test/e2e; do
    printf '\t_ "k8s.io/kubernetes/%s"\n' "$m" >> "$src/tools.go"
  done
  echo ')' >> "$src/tools.go"
  (cd "$src" && go mod tidy)
}
build_kubernetes() {
  local v=$1 dir=$2 src=$3
  k8s_module "$v" "$src"
  (cd "$src" && go build -ldflags "$(k8s_ldflags "$v")" -o "$dir/bin/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet \
    k8s.io/kubernetes/cmd/kube-proxy k8s.io/kubernetes/cmd/kubectl \
    k8s.io/kubernetes/cmd/kubeadm k8s.io/kubernetes/test/images/agnhost)
}
build_e2e() {
  local v=$1 dir=$2 src=$3
  k8s_module "$v" "$src"
  (cd "$src" && go test -c -ldflags "$(k8s_ldflags "$v")" -o "$dir/bin/e2e.test" k8s.io/kubernetes/test/e2e)
}
build_pause() {
  local v=$1 dir=$2 src=$3 modsrc
  mkdir -p "$src"
  modsrc=$(cd "$src" && go mod download -json "k8s.io/kubernetes@$v" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  [ -f "$modsrc/build/pause/linux/pause.c" ] || die "k8s.io/kubernetes@$v has no build/pause/linux/pause.c"
  command -v gcc >/dev/null || die "gcc not found (apt-get install gcc libc6-dev)"
  gcc -Os -Wall -Werror -static -DVERSION="$v" -o "$dir/bin/pause" "$modsrc/build/pause/linux/pause.c"
  strip "$dir/bin/pause"
}
build_etcd() {
  local v=$1 dir=$2 src=$3
  # etcd's server module replaces its sibling modules with relative paths (its own tree), which
  # `go install pkg@version` refuses: build it from a module that requires it.
  mkdir -p "$src"
  printf 'module lace.test/etcd\n\ngo 1.26.0\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$v" > "$src/go.mod"
  printf '//go:build tools\n\npackage tools\n\nimport _ "go.etcd.io/etcd/server/v3"\n' > "$src/tools.go"
  (cd "$src" && go mod tidy &&
    go build -ldflags "-s -w" -o "$dir/bin/etcd" go.etcd.io/etcd/server/v3)
}
build_containerd() {
  local v=$1 dir=$2
  local m=github.com/containerd/containerd/v2
  CGO_ENABLED=1 GOBIN=$dir/bin go install -ldflags "-s -w -X $m/version.Version=$v -X $m/version.Revision=module" \
    "$m/cmd/containerd@$v" "$m/cmd/containerd-shim-runc-v2@$v" "$m/cmd/ctr@$v"
}
build_crictl() {
  local v=$1 dir=$2
  GOBIN=$dir/bin go install -ldflags "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=${v#v}" \
    "sigs.k8s.io/cri-tools/cmd/crictl@$v"
}
build_coredns() {
  local v=$1 dir=$2
  GOBIN=$dir/bin go install -ldflags "-s -w" "github.com/coredns/coredns@$v"
}

ensure() {
  local name=$1 v dir start
  v=$(version_of "$name")
  dir=$(dir_of "$name")
  mkdir -p "$CACHE"
  exec 9>"$CACHE/.lock-$name"
  flock 9
  if [ -f "$dir/VERSIONS" ] && verify "$name" "$dir" 2>/dev/null; then
    exec 9>&-
    return 0
  fi
  say "building $name $v into $dir (log: $dir/build.log)"
  start=$EPOCHREALTIME
  rm -rf "$dir.tmp"
  mkdir -p "$dir.tmp/bin"
  if ! ( "build_$name" "$v" "$dir.tmp" "$CACHE/src/$name-$v" ) > "$dir.tmp/build.log" 2>&1; then
    tail -30 "$dir.tmp/build.log" >&2
    die "building $name $v failed; the whole log is $dir.tmp/build.log"
  fi
  recipe_of "$name" > "$dir.tmp/RECIPE"
  rm -rf "$dir"
  mv "$dir.tmp" "$dir"
  verify "$name" "$dir" || die "$name $v was built but does not report its version (see $dir/build.log)"
  say "built $name $v in $(awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN{printf "%.0f", b-a}')s"
  exec 9>&-
}

paths=()
for n in "${NAMES[@]}"; do
  binaries "$n" >/dev/null
  ensure "$n"
  paths+=("$(dir_of "$n")/bin")
done
if [ "$PRINT_PATH" = 1 ]; then
  (IFS=:; echo "${paths[*]}")
else
  for n in "${NAMES[@]}"; do say "$n $(version_of "$n"): $(dir_of "$n")/bin"; done
fi
