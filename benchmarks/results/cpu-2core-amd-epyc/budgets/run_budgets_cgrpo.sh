#!/usr/bin/env bash
# The rollout-budget study, part 8 (PLAN.md beside this file): GRPO and C-GRPO composed with PODS on the shipped
# model, seeds 64 onwards, interleaved. Not run yet (written with the planner; the machine was busy). Resumable: the
# same command continues. SRC: a snapshot of the code the study runs (git archive <commit> src | tar -x -C DIR).
set -euo pipefail
cd "$(dirname "$0")/../../../.."
export PYTHONPATH="${SRC:-$PWD}/src"  # SRC: a folder holding src/ (default: this checkout)
OUT=${OUT:-benchmarks/results/cpu-2core-amd-epyc/budgets/cgrpo-study}
exec .venv/bin/pods study \
  --methods grpo-n8,pods-mv-n32m8-cgrpo \
  --variant "cgrpo=--rollout_planner cgrpo --rollout_planner_args {\\\"num_calibration_samples\\\":64}" \
  --first-seed 64 --seeds "${SEEDS:-8}" --updates 300 --eval-every 20 --eval-problems 400 --eval-k 4 \
  --jobs "${JOBS:-2}" --drop-weights --progress-every 300 --max-minutes "${MAX_MINUTES:-240}" --out "$OUT" \
  --train_limit 512
