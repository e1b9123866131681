// CPU kernel of w4a16_gemm: fp32 activations x Marlin int4 weight -> fp32 [M, N]. Torch-free:
// raw pointers and sizes; the binding (w4a16_gemm.cpp) converts/permutes a, converts the scales
// and the output, and runs `w4a16_gemm_cpu_chunks` over column chunks in parallel.
//
// Numerics (vLLM gptq_marlin_gemm): each weight is dequantized to the activation's half type,
// w = half((q - z) * s) with ONE round-to-nearest-even ((q - z) * s is exact in fp32: a 5-bit
// integer times an 11-bit (fp16) or 8-bit (bf16) significand), then the products a * w are
// accumulated in fp32. The binding rounds the fp32 result (+ bias) to half once.
//
// Work unit: one 64-column chunk (Marlin words [kt, 128*ch .. 128*ch + 127] for every k-tile kt)
// times a range of rows of a. Per k-tile the 128 words decode into a 16 x 64 fp32 block `wbuf`
// whose columns are a fixed permutation (`colperm`) of the chunk's 64 columns, chosen so the
// AVX-512 decode needs no scatter; the accumulators use the same column order and are
// un-permuted when the chunk is written out.
//
// Marlin chunk layout (derived from vLLM's weight perm; tests check it against golden vectors):
// word w = 16c + 4t + j (c = 0..7, t = 0..3, j = 0..3 is the 16x16 tile, i.e. columns 16j..),
// nibble e (bits 4e..4e+3) holds
//     row = 2t + (e >> 2) + 8 * (e & 1),   col = 16j + c + 8 * ((e >> 1) & 1).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define W4K_HAVE_AVX512_PATH 1
#include <immintrin.h>  // intrinsics are used only inside target("avx512f") functions
#endif

namespace w4k::cpu {

enum class HalfType { kFloat16, kBFloat16 };

struct W4a16GemmProblem {
  const float* a;              // [size_m, size_k] fp32, row stride lda; act-order already applied
  int64_t lda;
  const uint16_t* a_bf16;      // the same rows as bf16 bits (bf16 activations only) or nullptr
  int64_t lda_bf16;
  const int32_t* b_q_weight;   // [size_k / 16, 2 * size_n], Marlin layout
  const float* scales;         // [num_groups, size_n], Marlin-permuted, values of b_scales
  const int32_t* zeros;        // [num_groups, size_n / 8] Marlin zero points, or nullptr (z = 8)
  const int32_t* g_idx;        // [size_k] group of each Marlin row (sorted), or nullptr
  const float* bias;           // [size_n] or nullptr
  float* c;                    // [size_m, size_n] fp32 result, row stride size_n
  int64_t size_m, size_n, size_k;
  int64_t num_groups;          // G, rows of scales (and zeros)
  int64_t group_size;          // rows per group when g_idx == nullptr (K / G; K for G == 1)
  HalfType weight_type;        // the half type w is rounded to (= a's dtype)
};

// ---- layout tables ---------------------------------------------------------------------------

// All per-chunk index maps, built once from the formulas (never per element).
struct MarlinChunkTables {
  int8_t colperm[64];        // wbuf column x -> chunk column n
  int8_t xcol[64];           // chunk column n -> wbuf column x (inverse of colperm)
  int8_t scale_src64[64];    // chunk column n -> position in its permuted 64-chunk (G > 1)
  int8_t scale_src32[32];    // column n of a 32-chunk -> position in permuted 32-chunk (G == 1)
  int8_t zp_word[64];        // chunk column n -> word (0..7) of the chunk's zero-point words
  int8_t zp_shift[64];       // ... and the bit offset of its nibble
  int8_t wsrc_word[16][64];  // (row, wbuf column x) -> word 0..127 of the chunk (generic path)
  int8_t wsrc_shift[16][64]; // ... and the bit offset of its nibble

