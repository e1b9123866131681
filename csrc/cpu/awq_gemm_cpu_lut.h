// CPU awq_gemm, the lookup (decode) path for small M: K in lanes, weights looked up in
// per-group tables. Shares the helpers, Problem and the numerics of awq_gemm_cpu.h.
//
#pragma once

#include "cpu/awq_gemm_cpu.h"
#include "cpu/awq_gemm_cpu_rows.h"
#include "cpu/dot_form.h"

namespace w4k {
namespace awq_cpu {

// For M <= kLutMaxMBf16 / kLutMaxMFp16 rows the tile path's per-element work (convert, fma,
// round, pair) costs more than streaming the weight. This path instead:
//  * reads a strip of rows of one 64-byte line (16 words = 128 columns) and transposes each
//    16-row tile so that register T_w holds word w of rows 0..15 (one dword per row);
//  * bf16: pairs the rows of T_w within each 16-bit unit with one vpshufb (dword 4a + d: unit
//    d % 2 of rows 2p, 2p + 1, p = 2a + d / 2; unit 0 holds columns 8w + 2e at nibble e, unit 1
//    columns 8w + 2e + 1), then per nibble e one 16-bit shift and one vpternlogd build the 32
//    indices (code, + 16 in the odd dwords), one vpermw looks the weights up in the group's
//    table of columns (2e, 2e + 1): entries 0..15 = T(fma(v, s, (-z) s)) for v = 0..15 of the
//    even column, 16..31 of the odd one, and one vdpbf16ps multiplies them with the x pairs of
//    rows (2p, 2p + 1) (lut_rows; or its fma form, lut_fma_min_rows);
//  * fp16: the tables hold fp16 values, widened once per pass to fp32 tables of 16 entries per
//    column that vpermps indexes with the shifted transposed word itself, then fp32 FMAs with
//    fp32 x (lut_rows_fp16).
// Summation order (the portable path mirrors it): bf16: column n has 8 fp32 lane sums; lane j
// takes rows 16t + 2j + 1 then 16t + 2j, t = 0, 1, ..., K/16 - 1, by fma; fp16: 16 lane sums,
// lane j takes row 16t + j; then out = ((a0 + a1) + a2) + ... in lane order. Used when M <= 8
// (bf16) or 7 (fp16) and group_size and K are multiples of 16 (tiles never straddle a group).
constexpr int64_t kLutLineWords = 16;  // one 64-byte line of a row: 128 columns
constexpr int64_t kLutStrip = 128;     // rows per strip (a multiple of 16; cut at groups)
constexpr int64_t kLutMBlock = 48;     // rows of x per work item (lane sums stay in L2)
// Lines per work item at M <= 4, where the weight stream is the cost and longer runs of each
// row help: the most of 16 / 8 / 4 (2048 / 1024 / 512 columns, runs of 1 KiB / 512 / 256 bytes
// per row of the weight) that still leaves four items per thread, so that a thread the OS
// preempts mid-item holds back at most a small part of the call (the caller cannot take an item
// another thread claimed: cpu/w4a16_gemm_work_queue.h); 1 above, where the lane sums of 48 rows
// need the room. The columns of an item do not change any column's sums. Measured on the Zen 5
// machine (2026-12-01; 2 threads, weights rotated, medians of 3-4 rounds alternating in fresh
// processes): two items per thread (16 lines, 8 on 4096 x 4096) ran bf16 M = 1 1.01-1.21x, M = 2
// 1.04-1.16x, fp16 0.94-1.31x the old 4 lines on the quiet machine, but with two busy processes
// on the cores (`bench_cpu_gemm.py --background-load 2`, three runs) 11008 x 4096 at M = 1 took
// 1.9-2.5 ms against 1.3-2.6 (medians 2.3 / 1.4); at four items per thread (4096 x 4096 keeps 4
// lines, 11008 x 4096 and 14336 x 4096 take 8) the quiet gain is 0.98-1.08x. W4K_AWQ_LUT_LINES
// sets the width at every M (tests: the bits do not depend on it).
inline int64_t lut_lines(int64_t size_m, int64_t size_n, int64_t threads) {
  if (const char* env = std::getenv("W4K_AWQ_LUT_LINES"))
    return std::clamp<int64_t>(std::atoll(env), 1, 64);
  if (size_m > 4) return 1;
  const int64_t all = (size_n + kLutLineWords * 8 - 1) / (kLutLineWords * 8);
  for (int64_t lines : {16, 8})
    if (all / lines >= 4 * threads) return lines;
  return 4;
}

// Rows up to which the lookup path runs. Measured (one thread, CPU time, weights rotated, the
// old limit 4 against the new one alternating; 4096x4096 unless stated): bf16 at M = 5 / 6 / 8
// 1.37-1.39 / 1.19-1.27 / 1.14-1.22x faster than the tile path (11008x4096 M = 8: 1.07-1.17x;
// 4096x11008 M = 6: 1.19-1.22x), the AVX2 lookups 1.14-1.22x at M = 5-8; at M = 10 0.88-0.94x,
// M = 16 0.86x. fp16 up to 7 (2026-11-25, the AVX2 lookups' fp16 rows in passes of 3 instead of
// 2): AVX-512 1.20-1.25 / 1.10-1.14 / 1.05-1.09x at M = 5 / 6 / 7 (4096x11008: 1.20 / 1.09x at
// 5 / 7), level at 8; AVX2 1.02-1.07 / 0.99-1.05 / 1.03-1.05x at 5 / 6 / 7 (three shapes), but
// 0.93-1.00x at 8 (3 + 3 + 2 rows). The order must be the same on every ISA (the bits), so the
// limit is one for all. Before 2026-11-25 (the lookup path's prefetching and strips) the tile
// path was faster from M = 5.
constexpr int64_t kLutMaxMBf16 = 8;
constexpr int64_t kLutMaxMFp16 = 7;
// With AMX tiles (bf16 on the AVX-512 path; cpu/amx_bf16.h) the tile path takes over from
// kLutMaxMBf16Amx + 1 rows (measured in awq.cpp, awq_gemm_run), and from kLutMaxMBf16AmxT + 1
// where the tiles take the weights as their A operand (amx_t_applies, awq_gemm_cpu_amx.h).
// Measured 2026-11-28 (one thread, CPU time, medians of 7 calls alternating, weights rotated),
// that path over this one: M = 2 0.89x on 4096 x 4096; M = 3 1.05 / 1.10 / 1.13x and M = 4
// 1.27 / 1.27 / 1.31x on 4096 x 4096 / 11008 x 4096 / 4096 x 11008. W4K_AWQ_LUT_ROWS overrides
// the limit of every path (tests and benchmarks compare the paths with it).
// Since 2026-12-02 the row path (awq_gemm_cpu_rows.h) takes bf16 at M = 1 on such a CPU first.
constexpr int64_t kLutMaxMBf16Amx = 4, kLutMaxMBf16AmxT = 1;
// fp16 on such a CPU: the weights-as-A tiles from 2 rows where they apply (awq_gemm_cpu.h
// kAmxTFp16MinRows), the lookups at 1.
constexpr int64_t kLutMaxMFp16AmxT = 1;
template <Dtype D>
inline bool lut_path_applies(const Problem& pb, bool amx = false) {
  if (row_path_applies<D>(pb, amx)) return false;  // its order is the tile path's
  const char* env = std::getenv("W4K_AWQ_LUT_ROWS");
  const int64_t max_m = env ? std::atoll(env)
                        : D == Dtype::kBFloat16
                            ? (!amx ? kLutMaxMBf16
                                    : amx_t_applies(pb) ? kLutMaxMBf16AmxT : kLutMaxMBf16Amx)
                        : amx && amx_t_applies(pb) ? kLutMaxMFp16AmxT
                                                   : kLutMaxMFp16;
  return pb.size_m <= max_m && pb.size_k % 16 == 0 && (pb.size_k / pb.groups) % 16 == 0;
}

// Scratch floats of the LUT path per thread.
inline int64_t lut_scratch_floats(int64_t size_m, int64_t lines) {
  const int64_t rows = std::min(size_m, kLutMBlock);
  return lines * 64 * 32 * rows         // lane sums: [line][m][pair][16 (bf16) or 32 (fp16)]
         + lines * 64 * 16              // tables of one group: [line][pair][32 bf16]
         + (kLutStrip / 16) * 16 * 16   // transposed strip: [tile][word][16 rows]
         + (kLutStrip / 16) * rows * 32;  // bf16 x pairs of the strip: [tile][m][16 dwords],
                                          // fma form: their odd and even halves, [tile][m][32]
}

// bf16 rows from which the AVX-512 lookups sum by the fma form of vdpbf16ps (the odd then the
// even product of a pair by fp32 fmas, the x pairs split once per strip; exactly the portable
// mirror's chain, subnormal products included): 2 where two FMAs cost at most 0.8x a
// vdpbf16ps (cpu/dot_form.h), else never. W4K_AWQ_FMA_ROWS overrides it.
inline int64_t lut_fma_min_rows() {
  const char* env = std::getenv("W4K_AWQ_FMA_ROWS");
  if (env) return std::atoll(env);
  return cpu::fma_form_faster() ? 2 : std::numeric_limits<int64_t>::max();
}

// Portable mirror of the LUT path for columns [n_begin, n_end).
template <Dtype D>
void chunk_lut_scalar(const Problem& pb, int64_t n_begin, int64_t n_end, int64_t m_begin,
                      int64_t m_end) {
  constexpr int kLanes = D == Dtype::kBFloat16 ? 8 : 16;
  const int64_t group_size = pb.size_k / pb.groups, words = pb.size_n / 8;
  for (int64_t n = n_begin; n < n_end; ++n) {
    const int shift = 4 * kAwqNibble[n % 8];
    for (int64_t m = m_begin; m < m_end; ++m) {
      const uint16_t* xr = pb.x + m * pb.ldx;
      float lane[16] = {};
      for (int64_t k0 = 0; k0 < pb.size_k; k0 += 16) {
        const int64_t g = k0 / group_size;
        const float s = to_float<D>(pb.scales[g * pb.size_n + n]);
        const float z = static_cast<float>((static_cast<uint32_t>(pb.qzeros[g * words + n / 8]) >> shift) & 15);
        auto weight = [&](int64_t k) {
          const float q = static_cast<float>((static_cast<uint32_t>(pb.qweight[k * words + n / 8]) >> shift) & 15);
          return to_float<D>(round_to<D>(std::fma(q, s, (-z) * s)));
        };
        for (int j = 0; j < kLanes; ++j) {
          if (D == Dtype::kBFloat16) {
            for (int64_t k : {k0 + 2 * j + 1, k0 + 2 * j})
              lane[j] = std::fma(to_float<D>(xr[k]), weight(k), lane[j]);
          } else {
            lane[j] = std::fma(to_float<D>(xr[k0 + j]), weight(k0 + j), lane[j]);
          }
        }
      }
      float acc = lane[0];
      for (int j = 1; j < kLanes; ++j) acc += lane[j];
      pb.out[m * pb.size_n + n] = round_to<D>(acc);
    }
  }
}

// 16 x 16 transpose of dwords: r[i] holds row i on entry and column i on exit.
// kPairUnits (bf16's lookup): the first stage interleaves 16-bit units instead of dwords, so
// that on exit dword 2p + u of r[i] holds unit u of column i of rows 2p (low half) and 2p + 1
// (high half): the later stages move dwords only, and a dword of rows (2p, 2p + 1) of unit u
// takes the place the plain transpose gives row 2p + u.
template <bool kPairUnits = false>
W4K_AWQ_AVX512 inline void transpose16(__m512i r[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = kPairUnits ? _mm512_unpacklo_epi16(r[i], r[i + 1])
                      : _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = kPairUnits ? _mm512_unpackhi_epi16(r[i], r[i + 1])
                          : _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  // Now lane L of r[4a + c] holds rows 4a..4a+3 of column 4L + c; gather the four a's.
  for (int c = 0; c < 4; ++c) {
    t[c] = _mm512_shuffle_i32x4(r[c], r[4 + c], 0x88);       // lanes 0,2 of each
    t[4 + c] = _mm512_shuffle_i32x4(r[c], r[4 + c], 0xDD);   // lanes 1,3 of each
    t[8 + c] = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0x88);
    t[12 + c] = _mm512_shuffle_i32x4(r[8 + c], r[12 + c], 0xDD);
  }
  for (int c = 0; c < 4; ++c) {
    r[c] = _mm512_shuffle_i32x4(t[c], t[8 + c], 0x88);
    r[8 + c] = _mm512_shuffle_i32x4(t[c], t[8 + c], 0xDD);
    r[4 + c] = _mm512_shuffle_i32x4(t[4 + c], t[12 + c], 0x88);
    r[12 + c] = _mm512_shuffle_i32x4(t[4 + c], t[12 + c], 0xDD);
  }
}

// Byte b and half h (0: low nibble) of the AutoAWQ word holding column j: kLaneCol[h][b] == j.
constexpr int kColHalf[8] = {0, 0, 1, 1, 0, 0, 1, 1};
constexpr int kColByte[8] = {0, 2, 0, 2, 1, 3, 1, 3};

// Tables of group g for the line's pairs: tab[(4w + b) * 16 ...] = 32 values (0..15, 16..31) of
// two columns of word w: fp16 the low and high nibble of byte b (kLaneCol[0][b], kLaneCol[1][b]);
// bf16 columns 2b and 2b + 1 (nibble b of the word's low and high 16-bit unit: lut_rows).
// Scales and (-z) * s come from load_params (lane order: word w, byte b, half h of a 64-column
// block is lane 16 (2 (w / 4) + h) + 4 (w % 4) + b), so the values are those of the other paths.
template <Dtype D>
W4K_AWQ_AVX512 void lut_tables(const Problem& pb, int64_t g, int64_t n0, int64_t words, float* tab) {
  const __m512 v = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  for (int64_t half = 0; half < 2; ++half) {
    const int64_t bw = std::min<int64_t>(8, words - 8 * half);
    if (bw <= 0) {
      std::memset(tab + half * 32 * 16, 0, sizeof(float) * 32 * 16);
      continue;
    }
    BlockParams p;
    load_params<D>(pb, g, n0 + 64 * half, bw, p);
    for (int w = 0; w < 8; ++w)
      for (int b = 0; b < 4; ++b) {
        __m512 e[2];
        for (int h = 0; h < 2; ++h) {
          // fp16: the byte's low / high nibble, columns kLaneCol[h][b]; bf16: column 2b + h
          const int col = D == Dtype::kBFloat16 ? 2 * b + h : kLaneCol[h][b];
          const int lane = 16 * (2 * (w / 4) + kColHalf[col]) + 4 * (w % 4) + kColByte[col];
          e[h] = _mm512_fmadd_ps(v, _mm512_set1_ps(p.s[lane]), _mm512_set1_ps(p.zs[lane]));
        }
        __m512i t;
        if constexpr (D == Dtype::kBFloat16) {
          t = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(e[1], e[0]));
        } else {
          constexpr int kRne = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
          t = _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtps_ph(e[0], kRne)),
                                 _mm512_cvtps_ph(e[1], kRne), 1);
        }
        _mm512_store_si512(tab + (4 * (8 * half + w) + b) * 16, t);
      }
  }
}

