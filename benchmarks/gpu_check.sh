#!/usr/bin/env bash
# Every GPU check of lltm-cuda in one run, sized for one device call (at most 8 minutes), the most
# important first, each step time-boxed, a failure recorded and the run going on:
#   1. the cost of a kernel boundary (benchmarks/kernel_boundary.py, torch alone, nothing built):
#      a chain of 2000 dependent tiny kernels eager and from one CUDA graph, an empty kernel plus a
#      synchronise, with the SM clock sampled during the runs;
#   2. install lltm-core and lltm-ref from this tree and lltm-cuda either from a wheel built
#      elsewhere (LLTM_CUDA_WHEEL: its library is on torch's stable ABI, so a wheel built with a
#      newer torch of the same CUDA major loads on the machine's, and no device time goes on nvcc)
#      or, without one, built here against the machine's torch (setup.py finds the toolkit);
#   3. lltm-cuda's sequence paths (cluster-persistent, grid-persistent, per step) against cuDNN's
#      nn.LSTM, as ratios in one process (benchmarks/persistent_vs_cudnn.py): the measurement that
#      decides whether the grid path should become the default where W_h does not fit a cluster;
#      then the cell at B16 against eager PyTorch in device time (bench_gpu.py --part cell-device);
#   4. the conformance kit with the persistent path forced (three dtypes), with the grid path
#      forced (three dtypes), then with the default choice (four dtypes);
#   5. compute-sanitizer racecheck and synccheck on a small sequence, over clusters and the
#      cooperative grid (benchmarks/small_sequence.py);
#   6. profiler tables and traces of lltm-cuda's and nn.LSTM's sequence, with cuDNN's kernel names
#      (benchmarks/profile_gpu.py; traces under $OUT/traces);
#   7. lltm-triton's kit, then the AOTInductor package of lltm-cuda's operators (a crash there rerun
#      under cuda-gdb for its native backtrace);
#   8. what time is left: lltm-cuda's GPU tests, benchmarks/bench_gpu.py (sequence, then cell),
#      lltm-triton's own tests and benchmark.
# What the emulated build (nox -s cuda_emulated) already checks on the CPU, this need not debug:
# it is here for what only the device shows (timing, cuBLAS, real concurrency, alignment traps).
#
#   OUT=/some/dir bash benchmarks/gpu_check.sh      (from anywhere; OUT defaults to a temp dir)
#
# Writes $OUT/<gpu>.log (everything printed) and $OUT/<gpu>.md (the report to commit as
# benchmarks/results/<gpu>.md), <gpu> the device's model as nvidia-smi names it (h100, h200, a100;
# gpu-check without one), the report rewritten after every step so that a run cut short still
# leaves one.  Needs only what a CUDA image has: python3 with a CUDA build of
# torch, nvcc, ninja, pytest; nothing from the network.  Give the command a wall-clock limit of
# about GPU_CHECK_SECONDS + 60.
#
# Environment: PYTHON (default python3), LLTM_CUDA_WHEEL (an lltm-cuda wheel to install, a path
# from the repository's root or absolute, e.g. the one benchmarks/build_gpu_wheel.sh writes;
# installed with --no-deps --no-index, the machine having no network), TORCH_CUDA_ARCH_LIST
# (default 9.0: one architecture keeps the build short; not used with a wheel), GPU_CHECK_SECONDS (default 480: the whole run's
# budget; each step gets at most what is left), DRY_RUN=1 (go on without a GPU, to try
# every step on a CPU machine: the GPU tests and the benchmark then skip), GPU_CHECK_SITE=1
# (install into a temporary folder on PYTHONPATH, as happens anyway where the interpreter's
# site-packages is not writable), GPU_CHECK_ONLY=triton (lltm-triton's section alone: see
# triton_checks), LLTM_SEED
# (the seed of the kit and of lltm-cuda's tests; default: a fresh one, printed in the report).
set -euo pipefail

SCRIPT=$(readlink -f "$0")  # before the cd: it re-runs itself below
cd "$(dirname "$SCRIPT")/.."
export OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
# The files' name: the first word of the GPU's name with a digit in it ("NVIDIA H100 80GB HBM3": h100).
if [[ -z ${GPU_CHECK_NAME:-} ]]; then
    GPU_CHECK_NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 \
        | tr ' ' '\n' | grep -v -i '^nvidia$' | grep -m 1 '[0-9]' | cut -d- -f1 | tr -cd '[:alnum:]' \
        | tr '[:upper:]' '[:lower:]' || true)
    export GPU_CHECK_NAME=${GPU_CHECK_NAME:-gpu-check}
