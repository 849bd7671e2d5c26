#!/usr/bin/env bash
# The evidence study (#42), shipped model, stage of SEEDS seeds per method. Resumable: the same command continues.
cd /work/main
export PYTHONPATH=/work/study-src/src
exec .venv/bin/pods study \
  --methods grpo-n8,pods-mv-n32m8-pilot8c,pods-mv-n32m8,pods-random-n32m8-pilot8c \
  --variant "pilot8c=--pilot_generations 8 --adaptive_reward correctness_reward" \
  --seeds "${SEEDS:-8}" --updates 300 --eval-every 20 --eval-problems 400 --eval-k 4 --jobs 2 --drop-weights \
  --progress-every 300 --max-minutes "${MAX_MINUTES:-150}" --out /work/evidence/shipped
