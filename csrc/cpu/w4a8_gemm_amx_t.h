// The int8-activation mode for AutoAWQ weights (awq_gemm_a8) on AMX-INT8 tiles with the weights
// as the A operand (torch-free): the transposed product isum^T = (q)^T qa^T, as the bf16 path
// of awq_gemm_cpu_amx.h does it, but without tables: a tile row is one column's 64 codes of one
// step (u8 0..15, exact as signed bytes for TDPBSSD), so after the 16-bit transposition of 64
// rows of a line (four 16-row transposes, transpose16<true>, two 32-row unit registers per
// 16-bit unit) each column's step is two shifts, two masks, one vpackuswb and one store: ~5
// instructions per 64 weights, against the B-operand path's decode of every code into panel
// quads. vpackuswb interleaves the two 32-row halves per 128-bit lane, so position p = 16 L + o
// of a tile row holds k = 8 L + o (o < 8) or 32 + 8 L + o - 8: the quantized activations are
// laid out as B tiles in the same order (tile row j: the dword of k-quad kq(j) of 16 rows).
//
// Numerics (w4a8_gemm_kernel.h): per block (64 or 128 rows, one or two steps) the C tiles
// start from zero and hold sum q * qa exactly; the epilogue subtracts z * sum(qa) and runs
// acc = fma(float(isum), sa * sw, acc) in block order, the same fp32 operations on the same
// integers as every other path: the same bits (tested).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "cpu/amx_bf16.h"
#include "cpu/awq_gemm_cpu_lut.h"  // transpose16
#include "cpu/w4a8_gemm_kernel.h"

namespace w4k::cpu {

#ifdef W4K_HAVE_AMX_PATH

// (a superset of awq_gemm_cpu.h's W4K_AWQ_AVX512, so that transpose16 inlines)
#define W4K_A8T_TARGET                                                                   \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vbmi,f16c," \
                        "fma,amx-tile,amx-int8")))

constexpr int64_t kA8TLine = 128;      // columns per line: the 64 bytes (16 words) of a row
constexpr int64_t kA8TStep = 64;       // k per tile step
constexpr int64_t kA8TItemLines = 4;   // lines per work item
// Rows for which awq_gemm_a8 takes this path. Measured 2026-11-28 (2 threads, wall clock,
// medians of 7 calls alternating with the other paths, 20 ms apart, weights rotated, bf16,
// group 128), x speed-up over the previous default (vpdpbusd register tiles below 64 rows, the
// B-operand AMX tiles from 64) on 11008 x 4096 / 4096 x 11008 / 4096 x 4096: M = 1 0.45 (11008
// x 4096), M = 16 1.00 / 0.98 / 0.95, M = 24 1.04 / 0.99 / 0.87, M = 32 1.26 / 1.20 / 1.12,
// M = 48 1.42 / 1.39 / 1.27, M = 63 1.59 / 1.44 / 1.45, M = 64 1.25 / - / 1.00, M = 96 1.09 / -
// / 1.03, M = 128 1.21 / - / 1.14. Below 32 rows its fixed costs (the 16-row tiles, the
// per-block epilogue of every line) outweigh the cheaper decode.
constexpr int64_t kA8TMinRows = 32, kA8TMaxRows = 128;

// AWQ with blocks of 64 or 128 rows, kA8TMinRows..kA8TMaxRows rows, AMX-INT8 present;
// W4K_A8_AMX_T=0 turns it off, =1 takes it at every M (tests).
inline bool a8t_applies(const W4a8Problem& p) {
  const char* env = std::getenv("W4K_A8_AMX_T");
  if (env && std::strcmp(env, "0") == 0) return false;
  const bool rows = (p.size_m >= kA8TMinRows && p.size_m <= kA8TMaxRows) ||
                    (env && std::strcmp(env, "1") == 0);
  return p.format == A8Format::kAwq && p.block % kA8TStep == 0 && rows && amx_int8_enabled();
}

