#!/usr/bin/env bash
# The rollout-budget study, part 2 (PLAN.md beside this file): GRPO, adaptive PODS, GRPO + GRESO and Knapsack-RL on
# the strong model (evidence/strong/model), seeds 64 onwards, interleaved. Resumable: the same command continues.
# SRC: a snapshot of the code the study runs:  git archive <commit> src | tar -x -C <snapshot>
set -euo pipefail
cd "$(dirname "$0")/../../../.."
export PYTHONPATH="${SRC:-$PWD}/src"  # SRC: a folder holding src/ (default: this checkout)
OUT=${OUT:-benchmarks/results/cpu-2core-amd-epyc/budgets/strong-study}
exec .venv/bin/pods study --config tiny \
  --model_name_or_path "benchmarks/results/cpu-2core-amd-epyc/evidence/strong/model" \
  --methods grpo-n16,pods-mv-n64m16-pilot16c,pods-mv-n16m16-greso,pods-mv-n32m16-knap24 \
  --variant "pilot16c=--pilot_generations 16 --adaptive_reward correctness_reward" \
  --variant "greso=--prompt_planner greso --oversample_prompts 2 --adaptive_reward correctness_reward" \
  --variant "knap24=--rollout_planner knapsack --adaptive_budget 24 --adaptive_reward correctness_reward" \
  --m 16 --prompts-per-step 8 --learning_rate 1e-4 --first-seed 64 \
  --seeds "${SEEDS:-8}" --updates 300 --eval-every 25 --eval-problems 500 --eval-k 8 --jobs "${JOBS:-2}" \
  --drop-weights --progress-every 300 --max-minutes "${MAX_MINUTES:-240}" --out "$OUT" --train_limit 512
