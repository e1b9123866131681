// The int8-activation mode of the CPU 4-bit GEMMs (w4a8_gemm: Marlin format, awq_gemm_a8:
// AutoAWQ format), torch-free: raw pointers and sizes.
//
// Scheme (llama.cpp Q8_0 / ONNX Runtime accuracy level 4 style). The activation row m is cut
// into blocks b of `block` consecutive rows of K (in the weight's row order: act-order gathered);
// each block gets sa[m, b] = absmax / 127 (fp32) and qa = rne(a / sa) in [-127, 127] (int8). The
// weight codes q (0..15, unsigned) multiply qa exactly with vpdpbusd (u8 x s8 -> int32), and the
// zero point comes out per block as z * sum(qa):
//     isum[m, b, n] = sum_{k in b} q[k, n] * qa[m, k]  -  z[g(b), n] * sum_{k in b} qa[m, k]
// (exact int32: |isum| <= 15 * 127 * block). The fp32 epilogue, in this order in every path:
//     t = sa[m, b] * sw[g(b), n]              (fp32 multiply)
//     acc = fma(float(isum), t, acc)          (b = 0, 1, ... ascending; acc starts at +0)
//     y = acc + bias[n]                       (fp32 add, only with a bias)
//     out = T(y)                              (one rounding to the activation dtype T)
// so the AVX-512 path, the AVX2 path (cpu/w4a8_gemm_avx2.h) and the portable path give the same
// bits (integer sums are exact in any order), with any thread count (every output is produced
// by one work item).
//
// The block is the weight group when the group is <= 128 rows (32, 64, 128), else the largest
// of 128, 64, 32, 16 that divides it (per channel: the group is K). 128 keeps the per-block
// epilogue to 1/32 of the vpdpbusd work and the activation rounding local (an outlier only
// coarsens its own 128 values); a block always lies inside one weight group.
//
// AVX-512 (VNNI) path. Per (block b, 64-column chunk) the weight codes are decoded into zmm
// that hold, per 32-bit lane, 4 codes of ONE column (a quad of 4 k-rows x 16 columns): every
// call, no re-layout. The activations are laid out once per call in the matching k order, so
// the arithmetic is a plain register-tiled GEMM: vpdpbusd of a weight zmm with the 4 activation
// bytes of a row broadcast. The column order inside a 64-column panel is fixed per format
// (PanelTables::col); the scales and zero points are gathered into it per block and the output
// is put back into natural order at the end.
//
// * Marlin: a k-tile's 16 words 16c .. 16c + 15 (128-bit block t, lane j) hold, in byte pairs,
//   column A = 16j + c (bytes 0, 2) and B = A + 8 (bytes 1, 3) of rows 2t, 2t + 8 (byte 0 / 1
//   low / high nibble) and 2t + 1, 2t + 9 (byte 2 / 3). Shifts and masks put column A's 4
//   nibbles in the 4 bytes of a dword (rows 2t, 2t + 8, 2t + 1, 2t + 9) and column B's in
//   another, and two in-lane vpunpck{l,h}dq pair them per word (decode_marlin_words: no vpshufb
//   or vpternlogd, which on Zen 4 compete with vpdpbusd for issue slots). A 4 x 4 transpose of
//   128-bit blocks (8 vshufi64x2 per 4 zmm) gives one zmm per quad t. So the activations of each
//   k-tile are ordered [0 8 1 9 | 2 10 3 11 | 4 12 5 13 | 6 14 7 15]. By rows of the work item:
//   1 row (marlin_row_a8) and 2 rows (marlin_2rows_half_a8) skip the transpose and keep the
//   128-bit blocks' partial sums apart until the end of the block (with the cheaper byte-shuffle
//   decode, decode_marlin_words_shuf); 3-16 rows (marlin_rows_h_a8, row groups of at most 8)
//   decode half a chunk (32 columns) at a time for all rows of a group; more rows decode an L1
//   panel per (block, chunk) and run 6-row x 64-column tiles (tile_a8).
// * AWQ: a chunk pair (one 64-byte line of each AutoAWQ row, 128 columns) per quad: two stages
//   of in-lane byte / word unpacks of the 4 rows' lines give dwords (k, k + 1, k + 2, k + 3)
//   of one column, and & 0x0f / & 0xf0 the low / high nibbles (the latter 16 times the code,
//   taken out of the exact int32 sum by a shift): 16 instructions per 8 zmm, in the "pair
//   order" of AwqPairTables. 1-4 rows: one strip of the columns per thread, each block read in
//   sweeps of 8-16 rows across the strip, the int32 sums in L1 (awq_sweep_block_a8); more
//   rows: the first register tile decodes into L1 panels of half pairs (tile_awq_pairs_a8),
//   tile_a8 runs the others. An odd last
//   chunk, and every chunk under W4K_A8_AWQ_PAIRS=0: one vpermt2b per output zmm gathers byte
//   4w + b of the 4 rows (held in two zmm) into a dword, then the low or high nibble is kept
//   (decode_awq_quad_regs, chunk panel order; awq_rows_a8 at 1-2 rows, tile_awq_a8 above).
//
// Portable path: the same activation quantization in scalar C++ and, per output, the same
// integer sums and the same fp32 epilogue.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cpu/w4a16_gemm_convert.h"  // HalfType, half_bits_to_float, narrow_c_row, chunk_tables

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(W4K_NO_AVX512)
#include <immintrin.h>
#define W4K_HAVE_A8_AVX512 1
#endif