inline int64_t a8t_row_blocks(int64_t size_m) { return (size_m + 15) / 16; }
inline int64_t a8t_qa_dwords(const W4a8Problem& p) {
  return a8t_row_blocks(p.size_m) * 16 * (p.size_k / 4);
}
inline int64_t a8t_scratch_floats(int64_t size_m) {
  return kA8TItemLines * a8t_row_blocks(size_m) * kA8TLine * 16  // acc [line][rb][column][16]
         + 2 * kA8TLine * 64 / 4                                  // A rows: 2 steps x 128 x 64 B
         + 3 * 256                                                // three 16-row transposes
         + 4 * 256                                                // C tiles of a quad
         + 4 * kA8TLine;                                          // sw, z (per line)
}

// Tile row j of a step holds k-quad kq(j) (see the header comment).
inline int a8t_quad(int j) {
  const int lane = j / 4, o = j % 4;
  return o < 2 ? 2 * lane + o : 8 + 2 * lane + o - 2;
}

// qa as B tiles for rows [16 rb, 16 rb + 16): qt[((rb * steps + s) * 16 + j) * 16 + i] = the
// dword of k-quad a8t_quad(j) of step s of row 16 rb + i (zero past M).
W4K_A8T_TARGET inline void a8t_qa_tiles(const W4a8Problem& p, int64_t rb, uint32_t* qt) {
  const int64_t steps = p.size_k / kA8TStep;
  for (int64_t s = 0; s < steps; ++s) {
    __m512i r[16];
    for (int i = 0; i < 16; ++i) {
      const int64_t m = 16 * rb + i;
      r[i] = m < p.size_m ? _mm512_loadu_si512(p.qa + m * p.lda_q + s * kA8TStep)
                          : _mm512_setzero_si512();
    }
    awq_cpu::transpose16(r);
    uint32_t* dst = qt + (rb * steps + s) * 256;
    for (int j = 0; j < 16; ++j) _mm512_store_si512(dst + 16 * j, r[a8t_quad(j)]);
  }
}

// Rows [k0, k0 + 64 steps) of a line (first word w0, `words` valid) as A rows:
// abuf[(s * 128 + c) * 64 + p] = the code of column c at row k0 + 64 s + k(p).
W4K_A8T_TARGET inline void a8t_decode(const W4a8Problem& p, int64_t k0, int64_t steps,
                                      int64_t w0, int64_t words, uint8_t* abuf,
                                      uint32_t* tbuf) {
  const int64_t ldq = p.size_n / 8;
  const __mmask16 wmask = static_cast<__mmask16>((1u << words) - 1);
  const __m512i unit0 = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28,
                                          30);
  const __m512i unit1 = _mm512_add_epi32(unit0, _mm512_set1_epi32(1));
  const __m512i low4 = _mm512_set1_epi16(15);
  for (int64_t s = 0; s < steps; ++s) {
    // one pointer stepped by a row (row addresses held at once were spilled)
    const int32_t* row = p.qweight + (k0 + kA8TStep * s) * ldq + w0;
    const int64_t pf = 2 * kA8TStep * ldq;  // the rows two steps ahead, into L2
    __m512i r[16];
    const int32_t* const step_row = row;
    for (int h = 0; h < 4; ++h) {  // rows 16 h .. 16 h + 15; the first three kept in tbuf
      for (int i = 0; i < 16; ++i, row += ldq) r[i] = _mm512_maskz_loadu_epi32(wmask, row);
      awq_cpu::transpose16<true>(r);
      if (h < 3)
        for (int w = 0; w < 16; ++w) _mm512_store_si512(tbuf + (h * 16 + w) * 16, r[w]);
    }
    uint8_t* a = abuf + s * kA8TLine * 64;
#pragma GCC unroll 16
    for (int w = 0; w < 16; ++w) {
      // the step's rows two steps ahead into L2, 4 per word (spread over the lookups: issued in
      // one burst with the loads they stalled on the miss queue)
      for (int i = 4 * w; i < 4 * w + 4; ++i)
        _mm_prefetch(reinterpret_cast<const char*>(step_row + i * ldq + pf), _MM_HINT_T1);
      const __m512i t0 = _mm512_load_si512(tbuf + w * 16);
      const __m512i t1 = _mm512_load_si512(tbuf + (16 + w) * 16);
      const __m512i t2 = _mm512_load_si512(tbuf + (32 + w) * 16);
#pragma GCC unroll 2
      for (int u = 0; u < 2; ++u) {
        // unit u of word w over rows 0..31 and 32..63, one row per 16-bit lane
        const __m512i lo = _mm512_permutex2var_epi32(t0, u ? unit1 : unit0, t1);
        const __m512i hi = _mm512_permutex2var_epi32(t2, u ? unit1 : unit0, r[w]);
#pragma GCC unroll 4
        for (int e = 0; e < 4; ++e) {
          const __m512i c0 = _mm512_and_si512(e ? _mm512_srli_epi16(lo, 4 * e) : lo, low4);
          const __m512i c1 = _mm512_and_si512(e ? _mm512_srli_epi16(hi, 4 * e) : hi, low4);
          _mm512_store_si512(a + (8 * w + 2 * e + u) * 64, _mm512_packus_epi16(c0, c1));
        }
      }
    }
  }
}

