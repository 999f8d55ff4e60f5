#!/usr/bin/env bash
# Issue 41's fine-tunes of all-MiniLM-L6-v2 on InsuranceQA on one GPU, within a time budget:
#   peer   benchmarks/finetune_peer.py: the project's two-tower fine-tune and sentence-
#          transformers' (torch, CUDA) on the same triplets, in the same run, every test question
#          ranked over the whole corpus: quality (nDCG@10) and training examples/s, one JSON.
#   table  the finetune job (configs/finetune.py): dot, BM25, the learned similarities over the
#          frozen embeddings, the query-tower and two-tower fine-tunes and the hybrid, vs dot on
#          all test questions and on the unseen-answer ones, with what each row recovers and costs.
#   late   the late-interaction job's fine-tuned rows (de_ft, colbert_ft, lite_ft) beside dot and
#          the frozen ColBERT: LITE fine-tuned jointly against ColBERT fine-tuned (paper 004).
#   curve  (not in the default RUNS) the learning curve of MiniLM mean at n = CURVE_SIZES with the
#          query-tower and two-tower fine-tunes as rows beside the learned similarities.
#
#   bash launch/finetune_gpu.sh            # inputs packed by launch/pack_device_inputs.py
#
# Each run keeps its checkpoints in $WORK (git-ignored, under the repository): stopped at the
# budget, the same command on the same machine resumes (the peer, which has none, starts over),
# and a finished run is only copied. Results and logs go to $OUT (NAME.json / NAME.md / NAME.log).
# The peer needs sentence-transformers (and transformers, datasets, accelerate) importable: where
# they are not, the peer stops with exit 1 and the other runs go on.
#
# Environment: BUDGET_S (seconds for all runs, default 520), OUT (default runs/ft_gpu_out), WORK
# (default runs/ft_gpu), DATA (default .carry/insuranceqa), MODEL (default .carry/minilm_fp16),
# RUNS (default "peer table late"), BATCH (queries per step, default 64), STEPS (fine-tune steps,
# default 202: one epoch of the 12,889 training questions), EVAL_EVERY (the table's fine-tunes'
# dev cadence in steps, default STEPS / 2: the two-tower one re-encodes the corpus each time),
# LATE_STEPS (the fine-tuned late-interaction rows' steps, default 806: one epoch at their batch
# of 16), CURVE_SIZES (default 1000+3000+12889), PYTHON (default python3).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1   # paths below are the repository's

BUDGET_S=${BUDGET_S:-520}
OUT=${OUT:-runs/ft_gpu_out}
WORK=${WORK:-runs/ft_gpu}
DATA=${DATA:-.carry/insuranceqa}
MODEL=${MODEL:-.carry/minilm_fp16}
RUNS=${RUNS:-peer table late}
BATCH=${BATCH:-64}
STEPS=${STEPS:-202}
EVAL_EVERY=${EVAL_EVERY:-$((STEPS / 2 > 0 ? STEPS / 2 : 1))}
LATE_STEPS=${LATE_STEPS:-806}
CURVE_SIZES=${CURVE_SIZES:-1000+3000+12889}
PYTHON=${PYTHON:-python3}

source launch/budget_runs.sh
budget_start || exit 1

JOB=(--config.data.path="${DATA}" --config.encoder.model="${MODEL}"
     --config.encoder.cache_dir="${WORK}/cache")
status=0
for name in ${RUNS}; do
  case ${name} in
    peer)
      mkdir -p "${WORK}/peer"
      budget_run peer "${WORK}/peer" bash -c '"$0" benchmarks/finetune_peer.py "${@:2}" \
          > "$1/results.tmp" && mv "$1/results.tmp" "$1/results.json" && cat "$1/results.json"' \
        "${PYTHON}" "${WORK}/peer" --collection insuranceqa --data_path "${DATA}" \
        --model "${MODEL}" --steps "${STEPS}" --batch_size "${BATCH}" --max_length 256 \
        --warmup "$((STEPS / 10))" --docs 0 --cache_dir "${WORK}/cache" ;;
    table)
      budget_run table "${WORK}/table" "${PYTHON}" -m bilinear_ir.main \
        --config="configs/finetune.py:collection=insuranceqa,steps=${STEPS}" \
        --config.finetune.batch_size="${BATCH}" --config.finetune.eval_every="${EVAL_EVERY}" \
        "${JOB[@]}" --workdir="${WORK}/table" ;;
    late)
      budget_run late "${WORK}/late" "${PYTHON}" -m bilinear_ir.main \
        --config="configs/late_interaction.py:collection=insuranceqa,distill=false" \
        --config.rows="('dot','colbert','de_ft','colbert_ft','lite_ft','hybrid')" \
        --config.finetune.steps="${LATE_STEPS}" \
        --config.finetune.eval_every="$((LATE_STEPS / 4))" "${JOB[@]}" \
        --workdir="${WORK}/late" ;;
    curve)
      budget_run curve "${WORK}/curve" "${PYTHON}" -m bilinear_ir.main \
        --config="configs/learning_curve.py:collection=insuranceqa,embeddings=mean,seeds=0,\
sizes=${CURVE_SIZES},finetunes=query_tower+two_tower" --config.finetune.batch_size="${BATCH}" \
        "${JOB[@]}" --workdir="${WORK}/curve" ;;
    *) echo "unknown run ${name} (RUNS: peer, table, late, curve)"; exit 2 ;;
  esac
  rc=$?
  if ((rc == 124)); then exit 124; fi   # the budget is spent: later runs would not start either
  if ((rc != 0)); then status=${rc}; fi
done
exit "${status}"
