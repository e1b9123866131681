// CPU awq_gemm, the AVX2 + FMA + F16C path (CPUs without the AVX-512 path's BF16 / VBMI, or
// W4K_CPU_ISA=avx2). Shares Problem, the helpers and the numerics of awq_gemm_cpu.h.
//
// One kernel serves both summation orders the portable code defines, so the bits equal the
// portable mirror of whichever path the shape selects (and so the AVX-512 path's):
//  * tile order (chunk_scalar): one fp32 chain per output; fp16 rows k = 0, 1, ...; bf16 pairs
//    (k + 1, k), and with K odd the last row as fma(x, w, acc + 0) (vdpbf16ps on (x, 0) x (w, 0));
//  * lookup order (chunk_lut_scalar, when lut_path_applies): L lane chains per output, lane j
//    taking rows 16t + 2j + 1, 16t + 2j (bf16, L = 8) or 16t + j (fp16, L = 16) for t = 0, 1, ...,
//    then out = ((a0 + a1) + a2) + ... in lane order.
// Each chain is run as a list of strip rows in chain order ("seq") by one micro-kernel.
//
// Layout: columns in a block of 64 (8 words a row) stay in column order: word w of a row is
// broadcast and shifted by 4 * kAwqNibble[j] in lane j, so lane j holds column 8w + j. A strip of
// kStripK rows is decoded once into `tile` [row][64] fp32 (the weight rounded to T and widened:
// exact), then the micro-kernel multiplies it by MR <= 6 rows of x (fp32, exact) into MR x 16
// accumulators (12 ymm + 2 weights + 1 broadcast of the 16).
// Weight rounding: fp16 by vcvtps2ph (RNE, denormals kept; = round_half); bf16 in integer ops
// as round_bf16 (= vcvtne2ps2bf16: RNE, NaN made quiet, |v| < FLT_MIN to a signed zero).
// Products are exact in fp32 (11- or 8-bit mantissas), and vfmadd231ps is the fma of
// chunk_scalar: no flush of denormal partial sums (unlike vdpbf16ps, see awq_gemm_cpu.h).
#pragma once

#include <immintrin.h>

#include <cfloat>

#include "cpu/awq_gemm_cpu.h"
#include "cpu/awq_gemm_cpu_lut.h"

namespace w4k {
namespace awq_cpu {

#define W4K_AWQ_AVX2 __attribute__((target("avx2,fma,f16c")))

// Lane chains per output column: 1 in tile order, 8 (bf16) / 16 (fp16) in lookup order.
template <Dtype D>
constexpr int64_t avx2_lanes(bool lut_order) {
  return !lut_order ? 1 : D == Dtype::kBFloat16 ? 8 : 16;
}

// Per-thread scratch floats of chunk_avx2 (columns of up to kChunkBlocks blocks).
inline int64_t avx2_scratch_floats(int64_t size_m, int64_t lanes) {
  return size_m * lanes * kChunkBlocks * kBlockN  // accumulators [block][m][lane][64]
         + kStripK * kBlockN                      // one decoded strip [row][64]
         + (kStripK + 2) * 2 * kBlockN;           // BlockParams of the strip's groups
}

// Lane j of word w holds column 8w + j: shift by 4 * kAwqNibble[j].
W4K_AWQ_AVX2 inline __m256i avx2_nibble_shifts() {
  return _mm256_setr_epi32(0, 16, 4, 20, 8, 24, 12, 28);
}

W4K_AWQ_AVX2 inline __m256 avx2_codes(int32_t word, __m256i shifts) {
  const __m256i v = _mm256_srlv_epi32(_mm256_set1_epi32(word), shifts);
  return _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(15)));
}

