#!/usr/bin/env bash
# The strong-model adaptive study (#32). Resumable: rerun the same command.
set -euo pipefail
ROOT=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
cd "$ROOT"
HERE=benchmarks/results/cpu-2core-amd-epyc/adaptive_strong
# SRC: the code the study runs, a folder holding src/ (default: this checkout); a snapshot keeps the commits made
# while the study runs out of its later runs:  git archive <commit> src | tar -x -C <snapshot>; SRC=<snapshot>
export PYTHONPATH="${SRC:-$ROOT}/src"
# MODEL: the strong model (default model/ beside this file; README.md gives its `pods build-tiny` command)
exec .venv/bin/pods study --config tiny --model_name_or_path "${MODEL:-$HERE/model}" \
  --methods grpo-n16,pods-mv-n64m16,pods-mv-n64m16-pilot16c,pods-random-n64m16-pilot16c,pods-mv-n64m16-b24c \
  --variant "pilot16c=--pilot_generations 16 --adaptive_reward correctness_reward" \
  --variant "b24c=--pilot_generations 16 --adaptive_rule budgeted --adaptive_budget 24 --adaptive_reward correctness_reward" \
  --m 16 --prompts-per-step 8 --learning_rate 1e-4 --seeds 8 --updates 300 --eval-every 25 \
  --eval-problems 500 --eval-k 8 --jobs 2 --drop-weights --progress-every 300 --max-minutes 70 \
  --out "${OUT:-$HERE/rerun}"
