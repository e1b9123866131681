#!/usr/bin/env bash
# Static SASS figures of the CUDA GEMM kernels (method: ../shared/GPU.md): compiles the torch-free
# translation units in csrc/kernels/sass/ for sm_80 and sm_90 with the flags the figures of the
# public kernels were measured with, and prints ../shared/tools/sass_stats.py's main-loop table.
#   bash scripts/sass_report.sh [OUTDIR] [TU-name-regex, e.g. awq or w4a16]   (default build/sass)
# W4K_SASS_NVCC_FLAGS adds nvcc flags (e.g. -DW4K_L2_CACHE_HINTS=1 for the hinted weight copies).
# Needs nvcc and a cuobjdump (../shared/tools/get-cuobjdump.sh fetches one: CUDA 13 ships none).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-build/sass}"
filter="${2:-.}"
tools="${W4K_SASS_TOOLS:-../shared/tools}"
mkdir -p "$out"
cuobjdump="${CUOBJDUMP:-$(bash "$tools/get-cuobjdump.sh" 2>/dev/null | tail -n 1)}"
for tu in csrc/kernels/sass/*_tu.cu; do
    name=$(basename "$tu" .cu)
    [[ "$name" =~ $filter ]] || continue
    for arch in 80 90; do
        obj="$out/${name}_sm${arch}.o"
        nvcc -c -std=c++17 -O3 -D__CUDA_NO_HALF_OPERATORS__ -D__CUDA_NO_HALF_CONVERSIONS__ \
            -D__CUDA_NO_BFLOAT16_CONVERSIONS__ -D__CUDA_NO_HALF2_OPERATORS__ \
            --expt-relaxed-constexpr -gencode "arch=compute_${arch},code=sm_${arch}" -lineinfo \
            -Xptxas -v -Xptxas -warn-spills ${W4K_SASS_NVCC_FLAGS:-} -Icsrc "$tu" -o "$obj" \
            2> "$out/${name}_sm${arch}.log" \
            || { cat "$out/${name}_sm${arch}.log"; exit 1; }
        python3 "$tools/sass_stats.py" "$obj" --ptxas-log "$out/${name}_sm${arch}.log" \
            --cuobjdump "$cuobjdump" --format mdloop
        python3 scripts/sass_desc_check.py "$obj" --cuobjdump "$cuobjdump" | tail -n 1
    done
done
