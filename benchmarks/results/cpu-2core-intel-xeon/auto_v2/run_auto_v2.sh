#!/usr/bin/env bash
# auto's second version at four cost ratios (PLAN.md beside this file). MODEL=shipped|strong, PART=measured|h200|r003|
# r03. Resumable: the same command continues. From any clone: the checkout is found from this file's place.
# SRC: a folder holding the src/ the study runs (a snapshot: git archive <commit> src | tar -x -C <snapshot>);
# OUT: where the study writes (default: <model>/<part> beside this file); DRY=--dry-run prints the runs.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$(git -C "$here" rev-parse --show-toplevel)"
export PYTHONPATH="${SRC:-$PWD}/src"
model=${MODEL:-strong}
part=${PART:-measured}
out=${OUT:-$here/$model/$part}
auto="auto=--rollout_planner auto --adaptive_reward correctness_reward"
case "$part" in
  measured) price=() ;;
  h200) price=(--price_at 202,0.056,0.526) ;;
  r003) price=(--price_at 202,0.0158,0.526) ;;
  r03) price=(--price_at 202,0.158,0.526) ;;
  *) echo "run_auto_v2.sh: PART is measured, h200, r003 or r03, not '$part'" >&2; exit 2 ;;
esac
if [ "$model" = shipped ]; then
  geometry=(--eval-every 20 --eval-problems 400 --eval-k 4)  # the study defaults: m 8, 16 prompts, lr 2e-4
  fixed=grpo-n8,pods-mv-n16m8,pods-mv-n32m8
  autom=pods-mv-n32m8-auto
else
  geometry=(--config tiny --model_name_or_path benchmarks/results/cpu-2core-amd-epyc/evidence/strong/model --m 16
            --prompts-per-step 8 --learning_rate 1e-4 --eval-every 25 --eval-problems 500 --eval-k 8)
  fixed=grpo-n16,pods-mv-n32m16,pods-mv-n64m16
  autom=pods-mv-n64m16-auto
fi
if [ "$part" = measured ]; then
  methods="$fixed,$autom"
elif [ -n "${FRESH:-}" ]; then  # FRESH=1: a priced part that runs its own baseline and fixed runs (their learning
  # does not depend on the costs, their wall clock is not read), for a part run beside other work; METHODS may
  # leave out the 4m runs (fixed=grpo-n16,pods-mv-n32m16, say)
  methods="${METHODS:-$fixed},$autom"
else  # the baseline and fixed runs are the measured part's, copied (a study holds regular files, not links): only
  # auto runs here, given this part's costs
  methods="$fixed,$autom"
  measured="$here/$model/measured/study/runs"
  [ -d "$measured" ] || { echo "run_auto_v2.sh: run PART=measured first (no $measured), or FRESH=1" >&2; exit 2; }
  mkdir -p "$out/study/runs"
  for run in "$measured"/*/; do
    name=$(basename "$run")
    case "$name" in *-auto-s*) ;; *) [ -e "$out/study/runs/$name" ] || cp -r "$run" "$out/study/runs/$name";; esac
  done
fi
exec .venv/bin/pods study "${geometry[@]}" --methods "$methods" --variant "$auto" "${price[@]}" \
  --first-seed 80 --seeds "${SEEDS:-8}" --updates 300 --jobs "${JOBS:-2}" --threads 1 --drop-weights \
  --progress-every 300 --max-minutes "${MAX_MINUTES:-600}" --out "$out" --train_limit 512 ${DRY:-}
