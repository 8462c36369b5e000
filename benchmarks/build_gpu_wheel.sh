#!/usr/bin/env bash
# Build the lltm-cuda wheel that benchmarks/gpu_check.sh installs on the GPU machine
# (LLTM_CUDA_WHEEL=...), so that the machine's few minutes go on the checks, not on nvcc.
#
#   PYTHON=/path/to/venv/bin/python bash benchmarks/build_gpu_wheel.sh
#
# PYTHON must have a CUDA build of torch >= 2.10 whose CUDA major is the GPU machine's torch's
# (the library is on torch's stable ABI: one build loads on every torch >= 2.10 of that CUDA
# major), plus setuptools, wheel and ninja; nvcc of that major must be found (setup.py looks).
# TORCH_CUDA_ARCH_LIST defaults to 9.0 (Hopper, sm_90), one architecture, so the wheel is
# small enough to travel with the working tree.  Writes wheelhouse/gpu/lltm_cuda-*.whl (git
# ignores wheelhouse/) and prints its path and size; a previous wheel there is replaced.
set -euo pipefail

cd "$(dirname "$(readlink -f "$0")")/.."
PYTHON=${PYTHON:-python3}
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
export MAX_JOBS=${MAX_JOBS:-1}
OUT_DIR=wheelhouse/gpu
mkdir -p "$OUT_DIR"
rm -f "$OUT_DIR"/lltm_cuda-*.whl
# CUDA_HOME unset, as for a user: setup.py finds the toolkit and says which it used.
env -u CUDA_HOME -u CUDA_PATH "$PYTHON" -m pip wheel --no-build-isolation --no-deps -w "$OUT_DIR" ./backends/lltm_cuda
wheel=$(ls "$OUT_DIR"/lltm_cuda-*.whl)
echo "built $wheel: $(stat -c %s "$wheel") bytes ($(du -h "$wheel" | cut -f1)), TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST"
echo "on the GPU machine: LLTM_CUDA_WHEEL=$wheel bash benchmarks/gpu_check.sh"