template <Dtype D>
W4K_AWQ_AVX2 inline __m256 avx2_widen(__m128i h) {
  if constexpr (D == Dtype::kHalf)
    return _mm256_cvtph_ps(h);
  else
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// T(v) widened back to fp32; the bf16 case is round_bf16 lane by lane. kPlain: the caller
// knows v is finite and 0 or |v| >= FLT_MIN (see avx2_load_params), where round_bf16 is plain
// RNE (a zero keeps its sign under RNE too).
template <Dtype D, bool kPlain>
W4K_AWQ_AVX2 inline __m256 avx2_round(__m256 v) {
  if constexpr (D == Dtype::kHalf) {
    return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  } else {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i hi = _mm256_set1_epi32(static_cast<int32_t>(0xFFFF0000u));
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i rne = _mm256_and_si256(
        _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), hi);
    if constexpr (kPlain) return _mm256_castsi256_ps(rne);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 tiny = _mm256_cmp_ps(_mm256_andnot_ps(sign, v), _mm256_set1_ps(FLT_MIN), _CMP_LT_OQ);
    const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    const __m256 quiet = _mm256_castsi256_ps(
        _mm256_and_si256(_mm256_or_si256(u, _mm256_set1_epi32(0x00400000)), hi));
    const __m256 r = _mm256_blendv_ps(_mm256_castsi256_ps(rne), _mm256_and_ps(v, sign), tiny);
    return _mm256_blendv_ps(r, quiet, nan);
  }
}

// Scales and (-z) * s of group g for the block at column n0, column order; words past the
// valid ones get 0. Returns whether every scale is finite with |s| >= FLT_MIN: then every
// weight fma(q, s, (-z) s) = (q - z) s is +-0 or has magnitude >= FLT_MIN (q - z an integer),
// and is never NaN (an overflow gives +-inf, which plain RNE keeps), so the bf16 rounding is
// plain RNE (avx2_round<.., true>).
template <Dtype D>
W4K_AWQ_AVX2 bool avx2_load_params(const Problem& pb, int64_t g, int64_t n0, int64_t words,
                                   BlockParams& p) {
  const __m256i shifts = avx2_nibble_shifts();
  __m256 odd = _mm256_setzero_ps();  // lanes with a NaN, inf or denormal scale
  for (int64_t w = 0; w < 8; ++w) {
    __m256 s = _mm256_setzero_ps(), zs = _mm256_setzero_ps();
    if (w < words) {
      s = avx2_widen<D>(_mm_loadu_si128(
          reinterpret_cast<const __m128i*>(pb.scales + g * pb.size_n + n0 + 8 * w)));
      const __m256 z = avx2_codes(pb.qzeros[g * (pb.size_n / 8) + n0 / 8 + w], shifts);
      // (-z) by a sign flip, so z = 0 gives -0 exactly as the portable (-z) * s does.
      zs = _mm256_mul_ps(_mm256_xor_ps(z, _mm256_set1_ps(-0.0f)), s);
      const __m256 a = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), s);
      odd = _mm256_or_ps(odd, _mm256_cmp_ps(a, _mm256_set1_ps(FLT_MIN), _CMP_NGE_UQ));  // < or NaN
      odd = _mm256_or_ps(odd, _mm256_cmp_ps(a, _mm256_set1_ps(FLT_MAX), _CMP_GT_OQ));
    }
    _mm256_store_ps(p.s + 8 * w, s);
    _mm256_store_ps(p.zs + 8 * w, zs);
  }
  return _mm256_movemask_ps(odd) == 0;
}

// Rows [0, kb) of one block (q = its first word of row k0) into tile [row][64]:
// T(fma(q, s, (-z) s)) widened to fp32; invalid words give 0.
template <Dtype D, bool kPlain>
W4K_AWQ_AVX2 void avx2_decode_strip(const int32_t* q, int64_t ldq, int64_t kb, int64_t words,
                                    const BlockParams* const* rows, float* tile) {
  const __m256i shifts = avx2_nibble_shifts();
  for (int64_t r = 0; r < kb; ++r) {
    const int32_t* qr = q + r * ldq;
    _mm_prefetch(reinterpret_cast<const char*>(qr + kStripK * ldq), _MM_HINT_T0);
    const BlockParams& p = *rows[r];
    float* t = tile + r * kBlockN;
    int64_t w = 0;
    for (; w < words; ++w)
      _mm256_store_ps(t + 8 * w, avx2_round<D, kPlain>(_mm256_fmadd_ps(avx2_codes(qr[w], shifts),
                                                               _mm256_load_ps(p.s + 8 * w),
                                                               _mm256_load_ps(p.zs + 8 * w))));
    for (; w < 8; ++w) _mm256_store_ps(t + 8 * w, _mm256_setzero_ps());
  }
}