// fp16 (D == kHalf) variant of lut_rows (same arguments): the pair's fp16 table is widened
// once per pass into two 16-entry fp32 tables (lo, hi column; exact), and each nibble position
// of the transposed word indexes one of them directly with vpermps, which reads only bits 0..3
// of each dword: nibble 2b of row i is (tw >> 8b) in lane i, nibble 2b + 1 is
// (tw >> (8b + 4)). Per 16 weights a shift (none for nibble 0) and a vpermps, where the 16-bit
// lookup took a vpermt2b, a vpternlogd, a vpermw and two vcvtph2ps per 32. Same products and the
// same fma chain per lane (lane j of a column takes row 16t + j) as before, so the bits do not
// change.
template <int MR>
W4K_AWQ_AVX512 void lut_rows_fp16(const Problem& pb, const float* xf, int64_t m0, int64_t m_rel,
                                  int64_t w, int64_t k0, int64_t tiles, const float* tab,
                                  const float* tbuf, float* lane) {
  // Pairs per pass: 8 accumulators + 8 tables at MR <= 2, 4 pairs' worth of registers above.
  constexpr int kPairs = MR <= 2 ? 4 : (MR <= 4 ? 2 : 1);
  for (int b0 = 0; b0 < 4; b0 += kPairs) {
    __m512 c[MR][2 * kPairs];  // [m][2 (pair - b0) + half]
    auto at = [&](int m, int j) {
      return lane + ((m_rel + m) * 64 + 4 * w + b0 + j / 2) * 32 + 16 * (j % 2);
    };
    for (int m = 0; m < MR; ++m)
      for (int j = 0; j < 2 * kPairs; ++j) c[m][j] = _mm512_load_ps(at(m, j));
    __m512 tf[2 * kPairs];
    for (int j = 0; j < kPairs; ++j) {
      const __m512i t16 = _mm512_load_si512(tab + (4 * w + b0 + j) * 16);
      tf[2 * j] = _mm512_cvtph_ps(_mm512_castsi512_si256(t16));
      tf[2 * j + 1] = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(t16, 1));
    }
    for (int64_t t = 0; t < tiles; ++t) {
      const __m512i tw = _mm512_load_si512(tbuf + (t * 16 + w) * 16);
      __m512 xv[MR];
      for (int m = 0; m < MR; ++m) xv[m] = _mm512_loadu_ps(xf + (m0 + m) * pb.size_k + k0 + 16 * t);
      for (int j = 0; j < 2 * kPairs; ++j) {
        const int nibble = 2 * b0 + j;  // pair b0 + j / 2, half j % 2
        const __m512i idx = nibble == 0 ? tw : _mm512_srli_epi32(tw, 4 * nibble);
        const __m512 wv = _mm512_permutexvar_ps(idx, tf[j]);
        for (int m = 0; m < MR; ++m) c[m][j] = _mm512_fmadd_ps(xv[m], wv, c[m][j]);
      }
    }
    for (int m = 0; m < MR; ++m)
      for (int j = 0; j < 2 * kPairs; ++j) _mm512_store_ps(at(m, j), c[m][j]);
  }
}

