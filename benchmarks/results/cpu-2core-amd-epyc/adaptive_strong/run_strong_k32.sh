#!/usr/bin/env bash
# The strong-model study, one more method after the others had finished (#32): a pilot of 32 > m = 16, so that
# max_variance also chooses within groups mixed after the pilot. Same folder, same settings, seeds 0-5.
set -euo pipefail
ROOT=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
cd "$ROOT"
HERE=benchmarks/results/cpu-2core-amd-epyc/adaptive_strong
# SRC: the code the study runs, a folder holding src/ (default: this checkout); a snapshot keeps the commits made
# while the study runs out of its later runs:  git archive <commit> src | tar -x -C <snapshot>; SRC=<snapshot>
export PYTHONPATH="${SRC:-$ROOT}/src"
# MODEL: the strong model (default model/ beside this file; README.md gives its `pods build-tiny` command)
exec .venv/bin/pods study --config tiny --model_name_or_path "${MODEL:-$HERE/model}" \
  --methods grpo-n16,pods-mv-n64m16,pods-mv-n64m16-pilot16c,pods-random-n64m16-pilot16c,pods-mv-n64m16-b24c,pods-mv-n64m16-pilot32c \
  --variant "pilot16c=--pilot_generations 16 --adaptive_reward correctness_reward" \
  --variant "b24c=--pilot_generations 16 --adaptive_rule budgeted --adaptive_budget 24 --adaptive_reward correctness_reward" \
  --variant "pilot32c=--pilot_generations 32 --adaptive_reward correctness_reward" \
  --m 16 --prompts-per-step 8 --learning_rate 1e-4 --seeds 6 --updates 300 --eval-every 25 \
  --eval-problems 500 --eval-k 8 --jobs 2 --drop-weights --progress-every 300 --max-minutes 30 \
  --out "${OUT:-$HERE/rerun}"
