"""Benchmark: KleidiAI-format int4 matmul (w4kernels) against its baselines, in one run.

For M in {1, 4, 16, 64, 256} and (N, K) in {(4096, 4096), (11008, 4096), (4096, 11008)} it times:
  ours      w4kernels.dyn_quant_matmul_4bit (LHS quantize-and-pack + matmul; per-channel, or
            per-block with --block-size)
  torch_dq  torch.ops.aten._dyn_quant_matmul_4bit on the same inputs (x86: reference loops)
  fp32      torch.matmul(x, W.T) in float32 (MKL)
  bf16      torch.matmul in bfloat16 (oneDNN)
and two machine probes:
  copy      a 512 MiB tensor copy: (bytes read + bytes written) / time; also a read-only sum
  peak      the int8 dot-product peak of the threads used: independent vpdpbusd (AVX-512 VNNI)
            or vpmaddubsw+vpmaddwd (AVX2) chains on every thread (a tiny inline extension)

Weights rotate through enough copies to exceed 4x the L3 (32 MiB here), so M=1 times memory,
not cache. Every time is the median of --repeats runs; the spread (max/min of the middle half)
is printed with it. The machine may be shared: run it on a quiet machine, and read the spread.

Usage: PYTHONPATH=python python benchmarks/bench_kleidiai.py [--repeats 9] [--block-size 0]
"""

import argparse
import os
import statistics
import time

# Spinning OpenMP workers make every multi-threaded library (ours, MKL, oneDNN) collapse to
# whole scheduler time slices (times of exactly 4, 8, 16 ms) when the machine is shared with
# other busy processes: a worker that spun away its slice is descheduled when the next parallel
# region needs it. Sleeping workers wake promptly. It must be set before OpenMP starts, and it
# applies to all baselines alike; export OMP_WAIT_POLICY=ACTIVE to measure the default.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

import w4kernels  # noqa: E402
from w4kernels import ops  # noqa: E402

L3_BYTES = 32 * 2 ** 20

_PEAK_SRC = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <atomic>
#include <chrono>

// Twelve independent accumulators in named registers (an array would be kept in memory
// and serialize on store forwarding); the asm only hides the constant operands.
#define W4K_12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

__attribute__((target("avx512f,avx512bw,avx512vnni"), noinline))
static int64_t vnni512(int64_t iters) {
#define DECL(i) __m512i acc##i = _mm512_set1_epi32(i);
  W4K_12(DECL)
#undef DECL
  __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(5);
  __asm__("" : "+v"(a), "+v"(b));
  for (int64_t it = 0; it < iters; ++it) {
#define OP(i) acc##i = _mm512_dpbusd_epi32(acc##i, a, b);
    W4K_12(OP)
#undef OP
  }
  __m512i t = _mm512_setzero_si512();
#define SUM(i) t = _mm512_add_epi32(t, acc##i);
  W4K_12(SUM)
#undef SUM
  return _mm512_reduce_add_epi32(t);
}

__attribute__((target("avx2"), noinline))
static int64_t avx2(int64_t iters) {
#define DECL(i) __m256i acc##i = _mm256_set1_epi32(i);
  W4K_12(DECL)
#undef DECL
  __m256i a = _mm256_set1_epi8(3), b = _mm256_set1_epi8(5), one = _mm256_set1_epi16(1);
  __asm__("" : "+v"(a), "+v"(b), "+v"(one));
  for (int64_t it = 0; it < iters; ++it) {
#define OP(i) acc##i = _mm256_add_epi32(acc##i, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), one)); \
              __asm__("" : "+v"(a));
    W4K_12(OP)
#undef OP
  }
  __m256i t = _mm256_setzero_si256();
#define SUM(i) t = _mm256_add_epi32(t, acc##i);
  W4K_12(SUM)
#undef SUM
  alignas(32) int32_t h[8];
  _mm256_store_si256((__m256i*)h, t);
  return h[0] + h[7];
}

