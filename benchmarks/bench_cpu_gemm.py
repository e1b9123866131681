"""CPU 4-bit GEMMs side by side: our Marlin/AWQ/KleidiAI ops against torch and ONNX Runtime.

One run times, on the same threads and weights rotated past the L3 (L3_BYTES; every operand is
copied until the copies total >= 4 x L3, and each call uses the next copy):

* ours: ``awq_gemm`` (AutoAWQ tensors as stored, bf16 and fp16 activations, group 128),
  ``w4a16_gemm`` (Marlin: GPTQ g128, AWQ zero points g128, GPTQ act-order g128; bf16),
  ``dyn_quant_matmul_4bit`` (KleidiAI int8 x int4, block 128, fp32 in/out), and the
  int8-activation mode ``w4a8_gemm`` (Marlin GPTQ g128 and AWQ zero points g128, bf16) and
  ``awq_gemm_a8`` (AutoAWQ tensors, bf16);
* torch: fp32, bf16 and fp16 ``F.linear`` on the dense weight, ``aten._weight_int4pack_mm_for_cpu``
  (bf16, g128), and ``awq_dequantize`` + bf16 ``torch.matmul`` (the un-fused route, which the
  dispatch rule below compares against ``awq_gemm``);
* ONNX Runtime ``MatMulNBits`` (bits 4, block 128, zero points; accuracy level 0 = fp32
  compute, 4 = int8 activations), fp32 activations, spinning workers off, when ``onnxruntime``
  and ``onnx`` are installed (optional: pip install onnxruntime onnx; a line says so when they
  are absent);
* probes: read bandwidth (an AVX-512 load loop over 512 MiB split over the threads, AVX2
  loads on a CPU without AVX-512; torch.sum without a compiler), and the peaks of the threads
  used: fp32 FMA, ``vdpbf16ps`` (bf16 pairs), ``vpdpbusd`` (int8), each 12 independent
  accumulator chains, and on a CPU with AMX-BF16 the tiles' ``TDPBF16PS`` peak (four C tiles,
  operands held in tile registers). Without AVX-512 the chains are ymm: fp32 FMA, int8 as the
  AVX2 kernels multiply (``vpmaddubsw`` + ``vpmaddwd`` + ``vpaddd``, or AVX-VNNI's VEX
  ``vpdpbusd``), and the bf16 rows, fp32 arithmetic there, count against the fp32 FMA peak.

Per row: median ms, weight GB/s (the format's weight bytes, scales included, over the time) and
% of the read probe (``%bw``) and of the same-rounds read (``%rd``: a read of the shape's int4
weight bytes, K N / 2, through the read probe's loop on rotated copies, timed as one more method
in the same rounds, so it shares the methods' moment and their cost of starting the threads;
its own row, ``read (same rounds)``, precedes each M's rows), GFLOP/s (2 M N K) and % of the peak of the row's arithmetic (bf16 dot for
bf16 rows, fp32 FMA for fp32/fp16 rows and ORT level 0, int8 dot for int8 rows; "NN%a": of the
AMX peak, for our rows that run on AMX tiles, counting the four tile products per product of
the fp16 split), and for our rows the ratio to the fastest competitor of the same arithmetic
(>1: we are faster): exact bf16 (torch bf16, torch int4, ORT level 0), exact fp16 (torch fp16,
ORT level 0) or int8 (ORT level 4); the int8-activation rows also get
``x kai``, KleidiAI's ms / ours (the issue's bar for the mode). Then the dispatch rule: the
smallest M from which ``awq_dequantize`` + ``torch.matmul`` beats ``awq_gemm`` on every shape.

``--isa avx2,scalar`` adds ``awq_gemm``, ``w4a16`` and int8-mode (``w4a8``, ``awq_gemm_a8``) rows
run with ``W4K_CPU_ISA`` capped to each value (the AVX2 paths and the portable code on this
machine), timed in the same run; ``--isa noamx`` rows run with ``W4K_CPU_AMX=0`` (the
``vdpbf16ps`` paths on a CPU with AMX).

``--background-load P`` times every point a second time while P processes spin on the cores
and prints each method's slowdown (loaded / quiet), the issue's "under load" check, and per M
the largest slowdown of ours next to torch's own ops'. Loaded, the time of a call is bimodal:
one that runs between the scheduler's preemptions costs about its quiet time, one that a
preemption hits costs a slice more (on the 2-vCPU VM of 2026-12-02, 4096 x 4096 at M = 16:
p10 0.8-1.0 ms, p90 2-6 ms for every op), so the median of a few calls says mostly which mode
they fell in. The loaded figure is therefore the mean of ``--load-repeats`` rounds (default
60, back to back: a model's steady state), against the quiet median.

``--order rounds`` (the default) times the methods of one (shape, M) point in rounds: every
repeat calls each method once, in an order shuffled per round (see ``time_rounds``), so a slow
stretch of a noisy machine (the Zen 5 VM of 2026-12-01 moved 1.5-2x within minutes) falls on
all of them alike and the ratios stay same-moment ratios; ``--order blocks`` times each
method's repeats back to back (the order of the runs quoted in the README before 2026-12-01);
``--order warm-rounds`` is ``rounds`` with each timed call right after an untimed call of the
same method on another weight copy: a GEMM that follows a GEMM, as in a model's layer. On a VM
whose idle vCPUs sleep in the host (2026-12-03: a worker woken after a 5 ms idle stretch first ran
a median 156 us later, p90 4 ms), a call that follows another library's call or an idle gap
pays for waking threads, and the default order charges that to every method in every round.
The loaded phase of ``--background-load`` always runs in rounds.

``OMP_WAIT_POLICY=PASSIVE`` is set (as in bench_kleidiai.py) unless already set.

    PYTHONPATH=$PWD/python python benchmarks/bench_cpu_gemm.py [--quick] [--threads 2]
        [--background-load 2] [--isa avx2,scalar] [--ms 1,4,16,64,256] [--shapes 4096x4096,11008x4096,4096x11008]
        [--order rounds|warm-rounds|blocks]
"""

