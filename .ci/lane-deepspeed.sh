#!/usr/bin/env bash
# The DeepSpeed lane: DeepSpeed and pods-rl in an environment of their own (.venv-ds), then tests/deepspeed: `pods
# train` under `accelerate launch` with the shipped ZeRO-2 and ZeRO-3 configs on 2 CPU ranks (DeepSpeed's CPU
# accelerator over gloo): time-based clock, SIGTERM and resume, divergence, a killed rank, `pods eval` on the run.
# From the repository root: CI=true bash .ci/lane-deepspeed.sh. About 5 minutes on 2 CPU cores, install included.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
python3 -m venv .venv-ds
. .venv-ds/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q "torch==2.13.0"  # the CPU build first (DeepSpeed builds against the torch it finds)
python -m pip install -q -e ".[dev,deepspeed]"
python - <<'PY'
from importlib.metadata import version
print("deepspeed lane:", ", ".join(f"{p} {version(p)}" for p in
      ("deepspeed", "torch", "accelerate", "transformers", "trl", "pods-rl")))
PY
echo "deepspeed lane: installed in $((SECONDS - started)) s"
export OMP_NUM_THREADS=1
timeout 900 python -m pytest -q --lane deepspeed tests/deepspeed --timeout 600 -p no:cacheprovider
echo "deepspeed lane: passed in $((SECONDS - started)) s"
