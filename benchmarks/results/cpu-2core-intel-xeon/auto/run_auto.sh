#!/usr/bin/env bash
# The auto study (PLAN.md beside this file): GRPO, fixed PODS and rollout_planner=auto, interleaved seed by seed, on
# the shipped model (MODEL=shipped) or the strong one (MODEL=strong). Resumable: the same command continues.
# SRC: a snapshot of the code the study runs (so that commits made while it runs do not reach its later runs):
#   git archive <commit> src | tar -x -C <snapshot>
set -euo pipefail
cd "$(dirname "$0")/../../../.."
export PYTHONPATH="${SRC:-$PWD}/src"  # SRC: a folder holding src/ (default: this checkout)
here=benchmarks/results/cpu-2core-intel-xeon/auto
auto="auto=--rollout_planner auto --adaptive_reward correctness_reward"
if [ "${MODEL:-shipped}" = shipped ]; then
  exec .venv/bin/pods study \
    --methods grpo-n8,pods-mv-n16m8,pods-mv-n32m8-auto --variant "$auto" \
    --first-seed 72 --seeds "${SEEDS:-8}" --updates 300 --eval-every 20 --eval-problems 400 --eval-k 4 \
    --jobs "${JOBS:-2}" --threads 1 --drop-weights --progress-every 300 --max-minutes "${MAX_MINUTES:-240}" \
    --out "${OUT:-$here/shipped}" --train_limit 512
fi
exec .venv/bin/pods study --config tiny \
  --model_name_or_path "benchmarks/results/cpu-2core-amd-epyc/evidence/strong/model" \
  --methods grpo-n16,pods-mv-n32m16,pods-mv-n64m16-auto --variant "$auto" \
  --m 16 --prompts-per-step 8 --learning_rate 1e-4 --first-seed 72 \
  --seeds "${SEEDS:-8}" --updates 300 --eval-every 25 --eval-problems 500 --eval-k 8 --jobs "${JOBS:-2}" --threads 1 \
  --drop-weights --progress-every 300 --max-minutes "${MAX_MINUTES:-240}" --out "${OUT:-$here/strong}" \
  --train_limit 512
