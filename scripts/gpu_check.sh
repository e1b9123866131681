#!/usr/bin/env bash
# gpu_check.sh OUTDIR: every check w4kernels makes on a real GPU, in one unattended run that
# leaves its logs and OUTDIR/summary.md behind.
#
# Expects the project's GPU machines: one NVIDIA GPU (H100 / H200), a CUDA build of torch
# already installed (torch 2.11 + CUDA 13.0 there, not the 2.14.1 of requirements.txt), nvcc
# 13.0 (CUDA_HOME or PATH), compute-sanitizer, and pytest for the test step. It installs
# nothing and needs no network; a missing tool makes its step "skipped", not the run fail.
#
# Steps, in order; each runs even if an earlier one failed, and its rc, duration and key figure
# go into the summary (rewritten after every step, so a run cut short still leaves one):
#   build      only the CUDA module (W4K_SIMT=0 W4K_CUDA=1), in place, for device 0's
#              architecture, against the installed torch -> build.log, ptxas.txt
#   import     w4kernels.build_info() of that build
#   smoke      scripts/gpu_sanitize_cases.py: every kernel variant once, checked against
#              w4kernels.reference -> smoke.log; should it report an illegal instruction,
#              build_no_l2_hint + smoke_no_l2_hint rebuild without the weight copies' L2 hint
#              (W4K_L2_CACHE_HINTS=0) and run it again, and the later steps use that build
#   tests      pytest tests -k cuda (the cuda backend) -> tests-cuda.log, tests-cuda.xml
#   bench_gpu_gemm, bench_gpu_gemm_graph (M <= 128 from CUDA-graph replays, with the A/B of
#              w4a16_gemm's split-K partitions: none, the uniform split of before 2026-11-27, 1,
#              2 and 4 balanced blocks per SM, against the planner's choice), bench_cuda_repack
#              -> bench_*.log (their tables are copied into the summary)
#   kernel_ab  scripts/gpu_kernel_ab.sh: build-time variants of w4a16_gemm's kernel (the open
#              leads) against the default, the kernel alone -> kernel_ab.log, kernel_ab/
#   memcheck, racecheck, synccheck, initcheck
#              compute-sanitizer --tool <tool> on scripts/gpu_sanitize_cases.py -> <tool>.log
#   profile    Nsight Compute on w4a16_gemm at M = 1 and 128 -> profile.log
#   profile_source
#              Nsight Compute's warp-stall samples per SASS instruction of the 16-row kernel
#              (8192 x 28672, M = 1) -> profile_source.csv (+ .top.txt: top opcodes, instructions)
#
# Environment: GPU_CHECK_QUICK=1 (smaller benchmarks), GPU_CHECK_BUDGET_S (default 540: later
# steps get shorter timeouts, or are skipped, so the run fits one 10-minute device call),
# GPU_CHECK_DRY_RUN=1 (print each step's command instead of running it; needs no GPU),
# GPU_CHECK_SKIP="STEP ..." (steps recorded as skipped, e.g. "bench_cuda_repack profile"),
# PYTHON (default python), MAX_JOBS (default: all cores).
# Without a GPU it prints one line, writes a summary saying "no GPU" and exits 0. Otherwise the
# exit status is 0 when every step that ran passed, 1 if any failed or timed out.
set -uo pipefail

