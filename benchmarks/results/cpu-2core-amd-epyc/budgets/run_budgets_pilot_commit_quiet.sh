#!/usr/bin/env bash
# Part 3c of the rollout-budget study (PLAN.md beside this file): GRPO and GRPO + Pilot-Commit without eviction on
# the shipped model, seeds 64 onwards, interleaved, on a quiet machine. Resumable: the same command continues.
set -euo pipefail
cd "$(dirname "$0")/../../../.."
export PYTHONPATH="${SRC:-$PWD}/src"  # SRC: a folder holding src/ (default: this checkout)
OUT=${OUT:-benchmarks/results/cpu-2core-amd-epyc/budgets/pilot-commit-quiet-study}
exec .venv/bin/pods study \
  --methods grpo-n8,pods-mv-n8m8-pcstay \
  --variant "pcstay=--prompt_planner pilot_commit --oversample_prompts 2 --adaptive_reward correctness_reward \
--prompt_planner_args {\\\"exclude_threshold_upper\\\":null}" \
  --first-seed 64 --seeds "${SEEDS:-8}" --updates 300 --eval-every 20 --eval-problems 400 --eval-k 4 \
  --jobs "${JOBS:-2}" --drop-weights --progress-every 300 --max-minutes "${MAX_MINUTES:-240}" --out "$OUT" \
  --train_limit 512
