#!/usr/bin/env bash
# Static SASS figures of the awq_gemm kernels (method: ../shared/GPU.md): compiles
# csrc/kernels/sass/awq_gemm_tu.cu for sm_80 and sm_90 with the flags the public kernels' figures
# were measured with (+ -warn-spills) and prints ../shared/tools/sass_stats.py's main-loop table.
#   bash scripts/sass_awq.sh [OUTDIR] [extra sass_stats.py args]     (default OUTDIR build/sass)
# Needs nvcc and a cuobjdump (../shared/tools/get-cuobjdump.sh fetches one: CUDA 13 ships none).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-build/sass}"
shift || true
tools="${W4K_SASS_TOOLS:-../shared/tools}"
mkdir -p "$out"
cuobjdump="${CUOBJDUMP:-$(bash "$tools/get-cuobjdump.sh" 2>/dev/null | tail -n 1)}"
tu=csrc/kernels/sass/awq_gemm_tu.cu
for arch in 80 90; do
    obj="$out/awq_gemm_tu_sm${arch}.o"
    log="$out/awq_gemm_tu_sm${arch}.log"
    nvcc -c -std=c++17 -O3 -D__CUDA_NO_HALF_OPERATORS__ -D__CUDA_NO_HALF_CONVERSIONS__ \
        -D__CUDA_NO_BFLOAT16_CONVERSIONS__ -D__CUDA_NO_HALF2_OPERATORS__ \
        --expt-relaxed-constexpr -gencode "arch=compute_${arch},code=sm_${arch}" -lineinfo \
        -Xptxas -v -Xptxas -warn-spills -Icsrc "$tu" -o "$obj" 2> "$log" \
        || { cat "$log"; exit 1; }
    python3 "$tools/sass_stats.py" "$obj" --ptxas-log "$log" --cuobjdump "$cuobjdump" \
        --kernel awq_gemm_kernel --format mdloop "$@"
done
