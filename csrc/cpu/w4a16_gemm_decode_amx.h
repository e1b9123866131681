// The CPU w4a16_gemm decode split (w4a16_gemm_decode_split.h) on AMX-BF16 tiles, with the weights
// as the A operand: out^T = W^T x^T (torch-free). bf16 activations at M <= 12, fp16 at M = 3..16
// (every fp16 value split into bf16 hi and lo parts, as the other tile path does: below).
//
// Why. At M = 1..4 the vdpbf16ps decode path (w4a16_gemm_decode_avx512.h) spends per 32
// weights a shift, a vpternlogd, a vpermt2w and, per row of a, a vdpbf16ps; on the Xeons with
// AMX (Sapphire / Emerald Rapids) a 512-bit vpermt2w and a vdpbf16ps each take about two
// cycles and do not overlap, so the loop is bound by them (~4.6 cycles per 32 weights at M = 1,
// ~11 at M = 4). Here the products go to TDPBF16PS, whose 16 columns of x^T cost the same at
// every M <= 16, and the vector units only look the weights up: per 32 weights half a
// vpermt2d, a vpsrlvw, a vpermw and a store. Measured on the AMX Xeon (2 threads, weights
// rotated, 7 alternating rounds, 2026-11-28), against the vdpbf16ps decode path: M = 1
// 1.10-1.18x, M = 2 1.30-1.44x, M = 4 1.90-2.08x on 4096 x 4096, 11008 x 4096, 4096 x 11008;
// against the M >= 5 tile path (weights as B): 1.3-1.7x at M = 5..12.
//
// Order (amx_decode_chunks_impl): blocks of kAmxDecodeBlockTiles k-tiles outer, the item's
// chunks inner, each chunk's four C tiles stored and reloaded between its blocks; the order
// before (each chunk over the whole 64-tile slice) read every k-tile row in 512-byte runs while
// 64 rows were in flight, which the memory of the AMX Xeon VM served at ~0.8x (below).
//
// A tile row = one output column n over one step of 32 k (two k-tiles kt, kt + 1; kt even),
// dword p = the bf16 pair (w[2p], w[2p + 1]) of k = 32 s + 2p, so the 16 dwords are the
// natural k order. Marlin's chunk words (w4a16_gemm_decode_avx512.h's header): line c of
// k-tile kt is words 16c .. 16c + 15, lane L = 4t + j, and a 16-bit shift by 4e' (e' = h + 2 b2)
// puts in the two halves of the lane the pair (2t + 8h, 2t + 8h + 1) of column 16j + c + 8 b2.
// So dword p = 8 kt' + 4h + t of the row of column (j, c, b2) comes from lane 4t + j of line c
// of tile kt + kt': one vpermt2d of the two tiles' line c gathers the 16 words of a column pair
// (b2 = 0, 1), a vpsrlvw by 4h + 8 b2 per lane brings each pair's codes to the low bits, and a
// vpermw looks the 16-bit weights up in the column's table of 16 bf16 values (the decode path's
// pair tables, build_pair_table_avx512: 32 contiguous bytes per column and group) broadcast to
// both halves of the register, so bit 4 of the index (the next nibble's) does not matter. A
// step whose two tiles lie in different groups looks up [T(g0) | T(g1)] with bit 4 set to the
// tile. Rows c + 8 b2 of A tile j are the columns 16j + c + 8 b2 = 16j .. 16j + 15 in order.
//
// B tile of step s (x^T): row p, dword m = (x[m, 32s + 2p], x[m, 32s + 2p + 1]) for m < M;
// its other columns only feed C columns that are not read. C tile j: [16 columns 16j + r][16
// columns m]. A last step of one k-tile (K / 16 odd) zeroes the A dwords of the missing tile
// (masked lookup) and x^T's rows past K, so nothing but zeros meets there.
//
// fp16: the weights rounded to fp16 and split into hi and lo parts (build_pair_table_avx512's
// kSplit tables: two lookups per A row), x^T's columns 0..7 the hi parts of the rows and 8..15
// their lo parts (amx_decode_x_tiles_split), per step the four hi A tiles' products, then the
// four lo ones into the same C tiles (per channel the lo parts are zero: no lo tiles), and each
// output its hi column plus its lo column: the products and the order of the tile path with the
// weights as B (cpu/amx_bf16.h amx_split_half), so where that path runs the same checks hold
// (no infinite activation, scales of at most 4096: W4a16GemmProblem::amx_split_ok).
//
// Numerics: the exact bf16 products of the contract, summed in fp32 by TDPBF16PS per 32-k step
// (its own order, cpu/amx_bf16.h), the steps of a slice of K in k order in the C tiles, the
// slices then added in slice order (w4a16_gemm_decode_split.h): within a slice (K <= 1024) the
// bits of the tile path with the weights as B (a step pairs the same products whichever operand
// is A; tested), over several slices the slices' sums added (that path chains all of K); not
// the vdpbf16ps chain's; the same for every thread count.
//
// Loop: per work item (a slice of K x a range of chunks), blocks of k-tiles outer, chunks and
// passes inner; a chunk's four C tiles stay in tile registers over a block and wait in cstore
// between blocks. The work is a flat software pipeline over steps: the four A tiles of step s
// are decoded into one half of an 8 KiB buffer, then the products of step s - 1 (the other
// half) are taken, so no tile load reads bytes just stored, and the C tiles are switched
// (stored, then zeroed or reloaded) only after those products, so the tile unit has a step
// queued while the next chunk's first step is decoded (2026-12-05: 4096 x 4096 bf16 M = 1-4
// 6-15% faster than switching before the decode, fp16 M = 4 17%, larger shapes the same).
// The next chunk's tiles of the step are prefetched into L2 (512 bytes further in the rows).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cpu/amx_bf16.h"
#include "cpu/w4a16_gemm_decode_avx512.h"

