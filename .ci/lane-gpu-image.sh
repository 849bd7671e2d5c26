#!/usr/bin/env bash
# The GPU image's versions, tried on this CPU (issue #52), so that the first GPU call does not discover an
# incompatibility: torch 2.11.0 (PyPI's build: a CUDA build that runs on a CPU; no CPU-only 2.11 can be had here),
# transformers 5.17.0, accelerate 1.15.0 and the image's other known versions, with the TRL, datasets and
# math-verify the preset carries (all from `benchmarks/gpu/wheels.py constraints`), in an environment of its own
# (.venv-gpu-image); pods-rl installed without its dependencies, so that those versions hold. Then, in a `git archive`
# of HEAD (the tree a device call carries, without this checkout's build files): the preset's dry run as on the
# machine (src/ on PYTHONPATH, no package metadata needed), the trainer tests, and the preset's CPU mode end to end.
# Python here is 3.11 (the image's is 3.12): the image's numpy 2.5.2 needs 3.12, so numpy is pip's choice here.
# The wheels (about 2.7 GB with torch's CUDA libraries) are kept in PODS_GPU_IMAGE_WHEELS (default
# ~/.cache/pods-rl/gpu-image-wheels): a second run on the same machine downloads nothing. Under CI=true the default
# folder is removed once installed (a CI machine never runs twice, and its disk is tight).
# From the repository root: CI=true bash .ci/lane-gpu-image.sh. 7-10 minutes on 2 shared cores with the wheels at hand
# (measured 437 s: install 170 s, tests 82 s, the CPU mode 169 s), about 5 more to download them the first time.
set -euo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
venv=.venv-gpu-image
wheels=${PODS_GPU_IMAGE_WHEELS:-$HOME/.cache/pods-rl/gpu-image-wheels}
rm -rf "$venv"
python3 -m venv "$venv"
. "$venv/bin/activate"
python benchmarks/gpu/wheels.py constraints > "$venv/constraints.txt"
# What the preset imports on the machine (the image's packages at its versions, the carried ones at theirs) and
# what the tests need; pods-rl's own base dependencies are among them.
packages=(torch transformers accelerate huggingface-hub peft tokenizers safetensors pyarrow trl datasets math-verify
          matplotlib pyyaml requests tqdm packaging numpy pytest pytest-timeout hypothesis)
mkdir -p "$wheels"
# No pip cache beside the wheels (they would be on disk twice). On a CI machine, which never runs this twice, the
# wheels go once they are installed: about 2.7 GB back before the tests.
python -m pip download -q --no-cache-dir -d "$wheels" -c "$venv/constraints.txt" "${packages[@]}"
python -m pip install -q --no-cache-dir --no-index --find-links "$wheels" -c "$venv/constraints.txt" "${packages[@]}"
if [ "${CI:-}" = true ] && [ -z "${PODS_GPU_IMAGE_WHEELS:-}" ]; then rm -rf "$wheels"; fi
tree=$(mktemp -d /tmp/pods-gpu-image.XXXXXX)
trap 'rm -rf "$tree"' EXIT
git archive HEAD | tar -x -C "$tree"
python -m pip install -q --no-deps "$tree"
python - "$venv/constraints.txt" <<'PY'
import sys
from importlib.metadata import version

pins = dict(line.strip().split("==") for line in open(sys.argv[1]) if "==" in line)
found = {name: version(name) for name in pins}
wrong = {name: (found[name], pin) for name, pin in pins.items() if not found[name].split("+")[0] == pin}
print("gpu-image lane:", ", ".join(f"{name} {v}" for name, v in found.items()))
if wrong:
    sys.exit(f"gpu-image lane: versions other than the image's: {wrong}")
PY
echo "gpu-image lane: installed in $((SECONDS - started)) s"
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 CUDA_VISIBLE_DEVICES=""
(cd "$tree" && PYTHONPATH="$tree/src" timeout 300 python benchmarks/gpu/h100.py all --dry-run --work "$tree/work" \
    > "$tree/dry-run.log" 2>&1) || { tail -30 "$tree/dry-run.log"; exit 1; }
grep -E "^dry run: |^total " "$tree/dry-run.log"
# The trainer tests and the preset's own (not the one that makes its own git archive: this tree is one), then the
# preset's CPU mode end to end (tests/gpu_image: answer, study, keep, and a second study that resumes).
(cd "$tree" && timeout 900 python -m pytest -q -p no:cacheprovider --timeout 600 tests/test_trainer.py \
    tests/test_trainer_adaptive.py tests/test_dropin.py tests/test_trl_surface.py tests/test_gpu_preset.py \
    -k "not git_archive")
(cd "$tree" && timeout 1500 python -m pytest -q -p no:cacheprovider --timeout 1400 --lane gpu_image tests/gpu_image)
echo "gpu-image lane: passed in $((SECONDS - started)) s"