if [[ $# -ne 1 ]]; then
    echo "usage: $0 OUTDIR" >&2
    exit 2
fi
mkdir -p "$1" || exit 2
OUTDIR=$(cd "$1" && pwd)
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
PYTHON=${PYTHON:-python}
QUICK=${GPU_CHECK_QUICK:-0}
DRY_RUN=${GPU_CHECK_DRY_RUN:-0}
BUDGET_S=${GPU_CHECK_BUDGET_S:-540}
RESERVE_S=10  # kept back for the summary
START=$SECONDS
FAILED=0

report() { "$PYTHON" "$ROOT/scripts/gpu_check_report.py" "$@"; }

# ---- is there a GPU? -------------------------------------------------------------------------
# torch decides, as the tests do; device 0's compute capability is the only architecture built.
if [[ $DRY_RUN == 1 ]]; then
    ARCH=${TORCH_CUDA_ARCH_LIST:-9.0}
    GPU_NAME="(dry run: no GPU used)"
else
    ARCH=$("$PYTHON" -c 'import torch
if torch.cuda.is_available():
    print("%d.%d" % torch.cuda.get_device_capability(0))' 2> "$OUTDIR/detect.log")
    detect_rc=$?
    if ((detect_rc != 0)); then  # a broken torch is an error, not "no GPU"
        echo "gpu_check: '$PYTHON -c \"import torch\"' failed (rc $detect_rc):" \
             "$(tail -n 1 "$OUTDIR/detect.log")" >&2
        printf '# gpu_check: torch failed to import\n\nSee detect.log.\n' > "$OUTDIR/summary.md"
        exit 1
    fi
    if [[ -z $ARCH ]]; then
        echo "gpu_check: no GPU visible (torch.cuda.is_available() is False); nothing to check." \
             "Summary: $OUTDIR/summary.md"
        { echo "# gpu_check: no GPU"
          echo
          echo "No GPU visible to torch on $(hostname) ($(date -u +%FT%TZ)):" \
               "torch.cuda.is_available() is False; no step ran."
        } > "$OUTDIR/summary.md"
        exit 0
    fi
    GPU_NAME=$("$PYTHON" -c 'import torch; print(torch.cuda.get_device_name(0))' 2>/dev/null)
fi

# ---- environment, for the summary's header ---------------------------------------------------
NVCC=$(command -v nvcc || echo "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc")
SANITIZER=$(command -v compute-sanitizer || true)
for candidate in "${CUDA_HOME:-/usr/local/cuda}"/{bin,compute-sanitizer}/compute-sanitizer; do
    [[ -z $SANITIZER && -x $candidate ]] && SANITIZER=$candidate
done
{
    echo "# gpu_check: $GPU_NAME (sm_${ARCH/./})"
    echo
    echo "- date: $(date -u +%FT%TZ), host $(hostname), commit" \
         "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "- torch: $("$PYTHON" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tail -n 1)"
    echo "- nvcc: $("$NVCC" --version 2>/dev/null | grep -o 'release [0-9.]*' || echo 'not found')"
    echo "- driver: $(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1 || echo unknown)"
    echo "- compute-sanitizer: ${SANITIZER:-not found}; ninja: $(command -v ninja >/dev/null && echo yes || echo 'no (serial build)')"
    echo "- quick: $QUICK; time budget: ${BUDGET_S}s"
} > "$OUTDIR/header.md"
: > "$OUTDIR/steps.tsv"

# ---- running and recording steps -------------------------------------------------------------

# record STEP RC SECONDS FIGURE LOG: one row of the summary table, then the summary rewritten.
record() {
    printf '%s\t%s\t%s\t%s\t%s\n' "$@" >> "$OUTDIR/steps.tsv"
    [[ $2 != 0 && $2 != skipped ]] && FAILED=1
    report summary "$OUTDIR"
}

# key_figure STEP LOG: the one line the summary shows for a finished step.
key_figure() {
    case $1 in
        build) report ptxas "$OUTDIR/$2" "$OUTDIR/ptxas.txt" ;;
        import) grep -E "^\{" "$OUTDIR/$2" | tail -n 1 ;;
        smoke*) grep -Eo "[0-9]+ of [0-9]+ cases ok" "$OUTDIR/$2" | tail -n 1 ;;
        build_no_l2_hint) report ptxas "$OUTDIR/$2" "$OUTDIR/ptxas_no_l2_hint.txt" ;;
        tests) report junit "$OUTDIR/tests-cuda.xml" ;;
        memcheck | racecheck | synccheck | initcheck) report sanitizer "$OUTDIR/$2" ;;
        bench_*) echo "$(grep -c MISMATCH "$OUTDIR/$2") mismatches; tables below" ;;
        kernel_ab) echo "$(grep -c '^== ' "$OUTDIR/$2") variant runs; table below" ;;
        profile) report ncu "$OUTDIR/$2" ;;
        profile_source) report stalls "$OUTDIR/profile_source.csv" ;;
    esac
}

# run_step STEP TIMEOUT_S LOG CMD...: run CMD (output to OUTDIR/LOG) under a timeout cut to
# what is left of the budget, and record it. rc 124: timed out.
run_step() {
    local step=$1 limit=$2 log=$3
    shift 3
    if [[ " ${GPU_CHECK_SKIP:-} " == *" $step "* ]]; then
        record "$step" skipped 0 "GPU_CHECK_SKIP" "-"
        return
    fi
    local left=$((BUDGET_S - (SECONDS - START) - RESERVE_S))
    if ((left < 20)); then
        record "$step" skipped 0 "time budget spent" "-"
        return
    fi
    ((limit > left)) && limit=$left
    if [[ $DRY_RUN == 1 ]]; then
        echo "[dry run] $step (timeout ${limit}s): $(printf "%q " "$@")"
        record "$step" 0 0 "dry run" "$log"
        return
    fi
    echo "gpu_check: $step (timeout ${limit}s) -> $log"
    local t0=$SECONDS rc
    timeout --kill-after=10 "$limit" "$@" > "$OUTDIR/$log" 2>&1
    rc=$?
    local figure
    figure=$(key_figure "$step" "$log" 2>/dev/null)
    ((rc == 124 || rc == 137)) && figure="timed out after ${limit}s; $figure"
    record "$step" "$rc" $((SECONDS - t0)) "$figure" "$log"
}

