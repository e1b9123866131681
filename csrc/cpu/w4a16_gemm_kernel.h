// CPU kernel of w4a16_gemm: fp32 activations x Marlin int4 weight -> fp32 [M, N]. Torch-free:
// raw pointers and sizes; the binding (w4a16_gemm.cpp) converts/permutes a, converts the scales
// and the output, and runs `w4a16_gemm_cpu_chunks` over column chunks in parallel.
//
// Numerics (vLLM gptq_marlin_gemm), T = the activation's half type:
// * grouped (G > 1): each weight is dequantized to T, w = T((q - z) * s) with ONE
//   round-to-nearest-even ((q - z) * s is exact in fp32: a 5-bit integer times an 11-bit (fp16)
//   or 8-bit (bf16) significand), the products a * w are accumulated in fp32, then + bias.
// * per-channel (G == 1, Marlin's structure): the weight is the exact integer q - z (the scale
//   is 1 in the dequantization), the products a * (q - z) are accumulated in fp32, and the
//   epilogue computes y = acc * s[n], then y + bias, two separate fp32 roundings (epilogue()).
// The binding rounds the fp32 result to T once.
//
// Work unit: one 64-column chunk (Marlin words [kt, 128*ch .. 128*ch + 127] for every k-tile kt)
// times a range of rows of a. Blocked path: per k-tile the 128 words decode into a 16 x 64 block
// `wbuf` whose columns are a fixed permutation (`colperm`) of the chunk's 64 columns, chosen so
// the AVX-512 decode needs no scatter; the accumulators use the same column order and are
// un-permuted when the chunk is written out. Few rows (AVX-512): per-column lookup tables.
//
// Files: w4a16_gemm_layout.h (problem, Marlin index tables, scalar rounding),
// w4a16_gemm_avx512.h (the AVX-512 paths), w4a16_gemm_avx2.h (the portable path vectorized,
// same bits), this file (portable path, CPU dispatch, driver).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cpu/amx_bf16.h"
#include "cpu/isa.h"
#include "cpu/w4a16_gemm_avx2.h"
#include "cpu/w4a16_gemm_avx512.h"
#include "cpu/w4a16_gemm_convert.h"
#include "cpu/w4a16_gemm_decode_avx512.h"
#include "cpu/w4a16_gemm_lookup_avx2.h"
#include "cpu/w4a16_gemm_layout.h"

