// AVX2 (+FMA, F16C) path of the CPU w4a16_gemm: the portable blocked loop of
// w4a16_gemm_kernel.h (dequant_tile_generic + micro_generic) vectorized across output columns,
// with the same arithmetic per output element, so it gives the portable path's bits:
// * weights: w = T((q - z) * s), the product exact in fp32, then ONE round-to-nearest-even
//   (fp16: vcvtps2ph, which rounds as round_to_fp16 does, subnormals and overflow included;
//   bf16: the integer rounding of round_to_bf16, NaN passed through unchanged as it does);
// * sums: acc[i][x] += a[i][k] * w[k][x] for k = 0, 1, ..., K - 1 in order (bf16: k = 1, 0, 3,
//   2, ..., the vdpbf16ps order, see micro_generic), the product rounded to fp32, then the sum
//   (vmulps + vaddps, as the portable loop, compiled without FMA). The
//   product has at most 22 significant bits, but for bf16 it can underflow or overflow fp32,
//   and there an FMA would differ from the portable bits. So the functions here are compiled
//   for avx2 + f16c WITHOUT fma: GCC contracts mul + add into an FMA wherever FMA is enabled,
//   even on intrinsics. (On AMD Zen the multiply and the add run on separate pipes, so the
//   split costs little there.) The path is still selected only where cpu/isa.h finds FMA too.
// The epilogue stays the shared scalar epilogue() of w4a16_gemm_layout.h.
#pragma once

#include <cstdint>

#include "cpu/w4a16_gemm_layout.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(W4K_NO_AVX512)
#define W4K_HAVE_AVX2_W4A16_PATH 1
#include <immintrin.h>

namespace w4k::cpu {

#define W4K_W4A16_AVX2 __attribute__((target("avx2,f16c")))  // no fma: see the top

// round_to_bf16: RNE on the bits, the result an fp32 with zero low 16 bits. It keeps a NaN as it
// is; so does this, because a NaN here has zero low 16 bits (adding at most 0x8000 then cannot
// carry into bit 16): a bf16 scale's NaN (low bits zero) carried through the multiply, or x86's
// default NaN 0xffc00000 (q - z = 0 times an infinite scale).
W4K_W4A16_AVX2 inline __m256 round_bf16_avx2(__m256 w) {
  const __m256i b = _mm256_castps_si256(w);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
  return _mm256_castsi256_ps(
      _mm256_and_si256(_mm256_add_epi32(b, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))),
                       _mm256_set1_epi32(static_cast<int>(0xffff0000u))));
}

// One k-tile (16 rows) of chunk words -> wbuf[16][64] (wbuf column order, as
// dequant_tile_generic). A 256-bit vector of the words at 16c + 4t + j, c = 4cg + 2h + (0, 1),
// j = 0..3 (two 4-word runs) holds, in nibble e of lane 4 (c - 4cg - 2h) + j, the weight of
// row 2t + (e >> 2) + 8 (e & 1) and wbuf column 16 (2cg + ((e >> 1) & 1)) + 8h + lane
// (MarlinChunkTables: x = 16q + 4cl + j with cl = c - 4cg), so each nibble position of the
// vector is 8 consecutive wbuf columns of one row. kUnitScale (per channel: every scale is 1,
// see decode_chunk_groups): w = q - z, an integer of at most 4 bits that T holds exactly, so
// the multiply and the rounding are identities and are skipped.
template <bool kZp, bool kFp16, bool kUnitScale = false>
W4K_W4A16_AVX2 void dequant_tile_avx2(const int32_t* words, const float* const* srow,
                                      const float* const* zrow, float* wbuf) {
  const __m256i low4 = _mm256_set1_epi32(0xf);
  const __m256 eight = _mm256_set1_ps(8.0f);
  for (int cg = 0; cg < 2; ++cg) {
    for (int h = 0; h < 2; ++h) {
      const int32_t* wc = words + 16 * (4 * cg + 2 * h);
#pragma GCC unroll 4
      for (int t = 0; t < 4; ++t) {
        const __m256i v = _mm256_loadu2_m128i(reinterpret_cast<const __m128i*>(wc + 16 + 4 * t),
                                              reinterpret_cast<const __m128i*>(wc + 4 * t));
#pragma GCC unroll 8
        for (int e = 0; e < 8; ++e) {
          const int row = 2 * t + (e >> 2) + 8 * (e & 1);
          const int x0 = 16 * (2 * cg + ((e >> 1) & 1)) + 8 * h;
          __m256 w = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(v, 4 * e), low4));
          w = _mm256_sub_ps(w, kZp ? _mm256_loadu_ps(zrow[row] + x0) : eight);
          if (kUnitScale) {  // w = q - z as it is (see above)
          } else if (kFp16) {
            w = _mm256_mul_ps(w, _mm256_loadu_ps(srow[row] + x0));  // exact in fp32
            w = _mm256_cvtph_ps(_mm256_cvtps_ph(w, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
          } else {
            w = round_bf16_avx2(_mm256_mul_ps(w, _mm256_loadu_ps(srow[row] + x0)));  // exact
          }
          _mm256_storeu_ps(wbuf + row * 64 + x0, w);
        }
      }
    }
  }
}

