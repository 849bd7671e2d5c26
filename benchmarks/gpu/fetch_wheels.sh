#!/usr/bin/env bash
# The wheels the GPU machine's image lacks for the preset (benchmarks/gpu/h100.py), downloaded here into .whl/ (git
# ignores it) to be carried there (the device tool's carry: [".whl"]). Which wheels, at which versions and why:
# benchmarks/gpu/wheels.lock.json, pods-rl's dependency closure resolved beside the image's own packages
# (benchmarks/gpu/wheels.py; `python3 benchmarks/gpu/wheels.py lock` resolves it again). Everything in that closure
# that the image lacks is carried, its own dependencies included: the image was seen without jinja2 (torch's,
# trl's), psutil (accelerate's), xxhash and pandas (datasets'). Then `wheels.py check .whl` reads every downloaded
# wheel's own metadata and fails on a version other than the lock's or a requirement the lock does not hold.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
rm -rf .whl && mkdir -p .whl
python3 benchmarks/gpu/wheels.py list > .whl/requirements.txt
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux2010_x86_64 \
    --platform manylinux_2_12_x86_64 --platform manylinux1_x86_64 -d .whl -r .whl/requirements.txt
python3 benchmarks/gpu/wheels.py check .whl
du -ch .whl/*.whl | tail -1
