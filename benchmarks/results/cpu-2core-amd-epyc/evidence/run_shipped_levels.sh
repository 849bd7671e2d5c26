#!/usr/bin/env bash
# The evidence study (#42), part 4 (PLAN.md): the shipped model, GRPO vs adaptive PODS on fresh seeds 32 onwards,
# SEEDS seeds per method (a stage: 8, 16, 24, 32). Resumable: the same command continues. Before the first run:
#   git archive <the commit that adds part 4> src | tar -x -C /work/study-shipped-levels-src
#   mkdir -p /work/evidence/shipped-levels && cp shipped/cost.json /work/evidence/shipped-levels/
cd /work/main
export PYTHONPATH=/work/study-shipped-levels-src/src
exec .venv/bin/pods study \
  --methods grpo-n8,pods-mv-n32m8-pilot8c \
  --variant "pilot8c=--pilot_generations 8 --adaptive_reward correctness_reward" --first-seed 32 \
  --seeds "${SEEDS:-8}" --updates 300 --eval-every 20 --eval-problems 400 --eval-k 4 --jobs "${JOBS:-2}" --drop-weights \
  --progress-every 300 --max-minutes "${MAX_MINUTES:-150}" --out /work/evidence/shipped-levels
