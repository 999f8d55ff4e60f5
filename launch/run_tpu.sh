#!/usr/bin/env bash
# Run one bilinear_ir config on a Cloud TPU VM (single- or multi-host), then delete the VM.
#
# Usage:
#   CONFIG=configs/synthetic_agreement.py launch/run_tpu.sh
#   TPU_NAME=my-tpu ZONE=us-central2-b ACCELERATOR_TYPE=v4-16 \
#     CONFIG="configs/synthetic_agreement.py:seed=1" EXTRA_ARGS="--config.num_test=5000" \
#     launch/run_tpu.sh
#
# Steps: create the TPU VM -> copy this checkout to every worker -> install jax[tpu] and the
# package on every worker -> run `python -m bilinear_ir.main --config=$CONFIG --workdir=$WORKDIR
# --config.distributed=True` on --worker=all (main calls jax.distributed.initialize(); process 0
# writes the outputs) -> copy $WORKDIR back from worker 0 -> delete the VM (also on failure or
# Ctrl-C, unless KEEP_VM=1).
#
# Environment (defaults in brackets):
#   TPU_NAME          name of the TPU VM to create                      [bilinear-ir-$USER]
#   ZONE              zone with TPU capacity                            [us-central2-b]
#   ACCELERATOR_TYPE  slice type, e.g. v4-8 (one host), v4-16 (two)     [v4-8]
#   VERSION           TPU VM software version (runtime image)           [tpu-ubuntu2204-base]
#   PROJECT           gcloud project; empty uses gcloud's default       []
#   CREATE_FLAGS      extra flags for `tpu-vm create`, e.g. "--spot"    []
#   CONFIG            config file[:args] relative to the repo root      [configs/synthetic_agreement.py]
#   WORKDIR           output folder on the workers                      [/tmp/bilinear_ir_run]
#   EXTRA_ARGS        extra flags for bilinear_ir.main ("--config.x=y") []
#   DISTRIBUTED       1: pass --config.distributed=True (the config must
#                     have a `distributed` field)                       [1]
#   JAX_SPEC          pip requirement for jax on TPU                    [jax[tpu]>=0.10,<0.11]
#   LOCAL_OUT         where the results land here (relative: to the repo
#                     root; runs/ is git-ignored)                      [runs/tpu/$TPU_NAME]
#   KEEP_VM           1: do not delete the VM at the end                [0]
#
# Needs: gcloud (authenticated, TPU API enabled), tar, git (to list the files of this checkout).
set -euo pipefail

TPU_NAME="${TPU_NAME:-bilinear-ir-${USER:-user}}"
ZONE="${ZONE:-us-central2-b}"
ACCELERATOR_TYPE="${ACCELERATOR_TYPE:-v4-8}"
VERSION="${VERSION:-tpu-ubuntu2204-base}"
PROJECT="${PROJECT:-}"
CREATE_FLAGS="${CREATE_FLAGS:-}"
CONFIG="${CONFIG:-configs/synthetic_agreement.py}"
WORKDIR="${WORKDIR:-/tmp/bilinear_ir_run}"
EXTRA_ARGS="${EXTRA_ARGS:-}"
DISTRIBUTED="${DISTRIBUTED:-1}"
JAX_SPEC="${JAX_SPEC:-jax[tpu]>=0.10,<0.11}"
LOCAL_OUT="${LOCAL_OUT:-runs/tpu/${TPU_NAME}}"
KEEP_VM="${KEEP_VM:-0}"

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "${REPO_ROOT}"  # relative LOCAL_OUT paths are under the repo root
GCLOUD_FLAGS=(--zone="${ZONE}")
if [[ -n "${PROJECT}" ]]; then
  GCLOUD_FLAGS+=(--project="${PROJECT}")
fi
STAGING="$(mktemp -d -t bilinear_ir.XXXXXX)"
TARBALL="${STAGING}/bilinear_ir.tgz"

log() { echo "[run_tpu] $*" >&2; }

cleanup() {
  local status=$?
  rm -rf "${STAGING}"
  if [[ "${KEEP_VM}" != "1" ]]; then
    log "deleting ${TPU_NAME}"
    gcloud compute tpus tpu-vm delete "${TPU_NAME}" "${GCLOUD_FLAGS[@]}" --quiet || \
      log "delete failed: remove ${TPU_NAME} by hand"
  else
    log "KEEP_VM=1: ${TPU_NAME} left running"
  fi
  exit "${status}"
}

on_all_workers() {
  gcloud compute tpus tpu-vm ssh "${TPU_NAME}" "${GCLOUD_FLAGS[@]}" --worker=all --command="$1"
}

log "creating ${TPU_NAME} (${ACCELERATOR_TYPE}, ${VERSION}) in ${ZONE}"
# shellcheck disable=SC2086  # CREATE_FLAGS is a list of flags
gcloud compute tpus tpu-vm create "${TPU_NAME}" "${GCLOUD_FLAGS[@]}" \
  --accelerator-type="${ACCELERATOR_TYPE}" --version="${VERSION}" ${CREATE_FLAGS}
trap cleanup EXIT
trap "exit 130" INT TERM  # goes through the EXIT trap

log "copying this checkout (tracked + untracked, not ignored files) to every worker"
git ls-files -z --cached --others --exclude-standard | tar --null -czf "${TARBALL}" -T -
gcloud compute tpus tpu-vm scp "${TARBALL}" "${TPU_NAME}:bilinear_ir.tgz" "${GCLOUD_FLAGS[@]}" \
  --worker=all

log "installing ${JAX_SPEC} and the package on every worker"
on_all_workers "set -e; rm -rf ~/bilinear_ir && mkdir -p ~/bilinear_ir && \
tar -xzf ~/bilinear_ir.tgz -C ~/bilinear_ir && cd ~/bilinear_ir && \
python3 -m pip install -q -U pip && python3 -m pip install -q $(printf '%q' "${JAX_SPEC}") && \
python3 -m pip install -q -e ."

RUN_FLAGS="--config=$(printf '%q' "${CONFIG}") --workdir=$(printf '%q' "${WORKDIR}")"
if [[ "${DISTRIBUTED}" == "1" ]]; then
  RUN_FLAGS+=" --config.distributed=True"
fi
log "running ${CONFIG} on all workers"
on_all_workers "set -e; cd ~/bilinear_ir && python3 -m bilinear_ir.main ${RUN_FLAGS} ${EXTRA_ARGS}"

log "copying ${WORKDIR} from worker 0 to ${LOCAL_OUT}"
mkdir -p "${LOCAL_OUT}"
gcloud compute tpus tpu-vm scp --recurse "${TPU_NAME}:${WORKDIR}/*" "${LOCAL_OUT}/" \
  "${GCLOUD_FLAGS[@]}" --worker=0
log "done: ${LOCAL_OUT}"
