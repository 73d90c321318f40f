#!/usr/bin/env bash
# Chart tier: both charts rendered by the real helm 3 and helm 4, strict schema validation for
# Kubernetes 1.33-1.37, the values contract and schema, install/upgrade/uninstall against a
# fake API server, the admission policies' CEL on the corpus the Rust validator judges, and the
# rendered Networks checked by Lace's own validator.
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
python3 -c 'import pytest' 2>/dev/null || need+=(pytest)
python3 -c 'import yaml' 2>/dev/null || need+=(pyyaml)
command -v kubernetes-validate >/dev/null || need+=(kubernetes-validate)
python3 -c 'import celpy' 2>/dev/null || need+=(cel-python)
python3 -c 'import jsonschema' 2>/dev/null || need+=(jsonschema)
if [ ${#need[@]} -gt 0 ]; then
  python3 -m pip install -q --disable-pip-version-check "${need[@]}" ||
    { echo "test-charts: could not pip install ${need[*]}" >&2; exit 1; }
fi
./scripts/install-helm.sh >/dev/null
# The rendered Networks are also checked by Lace's own validator: lace-agent from LACE_BIN_DIR
# when given (scripts/test.sh passes its test build's), else built here.
if [ -n "${LACE_BIN_DIR:-}" ]; then
  export LACE_AGENT=$LACE_BIN_DIR/lace-agent
else
  cargo build -q -p lace --bin lace-agent
  export LACE_AGENT="${CARGO_TARGET_DIR:-$PWD/target}/debug/lace-agent"
fi
[ -x "$LACE_AGENT" ] || { echo "test-charts: $LACE_AGENT is missing or not executable" >&2; exit 1; }
exec python3 -m pytest -q tests/charts "$@"