fi
if [[ -z ${GPU_CHECK_LOGGING:-} ]]; then  # run the rest under tee, in one shell
    GPU_CHECK_LOGGING=1 bash "$SCRIPT" 2>&1 | tee "$OUT/$GPU_CHECK_NAME.log"
    exit "${PIPESTATUS[0]}"
fi

PYTHON=${PYTHON:-python3}
BUDGET=${GPU_CHECK_SECONDS:-480}
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
export PYTHONUNBUFFERED=1
# Only to report nvcc's version: the build finds its toolkit itself (setup.py says which).
NVCC=${CUDA_HOME:+$CUDA_HOME/bin/}nvcc
command -v "$NVCC" >/dev/null || NVCC=/usr/local/cuda/bin/nvcc
NO_GPU=
export LLTM_SEED=${LLTM_SEED:-$RANDOM}
STEP_LOGS=$(mktemp -d)  # not under $OUT: only a few files may come back from there
RESULTS=()

# step NAME LIMIT CMD...: run CMD for at most LIMIT seconds (less if the budget is
# nearly spent), record its outcome and last line; returns CMD's success.
step() {
    local name=$1 limit=$2 start=$SECONDS status
    shift 2
    local left=$((BUDGET - SECONDS))
    ((left < limit)) && limit=$left
    echo
    echo "=== $name (at most ${limit}s) ==="
    if ((limit <= 0)); then
        RESULTS+=("| $name | not run: out of time | 0 | |")
        return 1
    fi
    if timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$STEP_LOGS/$name.log"; then
        status=pass
        # Without a GPU every check after the build skips: that is not a pass.
        [[ -n $NO_GPU && $name != build && $name != triton-build ]] && status="not checked: no GPU (DRY_RUN)"
    else
        status="FAIL (exit $?)"
        [[ $status == "FAIL (exit 124)" ]] && status="FAIL (timed out after ${limit}s)"
    fi
    RESULTS+=("| $name | $status | $((SECONDS - start)) | $(tail -n 1 "$STEP_LOGS/$name.log" | tr -d '|=' | sed 's/^ *//; s/ *$//') |")
    report > "$OUT/$GPU_CHECK_NAME.md"
    [[ $status != FAIL* ]]
}

# What pip installs as lltm-cuda: the wheel LLTM_CUDA_WHEEL names, else the source tree (built here).
cuda_dist() {
    if [[ -n ${LLTM_CUDA_WHEEL:-} ]]; then
        readlink -f "$LLTM_CUDA_WHEEL"
    else
        echo ./backends/lltm_cuda
    fi
}

environment() {
    date -u +"%Y-%m-%d %H:%M UTC"
    nvidia-smi || echo "nvidia-smi: not available"
    "$NVCC" --version || echo "$NVCC: not found (CUDA_HOME=${CUDA_HOME:-unset})"
    "$PYTHON" -c 'import sys, torch; print("python", sys.version.split()[0], "| torch", torch.__version__, "| CUDA", torch.version.cuda, "| GPU visible:", torch.cuda.is_available())'
    echo "lltm-cuda from: $(cuda_dist)"
}