namespace w4k::cpu {

enum class A8Format { kMarlin, kAwq };

struct W4a8Problem {
  A8Format format;
  const int32_t* qweight;   // Marlin [K/16, 2N] | AWQ [K, N/8]
  const uint16_t* scales;   // [G, N] half bits (Marlin: permuted; AWQ: natural)
  const int32_t* zeros;     // Marlin [G, N/8] or nullptr (z = 8) | AWQ qzeros [G, N/8]
  const float* bias;        // [N] fp32 or nullptr
  int64_t size_m, size_n, size_k;
  int64_t num_groups, group_size;  // group_size: rows of K per weight group (K for G == 1)
  int64_t block;            // activation block (rows of K), divides group_size
  HalfType type;            // activation / scale / output dtype
  // Quantized activations, laid out by quantize_a8_row: [M, K] int8 in the kernel's k order
  // (row stride lda_q) and cpu::kAmxPadRows rows more of storage (the AMX-INT8 tiles load 16
  // rows for a last row block of fewer), sa / sumqa [M, K / block] (row
  // stride num_blocks).
  const int8_t* qa;
  int64_t lda_q;
  const float* sa;
  const int32_t* sumqa;
  int64_t num_blocks;
  uint16_t* out;            // [M, N] half bits, row stride size_n
};

// Block of the activation quantization for a weight group of `group_size` rows (a multiple of
// 16): the group itself up to 128, else the largest of 128, 64, 32, 16 dividing it.
inline int64_t a8_block_size(int64_t group_size) {
  for (int64_t b : {128, 64, 32, 16})
    if (group_size % b == 0) return b;
  return 0;  // not a multiple of 16: the checks refuse it before this is called
}

// Up to this many rows per work item Marlin items are fewer and longer (the bandwidth-bound
// regime).
constexpr int64_t kA8FewRows = 4;
// Up to this many rows per work item the AVX-512 path's vpermt2b decode of AWQ (an item's odd
// last chunk, every chunk under W4K_A8_AWQ_PAIRS=0) runs in registers without L1 panels, each
// pass decoding every quad anew; with more rows a chunk pair's panel is decoded once by its
// first tile (one thread, 4096x11008 rotated: 3-4 rows 7-15 % faster so than with two register
// passes; 2 rows 15-20 % slower).
constexpr int64_t kA8AwqRegRows = 2;
// AWQ on the AVX-512 path: chunk pairs decoded by byte unpacks, up to this many rows in sweeps
// of whole strips (awq_sweep_block_a8, sums in L1), with more into L1 panels for the register
// tiles (tile_awq_pairs_a8) or, from kA8AmxMinRowsAwq rows, the AMX-INT8 tiles. W4K_A8_AWQ_PAIRS=0
// turns the pairs off (tests): every chunk then takes the vpermt2b decode, as an odd last
// chunk of an item always does.
constexpr int64_t kA8AwqPairRows = 4;
inline bool awq_pairs_enabled() {
  const char* env = std::getenv("W4K_A8_AWQ_PAIRS");
  return !(env && std::strcmp(env, "0") == 0);
}
// Marlin with 3 .. this many rows: half a chunk at a time, decoded in registers for all rows
// of a row group (at most 8); AWQ up to this many rows: items of 8 chunks.
constexpr int64_t kA8GroupRows = 16;

// Row order of the quantized activations inside one 16-row Marlin k-tile: position 4t + i holds
// row kMarlinQuadRow[4t + i] = (2t, 2t + 8, 2t + 1, 2t + 9)[i] (see the header comment).
constexpr int kMarlinQuadRow[16] = {0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15};

// AutoAWQ's packing order: nibble j of a word holds column 8w + kAwqOrder[j] (and column
// 8w + c is nibble kAwqNibble[c]).
constexpr int kAwqOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};
constexpr int kAwqNibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};

