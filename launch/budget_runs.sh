# Sourced by the GPU scripts (launch/late_interaction_gpu.sh, launch/finetune_gpu.sh): runs under
# one time budget, each resumable and copied, never run twice.
#
# Needs: BUDGET_S (seconds for all runs), OUT (results and logs), WORK (checkpoints and finished
# runs, under $WORK/done), PYTHON. `budget_start` first, then `budget_run` per run.
#
# budget_run NAME JOBDIR CMD...: runs CMD under what is left of the budget (SIGTERM at the end:
# a job keeps its last checkpoint) with its output appended to $OUT/NAME.log. On success the
# run's JOBDIR/results.md, any JOBDIR/*.png (moved) and JOBDIR/results.json (last: it marks
# the run done) go to $WORK/done/NAME.* and from there to $OUT. A run finished by an earlier
# call is only copied; with under 30 s left nothing starts (returns 124). Returns CMD's status.
budget_run() {
  local name=$1 jobdir=$2 left rc f
  shift 2
  mkdir -p "${WORK}/done" "${OUT}"
  if [[ -f "${WORK}/done/${name}.json" ]]; then
    echo "${name}: finished by an earlier call" | tee -a "${OUT}/${name}.log"
    cp "${WORK}/done/${name}".* "${OUT}/"
    return 0
  fi
  left=$((END - SECONDS))
  if ((left < 30)); then
    echo "${name}: skipped, ${left} s of the budget left" | tee -a "${OUT}/${name}.log"
    return 124
  fi
  echo "${name}: start with ${left} s left" | tee -a "${OUT}/${name}.log"
  timeout --signal=TERM --kill-after=20 "$((left - 10))" "$@" 2>&1 | tee -a "${OUT}/${name}.log"
  rc=${PIPESTATUS[0]}
  echo "${name}: rc ${rc} at ${SECONDS} s" | tee -a "${OUT}/${name}.log"
  if ((rc == 0)); then
    for f in "${jobdir}"/*.png; do
      [[ -e "${f}" ]] && mv "${f}" "${WORK}/done/${name}.png"
    done
    if [[ -f "${jobdir}/results.md" ]]; then
      cp "${jobdir}/results.md" "${WORK}/done/${name}.md"
    fi
    cp "${jobdir}/results.json" "${WORK}/done/${name}.json"
    for f in "${WORK}/done/${name}".*; do cp "${f}" "${OUT}/"; done
  fi
  return "${rc}"
}

# budget_start: sets END (the budget's end, in bash SECONDS), makes OUT and WORK, unbuffers
# python's output, installs the carried wheels (.carry/whl, `launch/pack_device_inputs.py`)
# where the machine's python lacks the project's dependencies and puts the repository on
# PYTHONPATH.
budget_start() {
  END=$((SECONDS + BUDGET_S))
  mkdir -p "${OUT}" "${WORK}"
  export PYTHONUNBUFFERED=1
  if ! "${PYTHON}" -c "import ml_collections, pytrec_eval" 2>/dev/null; then
    "${PYTHON}" -m pip install -q --no-index --no-deps --target /tmp/site .carry/whl/*.whl \
      || return 1
    export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
  fi
  export PYTHONPATH=.:${PYTHONPATH:-}
}
