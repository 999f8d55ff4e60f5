#!/usr/bin/env bash
# Run one bilinear_ir config on a single-GPU machine (run it ON that machine, from any folder).
#
# Usage:
#   launch/run_gpu.sh
#   CONFIG="configs/synthetic_agreement.py:seed=1" WORKDIR=runs/agreement launch/run_gpu.sh
#   SKIP_INSTALL=1 EXTRA_ARGS="--config.num_test=5000" launch/run_gpu.sh
#
# Steps: make (or reuse) a virtual environment -> pip install jax[cuda12] and this checkout ->
# check that jax sees a GPU -> `python -m bilinear_ir.main --config=$CONFIG --workdir=$WORKDIR`.
#
# Environment (defaults in brackets):
#   CONFIG        config file[:args] relative to the repo root        [configs/synthetic_agreement.py]
#   WORKDIR       output folder (relative to the repo root or absolute) [runs/gpu]
#   EXTRA_ARGS    extra flags for bilinear_ir.main ("--config.x=y")    []
#   VENV          virtual environment folder; empty: use PYTHON as is   [.venv]
#   PYTHON        interpreter that creates / is the environment         [python3]
#   JAX_SPEC      pip requirement for jax with CUDA                     [jax[cuda12]>=0.10,<0.11]
#   SKIP_INSTALL  1: install nothing (offline machine, jax already set up) [0]
#   ALLOW_CPU     1: run even if jax finds no GPU                        [0]
#
# Needs: an NVIDIA driver recent enough for CUDA 12 (the CUDA libraries come from pip).
set -euo pipefail

CONFIG="${CONFIG:-configs/synthetic_agreement.py}"
WORKDIR="${WORKDIR:-runs/gpu}"
EXTRA_ARGS="${EXTRA_ARGS:-}"
VENV="${VENV-.venv}"
PYTHON="${PYTHON:-python3}"
JAX_SPEC="${JAX_SPEC:-jax[cuda12]>=0.10,<0.11}"
SKIP_INSTALL="${SKIP_INSTALL:-0}"
ALLOW_CPU="${ALLOW_CPU:-0}"

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${REPO_ROOT}"

log() { echo "[run_gpu] $*" >&2; }

if [[ -n "${VENV}" ]]; then
  if [[ ! -x "${VENV}/bin/python" ]]; then
    log "creating virtual environment ${VENV}"
    "${PYTHON}" -m venv "${VENV}"
  fi
  PYTHON="${VENV}/bin/python"
fi

if [[ "${SKIP_INSTALL}" != "1" ]]; then
  log "installing ${JAX_SPEC} and the package"
  "${PYTHON}" -m pip install -q -U pip
  "${PYTHON}" -m pip install -q "${JAX_SPEC}"
  "${PYTHON}" -m pip install -q -e .
fi

BACKEND="$("${PYTHON}" -c 'import jax; print(jax.default_backend())')"
log "jax backend: ${BACKEND}"
if [[ "${BACKEND}" != "gpu" && "${ALLOW_CPU}" != "1" ]]; then
  log "jax found no GPU (backend ${BACKEND}); check nvidia-smi and JAX_SPEC, or set ALLOW_CPU=1"
  exit 1
fi

log "running ${CONFIG} -> ${WORKDIR}"
# shellcheck disable=SC2086  # EXTRA_ARGS is a list of flags
"${PYTHON}" -m bilinear_ir.main --config="${CONFIG}" --workdir="${WORKDIR}" ${EXTRA_ARGS}
log "done: ${WORKDIR}"
