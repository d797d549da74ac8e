#!/usr/bin/env bash
# The baselines' packages that the GPU host lacks (NLTK, torch-struct, hmmlearn, curvlinops and
# einconv; the host has the rest: einops, linear_operator, opt_einsum, regex, joblib, click,
# scikit-learn), downloaded as wheels for its Python 3.12 into .whl/ (in .gitignore). Run it
# where pip reaches a package index; carry .whl with the call that runs bench/gpu_check.sh
# (truth.py's baselines; curvlinops and einconv: bench/flatness.py's, when run on its own).
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .whl
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform manylinux1_x86_64 -d .whl \
    nltk defusedxml torch-struct hmmlearn curvlinops-for-pytorch==3.0.1 einconv
ls -l .whl