// acc[r][16 columns] = chain over the strip rows seq[0..n) for MR rows of x; with odd_tail the
// last seq row is the lone row of an odd K: acc + 0 first (the (x, 0) x (w, 0) pair).
//   x: fp32 activations at (row m0, column k0), row stride ldx; tile: the strip at the 16
//   columns; acc: row stride ldacc.
template <int MR>
W4K_AWQ_AVX2 inline void avx2_chain(const float* x, int64_t ldx, const int32_t* seq, int64_t n,
                                    bool odd_tail, const float* tile, float* acc, int64_t ldacc) {
  __m256 c[MR][2];
  for (int r = 0; r < MR; ++r) {
    c[r][0] = _mm256_loadu_ps(acc + r * ldacc);
    c[r][1] = _mm256_loadu_ps(acc + r * ldacc + 8);
  }
  const int64_t body = n - (odd_tail ? 1 : 0);
  for (int64_t i = 0; i < body; ++i) {
    const int64_t k = seq[i];
    const __m256 w0 = _mm256_load_ps(tile + k * kBlockN), w1 = _mm256_load_ps(tile + k * kBlockN + 8);
    for (int r = 0; r < MR; ++r) {
      const __m256 xv = _mm256_broadcast_ss(x + r * ldx + k);
      c[r][0] = _mm256_fmadd_ps(xv, w0, c[r][0]);
      c[r][1] = _mm256_fmadd_ps(xv, w1, c[r][1]);
    }
  }
  if (odd_tail) {
    const int64_t k = seq[n - 1];
    const __m256 w0 = _mm256_load_ps(tile + k * kBlockN), w1 = _mm256_load_ps(tile + k * kBlockN + 8);
    for (int r = 0; r < MR; ++r) {
      const __m256 xv = _mm256_broadcast_ss(x + r * ldx + k);
      c[r][0] = _mm256_fmadd_ps(xv, w0, _mm256_add_ps(c[r][0], _mm256_setzero_ps()));
      c[r][1] = _mm256_fmadd_ps(xv, w1, _mm256_add_ps(c[r][1], _mm256_setzero_ps()));
    }
  }
  for (int r = 0; r < MR; ++r) {
    _mm256_storeu_ps(acc + r * ldacc, c[r][0]);
    _mm256_storeu_ps(acc + r * ldacc + 8, c[r][1]);
  }
}

// One chain (seq) over all M rows of x and the block's 64 columns.
W4K_AWQ_AVX2 inline void avx2_chain_all(const Problem& pb, const float* xf, int64_t k0,
                                        const int32_t* seq, int64_t n, bool odd_tail,
                                        const float* tile, float* acc, int64_t ldacc) {
  constexpr int kMR = 6;
  for (int64_t col = 0; col < kBlockN; col += 16) {
    int64_t m = 0;
    auto at = [&](int64_t row) { return xf + row * pb.size_k + k0; };
    for (; m + kMR <= pb.size_m; m += kMR)
      avx2_chain<kMR>(at(m), pb.size_k, seq, n, odd_tail, tile + col, acc + m * ldacc + col, ldacc);
    float* a = acc + m * ldacc + col;
    switch (pb.size_m - m) {
      case 5: avx2_chain<5>(at(m), pb.size_k, seq, n, odd_tail, tile + col, a, ldacc); break;
      case 4: avx2_chain<4>(at(m), pb.size_k, seq, n, odd_tail, tile + col, a, ldacc); break;
      case 3: avx2_chain<3>(at(m), pb.size_k, seq, n, odd_tail, tile + col, a, ldacc); break;
      case 2: avx2_chain<2>(at(m), pb.size_k, seq, n, odd_tail, tile + col, a, ldacc); break;
      case 1: avx2_chain<1>(at(m), pb.size_k, seq, n, odd_tail, tile + col, a, ldacc); break;
      default: break;
    }
  }
}