namespace w4k::cpu {

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

// acc[i][0:64] += sum_k a[i * lda + k] * wbuf[k][0:64] for rows i < rows, one fp32 chain per
// output: k = 0, 1, 2, ... or, with `pairs` (bf16 activations, kc even), k = 1, 0, 3, 2, ...:
// the order in which vdpbf16ps adds a k-pair's two products (the odd row first), so that the
// blocked vdpbf16ps path and every other path give the same bits.
inline void micro_generic(const float* a, int64_t lda, const float* wbuf, int64_t kc,
                          float* acc, int64_t rows, bool pairs) {
  for (int64_t i = 0; i < rows; ++i) {
    float* acc_row = acc + i * 64;
    for (int64_t k0 = 0; k0 < kc; ++k0) {
      const int64_t k = pairs ? (k0 ^ 1) : k0;
      const float av = a[i * lda + k];
      const float* w_row = wbuf + k * 64;
      for (int x = 0; x < 64; ++x) acc_row[x] += av * w_row[x];
    }
  }
}

// ---- driver ------------------------------------------------------------------------------------

enum class CpuIsa { kGeneric, kAvx2, kAvx512, kAvx512Bf16 };

inline bool is_avx512(CpuIsa isa) { return isa == CpuIsa::kAvx512 || isa == CpuIsa::kAvx512Bf16; }

// The best path this CPU has, after the project-wide cap W4K_CPU_ISA (cpu/isa.h: "scalar"
// selects the portable path, "avx2" (or a CPU with AVX2 + FMA + F16C but not the AVX-512 set
// of cpu/isa.h) its AVX2 twin, which gives the same bits). W4K_W4A16_DPBF16=0 also turns off
// the AVX512-BF16 dot products, so tests can run every path on one machine.
inline CpuIsa w4a16_gemm_cpu_isa() {
#ifdef W4K_HAVE_AVX512_PATH
  if (cpu_isa() == Isa::kAvx512) {
    const char* dot = std::getenv("W4K_W4A16_DPBF16");
    const bool no_dot = dot && std::strcmp(dot, "0") == 0;
    return __builtin_cpu_supports("avx512bf16") && !no_dot ? CpuIsa::kAvx512Bf16
                                                          : CpuIsa::kAvx512;
  }
#endif
#ifdef W4K_HAVE_AVX2_W4A16_PATH
  if (cpu_isa() >= Isa::kAvx2) return CpuIsa::kAvx2;
#endif
  return CpuIsa::kGeneric;
}

// Rows of a up to which the AVX-512 lookup-table path is used (see lut_chunk_avx512): fp16
// activations above the decode path's rows (so by default never: the decode path now takes
// fp16 to 8 rows; with W4K_W4A16_PAIR_ROWS=4 fp16 5..8 runs here), never bf16 (with
// vdpbf16ps the blocked path's table decode is 1.6-2x faster at
// M = 4 and 6, 2 threads, 2026-11-24; without, bf16 takes the decode path with vdpbf16ps
// emulated up to 8 rows and the blocked path above, whose orders every ISA shares);
// W4K_W4A16_LUT_ROWS overrides it (benchmarks and tests compare both paths with it).
inline int64_t w4a16_gemm_lut_max_rows(bool fp16, bool amx = false) {
  const char* env = std::getenv("W4K_W4A16_LUT_ROWS");
  return env ? std::atoll(env) : (fp16 && !amx ? 8 : 0);
}

// Rows of a up to which the decode path is used (pair_chunks_avx512): 8, bf16 and fp16;
// W4K_W4A16_PAIR_ROWS overrides it for both (0 turns the path off: tests compare the paths).
// fp16, measured 2026-11-24 evening (as below; row blocks of 4, so 8 rows decode each tile
// twice): one thread, 4096 x 4096, ms decode / the path it replaced: M = 5 2.81 / 3.63 and 8
// 3.71 / 4.79 (lookup tables); 11008 x 4096 M = 5 7.78 / 9.84, 8 10.8 / 13.0; two threads
// (medians of 15 / 6 calls, the paths alternating) 1.12-1.29x faster at M = 5 and 8 on both
// shapes. Above 8 rows the AVX-512 decode path would still win (M = 9 4.46 / 6.46, 12 5.30 /
// 7.14, 16 7.38 / 8.21 against the blocked fp32 path; level at 20), but every ISA follows the
// decode path's order where it runs, and the AVX2 form of that order (decode_lanes_avx2) is
// 1.3-1.5x slower than the AVX2 blocked loop at 9..16 rows (M = 9 11.6 / 7.9, 12 13.3 / 9.2,
// 16 13.8 / 10.4 ms), against faster at 2..8 rows.
// bf16, measured 2026-11-24 evening (GPTQ g128, weights rotated, one thread, min CPU time of
// 40-60 calls, the two paths alternating in one process), ms decode / blocked path, and the
// share of one core's 234 GFLOP/s vdpbf16ps peak: 4096 x 4096 M = 5 1.21 / 1.44 (59 / 50 %),
// 6 1.41 / 1.63, 8 1.71 / 1.96 (67 / 59 %); 11008 x 4096 M = 5 3.42 / 3.91, 8 4.83 / 5.17;
// 4096 x 11008 M = 5 3.49 / 4.14, 8 4.88 / 5.33; at 9..16 rows (two row blocks) the paths are
// level to 9 % apart either way, so the blocked path keeps them. (Before each load of a row's
// activation vector served two vdpbf16ps, pair_pass_avx512, the decode path lost to the blocked
// path from 4 or 5 rows.)
// With AMX tiles (bf16, amx_bf16.h) the blocked path takes over from 5 rows: measured
// 2026-11-27 on the Intel Xeon (AMX-BF16) machine, 11008 x 4096, g128, 2 threads, min of 10
// calls, ms decode path / blocked AMX: M = 2 2.23 / 3.80, 3 3.56 / 4.90, 4 4.23 / 4.83, 5 5.20 /
// 4.64, 6 6.36 / 4.86, 8 6.71 / 3.87. fp16 on the tiles (split in two bf16, four tile products
// per product) from 7 rows: 2026-11-28, same machine and shape, medians of 12 calls (weights
// rotated), two runs, ms decode path / tiles: M = 5 7.92, 6.35 / 8.96, 7.17; 6 8.90, 6.32 /
// 9.06, 7.12; 7 9.18, 6.58 / 9.39, 6.29; 8 9.74, 8.68 / 8.89, 6.59.
// bf16 rows of the decode path from which it sums with the fma form of vdpbf16ps (two FMAs on
// the activations split once per block, pair_chunks_avx512's kSplitA; the bits of vdpbf16ps
// except where a product is subnormal, which vdpbf16ps flushes) instead of vdpbf16ps: 2 where
// two FMAs cost at most 0.8x a vdpbf16ps (fma_form_faster), else never. Measured on the AMX
// Xeon of 2026-11-28 (2 threads, weights rotated, 3 runs of 9 rounds alternating in one
// process, fma form x vdpbf16ps on 11008 x 4096, 4096 x 11008, 4096 x 4096): M = 1 0.92-0.98,
// M = 2 1.01-1.12, M = 3 0.91-1.14, M = 4 1.00-1.24; L1-resident (a harness of
// pair_pass_avx512): 2 rows 1.15-1.2x, 3 rows 1.2-1.4x, 4 rows 1.3-1.45x, 1 row 0.9x.
// W4K_W4A16_FMA_ROWS overrides it.
inline int64_t w4a16_fma_min_rows() {
  const char* env = std::getenv("W4K_W4A16_FMA_ROWS");
  if (env) return std::atoll(env);
#ifdef W4K_HAVE_AVX512_PATH
  return fma_form_faster() ? 2 : INT64_MAX;
#else
  return INT64_MAX;
#endif
}

inline int64_t w4a16_gemm_pair_max_rows(bool amx = false, bool fp16 = false) {
  const char* env = std::getenv("W4K_W4A16_PAIR_ROWS");
  return env ? std::atoll(env) : !amx ? 8 : fp16 ? 6 : 4;
}

// srow[r] / zrow[r] (r = 0..15): the decoded scales and zero points (decode_chunk_groups' sc and
// zf, wbuf column order; zf nullptr: zrow all nullptr) of the group of row 16 kt + r.
inline void tile_row_groups(const W4a16GemmProblem& p, int64_t kt, const float* sc,
                            const float* zf, const float* srow[16], const float* zrow[16]) {
  for (int r = 0; r < 16; ++r) {
    const int64_t g = p.g_idx ? p.g_idx[16 * kt + r] : (16 * kt + r) / p.group_size;
    srow[r] = sc + g * 64;
    zrow[r] = zf ? zf + g * 64 : nullptr;
  }
}

// c[m0 + i, chunk ch] = epilogue(sums[i][x]) for rows i < rows, sums in wbuf column order.
// c_row: where the chunk's 64 outputs of that row go (chunk column n at c_row[n]).
inline void write_chunk_row(const W4a16GemmProblem& p, int64_t ch, const float* chan_scale,
                            const float* sums, float* c_row) {
  const MarlinChunkTables& tb = chunk_tables();
  const float* bias = p.bias ? p.bias + 64 * ch : nullptr;
  for (int x = 0; x < 64; ++x) {
    const int n = tb.colperm[x];
    c_row[n] = epilogue(sums[x], chan_scale, n, bias ? bias[n] : 0.0f);
  }
}
inline void write_chunk_rows(const W4a16GemmProblem& p, int64_t ch, int64_t m0, int64_t rows,
                             const float* chan_scale, const float* sums) {
  for (int64_t i = 0; i < rows; ++i)
    write_chunk_row(p, ch, chan_scale, sums + i * 64, p.c + (m0 + i) * p.size_n + 64 * ch);
}

// ---- the decode path's summation order, for every ISA --------------------------------------
//
// At M <= 8 the AVX-512 decode path (pair_chunks_avx512; at M <= 4 inside
// the K slices of w4a16_gemm_decode_split.h) adds the products of each output in this order,
// and the portable and AVX2 paths follow it through decode_order_chunk, so they give the same
// bits (on an AVX-512 CPU without BF16 the decode path itself runs for bf16, vdpbf16ps emulated
// by two FMAs; on a CPU with AMX-BF16 bf16 at M <= 12 and fp16 at 3..16 run the same K slices on
// the tiles instead, w4a16_gemm_decode_amx.h, with the tile path's own bits, as at larger M):
// * K is cut into slices of decode_slice_tiles(p) k-tiles (kDecodeSliceTiles at M <= 4, all of
//   K in one slice above); each slice's sum is formed alone, and the slices' sums are added in
//   slice order (total = s0, then total + s1, ...), then the epilogue;
// * within a slice, each column keeps lane sums over its k-tiles in order: bf16 4 lanes, lane t
//   taking per tile the k-pairs (2t, 2t + 1) then (2t + 8, 2t + 9), each pair's odd row first
//   (vdpbf16ps); fp16 8 lanes (t, r) taking rows 2t + r then 2t + 8 + r; at the slice's end
//   bf16 (L0 + L1) + (L2 + L3), fp16 ((L00 + L01) + (L10 + L11)) + ((L20 + L21) + (L30 + L31));
// * k-tiles whose rows span groups (act-order) go to a separate fp32 sum in k order (`extra`),
//   added after the lanes: slice sum = lanes + extra.
// k-tiles per slice: 1024 rows of K (8 * size_n * 64 bytes of the weight: 2 MiB at N = 4096).
constexpr int64_t kDecodeSliceTiles = 64;
// Rows of a up to which the K-sliced split runs (the slices let two threads stream the weight
// as long contiguous runs, which pays where the op is a stream of the weight). At 5..8 rows the
// column split of the other paths is faster (one thread, 4096 x 4096, 2026-11-24: M = 5 1.22
// against 1.36-1.45 ms, M = 8 1.72-1.81 against 1.97-2.12; two threads level to 13 % faster at
// M = 8, 3-10 % slower at M = 5), so the decode path sums all of K in one slice there.
constexpr int64_t kDecodeSplitMaxRows = 4;
// Rows of a up to which the decode path's order can apply (w4a16_gemm_pair_max_rows' defaults).
constexpr int64_t kDecodePathMaxRows = 8;

inline int64_t decode_slice_tiles(const W4a16GemmProblem& p) {
  return p.size_m <= kDecodeSplitMaxRows ? kDecodeSliceTiles
                                         : std::max<int64_t>(1, p.size_k / 16);
}

// Whether this order applies to a problem (on every ISA): fp16 or bf16 activations, groups of
// whole k-tiles or act-order, within the decode path's rows. W4K_W4A16_KSPLIT=0 turns it off:
// the AVX-512 decode path then sums all of K in one slice at every M, and the other ISAs run
// their blocked loops (so the bits of AVX-512 and the others differ): a test knob.
inline bool decode_order_applies(const W4a16GemmProblem& p) {
  const char* env = std::getenv("W4K_W4A16_KSPLIT");
  if (env && std::strcmp(env, "0") == 0) return false;
  return (p.g_idx != nullptr || p.group_size % 16 == 0) &&
         p.size_m <= std::min<int64_t>(kDecodePathMaxRows, w4a16_gemm_pair_max_rows());
}

// decode_order_chunk's lane sums of `rows` rows over nt decoded tiles (wtiles[q][16][64]; tiles
// with tg[q] < 0 skipped: their products go to `extra`), in the order above: bf16 lane t takes
// per tile rows 2t + 1, 2t, 2t + 9, 2t + 8; fp16 lane (t, r) = 2t + r rows 2t + r, 2t + 8 + r.
// lanes[i][l][64] of row i (nl = 4 or 8 lanes); a: row 0's activations of the block's first
// tile, rows lda apart. One fp32 multiply and one add per product (no fma: the products are
// exact, so this is the AVX-512 path's fma, and the function is also inlined into the AVX2
// target, which is built without FMA).
inline void decode_lanes_generic(const float* a, int64_t lda, const float* wtiles, int nt,
                                 const int32_t* tg, float* lanes, int64_t rows, bool fp16) {
  const int nl = fp16 ? 8 : 4;
  for (int64_t i = 0; i < rows; ++i)
    for (int q = 0; q < nt; ++q) {
      if (tg[q] < 0) continue;
      const float* aq = a + i * lda + 16 * q;
      const float* wt = wtiles + q * 1024;
      // A lane's products of one tile in one pass over the columns (its sum loaded and stored
      // once).
      for (int t = 0; t < 4; ++t) {
        const int k = 2 * t;
        const float* w0 = wt + 64 * k;
        if (fp16) {
          for (int r = 0; r < 2; ++r) {
            float* lane = lanes + (i * nl + 2 * t + r) * 64;
            const float a0 = aq[k + r], a8 = aq[k + 8 + r];
            const float* wr = w0 + 64 * r;
            for (int x = 0; x < 64; ++x) lane[x] = (lane[x] + a0 * wr[x]) + a8 * wr[512 + x];
          }
        } else {
          float* lane = lanes + (i * nl + t) * 64;
          const float a0 = aq[k], a1 = aq[k + 1], a8 = aq[k + 8], a9 = aq[k + 9];
          for (int x = 0; x < 64; ++x)
            lane[x] = (((lane[x] + a1 * w0[64 + x]) + a0 * w0[x]) + a9 * w0[576 + x]) +
                      a8 * w0[512 + x];
        }
      }
    }
}

// A k-tile whose rows span groups (act-order): its products added to extra[rows][64] in k order
// (a: row 0's activations of the tile, rows lda apart; wtile[16][64] decoded, wbuf order).
inline void add_tile_in_k_order(const float* a, int64_t lda, int64_t rows, const float* wtile,
                                float* extra) {
  for (int64_t i = 0; i < rows; ++i) {
    const float* ai = a + i * lda;
    float* e = extra + i * 64;
    for (int k = 0; k < 16; ++k)
      for (int x = 0; x < 64; ++x) e[x] += ai[k] * wtile[64 * k + x];
  }
}

// Rows [m0, m0 + rows) of chunk ch in the decode path's order (above). decode_tile(words, srow,
// zrow, wtile) decodes one k-tile into wtile[16][64] (wbuf column order) as
// dequant_tile_generic does; sc / zf / chan_scale: decode_chunk_groups of the chunk. Tiles are
// decoded 16 at a time (within a slice); add_lanes(a, lda, wtiles, nt, tg, lanes, rows, fp16)
// adds a block's products to the lane sums: decode_lanes_generic, or on AVX2
// decode_lanes_avx2 (the sums in registers across the block).
template <typename DecodeTile, typename AddLanes>
__attribute__((always_inline)) inline void decode_order_chunk(
    const W4a16GemmProblem& p, int64_t ch, int64_t m0, int64_t rows, const int32_t* tile_group,
    const float* sc, const float* zf, const float* chan_scale, DecodeTile&& decode_tile,
    AddLanes&& add_lanes, std::vector<float>& scratch) {
  constexpr int kTiles = 16;
  const bool fp16 = p.weight_type == HalfType::kFloat16;
  const int64_t nl = fp16 ? 8 : 4, num_tiles = p.size_k / 16;
  scratch.resize(rows * (nl + 2) * 64 + kTiles * 16 * 64);
  float* lanes = scratch.data();          // [row][lane][64]
  float* extra = lanes + rows * nl * 64;  // [row][64]
  float* total = extra + rows * 64;       // [row][64]
  float* wtiles = total + rows * 64;      // [kTiles][16][64]
  const float* srow[16];
  const float* zrow[16];
  const int64_t slice_tiles = decode_slice_tiles(p);
  for (int64_t s0 = 0; s0 < num_tiles; s0 += slice_tiles) {
    const int64_t s1 = std::min(num_tiles, s0 + slice_tiles);
    std::fill(lanes, lanes + rows * (nl + 1) * 64, 0.0f);  // lanes and extra
    for (int64_t kt0 = s0; kt0 < s1; kt0 += kTiles) {
      const int nt = static_cast<int>(std::min<int64_t>(kTiles, s1 - kt0));
      for (int q = 0; q < nt; ++q) {
        const int64_t kt = kt0 + q;
        tile_row_groups(p, kt, sc, zf, srow, zrow);
        decode_tile(p.b_q_weight + kt * 2 * p.size_n + 128 * ch, srow, zf ? zrow : nullptr,
                    wtiles + q * 1024);
        if (tile_group[kt] < 0)
          add_tile_in_k_order(p.a + m0 * p.lda + 16 * kt, p.lda, rows, wtiles + q * 1024, extra);
      }
      add_lanes(p.a + m0 * p.lda + 16 * kt0, p.lda, wtiles, nt, tile_group + kt0, lanes, rows,
                fp16);
    }
    for (int64_t i = 0; i < rows; ++i)
      for (int x = 0; x < 64; ++x) {
        const float* l = lanes + i * nl * 64 + x;
        const float col =
            fp16 ? ((l[0] + l[64]) + (l[128] + l[192])) + ((l[256] + l[320]) + (l[384] + l[448]))
                 : (l[0] + l[64]) + (l[128] + l[192]);
        const float slice_sum = col + extra[i * 64 + x];
        total[i * 64 + x] = s0 == 0 ? slice_sum : total[i * 64 + x] + slice_sum;
      }
  }
  write_chunk_rows(p, ch, m0, rows, chan_scale, total);
}

// The lookup-table path's order (lut_chunk_avx512: fp16 at 5..8 rows on AVX-512), for the
// portable and AVX2 paths: per column 16 lane sums, lane r taking row r of every k-tile (one
// fp32 chain over the tiles in order), summed by lane_tree_sum16 at the end; k-tiles whose rows
// span groups go to the `extra` sum in k order, added after the lanes. Tiles are decoded 16 at a
// time; add_lanes(a, lda, wtiles, nt, tg, lanes, rows) adds a block's products to the lane sums
// of `rows` rows (lanes[i][r][64]; a: row 0's activations of the block's first tile; tiles with
// tg[q] < 0 skipped): lut_lanes_generic, or on AVX2 lut_lanes_avx2.
inline void lut_lanes_generic(const float* a, int64_t lda, const float* wtiles, int nt,
                              const int32_t* tg, float* lanes, int64_t rows) {
  for (int64_t i = 0; i < rows; ++i)
    for (int r = 0; r < 16; ++r) {
      float* lane = lanes + (i * 16 + r) * 64;
      for (int q = 0; q < nt; ++q) {
        if (tg[q] < 0) continue;
        const float av = a[i * lda + 16 * q + r];
        const float* w = wtiles + q * 1024 + 64 * r;
        for (int x = 0; x < 64; ++x) lane[x] += av * w[x];
      }
    }
}

template <typename DecodeTile, typename AddLanes>
__attribute__((always_inline)) inline void lut_order_chunk(const W4a16GemmProblem& p, int64_t ch,
                                                          int64_t m0, int64_t rows,
                                                          const int32_t* tile_group,
                                                          const float* sc, const float* zf,
                                                          const float* chan_scale,
                                                          DecodeTile&& decode_tile,
                                                          AddLanes&& add_lanes,
                                                          std::vector<float>& scratch) {
  constexpr int kTiles = 16;
  const int64_t num_tiles = p.size_k / 16;
  scratch.assign(rows * 17 * 64 + kTiles * 16 * 64, 0.0f);
  float* lanes = scratch.data();          // [row][lane r][64]
  float* extra = lanes + rows * 16 * 64;  // [row][64]
  float* wtiles = extra + rows * 64;      // [kTiles][16][64]
  const float* srow[16];
  const float* zrow[16];
  for (int64_t kt0 = 0; kt0 < num_tiles; kt0 += kTiles) {
    const int nt = static_cast<int>(std::min<int64_t>(kTiles, num_tiles - kt0));
    bool mixed = false;
    for (int q = 0; q < nt; ++q) {
      const int64_t kt = kt0 + q;
      mixed |= tile_group[kt] < 0;
      tile_row_groups(p, kt, sc, zf, srow, zrow);
      decode_tile(p.b_q_weight + kt * 2 * p.size_n + 128 * ch, srow, zf ? zrow : nullptr,
                  wtiles + q * 1024);
    }
    for (int64_t i = 0; i < rows && mixed; ++i) {  // mixed tiles: k order into extra
      const float* a = p.a + (m0 + i) * p.lda + 16 * kt0;
      for (int q = 0; q < nt; ++q) {
        if (tile_group[kt0 + q] >= 0) continue;
        float* e = extra + i * 64;
        for (int k = 0; k < 16; ++k)
          for (int x = 0; x < 64; ++x) e[x] += a[16 * q + k] * wtiles[q * 1024 + 64 * k + x];
      }
    }
    add_lanes(p.a + m0 * p.lda + 16 * kt0, p.lda, wtiles, nt, tile_group + kt0, lanes, rows);
  }
  for (int64_t i = 0; i < rows; ++i)  // the sums, in place of extra
    for (int x = 0; x < 64; ++x)
      extra[i * 64 + x] = lane_tree_sum16(lanes + i * 16 * 64 + x, 64) + extra[i * 64 + x];
  write_chunk_rows(p, ch, m0, rows, chan_scale, extra);
}

#ifdef W4K_HAVE_AVX2_W4A16_PATH
// lut_order_chunk's lane sums of MR rows over nt decoded tiles (wtiles[q][16][64]) with the sums
// in registers: per 8-column vector and lane r, the MR rows' sums, each weight vector loaded
// once for all rows; tiles whose rows span groups (tg[q] < 0) are skipped (their `extra`).
// lanes[i][r][64] of row i; a: row 0's activations of the first tile, rows lda apart.
template <int MR>
W4K_W4A16_AVX2 inline void lut_lanes_avx2(const float* a, int64_t lda, const float* wtiles,
                                          int nt, const int32_t* tg, float* lanes) {
  for (int v = 0; v < 8; ++v)
    for (int r = 0; r < 16; ++r) {
      __m256 acc[MR];
      for (int i = 0; i < MR; ++i) acc[i] = _mm256_loadu_ps(lanes + (i * 16 + r) * 64 + 8 * v);
      for (int q = 0; q < nt; ++q) {
        if (tg[q] < 0) continue;
        const __m256 w = _mm256_loadu_ps(wtiles + q * 1024 + 64 * r + 8 * v);
        const float* aq = a + 16 * q + r;
        for (int i = 0; i < MR; ++i)  // no FMA: see w4a16_gemm_avx2.h
          acc[i] = _mm256_add_ps(acc[i], _mm256_mul_ps(_mm256_broadcast_ss(aq + i * lda), w));
      }
      for (int i = 0; i < MR; ++i) _mm256_storeu_ps(lanes + (i * 16 + r) * 64 + 8 * v, acc[i]);
    }
}

// decode_lanes_generic with the sums in registers: for MR rows, V 8-column vectors at a time
// and each lane, the MR x V sums stay in registers over the block's tiles (the generic loop
// loads and stores a lane sum for every four products). V > 1 at few rows gives the adds of
// independent chains to overlap.
template <int MR, int V>
W4K_W4A16_AVX2 inline void decode_lanes_avx2(const float* a, int64_t lda, const float* wtiles,
                                             int nt, const int32_t* tg, float* lanes, bool fp16) {
  const int nl = fp16 ? 8 : 4;
  for (int v0 = 0; v0 < 8; v0 += V)
    for (int l = 0; l < nl; ++l) {
      // the lane's rows per tile, in order: bf16 2t + 1, 2t, 2t + 9, 2t + 8;
      // fp16 2t + r, 2t + 8 + r
      int krow[4];
      int nk;
      if (fp16) {
        const int t = l / 2, r = l % 2;
        krow[0] = 2 * t + r;
        krow[1] = 2 * t + 8 + r;
        nk = 2;
      } else {
        krow[0] = 2 * l + 1;
        krow[1] = 2 * l;
        krow[2] = 2 * l + 9;
        krow[3] = 2 * l + 8;
        nk = 4;
      }
      __m256 acc[MR][V];
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
        for (int v = 0; v < V; ++v)
          acc[i][v] = _mm256_loadu_ps(lanes + (i * nl + l) * 64 + 8 * (v0 + v));
      for (int q = 0; q < nt; ++q) {
        if (tg[q] < 0) continue;
        for (int e = 0; e < nk; ++e) {
          const int k = krow[e];
          const float* w = wtiles + q * 1024 + 64 * k + 8 * v0;
#pragma GCC unroll 8
          for (int i = 0; i < MR; ++i) {
            const __m256 av = _mm256_broadcast_ss(a + i * lda + 16 * q + k);
#pragma GCC unroll 8
            for (int v = 0; v < V; ++v)  // no FMA: see w4a16_gemm_avx2.h
              acc[i][v] = _mm256_add_ps(acc[i][v], _mm256_mul_ps(av, _mm256_loadu_ps(w + 8 * v)));
          }
        }
      }
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
        for (int v = 0; v < V; ++v)
          _mm256_storeu_ps(lanes + (i * nl + l) * 64 + 8 * (v0 + v), acc[i][v]);
    }
}

// decode_order_chunk, or (kLutOrder) lut_order_chunk's order, with the AVX2 tile decode, compiled
// for AVX2 (no FMA: see w4a16_gemm_avx2.h).
template <bool kLutOrder>
W4K_W4A16_AVX2 inline void order_chunk_avx2(const W4a16GemmProblem& p, int64_t ch, int64_t m0,
                                            int64_t rows, const int32_t* tile_group,
                                            const float* sc, const float* zf,
                                            const float* chan_scale, std::vector<float>& scratch) {
  const bool fp16 = p.weight_type == HalfType::kFloat16;
  auto decode = [&](const int32_t* words, const float* const* srow, const float* const* zrow,
                    float* wtile) {
    dequant_tile_avx2_any(words, srow, zrow, fp16, chan_scale != nullptr, wtile);
  };
  if (!kLutOrder) {
    auto add_lanes = [](const float* a, int64_t lda, const float* wtiles, int nt,
                        const int32_t* tg, float* lanes, int64_t rows, bool fp16) {
      // One row: the generic loop (auto-vectorized over the 64 columns) was as fast for bf16
      // and 1.15x faster for fp16 (one thread, 4096 x 4096, 2026-11-24); from two rows the sums
      // in registers: M = 4 fp16 7.4 -> 6.3 ms, M = 8 bf16 9.5 -> 8.0, fp16 10.6 -> 9.4.
      if (rows == 1) {
        decode_lanes_generic(a, lda, wtiles, nt, tg, lanes, rows, fp16);
        return;
      }
      const int64_t nl = fp16 ? 8 : 4;
      for (int64_t i0 = 0; i0 < rows; i0 += 4) {
        float* l = lanes + i0 * nl * 64;
        const float* ai = a + i0 * lda;
        switch (std::min<int64_t>(4, rows - i0)) {
          case 4: decode_lanes_avx2<4, 2>(ai, lda, wtiles, nt, tg, l, fp16); break;
          case 3: decode_lanes_avx2<3, 2>(ai, lda, wtiles, nt, tg, l, fp16); break;
          case 2: decode_lanes_avx2<2, 4>(ai, lda, wtiles, nt, tg, l, fp16); break;
          default: decode_lanes_avx2<1, 4>(ai, lda, wtiles, nt, tg, l, fp16); break;
        }
      }
    };
    decode_order_chunk(p, ch, m0, rows, tile_group, sc, zf, chan_scale, decode, add_lanes,
                       scratch);
    return;
  }
  // The lane sums in registers (lut_lanes_avx2): the generic loop's load and store of a lane
  // sum per product cost the AVX2 path 1.3-1.8x at M = 5..8.
  auto add_lanes = [](const float* a, int64_t lda, const float* wtiles, int nt,
                      const int32_t* tg, float* lanes, int64_t rows) {
    for (int64_t i0 = 0; i0 < rows; i0 += 8) {
      float* l = lanes + i0 * 16 * 64;
      const float* ai = a + i0 * lda;
      switch (std::min<int64_t>(8, rows - i0)) {
        case 8: lut_lanes_avx2<8>(ai, lda, wtiles, nt, tg, l); break;
        case 7: lut_lanes_avx2<7>(ai, lda, wtiles, nt, tg, l); break;
        case 6: lut_lanes_avx2<6>(ai, lda, wtiles, nt, tg, l); break;
        case 5: lut_lanes_avx2<5>(ai, lda, wtiles, nt, tg, l); break;
        case 4: lut_lanes_avx2<4>(ai, lda, wtiles, nt, tg, l); break;
        case 3: lut_lanes_avx2<3>(ai, lda, wtiles, nt, tg, l); break;
        case 2: lut_lanes_avx2<2>(ai, lda, wtiles, nt, tg, l); break;
        default: lut_lanes_avx2<1>(ai, lda, wtiles, nt, tg, l); break;
      }
    }
  };
  lut_order_chunk(p, ch, m0, rows, tile_group, sc, zf, chan_scale, decode, add_lanes, scratch);
}

// decode_order_chunk's order (MR <= kDecodePathMaxRows rows from m0) with the tiles decoded by
// table lookups (w4a16_gemm_lookup_avx2.h): the same bits, 1.5-3x faster (M = 1 .. 8; README
// "AVX2 path of w4a16_gemm"). A group's scales and zero points are decoded and its tables built when the first
// k-tile of the group comes; k-tiles whose rows span groups (act-order) take the per-weight
// decode into `extra`, as in decode_order_chunk. W4K_W4A16_AVX2_LOOKUP=0 turns it off (the
// per-weight decode then runs: a test and benchmark knob).
inline bool w4a16_avx2_lookup_enabled() {
  const char* env = std::getenv("W4K_W4A16_AVX2_LOOKUP");
  return !(env && std::strcmp(env, "0") == 0);
}

// Chunks are taken in bands, k-tile outer: one k-tile row of a band is nb * 512 contiguous
// bytes of the weight, where one chunk alone reads 512 bytes and jumps 8 * size_n bytes to its
// next k-tile, a stride the hardware prefetchers do not follow. Each chunk keeps its own lane
// sums, tables and scales (as one chunk alone: the same bits), and a lookup reads its table and
// lane sums from L1 either way, so a band costs no extra work as long as the band's lane sums
// and tables fit in L1: bands of up to 8 chunks within 32 KiB. Measured on a Zen 3 VM (AVX2
// only, 2026-12-07, 2 threads, weights rotated, in one process against one chunk at a time):
// bf16 M = 1 1.05-1.11x, M = 2-4 0.98-1.05x; fp16 M = 1 1.06-1.19x; bands of 8 at fp16 M = 4
// (80 KiB) 0.80-0.90x, hence the budget.
constexpr int kLookupBandMax = 8;
inline int lookup_band_chunks(int64_t rows, bool fp16) {
  const int64_t per_chunk = rows * lookup_lane_floats(fp16) * 4 + kLookupTableBytes;
  return static_cast<int>(std::clamp<int64_t>((32 << 10) / per_chunk, 1, kLookupBandMax));
}

// W4K_W4A16_AVX2_FMA=0 keeps the multiply and add everywhere (lookup_products_exact gates the
// FMA; a test and benchmark knob).
inline bool w4a16_avx2_fma_enabled() {
  const char* env = std::getenv("W4K_W4A16_AVX2_FMA");
  return !(env && std::strcmp(env, "0") == 0);
}

// One chunk of a band: its lane sums, per-weight sums, totals, tables, scales and zero points.
struct LookupChunk {
  float *lanes, *extra, *total, *s64, *z64, *chan_scale, *sc_all, *zf_all;
  uint8_t* tbl;
};

// One k-tile row of a band (nb chunks side by side, their words contiguous from `row`).
template <int MR, bool kFp16>
W4K_W4A16_AVX2 __attribute__((always_inline)) inline void lookup_band_row_avx2(
    const int32_t* row, int nb, const LookupChunk* cs, const float* a, int64_t lda,
    const int32_t* ahead) {
  for (int b = 0; b < nb; ++b)
    lookup_tile_avx2<MR, kFp16>(row + 128 * b, cs[b].tbl, a, lda, cs[b].lanes,
                                ahead ? ahead + 128 * b : nullptr);
}
// The same row compiled with FMA: GCC contracts each product's multiply and add into one
// vfmadd231ps (tests/test_cpu_hot_loops.py checks that it does), the same bits where every
// product is exact in fp32 (lookup_products_exact), where the callers alone take it. One call per
// k-tile row: a target with more instructions than its caller's is not inlined into it.
// Measured on a Zen 3 VM (AVX2 only, 2026-12-07, 2 threads, weights rotated, 15 rounds against
// W4K_W4A16_AVX2_FMA=0 in one process, GPTQ g128, 4096 x 4096, 11008 x 4096, 4096 x 11008): bf16
// M = 1 1.03-1.05x, M = 2 1.07-1.10x, M = 4 1.12-1.16x, M = 8 1.03x; fp16 M = 1 1.03-1.04x,
// M = 2 1.05-1.09x, M = 4 1.02-1.06x, M = 8 1.03-1.21x.
template <int MR, bool kFp16>
__attribute__((target("avx2,f16c,fma"), noinline)) void lookup_band_row_fma_avx2(
    const int32_t* row, int nb, const LookupChunk* cs, const float* a, int64_t lda,
    const int32_t* ahead) {
  lookup_band_row_avx2<MR, kFp16>(row, nb, cs, a, lda, ahead);
}

// act: the extremes of |a| over the rows' activations (abs_range_avx2), for the FMA gate.
template <int MR, bool kFp16>
W4K_W4A16_AVX2 inline void lookup_order_band_avx2(const W4a16GemmProblem& p, int64_t ch0,
                                                  int nb, int64_t m0,
                                                  const int32_t* tile_group,
                                                  bool any_mixed_tile, const AbsRange& act,
                                                  std::vector<float>& scratch) {
  constexpr int kLane = lookup_lane_floats(kFp16);
  // Each tile's 512 bytes are fetched kAhead k-tile rows before their use, one line per
  // 64-byte step of the lookup before it (AMD cores drop most prefetches issued back to back).
  constexpr int64_t kAhead = 8;
  const int64_t num_tiles = p.size_k / 16, slice_tiles = decode_slice_tiles(p);
  const bool has_zp = p.zeros != nullptr, per_channel = p.num_groups == 1;
  const int64_t all_groups = any_mixed_tile ? p.num_groups * 64 : 0;
  // per chunk: lanes [MR][kLane], extra [MR][64], total [MR][64], tables, s64, z64, chan_scale
  // [64 each], and with mixed tiles every group's scales and zero points
  const int64_t per_chunk = MR * (kLane + 128) + kLookupTableBytes / 4 + 3 * 64 + 2 * all_groups;
  scratch.resize(1024 + nb * per_chunk);
  float* wtile = scratch.data();  // [16][64], a mixed tile decoded per weight
  LookupChunk cs[kLookupBandMax];
  for (int b = 0; b < nb; ++b) {
    float* at = wtile + 1024 + b * per_chunk;
    LookupChunk& c = cs[b];
    c.lanes = at;
    c.extra = c.lanes + MR * kLane;
    c.total = c.extra + MR * 64;
    c.tbl = reinterpret_cast<uint8_t*>(c.total + MR * 64);
    c.s64 = c.total + MR * 64 + kLookupTableBytes / 4;
    c.z64 = c.s64 + 64;
    c.chan_scale = c.z64 + 64;
    c.sc_all = c.chan_scale + 64;
    c.zf_all = c.sc_all + all_groups;
    if (per_channel) decode_group_scales(p, ch0 + b, 0, c.s64, has_zp ? c.z64 : nullptr,
                                         c.chan_scale);
    if (any_mixed_tile)
      decode_chunk_groups(p, ch0 + b, c.sc_all, has_zp ? c.zf_all : nullptr,
                          per_channel ? c.chan_scale : nullptr);
  }
  // FMA for a k-tile row where every product of its group in every chunk of the band is exact
  // (fixed per band when per-channel: the weights are q - z there).
  const bool fma_allowed = w4a16_avx2_fma_enabled();
  const auto band_products_exact = [&] {
    if (!fma_allowed) return false;
    for (int b = 0; b < nb; ++b) {
      AbsRange s;
      abs_range_avx2(cs[b].s64, 64, s);
      if (!lookup_products_exact(kFp16, act, s)) return false;
    }
    return true;
  };
  bool use_fma = per_channel && band_products_exact();
  int64_t table_group = -1;
  const float* srow[16];
  const float* zrow[16];
  for (int64_t s0 = 0; s0 < num_tiles; s0 += slice_tiles) {
    const int64_t s1 = std::min(num_tiles, s0 + slice_tiles);
    for (int b = 0; b < nb; ++b)
      std::fill(cs[b].lanes, cs[b].lanes + MR * (kLane + 64), 0.0f);  // lanes and extra
    for (int64_t kt = s0; kt < s1; ++kt) {
      const int32_t* row = p.b_q_weight + kt * 2 * p.size_n + 128 * ch0;
      const int32_t* ahead = kt + kAhead < num_tiles ? row + kAhead * 2 * p.size_n : nullptr;
      const float* a = p.a + m0 * p.lda + 16 * kt;
      const int32_t g = tile_group[kt];
      if (g < 0) {
        for (int b = 0; b < nb; ++b) {
          tile_row_groups(p, kt, cs[b].sc_all, cs[b].zf_all, srow, zrow);
          dequant_tile_avx2_any(row + 128 * b, srow, has_zp ? zrow : nullptr, kFp16,
                                per_channel, wtile);
          add_tile_in_k_order(a, p.lda, MR, wtile, cs[b].extra);
        }
        continue;
      }
      if (g != table_group) {
        for (int b = 0; b < nb; ++b) {
          const int64_t ch = ch0 + b;
          if (!per_channel && g + 1 < p.num_groups) {  // the next group's (a miss each, else)
            const uint16_t* s_next = p.scales + (g + 1) * p.size_n + 64 * ch;
            __builtin_prefetch(s_next, 0, 3);
            __builtin_prefetch(s_next + 32, 0, 3);
            if (has_zp) __builtin_prefetch(p.zeros + (g + 1) * (p.size_n / 8) + 8 * ch, 0, 3);
          }
          if (!per_channel)
            gather_group_scales_avx2(p.scales + g * p.size_n + 64 * ch,
                                     has_zp ? p.zeros + g * (p.size_n / 8) + 8 * ch : nullptr,
                                     kFp16, cs[b].s64, cs[b].z64);
          build_lookup_tables_avx2<kFp16>(cs[b].s64, has_zp ? cs[b].z64 : nullptr, cs[b].tbl);
        }
        if (!per_channel) use_fma = band_products_exact();
        table_group = g;
      }
      if (use_fma)
        lookup_band_row_fma_avx2<MR, kFp16>(row, nb, cs, a, p.lda, ahead);
      else
        lookup_band_row_avx2<MR, kFp16>(row, nb, cs, a, p.lda, ahead);
    }
    for (int b = 0; b < nb; ++b)
      for (int i = 0; i < MR; ++i)
        for (int x = 0; x < 64; ++x) {
          const float slice_sum =
              lookup_column_sum(cs[b].lanes + i * kLane, x, kFp16) + cs[b].extra[i * 64 + x];
          float& t = cs[b].total[i * 64 + x];
          t = s0 == 0 ? slice_sum : t + slice_sum;
        }
  }
  for (int b = 0; b < nb; ++b)
    write_chunk_rows(p, ch0 + b, m0, MR, per_channel ? cs[b].chan_scale : nullptr, cs[b].total);
}

// lookup_order_band_avx2 for `rows` (1 .. kDecodePathMaxRows) rows.
W4K_W4A16_AVX2 inline void lookup_order_band_avx2(const W4a16GemmProblem& p, int64_t ch0, int nb,
                                                  int64_t m0, int64_t rows,
                                                  const int32_t* tile_group, bool any_mixed_tile,
                                                  const AbsRange& act,
                                                  std::vector<float>& scratch) {
  static_assert(kDecodePathMaxRows == 8, "one case per row count");
  const bool fp16 = p.weight_type == HalfType::kFloat16;
#define W4K_LOOKUP_CASE(n)                                                                     \
  case n:                                                                                      \
    if (fp16)                                                                                  \
      lookup_order_band_avx2<n, true>(p, ch0, nb, m0, tile_group, any_mixed_tile, act,         \
                                      scratch);                                                \
    else                                                                                       \
      lookup_order_band_avx2<n, false>(p, ch0, nb, m0, tile_group, any_mixed_tile, act,        \
                                       scratch);                                               \
    break;
  switch (rows) {
    W4K_LOOKUP_CASE(1) W4K_LOOKUP_CASE(2) W4K_LOOKUP_CASE(3) W4K_LOOKUP_CASE(4)
    W4K_LOOKUP_CASE(5) W4K_LOOKUP_CASE(6) W4K_LOOKUP_CASE(7) W4K_LOOKUP_CASE(8)
    default: break;
  }
#undef W4K_LOOKUP_CASE
}
#endif

// The blocked path's outputs of chunk ch, rows [m0, m0 + rows): sums[i][x] (wbuf column order)
// through the epilogue into p.c, or (p.out16) into row_tmp and rounded from there.
inline void write_chunk_out(const W4a16GemmProblem& p, int64_t ch, int64_t m0, int64_t rows,
                            const float* chan_scale, const float* sums, bool avx512) {
  alignas(64) float row_tmp[64];
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t out_at = (m0 + i) * p.size_n + 64 * ch;
    float* c_row = p.out16 ? row_tmp : p.c + out_at;
    const float* bias = p.bias ? p.bias + 64 * ch : nullptr;
#ifdef W4K_HAVE_AVX512_PATH
    if (avx512 && chan_scale == nullptr)
      write_chunk_row_grouped_avx512(sums + i * 64, bias, c_row);
    else
#endif
      write_chunk_row(p, ch, chan_scale, sums + i * 64, c_row);
    if (p.out16) narrow_c_row(row_tmp, 64, p.weight_type, avx512, p.out16 + out_at);
  }
}

