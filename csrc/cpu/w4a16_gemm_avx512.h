// AVX-512 paths of the CPU w4a16_gemm kernel (torch-free). Every function carries its own
// target attribute, so the file compiles with the project's baseline flags and is only called
// after the runtime CPU check in w4a16_gemm_kernel.h.
//
// * dequant_tile_avx512 + micro_avx512: the blocked path (dequantize a k-block of one chunk to
//   fp32, then a 6-row x 64-column register-blocked FMA loop).
// * dequant_tile_pairs_avx512 + micro_bf16_avx512: the same for bf16 activations with
//   vdpbf16ps (AVX512-BF16), two k-rows per instruction; one-group k-tiles are decoded by
//   table lookups instead (decode_tile_pairs_lut_avx512 on the decode path's tables, same
//   bits), and write_chunk_row_grouped_avx512 writes a grouped chunk row out.
// * lut_chunk_avx512: few rows of a; per-column lookup tables, one vpermps per 16 weights.
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "cpu/amx_bf16.h"
#include "cpu/w4a16_gemm_layout.h"

// W4K_NO_AVX512 builds the portable path only (used to check that it compiles on its own).
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(W4K_NO_AVX512)
#define W4K_HAVE_AVX512_PATH 1
#include <immintrin.h>

namespace w4k::cpu {

// GCC 12's avx512fintrin.h initializes its "undefined" vectors from themselves (__Y = __Y),
// which -Wuninitialized reports wherever _mm512_shuffle_i32x4 & co. get inlined.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// Words 16c .. 16c + 15 load as one vector with lane 4t + j (128-bit block t). Transposing
// 128-bit blocks of the four vectors c = 4cg .. 4cg + 3 gives v[t] with block cl = c - 4cg and
// lane 4cl + j: every nibble e of v[t] then belongs to ONE row, 2t + (e >> 2) + 8(e & 1), and
// its 16 lanes are wbuf columns 16q + lane, q = 2cg + ((e >> 1) & 1) (see MarlinChunkTables).
// Value of each 4-bit code as a float, indexed by the code (vpermps reads the low 4 bits of its
// index only, so it also masks the shifted nibble): q without zero points (q - z is formed
// later), q - 8 for symmetric GPTQ.
template <bool kZp>
__attribute__((target("avx512f"))) inline __m512 code_values() {
  return kZp ? _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
             : _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
}

// The 64 words of one column group of a tile, regrouped so that v[t] holds words 4t..4t+3 of
// each of its four 16-word runs (the words decoded together below).
__attribute__((target("avx512f"))) inline void load_column_group(const int32_t* wg,
                                                                 __m512i v[4]) {
  const __m512i z0 = _mm512_loadu_si512(wg), z1 = _mm512_loadu_si512(wg + 16);
  const __m512i z2 = _mm512_loadu_si512(wg + 32), z3 = _mm512_loadu_si512(wg + 48);
  const __m512i t0 = _mm512_shuffle_i32x4(z0, z1, 0x44), t1 = _mm512_shuffle_i32x4(z0, z1, 0xee);
  const __m512i t2 = _mm512_shuffle_i32x4(z2, z3, 0x44), t3 = _mm512_shuffle_i32x4(z2, z3, 0xee);
  v[0] = _mm512_shuffle_i32x4(t0, t2, 0x88);
  v[1] = _mm512_shuffle_i32x4(t0, t2, 0xdd);
  v[2] = _mm512_shuffle_i32x4(t1, t3, 0x88);
  v[3] = _mm512_shuffle_i32x4(t1, t3, 0xdd);
}

template <bool kZp, bool kFp16>
__attribute__((target("avx512f"))) void dequant_tile_avx512(const int32_t* words,
                                                            const float* const* srow,
                                                            const float* const* zrow,
                                                            float* wbuf) {
  const __m512 code = code_values<kZp>();
  for (int cg = 0; cg < 2; ++cg) {
    __m512i v[4];
    load_column_group(words + 64 * cg, v);
#pragma GCC unroll 4
    for (int t = 0; t < 4; ++t) {
#pragma GCC unroll 8
      for (int e = 0; e < 8; ++e) {
        const int row = 2 * t + (e >> 2) + 8 * (e & 1);
        const int x0 = 16 * (2 * cg + ((e >> 1) & 1));
        __m512 w = _mm512_permutexvar_ps(_mm512_srli_epi32(v[t], 4 * e), code);
        if (kZp) w = _mm512_sub_ps(w, _mm512_loadu_ps(zrow[row] + x0));
        w = _mm512_mul_ps(w, _mm512_loadu_ps(srow[row] + x0));  // exact in fp32
        if (kFp16) {
          w = _mm512_cvtph_ps(_mm512_cvtps_ph(w, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        } else {  // bf16 round-to-nearest-even on the bits (finite values; nan stays nan)
          __m512i b = _mm512_castps_si512(w);
          __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
          b = _mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
          w = _mm512_castsi512_ps(_mm512_and_si512(b, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
        }
        _mm512_storeu_ps(wbuf + row * 64 + x0, w);
      }
    }
  }
}

// k-tile kt of one chunk whose 16 rows span several groups (row groups: act-order or a group
// size that is not a multiple of 16): each row's scales (sc) and zero points (zf, or nullptr)
// looked up through g_idx, then dequant_tile_avx512. sc / zf: the chunk's [G][64] tables.
template <bool kFp16>
__attribute__((target("avx512f"))) inline void dequant_mixed_tile_avx512(
    const W4a16GemmProblem& p, int64_t kt, const int32_t* words, const float* sc,
    const float* zf, float* wtile) {
  const float* srow[16];
  const float* zrow[16];
  for (int r = 0; r < 16; ++r) {
    const int64_t g = p.g_idx[16 * kt + r];
    srow[r] = sc + g * 64;
    zrow[r] = zf ? zf + g * 64 : nullptr;
  }
  if (zf) dequant_tile_avx512<true, kFp16>(words, srow, zrow, wtile);
  else dequant_tile_avx512<false, kFp16>(words, srow, zrow, wtile);
}

// acc[i][0:64] += sum_k a[i * lda + k] * wbuf[k][0:64], MR rows held in 4 * MR registers; k in
// order, or with kPairs k = 1, 0, 3, 2, ... (micro_generic's bf16 order).
template <int MR, bool kPairs>
__attribute__((target("avx512f"))) void micro_avx512(const float* a, int64_t lda,
                                                     const float* wbuf, int64_t kc,
                                                     float* acc) {
  __m512 c[MR][4];  // unrolled loops: c stays in registers (see micro_bf16_avx512)
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q) c[i][q] = _mm512_loadu_ps(acc + i * 64 + 16 * q);
  for (int64_t k0 = 0; k0 < kc; ++k0) {
    const int64_t k = kPairs ? (k0 ^ 1) : k0;
    const float* w_row = wbuf + k * 64;
    __m512 w0 = _mm512_loadu_ps(w_row), w1 = _mm512_loadu_ps(w_row + 16);
    __m512 w2 = _mm512_loadu_ps(w_row + 32), w3 = _mm512_loadu_ps(w_row + 48);
    for (int i = 0; i < MR; ++i) {
      __m512 av = _mm512_set1_ps(a[i * lda + k]);
      c[i][0] = _mm512_fmadd_ps(av, w0, c[i][0]);
      c[i][1] = _mm512_fmadd_ps(av, w1, c[i][1]);
      c[i][2] = _mm512_fmadd_ps(av, w2, c[i][2]);
      c[i][3] = _mm512_fmadd_ps(av, w3, c[i][3]);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q) _mm512_storeu_ps(acc + i * 64 + 16 * q, c[i][q]);
}

// Runs f(std::integral_constant<int, R>{}, first_row) over `rows` output rows in register
// blocks of kMicroRows rows, then one block of the remaining 1..5: the microkernels take their
// row count as a template parameter. kMicroRows = 6: 24 accumulators + 4 weight vectors + 1
// broadcast of the 32 zmm registers.
constexpr int kMicroRows = 6;

template <typename F>
inline void for_row_blocks(int64_t rows, F&& f) {
  int64_t i = 0;
  for (; i + kMicroRows <= rows; i += kMicroRows) f(std::integral_constant<int, kMicroRows>{}, i);
  switch (rows - i) {
    case 5: f(std::integral_constant<int, 5>{}, i); break;
    case 4: f(std::integral_constant<int, 4>{}, i); break;
    case 3: f(std::integral_constant<int, 3>{}, i); break;
    case 2: f(std::integral_constant<int, 2>{}, i); break;
    case 1: f(std::integral_constant<int, 1>{}, i); break;
    default: break;
  }
}

__attribute__((target("avx512f"))) inline void micro_avx512_rows(const float* a, int64_t lda,
                                                                 const float* wbuf, int64_t kc,
                                                                 float* acc, int64_t rows,
                                                                 bool pairs = false) {
  for_row_blocks(rows, [&](auto mr, int64_t i) {
    if (pairs)
      micro_avx512<decltype(mr)::value, true>(a + i * lda, lda, wbuf, kc, acc + i * 64);
    else
      micro_avx512<decltype(mr)::value, false>(a + i * lda, lda, wbuf, kc, acc + i * 64);
  });
}

// ---- AVX-512 BF16 path: bf16 activations, two k-rows per vdpbf16ps ----------------------------
//
// With bf16 activations and weights rounded to bf16, every product a * w is exact in fp32, and
// vdpbf16ps adds two of them per lane into the fp32 accumulator: the same numerics as two
// fp32 FMAs (except that bf16/fp32 subnormals are flushed, an error below 2^-126 * |w|) at
// twice the rate. wbuf then holds row pairs: lane x of pair row P is the bf16 of rows 2P
// (low half) and 2P + 1 (high half) in wbuf column x. In the transposed words (see
// dequant_tile_avx512) rows 2t + 8*b1 and 2t + 8*b1 + 1 are nibbles e and e + 4 of v[t].

__attribute__((target("avx512f"))) inline __m512i bf16_rne_bits(__m512 w) {
  __m512i b = _mm512_castps_si512(w);
  __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
  return _mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));  // bf16 in high half
}

// The two bf16 values of each 32-bit lane of a k-pair vector as fp32: the low half (even row)
// and the high half (odd row).
__attribute__((target("avx512f"))) inline __m512 bf16_pair_even(__m512i pair) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(pair, 16));
}
__attribute__((target("avx512f"))) inline __m512 bf16_pair_odd(__m512i pair) {
  return _mm512_castsi512_ps(
      _mm512_and_si512(pair, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
}

// kSplit: fp16 weights for the AMX path: each value rounded to fp16, then its hi part into
// wpairs and its lo part into wpairs_lo (amx_split_half), both in the same pair layout.
template <bool kZp, bool kSplit = false>
__attribute__((target("avx512f,f16c"))) void dequant_tile_pairs_avx512(
    const int32_t* words, const float* const* srow, const float* const* zrow, uint32_t* wpairs,
    uint32_t* wpairs_lo = nullptr) {
  const __m512 code = code_values<kZp>();
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  for (int cg = 0; cg < 2; ++cg) {
    __m512i v[4];
    load_column_group(words + 64 * cg, v);
#pragma GCC unroll 4
    for (int t = 0; t < 4; ++t) {
#pragma GCC unroll 4
      for (int e = 0; e < 4; ++e) {  // e: even row 2t + 8(e & 1), odd row = nibble e + 4
        const int row = 2 * t + 8 * (e & 1);
        const int x0 = 16 * (2 * cg + ((e >> 1) & 1));
        __m512 w_even = _mm512_permutexvar_ps(_mm512_srli_epi32(v[t], 4 * e), code);
        __m512 w_odd = _mm512_permutexvar_ps(_mm512_srli_epi32(v[t], 4 * e + 16), code);
        if (kZp) {
          w_even = _mm512_sub_ps(w_even, _mm512_loadu_ps(zrow[row] + x0));
          w_odd = _mm512_sub_ps(w_odd, _mm512_loadu_ps(zrow[row + 1] + x0));
        }
        w_even = _mm512_mul_ps(w_even, _mm512_loadu_ps(srow[row] + x0));
        w_odd = _mm512_mul_ps(w_odd, _mm512_loadu_ps(srow[row + 1] + x0));
        // (odd & 0xffff0000) | (even >> 16): imm 0xd8 = "c ? b : a" bitwise
        if constexpr (kSplit) {
          constexpr int kRne = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
          __m512i hi_even, lo_even, hi_odd, lo_odd;
          amx_split_half(_mm512_cvtph_ps(_mm512_cvtps_ph(w_even, kRne)), hi_even, lo_even);
          amx_split_half(_mm512_cvtph_ps(_mm512_cvtps_ph(w_odd, kRne)), hi_odd, lo_odd);
          _mm512_storeu_si512(wpairs + (row / 2) * 64 + x0,
                              _mm512_ternarylogic_epi32(_mm512_srli_epi32(hi_even, 16), hi_odd,
                                                        high, 0xd8));
          _mm512_storeu_si512(wpairs_lo + (row / 2) * 64 + x0,
                              _mm512_ternarylogic_epi32(_mm512_srli_epi32(lo_even, 16), lo_odd,
                                                        high, 0xd8));
          continue;
        }
        __m512i pair = _mm512_ternarylogic_epi32(_mm512_srli_epi32(bf16_rne_bits(w_even), 16),
                                                 bf16_rne_bits(w_odd), high, 0xd8);
        _mm512_storeu_si512(wpairs + (row / 2) * 64 + x0, pair);
      }
    }
  }
}

// ---- blocked vdpbf16ps path: the k-tile decoded by table lookups -----------------------------
//
// A column of one group has only 16 possible weights, so the blocked path looks them up instead
// of computing (q - z) * s per weight. Word lane L = 4t + j of line c (words 16c .. 16c + 15 of
// a chunk's k-tile) holds in nibbles e' and e' + 4 (e' = 0..3) the weights of rows 2t + 8h and
// 2t + 8h + 1 (h = e' & 1) of column 16j + c + 8*b2 (b2 = e' >> 1) (MarlinChunkTables). A 16-bit
// shift by 4e' puts nibble e' in the low and e' + 4 in the high half of every 32-bit lane, so
// one vpermt2w over the 64-entry table of (c, b2) (index 16j + q: the decode path's table,
// build_pair_table_avx512 in w4a16_gemm_decode_avx512.h) gives the bf16 pair (w[2t + 8h],
// w[2t + 8h + 1]) of that column in lane (t, j). Transposing the 128-bit blocks t of the four
// lines c = 4cg .. 4cg + 3 then gives, per t, one vector of 16 columns of pair row t + 4h: lane
// 4cl + j = column 16j + 4cg + cl + 8*b2, which is wbuf column 16(2cg + b2) + 4cl + j
// (MarlinChunkTables::colperm), i.e. exactly the pair layout of dequant_tile_pairs_avx512. Per
// 32 weights: a shift (none for e' = 0), a vpternlogd, a vpermt2w, two 128-bit shuffles
// (instead of ~18 fp32 operations). The table entries are (q - z) * s rounded by
// vcvtne2ps2bf16, which differs from bf16_rne_bits only where the result is an fp32 subnormal
// (flushed to a signed zero: vdpbf16ps reads such a weight as that same zero) or a NaN (its
// payload), so both decoders give the same bits.

// One k-tile of a chunk (its 128 words) -> wpairs[8][64] (pair rows, wbuf column order) through
// the tables of the tile's group (build_pair_table_avx512<false>: 16 tables of 64 entries).
__attribute__((target("avx512f,avx512bw"))) inline void decode_tile_pairs_lut_avx512(
    const int32_t* words, const uint16_t* tbl, uint32_t* wpairs) {
  // Table index 16j + q: the code in bits 0..3 of each 16-bit half, j in bits 4..5.
  const __m512i code_mask = _mm512_set1_epi32(0x000f000f);
  const __m512i col_bits = _mm512_setr_epi32(0, 0x100010, 0x200020, 0x300030, 0, 0x100010,
                                             0x200020, 0x300030, 0, 0x100010, 0x200020,
                                             0x300030, 0, 0x100010, 0x200020, 0x300030);
#pragma GCC unroll 2
  for (int cg = 0; cg < 2; ++cg) {
    __m512i w[4];
    for (int cl = 0; cl < 4; ++cl) w[cl] = _mm512_loadu_si512(words + 16 * (4 * cg + cl));
#pragma GCC unroll 4
    for (int e = 0; e < 4; ++e) {  // h = e & 1, b2 = e >> 1
      __m512i v[4];
      for (int cl = 0; cl < 4; ++cl) {
        const __m512i shifted = e == 0 ? w[cl] : _mm512_srli_epi16(w[cl], 4 * e);
        // (shifted & code_mask) | col_bits: imm 0xea = (A & B) | C
        const __m512i idx = _mm512_ternarylogic_epi32(shifted, code_mask, col_bits, 0xea);
        const uint16_t* t = tbl + (2 * (4 * cg + cl) + (e >> 1)) * 64;
        v[cl] = _mm512_permutex2var_epi16(_mm512_loadu_si512(t), idx, _mm512_loadu_si512(t + 32));
      }
      // 4 x 4 transpose of 128-bit blocks: out[t] block cl = v[cl] block t
      const __m512i t0 = _mm512_shuffle_i32x4(v[0], v[1], 0x44), t1 = _mm512_shuffle_i32x4(v[0], v[1], 0xee);
      const __m512i t2 = _mm512_shuffle_i32x4(v[2], v[3], 0x44), t3 = _mm512_shuffle_i32x4(v[2], v[3], 0xee);
      uint32_t* dst = wpairs + 4 * (e & 1) * 64 + 16 * (2 * cg + (e >> 1));
      _mm512_storeu_si512(dst, _mm512_shuffle_i32x4(t0, t2, 0x88));
      _mm512_storeu_si512(dst + 64, _mm512_shuffle_i32x4(t0, t2, 0xdd));
      _mm512_storeu_si512(dst + 128, _mm512_shuffle_i32x4(t1, t3, 0x88));
      _mm512_storeu_si512(dst + 192, _mm512_shuffle_i32x4(t1, t3, 0xdd));
    }
  }
}

// wpairs[8][64] (pair row P: rows 2P and 2P + 1 as the low and high bf16 halves, wbuf column
// order) -> wtile[16][64] fp32 rows: the blocked fp32 path's layout, for a CPU without
// AVX512-BF16 (its micro-kernel then adds each pair odd row first, as vdpbf16ps does).
__attribute__((target("avx512f"))) inline void split_tile_pairs_avx512(const uint32_t* wpairs,
                                                                     float* wtile) {
  for (int pr = 0; pr < 8; ++pr)
    for (int v = 0; v < 4; ++v) {
      const __m512i x = _mm512_loadu_si512(wpairs + pr * 64 + 16 * v);
      _mm512_storeu_ps(wtile + (2 * pr) * 64 + 16 * v, bf16_pair_even(x));
      _mm512_storeu_ps(wtile + (2 * pr + 1) * 64 + 16 * v, bf16_pair_odd(x));
    }
}

// c_row[n] = acc[xcol[n]] + bias[n] for the 64 columns of a chunk (grouped weights: the
// epilogue is one fp32 add, the same as epilogue() with chan_scale == nullptr). Output vector
// v (columns 16v .. 16v + 15, n = 16v + r, r = 4cg + cl + 8*b2) reads wbuf column
// x = 16(2cg + b2) + 4cl + v: from acc[0..31] where cg = 0 (r % 8 < 4), else acc[32..63].
__attribute__((target("avx512f"))) inline void write_chunk_row_grouped_avx512(
    const float* acc, const float* bias, float* c_row) {
  const __m512 a0 = _mm512_loadu_ps(acc), a1 = _mm512_loadu_ps(acc + 16);
  const __m512 a2 = _mm512_loadu_ps(acc + 32), a3 = _mm512_loadu_ps(acc + 48);
  // index within the 32 floats of its half: x % 32 = 16 * b2 + 4 * cl + v
  const __m512i base = _mm512_setr_epi32(0, 4, 8, 12, 0, 4, 8, 12, 16, 20, 24, 28, 16, 20, 24, 28);
  constexpr __mmask16 kHigh = 0xF0F0;  // r % 8 >= 4: cg = 1
  for (int v = 0; v < 4; ++v) {
    const __m512i idx = _mm512_add_epi32(base, _mm512_set1_epi32(v));
    const __m512 lo = _mm512_permutex2var_ps(a0, idx, a1);
    const __m512 hi = _mm512_permutex2var_ps(a2, idx, a3);
    __m512 out = _mm512_mask_blend_ps(kHigh, lo, hi);
    out = _mm512_add_ps(out, bias ? _mm512_loadu_ps(bias + 16 * v) : _mm512_setzero_ps());
    _mm512_storeu_ps(c_row + 16 * v, out);
  }
}

// acc[i][0:64] += sum_k a[i * lda + k] * w[k][0:64]; a is bf16 (uint16 bits), kc even.
template <int MR>
__attribute__((target("avx512f,avx512bf16"))) void micro_bf16_avx512(
    const uint16_t* a, int64_t lda, const uint32_t* wpairs, int64_t kc, float* acc) {
  // The loops over the accumulators are unrolled so that GCC keeps c in registers from the
  // first load to the last store (without the pragmas it copied all of c through the stack
  // before and after the k loop: ~120 extra loads and stores per call).
  __m512 c[MR][4];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q) c[i][q] = _mm512_loadu_ps(acc + i * 64 + 16 * q);
  for (int64_t kp = 0; kp < kc / 2; ++kp) {
    const uint32_t* w_row = wpairs + kp * 64;
    __m512bh w0 = (__m512bh)_mm512_loadu_si512(w_row);
    __m512bh w1 = (__m512bh)_mm512_loadu_si512(w_row + 16);
    __m512bh w2 = (__m512bh)_mm512_loadu_si512(w_row + 32);
    __m512bh w3 = (__m512bh)_mm512_loadu_si512(w_row + 48);
    for (int i = 0; i < MR; ++i) {
      int32_t a_pair;
      std::memcpy(&a_pair, a + i * lda + 2 * kp, 4);  // (a[2kp], a[2kp + 1])
      __m512bh av = (__m512bh)_mm512_set1_epi32(a_pair);
      c[i][0] = _mm512_dpbf16_ps(c[i][0], av, w0);
      c[i][1] = _mm512_dpbf16_ps(c[i][1], av, w1);
      c[i][2] = _mm512_dpbf16_ps(c[i][2], av, w2);
      c[i][3] = _mm512_dpbf16_ps(c[i][3], av, w3);
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q) _mm512_storeu_ps(acc + i * 64 + 16 * q, c[i][q]);
}

__attribute__((target("avx512f,avx512bf16"))) inline void micro_bf16_avx512_rows(
    const uint16_t* a, int64_t lda, const uint32_t* wpairs, int64_t kc, float* acc,
    int64_t rows) {
  for_row_blocks(rows, [&](auto mr, int64_t i) {
    micro_bf16_avx512<decltype(mr)::value>(a + i * lda, lda, wpairs, kc, acc + i * 64);
  });
}

// ---- AVX-512 small-M path: per-column lookup tables --------------------------------------------
//
// With few rows of a, decoding dominates. A column n of group g has only 16 possible weights,
// lut[g][n][code] = half((code - z) * s), so decoding 16 weights of one column is one vpermps
// once their 16 codes sit in one vector. Words 16c .. 16c + 15 (lane 4t + j) hold 16 rows x 8
// columns (16j + c + 8*b2): row r of column (j, b2) is nibble e = 4(r % 2) + 2*b2 + r / 8 of
// word lane 4((r % 8) / 2) + j. So per column: vpermd (select the words), vpsrlvd (the nibbles),
// vpermps (the table) give w[16 rows] of that column, and acc[col] += a[k0 .. k0+15] * w keeps
// 16 partial sums per column that are added up at the end.

// lut[(g - g_first) * 1024 + n * 16 + code] for groups [g_first, g_last], chunk columns n.
template <bool kFp16>
__attribute__((target("avx512f"))) void build_luts_avx512(const float* sc, const float* zf,
                                                          int64_t g_first, int64_t g_last,
                                                          float* lut) {
  const MarlinChunkTables& tb = chunk_tables();
  const __m512 code = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int64_t g = g_first; g <= g_last; ++g) {
    for (int n = 0; n < 64; ++n) {
      const int x = tb.xcol[n];
      __m512 z = _mm512_set1_ps(zf ? zf[g * 64 + x] : 8.0f);
      __m512 w = _mm512_mul_ps(_mm512_sub_ps(code, z), _mm512_set1_ps(sc[g * 64 + x]));
      if (kFp16) {
        w = _mm512_cvtph_ps(_mm512_cvtps_ph(w, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      } else {
        __m512i b = _mm512_castps_si512(w);
        __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
        b = _mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
        w = _mm512_castsi512_ps(_mm512_and_si512(b, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
      }
      _mm512_storeu_ps(lut + (g - g_first) * 1024 + n * 16, w);
    }
  }
}

// MR rows of a x NC columns {16j + c + 8*b2 : j0 <= j < j0 + NC/2, b2 = 0, 1} over tiles
// [kt0, kt1). acc + i * acc_stride + 16 * cc (cc = 2(j - j0) + b2): 16-lane partial sums.
template <int MR, int NC>
__attribute__((target("avx512f"))) void lut_pass_avx512(
    const float* a, int64_t lda, const int32_t* words, int64_t word_stride, int64_t kt0,
    int64_t kt1, const float* lut, const int32_t* tile_group, int64_t g_first, int c, int j0,
    float* acc, int64_t acc_stride) {
  __m512 acc_v[MR][NC];
  for (int i = 0; i < MR; ++i)
    for (int cc = 0; cc < NC; ++cc) acc_v[i][cc] = _mm512_loadu_ps(acc + i * acc_stride + 16 * cc);
  // lane r (row r of the tile) of column (j, b2): word lane 4((r % 8) / 2) + j, bit offset
  // 4(4(r % 2) + 2*b2 + r / 8)
  const __m512i word_of_row = _mm512_setr_epi32(0, 0, 4, 4, 8, 8, 12, 12, 0, 0, 4, 4, 8, 8, 12, 12);
  const __m512i shift0 = _mm512_setr_epi32(0, 16, 0, 16, 0, 16, 0, 16, 4, 20, 4, 20, 4, 20, 4, 20);
  const __m512i shift1 = _mm512_add_epi32(shift0, _mm512_set1_epi32(8));
  __m512i word_idx[NC / 2];
  for (int jj = 0; jj < NC / 2; ++jj)
    word_idx[jj] = _mm512_add_epi32(word_of_row, _mm512_set1_epi32(j0 + jj));
  __m512 lut_v[NC];
  int64_t g_loaded = -1;
  for (int64_t kt = kt0; kt < kt1; ++kt) {
    const int64_t g = tile_group[kt];
    if (g < 0) continue;  // a tile whose rows span two groups: see lut_chunk_avx512
    if (g != g_loaded) {
      for (int cc = 0; cc < NC; ++cc) {
        const int col = 16 * (j0 + cc / 2) + c + 8 * (cc % 2);
        lut_v[cc] = _mm512_loadu_ps(lut + (g - g_first) * 1024 + col * 16);
      }
      g_loaded = g;
    }
    const __m512i w_words = _mm512_loadu_si512(words + (kt - kt0) * word_stride);
    __m512 av[MR];
    for (int i = 0; i < MR; ++i) av[i] = _mm512_loadu_ps(a + i * lda + 16 * kt);
    for (int jj = 0; jj < NC / 2; ++jj) {
      const __m512i col_words = _mm512_permutexvar_epi32(word_idx[jj], w_words);
      const __m512 w0 = _mm512_permutexvar_ps(_mm512_srlv_epi32(col_words, shift0), lut_v[2 * jj]);
      const __m512 w1 = _mm512_permutexvar_ps(_mm512_srlv_epi32(col_words, shift1), lut_v[2 * jj + 1]);
      for (int i = 0; i < MR; ++i) {
        acc_v[i][2 * jj] = _mm512_fmadd_ps(av[i], w0, acc_v[i][2 * jj]);
        acc_v[i][2 * jj + 1] = _mm512_fmadd_ps(av[i], w1, acc_v[i][2 * jj + 1]);
      }
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int cc = 0; cc < NC; ++cc) _mm512_storeu_ps(acc + i * acc_stride + 16 * cc, acc_v[i][cc]);
}

// Row blocks of at most 4: (MR, NC) = (1..2, 8) or (3..4, 4) keeps MR * NC accumulators, NC
// tables and MR rows of a within the 32 vector registers. acc[i][c][2j + b2][16] holds column
// 16j + c + 8*b2 of row i (1024 floats per row).
__attribute__((target("avx512f"))) inline void lut_tiles_avx512(
    const float* a, int64_t lda, int64_t rows, const int32_t* words, int64_t word_stride,
    int64_t kt0, int64_t kt1, const float* lut, const int32_t* tile_group, int64_t g_first,
    float* acc) {
  for (int64_t i0 = 0; i0 < rows; i0 += 4) {
    const int mr = static_cast<int>(std::min<int64_t>(4, rows - i0));
    const float* ai = a + i0 * lda;
    for (int c = 0; c < 8; ++c) {
      const int32_t* wc = words + 16 * c;
      float* acc_c = acc + i0 * 1024 + c * 128;
      if (mr == 1) {
        lut_pass_avx512<1, 8>(ai, lda, wc, word_stride, kt0, kt1, lut, tile_group, g_first, c, 0, acc_c, 1024);
      } else if (mr == 2) {
        lut_pass_avx512<2, 8>(ai, lda, wc, word_stride, kt0, kt1, lut, tile_group, g_first, c, 0, acc_c, 1024);
      } else {
        for (int j0 = 0; j0 < 4; j0 += 2) {
          float* acc_j = acc_c + 32 * j0;
          if (mr == 3)
            lut_pass_avx512<3, 4>(ai, lda, wc, word_stride, kt0, kt1, lut, tile_group, g_first, c, j0, acc_j, 1024);
          else
            lut_pass_avx512<4, 4>(ai, lda, wc, word_stride, kt0, kt1, lut, tile_group, g_first, c, j0, acc_j, 1024);
        }
      }
    }
  }
}

// One chunk, rows [m0, m0 + rows), through the lookup-table path. tile_group[kt] is the group
// of every row of k-tile kt, or -1 when its rows span groups (act-order boundaries): such tiles
// are dequantized row by row (dequant_tile_avx512) and accumulated in fp32 into `extra`
// (wbuf column order), which is added at the end. sc/zf/chan_scale: decode_chunk_groups output.
template <bool kFp16>
__attribute__((target("avx512f"))) void lut_chunk_avx512(const W4a16GemmProblem& p, int64_t ch,
                                                         int64_t m0, int64_t rows, const float* sc,
                                                         const float* zf, const float* chan_scale,
                                                         const int32_t* tile_group,
                                                         std::vector<float>& lut,
                                                         std::vector<float>& acc) {
  constexpr int64_t kTilesPerBlock = 16;  // 256 rows of K: 8 KiB of this chunk's words
  const int64_t num_tiles = p.size_k / 16;
  const MarlinChunkTables& tb = chunk_tables();
  acc.assign(rows * 1024 + rows * 64, 0.0f);
  float* extra = acc.data() + rows * 1024;
  float wtile[16 * 64];
  int64_t built_first = -1, built_last = -1;
  for (int64_t kt0 = 0; kt0 < num_tiles; kt0 += kTilesPerBlock) {
    const int64_t kt1 = std::min(num_tiles, kt0 + kTilesPerBlock);
    int64_t g_first = INT64_MAX, g_last = -1;
    for (int64_t kt = kt0; kt < kt1; ++kt) {
      if (tile_group[kt] < 0) {
        dequant_mixed_tile_avx512<kFp16>(p, kt, p.b_q_weight + kt * 2 * p.size_n + 128 * ch,
                                         sc, zf, wtile);
        micro_avx512_rows(p.a + m0 * p.lda + 16 * kt, p.lda, wtile, 16, extra, rows);
        continue;
      }
      g_first = std::min<int64_t>(g_first, tile_group[kt]);
      g_last = std::max<int64_t>(g_last, tile_group[kt]);
    }
    if (g_last < 0) continue;  // every tile of the block was mixed
    if (g_first != built_first || g_last != built_last) {
      lut.resize((g_last - g_first + 1) * 1024);
      build_luts_avx512<kFp16>(sc, zf, g_first, g_last, lut.data());
      built_first = g_first;
      built_last = g_last;
    }
    lut_tiles_avx512(p.a + m0 * p.lda, p.lda, rows, p.b_q_weight + kt0 * 2 * p.size_n + 128 * ch,
                     2 * p.size_n, kt0, kt1, lut.data(), tile_group, g_first, acc.data());
  }
  for (int64_t i = 0; i < rows; ++i) {
    float* c_row = p.c + (m0 + i) * p.size_n + 64 * ch;
    const float* bias = p.bias ? p.bias + 64 * ch : nullptr;
    for (int c = 0; c < 8; ++c)
      for (int cc = 0; cc < 8; ++cc) {
        const int col = 16 * (cc / 2) + c + 8 * (cc % 2);
        const float sum = lane_tree_sum16(acc.data() + i * 1024 + c * 128 + cc * 16, 1);
        c_row[col] = epilogue(sum + extra[i * 64 + tb.xcol[col]], chan_scale,
                              col, bias ? bias[col] : 0.0f);
      }
  }
}

#pragma GCC diagnostic pop

}  // namespace w4k::cpu
#endif  // x86-64 GCC/Clang