  MarlinChunkTables() {
    // wbuf column x = 16q + L, q = 2*cg + b2, L = 4*cl + j  <->  col = 16j + 4cg + cl + 8*b2
    // (the AVX-512 decode transposes 128-bit blocks so a vector holds one row: see below).
    for (int x = 0; x < 64; ++x) {
      int q = x / 16, lane = x % 16, cg = q / 2, b2 = q % 2, cl = lane / 4, j = lane % 4;
      colperm[x] = static_cast<int8_t>(16 * j + 4 * cg + cl + 8 * b2);
      xcol[colperm[x]] = static_cast<int8_t>(x);
    }
    // Marlin scale perms: permuted[x] = orig[perm[x]], so orig column perm[x] sits at x.
    for (int i = 0; i < 8; ++i)
      for (int j = 0; j < 8; ++j) scale_src64[i + 8 * j] = static_cast<int8_t>(8 * i + j);
    const int single[8] = {0, 1, 8, 9, 16, 17, 24, 25};
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 8; ++j) scale_src32[2 * i + single[j]] = static_cast<int8_t>(8 * i + j);
    // Zero points: 64-perm, then per 8 columns nibble i holds position 8a + [0,2,4,6,1,3,5,7][i].
    const int awq_nibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};  // inverse of [0,2,4,6,1,3,5,7]
    for (int n = 0; n < 64; ++n) {
      int x = scale_src64[n];
      zp_word[n] = static_cast<int8_t>(x / 8);
      zp_shift[n] = static_cast<int8_t>(4 * awq_nibble[x % 8]);
    }
    for (int w = 0; w < 128; ++w) {
      int c = w / 16, t = (w / 4) % 4, j = w % 4;
      for (int e = 0; e < 8; ++e) {
        int row = 2 * t + (e >> 2) + 8 * (e & 1);
        int col = 16 * j + c + 8 * ((e >> 1) & 1);
        int x = xcol[col];
        wsrc_word[row][x] = static_cast<int8_t>(w);
        wsrc_shift[row][x] = static_cast<int8_t>(4 * e);
      }
    }
  }
};

inline const MarlinChunkTables& chunk_tables() {
  static const MarlinChunkTables tables;
  return tables;
}

// ---- scalar half-precision rounding (generic path; AVX-512 uses vcvtps2ph) ---------------------

