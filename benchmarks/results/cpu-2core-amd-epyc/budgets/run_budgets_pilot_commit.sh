#!/usr/bin/env bash
# Part 3 of the rollout-budget study (PLAN.md beside this file): GRPO and GRPO + Pilot-Commit on the shipped model,
# seeds 64 onwards, interleaved, with part 1's settings; then (part 3b) a 4-rollout pilot and no eviction, added to
# the same folder. Resumable: the same command continues.
set -euo pipefail
cd "$(dirname "$0")/../../../.."
export PYTHONPATH="${SRC:-$PWD}/src"  # SRC: a folder holding src/ (default: this checkout)
OUT=${OUT:-benchmarks/results/cpu-2core-amd-epyc/budgets/pilot-commit-study}
exec .venv/bin/pods study \
  --methods grpo-n8,pods-mv-n8m8-pc,pods-mv-n16m8-pc4,pods-mv-n8m8-pcstay \
  --variant "pc=--prompt_planner pilot_commit --oversample_prompts 2 --adaptive_reward correctness_reward" \
  --variant "pc4=--prompt_planner pilot_commit --oversample_prompts 2 --adaptive_reward correctness_reward \
--prompt_planner_args {\\\"n_explore\\\":4}" \
  --variant "pcstay=--prompt_planner pilot_commit --oversample_prompts 2 --adaptive_reward correctness_reward \
--prompt_planner_args {\\\"exclude_threshold_upper\\\":null}" \
  --first-seed 64 --seeds "${SEEDS:-8}" --updates 300 --eval-every 20 --eval-problems 400 --eval-k 4 \
  --jobs "${JOBS:-2}" --drop-weights --progress-every 300 --max-minutes "${MAX_MINUTES:-240}" --out "$OUT" \
  --train_limit 512
