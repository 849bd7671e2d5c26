#!/usr/bin/env bash
# The evidence study (#42), strong model (PLAN.md, "The strong model"), stage of SEEDS seeds per method.
# Resumable: the same command continues (`pods study` skips finished runs; a run stopped by --max-minutes resumes
# from its checkpoint). Before the first run: the model is built once into strong/model/ (committed), and
# `git archive <the plan's commit> src | tar -x -C <snapshot>` makes the code snapshot (SRC=<snapshot>).
set -euo pipefail
ROOT=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
cd "$ROOT"
HERE=benchmarks/results/cpu-2core-amd-epyc/evidence
# SRC: the code the study runs, a folder holding src/ (default: this checkout); a snapshot keeps the commits made
# while the study runs out of its later runs:  git archive <commit> src | tar -x -C <snapshot>; SRC=<snapshot>
export PYTHONPATH="${SRC:-$ROOT}/src"
exec .venv/bin/pods study --config tiny --model_name_or_path "$HERE/strong/model" \
  --methods grpo-n16,pods-mv-n64m16-pilot16c,pods-mv-n64m16,pods-random-n64m16-pilot16c \
  --variant "pilot16c=--pilot_generations 16 --adaptive_reward correctness_reward" \
  --m 16 --prompts-per-step 8 --learning_rate 1e-4 \
  --seeds "${SEEDS:-8}" --updates 300 --eval-every 25 --eval-problems 500 --eval-k 8 --jobs "${JOBS:-2}" --drop-weights \
  --progress-every 300 --max-minutes "${MAX_MINUTES:-150}" --out "${OUT:-$HERE/rerun/strong}"