// Rows [m0, m0 + MR) x word w of one line, over the strip's tiles: lane sums in `lane`
// ([m - m_begin][pair][kLaneFloats]) are loaded, advanced and stored back.
// bf16: one vpshufb per transposed word pairs rows (2p, 2p + 1) within each 16-bit unit of the
// word: dword 4a + d of v holds unit d % 2 (columns 2e + d % 2 at nibble e, e = 0..3) of rows
// 2p and 2p + 1, p = 2a + d / 2. Per nibble e (pair e: columns 2e, 2e + 1): a 16-bit shift (none
// for e = 0) and one vpternlogd make the indices (code | 16 for the odd column), one vpermw
// looks up the bf16 weights, one vdpbf16ps per row of x (x pairs permuted to match, once per
// tile: xpairs, built once per strip by chunk_lut). Lane 4a + d of pair e's accumulator thus
// holds the chain of column 2e + d % 2 over row pairs p = 2a + d / 2 of every tile: the same 8
// chains per column as before (chunk_lut adds them in p order). fp16: lut_rows_fp16.
// xpairs[(t * rows + m_rel + m) * 16]: the x pairs of tile t and row m (bf16 only).
template <Dtype D, int MR, bool kFma = false>
W4K_AWQ_AVX512 void lut_rows(const Problem& pb, const float* xf, const float* xpairs,
                             int64_t rows, int64_t m0, int64_t m_rel, int64_t w, int64_t k0,
                             int64_t tiles, const float* tab, const float* tbuf, float* lane) {
  if constexpr (D == Dtype::kHalf) {
    (void)xpairs;
    (void)rows;
    lut_rows_fp16<MR>(pb, xf, m0, m_rel, w, k0, tiles, tab, tbuf, lane);
  } else {
    (void)xf;
    (void)m0;
    (void)k0;
    // Pairs per pass: as many as keep 16 accumulators (one per pair).
    constexpr int kPairs = MR <= 4 ? 4 : 2;
    const __m512i low4 = _mm512_set1_epi16(15);
    // odd dwords (unit 1: the pair's second column) index entries 16..31
    const __m512i unit_bit = _mm512_setr_epi32(0, 0x100010, 0, 0x100010, 0, 0x100010, 0,
                                               0x100010, 0, 0x100010, 0, 0x100010, 0, 0x100010,
                                               0, 0x100010);
    for (int b0 = 0; b0 < 4; b0 += kPairs) {
      __m512 c[MR][kPairs];  // [m][pair b0 + j]
      auto at = [&](int m, int j) { return lane + ((m_rel + m) * 64 + 4 * w + b0 + j) * 16; };
      for (int m = 0; m < MR; ++m)
        for (int j = 0; j < kPairs; ++j) c[m][j] = _mm512_load_ps(at(m, j));
      __m512i tb[kPairs];
      for (int j = 0; j < kPairs; ++j) tb[j] = _mm512_load_si512(tab + (4 * w + b0 + j) * 16);
      for (int64_t t = 0; t < tiles; ++t) {
        const __m512i v = _mm512_load_si512(tbuf + (t * 16 + w) * 16);
        __m512bh xv[MR];
        __m512 x_odd[MR], x_even[MR];  // kFma: the pairs' halves (rows 2p + 1, 2p)
        for (int m = 0; m < MR; ++m) {
          if constexpr (kFma) {
            x_odd[m] = _mm512_load_ps(xpairs + (t * rows + m_rel + m) * 32);
            x_even[m] = _mm512_load_ps(xpairs + (t * rows + m_rel + m) * 32 + 16);
          } else {
            xv[m] = reinterpret_cast<__m512bh>(
                _mm512_load_si512(xpairs + (t * rows + m_rel + m) * 16));
          }
        }
        for (int j = 0; j < kPairs; ++j) {
          const int e = b0 + j;
          const __m512i sh = e == 0 ? v : _mm512_srli_epi16(v, 4 * e);
          // (sh & low4) | unit_bit: imm 0xea = (A & B) | C
          const __m512i idx = _mm512_ternarylogic_epi32(sh, low4, unit_bit, 0xEA);
          const __m512i wv = _mm512_permutexvar_epi16(idx, tb[j]);
          if constexpr (kFma) {
            const __m512 w_odd = _mm512_castsi512_ps(
                _mm512_and_si512(wv, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
            const __m512 w_even = _mm512_castsi512_ps(_mm512_slli_epi32(wv, 16));
            for (int m = 0; m < MR; ++m)
              c[m][j] = _mm512_fmadd_ps(x_even[m], w_even,
                                        _mm512_fmadd_ps(x_odd[m], w_odd, c[m][j]));
          } else {
            for (int m = 0; m < MR; ++m)
              c[m][j] = _mm512_dpbf16_ps(c[m][j], xv[m], reinterpret_cast<__m512bh>(wv));
          }
        }
      }
      for (int m = 0; m < MR; ++m)
        for (int j = 0; j < kPairs; ++j) _mm512_store_ps(at(m, j), c[m][j]);
    }
  }
}

// Columns [n0, n1) (at most lut_lines(...) lines) x rows [m_begin, m_end) (at most kLutMBlock).
template <Dtype D>
W4K_AWQ_AVX512 void chunk_lut(const Problem& pb, const float* xf, int64_t n0, int64_t n1,
                              int64_t m_begin, int64_t m_end, float* scratch) {
  constexpr int64_t kLaneFloats = D == Dtype::kBFloat16 ? 16 : 32;  // per pair
  const int64_t group_size = pb.size_k / pb.groups, ldq = pb.size_n / 8;
  const int64_t words_all = (n1 - n0) / 8, rows = m_end - m_begin;
  const int64_t lines = (words_all + kLutLineWords - 1) / kLutLineWords;
  float* lanes = scratch;                                 // [line][m][64 pairs][lanes]
  float* tabs = lanes + lines * 64 * kLaneFloats * rows;  // [line][64 pairs][16 dwords]
  float* tbuf = tabs + lines * 64 * 16;                   // [tile][16 words][16 rows]
  float* xpairs = tbuf + (kLutStrip / 16) * 16 * 16;      // [tile][m][16 or 32] (bf16)
  const bool fma = D == Dtype::kBFloat16 && rows >= lut_fma_min_rows();
  // dword 4a + d of a tile's x pairs: (x[2p], x[2p + 1]), p = 2a + d / 2 (see lut_rows)
  const __m512i x_idx = _mm512_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7);
  std::memset(lanes, 0, sizeof(float) * lines * 64 * kLaneFloats * rows);
  for (int64_t g = 0; g < pb.groups; ++g) {
    for (int64_t l = 0; l < lines; ++l)
      lut_tables<D>(pb, g, n0 + 128 * l, std::min(kLutLineWords, words_all - 16 * l),
                    tabs + l * 64 * 16);
    // Strips outer, lines inner: the strip's rows (up to 128, one 4 KiB page each when
    // N >= 8192) stay in the TLB while all lines of the work item are read, so a page costs
    // one TLB miss per work item, not one per line. The next strip is prefetched into L2 while
    // the words of a line are looked up (into L1 it would evict the strip in use). 128-row
    // strips rather than 64: a word's lane sums and tables are loaded and stored once per 8
    // tiles, not 4 (one thread, 4096x4096: fp16 M = 1 and 4 10-12 % faster, bf16 2-4 %).
    for (int64_t k0 = g * group_size; k0 < (g + 1) * group_size; k0 += kLutStrip) {
      const int64_t kb = std::min(kLutStrip, (g + 1) * group_size - k0), tiles = kb / 16;
      if constexpr (D == Dtype::kBFloat16) {
        for (int64_t t = 0; t < tiles; ++t)
          for (int64_t m = 0; m < rows; ++m) {
            const __m512i xp = _mm512_permutexvar_epi32(
                x_idx, _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(
                           pb.x + (m_begin + m) * pb.ldx + k0 + 16 * t))));
            if (fma) {  // odd halves (rows 2p + 1) then even ones, as fp32
              _mm512_store_si512(
                  xpairs + (t * rows + m) * 32,
                  _mm512_and_si512(xp, _mm512_set1_epi32(static_cast<int>(0xffff0000u))));
              _mm512_store_si512(xpairs + (t * rows + m) * 32 + 16, _mm512_slli_epi32(xp, 16));
            } else {
              _mm512_store_si512(xpairs + (t * rows + m) * 16, xp);
            }
          }
      }
      for (int64_t l = 0; l < lines; ++l) {
        const int64_t words = std::min(kLutLineWords, words_all - 16 * l);
        const __mmask16 wmask = static_cast<__mmask16>((1u << words) - 1);
        // One pointer stepped by a row (16 row addresses held at once made GCC spill them).
        const int32_t* row = pb.qweight + n0 / 8 + 16 * l + k0 * ldq;
        for (int64_t t = 0; t < tiles; ++t) {
          __m512i r[16];
          for (int i = 0; i < 16; ++i, row += ldq) {
            r[i] = _mm512_maskz_loadu_epi32(wmask, row);
          }
          transpose16<D == Dtype::kBFloat16>(r);
          for (int w = 0; w < 16; ++w) _mm512_store_si512(tbuf + (t * 16 + w) * 16, r[w]);
        }
        const float* tab = tabs + l * 64 * 16;
        float* lane = lanes + l * 64 * kLaneFloats * rows;
        // This line of the next strip's rows (row: now at k0 + kb), into L2, a few rows per word
        // (issued in one burst with the loads above they stalled on the miss queue: 1.15-1.35x
        // slower, one thread).
        const int64_t pf_rows = std::min(kLutStrip, pb.size_k - (k0 + kb));
        const int64_t pf_per_word = (pf_rows + words - 1) / words;
        for (int64_t w = 0; w < words; ++w) {
          for (int64_t i = w * pf_per_word; i < std::min(pf_rows, (w + 1) * pf_per_word); ++i)
            _mm_prefetch(reinterpret_cast<const char*>(row + i * ldq), _MM_HINT_T1);
          // MR rows from m in the chosen form (the fma form for bf16 only)
          auto rows_mr = [&](auto mr, int64_t m) {
            constexpr int kMr = decltype(mr)::value;
            if (fma)  // bf16 only
              lut_rows<D, kMr, D == Dtype::kBFloat16>(pb, xf, xpairs, rows, m, m - m_begin, w,
                                                     k0, tiles, tab, tbuf, lane);
            else
              lut_rows<D, kMr>(pb, xf, xpairs, rows, m, m - m_begin, w, k0, tiles, tab, tbuf,
                               lane);
          };
          using std::integral_constant;
          int64_t m = m_begin;
          for (; m + 8 <= m_end; m += 8) rows_mr(integral_constant<int, 8>{}, m);
          switch (m_end - m) {
            case 7: rows_mr(integral_constant<int, 7>{}, m); break;
            case 6: rows_mr(integral_constant<int, 6>{}, m); break;
            case 5: rows_mr(integral_constant<int, 5>{}, m); break;
            case 4: rows_mr(integral_constant<int, 4>{}, m); break;
            case 3: rows_mr(integral_constant<int, 3>{}, m); break;
            case 2: rows_mr(integral_constant<int, 2>{}, m); break;
            case 1: rows_mr(integral_constant<int, 1>{}, m); break;
            default: break;
          }
        }
      }
    }
  }
  constexpr int kLanes = kLaneFloats / 2;
  for (int64_t l = 0; l < lines; ++l) {
    const int64_t words = std::min(kLutLineWords, words_all - 16 * l);
    for (int64_t m = 0; m < rows; ++m)
      for (int64_t w = 0; w < words; ++w)
        for (int b = 0; b < 4; ++b)
          for (int h = 0; h < 2; ++h) {
            const float* a = lanes + ((l * rows + m) * 64 + 4 * w + b) * kLaneFloats;
            float acc;
            int col;
            if constexpr (D == Dtype::kBFloat16) {
              // chain p of column 2b + h sits in lane 4 (p / 2) + 2 (p % 2) + h
              acc = a[h];
              for (int p = 1; p < kLanes; ++p) acc += a[4 * (p / 2) + 2 * (p % 2) + h];
              col = 2 * b + h;
            } else {
              a += kLanes * h;
              acc = a[0];
              for (int j = 1; j < kLanes; ++j) acc += a[j];
              col = kLaneCol[h][b];
            }
            pb.out[(m_begin + m) * pb.size_n + n0 + 128 * l + 8 * w + col] = round_to<D>(acc);
          }
  }
}

}  // namespace awq_cpu
}  // namespace w4k