// Per-format index tables of one 64-column panel, built once from the layout formulas.
struct PanelTables {
  int8_t col[64];          // panel position p -> chunk column n
  int8_t pos[64];          // chunk column n -> panel position p (inverse of col)
  int8_t scale_src[64];    // p -> position of its scale among the chunk's 64 stored scales
  int8_t scale_src_pc[64]; // the same for Marlin per-channel scales (32-column perm)
  int8_t zp_word[64];      // p -> word (0..7) of the chunk's 8 zero-point words
  int8_t zp_shift[64];     // ... and the bit offset of its nibble

  explicit PanelTables(A8Format f) {
    for (int p = 0; p < 64; ++p) {
      const int g = p / 16, lane = p % 16;
      int n;
      if (f == A8Format::kMarlin) {  // zmm g = (j pair 2 * (g / 2), c group g % 2), lane 4cc + d
        const int cc = lane / 4, d = lane % 4;
        n = 32 * (g / 2) + 4 * (g % 2) + cc + 8 * d;
      } else {  // zmm e = g: low nibbles (e < 2) or high ones of bytes 4w + b, w = 4(e % 2) + lane / 4
        const int h = g / 2, w = 4 * (g % 2) + lane / 4, b = lane % 4;
        n = 8 * w + kAwqOrder[2 * b + h];
      }
      col[p] = static_cast<int8_t>(n);
    }
    const MarlinChunkTables& mt = chunk_tables();
    for (int p = 0; p < 64; ++p) {
      const int n = col[p];
      pos[n] = static_cast<int8_t>(p);
      if (f == A8Format::kMarlin) {
        scale_src[p] = mt.scale_src64[n];
        scale_src_pc[p] = static_cast<int8_t>(32 * (n / 32) + mt.scale_src32[n % 32]);
        zp_word[p] = mt.zp_word[n];
        zp_shift[p] = mt.zp_shift[n];
      } else {
        scale_src[p] = scale_src_pc[p] = static_cast<int8_t>(n);
        zp_word[p] = static_cast<int8_t>(n / 8);
        zp_shift[p] = static_cast<int8_t>(4 * kAwqNibble[n % 8]);
      }
    }
  }
};

inline const PanelTables& panel_tables(A8Format f) {
  static const PanelTables marlin(A8Format::kMarlin), awq(A8Format::kAwq);
  return f == A8Format::kMarlin ? marlin : awq;
}

// AWQ on the AVX-512 path (awq_sweep_block_a8, tile_awq_pairs_a8, the AMX-INT8 panels): a chunk
// pair (one 64-byte line of each AutoAWQ row, 16 words = 128 columns) decoded by byte unpacks
// into 8 zmm in "pair order":
// position p = 16 j + 4 l + d, zmm j = 2 i + h, holds the column of nibble 2 d + h of word
// 4 l + i (l: the 128-bit lane, i: which of its 4 words, d: the byte, h: low or high nibble),
// i.e. column 8 (4 l + i) + AWQ order[2 d + h]; zero points are packed the same way, so a
// zero point sits at that same nibble of its word.
struct AwqPairTables {
  int16_t scale_idx[128];  // p -> its column n mod 64 (an index into the half pair's 64 scales)
  uint32_t scale_hi[4];    // bit r of word m: position 32 m + r is in the second chunk (n >= 64)
  int8_t zp_word[128];     // p -> word 4 l + i of the pair's 16 zero-point words
  int8_t zp_shift[128];    // ... and the bit offset 4 (2 d + h) of its nibble
  int8_t out_idx[8][16];   // natural columns 16 o + r <- position (among the 64 floats from
                           // 64 (o % 2)) of the pair's fp32 sums; o even reads zmm 0-3, odd 4-7