// The scales (as fp32, exact) and zero points of group g for columns [n0, n0 + ncols) of a line
// (ncols 64 or 128), 16 at a time; zero past ncols.
W4K_A8T_TARGET inline void a8t_scales_zeros(const W4a8Problem& p, int64_t g, int64_t n0,
                                            int64_t ncols, float* sw, int32_t* z) {
  const awq_cpu::Dtype d =
      p.type == HalfType::kFloat16 ? awq_cpu::Dtype::kHalf : awq_cpu::Dtype::kBFloat16;
  for (int64_t c0 = 0; c0 < kA8TLine; c0 += 16) {
    const bool in = c0 < ncols;  // ncols: 64 or 128
    const __m256i h = _mm256_maskz_loadu_epi16(in ? 0xFFFF : 0, p.scales + g * p.size_n + n0 + c0);
    _mm512_store_ps(sw + c0, awq_cpu::f16_to_f32(h, d));
    _mm512_store_si512(
        z + c0, awq_cpu::awq_codes16(p.zeros + g * (p.size_n / 8) + (n0 + c0) / 8, in ? 2 : 0));
  }
}

// Columns [n_begin, n_end) (n_begin a multiple of 128, at most kA8TItemLines lines), every row.
W4K_A8T_TARGET void a8t_chunk(const W4a8Problem& p, const uint32_t* qt, int64_t n_begin,
                              int64_t n_end, float* scratch) {
  const int64_t blocks_m = a8t_row_blocks(p.size_m), steps_all = p.size_k / kA8TStep;
  const int64_t words_all = (n_end - n_begin) / 8, lines = (words_all + 15) / 16;
  float* acc = scratch;  // [line][row block][column][16 rows]
  uint8_t* abuf = reinterpret_cast<uint8_t*>(acc + kA8TItemLines * blocks_m * kA8TLine * 16);
  uint32_t* tbuf = reinterpret_cast<uint32_t*>(abuf + 2 * kA8TLine * 64);
  int32_t* cbuf = reinterpret_cast<int32_t*>(tbuf + 3 * 256);
  float* sw = reinterpret_cast<float*>(cbuf + 4 * 256);
  int32_t* z = reinterpret_cast<int32_t*>(sw + kA8TLine);
  alignas(64) float sa_v[16];
  alignas(64) int32_t sq_v[16];
  std::memset(acc, 0, sizeof(float) * lines * blocks_m * kA8TLine * 16);
  AmxTileScope amx_tiles(true);
  const int64_t steps = p.block / kA8TStep;
  for (int64_t b = 0; b < p.num_blocks; ++b) {
    const int64_t k0 = b * p.block, g = k0 / p.group_size;
    for (int64_t l = 0; l < lines; ++l) {
      const int64_t n0 = n_begin + kA8TLine * l, ncols = std::min(kA8TLine, n_end - n0);
      a8t_scales_zeros(p, g, n0, ncols, sw, z);
      a8t_decode(p, k0, steps, n0 / 8, std::min<int64_t>(16, words_all - 16 * l), abuf, tbuf);
      amx_stores_before_tile_load();  // the A rows
      for (int64_t rb = 0; rb < blocks_m; ++rb) {
        for (int i = 0; i < 16; ++i) {
          const int64_t m = 16 * rb + i;
          sa_v[i] = m < p.size_m ? p.sa[m * p.num_blocks + b] : 0.0f;
          sq_v[i] = m < p.size_m ? p.sumqa[m * p.num_blocks + b] : 0;
        }
        const __m512 sav = _mm512_load_ps(sa_v);
        const __m512i sqv = _mm512_load_si512(sq_v);
        const uint32_t* q = qt + (rb * steps_all + k0 / kA8TStep) * 256;
        float* acc_l = acc + (l * blocks_m + rb) * kA8TLine * 16;
        for (int quad = 0; quad < 2; ++quad) {
          _tile_zero(0);
          _tile_zero(1);
          _tile_zero(2);
          _tile_zero(3);
          for (int64_t s = 0; s < steps; ++s) {
            const uint8_t* a = abuf + (s * kA8TLine + 64 * quad) * 64;
            _tile_loadd(4, q + s * 256, 64);
            _tile_loadd(5, a, 64);
            _tile_dpbssd(0, 5, 4);
            _tile_loadd(6, a + 16 * 64, 64);
            _tile_dpbssd(1, 6, 4);
            _tile_loadd(5, a + 32 * 64, 64);
            _tile_dpbssd(2, 5, 4);
            _tile_loadd(6, a + 48 * 64, 64);
            _tile_dpbssd(3, 6, 4);
          }
          _tile_stored(0, cbuf, 64);
          _tile_stored(1, cbuf + 256, 64);
          _tile_stored(2, cbuf + 512, 64);
          _tile_stored(3, cbuf + 768, 64);
          // the fp32 epilogue of every path: isum = sum - z * sum(qa), acc = fma(isum, sa sw, acc)
          for (int c = 0; c < 64; ++c) {
            const int col = 64 * quad + c;
            const __m512i isum =
                _mm512_sub_epi32(_mm512_load_si512(cbuf + 16 * c),
                                 _mm512_mullo_epi32(_mm512_set1_epi32(z[col]), sqv));
            const __m512 t = _mm512_mul_ps(sav, _mm512_set1_ps(sw[col]));
            float* ac = acc_l + col * 16;
            _mm512_store_ps(ac, _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), t, _mm512_load_ps(ac)));
          }
        }
      }
      amx_stores_before_tile_load();  // the next decode refills abuf
    }
  }
  // acc [column][16 rows] per (line, row block) -> rows of the output (+ bias, one rounding)
  alignas(64) float y[kA8TLine];
  for (int64_t l = 0; l < lines; ++l) {
    const int64_t n0 = n_begin + kA8TLine * l, ncols = std::min(kA8TLine, n_end - n0);
    for (int64_t rb = 0; rb < blocks_m; ++rb) {
      const float* a = acc + (l * blocks_m + rb) * kA8TLine * 16;
      for (int i = 0; i < 16 && 16 * rb + i < p.size_m; ++i) {
        const int64_t m = 16 * rb + i;
        for (int64_t c = 0; c < ncols; ++c)
          y[c] = p.bias ? a[c * 16 + i] + p.bias[n0 + c] : a[c * 16 + i];
        narrow_c_row(y, ncols, p.type, true, p.out + m * p.size_n + n0);
      }
    }
  }
}

#endif  // W4K_HAVE_AMX_PATH

}  // namespace w4k::cpu
