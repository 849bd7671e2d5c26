#!/usr/bin/env bash
# The shipped-model adaptive study on a quiet machine (#32): more seeds, finer evaluation. Resumable: the same
# command continues. OUT: its folder (default rerun/ beside this file; the filed study ran in another folder).
set -euo pipefail
ROOT=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
cd "$ROOT"
HERE=benchmarks/results/cpu-2core-amd-epyc/adaptive_quiet
# SRC: the code the study runs, a folder holding src/ (default: this checkout); a snapshot keeps the commits made
# while the study runs out of its later runs:  git archive <commit> src | tar -x -C <snapshot>; SRC=<snapshot>
export PYTHONPATH="${SRC:-$ROOT}/src"
exec .venv/bin/pods study \
  --methods grpo-n8,pods-mv-n32m8,pods-mv-n32m8-pilot8c,pods-random-n32m8-pilot8c \
  --variant "pilot8c=--pilot_generations 8 --adaptive_reward correctness_reward" \
  --seeds 8 --updates 120 --eval-every 10 --eval-problems 400 --eval-k 4 --jobs 2 --drop-weights \
  --progress-every 300 --max-minutes 20 --out "${OUT:-$HERE/rerun}"
