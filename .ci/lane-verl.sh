#!/usr/bin/env bash
# The verl lane: PODS on verl (tests/verl/) against real verl 0.9.x, Ray and TransferQueue, on CPU, in an
# environment of its own (verl pins its own transformers range). From the repo root: CI=true bash .ci/lane-verl.sh
#
# What runs here: the PODS replay buffer loaded by verl's own trainer from a config, sampling rollout records
# from TransferQueue on a local Ray cluster; verl's _compute_advantage and _balance_batch on what it returns;
# the recipes against verl's config; the rollout-budget planners through PODS's agent loop manager and worker, a
# few steps of verl's own prepare_step / dispatch / refill / sample() each (the LLM a table). What cannot: verl's
# FSDP workers (NCCL only), its vLLM/SGLang rollout servers (GPU builds) and so fit(); see docs/guides/verl.md.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$(date +%s)

python3 -m venv .venv-verl
. .venv-verl/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q "torch==2.13.0"  # the CPU build first, so that verl's dependencies keep it
python -m pip install -q -e ".[verl]" "pytest>=8" "pytest-timeout>=2.3"
python -m pip check
python - <<'PY'
from importlib.metadata import version
print("verl lane:", ", ".join(f"{name} {version(name)}" for name in
      ("pods-rl", "verl", "transferqueue", "ray", "tensordict", "torch", "transformers", "hydra-core", "trl")))
PY
echo "verl lane: install took $(( $(date +%s) - started )) s"

# Never leave a Ray cluster behind (the tests shut theirs down; this catches a crash). Only under CI: on a shared
# machine `ray stop` would also stop other people's clusters.
cleanup() { if [ "${CI:-}" = true ]; then ray stop --force >/dev/null 2>&1 || true; fi; }
trap cleanup EXIT

# Every test is bounded (pytest-timeout; the first one also starts Ray + TransferQueue), and so is the lane.
timeout -k 30 900 python -m pytest -q --lane verl tests/verl --timeout 300 -p no:cacheprovider -p no:asyncio
echo "verl lane: passed in $(( $(date +%s) - started )) s"