import argparse
import os
import random
import statistics
import subprocess
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import w4kernels  # noqa: E402,F401  (registers torch.ops.w4kernels)
from w4kernels import ops, quant  # noqa: E402

# The last-level cache the copies must defeat: 32 MiB on the Zen 4 class machine the first
# tables were taken on. On the Intel Xeon (AMX) machine of 2026-11-27, lscpu reports the host's
# 300 MiB, but torch.sum on two threads reads 40-42 GB/s up to 64 MB and 23-26 GB/s from 128 MB
# up: what this VM gets of it is under 128 MB, so 64 MiB (copies >= 256 MB) covers both.
L3_BYTES = 64 << 20
GROUP = 128

_PROBE_SRC = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <atomic>
#include <chrono>

#define W4K_12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

// Twelve independent chains in named registers; the asm hides the constant operands. One
// instantiation per kind, so that only its 12 accumulators are live: with the fp32 and the int32
// chains in one loop (24 accumulators) the Zen 5 VM ran the vpdpbusd chains at 0.8 per cycle
// and printed the int8 rows at up to 167 % of "the peak" (2026-12-06; apart, 1.9 per cycle).
template <int kKind>
__attribute__((target("avx512f,avx512bw,avx512vnni,avx512bf16"), noinline))
static double chains(int64_t iters) {
#define DECL(i) __m512 f##i = _mm512_set1_ps(i); __m512i n##i = _mm512_set1_epi32(i);
  W4K_12(DECL)
#undef DECL
  __m512 a = _mm512_set1_ps(1e-3f), b = _mm512_set1_ps(1e-3f);
  __m512i ia = _mm512_set1_epi8(3), ib = _mm512_set1_epi8(5);
  __asm__("" : "+v"(a), "+v"(b), "+v"(ia), "+v"(ib));
  for (int64_t it = 0; it < iters; ++it) {
    if constexpr (kKind == 0) {
#define OP(i) f##i = _mm512_fmadd_ps(a, b, f##i);
      W4K_12(OP)
#undef OP
    } else if constexpr (kKind == 1) {
#define OP(i) f##i = _mm512_dpbf16_ps(f##i, (__m512bh)ia, (__m512bh)ib);
      W4K_12(OP)
#undef OP
    } else {
#define OP(i) n##i = _mm512_dpbusd_epi32(n##i, ia, ib);
      W4K_12(OP)
#undef OP
    }
  }
  __m512 t = _mm512_setzero_ps();
#define SUM(i) t = _mm512_add_ps(t, kKind == 2 ? _mm512_cvtepi32_ps(n##i) : f##i);
  W4K_12(SUM)
#undef SUM
  return _mm512_reduce_add_ps(t);
}

// The same chains in ymm registers, for a CPU without the AVX-512 set: kind 0 fp32 FMA, kind 2
// int8 as the AVX2 kernels multiply it (vpmaddubsw, vpmaddwd by ones, vpaddd: 32 MACs per chain
// step), or one VEX vpdpbusd where the CPU has AVX-VNNI (kAvxVnni).
template <int kKind, bool kAvxVnni = false>
__attribute__((target("avx2,fma,avxvnni"), noinline))
static double chains_avx2(int64_t iters) {
#define DECL(i) __m256 f##i = _mm256_set1_ps(i); __m256i n##i = _mm256_set1_epi32(i);
  W4K_12(DECL)
#undef DECL
  __m256 a = _mm256_set1_ps(1e-3f), b = _mm256_set1_ps(1e-3f);
  __m256i ia = _mm256_set1_epi8(3), ib = _mm256_set1_epi8(5), ones = _mm256_set1_epi16(1);
  __asm__("" : "+x"(a), "+x"(b), "+x"(ia), "+x"(ib), "+x"(ones));
  for (int64_t it = 0; it < iters; ++it) {
    if constexpr (kKind == 0) {
#define OP(i) f##i = _mm256_fmadd_ps(a, b, f##i);
      W4K_12(OP)
#undef OP
    } else if constexpr (kAvxVnni) {
#define OP(i) n##i = _mm256_dpbusd_avx_epi32(n##i, ia, ib);
      W4K_12(OP)
#undef OP
    } else {
#define OP(i) n##i = _mm256_add_epi32(n##i, _mm256_madd_epi16(_mm256_maddubs_epi16(ia, ib), ones));
      W4K_12(OP)
#undef OP
    }
  }
  __m256 t = _mm256_setzero_ps();
#define SUM(i) t = _mm256_add_ps(t, kKind == 2 ? _mm256_cvtepi32_ps(n##i) : f##i);
  W4K_12(SUM)
#undef SUM
  alignas(32) float v[8];
  _mm256_store_ps(v, t);
  return v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
}