  AwqPairTables() {
    int pos[128];
    for (int m = 0; m < 4; ++m) scale_hi[m] = 0;
    for (int p = 0; p < 128; ++p) {
      const int j = p / 16, l = p % 16 / 4, d = p % 4, i = j / 2, h = j % 2;
      const int w = 4 * l + i, n = 8 * w + kAwqOrder[2 * d + h];
      pos[n] = p;
      scale_idx[p] = static_cast<int16_t>(n % 64);
      if (n >= 64) scale_hi[p / 32] |= 1u << (p % 32);
      zp_word[p] = static_cast<int8_t>(w);
      zp_shift[p] = static_cast<int8_t>(4 * (2 * d + h));
    }
    for (int o = 0; o < 8; ++o)
      for (int r = 0; r < 16; ++r)
        out_idx[o][r] = static_cast<int8_t>(pos[16 * o + r] - 64 * (o % 2));
  }
};

inline const AwqPairTables& awq_pair_tables() {
  static const AwqPairTables t;
  return t;
}

// Source column of a (before act-order) for position k' of the quantized row.
inline int64_t a8_source_row(A8Format f, int64_t kq) {
  return f == A8Format::kMarlin ? 16 * (kq / 16) + kMarlinQuadRow[kq % 16] : kq;
}

// ---- activation quantization ----------------------------------------------------------------

// fp32 of the gathered activations of one block -> qa, sa, sum(qa). absmax is the integer max
// of the |x| bit patterns: NaN > inf > every finite value, in any order, so a block holding a
// NaN gets sa = NaN and one holding an inf sa = inf; qa is then 0 (and for absmax = 0) and the
// epilogue's fma(0, NaN or inf, acc) makes the row's outputs NaN: garbage is never hidden.
inline void quantize_block_scalar(const float* x, int64_t n, int8_t* qa, float* sa,
                                  int32_t* sumqa) {
  uint32_t amax_bits = 0;
  for (int64_t i = 0; i < n; ++i) amax_bits = std::max(amax_bits, f32_bits(x[i]) & 0x7fffffffu);
  const float s = f32_from_bits(amax_bits) / 127.0f;
  const bool ok = std::isfinite(s) && s != 0.0f;
  int32_t sum = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t q = ok ? static_cast<int32_t>(std::nearbyint(x[i] / s)) : 0;
    qa[i] = static_cast<int8_t>(q);
    sum += q;
  }
  *sa = s;
  *sumqa = sum;
}

#ifdef W4K_HAVE_A8_AVX512
// GCC 12's AVX-512 headers initialize their "undefined" vectors from themselves (see
// w4a16_gemm_avx512.h); -Wuninitialized reports it wherever they get inlined.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
__attribute__((target("avx512f,avx512bw,avx512vl"))) inline void quantize_block_avx512(
    const float* x, int64_t n, int8_t* qa, float* sa, int32_t* sumqa) {
  // n is a multiple of 16
  __m512i amax = _mm512_setzero_si512();
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
  for (int64_t i = 0; i < n; i += 16)
    amax = _mm512_max_epu32(amax, _mm512_and_si512(_mm512_loadu_si512(x + i), abs_mask));
  const float s = f32_from_bits(static_cast<uint32_t>(_mm512_reduce_max_epu32(amax))) / 127.0f;
  const bool ok = std::isfinite(s) && s != 0.0f;
  __m512i sum = _mm512_setzero_si512();
  const __m512 sv = _mm512_set1_ps(s);
  for (int64_t i = 0; i < n; i += 16) {
    __m512i q = _mm512_setzero_si512();
    if (ok)
      q = _mm512_cvt_roundps_epi32(_mm512_div_ps(_mm512_loadu_ps(x + i), sv),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    sum = _mm512_add_epi32(sum, q);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qa + i), _mm512_cvtepi32_epi8(q));
  }
  *sa = s;
  *sumqa = _mm512_reduce_add_epi32(sum);
}
#pragma GCC diagnostic pop

