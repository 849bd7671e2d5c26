#!/usr/bin/env bash
# The rollout-budget study's parts 8 and 9 (C-GRPO; planned in ../../cpu-2core-amd-epyc/budgets/PLAN.md before any
# run, and PLAN.md beside this file), run on the 2-core Intel Xeon VM: GRPO and C-GRPO composed with PODS, interleaved
# seed by seed, on the shipped model (MODEL=shipped) or the strong one (MODEL=strong). Resumable: the same command
# continues; DRY=--dry-run prints the runs' commands. SRC: a snapshot of the code the study runs:
#   git archive <commit> src | tar -x -C <snapshot>
set -euo pipefail
cd "$(dirname "$0")/../../../.."
export PYTHONPATH="${SRC:-$PWD}/src"  # SRC: a folder holding src/ (default: this checkout)
here=benchmarks/results/cpu-2core-intel-xeon/cgrpo
cgrpo="cgrpo=--rollout_planner cgrpo --rollout_planner_args {\\\"num_calibration_samples\\\":64}"
if [ "${MODEL:-shipped}" = shipped ]; then
  exec .venv/bin/pods study ${DRY:-} \
    --methods grpo-n8,pods-mv-n32m8-cgrpo --variant "$cgrpo" \
    --first-seed 64 --seeds "${SEEDS:-8}" --updates 300 --eval-every 20 --eval-problems 400 --eval-k 4 \
    --jobs "${JOBS:-2}" --threads 1 --drop-weights --progress-every 300 --max-minutes "${MAX_MINUTES:-240}" \
    --out "${OUT:-$here/shipped}" --train_limit 512
fi
exec .venv/bin/pods study ${DRY:-} --config tiny \
  --model_name_or_path "benchmarks/results/cpu-2core-amd-epyc/evidence/strong/model" \
  --methods grpo-n16,pods-mv-n32m16-cgrpo --variant "$cgrpo" \
  --m 16 --prompts-per-step 8 --learning_rate 1e-4 --first-seed 64 \
  --seeds "${SEEDS:-8}" --updates 300 --eval-every 25 --eval-problems 500 --eval-k 8 --jobs "${JOBS:-2}" --threads 1 \
  --drop-weights --progress-every 300 --max-minutes "${MAX_MINUTES:-240}" --out "${OUT:-$here/strong}" \
  --train_limit 512
