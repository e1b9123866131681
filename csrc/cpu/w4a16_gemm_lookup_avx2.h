// AVX2 decode of the Marlin weight by table lookups, for the CPU w4a16_gemm at M <= 8 (the
// decode path's rows and summation order, w4a16_gemm_kernel.h): the AVX2 counterpart of the AVX-512
// decode path, with the same bits as the portable code.
//
// Why: the per-weight AVX2 decode (dequant_tile_avx2: shift, mask, convert, subtract, multiply,
// a 5-op rounding and a store per 8 weights, then a reload per row) kept M = 1 at ~2 GB/s of
// weight per core. Here every column's 16 possible weights of a group, T((q - z) * s) for
// q = 0..15 (the same operations, so the same values), are built once per group as two 16-byte
// tables (low and high bytes of the fp16 / bf16 bits), and a tile is decoded by `vpshufb`,
// which looks up 16 bytes in a table per 128-bit lane: every lane holds one column's 16 rows.
//
// Data flow for one k-tile of a chunk (128 words, Marlin layout of w4a16_gemm_layout.h: word
// 16c + 4t + j, nibble e -> row 2t + (e >> 2) + 8 (e & 1), column x(c, j, e >> 1 & 1) in wbuf
// order, x(c, j, e1) = 32 (c >> 2) + 16 e1 + 4 (c & 3) + j):
// * per c, the 16 words (one line) are regrouped by one vpermd each half and two 64-bit unpacks
//   into U_T (T = 0, 1): 128-bit lane L of U_T holds the words t = 0..3 of j = T + 2L. Read as
//   16-bit units, unit w of such a lane holds, nibble by nibble, rows w and w + 8 of column
//   x(c, j, 0), then rows w and w + 8 of x(c, j, 1); two packs of the masked nibbles give the
//   index bytes of each column in natural row order (idx_e1: lane L = column x(c, T + 2L, e1));
// * two vpshufb (low and high byte tables of those two columns) and two byte unpacks give the
//   16-bit weights of rows 0..7 and 8..15;
// * bf16: the odd rows of each dword are already fp32 (bits << 16) after a mask, the even rows
//   after a shift: 4 vectors (rows 2t + 1, 2t, 2t + 9, 2t + 8 in element t of each lane), the
//   decode path's 4 lane sums of the two columns, added in its order; fp16: vcvtph2ps of each
//   8-row half, the 8 lane sums (t, r) of rows 2t + r, then 2t + 8 + r.
// Products and sums: an fp32 multiply, then an add (no FMA: see w4a16_gemm_avx2.h), except
// where every product is exact in fp32 (lookup_products_exact): there the tile is compiled into
// an FMA target (lookup_band_row_fma_avx2, w4a16_gemm_kernel.h), where GCC contracts each
// multiply and add into one vfmadd231ps, which rounds once where the two round twice, but the
// first of those two roundings is then no rounding at all, so the bits are the same.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "cpu/w4a16_gemm_avx2.h"

#ifdef W4K_HAVE_AVX2_W4A16_PATH