// The same in AVX2: the same absmax bits, the same IEEE division and round-to-nearest-even
// (vcvtps2dq under the default MXCSR rounding, as nearbyint), so the same qa, sa and sum.
__attribute__((target("avx2"))) inline void quantize_block_avx2(const float* x, int64_t n,
                                                                int8_t* qa, float* sa,
                                                                int32_t* sumqa) {
  // n is a multiple of 16
  __m256i amax = _mm256_setzero_si256();
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  for (int64_t i = 0; i < n; i += 8)
    amax = _mm256_max_epu32(amax, _mm256_and_si256(
                                      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)),
                                      abs_mask));
  __m128i m4 = _mm_max_epu32(_mm256_castsi256_si128(amax), _mm256_extracti128_si256(amax, 1));
  m4 = _mm_max_epu32(m4, _mm_shuffle_epi32(m4, 0x4e));
  m4 = _mm_max_epu32(m4, _mm_shuffle_epi32(m4, 0xb1));
  const float s = f32_from_bits(static_cast<uint32_t>(_mm_cvtsi128_si32(m4))) / 127.0f;
  const bool ok = std::isfinite(s) && s != 0.0f;
  __m256i sum = _mm256_setzero_si256();
  const __m256 sv = _mm256_set1_ps(s);
  for (int64_t i = 0; i < n; i += 16) {
    __m256i q0 = _mm256_setzero_si256(), q1 = _mm256_setzero_si256();
    if (ok) {
      q0 = _mm256_cvtps_epi32(_mm256_div_ps(_mm256_loadu_ps(x + i), sv));
      q1 = _mm256_cvtps_epi32(_mm256_div_ps(_mm256_loadu_ps(x + i + 8), sv));
    }
    sum = _mm256_add_epi32(sum, _mm256_add_epi32(q0, q1));
    // int32 -> int8 in order (values in [-127, 127]: the saturating packs are exact)
    const __m256i w16 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q0, q1), 0xd8);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qa + i),
                     _mm_packs_epi16(_mm256_castsi256_si128(w16),
                                     _mm256_extracti128_si256(w16, 1)));
  }
  __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
  *sa = s;
  *sumqa = _mm_cvtsi128_si32(s4);
}
#endif

// Vector width of the activation quantization (the binding picks it with the kernel path).
enum class A8Simd { kNone, kAvx2, kAvx512 };

// One activation row (half bits, row a_row; act-order: column r of the weight takes a[perm[r]])
// -> qa in the kernel's k order, sa and sumqa per block. scratch: size_k floats.
inline void quantize_a8_row(const W4a8Problem& p, const uint16_t* a_row, const int32_t* perm,
                            A8Simd simd, int8_t* qa, float* sa, int32_t* sumqa,
                            float* scratch) {
  for (int64_t kq = 0; kq < p.size_k; ++kq) {
    const int64_t r = a8_source_row(p.format, kq);
    scratch[kq] = half_bits_to_float(a_row[perm ? perm[r] : r], p.type);
  }
  for (int64_t b = 0; b < p.num_blocks; ++b) {
    const int64_t k0 = b * p.block;
#ifdef W4K_HAVE_A8_AVX512
    if (simd == A8Simd::kAvx512) {
      quantize_block_avx512(scratch + k0, p.block, qa + k0, sa + b, sumqa + b);
      continue;
    }
    if (simd == A8Simd::kAvx2) {
      quantize_block_avx2(scratch + k0, p.block, qa + k0, sa + b, sumqa + b);
      continue;
    }
#endif
    (void)simd;
    quantize_block_scalar(scratch + k0, p.block, qa + k0, sa + b, sumqa + b);
  }
}

// ---- weights of one (block, chunk): codes, scales and zero points ----------------------------