// MACs per second over all at::parallel_for threads (each runs `iters` iterations of 12 ops).
double peak_macs(bool use_vnni512, int64_t iters) {
  const int nt = at::get_num_threads();
  auto t0 = std::chrono::steady_clock::now();
  std::atomic<int64_t> sink{0};
  at::parallel_for(0, nt, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) sink += use_vnni512 ? vnni512(iters) : avx2(iters);
  });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return double(nt) * iters * 12 * (use_vnni512 ? 64 : 32) / s + 0.0 * double(sink.load());
}
"""


def int8_peak(isa):
    """Measured int8 multiply-accumulates per second of all threads, or None if unavailable."""
    from torch.utils.cpp_extension import load_inline
    try:
        mod = load_inline("w4k_int8_peak", cpp_sources=_PEAK_SRC, functions=["peak_macs"],
                          extra_cflags=["-O2", "-fopenmp"], extra_ldflags=["-fopenmp"])
    except Exception as e:  # noqa: BLE001  (no compiler: say so, do not invent a number)
        print(f"peak probe unavailable: {e}")
        return None
    vnni = isa == "avx512"
    mod.peak_macs(vnni, 2_000_000)  # warm up
    # The best of several: a time slice lost to another process only lowers a sample.
    return max(mod.peak_macs(vnni, 20_000_000) for _ in range(5))


def timeit(fn, repeats, rotate=1):
    """Median and spread (max/min of the middle half) of `repeats` timed calls."""
    fn(0)
    ts = []
    for i in range(repeats):
        t0 = time.perf_counter()
        fn((i + 1) % rotate)
        ts.append(time.perf_counter() - t0)
    ts.sort()
    q = ts[len(ts) // 4: len(ts) - len(ts) // 4] or ts
    return statistics.median(ts), q[-1] / q[0]


def bandwidths(repeats):
    """(copy GB/s counting bytes read + written, read-only GB/s of a sum) over 512 MiB."""
    a = torch.ones(512 * 2 ** 20 // 4)
    b = torch.empty_like(a)
    t_copy, _ = timeit(lambda i: b.copy_(a), repeats)
    t_read, _ = timeit(lambda i: a.sum(), repeats)
    return 2 * a.numel() * 4 / t_copy, a.numel() * 4 / t_read


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--block-size", type=int, default=0, help="0 = per-channel; else per-block bl")
    p.add_argument("--ms", type=int, nargs="*", default=[1, 4, 16, 64, 256])
    p.add_argument("--shapes", type=str, default="4096x4096,11008x4096,4096x11008",
                   help="comma-separated NxK")
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0 = default)")
    p.add_argument("--torch-dq-budget", type=float, default=4.0,
                   help="seconds per torch_dq point; slow points run fewer repeats (min 1)")
    args = p.parse_args()

    torch.manual_seed(0)
    if args.threads:
        torch.set_num_threads(args.threads)
    nt = torch.get_num_threads()
    isa = ops.kleidiai_isa()
    print(f"torch {w4kernels.build_info()['torch']}  threads={nt}  kernel path={isa}  "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}  "
          f"weights={'per-channel' if not args.block_size else f'per-block bl={args.block_size}'}")
    bw, bw_read = bandwidths(args.repeats)
    peak = int8_peak(isa)
    print(f"copy bandwidth: {bw / 1e9:.1f} GB/s (read + write; %copy below is against this)  "
          f"read-only (sum): {bw_read / 1e9:.1f} GB/s")
    print(f"int8 peak ({nt} threads, "
          f"{'vpdpbusd zmm' if isa == 'avx512' else 'vpmaddubsw'}): "
          f"{'n/a' if peak is None else f'{peak / 1e9:.0f} GMAC/s'}")
    print("times: median ms; ratios = baseline time / our time; wGB/s = K*N/2 weight bytes / our "
          "time; spread = max/min of the middle half of our repeats")
    print(f"{'M':>4} {'N':>6} {'K':>6} | {'ours':>8} {'torch_dq':>9} {'fp32':>8} {'bf16':>8} | "
          f"{'x tdq':>7} {'x fp32':>7} {'x bf16':>7} | {'wGB/s':>6} {'%copy':>6} {'GMAC/s':>7} "
          f"{'%peak':>6}  spread")
    rows = []
    for shape in args.shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        bs = args.block_size or k
        w = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8)
        s = torch.rand(n) * 0.01 if bs == k else (torch.rand(n, k // bs) * 0.01).bfloat16()
        packed = ops.dyn_quant_pack_4bit_weight(w, s, None, bs, k, n)
        copies = max(1, -(-4 * L3_BYTES // packed.numel()))
        packs = [packed] + [packed.clone() for _ in range(copies - 1)]
        tq = torch.ops.aten._dyn_quant_pack_4bit_weight(w, s, None, bs, k, n)
        wf = torch.randn(n, k)
        wb = wf.bfloat16()
        for m in args.ms:
            x = torch.randn(m, k)
            xb = x.bfloat16()
            t_ours, spread = timeit(lambda i: ops.dyn_quant_matmul_4bit(x, packs[i], bs, k, n),
                                    args.repeats, rotate=copies)
            t0 = time.perf_counter()
            torch.ops.aten._dyn_quant_matmul_4bit(x, tq, bs, k, n)
            t_tdq = time.perf_counter() - t0
            reps = min(args.repeats, int(args.torch_dq_budget / max(t_tdq, 1e-9)))
            if reps >= 3:  # else the single (slow, compute-bound) sample stands
                t_tdq, _ = timeit(lambda i: torch.ops.aten._dyn_quant_matmul_4bit(x, tq, bs, k, n), reps)
            t_f32, _ = timeit(lambda i: torch.matmul(x, wf.t()), args.repeats)
            t_b16, _ = timeit(lambda i: torch.matmul(xb, wb.t()), args.repeats)
            wgbs = k * n / 2 / t_ours
            macs = m * n * k / t_ours
            rows.append(dict(m=m, n=n, k=k, ours=t_ours, torch_dq=t_tdq, fp32=t_f32, bf16=t_b16,
                             weight_gbs=wgbs / 1e9, frac_copy=wgbs / bw, gmacs=macs / 1e9,
                             frac_peak=None if peak is None else macs / peak, spread=spread))
            pk = "" if peak is None else f"{100 * macs / peak:>5.0f}%"
            print(f"{m:>4} {n:>6} {k:>6} | {t_ours * 1e3:>8.3f} {t_tdq * 1e3:>9.1f} "
                  f"{t_f32 * 1e3:>8.3f} {t_b16 * 1e3:>8.3f} | {t_tdq / t_ours:>7.1f} "
                  f"{t_f32 / t_ours:>7.2f} {t_b16 / t_ours:>7.2f} | {wgbs / 1e9:>6.1f} "
                  f"{100 * wgbs / bw:>5.0f}% {macs / 1e9:>7.1f} {pk:>6}  x{spread:.2f}", flush=True)
        del packs, tq, wf, wb
    return rows


if __name__ == "__main__":
    main()