#ifdef W4K_HAVE_AMX_PATH
// The blocked bf16 path on AMX tiles (amx_bf16.h), for chunks [chunk_begin, chunk_end) x rows
// [m0, m0 + rows). The weights are decoded exactly as on the vdpbf16ps path (pair rows; table
// lookups for one-group k-tiles, the fp32 decode for the others); the loops: k-blocks of 256
// rows outside (a's 256-column slice, rows x 512 bytes, stays in L2 for every chunk of the
// item), chunks inside, each decoded (32 KiB of pair rows) and multiplied by every row block
// while its pairs are in L1. Every chunk's accumulators (rows x 64 fp32) persist across the
// k-blocks. Measured 2026-11-27 (11008 x 4096, bf16 g128, one thread, min of 4-5 calls, a noisy
// machine): M = 256 74 ms with the vdpbf16ps path's order (chunks outside: a read from L3 once per
// chunk) -> 40 (64-byte aligned buffers: tile rows split across two lines had halved the tiles'
// rate) -> 32-34 (this order; all chunks decoded before the tiles run: 40); M = 16 8.3, level
// with the others. Decoding the next chunk while the tiles multiply the last (two buffers) and
// k-blocks of 128 or 512 rows were no faster.
inline void w4a16_amx_chunks(const W4a16GemmProblem& p, int64_t chunk_begin, int64_t chunk_end,
                             int64_t m0, int64_t rows, const int32_t* tile_group, bool pair_lut) {
  constexpr int64_t kKc = 256, kPairWords = kKc / 2 * 64;
  const int64_t nch = chunk_end - chunk_begin, num_tiles = p.size_k / 16;
  const int64_t gstride = p.num_groups * 64;
  const bool has_zp = p.zeros != nullptr, per_channel = p.num_groups == 1;
  // fp16: a as split rows (p.a_split(), amx_split_row; m0 a multiple of 8), and the grouped
  // weights split too (amx_split_half); per channel the weights q - z are integers, exact in
  // bf16 (no lo part).
  const bool split_w = p.a_split() && !per_channel;
  const int64_t tile_rows = p.a_split() ? amx_split_tile_rows(rows) : rows;
  const int64_t a_row0 = p.a_split() ? amx_split_row(m0, 0) : m0;
  const int64_t tbl_entries = split_w ? 2048 : 1024;  // per chunk: the hi and lo tables
  const bool any_mixed = std::any_of(tile_group, tile_group + num_tiles,
                                     [](int32_t g) { return g < 0; });
  // fp32 scales / zero points (decode_chunk_groups) where the fp32 decode or the per-channel
  // epilogue needs them
  const bool fp32_groups = !pair_lut || per_channel || any_mixed;
  // Scratch kept per thread and grown, never shrunk (as the binding's and awq_gemm's): at
  // M = 256 an item's accumulators are 720 KiB, which fresh vectors took as new pages from the
  // OS on every call (page faults and page zeroing led a perf profile; 11008 x 4096, one thread:
  // 33.6 -> 28.6 ms). The largest item a thread ran stays allocated: rows x 64 x 4 bytes per
  // chunk of the item (11.5 MB at M = 4096, 11 chunks).
  struct Scratch {
    std::vector<float> sc, zf, chan;
    Vector64<uint32_t> pairs;  // one chunk's k-block of pair rows
    Vector64<float> acc;       // every chunk's accumulators, rows x 64 each
    std::vector<uint16_t> tbl;  // each chunk's pair table (16 x 64 entries)
    std::vector<int64_t> tbl_group;  // the group it holds
  };
  thread_local Scratch scratch;
  auto grow = [](auto& v, size_t n) {
    if (v.size() < n) v.resize(n);
  };
  grow(scratch.sc, fp32_groups ? nch * gstride : 0);
  grow(scratch.zf, fp32_groups && has_zp ? nch * gstride : 0);
  grow(scratch.chan, per_channel ? nch * 64 : 0);
  grow(scratch.pairs, (split_w ? 2 : 1) * kPairWords);  // hi pair rows, then lo
  grow(scratch.acc, nch * tile_rows * 64);
  grow(scratch.tbl, nch * tbl_entries);
  scratch.tbl_group.assign(nch, -1);
  std::fill(scratch.acc.begin(), scratch.acc.begin() + nch * tile_rows * 64, 0.0f);
  std::vector<float>& sc = scratch.sc;
  std::vector<float>& zf = scratch.zf;
  std::vector<float>& chan = scratch.chan;
  Vector64<uint32_t>& pairs = scratch.pairs;
  Vector64<float>& acc = scratch.acc;
  std::vector<uint16_t>& tbl = scratch.tbl;
  std::vector<int64_t>& tbl_group = scratch.tbl_group;
  if (fp32_groups)
    for (int64_t c = 0; c < nch; ++c)
      decode_chunk_groups(p, chunk_begin + c, sc.data() + c * gstride,
                          has_zp ? zf.data() + c * gstride : nullptr,
                          per_channel ? chan.data() + c * 64 : nullptr);
  const float* srow[16];
  const float* zrow[16];
  AmxTileScope amx_tiles(true);
  for (int64_t kb = 0; kb < p.size_k; kb += kKc) {
    const int64_t kc = std::min(kKc, p.size_k - kb);
    for (int64_t c = 0; c < nch; ++c) {
      const int64_t ch = chunk_begin + c;
      for (int64_t k0 = kb; k0 < kb + kc; k0 += 16) {
        const int64_t kt = k0 / 16;
        const int32_t* words = p.b_q_weight + kt * 2 * p.size_n + 128 * ch;
        // k-tiles are 8 N bytes apart, a stride the hardware prefetchers miss: the tile one
        // k-block ahead into L2, and two tiles ahead into L1 (as the vdpbf16ps path does)
        if (k0 + kKc < p.size_k)
          for (int l = 0; l < 8; ++l)
            __builtin_prefetch(words + (kKc / 16) * 2 * p.size_n + 16 * l, 0, 2);
        if (k0 + 32 < kb + kc)
          for (int l = 0; l < 8; ++l) __builtin_prefetch(words + 2 * 2 * p.size_n + 16 * l, 0, 3);
        uint32_t* dst = pairs.data() + (k0 - kb) / 2 * 64;
        uint32_t* dst_lo = dst + kPairWords;
        const int64_t g = tile_group[kt];
        if (g >= 0 && pair_lut) {  // one group: table lookups
          uint16_t* t = tbl.data() + c * tbl_entries;
          if (g != tbl_group[c]) {
            const uint16_t* s_row = per_channel ? nullptr : p.scales + g * p.size_n + 64 * ch;
            const int32_t* z_words = has_zp ? p.zeros + g * (p.size_n / 8) + 8 * ch : nullptr;
            if (split_w) build_pair_table_avx512<true, false, true>(s_row, z_words, t);
            else build_pair_table_avx512<false>(s_row, z_words, t);
            tbl_group[c] = g;
          }
          decode_tile_pairs_lut_avx512(words, t, dst);
          if (split_w) decode_tile_pairs_lut_avx512(words, t + 1024, dst_lo);
          continue;
        }
        tile_row_groups(p, kt, sc.data() + c * gstride, has_zp ? zf.data() + c * gstride : nullptr,
                        srow, zrow);
        if (split_w && has_zp)
          dequant_tile_pairs_avx512<true, true>(words, srow, zrow, dst, dst_lo);
        else if (split_w)
          dequant_tile_pairs_avx512<false, true>(words, srow, zrow, dst, dst_lo);
        else if (has_zp) dequant_tile_pairs_avx512<true>(words, srow, zrow, dst);
        else dequant_tile_pairs_avx512<false>(words, srow, zrow, dst);
      }
      // the chunk's products, every row block, while its pair rows are in L1
      amx_bf16_rows(p.a_bf16 + a_row0 * p.lda_bf16 + kb, p.lda_bf16, pairs.data(), kc,
                    acc.data() + c * tile_rows * 64, tile_rows,
                    split_w ? pairs.data() + kPairWords : nullptr,
                    /*a_rows16=*/ true);  // a_bf16 has kAmxPadRows rows past M
    }
  }
  for (int64_t c = 0; c < nch; ++c) {
    float* sums = acc.data() + c * tile_rows * 64;
    if (p.a_split()) amx_fold_split_rows(sums, rows);
    write_chunk_out(p, chunk_begin + c, m0, rows, per_channel ? chan.data() + c * 64 : nullptr,
                    sums, true);
  }
}
#endif