namespace w4k::cpu {

// One group's tables of one chunk: slot (c, T, e1) = 64 bytes, low-byte table of the columns
// x(c, T, e1) and x(c, T + 2, e1) (16 bytes each), then their high-byte tables.
constexpr int kLookupTableBytes = 8 * 2 * 2 * 64;
constexpr int lookup_slot(int c, int t, int e1) { return (c * 2 + t) * 2 + e1; }
// Where wbuf column x = x(c, j, e1) sits: its slot (c, j & 1, e1) and the slot's 128-bit lane
// j >> 1 (tables and lane sums alike).
constexpr int lookup_slot_of(int x) {
  return lookup_slot(4 * (x >> 5) + ((x >> 2) & 3), x & 1, (x >> 4) & 1);
}
constexpr int lookup_lane_of(int x) { return (x >> 1) & 1; }
// Lane sums per row of a: bf16 4 per column, fp16 8.
constexpr int lookup_lane_floats(bool fp16) { return fp16 ? 512 : 256; }

// Where the scale and zero point of wbuf column x sit in a group's Marlin-permuted row of the
// chunk (G > 1: decode_group_scales' indices, precomputed per x).
struct LookupScaleIndex {
  alignas(32) int16_t scale_at[64];  // position of x's scale in the chunk's 64 scales
  alignas(32) int32_t zero_word[64];  // word (0..7) of the chunk's zero-point words ...
  alignas(32) int32_t zero_shift[64];  // ... and the bit offset of x's nibble
  LookupScaleIndex() {
    const MarlinChunkTables& tb = chunk_tables();
    for (int x = 0; x < 64; ++x) {
      const int n = tb.colperm[x];
      scale_at[x] = tb.scale_src64[n];
      zero_word[x] = tb.zp_word[n];
      zero_shift[x] = tb.zp_shift[n];
    }
  }
};

// decode_group_scales for G > 1 (no per-channel epilogue), vectorized: s64[x] and (z_words
// not nullptr) z64[x] of wbuf column x, from the group's 64 scale bits s_row (fp16 or bf16)
// and its 8 zero-point words.
W4K_W4A16_AVX2 inline void gather_group_scales_avx2(const uint16_t* s_row,
                                                    const int32_t* z_words, bool fp16,
                                                    float* s64, float* z64) {
  static const LookupScaleIndex ix;
  alignas(16) uint16_t bits[64];
  for (int x = 0; x < 64; ++x) bits[x] = s_row[ix.scale_at[x]];
  const __m256i zw = z_words ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(z_words))
                             : _mm256_setzero_si256();
  for (int x = 0; x < 64; x += 8) {
    const __m128i h = _mm_load_si128(reinterpret_cast<const __m128i*>(bits + x));
    _mm256_storeu_ps(s64 + x, fp16 ? _mm256_cvtph_ps(h)
                                   : _mm256_castsi256_ps(
                                         _mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)));
    if (z_words) {
      const __m256i w = _mm256_permutevar8x32_epi32(
          zw, _mm256_load_si256(reinterpret_cast<const __m256i*>(ix.zero_word + x)));
      const __m256i shift =
          _mm256_load_si256(reinterpret_cast<const __m256i*>(ix.zero_shift + x));
      const __m256i z = _mm256_and_si256(_mm256_srlv_epi32(w, shift), _mm256_set1_epi32(15));
      _mm256_storeu_ps(z64 + x, _mm256_cvtepi32_ps(z));
    }
  }
}

// round_bf16_avx2's bf16 bits (dequant_tile_avx2's rounding), in the low 16 bits of each dword:
// its sum shifted down (its mask clears only bits the shift drops).
W4K_W4A16_AVX2 inline __m256i bf16_bits_avx2(__m256 w) {
  const __m256i b = _mm256_castps_si256(w);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
  return _mm256_srli_epi32(_mm256_add_epi32(b, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))),
                           16);
}

// Entries q = 0..7 (lo) and 8..15 (hi) of wbuf column x's table before rounding: (q - z) * s,
// exact in fp32 (z64 nullptr: z = 8).
W4K_W4A16_AVX2 inline void lookup_entries_avx2(const float* s64, const float* z64, int x,
                                               __m256& lo, __m256& hi) {
  const __m256 s = _mm256_set1_ps(s64[x]);
  const __m256 z = _mm256_set1_ps(z64 ? z64[x] : 8.0f);
  lo = _mm256_mul_ps(_mm256_sub_ps(_mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7), z), s);
  hi = _mm256_mul_ps(_mm256_sub_ps(_mm256_setr_ps(8, 9, 10, 11, 12, 13, 14, 15), z), s);
}

