#!/usr/bin/env bash
# The one-command accelerator check (run it ON the GPU / TPU machine, from any folder).
#
# Usage:
#   launch/accelerator_check.sh                # full sizes; outputs in $OUT
#   OUT=/tmp/acc launch/accelerator_check.sh
#   launch/accelerator_check.sh --reduced      # CPU-sized: the whole check on a CPU in minutes
#   launch/accelerator_check.sh --steps tests_device,topk
#
# Runs benchmarks/accelerator_check.py: the exactness and sharding tests on the device, then the
# top-k, streamed top-k, training-throughput, MoL and fidelity benchmarks, each writing its JSON,
# within BUDGET_S seconds for all steps (default 450: under 8 minutes with start-up). Writes
# OUT/summary.md, OUT/summary.json and one log (+ JSON) per step. Exit status 0 when every step
# passed.
#
# Environment (defaults in brackets):
#   OUT       output folder (relative to the repo root or absolute)   [runs/accelerator_check]
#   PYTHON    interpreter with jax (+ the accelerator plugin) and this package  [python3]
#   BUDGET_S  seconds for all steps together                           [450]
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${REPO_ROOT}"

OUT="${OUT:-runs/accelerator_check}"
PYTHON="${PYTHON:-python3}"
BUDGET_S="${BUDGET_S:-450}"

exec "${PYTHON}" benchmarks/accelerator_check.py --out "${OUT}" --budget-s "${BUDGET_S}" "$@"