#if defined(W4K_HAVE_AMX_PATH) && defined(W4K_HAVE_AVX512_PATH)
#define W4K_HAVE_W4A16_AMX_DECODE 1
#endif

namespace w4k::cpu {

#ifdef W4K_HAVE_W4A16_AMX_DECODE

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"  // GCC 12's _mm512_inserti64x4
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#define W4K_W4A16_AMX_DECODE \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16")))

constexpr int64_t kAmxDecodeStepTiles = 2;  // k-tiles per 32-k tile step
// k-tiles per block of amx_decode_chunks_impl: the item's chunks are decoded block after block,
// each chunk's C tiles stored and reloaded between its blocks, so that while a block lasts every
// k-tile row is read in runs of the item's chunks (half of N here) instead of 512 bytes.
// Measured 2026-12-02 (AMX Xeon VM, 2 threads, weights rotated, bf16 GPTQ g128, 3 rounds
// alternating in fresh processes), x the whole-slice order (64 k-tiles per chunk, the order
// before): M = 1 1.17-1.23 / 1.20-1.27 / 1.13-1.23 on 4096 x 4096 / 11008 x 4096 / 4096 x 11008,
// M = 2 / 4 / 12 on 11008 x 4096 1.17 / 1.29 / 1.17; blocks of 2 / 4 / 12 / 16 / 32 k-tiles were
// slower than 8 (0.69 / 0.78 / ~0.93 / 0.77 / 0.8x), and items twice as wide or half as wide
// level with today's. W4K_W4A16_AMX_BLOCK sets it (even; 0: the whole slice; the bits do not
// depend on it: the C tiles go through memory exactly).
constexpr int64_t kAmxDecodeBlockTiles = 8;
inline const int64_t kAmxDecodeBlockEnv = [] {
  const char* env = std::getenv("W4K_W4A16_AMX_BLOCK");
  if (!env) return kAmxDecodeBlockTiles;
  const int64_t v = std::atoll(env);
  return v <= 0 ? int64_t{0} : std::max<int64_t>(2, v / 2 * 2);
}();
inline int64_t amx_decode_block_tiles() { return kAmxDecodeBlockEnv; }
// Rows of a up to which the decode split runs on the tiles: its decode costs the same at every M
// up to 16 (the tile columns), the M >= 5 tile path (weights as B, all of K per item) decodes
// more per weight. Measured (2 threads, rotated weights, 9 alternating rounds, 2026-11-28):
// 1.3-1.7x that path at M = 5..12 on the three shapes, 0.95-1.2x at 16.
constexpr int64_t kAmxDecodeMaxRows = 12;
// fp16 (every value split into bf16 hi and lo parts, cpu/amx_bf16.h): an x^T tile holds the hi
// parts of 8 rows in columns 0..7 and their lo parts in 8..15, a second one rows 8..15 (each
// chunk then in two passes over its column halves), so at most 16 rows; and from 3 rows: the
// split doubles the lookups, the stores and the tile products, and its tables cost 3x the bf16
// ones, so at 1..2 rows the fp16 decode path (fp32 FMAs) stays ahead. Measured (2 threads,
// weights rotated, 7 alternating rounds, two runs, 2026-11-28) over the paths before: M = 1
// 0.74-0.76x, M = 2 0.88-0.89x, M = 3 1.04-1.12x, M = 4 1.05-1.36x, M = 6 1.62-1.74x, M = 8
// 1.13-1.70x, M = 9 / 12 / 16 1.33-1.59x on the three shapes.
constexpr int64_t kAmxDecodeMinRowsFp16 = 3, kAmxDecodeMaxRowsFp16 = 16;
// W4K_W4A16_AMX_DECODE_ROWS overrides the upper limits (0 turns the path off; at most 16),
// W4K_W4A16_AMX_DECODE_MIN_ROWS the lower one of fp16.
inline int64_t w4a16_amx_decode_max_rows(bool fp16) {
  const char* env = std::getenv("W4K_W4A16_AMX_DECODE_ROWS");
  return env ? std::min<int64_t>(16, std::atoll(env))
             : fp16 ? kAmxDecodeMaxRowsFp16 : kAmxDecodeMaxRows;
}
inline int64_t w4a16_amx_decode_min_rows(bool fp16) {
  const char* env = std::getenv("W4K_W4A16_AMX_DECODE_MIN_ROWS");
  return !fp16 ? 1 : env ? std::atoll(env) : kAmxDecodeMinRowsFp16;
}

// x^T tiles per 32-k step: one (bf16: 16 rows; fp16: the hi and lo parts of 8 rows), or for fp16
// at 9..16 rows two.
inline int64_t amx_decode_x_blocks(int64_t rows, bool fp16) { return fp16 && rows > 8 ? 2 : 1; }
// Dwords of the x^T buffer: 16 x 16 per tile.
inline int64_t amx_decode_x_dwords(int64_t size_k, int64_t blocks) {
  return (size_k + 31) / 32 * 256 * blocks;
}

// x^T as B tiles for every step of K: xt[s * 256 + 16p + m] = the bf16 pair of x's row m at
// k = 32s + 2p (m < rows; zero past K). Columns m >= rows are left as they are.
inline void amx_decode_x_tiles(const uint16_t* a, int64_t lda, int64_t rows, int64_t size_k,
                               uint32_t* xt) {
  const int64_t pairs = size_k / 2, steps = (size_k + 31) / 32;
  for (int64_t m = 0; m < rows; ++m) {
    const uint32_t* row = reinterpret_cast<const uint32_t*>(a + m * lda);
    for (int64_t q = 0; q < steps * 16; ++q) xt[q * 16 + m] = q < pairs ? row[q] : 0u;
  }
}

// fp16: the same from the fp32 rows a (fp16 values, exact), each split into its bf16 hi and lo
// parts (amx_split_half), in blocks of 8 rows: x^T tile b of step s holds rows 8b .. 8b + 7, the
// hi part of row 8b + i in column i, its lo part in column 8 + i:
// xt[(s * blocks + b) * 256 + 16p + 8h + i], blocks = amx_decode_x_blocks(rows, true) (rows
// <= 16).
// tmp: 2 * size_k scratch.
W4K_W4A16_AMX_DECODE inline void amx_decode_x_tiles_split(const float* a, int64_t lda,
                                                          int64_t rows, int64_t size_k,
                                                          uint16_t* tmp, uint32_t* xt) {
  const int64_t pairs = size_k / 2, steps = (size_k + 31) / 32;
  const int64_t blocks = amx_decode_x_blocks(rows, true);
  const uint32_t* parts[2] = {reinterpret_cast<const uint32_t*>(tmp),
                              reinterpret_cast<const uint32_t*>(tmp + size_k)};
  for (int64_t m = 0; m < rows; ++m) {
    for (int64_t k = 0; k < size_k; k += 16) {  // K is a multiple of 16
      __m512i hi, lo;
      amx_split_half(_mm512_loadu_ps(a + m * lda + k), hi, lo);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(tmp + k),
                          _mm512_cvtepi32_epi16(_mm512_srli_epi32(hi, 16)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(tmp + size_k + k),
                          _mm512_cvtepi32_epi16(_mm512_srli_epi32(lo, 16)));
    }
    const int64_t b = m / 8, i = m % 8;
    for (int h = 0; h < 2; ++h)
      for (int64_t q = 0; q < steps * 16; ++q)
        xt[((q / 16) * blocks + b) * 256 + (q % 16) * 16 + 8 * h + i] =
            q < pairs ? parts[h][q] : 0u;
  }
}

// One step's products with one part's A tiles (a[jl]: 16 rows of 32 bf16): kBlocks = 1: C tile
// j += A tile j x the x^T tile; kBlocks = 2 (fp16, 9..16 rows, a half of the chunk's columns):
// C tile 2 jl + b += A tile jl x x^T tile b.
// Always inlined: the fp16 forms with lo parts call it twice a step, and GCC kept it out of line
// then (a call through the PLT per part and step; tests/test_cpu_hot_loops.py found it).
template <int kBlocks>
W4K_W4A16_AMX_DECODE __attribute__((always_inline)) inline void amx_decode_products(
    const uint32_t* xt_step, const uint16_t (*a)[16 * 32]) {
  amx_stores_before_tile_load();  // the stores of a (one step ago) and of xt
  _tile_loadd(6, xt_step, 64);
  if constexpr (kBlocks == 1) {
    _tile_loadd(4, a[0], 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_loadd(5, a[1], 64);
    _tile_dpbf16ps(1, 5, 6);
    _tile_loadd(4, a[2], 64);
    _tile_dpbf16ps(2, 4, 6);
    _tile_loadd(5, a[3], 64);
    _tile_dpbf16ps(3, 5, 6);
  } else {
    _tile_loadd(7, xt_step + 256, 64);
    _tile_loadd(4, a[0], 64);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_loadd(5, a[1], 64);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  amx_stores_before_tile_load();  // before the next stores into a
}

// The shuffle constants of the decode (amx_decode_chunks_impl).
struct AmxDecodeConsts {
  __m512i gather[4];  // vpermt2d: dword p = 8 kt' + 4h + t <- lane 4t + j of tile kt'
  __m512i shift[2];   // vpsrlvw: 4h + 8 b2 for both halves of dword p (h = bit 2 of p)
  __m512i code_mask;  // the code's 4 bits in each half
  __m512i tile_bit;   // bit 4 of the index = the tile (dwords 8..15: kt' = 1)
  W4K_W4A16_AMX_DECODE AmxDecodeConsts() {
    for (int j = 0; j < 4; ++j) {
      alignas(64) int32_t v[16];
      for (int q = 0; q < 16; ++q) v[q] = 16 * (q >> 3) + 4 * (q & 3) + j;
      gather[j] = _mm512_load_si512(v);
    }
    for (int b2 = 0; b2 < 2; ++b2) {
      alignas(64) int16_t v[32];
      for (int w = 0; w < 32; ++w) v[w] = static_cast<int16_t>(4 * ((w >> 3) & 1) + 8 * b2);
      shift[b2] = _mm512_load_si512(v);
    }
    code_mask = _mm512_set1_epi32(0x000f000f);
    tile_bit = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi32(0x00100010), 1);
  }
};

// The 16-bit weights of one A row from its table(s): idx from the vpsrlvw (kTwoGroups, a step
// across two groups: bit 4 set to the tile), t0 / t1: the column's 16 entries in the tables of
// the step's first and second tile; !kTwoTiles (one tile only): its dwords 8..15 zero.
template <bool kTwoGroups, bool kTwoTiles>
W4K_W4A16_AMX_DECODE __attribute__((always_inline)) inline __m512i amx_decode_lookup(
    __m512i idx, const uint16_t* t0, const uint16_t* t1) {
  const __m256i first = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t0));
  __m512i table;
  if constexpr (kTwoGroups)
    table = _mm512_inserti64x4(_mm512_castsi256_si512(first),
                               _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t1)), 1);
  else
    table = _mm512_broadcast_i64x4(first);
  constexpr __mmask32 kFirstTile = 0x0000ffffu;  // the 16-bit lanes of dwords 0..7
  if constexpr (kTwoTiles) return _mm512_permutexvar_epi16(idx, table);
  return _mm512_maskz_permutexvar_epi16(kFirstTile, idx, table);
}

