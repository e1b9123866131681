// Which form of the bf16 pair dot product a CPU runs faster: vdpbf16ps, or the same two
// products as fp32 FMAs on the pair's halves (the bits of vdpbf16ps where no product is
// subnormal; vdpbf16ps flushes those). Used by the few-row decode paths of w4a16_gemm
// (w4a16_gemm_decode_avx512.h) and awq_gemm (awq_gemm_cpu_lut.h). Torch-free.
#pragma once

#include <algorithm>
#include <cstdint>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(W4K_NO_AVX512)
#include <immintrin.h>
#include <x86intrin.h>  // __rdtsc

namespace w4k::cpu {

// TSC ticks of one vdpbf16ps and of two fp32 FMAs (zmm, 8 independent chains each), the best
// of 5 short runs: what the decode path's two forms spend per 32 products.
__attribute__((target("avx512f,avx512bf16"), noinline)) inline void dot_form_ticks(
    double* dpbf16, double* fma2) {
  constexpr int kChains = 8, kIters = 512;
  *dpbf16 = *fma2 = 1e30;
  for (int trial = 0; trial < 5; ++trial) {
    __m512 c[kChains];
    for (int i = 0; i < kChains; ++i) c[i] = _mm512_set1_ps(static_cast<float>(i));
    const __m512bh a = (__m512bh)_mm512_set1_epi32(0x3f803f80);
    const __m512 x = _mm512_set1_ps(1.0f), y = _mm512_set1_ps(0.5f);
    uint64_t t0 = __rdtsc();
    for (int it = 0; it < kIters; ++it) {
#pragma GCC unroll 8
      for (int i = 0; i < kChains; ++i) c[i] = _mm512_dpbf16_ps(c[i], a, a);
    }
    uint64_t t1 = __rdtsc();
    for (int it = 0; it < kIters; ++it) {
#pragma GCC unroll 8
      for (int i = 0; i < kChains; ++i) c[i] = _mm512_fmadd_ps(_mm512_fmadd_ps(c[i], x, y), x, y);
    }
    uint64_t t2 = __rdtsc();
    __m512 sum = c[0];
    for (int i = 1; i < kChains; ++i) sum = _mm512_add_ps(sum, c[i]);
    alignas(64) float lanes[16];  // keeps the chains live (no reduce intrinsic: GCC 12 warns)
    _mm512_store_ps(lanes, sum);
    volatile float sink = lanes[0];
    (void)sink;
    *dpbf16 = std::min(*dpbf16, static_cast<double>(t1 - t0) / (kIters * kChains));
    *fma2 = std::min(*fma2, static_cast<double>(t2 - t1) / (kIters * kChains));
  }
}

// Whether the fma form of vdpbf16ps (the odd then the even product of a pair, each by an fp32
// fma) beats vdpbf16ps itself on this CPU: two FMAs take at most 0.8x a vdpbf16ps (measured
// once per process). On the Zen 4 the kernels were tuned on a vdpbf16ps issues like an FMA; on
// the AMX Xeon of 2026-11-28 it takes about 2.2 cycles, and the fma form of w4a16_gemm's
// decode path was 1.1-1.4x faster at 2-4 rows (L1-resident harness of pair_pass_avx512).
inline bool fma_form_faster() {
  static const bool faster = [] {
    double dp = 0, fma2 = 0;
    dot_form_ticks(&dp, &fma2);
    return fma2 <= 0.8 * dp;
  }();
  return faster;
}

}  // namespace w4k::cpu

#else

namespace w4k::cpu {
inline bool fma_form_faster() { return false; }
}  // namespace w4k::cpu

#endif