// dequant_tile_avx2 for a tile's operands: zrow nullptr (no zero points: z = 8), fp16 or bf16
// rounding, unit_scale (per channel: the scales are 1, see decode_chunk_groups).
W4K_W4A16_AVX2 inline void dequant_tile_avx2_any(const int32_t* words, const float* const* srow,
                                                 const float* const* zrow, bool fp16,
                                                 bool unit_scale, float* wbuf) {
  if (unit_scale && zrow) dequant_tile_avx2<true, false, true>(words, srow, zrow, wbuf);
  else if (unit_scale) dequant_tile_avx2<false, false, true>(words, srow, zrow, wbuf);
  else if (zrow && fp16) dequant_tile_avx2<true, true>(words, srow, zrow, wbuf);
  else if (zrow) dequant_tile_avx2<true, false>(words, srow, zrow, wbuf);
  else if (fp16) dequant_tile_avx2<false, true>(words, srow, zrow, wbuf);
  else dequant_tile_avx2<false, false>(words, srow, zrow, wbuf);
}

// acc[i][c0 .. c0 + 8 NV - 1] += a[i][k] * wbuf[k][c0 ..], k = 0 .. kc - 1 in order (kPairs:
// k = 1, 0, 3, 2, ..., micro_generic's bf16 order), for MR rows: MR x NV accumulators + NV
// weight vectors + 1 broadcast in the 16 ymm registers (6 x 2 for many rows; 1 x 8 for one row,
// whose 8 independent chains hide the add latency).
template <int MR, int NV, bool kPairs>
W4K_W4A16_AVX2 void micro_avx2(const float* a, int64_t lda, const float* wbuf, int64_t kc,
                               float* acc, int c0) {
  // Every loop over the accumulators unrolled, so that c stays in registers (with the load and
  // store loops rolled GCC kept c in memory too and stored all of it on every k).
  __m256 c[MR][NV];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) c[i][v] = _mm256_loadu_ps(acc + i * 64 + c0 + 8 * v);
  for (int64_t k0 = 0; k0 < kc; ++k0) {
    const int64_t k = kPairs ? (k0 ^ 1) : k0;
    __m256 w[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) w[v] = _mm256_loadu_ps(wbuf + k * 64 + c0 + 8 * v);
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i) {
      const __m256 av = _mm256_broadcast_ss(a + i * lda + k);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v)  // no FMA: see the top
        c[i][v] = _mm256_add_ps(c[i][v], _mm256_mul_ps(av, w[v]));
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) _mm256_storeu_ps(acc + i * 64 + c0 + 8 * v, c[i][v]);
}

// micro_generic's contract for any number of rows: tiles of 6 rows x 16 columns (one row:
// 1 x 64).
template <bool kPairs>
W4K_W4A16_AVX2 inline void micro_avx2_rows(const float* a, int64_t lda, const float* wbuf,
                                           int64_t kc, float* acc, int64_t rows) {
  if (rows == 1) {
    micro_avx2<1, 8, kPairs>(a, lda, wbuf, kc, acc, 0);
    return;
  }
  for (int64_t i0 = 0; i0 < rows; i0 += 6) {
    const float* a_i = a + i0 * lda;
    float* acc_i = acc + i0 * 64;
    for (int c0 = 0; c0 < 64; c0 += 16) {
      switch (rows - i0 >= 6 ? 6 : rows - i0) {
        case 6: micro_avx2<6, 2, kPairs>(a_i, lda, wbuf, kc, acc_i, c0); break;
        case 5: micro_avx2<5, 2, kPairs>(a_i, lda, wbuf, kc, acc_i, c0); break;
        case 4: micro_avx2<4, 2, kPairs>(a_i, lda, wbuf, kc, acc_i, c0); break;
        case 3: micro_avx2<3, 2, kPairs>(a_i, lda, wbuf, kc, acc_i, c0); break;
        case 2: micro_avx2<2, 2, kPairs>(a_i, lda, wbuf, kc, acc_i, c0); break;
        default: micro_avx2<1, 2, kPairs>(a_i, lda, wbuf, kc, acc_i, c0); break;
      }
    }
  }
}

W4K_W4A16_AVX2 inline void micro_avx2_rows(const float* a, int64_t lda, const float* wbuf,
                                           int64_t kc, float* acc, int64_t rows, bool pairs) {
  if (pairs) micro_avx2_rows<true>(a, lda, wbuf, kc, acc, rows);
  else micro_avx2_rows<false>(a, lda, wbuf, kc, acc, rows);
}

}  // namespace w4k::cpu

#endif  // x86-64 GCC/clang