// Floating-point operations (2 per multiply-add) per second over all threads, each kind in
// zmm where the CPU has its AVX-512 instruction, else in ymm: kind 0 fp32 FMA (16 MACs/op;
// ymm 8), 1 vdpbf16ps (32; 0 without AVX-512 BF16: no bf16 dot), 2 vpdpbusd (64; ymm 32 per
// step).
double peak_flops(int64_t kind, int64_t iters) {
  const bool wide = kind == 0   ? __builtin_cpu_supports("avx512f")
                    : kind == 1 ? __builtin_cpu_supports("avx512bf16")
                                : __builtin_cpu_supports("avx512vnni");
  if (kind == 1 && !wide) return 0.0;
  const bool vnni = __builtin_cpu_supports("avxvnni");
  const int nt = at::get_num_threads();
  std::atomic<double> sink{0};
  auto t0 = std::chrono::steady_clock::now();
  at::parallel_for(0, nt, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const double v = !wide     ? (kind == 0 ? chains_avx2<0>(iters)
                                   : vnni     ? chains_avx2<2, true>(iters)
                                              : chains_avx2<2>(iters))
                       : kind == 0 ? chains<0>(iters)
                       : kind == 1 ? chains<1>(iters)
                                   : chains<2>(iters);
      sink.store(v);
    }
  });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int macs = (kind == 0 ? 16 : kind == 1 ? 32 : 64) / (wide ? 1 : 2);
  return 2.0 * nt * iters * 12 * macs / s + 0.0 * sink.load();
}

// AMX-BF16 (Intel): TDPBF16PS on four C tiles from one A and one B tile that stay in tile
// registers (no loads): the tiles' multiply-add peak, 16 x 16 x 32 MACs per instruction. 0 where
// the CPU or the OS has no AMX (CPUID, XCR0 bits 17-18, Linux's per-process permission).
static bool amx_ok() {
  static const bool ok = [] {
    if (!__builtin_cpu_supports("avx512f")) return false;
    unsigned a, b, c, d;
    __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
    if (!(d & (1u << 24)) || !(d & (1u << 22))) return false;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & (3u << 17)) != (3u << 17)) return false;
    return syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  }();
  return ok;
}

__attribute__((target("amx-tile,amx-bf16"), noinline))
static void amx_chains(int64_t iters) {
  alignas(64) unsigned char cfg[64] = {0};
  cfg[0] = 1;
  for (int t = 0; t < 6; ++t) { cfg[16 + 2 * t] = 64; cfg[48 + t] = 16; }
  __asm__ volatile("ldtilecfg %0" : : "m"(cfg));
  alignas(64) static const uint16_t ones[16 * 32] = {0};
  _tile_loadd(4, ones, 64);
  _tile_loadd(5, ones, 64);
  _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
  for (int64_t it = 0; it < iters; ++it) {
    _tile_dpbf16ps(0, 4, 5); _tile_dpbf16ps(1, 4, 5);
    _tile_dpbf16ps(2, 4, 5); _tile_dpbf16ps(3, 4, 5);
  }
  alignas(64) float out[16 * 16];
  _tile_stored(0, out, 64);
  _tile_release();
}

double amx_peak_flops(int64_t iters) {
  if (!amx_ok()) return 0.0;
  const int nt = at::get_num_threads();
  auto t0 = std::chrono::steady_clock::now();
  at::parallel_for(0, nt, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) amx_chains(iters);
  });
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return 2.0 * nt * iters * 4 * 16 * 16 * 32 / s;
}

