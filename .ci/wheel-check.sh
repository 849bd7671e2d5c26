#!/usr/bin/env bash
# The release check: what a user gets from the wheel. Builds the sdist and the wheel (`python -m build`: the wheel is
# built from the sdist, so both must carry everything), checks that the wheel carries the shipped model, the recipes
# and the templates, installs it into a fresh environment (torch's CPU build first) and runs `pods train` from it for
# a few seconds of training on the shipped model, in a directory outside the repository.
# From the repo root, after `make install` (its .venv has `build`): bash .ci/wheel-check.sh. About 4 min on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
started=$SECONDS
python=${PYTHON:-$repo/.venv/bin/python}
work=$(mktemp -d "${TMPDIR:-/tmp}/pods-wheel-check.XXXXXX")
trap 'rm -rf "$work"' EXIT
unset PYTHONPATH  # nothing of the source tree may leak into the installed package

timeout 600 "$python" -m build --outdir "$work/dist" "$repo" >"$work/build.log" 2>&1 || { tail -30 "$work/build.log"; exit 1; }
wheel=$(ls "$work"/dist/*.whl)
sdist=$(ls "$work"/dist/*.tar.gz)
echo "wheel check: built $(basename "$sdist") and $(basename "$wheel") in $((SECONDS - started)) s"

# The wheel and the sdist carry every shipped data file of the source tree: the tiny model, the recipes, templates.
"$python" - "$repo" "$wheel" "$sdist" <<'PY'
import sys, tarfile, zipfile
from pathlib import Path

repo, wheel, sdist = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
package = repo / "src" / "pods_rl"
shipped = sorted(str(p.relative_to(package.parent)) for folder in ("assets", "recipes", "templates")
                 for p in (package / folder).rglob("*") if p.is_file() and "__pycache__" not in p.parts)
assert any(name.endswith("model.safetensors") for name in shipped) and "pods_rl/recipes/tiny.yaml" in shipped, shipped
in_wheel = set(zipfile.ZipFile(wheel).namelist())
missing = [name for name in shipped if name not in in_wheel]
assert not missing, f"the wheel lacks {missing}"
root = Path(sdist).name.removesuffix(".tar.gz")
in_sdist = set(tarfile.open(sdist).getnames())
missing = [name for name in shipped if f"{root}/src/{name}" not in in_sdist]
assert not missing, f"the sdist lacks {missing}"
print(f"wheel check: the wheel and the sdist carry the {len(shipped)} shipped data files (model, recipes, templates)")
PY

python3 -m venv "$work/venv"
# Every step is bounded: the installs (about 3 min here) as much as the build and the run.
timeout 300 "$work/venv/bin/python" -m pip install -q --upgrade pip
timeout 900 "$work/venv/bin/python" -m pip install -q "${TORCH_SPEC:-torch==2.13.0}" ${TORCH_INDEX:+--extra-index-url "$TORCH_INDEX"}
timeout 900 "$work/venv/bin/python" -m pip install -q "$wheel"
echo "wheel check: installed into a fresh environment in $((SECONDS - started)) s"

# From a directory outside the repository: the installed package, its version, and the default recipe on the shipped
# model for 5 s of training (20 held-out problems before and after instead of 200).
mkdir "$work/run" && cd "$work/run"
"$work/venv/bin/python" - "$work/venv" "$repo/pyproject.toml" <<'PY'
import re, sys
from pathlib import Path

import pods_rl

venv, pyproject = Path(sys.argv[1]).resolve(), Path(sys.argv[2])
assert Path(pods_rl.__file__).resolve().is_relative_to(venv), f"pods_rl imported from {pods_rl.__file__}"
version = re.search(r'^version = "([^"]+)"', pyproject.read_text(), re.M).group(1)
assert pods_rl.__version__ == version, (pods_rl.__version__, version)
print(f"wheel check: pods_rl {pods_rl.__version__} from {Path(pods_rl.__file__).parent}")
PY
timeout 600 "$work/venv/bin/pods" train --max_train_seconds 5 --eval_num_problems 20 --output_dir run \
    >"$work/train.log" 2>&1 || { tail -30 "$work/train.log"; exit 1; }
"$work/venv/bin/python" - <<'PY'
import json
from pathlib import Path

summary = json.loads(Path("run/summary.json").read_text())
assert summary["steps"] >= 1 and 0 < summary["train_seconds"] < 60, summary
assert (Path("run/final") / "model.safetensors").is_file() and (Path("run") / "metrics.jsonl").is_file()
print(f"wheel check: pods train ran {summary['steps']} steps in {summary['train_seconds']:.1f} s of training; "
      f"accuracy {summary.get('accuracy_before')} -> {summary.get('accuracy_after')}")
PY
echo "wheel check: passed in $((SECONDS - started)) s"
