// CPU awq_gemm, the row path for a few bf16 rows: AutoAWQ's words read as stored (no
// transposition, no per-column tables), the weights decoded by arithmetic with the columns in
// the lanes, and each column summed in the tile path's order (awq_gemm_cpu.h), so its bits are
// the tile path's and the portable chunk_scalar's.
//
// Why: the lookup path (awq_gemm_cpu_lut.h) needs K in the lanes, so it transposes every
// 16 x 16 block of words and builds a 16-entry table per column and group on every call; on
// the Intel cores with AMX it reaches ~7 GB/s of weight per core with the weight in L2 and ~3
// streaming, its 128-row strips and tables needing the narrow items that the memory serves
// badly (below). Here a row pair of a 64-byte line
// (16 words of rows k and k + 1: 128 columns) becomes, per nibble j, one vector of 32 bf16 weights
// in vdpbf16ps's pair order with ~8 instructions:
//  * the two rows' words are interleaved by merge-masked loads (a row's words shifted one lane):
//    B = (row k word 2i, row k+1 word 2i) in dwords (2i, 2i + 1), A = the same of word 2i + 1;
//  * nibble j of a dword is moved to fp32 mantissa bits 19..22 by one shift, and one vpternlogd
//    ORs in the exponent of 1.0: f = 1 + q / 16 = (16 + q) / 16, exactly;
//  * fma(f, 16 s, -(16 + z) s) = (q - z) s exactly (every product has at most 13 significant
//    bits), the value the other paths get from fma(q, s, (-z) s); 16 s and -(16 + z) s are made
//    once per line and group, arranged like B and A (lanes 2i, 2i + 1: the column of word 2i of
//    B, resp. 2i + 1 of A);
//  * one vcvtne2ps2bf16 rounds B and A (the other paths' rounding) into 16 (w[k], w[k+1]) pairs:
//    dword i < 8 column 16 i + c(j), dword 8 + i column 16 i + 8 + c(j), c = {0,2,4,6,1,3,5,7};
//  * one vdpbf16ps per row of x with the x pair (x[k], x[k+1]) broadcast, or from 2 rows its fma
//    form (cpu/dot_form.h): the pairs split once into w[k+1] and w[k], two fp32 FMAs per row,
//    the odd one first: the tile path's chain exactly.
// A scale that is not finite or has |s| >= 2^122 ((16 + z) s could overflow where (-z) s does
// not) sends its line to chunk_scalar (the same bits; detected per line and group).
// Order of work: per group, the item's lines' constants; per 16-row strip, line after line (the
// strip's rows stay in the TLB while every line reads them; rows are N / 2 bytes apart), each
// line's accumulators (M x 8 vectors) loaded and stored once per strip, and the same line's rows
// of the next strip prefetched into L2 while its rows are summed; items of many lines
// (row_lines), so that each row is read in long runs. Used for bf16 at M <= row_path_rows() with
// an even group size (a pair never spans two groups).
// Measured on the AMX Xeon VM (2026-12-02; 2 threads, weights rotated past the L3, medians of 5
// rounds, bf16 group 128), x the lookup path (the default at M = 1 before): 1.50-1.65 on
// 4096 x 4096 / 11008 x 4096 / 4096 x 11008 (three rounds alternating in fresh processes), and
// 1.38-1.53 at M = 2. One thread with the weight in L2 (2048 x 1024, M = 1) it runs at 0.93x the
// lookup path's speed: the gain is the memory order (the lookup path given the same items gains
// 1.14x; its 128-row strips and per-column tables need their long strips).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "cpu/awq_gemm_cpu.h"
#include "cpu/isa.h"