__attribute__((target("avx512f"), noinline))
static double read_range_avx512(const float* p, int64_t n) {
  __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
  for (int64_t i = 0; i + 64 <= n; i += 64) {
    s0 = _mm512_add_ps(s0, _mm512_load_ps(p + i));
    s1 = _mm512_add_ps(s1, _mm512_load_ps(p + i + 16));
    s2 = _mm512_add_ps(s2, _mm512_load_ps(p + i + 32));
    s3 = _mm512_add_ps(s3, _mm512_load_ps(p + i + 48));
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

// The same read in ymm loads, 64 floats (four lines) per step, for a CPU without AVX-512.
__attribute__((target("avx2"), noinline))
static double read_range_avx2(const float* p, int64_t n) {
  __m256 s[8];
  for (auto& v : s) v = _mm256_setzero_ps();
  for (int64_t i = 0; i + 64 <= n; i += 64)
    for (int j = 0; j < 8; ++j) s[j] = _mm256_add_ps(s[j], _mm256_load_ps(p + i + 8 * j));
  for (int j = 1; j < 8; ++j) s[0] = _mm256_add_ps(s[0], s[j]);
  alignas(32) float v[8];
  _mm256_store_ps(v, s[0]);
  return v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7];
}

static double read_range(const float* p, int64_t n) {
  static const bool wide = __builtin_cpu_supports("avx512f");
  return wide ? read_range_avx512(p, n) : read_range_avx2(p, n);
}

// Seconds to read the whole tensor once, each thread a contiguous share (64-float multiples),
// timed from the moment the last thread has started (a spin barrier) to the last one's end: the
// read alone, not the thread pool's start (on a VM whose idle vCPUs sleep in the host, a wake-up
// of up to 4 ms, a fifth of the 512 MiB probe). The same-rounds read (%rd) is timed around the
// call by time_rounds, so it pays the start as the methods do.
double read_seconds(torch::Tensor a) {
  using clock = std::chrono::steady_clock;
  const float* p = a.data_ptr<float>();
  const int64_t n = a.numel(), nt = at::get_num_threads();
  const int64_t share = (n / nt) / 64 * 64;
  std::atomic<double> sink{0};
  std::atomic<int64_t> arrived{0}, start_ns{0}, end_ns{0};
  at::parallel_for(0, nt, 1, [&](int64_t b, int64_t e) {
    // each thread of the team runs one chunk of the nt shares at once (a chunk of several when
    // the team is smaller, all of them when the call runs inline): the last to start opens it
    if (arrived.fetch_add(e - b) + (e - b) == nt)
      start_ns.store(clock::now().time_since_epoch().count());
    while (start_ns.load() == 0) _mm_pause();
    for (int64_t i = b; i < e; ++i) sink.store(read_range(p + i * share, share));
    const int64_t t = clock::now().time_since_epoch().count();
    int64_t prev = end_ns.load();
    while (prev < t && !end_ns.compare_exchange_weak(prev, t)) {}
  });
  const int64_t ticks = end_ns.load() - start_ns.load();
  return std::chrono::duration<double>(clock::duration(ticks)).count() + 0.0 * sink.load();
}
"""


def load_probes():
    """The compiled probes, or None (no compiler / no AVX2 + FMA: said once, never invented)."""
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    if " avx2" not in flags or " fma" not in flags:
        print("probes: this CPU lacks AVX2/FMA; peaks n/a, bandwidth from torch.sum")
        return None
    from torch.utils.cpp_extension import load_inline
    try:
        return load_inline("w4k_cpu_gemm_probes", cpp_sources=_PROBE_SRC,
                           functions=["peak_flops", "amx_peak_flops", "read_seconds"],
                           extra_cflags=["-O2", "-fopenmp"], extra_ldflags=["-fopenmp"])
    except Exception as e:  # noqa: BLE001
        print(f"probes unavailable ({type(e).__name__}: {str(e)[:200]}); peaks n/a, "
              "bandwidth from torch.sum")
        return None


def time_rounds(calls, repeats, stat=statistics.median, warm=False):
    """Median (or `stat`) seconds per key of calls {key: (fn, copies)}: each fn called once
    first, then `repeats` rounds that call every fn once, in an order shuffled per round (a fixed
    seed), so that no method always follows the same one: the call after another library's
    (ORT's or torch's thread pool) finds our sleeping worker cold, and in a fixed order that cost
    fell on one method every round (2026-12-02, 4096 x 4096 M = 1: our KleidiAI path 0.63 ms
    right after ORT, 0.50-0.53 elsewhere in the round). Call i of a fn uses copy (i + 1) %
    copies. warm (--order warm-rounds): each timed call right after an untimed call of the same
    fn on copy (i + 1 + copies // 2) % copies (another copy where there are two or more, last
    touched copies // 2 rounds before, so the timed call still streams its weight from memory):
    a GEMM that follows a GEMM, as in a model's layer, instead of one that follows another
    library's call or an idle stretch."""
    for fn, _ in calls.values():
        fn(0)
    ts = {key: [] for key in calls}
    order = list(calls)
    shuffle = random.Random(0).shuffle
    for i in range(repeats):
        shuffle(order)
        for key in order:
            fn, copies = calls[key]
            if warm:
                fn((i + 1 + copies // 2) % copies)
            t0 = time.perf_counter()
            fn((i + 1) % copies)
            ts[key].append(time.perf_counter() - t0)
    return {key: stat(v) for key, v in ts.items()}


def timeit(fn, copies, repeats):
    """Median seconds of `repeats` calls, call i using copy (i + 1) % copies."""
    return time_rounds({None: (fn, copies)}, repeats)[None]


def read_bandwidth(probes, nbytes, repeats):
    a = torch.ones(nbytes // 4)
    if probes is not None:
        probes.read_seconds(a)
        t = statistics.median(probes.read_seconds(a) for _ in range(repeats))
    else:
        t = timeit(lambda i: a.sum(), 1, repeats)
    return nbytes / t


def n_copies(nbytes, quick):
    """Copies of an operand of `nbytes` that total >= 4 x L3 (2 in --quick)."""
    return 2 if quick else max(1, int(-(-4 * L3_BYTES // nbytes)))


# ---- the methods: each builds its copies and returns (weight bytes, copies, fn(x, i)) ----------


def _awq_random(k, n, gen, dtype):
    qweight = torch.randint(-2**31, 2**31 - 1, (k, n // 8), dtype=torch.int32, generator=gen)
    qzeros = torch.randint(-2**31, 2**31 - 1, (k // GROUP, n // 8), dtype=torch.int32, generator=gen)
    scales = (torch.rand(k // GROUP, n, generator=gen) * 0.01 + 1e-3).to(dtype)
    return quant.AWQWeight(qweight, scales, qzeros, GROUP, k, n)


def _gptq_random(k, n, gen, act_order, dtype=torch.bfloat16):
    qweight = torch.randint(-2**31, 2**31 - 1, (k // 8, n), dtype=torch.int32, generator=gen)
    scales = (torch.rand(k // GROUP, n, generator=gen) * 0.01 + 1e-3).to(dtype)
    g_idx = None
    if act_order:
        g_idx = (torch.arange(k) // GROUP)[torch.randperm(k, generator=gen)].to(torch.int32)
    return quant.GPTQWeight(qweight, scales, g_idx, GROUP, k, n)


def m_awq(k, n, gen, quick, dtype):
    wb = k * n // 2 + (k // GROUP) * n * (2 + 0.5)
    c = n_copies(wb, quick)
    ws = [_awq_random(k, n, gen, dtype) for _ in range(c)]
    return wb, c, lambda x, i: ops.awq_gemm(x, ws[i].qweight, ws[i].scales, ws[i].qzeros, 8)


def m_awq_dequant_mm(k, n, gen, quick):
    wb = k * n // 2 + (k // GROUP) * n * 2.5
    c = n_copies(wb, quick)
    ws = [_awq_random(k, n, gen, torch.bfloat16) for _ in range(c)]
    return wb, c, lambda x, i: torch.matmul(
        x, ops.awq_dequantize(ws[i].qweight, ws[i].scales, ws[i].qzeros))


def m_w4a16(k, n, gen, quick, kind, dtype=torch.bfloat16):
    wb = k * n // 2 + (k // GROUP) * n * (2.5 if kind == "awq" else 2) + (4 * k if kind == "act" else 0)
    c = n_copies(wb, quick)
    if kind == "awq":
        ms = [quant.awq_to_marlin(_awq_random(k, n, gen, dtype)) for _ in range(c)]
    else:
        ms = [quant.gptq_to_marlin(_gptq_random(k, n, gen, kind == "act", dtype)) for _ in range(c)]
    return wb, c, lambda x, i: ms[i].gemm(x)


def m_w4a8(k, n, gen, quick, kind):
    """The int8-activation mode on the tensors of the w4a16 rows (Marlin GPTQ / AWQ zp)."""
    wb = k * n // 2 + (k // GROUP) * n * (2.5 if kind == "awq" else 2)
    c = n_copies(wb, quick)
    if kind == "awq":
        ms = [quant.awq_to_marlin(_awq_random(k, n, gen, torch.bfloat16)) for _ in range(c)]
    else:
        ms = [quant.gptq_to_marlin(_gptq_random(k, n, gen, False)) for _ in range(c)]

    def call(x, i):
        w = ms[i]
        return ops.w4a8_gemm(x, w.b_q_weight, w.b_scales, w.b_zeros, None, None, 4, x.shape[0],
                             n, k)
    return wb, c, call


def m_awq_a8(k, n, gen, quick):
    wb = k * n // 2 + (k // GROUP) * n * 2.5
    c = n_copies(wb, quick)
    ws = [_awq_random(k, n, gen, torch.bfloat16) for _ in range(c)]
    return wb, c, lambda x, i: ops.awq_gemm_a8(x, ws[i].qweight, ws[i].scales, ws[i].qzeros)


def m_kleidiai(k, n, gen, quick):
    w = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=gen)
    s = (torch.rand(n, k // GROUP, generator=gen) * 0.01).bfloat16()
    packed = ops.dyn_quant_pack_4bit_weight(w, s, None, GROUP, k, n)
    c = n_copies(packed.numel(), quick)
    packs = [packed] + [packed.clone() for _ in range(c - 1)]
    return packed.numel(), c, lambda x, i: ops.dyn_quant_matmul_4bit(x, packs[i], GROUP, k, n)


def m_dense(k, n, gen, quick, dtype):
    w = (torch.randn(n, k, generator=gen) * 0.02).to(dtype)
    c = n_copies(w.numel() * w.element_size(), quick)
    wsl = [w] + [w.clone() for _ in range(c - 1)]
    return w.numel() * w.element_size(), c, lambda x, i: F.linear(x, wsl[i])


def m_torch_int4(k, n, gen, quick):
    def one():
        q = torch.randint(0, 16, (n, k), dtype=torch.int32, generator=gen)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 2)
        sz = torch.rand(k // GROUP, n, 2, generator=gen).to(torch.bfloat16)
        return packed, sz
    wb = k * n // 2 + (k // GROUP) * n * 4
    c = n_copies(wb, quick)
    ws = [one() for _ in range(c)]
    return wb, c, lambda x, i: torch.ops.aten._weight_int4pack_mm_for_cpu(x, ws[i][0], GROUP, ws[i][1])


def ort_available():
    try:
        import onnx  # noqa: F401
        import onnxruntime  # noqa: F401
        return True
    except ImportError:
        return False


def m_ort(k, n, gen, quick, accuracy_level, threads):
    import numpy as np
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    blocks = k // GROUP
    blob = GROUP // 2

    def session():
        b = torch.randint(0, 256, (n, blocks, blob), dtype=torch.uint8, generator=gen).numpy()
        scales = (torch.rand(n * blocks, generator=gen) * 0.01 + 1e-3).numpy().astype(np.float32)
        zp = torch.randint(0, 256, (n * ((blocks + 1) // 2),), dtype=torch.uint8,
                           generator=gen).numpy()
        node = helper.make_node("MatMulNBits", ["A", "B", "scales", "zero_points"], ["Y"],
                                domain="com.microsoft", K=k, N=n, bits=4, block_size=GROUP,
                                accuracy_level=accuracy_level)
        graph = helper.make_graph(
            [node], "w4", [helper.make_tensor_value_info("A", TensorProto.FLOAT, ["M", k])],
            [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["M", n])],
            initializer=[onnx.numpy_helper.from_array(b, "B"),
                         onnx.numpy_helper.from_array(scales, "scales"),
                         onnx.numpy_helper.from_array(zp, "zero_points")])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                        helper.make_opsetid("com.microsoft", 1)])
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        # ORT's workers spin after each run by default; in a shared run they would take the
        # cores from whatever is timed next (measured: awq_gemm at M = 4 went from ~2 ms to
        # ~100 ms right after an ORT row). Blocking workers, as OMP_WAIT_POLICY=PASSIVE does
        # for torch and us.
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        return ort.InferenceSession(model.SerializeToString(), so,
                                    providers=["CPUExecutionProvider"])

    wb = k * n // 2 + n * blocks * 4.5
    c = n_copies(wb, quick)
    sessions = [session() for _ in range(c)]
    return wb, c, lambda x, i: sessions[i].run(None, {"A": x})[0]


# ---- the table ---------------------------------------------------------------------------------

# name -> (arithmetic, activation kind, ours)
READ = "read (same rounds)"  # the same-rounds read of each point (module docstring: %rd)

METHODS = {
    "awq_gemm bf16": ("bf16", "bf16", True),
    "awq_gemm fp16": ("fp32", "fp16", True),
    "w4a16 gptq bf16": ("bf16", "bf16", True),
    "w4a16 awq-zp bf16": ("bf16", "bf16", True),
    "w4a16 act-order bf16": ("bf16", "bf16", True),
    "w4a16 gptq fp16": ("fp32", "fp16", True),
    "w4a16 awq-zp fp16": ("fp32", "fp16", True),
    "kleidiai int8": ("int8", "fp32", True),
    "w4a8 gptq bf16": ("int8", "bf16", True),
    "w4a8 awq-zp bf16": ("int8", "bf16", True),
    "awq_gemm_a8 bf16": ("int8", "bf16", True),
    "awq dequant+mm": ("bf16", "bf16", False),
    "torch fp32": ("fp32", "fp32", False),
    "torch bf16": ("bf16", "bf16", False),
    "torch fp16": ("fp32", "fp16", False),
    "torch int4 bf16": ("bf16", "bf16", False),
    "ort acc0": ("fp32", "np32", False),
    "ort acc4": ("int8", "np32", False),
}
# Competitors each of our rows is ranked against (the same arithmetic: exact 16-bit weights
# with fp32 sums, or int8 activations).
EXACT_PEERS = ["torch bf16", "torch int4 bf16", "ort acc0"]
FP16_PEERS = ["torch fp16", "ort acc0"]  # our fp16 rows: the same activations
INT8_PEERS = ["ort acc4"]
INT8_MODE = ["w4a8 gptq bf16", "w4a8 awq-zp bf16", "awq_gemm_a8 bf16"]  # also ranked vs KleidiAI


def on_amx(name, m):
    """How many tile products per product the row spends where the CPU has AMX tiles (0: not
    on the tiles), by the ops' default limits: bf16 w4a16_gemm at every M (its decode split on
    the tiles up to 12 rows, the tile path above) and awq_gemm from 2 rows (its row path takes
    M = 1), fp16 split into two bf16 (4) in w4a16_gemm from 3 rows and awq_gemm from 2; never
    with W4K_CPU_AMX=0 (@noamx) or an ISA cap."""
    if " @" in name or not name.startswith(("w4a16", "awq_gemm ")):
        return 0
    if name.endswith("bf16"):
        return 1 if m >= (2 if name.startswith("awq_gemm") else 1) else 0
    return 4 if m >= (2 if name.startswith("awq_gemm") else 3) else 0


def with_isa(built, isa):
    """The method's calls run with W4K_CPU_ISA=isa, or for isa "noamx" with W4K_CPU_AMX=0 (the
    AVX-512 paths without AMX tiles); both are read by the op at each call."""
    wb, c, fn = built
    key, value = ("W4K_CPU_AMX", "0") if isa == "noamx" else ("W4K_CPU_ISA", isa)

    def call(x, i):
        old = os.environ.get(key)
        os.environ[key] = value
        try:
            return fn(x, i)
        finally:
            if old is None:
                del os.environ[key]
            else:
                os.environ[key] = old
    return wb, c, call


def build(name, k, n, gen, quick, threads):
    if " @" in name:  # "awq_gemm bf16 @avx2", "w4a16 gptq bf16 @scalar": the ISA capped
        base, isa = name.split(" @")
        return with_isa(build(base, k, n, gen, quick, threads), isa)
    if name == "awq_gemm_a8 bf16":
        return m_awq_a8(k, n, gen, quick)
    if name.startswith("awq_gemm"):
        return m_awq(k, n, gen, quick, torch.bfloat16 if "bf16" in name else torch.float16)
    if name == "awq dequant+mm":
        return m_awq_dequant_mm(k, n, gen, quick)
    if name.startswith("w4a8"):
        return m_w4a8(k, n, gen, quick, "awq" if "awq" in name else "gptq")
    if name.startswith("w4a16"):
        return m_w4a16(k, n, gen, quick, name.split()[1].replace("awq-zp", "awq")
                       .replace("act-order", "act"),
                       torch.float16 if name.endswith("fp16") else torch.bfloat16)
    if name == "kleidiai int8":
        return m_kleidiai(k, n, gen, quick)
    if name == "torch fp32":
        return m_dense(k, n, gen, quick, torch.float32)
    if name == "torch bf16":
        return m_dense(k, n, gen, quick, torch.bfloat16)
    if name == "torch fp16":
        return m_dense(k, n, gen, quick, torch.float16)
    if name == "torch int4 bf16":
        return m_torch_int4(k, n, gen, quick)
    if name.startswith("ort"):
        return m_ort(k, n, gen, quick, int(name[-1]), threads)
    raise KeyError(name)


def activation(kind, m, k, gen):
    x = torch.randn(m, k, generator=gen)
    if kind == "np32":
        return x.numpy()
    return x.to({"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[kind])


class BackgroundLoad:
    """P processes spinning in pure Python (each wants a whole core) while the block runs."""

    def __init__(self, procs):
        self.procs = procs
        self.ps = []

    def __enter__(self):
        self.ps = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                   for _ in range(self.procs)]
        time.sleep(0.3)
        return self

    def __exit__(self, *exc):
        for p in self.ps:
            p.kill()
        for p in self.ps:
            p.wait()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--ms", default="1,4,16,64,256")
    ap.add_argument("--shapes", default="4096x4096,11008x4096,4096x11008", help="NxK, comma-separated")
    ap.add_argument("--methods", default=",".join(METHODS), help="comma-separated subset")
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: one small shape, M 1 and 16, 3 repeats, no peak probes")
    ap.add_argument("--background-load", type=int, default=0, metavar="P",
                    help="also time every point while P busy processes run; print slowdowns")
    ap.add_argument("--load-repeats", type=int, default=60, metavar="R",
                    help="rounds per point under --background-load (their mean is taken)")
    ap.add_argument("--order", choices=["rounds", "warm-rounds", "blocks"], default="rounds",
                    help="rounds: each repeat calls every method once, in an order shuffled "
                         "per round (default); warm-rounds: the same, each timed call right "
                         "after an untimed call of the same method on another weight copy; "
                         "blocks: each method's repeats back to back")
    ap.add_argument("--isa", default="", metavar="LIST",
                    help="also time awq_gemm, w4a16 and the int8 mode (w4a8, awq_gemm_a8) with "
                         "W4K_CPU_ISA set to each of these (e.g. avx2,scalar; noamx: "
                         "W4K_CPU_AMX=0 instead): rows 'awq_gemm bf16 @avx2', 'w4a8 gptq bf16 "
                         "@avx2', ... in the same run")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    quick = args.quick
    shapes = [(512, 1024)] if quick else [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    ms = [1, 16] if quick else [int(m) for m in args.ms.split(",")]
    repeats = 3 if quick else args.repeats
    load_repeats = 3 if quick else args.load_repeats
    names = [s for s in args.methods.split(",") if s]
    for isa in [v for v in args.isa.split(",") if v]:
        for base in [s for s in names
                     if (s.startswith(("awq_gemm", "w4a16")) or s in INT8_MODE) and " @" not in s]:
            METHODS[f"{base} @{isa}"] = METHODS[base]
            names.append(f"{base} @{isa}")
    if not ort_available():
        print("ONNX Runtime rows skipped: onnxruntime/onnx not installed "
              "(optional: pip install onnxruntime onnx)")
        names = [s for s in names if not s.startswith("ort")]
    gen = torch.Generator().manual_seed(0)

    probes = None if quick else load_probes()
    bw = read_bandwidth(probes, (64 if quick else 512) << 20, repeats)
    peaks = {}
    if probes is not None:
        for kind, key in enumerate(["fp32", "bf16", "int8"]):
            probes.peak_flops(kind, 1_000_000)
            peaks[key] = max(probes.peak_flops(kind, 20_000_000) for _ in range(3))
        if peaks["bf16"] == 0:  # no bf16 dot product: the bf16 rows multiply in fp32 here
            print("probes: no AVX-512 BF16 on this CPU: bf16 rows are fp32 arithmetic, "
                  "%peak of the fp32 FMA peak")
            peaks["bf16"] = peaks["fp32"]
        amx = max(probes.amx_peak_flops(2_000_000) for _ in range(3))
        if amx > 0:
            peaks["amx"] = amx
    load = os.getloadavg()
    print(f"torch {torch.__version__}  threads={torch.get_num_threads()}  "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}  load average before: "
          f"{load[0]:.2f} {load[1]:.2f}  group={GROUP}  repeats={repeats}")
    print(f"read bandwidth probe: {bw / 1e9:.1f} GB/s   peaks (GFLOP/s, these threads): " +
          ("  ".join(f"{k} {v / 1e9:.0f}" for k, v in peaks.items()) or "n/a"))

    results = {}  # (shape, name, m) -> seconds (quiet), and loaded when asked
    loaded = {}
    for n, k in shapes:
        built = {}
        for name in names:
            try:
                built[name] = build(name, k, n, gen, quick, args.threads)
            except Exception as e:  # noqa: BLE001  (a competitor that cannot run here: say why)
                print(f"{name} on {n}x{k}: skipped ({type(e).__name__}: {str(e)[:160]})")
        xs = {m: {kind: activation(kind, m, k, gen) for kind in {METHODS[s][1] for s in built}}
              for m in ms}
        read_bytes = k * n // 2  # the int4 weight of the shape
        reads = [torch.ones(read_bytes // 4) for _ in range(n_copies(read_bytes, quick))]
        read_fn = ((lambda i: probes.read_seconds(reads[i])) if probes is not None else
                   (lambda i: reads[i].sum()))
        # Every copy of every method called once before any timing: the copies built first
        # have lain untouched while the others were built, and on the VM of 2026-12-02 their
        # first calls after that were 2-5x slow (w4a16 gptq 4096 x 4096 M = 1: 2.5-4.2 ms in
        # the timed repeats against 0.8 ms with this pass; not seen when one method's copies
        # are built and called at once: presumably the host reclaiming cold guest memory).
        for name, (wb, c, fn) in built.items():
            for i in range(c):
                fn(xs[ms[0]][METHODS[name][1]], i)
        for i in range(len(reads)):
            read_fn(i)
        for phase in ["quiet"] + (["loaded"] if args.background_load else []):
            ctx = BackgroundLoad(args.background_load) if phase == "loaded" else None
            if ctx:
                ctx.__enter__()
            try:
                for m in ms:
                    calls = {name: ((lambda i, fn=fn, x=xs[m][METHODS[name][1]]: fn(x, i)), c)
                             for name, (wb, c, fn) in built.items()}
                    if phase == "quiet":
                        calls[READ] = (read_fn, len(reads))
                    if phase == "loaded":  # the mean: see the module docstring
                        times = time_rounds(calls, load_repeats, stat=statistics.fmean)
                    elif args.order in ("rounds", "warm-rounds"):
                        times = time_rounds(calls, repeats, warm=args.order == "warm-rounds")
                    else:
                        times = {name: timeit(fn, c, repeats) for name, (fn, c) in calls.items()}
                    into = results if phase == "quiet" else loaded
                    for name, t in times.items():
                        into[(n, k, name, m)] = t
            finally:
                if ctx:
                    ctx.__exit__(None, None, None)
        print(f"\nN={n} K={k}  (weight GB/s counts the format's weight + scale bytes; "
              f"x best = best same-arithmetic competitor's ms / ours)")
        print(f"{'M':>4} {'method':<22} {'ms':>9} {'wGB/s':>7} {'%bw':>5} {'%rd':>5} "
              f"{'GFLOP/s':>8} "
              f"{'%peak':>6} {'x best':>7} {'x kai':>6}" + (f" {'loaded ms':>10} {'slowdown':>8}" if loaded else ""))
        worst = {}  # m -> [(slowdown, name)] of every method (loaded runs)
        for m in ms:
            t_read = results[(n, k, READ, m)]
            print(f"{m:>4} {READ:<22} {t_read * 1e3:9.3f} {read_bytes / t_read / 1e9:7.1f} "
                  f"{100 * read_bytes / t_read / bw:4.0f}%")
            for name, (wb, c, fn) in built.items():
                t = results[(n, k, name, m)]
                arith, _, ours = METHODS[name]
                flops = 2.0 * m * n * k / t
                pk = f"{100 * flops / peaks[arith]:5.0f}%" if arith in peaks else f"{'-':>6}"
                tiles = on_amx(name, m) if ours and "amx" in peaks else 0
                if tiles:  # of the AMX tiles' peak, every tile product counted
                    pk = f"{100 * tiles * flops / peaks['amx']:4.0f}%a"
                best = "-"
                if ours:
                    peers = (INT8_PEERS if arith == "int8" else
                             FP16_PEERS if METHODS[name][1] == "fp16" else EXACT_PEERS)
                    ts = [results[(n, k, p, m)] for p in peers if (n, k, p, m) in results]
                    if ts:
                        best = f"{min(ts) / t:.2f}"
                kai = "-"
                if name.split(" @")[0] in INT8_MODE and (n, k, "kleidiai int8", m) in results:
                    kai = f"{results[(n, k, 'kleidiai int8', m)] / t:.2f}"
                rd = 100 * (wb / t) / (read_bytes / t_read)
                line = (f"{m:>4} {name:<22} {t * 1e3:9.3f} {wb / t / 1e9:7.1f} "
                        f"{100 * wb / t / bw:4.0f}% {rd:4.0f}% {flops / 1e9:8.1f} {pk:>6} "
                        f"{best:>7} {kai:>6}")
                if loaded:
                    tl = loaded[(n, k, name, m)]
                    line += f" {tl * 1e3:10.3f} {tl / t:7.1f}x"
                    worst.setdefault(m, []).append((tl / t, name))
                print(line, flush=True)
        for m, v in worst.items():  # the check: ours lose no more than torch's own
            mine = max((x for x in v if METHODS[x[1]][2]), default=None)
            torch_own = [x for x in v if x[1].startswith("torch")]
            if not (mine and torch_own):
                continue
            # the yardstick: torch's bf16 F.linear where it ran (the issue's), else its worst
            yard = next((x for x in torch_own if x[1] == "torch bf16"), max(torch_own))
            verdict = "no more" if mine[0] <= yard[0] else "more"
            print(f"  under load, M = {m}: ours at most {mine[0]:.2f}x ({mine[1]}), torch's "
                  + ", ".join(f"{nm} {sd:.2f}x" for sd, nm in torch_own)
                  + f" (ours lose {verdict} than {yard[1]})")
        del built, xs, reads

    # Dispatch rule: the smallest M of the run from which dequantize + matmul wins everywhere.
    if "awq_gemm bf16" in names and "awq dequant+mm" in names:
        wins = [m for m in ms if all(results[(n, k, "awq dequant+mm", m)] < results[(n, k, "awq_gemm bf16", m)]
                                     for n, k in shapes)]
        rule = min(wins) if wins else None
        print("\ndispatch rule (bf16): awq_dequantize + torch.matmul beats awq_gemm from M = "
              f"{rule if rule else 'never (in the M values of this run)'}; ratios (dequant+mm / "
              "awq_gemm) per M: " + ", ".join(
                  f"{m}: " + "/".join(f"{results[(n, k, 'awq dequant+mm', m)] / results[(n, k, 'awq_gemm bf16', m)]:.2f}"
                                       for n, k in shapes) for m in ms))
    load = os.getloadavg()
    print(f"load average after: {load[0]:.2f} {load[1]:.2f}")
    return results


if __name__ == "__main__":
    main()
