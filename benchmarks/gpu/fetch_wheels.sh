#!/usr/bin/env bash
# The wheels the GPU machine's image lacks for the preset (benchmarks/gpu/h100.py), downloaded here into .whl/ (git
# ignores it) to be carried there (the device tool's carry: [".whl"]). Which wheels, at which versions and why:
# benchmarks/gpu/wheels.lock.json (benchmarks/gpu/wheels.py; `python3 benchmarks/gpu/wheels.py lock` resolves it
# again): TRL, datasets, math-verify and what they need that the image lacks; nothing the image has, so that no
# carried copy replaces the image's torch or transformers on PYTHONPATH. Then `wheels.py check .whl` reads every
# downloaded wheel's own metadata and fails on a version other than the lock's or a requirement the lock does not
# hold, and `h100.py preflight` sums what a call carries.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
rm -rf .whl && mkdir -p .whl
python3 benchmarks/gpu/wheels.py list > .whl/requirements.txt
platforms=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
for n in $(seq 5 40); do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d .whl -r .whl/requirements.txt
rm .whl/requirements.txt
python3 benchmarks/gpu/wheels.py check .whl
du -ch .whl/*.whl | tail -1