// Which path w4a16_gemm_cpu_chunks takes for a work item of `rows` rows of a (the binding asks
// too: the blocked path writes its outputs rounded, and the vdpbf16ps one needs no fp32 a).
struct W4a16RowPaths {
  // bf16 activations: two k-rows per vdpbf16ps on bf16 weight pairs (decode and blocked paths).
  bool use_dpbf16;
  // Few rows: decoding dominates, and the lookup-table path decodes 16 weights per vpermps.
  // Measured crossover (one core, K = N = 4096): ~8 rows against the fp32 blocked path (with
  // vdpbf16ps the blocked path wins at every M above the decode path's).
  bool use_lut;
  // Few rows: the in-place decode (w4a16_gemm_decode_avx512.h: bf16 pairs for vdpbf16ps, or
  // fp16 widened to fp32) streams the weight faster than the lookup tables. (bf16 without
  // AVX512-BF16: vdpbf16ps emulated by two FMAs, pair_chunks_avx512 kEmu)
  bool use_pairs;
  // The decode path's rows on the portable and AVX2 paths: the AVX-512 decode path's summation
  // order (decode_order_chunk), so that they give its bits.
  bool decode_order;
  // fp16 at the rows where AVX-512 takes its lookup tables (5..8): their order (lut_order_chunk).
  bool lut_order;
  // The blocked bf16 path on a CPU with AMX tiles (w4a16_amx_chunks).
  bool use_amx;
  // None of the above: the blocked path (a k-block of a chunk dequantized once, then
  // register-blocked vdpbf16ps or FMAs over all the rows).
  bool blocked() const { return !use_lut && !use_pairs && !decode_order && !lut_order; }
};

