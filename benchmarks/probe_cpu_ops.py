"""What one core of this CPU can do with the instructions of the CPU GEMMs' inner loops.

Prints, for one thread:

* the reciprocal throughput of single 512-bit instructions (ns per instruction, 8 independent
  chains, and in cycles of the vpaddd rate, which is two per cycle on every AVX-512 core we
  know): the table lookups (vpermt2w, vpermw, vpermb, vpermt2d, vpshufb), the shuffles and shifts
  of the decode, and the dot products (vdpbf16ps, vpdpbusd, vfmadd);
* the bare decode loop of w4a16_gemm's M = 1 path (csrc/cpu/w4a16_gemm_decode_avx512.h,
  pair_pass_avx512 with one row): per 32 weights a 16-bit shift (none for nibble 0), a
  vpternlogd, a vpermt2w into a 64-entry bf16 table and a vdpbf16ps, on words and tables in L1:
  the rate at which one core can stream Marlin weights through that design, with no memory,
  table builds or loop bookkeeping of the real kernel;
* on a CPU with AMX-BF16, the TDPBF16PS rate (bench_cpu_gemm.py's probe: four C tiles, operands
  in tile registers).

So the M = 1 section of the README can say what bounds the op on a given CPU (Intel's
vpermt2w and vdpbf16ps take two cycles each where Zen 4's take one).

    PYTHONPATH=$PWD/python python benchmarks/probe_cpu_ops.py
"""

import os
import sys

import torch
from torch.utils.cpp_extension import load_inline

_SRC = r"""
#include <torch/extension.h>
#include <immintrin.h>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#define W4K_TARGET __attribute__((target("avx512f,avx512bw,avx512vbmi,avx512bf16,avx512vnni,fma")))

// ns per instruction of op over 8 independent chains x[j] = op(t0, x[j], t1).
template <typename F>
W4K_TARGET static double chains(F op) {
  __m512i x[8];
  for (int i = 0; i < 8; ++i) x[i] = _mm512_set1_epi32(i * 7 + 1);
  // 1.0f / bf16 pairs (1.0, 1.0): normal floats (a denormal operand makes fma take a microcode
  // assist of ~160 cycles); the table and shuffle instructions do not care
  __m512i t0 = _mm512_set1_epi32(0x3f800000), t1 = _mm512_set1_epi32(0x3f803f80);
  __asm__("" : "+v"(t0), "+v"(t1));
  const int64_t n = 20000000;
  auto s = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < n; ++i) {
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) x[j] = op(t0, x[j], t1);
    __asm__ volatile("" : "+v"(x[0]), "+v"(x[1]), "+v"(x[2]), "+v"(x[3]), "+v"(x[4]),
                     "+v"(x[5]), "+v"(x[6]), "+v"(x[7]));
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count() / (n * 8) * 1e9;
}

W4K_TARGET std::vector<std::pair<std::string, double>> instruction_ns() {
  using V = __m512i;
  std::vector<std::pair<std::string, double>> r;
  r.push_back({"vpaddd", chains([](V a, V x, V b) { return _mm512_add_epi32(x, a); })});
  r.push_back({"vpermt2w", chains([](V a, V x, V b) { return _mm512_permutex2var_epi16(a, x, b); })});
  r.push_back({"vpermt2b", chains([](V a, V x, V b) { return _mm512_permutex2var_epi8(a, x, b); })});
  r.push_back({"vpermt2d", chains([](V a, V x, V b) { return _mm512_permutex2var_epi32(a, x, b); })});
  r.push_back({"vpermw", chains([](V a, V x, V b) { return _mm512_permutexvar_epi16(x, a); })});
  r.push_back({"vpermb", chains([](V a, V x, V b) { return _mm512_permutexvar_epi8(x, a); })});
  r.push_back({"vpshufb", chains([](V a, V x, V b) { return _mm512_shuffle_epi8(a, x); })});
  r.push_back({"vshufi32x4", chains([](V a, V x, V b) { return _mm512_shuffle_i32x4(x, a, 0x44); })});
  r.push_back({"vpsrlw", chains([](V a, V x, V b) { return _mm512_srli_epi16(x, 4); })});
  r.push_back({"vpternlogd", chains([](V a, V x, V b) { return _mm512_ternarylogic_epi32(x, a, b, 0xea); })});
  r.push_back({"vdpbf16ps", chains([](V a, V x, V b) {
    return _mm512_castps_si512(_mm512_dpbf16_ps(_mm512_castsi512_ps(x), (__m512bh)a, (__m512bh)b)); })});
  r.push_back({"vpdpbusd", chains([](V a, V x, V b) { return _mm512_dpbusd_epi32(x, a, b); })});
  r.push_back({"vfmadd231ps", chains([](V a, V x, V b) {
    return _mm512_castps_si512(_mm512_fmadd_ps(_mm512_castsi512_ps(a), _mm512_castsi512_ps(b),
                                               _mm512_castsi512_ps(x))); })});
  return r;
}

// The decode path's inner loop for one row: per k-tile 4 lines of 16 words, per line and
// nibble position a shift, a vpternlogd (index 16j + q), a vpermt2w and a vdpbf16ps.
__attribute__((target("avx512f,avx512bw,avx512bf16"), noipa))
static float decode_loop(const int32_t* words, int64_t tiles, const __m512i* a_pairs,
                         const uint16_t* tbl) {
  const __m512i code_mask = _mm512_set1_epi32(0x000f000f);
  const __m512i col_bits = _mm512_setr_epi32(0, 0x100010, 0x200020, 0x300030, 0, 0x100010,
      0x200020, 0x300030, 0, 0x100010, 0x200020, 0x300030, 0, 0x100010, 0x200020, 0x300030);
  __m512i t0[8], t1[8];
  for (int i = 0; i < 8; ++i) {
    t0[i] = _mm512_loadu_si512(tbl + 64 * i);
    t1[i] = _mm512_loadu_si512(tbl + 64 * i + 32);
  }
  __m512 acc[8];
  for (int i = 0; i < 8; ++i) acc[i] = _mm512_setzero_ps();
  for (int64_t kt = 0; kt < tiles; ++kt) {
    const int32_t* w = words + (kt % 64) * 64;
    const __m512bh a0 = (__m512bh)a_pairs[2 * (kt % 8)], a1 = (__m512bh)a_pairs[2 * (kt % 8) + 1];
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      const __m512i x = _mm512_loadu_si512(w + 16 * c);
#pragma GCC unroll 4
      for (int e = 0; e < 4; ++e) {
        const __m512i s = e == 0 ? x : _mm512_srli_epi16(x, 4 * e);
        const __m512i idx = _mm512_ternarylogic_epi32(s, code_mask, col_bits, 0xea);
        const __m512i v = _mm512_permutex2var_epi16(t0[2 * c + (e >> 1)], idx, t1[2 * c + (e >> 1)]);
        acc[2 * c + (e & 1)] = _mm512_dpbf16_ps(acc[2 * c + (e & 1)], (e & 1) ? a1 : a0, (__m512bh)v);
      }
    }
  }
  float s = 0;
  for (int i = 0; i < 8; ++i) s += _mm512_reduce_add_ps(acc[i]);
  return s;
}

// Weights per ns of decode_loop (512 weights per k-tile of 4 lines).
double decode_weights_per_ns() {
  std::vector<int32_t> words(64 * 64);
  for (size_t i = 0; i < words.size(); ++i) words[i] = static_cast<int32_t>(i * 2654435761u);
  std::vector<uint16_t> tbl(1024, 0x3f80);
  alignas(64) __m512i a_pairs[16];
  for (int i = 0; i < 16; ++i) a_pairs[i] = _mm512_set1_epi32(0x3f803f80);
  const int64_t tiles = 4096, reps = 2000;
  float sink = 0;
  auto s = std::chrono::steady_clock::now();
  for (int64_t r = 0; r < reps; ++r) sink += decode_loop(words.data(), tiles, a_pairs, tbl.data());
  const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - s).count();
  return tiles * reps * 512.0 / sec / 1e9 + 0.0 * sink;
}
"""


