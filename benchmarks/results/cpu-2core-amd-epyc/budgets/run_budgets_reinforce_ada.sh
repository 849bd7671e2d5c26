#!/usr/bin/env bash
# Part 4 of the rollout-budget study (PLAN.md beside this file): GRPO and Reinforce-Ada (as released, and with its
# advantages std-scaled) on the shipped model, seeds 64 onwards, interleaved, on a quiet machine. Resumable: the same
# command continues. SRC: a snapshot of the code the study runs (git archive <commit> src | tar -x -C DIR).
set -euo pipefail
cd "$(dirname "$0")/../../../.."
export PYTHONPATH="${SRC:-$PWD}/src"  # SRC: a folder holding src/ (default: this checkout)
OUT=${OUT:-benchmarks/results/cpu-2core-amd-epyc/budgets/reinforce-ada-study}
ra="--pilot_generations 8 --adaptive_rule reinforce_ada --downsample_rule reinforce_ada --advantage_baseline sampled \
--adaptive_reward correctness_reward"
exec .venv/bin/pods study \
  --methods grpo-n8,pods-mv-n32m8-ra,pods-mv-n32m8-rastd \
  --variant "ra=$ra --scale_rewards none" \
  --variant "rastd=$ra --scale_rewards group" \
  --first-seed 64 --seeds "${SEEDS:-8}" --updates 300 --eval-every 20 --eval-problems 400 --eval-k 4 \
  --jobs "${JOBS:-2}" --drop-weights --progress-every 300 --max-minutes "${MAX_MINUTES:-240}" --out "$OUT" \
  --train_limit 512
