#!/usr/bin/env bash
# The rollout-budget study (PLAN.md beside this file): GRPO, PODS 16 -> 8, adaptive PODS, GRPO + GRESO and
# Knapsack-RL on the shipped model, seeds 64 onwards, interleaved. Resumable: the same command continues.
# SRC: a snapshot of the code the study runs (so that commits made while it runs do not reach its later runs):
#   git archive <commit> src | tar -x -C <snapshot>
set -euo pipefail
cd "$(dirname "$0")/../../../.."
export PYTHONPATH="${SRC:-$PWD}/src"  # SRC: a folder holding src/ (default: this checkout)
OUT=${OUT:-benchmarks/results/cpu-2core-amd-epyc/budgets/study}
exec .venv/bin/pods study \
  --methods grpo-n8,pods-mv-n16m8,pods-mv-n32m8-pilot8c,pods-mv-n8m8-greso,pods-mv-n16m8-knap12 \
  --variant "pilot8c=--pilot_generations 8 --adaptive_reward correctness_reward" \
  --variant "greso=--prompt_planner greso --oversample_prompts 2 --adaptive_reward correctness_reward" \
  --variant "knap12=--rollout_planner knapsack --adaptive_budget 12 --adaptive_reward correctness_reward" \
  --first-seed 64 --seeds "${SEEDS:-8}" --updates 300 --eval-every 20 --eval-problems 400 --eval-k 4 \
  --jobs "${JOBS:-2}" --drop-weights --progress-every 300 --max-minutes "${MAX_MINUTES:-240}" --out "$OUT" \
  --train_limit 512