// has_a_bf16: a is also given as bf16 (p.a_bf16; the binding does that for bf16 activations,
// and for fp16 ones on AMX as hi and lo parts, w4a16_gemm_fp16_split).
inline W4a16RowPaths w4a16_gemm_row_paths(const W4a16GemmProblem& p, int64_t rows, CpuIsa isa,
                                          bool has_a_bf16) {
  const bool avx512 = is_avx512(isa);
  const bool fp16 = p.weight_type == HalfType::kFloat16;
  const bool tiles_ok = p.g_idx != nullptr || p.group_size % 16 == 0;
  W4a16RowPaths r;
  r.use_dpbf16 = isa == CpuIsa::kAvx512Bf16 && !fp16 && has_a_bf16;
  // AMX tiles: bf16 activations as they are, fp16 ones split into two bf16 (the binding then
  // gives their hi and lo parts as a_bf16 and a_lo: has_a_bf16).
  const bool amx = isa == CpuIsa::kAvx512Bf16 && has_a_bf16 && amx_bf16_enabled();
  r.use_lut = avx512 && tiles_ok && rows <= w4a16_gemm_lut_max_rows(fp16, amx);
  r.use_pairs = avx512 && (fp16 || has_a_bf16) && tiles_ok &&
                rows <= w4a16_gemm_pair_max_rows(amx, fp16);
  r.decode_order = !avx512 && decode_order_applies(p);
  r.lut_order = !avx512 && !r.decode_order && fp16 && tiles_ok &&
                rows > w4a16_gemm_pair_max_rows() && rows <= w4a16_gemm_lut_max_rows(true);
  r.use_amx = amx && r.blocked();
  return r;
}

