#!/usr/bin/env bash
# The shipped-model adaptive study on a quiet machine (#32): more seeds, finer evaluation. Resumable.
cd /work/main
export PYTHONPATH=/work/study-src
exec .venv/bin/pods study \
  --methods grpo-n8,pods-mv-n32m8,pods-mv-n32m8-pilot8c,pods-random-n32m8-pilot8c \
  --variant "pilot8c=--pilot_generations 8 --adaptive_reward correctness_reward" \
  --seeds 8 --updates 120 --eval-every 10 --eval-problems 400 --eval-k 4 --jobs 2 --drop-weights \
  --progress-every 300 --max-minutes 20 --out /work/shipped/study
