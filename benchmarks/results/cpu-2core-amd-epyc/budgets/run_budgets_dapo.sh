#!/usr/bin/env bash
# The rollout-budget study, part 6 (PLAN.md beside this file): GRPO and DAPO's dynamic sampling (the `dapo` preset:
# 3x the prompts, every rollout kept, the most varied groups train) on the shipped model, seeds 64 onwards,
# interleaved. Resumable: the same command continues.
# SRC: a snapshot of the code the study runs:  git archive <commit> src | tar -x -C <snapshot>
set -euo pipefail
cd "$(dirname "$0")/../../../.."
export PYTHONPATH="${SRC:-$PWD}/src"  # SRC: a folder holding src/ (default: this checkout)
OUT=${OUT:-benchmarks/results/cpu-2core-amd-epyc/budgets/dapo-study}
exec .venv/bin/pods study \
  --methods grpo-n8,pods-mv-n8m8-dapo \
  --variant "dapo=--oversample_prompts 3" \
  --first-seed 64 --seeds "${SEEDS:-8}" --updates 300 --eval-every 20 --eval-problems 400 --eval-k 4 \
  --jobs "${JOBS:-2}" --drop-weights --progress-every 300 --max-minutes "${MAX_MINUTES:-240}" --out "$OUT" \
  --train_limit 512