// Columns [n_begin, n_end) (n_begin a multiple of 64, at most kChunkBlocks blocks; n_end a
// multiple of 8), all M rows. xf: fp32 activations [M, K] (exact widening of x). lut_order:
// sum in the lookup path's order (the caller passes lut_path_applies).
template <Dtype D>
W4K_AWQ_AVX2 void chunk_avx2(const Problem& pb, const float* xf, int64_t n_begin, int64_t n_end,
                             bool lut_order, float* scratch) {
  const int64_t lanes = avx2_lanes<D>(lut_order);
  const int64_t group_size = pb.size_k / pb.groups, ldq = pb.size_n / 8;
  const int64_t nblocks = (n_end - n_begin + kBlockN - 1) / kBlockN;
  const int64_t block_floats = pb.size_m * lanes * kBlockN;  // acc of a block: [m][lane][64]
  float* acc = scratch;
  float* tile = acc + kChunkBlocks * block_floats;
  BlockParams* params = reinterpret_cast<BlockParams*>(tile + kStripK * kBlockN);
  const BlockParams* rows[kStripK];
  alignas(64) int32_t seq[kStripK];
  std::memset(acc, 0, sizeof(float) * nblocks * block_floats);
  for (int64_t k0 = 0; k0 < pb.size_k; k0 += kStripK) {
    const int64_t kb = std::min(kStripK, pb.size_k - k0);
    const int64_t g0 = k0 / group_size, g1 = (k0 + kb - 1) / group_size;
    // each row's group parameters (filled per block below; the rows' groups are the same)
    for (int64_t r = 0; r < kb; ++r) rows[r] = &params[(k0 + r) / group_size - g0];
    for (int64_t b = 0; b < nblocks; ++b) {
      const int64_t n0 = n_begin + b * kBlockN;
      const int64_t words = std::min<int64_t>(8, (n_end - n0) / 8);
      bool plain = true;
      for (int64_t g = g0; g <= g1; ++g) plain &= avx2_load_params<D>(pb, g, n0, words, params[g - g0]);
      const int32_t* q = pb.qweight + k0 * ldq + n0 / 8;
      if (plain)
        avx2_decode_strip<D, true>(q, ldq, kb, words, rows, tile);
      else
        avx2_decode_strip<D, false>(q, ldq, kb, words, rows, tile);
      float* accb = acc + b * block_floats;
      if (!lut_order) {
        int64_t n = 0;
        bool odd = false;
        if constexpr (D == Dtype::kBFloat16) {
          for (int64_t r = 0; r + 2 <= kb; r += 2) seq[n++] = r + 1, seq[n++] = r;
          if (kb % 2) seq[n++] = kb - 1, odd = true;  // only in the last strip of an odd K
        } else {
          for (int64_t r = 0; r < kb; ++r) seq[n++] = r;
        }
        avx2_chain_all(pb, xf, k0, seq, n, odd, tile, accb, kBlockN);
      } else {  // kb is a multiple of 16 (K is, and strips start at multiples of 128)
        for (int64_t j = 0; j < lanes; ++j) {
          int64_t n = 0;
          for (int64_t t = 0; t < kb; t += 16) {
            if constexpr (D == Dtype::kBFloat16)
              seq[n++] = t + 2 * j + 1, seq[n++] = t + 2 * j;
            else
              seq[n++] = t + j;
          }
          avx2_chain_all(pb, xf, k0, seq, n, false, tile, accb + j * kBlockN, lanes * kBlockN);
        }
      }
    }
  }
  for (int64_t b = 0; b < nblocks; ++b) {
    const int64_t n0 = n_begin + b * kBlockN;
    const int64_t ncols = std::min(kBlockN, n_end - n0);
    for (int64_t m = 0; m < pb.size_m; ++m) {
      const float* a = acc + b * block_floats + m * lanes * kBlockN;
      uint16_t* o = pb.out + m * pb.size_n + n0;
      for (int64_t col = 0; col < ncols; ++col) {
        float sum = a[col];
        for (int64_t j = 1; j < lanes; ++j) sum += a[j * kBlockN + col];  // lane order
        o[col] = round_to<D>(sum);
      }
    }
  }
}

}  // namespace awq_cpu
}  // namespace w4k