// c[m0:m1, chunk columns] (+ bias) for every 64-column chunk in [chunk_begin, chunk_end), on
// the path w4a16_gemm_row_paths picks: the AVX-512 decode or lookup-table paths (few rows), the
// blocked path (dequantize 64 or 256 rows of K x 64 columns, then register-blocked FMAs;
// vdpbf16ps for bf16), or, below AVX-512, portable C++ (or its AVX2 twin, w4a16_gemm_avx2.h)
// with the same bits. Outputs go to p.c as fp32, except on the blocked path with p.out16 set.
// Returns 0 (no failure mode once the binding has checked the arguments).
inline int w4a16_gemm_cpu_chunks(const W4a16GemmProblem& p, int64_t chunk_begin,
                                 int64_t chunk_end, int64_t m0, int64_t m1, CpuIsa isa) {
  const int64_t rows = m1 - m0;
  const bool has_zp = p.zeros != nullptr;
  float chan_scale_buf[64];
  float* chan_scale = p.num_groups == 1 ? chan_scale_buf : nullptr;  // per-channel epilogue
  const float* srow[16];
  const float* zrow[16];
  const bool avx512 = is_avx512(isa);
  const bool avx2 = isa == CpuIsa::kAvx2;
  const W4a16RowPaths paths = w4a16_gemm_row_paths(p, rows, isa, p.a_bf16 != nullptr);
  const bool use_dpbf16 = paths.use_dpbf16;
  // bf16 activations on the fp32 blocked paths: each k-pair's products added odd row first, as
  // vdpbf16ps does, so that a CPU with and one without AVX512-BF16 (and the AVX2 and portable
  // paths) give the same bits (micro_generic).
  const bool bf16_pairs = p.weight_type == HalfType::kBFloat16;
  // Rows of K per dequantized block. fp32: 64 x 64 fp32 = 16 KiB (half of L1). bf16 pairs,
  // above 32 rows of a: 256 rows = 128 pair rows x 64 columns x 4 bytes = 32 KiB, so every
  // load/store of the 6 x 64 accumulators is spread over 128 k-pairs x 24 vdpbf16ps; up to 32
  // rows, 64 (8 KiB: the block stays in L1 next to the rows of a while the few row blocks
  // read it). Measured 2026-11-24 (2 threads, weights rotated, the sizes alternating in one
  // process, medians), 4096 x 4096 / 11008 x 4096, ms for 256 / 64 rows: M = 8 1.66 / 1.28 and
  // 4.02 / 3.05; M = 16 2.17 / 1.95 and 5.64 / 5.28; M = 32 3.43 / 3.29 and 9.12 / 8.95;
  // M = 64 5.95 / 6.08 and 15.8 / 16.1; M = 256 21.2 / 21.8 and 58.7 / 60.5.
  const int64_t kKc = use_dpbf16 && rows > 32 ? 256 : 64;
  // The vdpbf16ps path decodes one-group k-tiles by table lookups
  // (decode_tile_pairs_lut_avx512); W4K_W4A16_PAIR_LUT=0 computes every weight in fp32 instead
  // (dequant_tile_pairs_avx512: the same values, so the same bits; tests compare the two).
  const bool fp16 = p.weight_type == HalfType::kFloat16;
  const bool use_lut = paths.use_lut, use_pairs = paths.use_pairs;
  const bool decode_order = paths.decode_order, lut_order = paths.lut_order;
  // (p.out16 is for the blocked path only; the binding sets it only where that runs.)
  std::vector<float> lut, lut_acc;
  std::vector<int32_t> tile_group;  // group of each k-tile, -1 if its rows span groups
  // bf16 on AVX-512 without BF16, blocked path: one-group k-tiles decoded by the vdpbf16ps path's
  // table lookups (tables rounded without BF16 instructions), split into fp32 rows.
  const char* lut_env = std::getenv("W4K_W4A16_PAIR_LUT");
  const bool pair_lut = !(lut_env && std::strcmp(lut_env, "0") == 0);
  const bool emu_lut = avx512 && !use_dpbf16 && !fp16 && pair_lut;
  if (use_lut || use_pairs || use_dpbf16 || decode_order || lut_order || emu_lut ||
      paths.use_amx) {
    tile_group.resize(p.size_k / 16);
    for (int64_t kt = 0; kt < p.size_k / 16; ++kt) {
      if (p.g_idx == nullptr) {
        tile_group[kt] = static_cast<int32_t>(16 * kt / p.group_size);
      } else {
        const int32_t* g = p.g_idx + 16 * kt;
        tile_group[kt] = std::all_of(g, g + 16, [&](int32_t x) { return x == g[0]; }) ? g[0] : -1;
      }
    }
  }
#ifdef W4K_HAVE_AMX_PATH
  if (paths.use_amx) {  // bf16 on a CPU with AMX tiles: its own loops
    w4a16_amx_chunks(p, chunk_begin, chunk_end, m0, rows, tile_group.data(), pair_lut);
    return 0;
  }
#endif
  std::vector<float> sc(p.num_groups * 64), zf(has_zp ? p.num_groups * 64 : 0);
  std::vector<float> wbuf(kKc * 64), acc(rows * 64);
#ifdef W4K_HAVE_AVX512_PATH
  if (use_pairs) {
    const bool any_mixed_tile =
        std::any_of(tile_group.begin(), tile_group.end(), [](int32_t g) { return g < 0; });
    PairScratch scratch;
    if (fp16)
      pair_chunks_avx512<true>(p, chunk_begin, chunk_end, m0, rows, tile_group.data(),
                               any_mixed_tile, scratch, 0, p.size_k / 16, nullptr);
    else if (!use_dpbf16)
      pair_chunks_avx512<false, true>(p, chunk_begin, chunk_end, m0, rows, tile_group.data(),
                                      any_mixed_tile, scratch, 0, p.size_k / 16, nullptr);
    else if (rows >= w4a16_fma_min_rows())
      pair_chunks_avx512<false, true, true>(p, chunk_begin, chunk_end, m0, rows,
                                            tile_group.data(), any_mixed_tile, scratch, 0,
                                            p.size_k / 16, nullptr);
    else
      pair_chunks_avx512<false>(p, chunk_begin, chunk_end, m0, rows, tile_group.data(),
                                any_mixed_tile, scratch, 0, p.size_k / 16, nullptr);
    return 0;
  }
#endif
  if (decode_order || lut_order) {
    std::vector<float> order_scratch;
#ifdef W4K_HAVE_AVX2_W4A16_PATH
    if (avx2 && decode_order && rows <= kDecodePathMaxRows && w4a16_avx2_lookup_enabled()) {
      const bool any_mixed_tile =
          std::any_of(tile_group.begin(), tile_group.end(), [](int32_t g) { return g < 0; });
      const int band = lookup_band_chunks(rows, fp16);
      AbsRange act;
      for (int64_t i = 0; i < rows; ++i) abs_range_avx2(p.a + (m0 + i) * p.lda, p.size_k, act);
      for (int64_t ch = chunk_begin; ch < chunk_end; ch += band)
        lookup_order_band_avx2(p, ch, static_cast<int>(std::min<int64_t>(band, chunk_end - ch)),
                               m0, rows, tile_group.data(), any_mixed_tile, act, order_scratch);
      return 0;
    }
#endif
    auto decode = [&](const int32_t* words, const float* const* srow, const float* const* zrow,
                      float* wtile) {
      dequant_tile_generic(words, srow, zrow, p.weight_type, wtile);
    };
    for (int64_t ch = chunk_begin; ch < chunk_end; ++ch) {
      decode_chunk_groups(p, ch, sc.data(), has_zp ? zf.data() : nullptr, chan_scale);
      const float* z = has_zp ? zf.data() : nullptr;
      const int32_t* tg = tile_group.data();
#ifdef W4K_HAVE_AVX2_W4A16_PATH
      if (avx2) {
        if (lut_order)
          order_chunk_avx2<true>(p, ch, m0, rows, tg, sc.data(), z, chan_scale, order_scratch);
        else
          order_chunk_avx2<false>(p, ch, m0, rows, tg, sc.data(), z, chan_scale, order_scratch);
        continue;
      }
#endif
      if (lut_order)
        lut_order_chunk(p, ch, m0, rows, tg, sc.data(), z, chan_scale, decode, lut_lanes_generic,
                        order_scratch);
      else
        decode_order_chunk(p, ch, m0, rows, tg, sc.data(), z, chan_scale, decode,
                           decode_lanes_generic, order_scratch);
    }
    return 0;
  }
  (void)use_lut;
  (void)use_pairs;
  (void)use_dpbf16;
  (void)pair_lut;
  (void)avx2;  // all unused when the AVX-512 paths are compiled out
  // vdpbf16ps path: the pair tables of the current group (build_pair_table_avx512).
  alignas(64) uint16_t pair_tbl[16 * 64];
  (void)pair_tbl;
  // The table decode reads the scales and zero points itself; the fp32 ones
  // (decode_chunk_groups) are needed by the lookup-table path, for the epilogue's per-channel
  // scales and for k-tiles whose rows span groups (act-order), which the fp32 decoder handles.
  const bool lut_decode = (use_dpbf16 && pair_lut) || emu_lut;
  const bool fp32_groups =
      !lut_decode || use_lut || chan_scale != nullptr ||
      std::any_of(tile_group.begin(), tile_group.end(), [](int32_t g) { return g < 0; });
  for (int64_t ch = chunk_begin; ch < chunk_end; ++ch) {
    if (fp32_groups) decode_chunk_groups(p, ch, sc.data(), has_zp ? zf.data() : nullptr, chan_scale);
    int64_t tbl_group = -1;  // the group pair_tbl holds (tables are per chunk)
    (void)tbl_group;
#ifdef W4K_HAVE_AVX512_PATH
    if (use_lut) {
      const float* z = has_zp ? zf.data() : nullptr;
      if (p.weight_type == HalfType::kFloat16)
        lut_chunk_avx512<true>(p, ch, m0, rows, sc.data(), z, chan_scale, tile_group.data(), lut,
                               lut_acc);
      else
        lut_chunk_avx512<false>(p, ch, m0, rows, sc.data(), z, chan_scale, tile_group.data(), lut,
                                lut_acc);
      continue;
    }
#endif
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t kb = 0; kb < p.size_k; kb += kKc) {
      const int64_t kc = std::min(kKc, p.size_k - kb);
      for (int64_t k0 = kb; k0 < kb + kc; k0 += 16) {
        auto set_group_rows = [&] {  // each row's fp32 scales and zero points
          tile_row_groups(p, k0 / 16, sc.data(), has_zp ? zf.data() : nullptr, srow, zrow);
        };
        const int32_t* words = p.b_q_weight + (k0 / 16) * 2 * p.size_n + 128 * ch;
        float* w_tile = wbuf.data() + (k0 - kb) * 64;
#ifdef W4K_HAVE_AVX512_PATH
        if (use_dpbf16 || emu_lut) {
          // Consecutive k-tiles of a chunk are 8 * size_n bytes apart, a stride the hardware
          // prefetchers do not follow: fetch the tile one k-block ahead (8 lines of 64 bytes).
          // And into L1 two tiles ahead: the decode waited on these loads from L2 (a third of
          // its samples; M = 256 one thread, perf). Its share of the op went 3.3-3.7 -> 2.2-2.4 %
          // (M = 256) and M = 64 took 1-6 % less (4096 x 4096, 11008 x 4096, one thread).
          if (k0 + kKc < p.size_k)
            for (int l = 0; l < 8; ++l)
              __builtin_prefetch(words + (kKc / 16) * 2 * p.size_n + 16 * l, 0, 2);
          if (k0 + 32 < kb + kc)
            for (int l = 0; l < 8; ++l) __builtin_prefetch(words + 2 * 2 * p.size_n + 16 * l, 0, 3);
          uint32_t* pairs = reinterpret_cast<uint32_t*>(wbuf.data()) + (k0 - kb) / 2 * 64;
          const int64_t g = tile_group[k0 / 16];
          if (g >= 0 && pair_lut) {  // one group: table lookups
            if (g != tbl_group) {
              const uint16_t* s_row = chan_scale ? nullptr : p.scales + g * p.size_n + 64 * ch;
              const int32_t* z_words = has_zp ? p.zeros + g * (p.size_n / 8) + 8 * ch : nullptr;
              if (use_dpbf16) build_pair_table_avx512<false>(s_row, z_words, pair_tbl);
              else build_pair_table_avx512<false, true>(s_row, z_words, pair_tbl);
              tbl_group = g;
            }
            if (use_dpbf16) {
              decode_tile_pairs_lut_avx512(words, pair_tbl, pairs);
            } else {  // without AVX512-BF16: the pairs split into the fp32 path's rows
              alignas(64) uint32_t tile_pairs[8 * 64];
              decode_tile_pairs_lut_avx512(words, pair_tbl, tile_pairs);
              split_tile_pairs_avx512(tile_pairs, w_tile);
            }
            continue;
          }
          if (use_dpbf16) {
            set_group_rows();
            if (has_zp) dequant_tile_pairs_avx512<true>(words, srow, zrow, pairs);
            else dequant_tile_pairs_avx512<false>(words, srow, zrow, pairs);
            continue;
          }
        }
#endif
        set_group_rows();
#ifdef W4K_HAVE_AVX512_PATH
        if (avx512) {
          const bool fp16 = p.weight_type == HalfType::kFloat16;
          if (has_zp && fp16) dequant_tile_avx512<true, true>(words, srow, zrow, w_tile);
          else if (has_zp) dequant_tile_avx512<true, false>(words, srow, zrow, w_tile);
          else if (fp16) dequant_tile_avx512<false, true>(words, srow, zrow, w_tile);
          else dequant_tile_avx512<false, false>(words, srow, zrow, w_tile);
          continue;
        }
#endif
#ifdef W4K_HAVE_AVX2_W4A16_PATH
        if (avx2) {
          dequant_tile_avx2_any(words, srow, has_zp ? zrow : nullptr, fp16, chan_scale != nullptr,
                                w_tile);
          continue;
        }
#endif
        dequant_tile_generic(words, srow, has_zp ? zrow : nullptr, p.weight_type, w_tile);
      }
      const float* a_block = p.a ? p.a + m0 * p.lda + kb : nullptr;  // (none with vdpbf16ps)
#ifdef W4K_HAVE_AVX512_PATH
      if (use_dpbf16) {
        micro_bf16_avx512_rows(p.a_bf16 + m0 * p.lda_bf16 + kb, p.lda_bf16,
                               reinterpret_cast<const uint32_t*>(wbuf.data()), kc, acc.data(),
                               rows);
        continue;
      }
      if (avx512) {
        micro_avx512_rows(a_block, p.lda, wbuf.data(), kc, acc.data(), rows, bf16_pairs);
        continue;
      }
#endif
#ifdef W4K_HAVE_AVX2_W4A16_PATH
      if (avx2) {
        micro_avx2_rows(a_block, p.lda, wbuf.data(), kc, acc.data(), rows, bf16_pairs);
        continue;
      }
#endif
      micro_generic(a_block, p.lda, wbuf.data(), kc, acc.data(), rows, bf16_pairs);
    }
    write_chunk_out(p, ch, m0, rows, chan_scale, acc.data(), avx512);
  }
  return 0;
}

}  // namespace w4k::cpu