// Scales (fp32) and zero points of weight group g for chunk ch, in panel order.
inline void gather_scales_zeros(const W4a8Problem& p, const PanelTables& tb, int64_t g,
                                int64_t ch, float* sw, int32_t* z) {
  const uint16_t* s_row = p.scales + g * p.size_n + 64 * ch;
  const bool per_channel_marlin = p.format == A8Format::kMarlin && p.num_groups == 1;
  const int32_t* z_words = p.zeros ? p.zeros + g * (p.size_n / 8) + 8 * ch : nullptr;
  for (int q = 0; q < 64; ++q) {
    sw[q] = half_bits_to_float(s_row[per_channel_marlin ? tb.scale_src_pc[q] : tb.scale_src[q]],
                               p.type);
    z[q] = z_words ? static_cast<int32_t>(
                         (static_cast<uint32_t>(z_words[tb.zp_word[q]]) >> tb.zp_shift[q]) & 15u)
                   : 8;
  }
}

// Code q (0..15) of weight row r (Marlin row order), chunk column n of chunk ch.
inline uint32_t weight_code(const W4a8Problem& p, int64_t r, int64_t ch, int n) {
  if (p.format == A8Format::kMarlin) {
    // word w = 16c + 4t + j, nibble e: row = 2t + (e >> 2) + 8(e & 1), col = 16j + c + 8(e>>1 & 1)
    const int rr = static_cast<int>(r % 16), j = n / 16, c = n % 8, b2 = (n / 8) % 2;
    const int t = (rr % 8) / 2, e = 4 * (rr % 2) + 2 * b2 + (rr / 8);
    const int32_t word = p.qweight[(r / 16) * 2 * p.size_n + 128 * ch + 16 * c + 4 * t + j];
    return (static_cast<uint32_t>(word) >> (4 * e)) & 15u;
  }
  const int64_t col = 64 * ch + n;
  const int32_t word = p.qweight[r * (p.size_n / 8) + col / 8];
  return (static_cast<uint32_t>(word) >> (4 * kAwqNibble[col % 8])) & 15u;
}

// ---- portable path ------------------------------------------------------------------------------

// Columns of chunks [ch0, ch1), rows [m0, m1): the whole computation, one output at a time.
inline void w4a8_chunks_portable(const W4a8Problem& p, int64_t ch0, int64_t ch1, int64_t m0,
                                 int64_t m1) {
  const PanelTables& tb = panel_tables(p.format);
  std::vector<uint8_t> codes(p.block * 64);  // [k' in block][chunk column n]
  std::vector<float> acc((m1 - m0) * 64), sw(64), y(64);
  std::vector<int32_t> z(64);
  for (int64_t ch = ch0; ch < ch1; ++ch) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t b = 0; b < p.num_blocks; ++b) {
      const int64_t k0 = b * p.block, g = k0 / p.group_size;
      gather_scales_zeros(p, tb, g, ch, sw.data(), z.data());
      for (int64_t kq = 0; kq < p.block; ++kq)
        for (int n = 0; n < 64; ++n)
          codes[kq * 64 + n] = static_cast<uint8_t>(
              weight_code(p, a8_source_row(p.format, k0 + kq), ch, n));
      for (int64_t m = m0; m < m1; ++m) {
        const int8_t* qa = p.qa + m * p.lda_q + k0;
        const float sa = p.sa[m * p.num_blocks + b];
        const int32_t sq = p.sumqa[m * p.num_blocks + b];
        for (int q = 0; q < 64; ++q) {  // panel order, as the AVX-512 path keeps its sums
          const int n = tb.col[q];
          int32_t dot = 0;
          for (int64_t kq = 0; kq < p.block; ++kq) dot += codes[kq * 64 + n] * qa[kq];
          const int32_t isum = dot - z[q] * sq;
          const float t = sa * sw[q];
          float& c = acc[(m - m0) * 64 + q];
          c = std::fma(static_cast<float>(isum), t, c);
        }
      }
    }
    for (int64_t m = m0; m < m1; ++m) {
      for (int n = 0; n < 64; ++n) {
        const float v = acc[(m - m0) * 64 + tb.pos[n]];
        y[n] = p.bias ? v + p.bias[64 * ch + n] : v;
      }
      narrow_c_row(y.data(), 64, p.type, false, p.out + m * p.size_n + 64 * ch);
    }
  }
}

}  // namespace w4k::cpu