// The tables of the 64 columns (wbuf order) with scales s64 and zero points z64 (nullptr: 8):
// entry q of column x = T((q - z) * s), rounded as dequant_tile_avx2 rounds each weight. Slot by
// slot, its two columns A (lane 0) and B (lane 1) together, so that each half of the slot (low
// bytes, high bytes) is one 32-byte store and no column index is mapped to its slot. Against
// one column at a time (the Zen 3 VM, 2026-12-07, in one process, GPTQ g128, the three shapes):
// bf16 M = 1 1.11-1.12x, M = 2 1.08-1.12x, M = 4 1.06-1.07x; fp16 1.00-1.09x (its tables
// were cheaper already).
template <bool kFp16>
W4K_W4A16_AVX2 inline void build_lookup_tables_avx2(const float* s64, const float* z64,
                                                    uint8_t* tbl) {
  // per lane: the low bytes of its 8 16-bit entries, then their high bytes
  const __m256i split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                                         0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  const __m256i dword_pairs = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const __m256i low_byte = _mm256_set1_epi16(0x00ff);
  for (int c = 0; c < 8; ++c)
    for (int t = 0; t < 2; ++t)
      for (int e1 = 0; e1 < 2; ++e1) {
        const int x = 32 * (c >> 2) + 16 * e1 + 4 * (c & 3) + t;  // x(c, t + 2 L, e1) at L = 0
        __m256 a_lo, a_hi, b_lo, b_hi;
        lookup_entries_avx2(s64, z64, x, a_lo, a_hi);
        lookup_entries_avx2(s64, z64, x + 2, b_lo, b_hi);
        __m256i lo, hi;  // [A's 16 low bytes | B's], [A's 16 high bytes | B's]
        if (kFp16) {
          constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
          // per column: qwords low bytes q 0-7, high 0-7, low 8-15, high 8-15
          const __m256i a = _mm256_shuffle_epi8(
              _mm256_setr_m128i(_mm256_cvtps_ph(a_lo, kRound), _mm256_cvtps_ph(a_hi, kRound)),
              split);
          const __m256i b = _mm256_shuffle_epi8(
              _mm256_setr_m128i(_mm256_cvtps_ph(b_lo, kRound), _mm256_cvtps_ph(b_hi, kRound)),
              split);
          lo = _mm256_permute4x64_epi64(_mm256_unpacklo_epi64(a, b), 0xd8);  // qwords 0 2 1 3
          hi = _mm256_permute4x64_epi64(_mm256_unpackhi_epi64(a, b), 0xd8);
        } else {
          // per column: 16-bit entries q 0-3, 8-11 | 4-7, 12-15; then bytes A 0-3, A 8-11,
          // B 0-3, B 8-11 | A 4-7, A 12-15, B 4-7, B 12-15, dwords regrouped
          const __m256i a = _mm256_packus_epi32(bf16_bits_avx2(a_lo), bf16_bits_avx2(a_hi));
          const __m256i b = _mm256_packus_epi32(bf16_bits_avx2(b_lo), bf16_bits_avx2(b_hi));
          lo = _mm256_permutevar8x32_epi32(
              _mm256_packus_epi16(_mm256_and_si256(a, low_byte), _mm256_and_si256(b, low_byte)),
              dword_pairs);
          hi = _mm256_permutevar8x32_epi32(
              _mm256_packus_epi16(_mm256_srli_epi16(a, 8), _mm256_srli_epi16(b, 8)), dword_pairs);
        }
        uint8_t* dst = tbl + 64 * lookup_slot(c, t, e1);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), lo);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 32), hi);
      }
}

