"""CPU speed of w4a16_gemm against its baselines, measured in the same run.

For each (M, K, N) it prints the median time of:

* ``w4a16``: ``torch.ops.w4kernels.w4a16_gemm`` (int4 Marlin weight, K*N/2 bytes);
* ``mm_f32``: ``torch.matmul`` in fp32 on the dequantized weight (4*K*N bytes);
* ``mm_half``: ``torch.matmul`` in the activation dtype on the dequantized weight (2*K*N bytes;
  for fp16 only up to M = 16: torch's CPU fp16 matmul is unoptimized and takes seconds);
* ``ref``: the un-fused path a user would write without the kernel: dequantize with
  ``reference.marlin_dequantize`` and then ``torch.matmul`` in the activation dtype (only for
  M = 1 and 256 by default: it is slow);

and the ratios ``w4a16`` / baseline (> 1 means the kernel is faster) plus the kernel's weight
bandwidth (GB/s of int4 weight streamed).

Several copies of every weight are rotated so the working set exceeds the 32 MiB L3 and each
call streams its weight from DRAM, as in a real model. The machine is shared: run it when
nothing else is compiling, and read the spread (min..max of the repeats) as the noise level.

    PYTHONPATH=$PWD/python python benchmarks/bench_w4a16_cpu.py [--dtype bf16] [--quick]
        [--threads 1] [--ms 1,16]
"""

import argparse
import os
import statistics
import time

import torch

import w4kernels
from w4kernels import reference as R

SHAPES = [(4096, 4096), (4096, 11008), (11008, 4096)]
MS = [1, 16, 64, 256]
L3_BYTES = 32 << 20


def make_weight(size_k, size_n, group_size, dtype, gen):
    q = torch.randint(0, 16, (size_k, size_n), dtype=torch.int32, generator=gen)
    g = 1 if group_size == -1 else size_k // group_size
    s = (torch.rand(g, size_n, generator=gen) * 0.01 + 0.001).to(dtype)
    return R.marlin_pack(q), R.marlin_permute_scales(s, size_k, size_n, group_size)


def copies_for(nbytes, minimum=2):
    """How many copies of an nbytes operand exceed the L3 twice over."""
    return max(minimum, -(-2 * L3_BYTES // nbytes))


def timeit(fn, args_list, repeats, warmup=2):
    t0 = time.perf_counter()
    for i in range(warmup):
        fn(*args_list[i % len(args_list)])
    if time.perf_counter() - t0 > 2.0:  # e.g. torch's fp16 matmul on CPU: a few samples do
        repeats = min(repeats, 3)
    times = []
    for i in range(repeats):
        args = args_list[i % len(args_list)]
        t0 = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t0)
    return statistics.median(times), min(times), max(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    # fp16 / bf16 as in the demo and bench_gpu_gemm.py; torch's names (the old spelling here)
    # still work.
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"],
                    type=lambda s: {"bfloat16": "bf16", "float16": "fp16"}.get(s, s))
    ap.add_argument("--group-size", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--quick", action="store_true", help="first shape only, fewer repeats")
    ap.add_argument("--ref-ms", default="1,256", help="M values that also time the ref path")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    ap.add_argument("--ms", default=",".join(map(str, MS)), help="comma-separated M values")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    ms = [int(m) for m in args.ms.split(",")]
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    shapes = SHAPES[:1] if args.quick else SHAPES
    repeats = 5 if args.quick else args.repeats
    ref_ms = {int(m) for m in args.ref_ms.split(",") if m}
    gen = torch.Generator().manual_seed(0)
    op = torch.ops.w4kernels.w4a16_gemm
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    print(f"threads={torch.get_num_threads()} dtype={args.dtype} group_size={args.group_size} "
          f"repeats={repeats} torch={torch.__version__} avx512f={'avx512f' in flags} "
          f"avx512_bf16={'avx512_bf16' in flags} W4K_CPU_ISA={os.environ.get('W4K_CPU_ISA')} "
          f"load={os.getloadavg()[0]:.1f}")
    print(f"{'M':>4} {'K':>6} {'N':>6} | {'w4a16 ms':>9} {'(min..max)':>15} {'GB/s':>6} | "
          f"{'mm_f32':>8} {'x':>5} | {'mm_half':>8} {'x':>5} | {'ref':>8} {'x':>5}")
    for size_k, size_n in shapes:
        n_q = copies_for(size_k * size_n // 2)
        weights = [make_weight(size_k, size_n, args.group_size, dtype, gen) for _ in range(n_q)]
        w_half = R.marlin_dequantize(weights[0][0], weights[0][1], None, None, size_k, size_n)
        n_f32 = copies_for(4 * size_k * size_n)
        w_f32 = [w_half.float().clone() for _ in range(n_f32)]
        w_h = [w_half.clone() for _ in range(copies_for(2 * size_k * size_n))]
        ws = w4kernels.ops.marlin_workspace(size_n)
        for m in ms:
            a = torch.randn(m, size_k, generator=gen).to(dtype)
            a32 = a.float()

            def run(bq, bs):
                return op(a, bq, bs, None, None, None, ws, 4, m, size_n, size_k, True, None, True)

            t, tmin, tmax = timeit(run, weights, repeats)
            t32 = timeit(lambda w: torch.matmul(a32, w), [(w,) for w in w_f32], repeats)[0]
            th = None
            if dtype == torch.bfloat16 or m <= 16:  # CPU fp16 matmul takes seconds beyond
                th = timeit(lambda w: torch.matmul(a, w), [(w,) for w in w_h], repeats)[0]
            ref_txt = f"{'-':>8} {'-':>5}"
            if m in ref_ms:
                def ref(bq, bs):
                    w = R.marlin_dequantize(bq, bs, None, None, size_k, size_n)
                    return torch.matmul(a, w)
                tr = timeit(ref, weights, max(3, repeats // 5), warmup=1)[0]
                ref_txt = f"{tr * 1e3:8.2f} {tr / t:5.1f}"
            gbs = size_k * size_n / 2 / t / 1e9
            half_txt = f"{th * 1e3:8.2f} {th / t:5.2f}" if th else f"{'-':>8} {'-':>5}"
            print(f"{m:>4} {size_k:>6} {size_n:>6} | {t * 1e3:9.3f} "
                  f"({tmin * 1e3:6.2f}..{tmax * 1e3:6.2f}) {gbs:6.2f} | "
                  f"{t32 * 1e3:8.2f} {t32 / t:5.2f} | {half_txt} | {ref_txt}",
                  flush=True)


if __name__ == "__main__":
    main()