// The A tiles of one step of one chunk, columns 16j .. 16j + 15 for j = j0 .. j0 + kJ - 1:
// a[part][j - j0][row c + 8 b2] (part 1: the lo parts, kLo) from the 8 lines of the step's
// tile(s) at w0 (the second word_stride further), tables t0 / t1 (lo parts kLoTable entries
// further).
template <bool kLo, bool kTwoGroups, bool kTwoTiles, int kJ>
W4K_W4A16_AMX_DECODE __attribute__((always_inline)) inline void amx_decode_step(
    const int32_t* w0, int64_t word_stride, const uint16_t* t0, const uint16_t* t1,
    const AmxDecodeConsts& k, int j0, uint16_t (*a)[4][16 * 32]) {
  constexpr int64_t kLoTable = 1024;
  for (int c = 0; c < 8; ++c) {
    const __m512i line0 = _mm512_loadu_si512(w0 + 16 * c);
    const __m512i line1 =
        kTwoTiles ? _mm512_loadu_si512(w0 + word_stride + 16 * c) : _mm512_setzero_si512();
    for (int jl = 0; jl < kJ; ++jl) {
      const int j = j0 + jl;
      const __m512i words = _mm512_permutex2var_epi32(line0, k.gather[j], line1);
      for (int b2 = 0; b2 < 2; ++b2) {
        const int64_t col = (2 * c + b2) * 64 + 16 * j;  // the column's 16 entries
        __m512i idx = _mm512_srlv_epi16(words, k.shift[b2]);
        if constexpr (kTwoGroups)
          idx = _mm512_ternarylogic_epi32(idx, k.code_mask, k.tile_bit, 0xea);  // (A & B) | C
        const int row = c + 8 * b2;
        _mm512_store_si512(a[0][jl] + row * 32,
                           amx_decode_lookup<kTwoGroups, kTwoTiles>(idx, t0 + col, t1 + col));
        if constexpr (kLo)
          _mm512_store_si512(a[1][jl] + row * 32,
                             amx_decode_lookup<kTwoGroups, kTwoTiles>(idx, t0 + kLoTable + col,
                                                                      t1 + kLoTable + col));
      }
    }
  }
}