inline uint32_t f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float f32_from_bits(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

// Round a float to the nearest fp16 value (ties to even, subnormals, overflow to inf), as float.
inline float round_to_fp16(float f) {
  uint32_t x = f32_bits(f);
  uint32_t sign = x & 0x80000000u, ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return f;                              // inf / nan
  if (ax >= 0x477ff000u) return f32_from_bits(sign | 0x7f800000u);  // >= 65520 -> inf
  if (ax < 0x38800000u) {                                       // below 2^-14: fp16 subnormal
    float units = std::nearbyint(std::fabs(f) * 0x1p24f);       // multiples of 2^-24, RNE
    return f32_from_bits(sign | f32_bits(units * 0x1p-24f));
  }
  uint32_t lsb = (ax >> 13) & 1u;                               // keep 10 mantissa bits, RNE
  return f32_from_bits(sign | ((ax + 0xfffu + lsb) & ~0x1fffu));
}

inline float round_to_bf16(float f) {
  uint32_t x = f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return f;                // nan stays nan
  return f32_from_bits((x + 0x7fffu + ((x >> 16) & 1u)) & 0xffff0000u);
}

// ---- generic path (plain C++, auto-vectorized at -O3) ------------------------------------------

// One k-tile (16 rows) of chunk words -> wbuf[16][64] (permuted columns). srow[r] / zrow[r]:
// decoded scales / zero points (wbuf column order) of row r's group; zrow == nullptr -> z = 8.
inline void dequant_tile_generic(const int32_t* words, const float* const* srow,
                                 const float* const* zrow, HalfType type, float* wbuf) {
  const MarlinChunkTables& tb = chunk_tables();
  for (int r = 0; r < 16; ++r) {
    for (int x = 0; x < 64; ++x) {
      int q = (static_cast<uint32_t>(words[tb.wsrc_word[r][x]]) >> tb.wsrc_shift[r][x]) & 0xf;
      float z = zrow ? zrow[r][x] : 8.0f;
      float w = (static_cast<float>(q) - z) * srow[r][x];  // exact in fp32
      wbuf[r * 64 + x] = type == HalfType::kFloat16 ? round_to_fp16(w) : round_to_bf16(w);
    }
  }
}

// acc[i][0:64] += sum_k a[i * lda + k] * wbuf[k][0:64] for rows i < rows.
inline void micro_generic(const float* a, int64_t lda, const float* wbuf, int64_t kc,
                          float* acc, int64_t rows) {
  for (int64_t i = 0; i < rows; ++i) {
    float* acc_row = acc + i * 64;
    for (int64_t k = 0; k < kc; ++k) {
      const float av = a[i * lda + k];
      const float* w_row = wbuf + k * 64;
      for (int x = 0; x < 64; ++x) acc_row[x] += av * w_row[x];
    }
  }
}

// ---- AVX-512 path ------------------------------------------------------------------------------

#ifdef W4K_HAVE_AVX512_PATH
// GCC 12's avx512fintrin.h initializes its "undefined" vectors from themselves (__Y = __Y),
// which -Wuninitialized reports wherever _mm512_shuffle_i32x4 & co. get inlined.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// Words 16c .. 16c + 15 load as one vector with lane 4t + j (128-bit block t). Transposing
// 128-bit blocks of the four vectors c = 4cg .. 4cg + 3 gives v[t] with block cl = c - 4cg and
// lane 4cl + j: every nibble e of v[t] then belongs to ONE row, 2t + (e >> 2) + 8(e & 1), and
// its 16 lanes are wbuf columns 16q + lane, q = 2cg + ((e >> 1) & 1) (see MarlinChunkTables).
template <bool kZp, bool kFp16>
__attribute__((target("avx512f"))) void dequant_tile_avx512(const int32_t* words,
                                                            const float* const* srow,
                                                            const float* const* zrow,
                                                            float* wbuf) {
  // vpermps indexes with the low 4 bits only, so it also masks the shifted nibble.
  const __m512 code = kZp ? _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
                          : _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
  for (int cg = 0; cg < 2; ++cg) {
    const int32_t* wg = words + 64 * cg;
    __m512i z0 = _mm512_loadu_si512(wg), z1 = _mm512_loadu_si512(wg + 16);
    __m512i z2 = _mm512_loadu_si512(wg + 32), z3 = _mm512_loadu_si512(wg + 48);
    __m512i t0 = _mm512_shuffle_i32x4(z0, z1, 0x44), t1 = _mm512_shuffle_i32x4(z0, z1, 0xee);
    __m512i t2 = _mm512_shuffle_i32x4(z2, z3, 0x44), t3 = _mm512_shuffle_i32x4(z2, z3, 0xee);
    __m512i v[4] = {_mm512_shuffle_i32x4(t0, t2, 0x88), _mm512_shuffle_i32x4(t0, t2, 0xdd),
                    _mm512_shuffle_i32x4(t1, t3, 0x88), _mm512_shuffle_i32x4(t1, t3, 0xdd)};
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

// acc[i][0:64] += sum_k a[i * lda + k] * wbuf[k][0:64], MR rows held in 4 * MR registers.
template <int MR>
__attribute__((target("avx512f"))) void micro_avx512(const float* a, int64_t lda,
                                                     const float* wbuf, int64_t kc,
                                                     float* acc) {
  __m512 c[MR][4];
  for (int i = 0; i < MR; ++i)
    for (int q = 0; q < 4; ++q) c[i][q] = _mm512_loadu_ps(acc + i * 64 + 16 * q);
  for (int64_t k = 0; k < kc; ++k) {
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
  for (int i = 0; i < MR; ++i)
    for (int q = 0; q < 4; ++q) _mm512_storeu_ps(acc + i * 64 + 16 * q, c[i][q]);
}

__attribute__((target("avx512f"))) inline void micro_avx512_rows(const float* a, int64_t lda,
                                                                 const float* wbuf, int64_t kc,
                                                                 float* acc, int64_t rows) {
  constexpr int kMr = 6;  // 24 accumulators + 4 weight vectors + 1 broadcast of 32 registers
  int64_t i = 0;
  for (; i + kMr <= rows; i += kMr) micro_avx512<kMr>(a + i * lda, lda, wbuf, kc, acc + i * 64);
  switch (rows - i) {
    case 5: micro_avx512<5>(a + i * lda, lda, wbuf, kc, acc + i * 64); break;
    case 4: micro_avx512<4>(a + i * lda, lda, wbuf, kc, acc + i * 64); break;
    case 3: micro_avx512<3>(a + i * lda, lda, wbuf, kc, acc + i * 64); break;
    case 2: micro_avx512<2>(a + i * lda, lda, wbuf, kc, acc + i * 64); break;
    case 1: micro_avx512<1>(a + i * lda, lda, wbuf, kc, acc + i * 64); break;
    default: break;
  }
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

template <bool kZp>
__attribute__((target("avx512f"))) void dequant_tile_pairs_avx512(const int32_t* words,
                                                                  const float* const* srow,
                                                                  const float* const* zrow,
                                                                  uint32_t* wpairs) {
  const __m512 code = kZp ? _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
                          : _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  for (int cg = 0; cg < 2; ++cg) {
    const int32_t* wg = words + 64 * cg;
    __m512i z0 = _mm512_loadu_si512(wg), z1 = _mm512_loadu_si512(wg + 16);
    __m512i z2 = _mm512_loadu_si512(wg + 32), z3 = _mm512_loadu_si512(wg + 48);
    __m512i t0 = _mm512_shuffle_i32x4(z0, z1, 0x44), t1 = _mm512_shuffle_i32x4(z0, z1, 0xee);
    __m512i t2 = _mm512_shuffle_i32x4(z2, z3, 0x44), t3 = _mm512_shuffle_i32x4(z2, z3, 0xee);
    __m512i v[4] = {_mm512_shuffle_i32x4(t0, t2, 0x88), _mm512_shuffle_i32x4(t0, t2, 0xdd),
                    _mm512_shuffle_i32x4(t1, t3, 0x88), _mm512_shuffle_i32x4(t1, t3, 0xdd)};
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
        __m512i pair = _mm512_ternarylogic_epi32(_mm512_srli_epi32(bf16_rne_bits(w_even), 16),
                                                 bf16_rne_bits(w_odd), high, 0xd8);
        _mm512_storeu_si512(wpairs + (row / 2) * 64 + x0, pair);
      }
    }
  }
}

// acc[i][0:64] += sum_k a[i * lda + k] * w[k][0:64]; a is bf16 (uint16 bits), kc even.
template <int MR>
__attribute__((target("avx512f,avx512bf16"))) void micro_bf16_avx512(
    const uint16_t* a, int64_t lda, const uint32_t* wpairs, int64_t kc, float* acc) {
  __m512 c[MR][4];
  for (int i = 0; i < MR; ++i)
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
  for (int i = 0; i < MR; ++i)
    for (int q = 0; q < 4; ++q) _mm512_storeu_ps(acc + i * 64 + 16 * q, c[i][q]);
}

__attribute__((target("avx512f,avx512bf16"))) inline void micro_bf16_avx512_rows(
    const uint16_t* a, int64_t lda, const uint32_t* wpairs, int64_t kc, float* acc,
    int64_t rows) {
  constexpr int kMr = 6;
  int64_t i = 0;
  for (; i + kMr <= rows; i += kMr) micro_bf16_avx512<kMr>(a + i * lda, lda, wpairs, kc, acc + i * 64);
  switch (rows - i) {
    case 5: micro_bf16_avx512<5>(a + i * lda, lda, wpairs, kc, acc + i * 64); break;
    case 4: micro_bf16_avx512<4>(a + i * lda, lda, wpairs, kc, acc + i * 64); break;
    case 3: micro_bf16_avx512<3>(a + i * lda, lda, wpairs, kc, acc + i * 64); break;
    case 2: micro_bf16_avx512<2>(a + i * lda, lda, wpairs, kc, acc + i * 64); break;
    case 1: micro_bf16_avx512<1>(a + i * lda, lda, wpairs, kc, acc + i * 64); break;
    default: break;
  }
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
    int64_t kt1, const float* lut, int64_t group_tiles, int64_t g_first, int c, int j0,
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
    const int64_t g = kt / group_tiles;
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
    int64_t kt0, int64_t kt1, const float* lut, int64_t group_tiles, int64_t g_first,
    float* acc) {
  for (int64_t i0 = 0; i0 < rows; i0 += 4) {
    const int mr = static_cast<int>(std::min<int64_t>(4, rows - i0));
    const float* ai = a + i0 * lda;
    for (int c = 0; c < 8; ++c) {
      const int32_t* wc = words + 16 * c;
      float* acc_c = acc + i0 * 1024 + c * 128;
      if (mr == 1) {
        lut_pass_avx512<1, 8>(ai, lda, wc, word_stride, kt0, kt1, lut, group_tiles, g_first, c, 0, acc_c, 1024);
      } else if (mr == 2) {
        lut_pass_avx512<2, 8>(ai, lda, wc, word_stride, kt0, kt1, lut, group_tiles, g_first, c, 0, acc_c, 1024);
      } else {
        for (int j0 = 0; j0 < 4; j0 += 2) {
          float* acc_j = acc_c + 32 * j0;
          if (mr == 3)
            lut_pass_avx512<3, 4>(ai, lda, wc, word_stride, kt0, kt1, lut, group_tiles, g_first, c, j0, acc_j, 1024);
          else
            lut_pass_avx512<4, 4>(ai, lda, wc, word_stride, kt0, kt1, lut, group_tiles, g_first, c, j0, acc_j, 1024);
        }
      }
    }
  }
}

// One chunk, rows [m0, m0 + rows), through the lookup-table path (no act-order, group_size a
// multiple of 16 so a k-tile has one group). sc/zf: decode_chunk_groups output.
template <bool kFp16>
__attribute__((target("avx512f"))) void lut_chunk_avx512(const W4a16GemmProblem& p, int64_t ch,
                                                         int64_t m0, int64_t rows,
                                                         const float* sc, const float* zf,
                                                         std::vector<float>& lut,
                                                         std::vector<float>& acc) {
  constexpr int64_t kTilesPerBlock = 16;  // 256 rows of K: 8 KiB of this chunk's words
  const int64_t group_tiles = p.group_size / 16, num_tiles = p.size_k / 16;
  acc.assign(rows * 1024, 0.0f);
  int64_t built_first = -1, built_last = -1;
  for (int64_t kt0 = 0; kt0 < num_tiles; kt0 += kTilesPerBlock) {
    const int64_t kt1 = std::min(num_tiles, kt0 + kTilesPerBlock);
    const int64_t g_first = kt0 / group_tiles, g_last = (kt1 - 1) / group_tiles;
    if (g_first != built_first || g_last != built_last) {
      lut.resize((g_last - g_first + 1) * 1024);
      build_luts_avx512<kFp16>(sc, zf, g_first, g_last, lut.data());
      built_first = g_first;
      built_last = g_last;
    }
    lut_tiles_avx512(p.a + m0 * p.lda, p.lda, rows, p.b_q_weight + kt0 * 2 * p.size_n + 128 * ch,
                     2 * p.size_n, kt0, kt1, lut.data(), group_tiles, g_first, acc.data());
  }
  for (int64_t i = 0; i < rows; ++i) {
    float* c_row = p.c + (m0 + i) * p.size_n + 64 * ch;
    const float* bias = p.bias ? p.bias + 64 * ch : nullptr;
    for (int c = 0; c < 8; ++c)
      for (int cc = 0; cc < 8; ++cc) {
        const int col = 16 * (cc / 2) + c + 8 * (cc % 2);
        const __m512 v = _mm512_loadu_ps(acc.data() + i * 1024 + c * 128 + cc * 16);
        c_row[col] = _mm512_reduce_add_ps(v) + (bias ? bias[col] : 0.0f);
      }
  }
}

#pragma GCC diagnostic pop
#endif  // W4K_HAVE_AVX512_PATH

// ---- driver ------------------------------------------------------------------------------------

enum class CpuIsa { kGeneric, kAvx512, kAvx512Bf16 };

// The best path this CPU has. W4K_W4A16_ISA=generic or =avx512 (no BF16 dot products) caps it;
// tests use that to cover every path on one machine.
inline CpuIsa w4a16_gemm_cpu_isa() {
  const char* force = std::getenv("W4K_W4A16_ISA");
  if (force && std::strcmp(force, "generic") == 0) return CpuIsa::kGeneric;
#ifdef W4K_HAVE_AVX512_PATH
  if (__builtin_cpu_supports("avx512f")) {
    if (force && std::strcmp(force, "avx512") == 0) return CpuIsa::kAvx512;
    return __builtin_cpu_supports("avx512bf16") ? CpuIsa::kAvx512Bf16 : CpuIsa::kAvx512;
  }
#endif
  return CpuIsa::kGeneric;
}

// Scales and zero points of one chunk for every group, in wbuf column order: sc[g][x] is the
// scale of column colperm[x]. The scale perm is per 64 columns when G > 1 (aligned with the
// chunk) and per 32 columns when G == 1.
inline void decode_chunk_groups(const W4a16GemmProblem& p, int64_t ch, float* sc, float* zf) {
  const MarlinChunkTables& tb = chunk_tables();
  for (int64_t g = 0; g < p.num_groups; ++g) {
    const float* s_row = p.scales + g * p.size_n + 64 * ch;
    for (int x = 0; x < 64; ++x) {
      int n = tb.colperm[x];
      int src = p.num_groups > 1 ? tb.scale_src64[n] : 32 * (n / 32) + tb.scale_src32[n % 32];
      sc[g * 64 + x] = s_row[src];
      if (zf) {
        const int32_t* z_words = p.zeros + g * (p.size_n / 8) + 8 * ch;
        uint32_t word = static_cast<uint32_t>(z_words[tb.zp_word[n]]);
        zf[g * 64 + x] = static_cast<float>((word >> tb.zp_shift[n]) & 0xf);
      }
    }
  }
}

// c[m0:m1, chunk columns] (+ bias) for every 64-column chunk in [chunk_begin, chunk_end).
// Returns 0 (no failure mode once the binding has checked the arguments).
// Rows of a up to which the AVX-512 lookup-table path is used (see lut_chunk_avx512);
// W4K_W4A16_LUT_ROWS overrides it (benchmarks and tests compare both paths with it).
inline int64_t w4a16_gemm_lut_max_rows() {
  const char* env = std::getenv("W4K_W4A16_LUT_ROWS");
  return env ? std::atoll(env) : 8;
}

inline int w4a16_gemm_cpu_chunks(const W4a16GemmProblem& p, int64_t chunk_begin,
                                 int64_t chunk_end, int64_t m0, int64_t m1, CpuIsa isa) {
  constexpr int64_t kKc = 64;  // rows of K per dequantized block: 64 x 64 fp32 = 16 KiB (half of L1)
  const MarlinChunkTables& tb = chunk_tables();
  const int64_t rows = m1 - m0;
  const bool has_zp = p.zeros != nullptr;
  std::vector<float> sc(p.num_groups * 64), zf(has_zp ? p.num_groups * 64 : 0);
  std::vector<float> wbuf(kKc * 64), acc(rows * 64);
  const float* srow[16];
  const float* zrow[16];
  // Few rows: decoding dominates, and the lookup-table path decodes 16 weights per vpermps.
  const bool avx512 = isa == CpuIsa::kAvx512 || isa == CpuIsa::kAvx512Bf16;
  const bool use_lut = avx512 && p.g_idx == nullptr && p.group_size % 16 == 0 &&
                       rows <= w4a16_gemm_lut_max_rows();
  // bf16 activations: two k-rows per vdpbf16ps on bf16 weight pairs.
  const bool use_dpbf16 = isa == CpuIsa::kAvx512Bf16 &&
                          p.weight_type == HalfType::kBFloat16 && p.a_bf16 != nullptr;
  std::vector<float> lut, lut_acc;
  for (int64_t ch = chunk_begin; ch < chunk_end; ++ch) {
    decode_chunk_groups(p, ch, sc.data(), has_zp ? zf.data() : nullptr);
#ifdef W4K_HAVE_AVX512_PATH
    if (use_lut) {
      const float* z = has_zp ? zf.data() : nullptr;
      if (p.weight_type == HalfType::kFloat16)
        lut_chunk_avx512<true>(p, ch, m0, rows, sc.data(), z, lut, lut_acc);
      else
        lut_chunk_avx512<false>(p, ch, m0, rows, sc.data(), z, lut, lut_acc);
      continue;
    }
#endif
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t kb = 0; kb < p.size_k; kb += kKc) {
      const int64_t kc = std::min(kKc, p.size_k - kb);
      for (int64_t k0 = kb; k0 < kb + kc; k0 += 16) {
        for (int r = 0; r < 16; ++r) {
          int64_t g = p.g_idx ? p.g_idx[k0 + r] : (k0 + r) / p.group_size;
          srow[r] = sc.data() + g * 64;
          zrow[r] = has_zp ? zf.data() + g * 64 : nullptr;
        }
        const int32_t* words = p.b_q_weight + (k0 / 16) * 2 * p.size_n + 128 * ch;
        float* w_tile = wbuf.data() + (k0 - kb) * 64;
#ifdef W4K_HAVE_AVX512_PATH
        if (use_dpbf16) {
          uint32_t* pairs = reinterpret_cast<uint32_t*>(wbuf.data()) + (k0 - kb) / 2 * 64;
          if (has_zp) dequant_tile_pairs_avx512<true>(words, srow, zrow, pairs);
          else dequant_tile_pairs_avx512<false>(words, srow, zrow, pairs);
          continue;
        }
        if (avx512) {
          const bool fp16 = p.weight_type == HalfType::kFloat16;
          if (has_zp && fp16) dequant_tile_avx512<true, true>(words, srow, zrow, w_tile);
          else if (has_zp) dequant_tile_avx512<true, false>(words, srow, zrow, w_tile);
          else if (fp16) dequant_tile_avx512<false, true>(words, srow, zrow, w_tile);
          else dequant_tile_avx512<false, false>(words, srow, zrow, w_tile);
          continue;
        }
#endif
        dequant_tile_generic(words, srow, has_zp ? zrow : nullptr, p.weight_type, w_tile);
      }
      const float* a_block = p.a + m0 * p.lda + kb;
#ifdef W4K_HAVE_AVX512_PATH
      if (use_dpbf16) {
        micro_bf16_avx512_rows(p.a_bf16 + m0 * p.lda_bf16 + kb, p.lda_bf16,
                               reinterpret_cast<const uint32_t*>(wbuf.data()), kc, acc.data(),
                               rows);
        continue;
      }
      if (avx512) {
        micro_avx512_rows(a_block, p.lda, wbuf.data(), kc, acc.data(), rows);
        continue;
      }
#endif
      micro_generic(a_block, p.lda, wbuf.data(), kc, acc.data(), rows);
    }
    for (int64_t i = 0; i < rows; ++i) {
      float* c_row = p.c + (m0 + i) * p.size_n + 64 * ch;
      const float* bias = p.bias ? p.bias + 64 * ch : nullptr;
      for (int x = 0; x < 64; ++x) {
        int n = tb.colperm[x];
        c_row[n] = acc[i * 64 + x] + (bias ? bias[n] : 0.0f);
      }
    }
  }
  return 0;
}

}  // namespace w4k::cpu