skip_step() {  # skip_step STEP WHY
    echo "gpu_check: $1 skipped: $2"
    record "$1" skipped 0 "$2" "-"
}

# The in-place build comes first on the path; unbuffered output keeps a killed step's log.
export PYTHONPATH="$ROOT/python${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

# ---- 1. build: the CUDA module only, for this GPU, against the torch installed here ----------
# Its own build-temp so objects of a CPU / emulator build in build/ are never mixed in.
run_step build 300 build.log env W4K_SIMT=0 W4K_CUDA=1 TORCH_CUDA_ARCH_LIST="$ARCH" \
    MAX_JOBS="${MAX_JOBS:-$(nproc)}" "$PYTHON" setup.py build_ext --inplace \
    --build-temp build/gpu-check
run_step import 60 import.log "$PYTHON" -c \
    'import json, w4kernels; print(json.dumps(w4kernels.build_info()))'

# ---- 2. correctness: every kernel variant once, then the cuda backend of the test suite -----
run_step smoke 120 smoke.log "$PYTHON" scripts/gpu_sanitize_cases.py
# The GEMMs' weight copies carry an L2 evict_first hint; the first H100 run faulted on them
# (illegal instruction: a ptxas encoding bug, worked around since, csrc/kernels/ptx.cuh). Should
# the smoke cases fault so again, rebuild without the hint (step build_no_l2_hint) so that the
# remaining steps still measure something, and say so in the summary.
if [[ $DRY_RUN != 1 ]] && grep -qi "illegal instruction" "$OUTDIR/smoke.log" 2>/dev/null; then
    echo "gpu_check: illegal instruction in the smoke cases: rebuilding with W4K_L2_CACHE_HINTS=0"
    run_step build_no_l2_hint 300 build_no_l2_hint.log env W4K_SIMT=0 W4K_CUDA=1 \
        W4K_L2_CACHE_HINTS=0 TORCH_CUDA_ARCH_LIST="$ARCH" MAX_JOBS="${MAX_JOBS:-$(nproc)}" \
        "$PYTHON" setup.py build_ext --inplace --build-temp build/gpu-check-no-l2-hint
    run_step smoke_no_l2_hint 120 smoke_no_l2_hint.log "$PYTHON" scripts/gpu_sanitize_cases.py
fi
if [[ $DRY_RUN == 1 ]] || "$PYTHON" -c 'import pytest' 2>/dev/null; then
    run_step tests 240 tests-cuda.log "$PYTHON" -m pytest tests -q -k cuda -p no:cacheprovider \
        --junitxml="$OUTDIR/tests-cuda.xml"
else
    skip_step tests "pytest is not installed"
fi

# ---- 3. benchmarks (before the sanitizers, whose steps a short budget drops first) ----------
quick_flag=()
[[ $QUICK == 1 ]] && quick_flag=(--quick)
run_step bench_gpu_gemm 240 bench_gpu_gemm.log "$PYTHON" benchmarks/bench_gpu_gemm.py \
    ${quick_flag[@]+"${quick_flag[@]}"}
# The small-M rows again from CUDA-graph replays (decode as vLLM runs it: no launch gaps), with
# the split-K partitions' A/B (same run, same weights; "V x" > 1: V beats the planner).
run_step bench_gpu_gemm_graph 150 bench_gpu_gemm_graph.log "$PYTHON" benchmarks/bench_gpu_gemm.py \
    --graph --dtype fp16 --m 1 4 16 64 128 --split-blocks none old 1x 2x 4x \
    ${quick_flag[@]+"${quick_flag[@]}"}
run_step bench_cuda_repack 120 bench_cuda_repack.log "$PYTHON" benchmarks/bench_cuda_repack.py \
    ${quick_flag[@]+"${quick_flag[@]}"}
