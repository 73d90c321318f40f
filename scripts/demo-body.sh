#!/usr/bin/env bash
# demo-body.sh - the demo itself, run as root on a kernel with VRF + SRv6 (scripts/demo.sh runs
# it on the host or in the VM). For now: the two-node SRv6 bed of the smoke test, shown with
# stock tools and torn down. Replace this body with the multi-node Lace demo.
#
# env: LACE_BED_BIN  the built lace-netns-bed binary (scripts/demo.sh sets it)
set -euo pipefail
exec "${LACE_BED_BIN:?run through scripts/demo.sh}"