// One k-tile of one chunk (words: its 128 words; prefetch, unless nullptr: 128 words to fetch,
// a line per 16 words) for MR rows of a (a: row 0's 16 activations
// of the tile, rows lda apart), added to the lane sums lanes[MR][lookup_lane_floats]: bf16 slot
// (c, T, e1) = 8 floats, lane L's 4 lane sums at 4L; fp16 16 floats, lane L's 8 at 8L.
template <int MR, bool kFp16>
W4K_W4A16_AVX2 __attribute__((always_inline)) inline void lookup_tile_avx2(const int32_t* words, const uint8_t* tbl,
                                            const float* a, int64_t lda, float* lanes,
                                            const int32_t* prefetch) {
  constexpr int kLane = lookup_lane_floats(kFp16);
  const __m256i dword_pairs = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const __m256i nib = _mm256_set1_epi16(0x000f);
  // bf16: the activations of each step, element t of both lanes: rows 2t + 1, 2t, 2t + 9,
  // 2t + 8; fp16: rows 0..7 and 8..15 as they are.
  alignas(32) float steps[MR][4][8];
  if (!kFp16) {
    const __m256i odd = _mm256_setr_epi32(1, 3, 5, 7, 1, 3, 5, 7);
    const __m256i even = _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6);
    for (int i = 0; i < MR; ++i) {
      const __m256 a0 = _mm256_loadu_ps(a + i * lda), a1 = _mm256_loadu_ps(a + i * lda + 8);
      _mm256_store_ps(steps[i][0], _mm256_permutevar8x32_ps(a0, odd));
      _mm256_store_ps(steps[i][1], _mm256_permutevar8x32_ps(a0, even));
      _mm256_store_ps(steps[i][2], _mm256_permutevar8x32_ps(a1, odd));
      _mm256_store_ps(steps[i][3], _mm256_permutevar8x32_ps(a1, even));
    }
  }
  for (int c = 0; c < 8; ++c) {
    if (prefetch) _mm_prefetch(reinterpret_cast<const char*>(prefetch + 16 * c), _MM_HINT_T0);
    const __m256i p0 = _mm256_permutevar8x32_epi32(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words + 16 * c)), dword_pairs);
    const __m256i p1 = _mm256_permutevar8x32_epi32(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words + 16 * c + 8)), dword_pairs);
    for (int t = 0; t < 2; ++t) {
      const __m256i u = t ? _mm256_unpackhi_epi64(p0, p1) : _mm256_unpacklo_epi64(p0, p1);
      for (int e1 = 0; e1 < 2; ++e1) {
        const __m256i idx =
            e1 ? _mm256_packus_epi16(_mm256_and_si256(_mm256_srli_epi16(u, 8), nib),
                                     _mm256_srli_epi16(u, 12))
               : _mm256_packus_epi16(_mm256_and_si256(u, nib),
                                     _mm256_and_si256(_mm256_srli_epi16(u, 4), nib));
        const int slot = lookup_slot(c, t, e1);
        const uint8_t* tb = tbl + 64 * slot;
        const __m256i lo = _mm256_shuffle_epi8(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tb)), idx);
        const __m256i hi = _mm256_shuffle_epi8(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tb + 32)), idx);
        const __m256i w_rows0 = _mm256_unpacklo_epi8(lo, hi);  // rows 0..7 of each lane
        const __m256i w_rows8 = _mm256_unpackhi_epi8(lo, hi);  // rows 8..15
        if (kFp16) {
          const __m256 w00 = _mm256_cvtph_ps(_mm256_castsi256_si128(w_rows0));
          const __m256 w08 = _mm256_cvtph_ps(_mm256_castsi256_si128(w_rows8));
          const __m256 w10 = _mm256_cvtph_ps(_mm256_extracti128_si256(w_rows0, 1));
          const __m256 w18 = _mm256_cvtph_ps(_mm256_extracti128_si256(w_rows8, 1));
#pragma GCC unroll 4
          for (int i = 0; i < MR; ++i) {
            const __m256 a0 = _mm256_loadu_ps(a + i * lda), a8 = _mm256_loadu_ps(a + i * lda + 8);
            float* l = lanes + i * kLane + 16 * slot;
            __m256 s0 = _mm256_loadu_ps(l), s1 = _mm256_loadu_ps(l + 8);
            s0 = _mm256_add_ps(_mm256_add_ps(s0, _mm256_mul_ps(a0, w00)), _mm256_mul_ps(a8, w08));
            s1 = _mm256_add_ps(_mm256_add_ps(s1, _mm256_mul_ps(a0, w10)), _mm256_mul_ps(a8, w18));
            _mm256_storeu_ps(l, s0);
            _mm256_storeu_ps(l + 8, s1);
          }
        } else {
          const __m256i high = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
          const __m256 w1 = _mm256_castsi256_ps(_mm256_and_si256(w_rows0, high));
          const __m256 w0 = _mm256_castsi256_ps(_mm256_slli_epi32(w_rows0, 16));
          const __m256 w9 = _mm256_castsi256_ps(_mm256_and_si256(w_rows8, high));
          const __m256 w8 = _mm256_castsi256_ps(_mm256_slli_epi32(w_rows8, 16));
#pragma GCC unroll 4
          for (int i = 0; i < MR; ++i) {
            float* l = lanes + i * kLane + 8 * slot;
            __m256 s = _mm256_loadu_ps(l);
            s = _mm256_add_ps(s, _mm256_mul_ps(_mm256_load_ps(steps[i][0]), w1));
            s = _mm256_add_ps(s, _mm256_mul_ps(_mm256_load_ps(steps[i][1]), w0));
            s = _mm256_add_ps(s, _mm256_mul_ps(_mm256_load_ps(steps[i][2]), w9));
            s = _mm256_add_ps(s, _mm256_mul_ps(_mm256_load_ps(steps[i][3]), w8));
            _mm256_storeu_ps(l, s);
          }
        }
      }
    }
  }
}

