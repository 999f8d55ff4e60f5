#!/usr/bin/env bash
# The one-command accelerator check (run it ON the GPU / TPU machine, from any folder).
#
# Usage:
#   launch/accelerator_check.sh --out DIR           # full sizes; outputs in DIR
#   OUT=/tmp/acc launch/accelerator_check.sh
#   launch/accelerator_check.sh --reduced           # CPU sizes: the whole check in about 2 minutes
#   launch/accelerator_check.sh --steps tests_device,topk
#   launch/accelerator_check.sh --kernels --out DIR  # issue 42: XLA scan + 3xTF32 (<= 300 s)
#
# The GPU scan sweep (benchmarks/gpu_sweep.py, about 220 s) is a separate command, not a step
# here: the steps' limits already fill this check's budget.
#
# Runs benchmarks/accelerator_check.py: the exactness and sharding tests on the device, then the
# top-k, MoL, training-throughput, streamed top-k and fidelity benchmarks, each writing its JSON,
# within BUDGET_S seconds for the whole check (default 450: under 8 minutes with the wheel
# install and start-up). Writes one OUT/summary.json and one log (+ JSON) per step. Exit status
# 0 when every step passed.
#
# Python packages the machine lacks (a GPU image without ml-collections, faiss-cpu or
# pytrec-eval-terrier) are installed from the wheels in $WHEELS, when it holds any and one of
# them is missing: into a temporary folder put first on PYTHONPATH, with no index (offline).
#
# Environment (defaults in brackets):
#   OUT       output folder (relative to the repo root or absolute)   [runs/accelerator_check]
#   PYTHON    interpreter with jax (+ the accelerator plugin) and this package's needs  [python3]
#   BUDGET_S  seconds for the whole check                               [450]
#   WHEELS    folder of .whl files for missing packages                 [.whl in the repo root]
set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${REPO_ROOT}"

OUT="${OUT:-runs/accelerator_check}"
PYTHON="${PYTHON:-python3}"
BUDGET_S="${BUDGET_S:-450}"
WHEELS="${WHEELS:-${REPO_ROOT}/.whl}"

if ! "${PYTHON}" -c "import ml_collections, faiss, pytrec_eval" 2>/dev/null; then
  if compgen -G "${WHEELS}/*.whl" >/dev/null; then
    SITE="$(mktemp -d)"
    echo "installing the wheels of ${WHEELS} into ${SITE} (a package was missing)"
    "${PYTHON}" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "${SITE}" "${WHEELS}"/*.whl
    export PYTHONPATH="${SITE}${PYTHONPATH:+:${PYTHONPATH}}"
  fi
  "${PYTHON}" -c "import ml_collections" || {
    echo "ml_collections is missing: put its wheel in ${WHEELS} (launch/README.md)" >&2
    exit 2
  }
fi

exec "${PYTHON}" benchmarks/accelerator_check.py --out "${OUT}" --budget-s "${BUDGET_S}" "$@"
