#!/usr/bin/env bash
# The evidence study (#42), part 4 (PLAN.md): the shipped model, GRPO vs adaptive PODS on fresh seeds 32 onwards,
# SEEDS seeds per method (a stage: 8, 16, 24, 32). Resumable: the same command continues. Before the first run:
#   git archive <the commit that adds part 4> src | tar -x -C <snapshot>   (then SRC=<snapshot>)
#   mkdir -p "$OUT" && cp shipped/cost.json "$OUT"/   (OUT: the study's folder, default rerun/shipped-levels here)
set -euo pipefail
ROOT=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
cd "$ROOT"
HERE=benchmarks/results/cpu-2core-amd-epyc/evidence
# SRC: the code the study runs, a folder holding src/ (default: this checkout); a snapshot keeps the commits made
# while the study runs out of its later runs:  git archive <commit> src | tar -x -C <snapshot>; SRC=<snapshot>
export PYTHONPATH="${SRC:-$ROOT}/src"
OUT=${OUT:-$HERE/rerun/shipped-levels}
exec .venv/bin/pods study \
  --methods grpo-n8,pods-mv-n32m8-pilot8c \
  --variant "pilot8c=--pilot_generations 8 --adaptive_reward correctness_reward" --first-seed 32 \
  --seeds "${SEEDS:-8}" --updates 300 --eval-every 20 --eval-problems 400 --eval-k 4 --jobs "${JOBS:-2}" --drop-weights \
  --progress-every 300 --max-minutes "${MAX_MINUTES:-150}" --out "$OUT"