namespace w4k {
namespace awq_cpu {

constexpr int64_t kRowLineWords = 16;  // one 64-byte line of a row: 128 columns
// Rows per strip. 2 threads, 11008 x 4096 M = 1, items of 43 lines, ms: 8 rows 2.63, 16 2.47,
// 32 2.58, 64 3.30, 128 3.53 (the rows a line's pass reads before the next line's).
constexpr int64_t kRowStrip = 16;
constexpr int kRowMaxRows = 3;  // 4 rows' 32 accumulators and x do not fit the registers
constexpr int64_t kRowParamFloats = 8 * 4 * 16;  // per line and group: [j][16 s B, nz B, 16 s A, nz A]
constexpr int kRowNibbleCol[8] = {0, 2, 4, 6, 1, 3, 5, 7};  // nibble j holds column 8w + c(j)

// Rows up to which the row path runs: on a CPU with AMX-BF16 (the Intel cores it was measured on)
// kRowRowsAmx, on an AMD CPU of family 1Ah (Zen 5) or later kRowRowsZen5, elsewhere none: on the
// Zen 4 VM (vpermw one fast instruction) it ran 0.76-0.82x the lookup path at M = 1 on the three
// shapes and 0.78x at M = 2 on 11008 x 4096 (2026-12-03; 2 threads, weights rotated, the two
// alternating in one process; 0.6-0.95x the day before in fresh processes); W4K_AWQ_ROW_ROWS
// overrides both (tests run the path on any AVX-512 BF16 CPU with it). On the AMX Xeon the tiles
// with the weights as A, given the same long row runs (awq_gemm_cpu_amx.h amx_t_item_lines), are
// level with it at M = 1 (0.98-1.05x) and ahead from 2 rows (2 threads, weights rotated, two
// rounds: M = 2 1.05-1.19x, M = 3 1.17-1.37x on the three shapes), so they take M >= 2 there.
// On the Zen 5 VM (AMD family 1Ah, 2026-12-06; 2 threads, weights rotated past the L3, the two
// alternating in one process, medians of 9 rounds) the row path ran 1.16 / 1.10 / 1.11 / 1.29 /
// 1.33x the lookup path at M = 1 on 4096 x 4096 / 11008 x 4096 / 4096 x 11008 / 14336 x 4096 /
// 4096 x 14336 (a second run: 1.36 and 1.04x on the first two), but with W4K_AWQ_ROW_ROWS=3
// 0.93-0.98x at M = 2 and 0.80-0.86x at M = 3: so on that family and later it takes M = 1 too.
// The rule looks at the CPU only, not at W4K_CPU_ISA, so that the AVX2 and portable paths sum in
// the same (tile) order on such a CPU whatever the cap.
constexpr int64_t kRowRowsAmx = 1, kRowRowsZen5 = 1;
inline int64_t row_path_rows(bool amx) {
  if (const char* env = std::getenv("W4K_AWQ_ROW_ROWS"))
    return std::min<int64_t>(std::atoll(env), kRowMaxRows);
  return amx ? kRowRowsAmx : amd_cpu_family() >= 0x1a ? kRowRowsZen5 : 0;
}
template <Dtype D>
inline bool row_path_applies(const Problem& pb, bool amx) {
  return D == Dtype::kBFloat16 && pb.size_m <= row_path_rows(amx) &&
         (pb.size_k / pb.groups) % 2 == 0;
}

// Lines per work item: one item per thread, at most 64 lines (8192 columns). Each row is then
// read in runs of 64 bytes x the item's lines per strip: the hardware's L2 streamer follows a
// row's page along such runs, and the software prefetches of the next strip alone cannot keep
// a core's line fill buffers busy (2026-12-02, 2 threads, 11008 x 4096 M = 1, 64-row strips:
// without them 0.67x, L1 hints 0.92x, non-temporal 0.44x). Measured the same day, ms, M = 1:
// 4 / 8 / 22 / 43 lines per item 5.12 / 3.75 / 2.57 / 2.47 (11008 x 4096); two items per thread
// 0.89-0.94x one on the three shapes; and with two busy processes on both cores (two runs,
// medians of 7) 11008 x 4096 took 5.0 / 5.2 ms at one item per thread, 5.6 / 6.6 at two, 7.2 /
// 10.5 on the lookup path. W4K_AWQ_LUT_LINES sets the width (as for the lookup path; the bits
// do not depend on it).
inline int64_t row_lines(int64_t size_n, int64_t threads) {
  if (const char* env = std::getenv("W4K_AWQ_LUT_LINES"))
    return std::clamp<int64_t>(std::atoll(env), 1, 64);
  return lines_per_thread(size_n, threads);
}

inline int64_t row_scratch_floats(int64_t size_m, int64_t lines) {
  return lines * kRowParamFloats + lines * size_m * 8 * 16 + 8 * 16;
}

// The constants of one line (words w0 .. w0 + nw - 1, nw <= 16) and group into p; false where a
// scale is not finite or |s| >= 2^122.
W4K_AWQ_AVX512 inline bool row_params(const Problem& pb, int64_t g, int64_t w0, int64_t nw,
                                      float* p) {
  const uint16_t* s = pb.scales + g * pb.size_n + 8 * w0;
  const int64_t ncols = 8 * nw;
  __m512 f[8];
  __mmask16 bad = 0;
  for (int i = 0; i < 8; ++i) {
    const int64_t left = ncols - 16 * i;
    const __mmask16 m = left >= 16 ? 0xFFFF : left <= 0 ? 0 : static_cast<__mmask16>((1u << left) - 1);
    f[i] = f16_to_f32(_mm256_maskz_loadu_epi16(m, s + 16 * i), Dtype::kBFloat16);
    bad |= _mm512_cmp_ps_mask(_mm512_abs_ps(f[i]), _mm512_set1_ps(0x1p122f), _CMP_NLT_UQ);
  }
  if (bad) return false;
  // s of column 16 i + c in lanes 2i and 2i + 1, for the 16 columns c of B (c(j)) and A
  // (8 + c(j)): per row pair (f[2a], f[2a + 1]) and four columns, one vpermt2ps puts column C
  // of the pair in a 128-bit block (F2a[C], F2a[C], F2a+1[C], F2a+1[C]); a 4 x 4 transpose of
  // blocks gathers the four pairs.
  static constexpr int kCols[4][4] = {{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}};
  __m512 sv[4][4];  // [q][b]: q 0, 1 -> B nibbles 4q + b; q 2, 3 -> A nibbles 4(q - 2) + b
  for (int q = 0; q < 4; ++q) {
    alignas(64) int32_t idx[16];
    for (int b = 0; b < 4; ++b) {
      const int c = kCols[q][b];
      idx[4 * b] = idx[4 * b + 1] = c;
      idx[4 * b + 2] = idx[4 * b + 3] = 16 + c;
    }
    const __m512i iv = _mm512_load_si512(idx);
    __m512 h[4];
    for (int a = 0; a < 4; ++a) h[a] = _mm512_permutex2var_ps(f[2 * a], iv, f[2 * a + 1]);
    const __m512 t0 = _mm512_shuffle_f32x4(h[0], h[1], 0x44), t1 = _mm512_shuffle_f32x4(h[0], h[1], 0xEE);
    const __m512 t2 = _mm512_shuffle_f32x4(h[2], h[3], 0x44), t3 = _mm512_shuffle_f32x4(h[2], h[3], 0xEE);
    sv[q][0] = _mm512_shuffle_f32x4(t0, t2, 0x88);
    sv[q][1] = _mm512_shuffle_f32x4(t0, t2, 0xDD);
    sv[q][2] = _mm512_shuffle_f32x4(t1, t3, 0x88);
    sv[q][3] = _mm512_shuffle_f32x4(t1, t3, 0xDD);
  }
  // Zero points: word 2i (B) or 2i + 1 (A) in lanes 2i and 2i + 1.
  const __m512i zw = _mm512_maskz_loadu_epi32(static_cast<__mmask16>((1u << nw) - 1),
                                              pb.qzeros + g * (pb.size_n / 8) + w0);
  const __m512i zb = _mm512_permutexvar_epi32(
      _mm512_setr_epi32(0, 0, 2, 2, 4, 4, 6, 6, 8, 8, 10, 10, 12, 12, 14, 14), zw);
  const __m512i za = _mm512_permutexvar_epi32(
      _mm512_setr_epi32(1, 1, 3, 3, 5, 5, 7, 7, 9, 9, 11, 11, 13, 13, 15, 15), zw);
  const __m512 sixteen = _mm512_set1_ps(16.0f), minus16 = _mm512_set1_ps(-16.0f);
  for (int j = 0; j < 8; ++j) {
    const __m512 s_b = sv[j / 4][j % 4], s_a = sv[2 + j / 4][j % 4];
    const __m512 z_b = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(zb, 4 * j), _mm512_set1_epi32(15)));
    const __m512 z_a = _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srli_epi32(za, 4 * j), _mm512_set1_epi32(15)));
    _mm512_store_ps(p + (4 * j + 0) * 16, _mm512_mul_ps(s_b, sixteen));
    _mm512_store_ps(p + (4 * j + 1) * 16, _mm512_mul_ps(_mm512_sub_ps(minus16, z_b), s_b));
    _mm512_store_ps(p + (4 * j + 2) * 16, _mm512_mul_ps(s_a, sixteen));
    _mm512_store_ps(p + (4 * j + 3) * 16, _mm512_mul_ps(_mm512_sub_ps(minus16, z_a), s_a));
  }
  return true;
}