def main():
    flags = open("/proc/cpuinfo").read()
    need = ["avx512f", "avx512bw", "avx512_vbmi", "avx512_bf16", "avx512_vnni"]
    missing = [f for f in need if f not in flags]
    if missing:
        print(f"this CPU lacks {', '.join(missing)}: nothing to probe")
        return
    torch.set_num_threads(1)
    m = load_inline("w4k_probe_cpu_ops", cpp_sources=_SRC,
                    functions=["instruction_ns", "decode_weights_per_ns"],
                    # lambdas do not take a function's target attribute: the whole probe is
                    # built for this CPU's AVX-512 set (checked above before loading it)
                    extra_cflags=["-O2", "-mavx512f", "-mavx512bw", "-mavx512vbmi",
                                  "-mavx512bf16", "-mavx512vnni", "-mfma", "-Wno-psabi"])
    rows = m.instruction_ns()
    cycle = 2 * dict(rows)["vpaddd"]  # vpaddd: two per cycle
    print(f"one thread; a cycle taken as 2 x vpaddd = {cycle:.3f} ns ({1 / cycle:.2f} GHz)")
    for name, ns in rows:
        print(f"  {name:<12} {ns:6.3f} ns  {ns / cycle:5.2f} cycles per instruction")
    w = max(m.decode_weights_per_ns() for _ in range(3))
    print(f"bare M = 1 decode loop (shift, vpternlogd, vpermt2w, vdpbf16ps per 32 weights, L1): "
          f"{w:.1f} weights/ns = {w / 2:.1f} GB/s of int4 weight per core, "
          f"{32 / w / cycle:.2f} cycles per 32 weights")
    # the tiles' peak: bench_cpu_gemm.py's probe, on the one thread set above
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bench_cpu_gemm
    probes = bench_cpu_gemm.load_probes()
    amx = max(probes.amx_peak_flops(2_000_000) for _ in range(3)) / 1e9 if probes else 0.0
    print(f"AMX TDPBF16PS: {amx:.0f} GFLOP/s per core" if amx else "AMX-BF16: not on this CPU/OS")


if __name__ == "__main__":
    main()
