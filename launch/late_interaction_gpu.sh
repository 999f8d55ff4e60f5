#!/usr/bin/env bash
# The late-interaction job on InsuranceQA on one GPU, within a time budget: first the token
# curve (ColBERT with a trained projection, ME-BERT, small LITE, flattened LITE and KNRM at n =
# 300, 1,000, 3,000 and 12,889 training questions; LITE's and the table's curve are the CPU run's,
# README), then the full-n table: those rows (resumed from the curve's n = 12,889 checkpoints, not
# trained twice), LITE, LITE at the paper's widths, the table row and the distillation rows.
#
#   bash launch/late_interaction_gpu.sh            # inputs packed by launch/pack_device_inputs.py
#
# Both runs checkpoint in $WORK (git-ignored, under the repository): stopped at the budget, the
# same command on the same machine resumes where it stopped. Results, logs and the curve's plot go
# to $OUT (curve.json / curve.md / curve.png, full.json / full.md, curve.log, full.log).
#
# Environment: BUDGET_S (seconds for both runs, default 520), OUT (default runs/li_gpu_out), WORK
# (default runs/li_gpu), DATA (default .carry/insuranceqa), MODEL (default .carry/minilm_fp16),
# SIZES (default 300+1000+3000+12889), STEPS (default 2000), EVAL_EVERY (default 250), PYTHON
# (default python3), CURVE_ROWS (the curve's rows, quoted names joined by commas, holding 'dot'
# and 'colbert'; default all of the above: e.g. CURVE_ROWS="'dot','colbert','lite_small'" for
# the rows the 2-core CPU has not trained on the curve, README).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1   # paths below are the repository's

BUDGET_S=${BUDGET_S:-520}
OUT=${OUT:-runs/li_gpu_out}
WORK=${WORK:-runs/li_gpu}
DATA=${DATA:-.carry/insuranceqa}
MODEL=${MODEL:-.carry/minilm_fp16}
SIZES=${SIZES:-300+1000+3000+12889}
STEPS=${STEPS:-2000}
EVAL_EVERY=${EVAL_EVERY:-250}
PYTHON=${PYTHON:-python3}

source launch/budget_runs.sh
budget_start || exit 1

CURVE_ROWS=${CURVE_ROWS:-"'dot','colbert','colbert_proj','mebert','lite_small','lite_flat','knrm'"}
COMMON=(--config.data.path="${DATA}" --config.encoder.model="${MODEL}"
        --config.encoder.cache_dir="${WORK}/cache" --config.train.eval_every="${EVAL_EVERY}"
        --workdir="${WORK}/job")

# run NAME ARGS...: the job with ARGS under what is left of the budget (`budget_run`; its
# workdir is the same for both runs: the full run resumes the curve's checkpoints).
run() {
  local name=$1
  shift
  budget_run "${name}" "${WORK}/job" "${PYTHON}" -m bilinear_ir.main "$@" "${COMMON[@]}"
}

CONFIG="configs/late_interaction.py:collection=insuranceqa,steps=${STEPS}"
run curve --config="${CONFIG},distill=false,sizes=${SIZES}" \
  --config.rows="(${CURVE_ROWS},'hybrid')" || exit
run full --config="${CONFIG}" --config.rows="(${CURVE_ROWS},'lite','lite_paper','table','hybrid')"