// (16 + q) / 16 as fp32 for nibble j of every dword: the nibble moved to mantissa bits 19..22,
// the exponent of 1.0 ORed in.
template <int kJ>
W4K_AWQ_AVX512 inline __m512 row_code(__m512i w) {
  const __m512i moved = kJ <= 4 ? _mm512_slli_epi32(w, 19 - 4 * kJ) : _mm512_srli_epi32(w, 4 * kJ - 19);
  return _mm512_castsi512_ps(_mm512_ternarylogic_epi32(moved, _mm512_set1_epi32(0x00780000),
                                                       _mm512_set1_epi32(0x3F800000), 0xEA));
}

// The masks of a line of nw words: B takes word 2i of both rows, A word 2i + 1.
struct RowMasks {
  __mmask16 b_even, b_odd, a_even, a_odd;
  explicit RowMasks(int64_t nw) {
    b_even = b_odd = a_even = a_odd = 0;
    for (int i = 0; i < 8; ++i) {
      if (2 * i < nw) b_even |= 1u << (2 * i), b_odd |= 1u << (2 * i + 1);
      if (2 * i + 1 < nw) a_even |= 1u << (2 * i), a_odd |= 1u << (2 * i + 1);
    }
  }
};

// Nibble kJ of a row pair into a[m][kJ - kJ0] (row_pass).
template <int kM, int kJ, int kJ0, bool kFma>
W4K_AWQ_AVX512 inline void row_nibble(__m512i wb, __m512i wa, const float* p, const __m512* xo,
                                      const __m512* xe, const __m512i* xp, __m512 (*a)[8]) {
  const float* pj = p + 4 * kJ * 16;
  const __m512 vb = _mm512_fmadd_ps(row_code<kJ>(wb), _mm512_load_ps(pj), _mm512_load_ps(pj + 16));
  const __m512 va = _mm512_fmadd_ps(row_code<kJ>(wa), _mm512_load_ps(pj + 32), _mm512_load_ps(pj + 48));
  const __m512i w = (__m512i)_mm512_cvtne2ps_pbh(va, vb);
  constexpr int jj = kJ - kJ0;
  if constexpr (kFma) {
    const __m512 odd = _mm512_castsi512_ps(
        _mm512_and_si512(w, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
    const __m512 even = _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
    for (int m = 0; m < kM; ++m) {
      a[m][jj] = _mm512_fmadd_ps(xo[m], odd, a[m][jj]);
      a[m][jj] = _mm512_fmadd_ps(xe[m], even, a[m][jj]);
    }
  } else {
    for (int m = 0; m < kM; ++m) a[m][jj] = _mm512_dpbf16_ps(a[m][jj], (__m512bh)w, (__m512bh)xp[m]);
  }
}
template <int kM, int kJ0, bool kFma, int... J>
W4K_AWQ_AVX512 inline void row_nibbles(std::integer_sequence<int, J...>, __m512i wb, __m512i wa,
                                       const float* p, const __m512* xo, const __m512* xe,
                                       const __m512i* xp, __m512 (*a)[8]) {
  (row_nibble<kM, kJ0 + J, kJ0, kFma>(wb, wa, p, xo, xe, xp, a), ...);
}

// One strip of one line: `pairs` row pairs from q0 (row k0 of the line), nibbles kJ0 ..
// kJ0 + kJN - 1, acc [kM][8][16] in memory (lane order above). kFma: the fma form with fp32 x
// (xf, row stride ldxf), else vdpbf16ps with the bf16 x pairs (x, row stride ldx). Rows
// `ahead` further on are prefetched into L2.
template <int kM, int kJ0, int kJN, bool kFma>
W4K_AWQ_AVX512 inline void row_pass(const int32_t* q0, int64_t ldq, int64_t pairs, const float* p,
                                    const uint16_t* x, int64_t ldx, const float* xf,
                                    int64_t ldxf, const RowMasks& mk, int64_t ahead, float* acc) {
  __m512 a[kM][8];
  for (int m = 0; m < kM; ++m)
    for (int j = 0; j < kJN; ++j) a[m][j] = _mm512_load_ps(acc + (m * 8 + kJ0 + j) * 16);
  for (int64_t pr = 0; pr < pairs; ++pr) {
    const int32_t* r0 = q0 + 2 * pr * ldq;
    const int32_t* r1 = r0 + ldq;
    if (ahead) {
      _mm_prefetch(reinterpret_cast<const char*>(r0 + ahead * ldq), _MM_HINT_T1);
      _mm_prefetch(reinterpret_cast<const char*>(r1 + ahead * ldq), _MM_HINT_T1);
    }
    __m512i wb = _mm512_maskz_loadu_epi32(mk.b_even, r0);
    wb = _mm512_mask_loadu_epi32(wb, mk.b_odd, r1 - 1);
    __m512i wa = _mm512_maskz_loadu_epi32(mk.a_odd, r1);
    wa = _mm512_mask_loadu_epi32(wa, mk.a_even, r0 + 1);
    __m512 xo[kM], xe[kM];
    __m512i xp[kM];
    for (int m = 0; m < kM; ++m) {
      if constexpr (kFma) {
        xe[m] = _mm512_set1_ps(xf[m * ldxf + 2 * pr]);
        xo[m] = _mm512_set1_ps(xf[m * ldxf + 2 * pr + 1]);
      } else {
        int32_t d;
        std::memcpy(&d, x + m * ldx + 2 * pr, 4);
        xp[m] = _mm512_set1_epi32(d);
      }
    }
    row_nibbles<kM, kJ0, kFma>(std::make_integer_sequence<int, kJN>{}, wb, wa, p, xo, xe, xp, a);
  }
  for (int m = 0; m < kM; ++m)
    for (int j = 0; j < kJN; ++j) _mm512_store_ps(acc + (m * 8 + kJ0 + j) * 16, a[m][j]);
}

// Columns [n0, n1) (n0 a multiple of 128, n1 - n0 a multiple of 8) for every row; xf: x widened
// to fp32 ([M, K], contiguous).
template <int kM>
W4K_AWQ_AVX512 void chunk_rows(const Problem& pb, const float* xf, int64_t n0, int64_t n1,
                               bool fma, float* scratch) {
  const int64_t group_size = pb.size_k / pb.groups, ldq = pb.size_n / 8;
  const int64_t words_all = (n1 - n0) / 8;
  const int64_t lines = (words_all + kRowLineWords - 1) / kRowLineWords;
  float* params = scratch;                        // [line][kRowParamFloats]
  float* acc = params + lines * kRowParamFloats;  // [line][kM][8][16]
  uint16_t* staged = reinterpret_cast<uint16_t*>(acc + lines * kM * 8 * 16);  // [8][16]
  std::memset(acc, 0, sizeof(float) * lines * kM * 8 * 16);
  uint64_t scalar_lines = 0;  // lines with a scale the decode cannot take (at most 64 lines)
  for (int64_t g = 0; g < pb.groups; ++g) {
    for (int64_t l = 0; l < lines; ++l)
      if (!(scalar_lines >> l & 1) &&
          !row_params(pb, g, n0 / 8 + 16 * l, std::min(kRowLineWords, words_all - 16 * l),
                      params + l * kRowParamFloats))
        scalar_lines |= uint64_t{1} << l;
    for (int64_t k0 = g * group_size; k0 < (g + 1) * group_size; k0 += kRowStrip) {
      const int64_t pairs = std::min(kRowStrip, (g + 1) * group_size - k0) / 2;
      for (int64_t l = 0; l < lines; ++l) {
        if (scalar_lines >> l & 1) continue;
        const RowMasks mk(std::min(kRowLineWords, words_all - 16 * l));
        const int32_t* q0 = pb.qweight + k0 * ldq + n0 / 8 + 16 * l;
        const float* p = params + l * kRowParamFloats;
        float* a = acc + l * kM * 8 * 16;
        const uint16_t* x = pb.x + k0;
        const float* xr = xf + k0;
        if (kM <= 2) {
          if (fma)
            row_pass<kM, 0, 8, true>(q0, ldq, pairs, p, x, pb.ldx, xr, pb.size_k, mk, kRowStrip, a);
          else
            row_pass<kM, 0, 8, false>(q0, ldq, pairs, p, x, pb.ldx, xr, pb.size_k, mk, kRowStrip, a);
        } else {  // 3 rows: 4 x 3 accumulators per pass, the strip's rows read twice (from L1)
          row_pass<kM, 0, 4, true>(q0, ldq, pairs, p, x, pb.ldx, xr, pb.size_k, mk, kRowStrip, a);
          row_pass<kM, 4, 4, true>(q0, ldq, pairs, p, x, pb.ldx, xr, pb.size_k, mk, 0, a);
        }
      }
    }
  }
  for (int64_t l = 0; l < lines; ++l) {
    const int64_t c0 = n0 + 128 * l, nw = std::min(kRowLineWords, words_all - 16 * l);
    if (scalar_lines >> l & 1) {
      chunk_scalar<Dtype::kBFloat16>(pb, c0, c0 + 8 * nw);
      continue;
    }
    for (int m = 0; m < kM; ++m) {
      const float* a = acc + (l * kM + m) * 8 * 16;
      for (int j = 0; j < 8; j += 2)
        _mm512_store_si512(staged + 16 * j,
                           (__m512i)_mm512_cvtne2ps_pbh(_mm512_load_ps(a + 16 * (j + 1)),
                                                        _mm512_load_ps(a + 16 * j)));
      uint16_t* out = pb.out + m * pb.size_n + c0;
      for (int j = 0; j < 8; ++j)
        for (int i = 0; i < 16; ++i) {
          const int64_t col = 16 * (i % 8) + 8 * (i / 8) + kRowNibbleCol[j];
          if (col < 8 * nw) out[col] = staged[16 * j + i];
        }
    }
  }
}

}  // namespace awq_cpu
}  // namespace w4k