# The kernel's open leads, each a build-time variant of the kernel alone (no torch) timed against
# the default in one run (scripts/gpu_kernel_ab.sh; README "Measured on an H200 (2026-11-28)"):
# the B-source lag, and the header of 26cfa72 (scales copied once per 32-row quarter) where git
# can show it. GPU_CHECK_AB="NAME=FLAGS ..." replaces the list (flags without spaces).
ab_variants=(base= blag=-DW4K_W4A16_B_LAG=1)
if [[ $DRY_RUN != 1 ]] && git cat-file -e 26cfa72:csrc/kernels/w4a16_gemm.cuh 2>/dev/null; then
    mkdir -p "$OUTDIR/ab_26cfa72/kernels"
    git show 26cfa72:csrc/kernels/w4a16_gemm.cuh > "$OUTDIR/ab_26cfa72/kernels/w4a16_gemm.cuh" &&
        ab_variants+=("scales_x4=-I$OUTDIR/ab_26cfa72")
fi
[[ -n ${GPU_CHECK_AB:-} ]] && read -r -a ab_variants <<< "$GPU_CHECK_AB"
run_step kernel_ab 150 kernel_ab.log env AB_M="1 16" bash scripts/gpu_kernel_ab.sh \
    "$OUTDIR/kernel_ab" "${ab_variants[@]}"

# ---- 4. compute-sanitizer on the same cases ------------------------------------------------
# No caching allocator: every tensor is its own cudaMalloc, so memcheck sees its true bounds
# and initcheck sees fresh (uninitialized) memory rather than recycled blocks.
# initcheck leaves out the dense-path cases: on an H100 (compute-sanitizer of CUDA 13.0,
# 2026-11-24) it reported every byte of their output, which cuBLAS's matmul writes, as
# uninitialized when the result was copied back (the results matched the reference; memcheck,
# racecheck and synccheck were clean on the same cases) and spent its whole timeout listing them.
for tool in memcheck racecheck synccheck initcheck; do
    if [[ -z $SANITIZER && $DRY_RUN != 1 ]]; then
        skip_step "$tool" "compute-sanitizer not found"
        continue
    fi
    exclude=()
    [[ $tool == initcheck ]] && exclude=(-x "dense path")
    run_step "$tool" 150 "$tool.log" env PYTORCH_NO_CUDA_MEMORY_CACHING=1 \
        "${SANITIZER:-compute-sanitizer}" --tool "$tool" --error-exitcode 3 --print-limit 50 \
        "$PYTHON" scripts/gpu_sanitize_cases.py ${exclude[@]+"${exclude[@]}"}
done

# ---- 5. Nsight Compute on w4a16_gemm, M = 1 and 128 (4096 x 4096, fp16): time, DRAM %, issue
# use, eligible warps per scheduler (gpu_check_report.py ncu), the figures that say what bounds
# the kernel; the sections stay in profile.log.
NCU=$(command -v ncu || true)
if [[ -z $NCU && $DRY_RUN != 1 ]]; then
    skip_step profile "ncu not found"
else
    run_step profile 150 profile.log bash -c 'for m in 1 128; do
        "$0" --section SpeedOfLight --section SchedulerStats --section WarpStateStats \
            --section Occupancy --section LaunchStats -k regex:w4a16_gemm_kernel -c 1 \
            "$1" benchmarks/bench_gpu_gemm.py --quick --dtype fp16 --m "$m" || exit; done' \
        "${NCU:-ncu}" "$PYTHON"
fi

# ---- 6. Nsight Compute's warp-stall sampling per SASS instruction: w4a16_gemm's kernel alone
# (benchmarks/gpu/bench_w4a16_kernel.cu, -lineinfo) on 8192 x 28672 at M = 1. The key figure: the
# opcodes with the most samples and their main reason (gpu_check_report.py stalls); the source
# page in profile_source.csv, its top ten opcodes and instructions in profile_source.csv.top.txt.
if [[ -z $NCU && $DRY_RUN != 1 ]]; then
    skip_step profile_source "ncu not found"
else
    run_step profile_source 150 profile_source.log bash -c '
        "$0" -O3 -std=c++17 -arch="sm_$1" -lineinfo -I csrc -o "$3/profile_source.bin" \
            benchmarks/gpu/bench_w4a16_kernel.cu || exit
        W4K_BENCH_SHAPE=8192x28672 "$2" --clock-control none -k regex:w4a16_gemm_kernel -c 1 \
            --section SourceCounters --section WarpStateStats -f -o "$3/profile_source" \
            "$3/profile_source.bin" 1 || exit
        "$2" --import "$3/profile_source.ncu-rep" --page source --print-source sass --csv \
            > "$3/profile_source.csv"' "$NVCC" "${ARCH/./}" "${NCU:-ncu}" "$OUTDIR"
fi

echo "gpu_check: done in $((SECONDS - START))s; summary: $OUTDIR/summary.md"
sed -n '/^| step/,/^$/p' "$OUTDIR/summary.md"
exit $FAILED