// Chunks [ch0, ch1) x k-tiles [kt0, kt1) (kt0 even) for rows [0, rows): the raw fp32 sums (no
// scale per channel, no bias) to part[m * size_n + 64 ch + n]. xt: amx_decode_x_tiles (fp16:
// amx_decode_x_tiles_split) of the whole K. tbl: scratch for the pair tables of one chunk
// (groups of the slice). Every tile of the range has one group (tile_group >= 0). Needs an
// AmxTileScope on this thread.
// kFp16: the weights rounded to fp16 and split into bf16 hi and lo parts (the tables of
// build_pair_table_avx512's kSplit); kLo: their lo parts are looked up and multiplied too (per
// channel they are zero: the weights are the integers q - z), after the hi parts of each step,
// as the tile path with the weights as B adds them; each output is its hi column plus its lo
// column. kBlocks = 2 (fp16 at 9..16 rows): two x^T tiles per step (rows 0..7 and 8..15), each
// chunk in two passes over the slice, one per half of its columns (2 x 2 C tiles; the second
// pass reads the lines again, from L1 or L2).
template <bool kFp16, bool kLo, int kBlocks>
W4K_W4A16_AMX_DECODE inline void amx_decode_chunks_impl(
    const W4a16GemmProblem& p, int64_t ch0, int64_t ch1, int64_t rows, int64_t kt0,
    int64_t kt1, const int32_t* tile_group, const uint32_t* xt, std::vector<uint16_t>& tbl,
    float* part) {
  const int64_t word_stride = 2 * p.size_n;
  const bool per_channel = p.num_groups == 1;
  int64_t g_first = INT64_MAX, g_last = -1;
  for (int64_t kt = kt0; kt < kt1; ++kt) {
    g_first = std::min<int64_t>(g_first, tile_group[kt]);
    g_last = std::max<int64_t>(g_last, tile_group[kt]);
  }
  constexpr int64_t kTable = kPairTable<kFp16>;
  const int64_t groups = g_last - g_first + 1, chunks = ch1 - ch0;
  // Blocks of k-tiles outer, the item's chunks inner (amx_decode_block_tiles): each k-tile row
  // is read in runs of the item's chunks (512 bytes each) while a block lasts. The tables of a
  // chunk are built once per call for every group of the slice (tbl: [chunk][group]); the C
  // tiles of a chunk are kept in cstore between its blocks.
  const int64_t block = amx_decode_block_tiles() > 0 ? amx_decode_block_tiles() : kt1 - kt0;
  tbl.resize(chunks * groups * kTable);
  thread_local std::vector<uint8_t> built;
  built.assign(chunks * groups, 0);
  thread_local Vector64<float> cstore;
  if (block < kt1 - kt0) cstore.resize(chunks * kBlocks * 4 * 256);
  const AmxDecodeConsts consts;
  // [step parity][hi, lo][tile j][row][32 bf16]
  alignas(64) uint16_t abuf[2][kLo ? 2 : 1][4][16 * 32];
  alignas(64) float cbuf[4][16 * 16];
  constexpr int kJ = 4 / kBlocks;  // 16-column tiles per pass
  // One unit = one step of one pass of one chunk. The units run in a software pipeline: unit u
  // is decoded, then the products of unit u - 1 are taken, and when u starts another chunk (or
  // pass) the C tiles are switched only then, so the tile unit always has the products of one
  // step queued while the next is decoded, across chunks and blocks alike.
  struct Unit {
    int64_t kb, ch, kt;
    int pass;
  };
  auto c_store = [&](const Unit& u) -> float* {
    return cstore.data() + ((u.ch - ch0) * kBlocks + u.pass) * 4 * 256;
  };
  // The lambdas carry the target attribute (GCC gives a lambda none of its function's), so that
  // the tile intrinsics and amx_decode_products inline into them.
  // c_start: the C tiles of u's chunk and pass into tmm0..3
  auto c_start = [&](const Unit& u) W4K_W4A16_AMX_DECODE {
    if (u.kb == kt0) {
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      return;
    }
    const float* cs = c_store(u);
    _tile_loadd(0, cs, 64);
    _tile_loadd(1, cs + 256, 64);
    _tile_loadd(2, cs + 512, 64);
    _tile_loadd(3, cs + 768, 64);
  };
  // c_finish: after the last step of u's chunk and pass in u's block
  auto c_finish = [&](const Unit& u) W4K_W4A16_AMX_DECODE {
    if (u.kb + block < kt1) {
      float* cs = c_store(u);
      _tile_stored(0, cs, 64);
      _tile_stored(1, cs + 256, 64);
      _tile_stored(2, cs + 512, 64);
      _tile_stored(3, cs + 768, 64);
      return;
    }
    _tile_stored(0, cbuf[0], 64);
    _tile_stored(1, cbuf[1], 64);
    _tile_stored(2, cbuf[2], 64);
    _tile_stored(3, cbuf[3], 64);
    // C tile jl * kBlocks + b: [column 16 (j0 + jl) + r][x^T column]; fp16: row 8b + i is hi
    // column i plus lo column 8 + i
    const int j0 = u.pass * kJ;
    for (int64_t m = 0; m < rows; ++m)
      for (int jl = 0; jl < kJ; ++jl)
        for (int r = 0; r < 16; ++r) {
          const float* c_row = cbuf[jl * kBlocks + m / 8 % kBlocks] + r * 16;
          const int64_t n = 64 * u.ch + 16 * (j0 + jl) + r;
          part[m * p.size_n + n] = kFp16 ? c_row[m % 8] + c_row[8 + m % 8] : c_row[m];
        }
  };
  auto products = [&](const Unit& u, int half) W4K_W4A16_AMX_DECODE {
    const uint32_t* xt_step = xt + u.kt / 2 * 256 * kBlocks;
    amx_decode_products<kBlocks>(xt_step, abuf[half][0]);
    if constexpr (kLo) amx_decode_products<kBlocks>(xt_step, abuf[half][kLo]);
  };
  Unit prev{};
  bool have_prev = false;
  int half = 0;
  for (int64_t kb = kt0; kb < kt1; kb += block) {
    const int64_t kbe = std::min(kt1, kb + block);
    const bool last_block = kbe == kt1;
    for (int64_t ch = ch0; ch < ch1; ++ch) {
      uint16_t* ctbl = tbl.data() + (ch - ch0) * groups * kTable;
      for (int64_t kt = kb; kt < kbe; ++kt) {
        const int64_t g = tile_group[kt];
        uint8_t& done = built[(ch - ch0) * groups + (g - g_first)];
        if (done) continue;
        build_pair_table_avx512<kFp16, false, kFp16>(
            per_channel ? nullptr : p.scales + g * p.size_n + 64 * ch,
            p.zeros ? p.zeros + g * (p.size_n / 8) + 8 * ch : nullptr,
            ctbl + (g - g_first) * kTable);
        done = 1;
      }
      const int32_t* chunk_words = p.b_q_weight + 128 * ch;
      for (int pass = 0; pass < kBlocks; ++pass) {
        const int j0 = pass * kJ;
        for (int64_t kt = kb; kt < kbe; kt += kAmxDecodeStepTiles) {
          const Unit u{kb, ch, kt, pass};
          const int32_t* w0 = chunk_words + kt * word_stride;
          const bool two_tiles = kt + 1 < kbe;
          if (pass == kBlocks - 1) {  // the next chunk's lines (or the next block's first)
            const int32_t* next = ch + 1 < ch1 ? w0 + 128 : last_block ? nullptr
                                  : p.b_q_weight + 128 * ch0 + (kt + block) * word_stride;
            if (next)
              for (int t = 0; t < (two_tiles ? 2 : 1); ++t)
                for (int l = 0; l < 8; ++l)
                  _mm_prefetch(reinterpret_cast<const char*>(next + t * word_stride + 16 * l),
                               _MM_HINT_T1);
          }
          const int64_t g0 = tile_group[kt], g1 = two_tiles ? tile_group[kt + 1] : g0;
          const uint16_t* t0 = ctbl + (g0 - g_first) * kTable;
          const uint16_t* t1 = ctbl + (g1 - g_first) * kTable;
          if (!two_tiles)
            amx_decode_step<kLo, false, false, kJ>(w0, word_stride, t0, t1, consts, j0, abuf[half]);
          else if (g1 != g0)
            amx_decode_step<kLo, true, true, kJ>(w0, word_stride, t0, t1, consts, j0, abuf[half]);
          else
            amx_decode_step<kLo, false, true, kJ>(w0, word_stride, t0, t1, consts, j0, abuf[half]);
          if (!have_prev) {
            c_start(u);
          } else {
            products(prev, half ^ 1);
            if (prev.ch != ch || prev.pass != pass || prev.kb != kb) {
              c_finish(prev);
              c_start(u);
            }
          }
          prev = u;
          have_prev = true;
          half ^= 1;
        }
      }
    }
  }
  if (have_prev) {
    products(prev, half ^ 1);
    c_finish(prev);
  }
}


inline void amx_decode_chunks(const W4a16GemmProblem& p, int64_t ch0, int64_t ch1, int64_t rows,
                              int64_t kt0, int64_t kt1, const int32_t* tile_group,
                              const uint32_t* xt, std::vector<uint16_t>& tbl, float* part) {
  const bool two = amx_decode_x_blocks(rows, true) == 2;
  auto* f = p.weight_type == HalfType::kBFloat16 ? &amx_decode_chunks_impl<false, false, 1>
            : p.num_groups == 1 ? (two ? &amx_decode_chunks_impl<true, false, 2>
                                       : &amx_decode_chunks_impl<true, false, 1>)
                                : (two ? &amx_decode_chunks_impl<true, true, 2>
                                       : &amx_decode_chunks_impl<true, true, 1>);
  f(p, ch0, ch1, rows, kt0, kt1, tile_group, xt, tbl, part);
}

#pragma GCC diagnostic pop

#endif  // W4K_HAVE_W4A16_AMX_DECODE

}  // namespace w4k::cpu
