#!/usr/bin/env bash
# On a lent GPU machine (no network): install cuda-bindings from wheels carried in .wheels/ when the machine's
# python3 lacks it (fill .wheels here first: pip download --only-binary=:all: --python-version 3.12
#   --platform manylinux_2_28_x86_64 -d .wheels cuda-bindings cuda-pathfinder), then print the GPU and versions.
set -euo pipefail
if ! python3 -c "import cuda.bindings" 2>/dev/null; then
  python3 -m pip install --quiet --no-index --find-links .wheels cuda-bindings cuda-pathfinder
fi
nvidia-smi --query-gpu=name,uuid,clocks.sm,utilization.gpu --format=csv,noheader
python3 -c "import torch, cuda.bindings; print('torch', torch.__version__, 'cuda-bindings', cuda.bindings.__version__)"
# pytest, pytest-xdist and hypothesis for the CUDA tests, when carried (pip download ... pytest pytest-xdist hypothesis)
if ! python3 -c "import pytest, xdist, hypothesis" 2>/dev/null && ls .wheels/pytest-* > /dev/null 2>&1; then
  python3 -m pip install --quiet --no-index --find-links .wheels pytest pytest-xdist hypothesis
fi