checks() {
    environment
    if ! "$PYTHON" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then
        if [[ ${DRY_RUN:-0} != 1 ]]; then
            echo "gpu_check.sh: no CUDA device visible to $PYTHON's torch: run this on the GPU machine (DRY_RUN=1 tries every step anyway)."
            return 2
        fi
        echo "DRY_RUN=1: no GPU; going on, the GPU tests and the benchmarks will skip."
        NO_GPU=1
    fi
    # Into the interpreter's own site-packages when it may write there, else (or with
    # GPU_CHECK_SITE=1) into a folder of its own on PYTHONPATH, as the device README does.
    local site_args=()
    if [[ -n ${GPU_CHECK_SITE:-} ]] || ! "$PYTHON" -c \
            'import os, sys, sysconfig; sys.exit(not os.access(sysconfig.get_paths()["purelib"], os.W_OK))'; then
        local site
        site=$(mktemp -d)
        site_args=(--target "$site")
        export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
        echo "installing into $site (on PYTHONPATH), not $PYTHON's site-packages"
    fi
    if [[ -n ${LLTM_CUDA_WHEEL:-} && ! -f $LLTM_CUDA_WHEEL ]]; then
        echo "gpu_check.sh: LLTM_CUDA_WHEEL=$LLTM_CUDA_WHEEL is not a file (a path from the repository's root, or absolute)"
        return 2
    fi
    if [[ ${GPU_CHECK_ONLY:-} == triton ]]; then  # lltm-triton's section alone: see triton_checks
        triton_checks
        return
    fi
    # First, before anything is built: what a kernel boundary costs here.
    step kernel-boundary 75 "$PYTHON" benchmarks/kernel_boundary.py --markdown "$STEP_LOGS/boundary.md" || true
    # Without the three packages nothing else can run.  The last line names the build installed.
    step build 200 bash -c '"$0" -m pip install "$@" && "$0" -c "from lltm_cuda import _build_info as b
print(\"lltm-cuda built with torch\", b.TORCH_VERSION, \"for torch\", \".\".join(map(str, b.TARGET_TORCH)), \"and newer, CUDA\", b.CUDA_VERSION,
      \"arch\", b.ARCH_LIST, \"with the CUDA toolkit at\", b.CUDA_HOME)"' \
        "$PYTHON" "${site_args[@]}" --no-build-isolation --no-deps --no-index . ./backends/lltm_ref "$(cuda_dist)" \
        || return 1
    step persistent-vs-cudnn 120 "$PYTHON" benchmarks/persistent_vs_cudnn.py \
        --markdown "$STEP_LOGS/bench_persistent.md" || true
    # The cell's target in device time (seconds): the full cell benchmark comes last, if time is left.
    step cell-device 45 "$PYTHON" benchmarks/bench_gpu.py --part cell-device \
        --markdown "$STEP_LOGS/bench_cell_device.md" || true
    # The persistent path forced: every kit case it takes (not float64, nor S1031, whose W_h does not fit).
    LLTM_CUDA_SEQUENCE=persistent step kit-persistent 90 "$PYTHON" -m pytest -p no:cacheprovider -q -rs \
        --pyargs lltm_core.testing --lltm-backend cuda --lltm-device cuda --lltm-seed "$LLTM_SEED" \
        --lltm-dtype float32 --lltm-dtype float16 --lltm-dtype bfloat16 -k "not S1031 and not float64" || true
    # The grid path forced: every kit case but float64's (its S1031 runs: a block holds its rows of W_h).
    LLTM_CUDA_SEQUENCE=grid step kit-grid 75 "$PYTHON" -m pytest -p no:cacheprovider -q -rs \
        --pyargs lltm_core.testing --lltm-backend cuda --lltm-device cuda --lltm-seed "$LLTM_SEED" \
        --lltm-dtype float32 --lltm-dtype float16 --lltm-dtype bfloat16 -k "not float64" || true
    step conformance-kit 150 "$PYTHON" -m pytest -p no:cacheprovider -q -rs --pyargs lltm_core.testing \
        --lltm-backend cuda --lltm-device cuda --lltm-seed "$LLTM_SEED" \
        --lltm-dtype float32 --lltm-dtype float64 --lltm-dtype float16 --lltm-dtype bfloat16 || true
    local sanitizer tool
    sanitizer=$(command -v compute-sanitizer || echo "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer")
    for tool in racecheck synccheck; do
        if [[ -x $sanitizer ]]; then
            step "sanitizer-$tool" 60 "$sanitizer" --tool "$tool" --error-exitcode 1 --kernel-name kns=persistent \
                "$PYTHON" benchmarks/small_sequence.py || true
        else
            RESULTS+=("| sanitizer-$tool | not run: no compute-sanitizer at $sanitizer | 0 | |")
        fi
    done
    # Which kernels take the sequence's time (cuDNN's names too), and traces to open in Perfetto.
    step profile 60 "$PYTHON" benchmarks/profile_gpu.py --top 5 --traces "$OUT/traces" || true
    triton_checks kit
    # lltm-cuda's operators exported (dynamic batch and time) and compiled by AOTInductor into a
    # package that calls them, run at other sizes against lltm-ref.
    if ! LLTM_CUDA_TEST_AOTI=1 step aoti 120 "$PYTHON" -m pytest -p no:cacheprovider -q -rs \
            backends/lltm_cuda/tests/test_export.py -k "aoti and not control" --lltm-seed "$LLTM_SEED" \
            && [[ ${RESULTS[-1]} == *"exit 139"* ]]; then
        # A crash: first the controls, each in its own process (a crash ends the process), to tell
        # whether any package loads here (torch operators alone) and whether lltm-cuda's loads
        # without constants in the package (test_export.py's test_aoti_control).
        local control
        for control in torch-ops-only weights-as-inputs; do
            LLTM_CUDA_TEST_AOTI=1 step "aoti-control-$control" 60 "$PYTHON" -m pytest -p no:cacheprovider -q \
                backends/lltm_cuda/tests/test_export.py -k "aoti_control and $control" \
                --lltm-seed "$LLTM_SEED" || true
        done
        # A crash in C++ leaves Python's traceback only: the native one, from cuda-gdb (the CUDA
        # image's debugger, which also debugs host code; the image has no gdb).
        local gdb
        gdb=$(command -v cuda-gdb || echo "${CUDA_HOME:-/usr/local/cuda}/bin/cuda-gdb")
        [[ -x $gdb ]] && LLTM_CUDA_TEST_AOTI=1 step aoti-backtrace 120 "$gdb" -batch -ex run -ex bt \
            --args "$PYTHON" -m pytest -p no:cacheprovider -q backends/lltm_cuda/tests/test_export.py \
            -k "aoti_package and float32" --lltm-seed "$LLTM_SEED" || true
    fi
    # On the GPU machine, lltm-cuda failing to load is an error, not a skip.  ptxas's report
    # (test_device_code.py) needs no GPU: nox -s cuda reads it, and the device's minutes go elsewhere.
    LLTM_REQUIRE_GPU=$([[ -n $NO_GPU ]] && echo 0 || echo 1) \
        step gpu-tests 120 "$PYTHON" -m pytest -p no:cacheprovider -q -rs backends/lltm_cuda/tests \
        --ignore=backends/lltm_cuda/tests/test_device_code.py --lltm-seed "$LLTM_SEED" || true
    # The sequence first: it is bounded (about a minute); the cell's torch.compile is what may overrun.
    step benchmark-sequence 120 "$PYTHON" benchmarks/bench_gpu.py --part sequence \
        --markdown "$STEP_LOGS/bench_sequence.md" || true
    step benchmark-cell 150 "$PYTHON" benchmarks/bench_gpu.py --part cell --markdown "$STEP_LOGS/bench_cell.md" || true
    triton_checks rest
}

# --- lltm-triton ----------------------------------------------------------------------------
# After lltm-cuda's checks (then lltm-cuda is built, and the comparison has it), or alone with
# GPU_CHECK_ONLY=triton, sized for one device call of its own (at most 9 minutes with lltm-cuda's
# build: GPU_CHECK_ONLY=triton GPU_CHECK_SECONDS=540): install lltm-triton (pure Python; triton is
# the one that comes with the machine's torch), run the kit on
# CUDA in all four dtypes first, then lltm-triton's own tests (those the interpreter cannot check
# among them), then benchmarks/bench_triton.py: lltm-triton, lltm-cuda and cuDNN's nn.LSTM at
# T64 B16 I32 S128, T256 B32 I128 S256 and T64 B256 I1024 S1024, in bfloat16 and in float32 with
# TF32 on both sides and IEEE on both sides.  Alone and with DRY_RUN=1 on a CPU-only torch (this
# section's cheap dry run: no 5.5 GB CUDA torch), lltm-cuda is not built and its tests do not run;
# lltm-triton's own tests then run under Triton's interpreter.
# triton_checks kit: the build and the kit; triton_checks rest: the tests and the benchmark; no
# argument: all of it.
triton_checks() {
    local part=${1:-all}
    if [[ $part != rest ]]; then
        triton_build_and_kit || return 1
    fi
    [[ $part == kit ]] && return 0
    # On the GPU: compiled for it, and test_gpu.py's skip is an error.  Without one: the interpreter.
    # Compiling every variant for sm_90 without loading it (test_compiled.py) needs no GPU: nox -s triton does it.
    LLTM_REQUIRE_GPU=$([[ -n $NO_GPU ]] && echo 0 || echo 1) TRITON_INTERPRET=$([[ -n $NO_GPU ]] && echo 1 || echo 0) \
        step triton-tests 150 "$PYTHON" -m pytest -p no:cacheprovider -q -rs backends/lltm_triton/tests \
        --ignore=backends/lltm_triton/tests/test_compiled.py --lltm-seed "$LLTM_SEED" || true
    step triton-benchmark 150 "$PYTHON" benchmarks/bench_triton.py --markdown "$STEP_LOGS/bench_triton.md" || true
    [[ ${RESULTS[*]} != *FAIL* ]]
}

triton_build_and_kit() {
    local dists=(./backends/lltm_triton)
    if [[ ${GPU_CHECK_ONLY:-} == triton ]]; then
        dists=(. ./backends/lltm_ref ./backends/lltm_triton)
        if [[ -n $NO_GPU ]] && ! "$PYTHON" -c 'import sys, torch; sys.exit(torch.version.cuda is None)'; then
            echo "DRY_RUN=1 with a CPU-only torch: lltm-cuda is not built; the comparison runs without it."
        else
            dists+=("$(cuda_dist)")
        fi
    fi
    step triton-build 200 bash -c '"$0" -m pip install "$@" && "$0" -c "import triton, lltm_triton
print(\"triton\", triton.__version__, \"| lltm-triton:\", lltm_triton.unavailable_reason() or \"available\")"' \
        "$PYTHON" "${site_args[@]}" --no-build-isolation --no-deps --no-index "${dists[@]}" || return 1
    step triton-kit 180 "$PYTHON" -m pytest -p no:cacheprovider -q -rs --pyargs lltm_core.testing \
        --lltm-backend triton --lltm-device cuda --lltm-seed "$LLTM_SEED" \
        --lltm-dtype float32 --lltm-dtype float64 --lltm-dtype float16 --lltm-dtype bfloat16 || true
}

REPORT_HEAD=()  # the report's first lines: computed once (python and nvidia-smi take seconds)

report() {
    if ((${#REPORT_HEAD[@]} == 0)); then
        local gpu
        gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1 || true)
        gpu=${gpu:-no GPU, none}
        REPORT_HEAD=(
            "# lltm-cuda GPU check: ${gpu%%,*}"
            ""
            "Command: \`bash benchmarks/gpu_check.sh\` ($([[ -n ${LLTM_CUDA_WHEEL:-} ]] && echo "LLTM_CUDA_WHEEL=$LLTM_CUDA_WHEEL" || echo "TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST")), $(date -u +"%Y-%m-%d %H:%M UTC")."
            "$("$PYTHON" -c 'import torch; print(f"torch {torch.__version__} (CUDA {torch.version.cuda})")' 2>&1), nvcc $("$NVCC" --version 2>/dev/null | grep -o 'release [0-9.]*' || echo '?'), driver ${gpu#*, }."
            "Seed of the kit and of lltm-cuda's tests: $LLTM_SEED (LLTM_SEED=$LLTM_SEED repeats it)."
        )
    fi
    printf '%s\n' "${REPORT_HEAD[@]}"
    echo
    echo "| step | result | seconds | last line |"
    echo "| --- | --- | --- | --- |"
    printf '%s\n' "${RESULTS[@]}"
    if [[ -f $STEP_LOGS/boundary.md ]]; then
        printf '\n## The cost of a kernel boundary (benchmarks/kernel_boundary.py)\n\n'
        cat "$STEP_LOGS/boundary.md"
    fi
    local part
    for part in persistent cell_device sequence cell triton; do
        if [[ -f $STEP_LOGS/bench_$part.md ]]; then
            echo
            if [[ $part == persistent ]]; then
                echo "## lltm-cuda's sequence paths against cuDNN's nn.LSTM (benchmarks/persistent_vs_cudnn.py)"
            elif [[ $part == cell_device ]]; then
                echo "## The cell at B16 I32 S128 in device time (benchmarks/bench_gpu.py --part cell-device)"
            elif [[ $part == triton ]]; then
                echo "## Benchmark: lltm-triton (benchmarks/bench_triton.py)"
            else
                echo "## Benchmark: the $part (benchmarks/bench_gpu.py --part $part)"
            fi
            echo
            cat "$STEP_LOGS/bench_$part.md"
        fi
    done
    local log
    for log in profile sanitizer-racecheck sanitizer-synccheck aoti-backtrace; do
        if [[ -f $STEP_LOGS/$log.log ]]; then
            printf '\n## %s\n\n```\n' "$log"
            tail -n 80 "$STEP_LOGS/$log.log"
            printf '```\n'
        fi
    done
}

status=0
checks || status=$?
report | tee "$OUT/$GPU_CHECK_NAME.md"
echo "gpu_check.sh: exit $status; log and report in $OUT"
exit "$status"