// The extremes of |v| over v[0 .. n) (n a multiple of 8: K and a group's 64 scales): the largest |v| bits (>= 0x7f800000: an inf or NaN among
// them) and the smallest nonzero |v| bits (0xffffffff: none nonzero), folded into r.
struct AbsRange {
  uint32_t max_bits = 0, min_nonzero_bits = 0xffffffffu;
};
W4K_W4A16_AVX2 inline void abs_range_avx2(const float* v, int64_t n, AbsRange& r) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff);
  __m256i hi = _mm256_setzero_si256(), lo = _mm256_set1_epi32(-1);
  for (int64_t i = 0; i < n; i += 8) {
    const __m256i b =
        _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(v + i)), abs_mask);
    hi = _mm256_max_epu32(hi, b);  // a zero becomes 0xffffffff, which no minimum keeps
    lo = _mm256_min_epu32(lo, _mm256_or_si256(b, _mm256_cmpeq_epi32(b, _mm256_setzero_si256())));
  }
  alignas(32) uint32_t h[8], l[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(h), hi);
  _mm256_store_si256(reinterpret_cast<__m256i*>(l), lo);
  for (int j = 0; j < 8; ++j) {
    r.max_bits = std::max(r.max_bits, h[j]);
    r.min_nonzero_bits = std::min(r.min_nonzero_bits, l[j]);
  }
}

// Whether every product a * w of activations with |a| in range `a` and weights
// w = T((q - z) * s) of scales with |s| in range `s` (one group; q, z in 0..15) is exact in fp32,
// so that an FMA gives the multiply-then-add bits. Inputs must be finite (then every NaN of the
// sums is x86's default NaN, and the two forms agree on it too). fp16: 11 x 11 significant bits,
// |a w| between 2^-48 and 2^32 or inf (a weight overflowed to inf in fp16 gives inf or the
// default NaN both ways): always exact. bf16: 8 x 8 bits, exact unless the product leaves the
// normal range: |w| <= 16 max|s| (|q - z| <= 15, rounded up at most to 16) and nonzero |w| >=
// min nonzero |s| (the rounding is monotonic and keeps the bf16 scale itself).
inline bool lookup_products_exact(bool fp16, const AbsRange& a, const AbsRange& s) {
  if (a.max_bits >= 0x7f800000u || s.max_bits >= 0x7f800000u) return false;
  if (fp16) return true;
  const auto value = [](uint32_t bits) {
    float f;
    std::memcpy(&f, &bits, 4);
    return static_cast<double>(f);
  };
  const double w_max = 16.0 * value(s.max_bits);
  if (w_max >= 0x1p127 || value(a.max_bits) * w_max >= 0x1p127) return false;
  if (a.min_nonzero_bits == 0xffffffffu || s.min_nonzero_bits == 0xffffffffu) return true;
  return value(a.min_nonzero_bits) * value(s.min_nonzero_bits) >= 0x1p-126;
}

// The decode path's sum of one column's lane sums (w4a16_gemm_kernel.h): bf16 (L0 + L1) +
// (L2 + L3); fp16 ((L0 + L1) + (L2 + L3)) + ((L4 + L5) + (L6 + L7)), lane 2t + r = (t, r).
inline float lookup_column_sum(const float* lanes, int x, bool fp16) {
  const int slot = lookup_slot_of(x), lane = lookup_lane_of(x);
  if (fp16) {
    const float* l = lanes + 16 * slot + 8 * lane;
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
  }
  const float* l = lanes + 8 * slot + 4 * lane;
  return (l[0] + l[1]) + (l[2] + l[3]);
}

}  // namespace w4k::cpu

#endif  // W4K_HAVE_AVX2_W4A16_PATH
