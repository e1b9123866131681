#!/usr/bin/env bash
# gpu_kernel_ab.sh OUTDIR NAME=FLAGS ...: A/B of compile-time variants of w4a16_gemm's CUDA kernel
# on a GPU machine, without building the extension: each variant is
# benchmarks/gpu/bench_w4a16_kernel.cu compiled with its nvcc flags (all in parallel, for device
# 0's architecture), then the variants run in turn, the whole round twice (A B C A B C: the
# spread between rounds is the noise). Logs: OUTDIR/NAME.build.log, OUTDIR/NAME.run1.txt, .run2.
#
#   bash scripts/gpu_kernel_ab.sh /tmp/ab base= s8=-DW4K_W4A16_STAGES_16ROW=8
#
# A variant's flags come before -I csrc, so "-I DIR" puts DIR's headers first: an older kernel,
# e.g. git show COMMIT:csrc/kernels/w4a16_gemm.cuh > ab_old/kernels/w4a16_gemm.cuh, then
# old="-I ab_old" (a folder the device machine receives: not ignored by git, or carried).
#
# Environment: AB_M (default "1 16": the values of M), NVCC (default nvcc on PATH or CUDA_HOME).
set -uo pipefail
if [[ $# -lt 2 ]]; then
    echo "usage: $0 OUTDIR NAME=FLAGS ..." >&2
    exit 2
fi
OUT=$1
shift
mkdir -p "$OUT" || exit 2
cd "$(dirname "$0")/.." || exit 2
NVCC=${NVCC:-$(command -v nvcc || echo "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc")}
ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d .)
if [[ -z $ARCH ]]; then
    echo "gpu_kernel_ab: no GPU visible (nvidia-smi reports none); nothing to measure"
    exit 0
fi
names=()
for spec in "$@"; do
    name=${spec%%=*}
    flags=${spec#*=}
    names+=("$name")
    # shellcheck disable=SC2086  # the flags are words
    "$NVCC" -O3 -std=c++17 -arch="sm_$ARCH" $flags -I csrc -Xptxas -v \
        -o "$OUT/$name.bin" benchmarks/gpu/bench_w4a16_kernel.cu > "$OUT/$name.build.log" 2>&1 &
done
failed=0
for job in $(jobs -p); do wait "$job" || failed=1; done
for name in "${names[@]}"; do
    if [[ ! -x $OUT/$name.bin ]]; then
        echo "gpu_kernel_ab: $name failed to build:"
        tail -n 5 "$OUT/$name.build.log"
        failed=1
    fi
    echo "$name: $(grep -c 'spill stores' "$OUT/$name.build.log") kernels," \
         "$(grep -E '[1-9][0-9]* bytes spill stores' -c "$OUT/$name.build.log") with spills"
done
read -r -a ms <<< "${AB_M:-1 16}"
for round in 1 2; do
    for name in "${names[@]}"; do
        [[ -x $OUT/$name.bin ]] || continue
        echo "== $name (round $round)"
        "$OUT/$name.bin" "${ms[@]}" | tee "$OUT/$name.run$round.txt" || failed=1
    done
done
exit $failed
