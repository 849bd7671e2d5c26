#!/usr/bin/env bash
# The wheels the GPU machine's image lacks for the preset (benchmarks/gpu/h100.py), downloaded here into .whl/ (git
# ignores it) to be carried there. The image, as last seen: Python 3.12, torch 2.11, transformers 5.17, accelerate
# 1.15, peft, huggingface_hub 1.33, pyarrow, matplotlib, sympy; no trl, datasets, math-verify or vLLM.
#   trl 1.16.0         pods_rl's trainer (trl>=1.12,<1.17); needs transformers>=4.56.2, accelerate>=1.10.1, datasets
#   datasets 4.8.5     trl>=1.16 needs datasets>=4.7; 4.8.5 asks pyarrow>=21 (5.x asks >=24, newer than the image
#                      may have) and huggingface-hub<2.0 (the image: 1.33)
#   dill 0.4.1, multiprocess 0.70.19    datasets 4.8.5's pins (dill<0.4.2, multiprocess<0.70.20)
#   fsspec 2026.2.0    datasets 4.8.5 asks fsspec<=2026.2.0; the image's own version is unknown, so it is carried
# math-verify is not needed: the preset's task (arithmetic) grades numerically. Checked on CPU with exactly these
# wheels over transformers 5.17.0, accelerate 1.15.0, huggingface_hub 1.33.0, pyarrow 21.0.0 (torch 2.13 CPU):
# `python benchmarks/gpu/h100.py all --device cpu --tiny` ran every step (benchmarks/gpu/README.md).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
mkdir -p .whl
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
    trl==1.16.0 datasets==4.8.5 dill==0.4.1 multiprocess==0.70.19 fsspec==2026.2.0
ls -l .whl
du -ch .whl/*.whl | tail -1
