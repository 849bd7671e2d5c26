#!/usr/bin/env bash
# The evidence study (#42), shipped model, stage of SEEDS seeds per method. Resumable: the same command continues.
set -euo pipefail
ROOT=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
cd "$ROOT"
HERE=benchmarks/results/cpu-2core-amd-epyc/evidence
# SRC: the code the study runs, a folder holding src/ (default: this checkout); a snapshot keeps the commits made
# while the study runs out of its later runs:  git archive <commit> src | tar -x -C <snapshot>; SRC=<snapshot>
export PYTHONPATH="${SRC:-$ROOT}/src"
# Stage 2 (SEEDS=16) was started with JOBS=1 under `taskset -c 0` (other work on core 1; one thread per run either way)
# and stopped after its first 3 runs (seed 8 of grpo-n8, adaptive, PODS 32->8; in shipped/study/runs): the same
# command resumes from there. On a quiet machine JOBS=2 runs it in about 90 minutes.
exec .venv/bin/pods study \
  --methods grpo-n8,pods-mv-n32m8-pilot8c,pods-mv-n32m8,pods-random-n32m8-pilot8c \
  --variant "pilot8c=--pilot_generations 8 --adaptive_reward correctness_reward" \
  --seeds "${SEEDS:-8}" --updates 300 --eval-every 20 --eval-problems 400 --eval-k 4 --jobs "${JOBS:-2}" --drop-weights \
  --progress-every 300 --max-minutes "${MAX_MINUTES:-150}" --out "${OUT:-$HERE/rerun/shipped}"
