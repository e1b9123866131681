// Torch-free conversions around the CPU w4a16_gemm kernel: the activations (act-order gather,
// widening to fp32) and the fp32 result (one rounding to fp16/bf16). The binding runs them on
// the kernel's own work queue instead of through torch ops: a torch op on more than 32768
// elements opens an OpenMP region, and each one is a barrier that waits for every thread of the
// team (see w4a16_gemm_work_queue.h for why that collapses on a busy machine).
#pragma once

#include <cstdint>
#include <cstring>

#include "cpu/w4a16_gemm_layout.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(W4K_NO_AVX512)
#include <immintrin.h>
#define W4K_CONVERT_AVX512 1
#endif

namespace w4k::cpu {

// Bits of the fp16 / bf16 value nearest to f (ties to even; overflow to inf), nan as torch's
// conversion gives it (bf16 0x7fc0; fp16 sign | 0x7e00), so the result matches Tensor.to().
inline uint16_t float_to_half_bits(float f, HalfType type) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if (type == HalfType::kBFloat16) {
    if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;
    return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
  }
  const float r = round_to_fp16(f);  // an fp16 value (or inf / nan), exact from here on
  uint32_t u;
  std::memcpy(&u, &r, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t au = u & 0x7fffffffu;
  if (au >= 0x7f800000u) return sign | (au > 0x7f800000u ? 0x7e00u : 0x7c00u);
  if (au < 0x38800000u) {  // subnormal: multiples of 2^-24
    float a;
    std::memcpy(&a, &au, 4);
    return sign | static_cast<uint16_t>(a * 0x1p24f);
  }
  return sign | static_cast<uint16_t>(((au >> 23) - 112) << 10 | ((au >> 13) & 0x3ffu));
}

#ifdef W4K_CONVERT_AVX512
__attribute__((target("avx512f,avx512bw"))) inline void widen_row_avx512(
    const uint16_t* src, int64_t size_k, HalfType type, float* dst) {
  int64_t k = 0;
  for (; k + 16 <= size_k; k += 16) {
    const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + k));
    const __m512 f = type == HalfType::kFloat16
                         ? _mm512_cvtph_ps(h)
                         : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    _mm512_storeu_ps(dst + k, f);
  }
  for (; k < size_k; ++k) dst[k] = half_bits_to_float(src[k], type);
}

__attribute__((target("avx512f,avx512bw"))) inline void narrow_row_avx512(
    const float* src, int64_t size_n, HalfType type, uint16_t* dst) {
  int64_t n = 0;
  for (; type == HalfType::kFloat16 && n + 16 <= size_n; n += 16) {
    const __m512 f = _mm512_loadu_ps(src + n);
    __m512i h = _mm512_cvtepu16_epi32(
        _mm512_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    const __m512i x = _mm512_castps_si512(f);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(
        _mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    h = _mm512_mask_or_epi32(h, nan, _mm512_and_si512(_mm512_srli_epi32(x, 16),
                                                      _mm512_set1_epi32(0x8000)),
                             _mm512_set1_epi32(0x7e00));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + n), _mm512_cvtepi32_epi16(h));
  }
  for (; type == HalfType::kBFloat16 && n + 16 <= size_n; n += 16) {
    const __m512i x = _mm512_castps_si512(_mm512_loadu_ps(src + n));
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(x, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(
        _mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    r = _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7fc0));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + n), _mm512_cvtepi32_epi16(r));
  }
  for (; n < size_n; ++n) dst[n] = float_to_half_bits(src[n], type);
}
#endif

// Row m of a (row stride lda_in, half bits), its columns gathered by perm (act order: column r
// is a[m, perm[r]]; nullptr: identity), into dst32 (fp32) if dst32 != nullptr and dst16 (the
// same half bits) if dst16 != nullptr. gathered: size_k scratch halves when perm != nullptr.
inline void prepare_a_row(const uint16_t* a_row, const int32_t* perm, int64_t size_k,
                          HalfType type, bool avx512, float* dst32, uint16_t* dst16,
                          uint16_t* gathered) {
  const uint16_t* src = a_row;
  if (perm) {
    uint16_t* g = dst16 ? dst16 : gathered;
    for (int64_t r = 0; r < size_k; ++r) g[r] = a_row[perm[r]];
    src = g;
  } else if (dst16) {
    std::memcpy(dst16, a_row, size_k * 2);
  }
  if (dst32 == nullptr) return;  // the caller needs only the bf16 copy
#ifdef W4K_CONVERT_AVX512
  if (avx512) {
    widen_row_avx512(src, size_k, type, dst32);
    return;
  }
#endif
  (void)avx512;
  for (int64_t k = 0; k < size_k; ++k) dst32[k] = half_bits_to_float(src[k], type);
}

// One row of the fp32 result rounded once to the half type.
inline void narrow_c_row(const float* src, int64_t size_n, HalfType type, bool avx512,
                         uint16_t* dst) {
#ifdef W4K_CONVERT_AVX512
  if (avx512) {
    narrow_row_avx512(src, size_n, type, dst);
    return;
  }
#endif
  (void)avx512;
  for (int64_t n = 0; n < size_n; ++n) dst[n] = float_to_half_bits(src[n], type);
}

}  // namespace w4k::cpu
