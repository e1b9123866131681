// CPU awq_gemm on AMX tiles with the weights as the A operand: the transposed product
// out^T = W^T x^T (torch-free; shares Problem and the weight numerics of awq_gemm_cpu.h), for
// bf16 activations and, split into bf16 hi and lo parts, fp16 ones (below).
//
// Why transposed. The tile path of awq_gemm_cpu.h feeds the weights as TDPBF16PS's B operand:
// a tile row there is one pair of k-rows across 16 columns, so every weight is decoded on its
// own (codes widened to fp32, an fma with its column's scale and zero point, rounded to bf16,
// the two rows of a pair interleaved): ~14 instructions per 32 weights, 3-4x the tile work at
// M = 16 (perf, 2026-11-28: the decode 69 % of the call, the tiles 24 %). Here a tile row is one
// output column n over 32 consecutive k, so all 32 weights of a row share one group and one
// column: they are looked up in that column's table of 16 bf16 values T(fma(v, s, (-z) s)),
// v = 0..15 (the rounding every other path applies, awq_gemm_cpu.h "Numerics"), by one vpermw.
// Per 32 weights: a 16-bit shift (none for a unit's first nibble), the vpermw and a store,
// plus the share of a transposition that brings each column's codes into one register:
//  * a line is the 64 bytes (16 words, 128 columns) of a row; 16 rows of it are transposed at
//    16-bit granularity (transpose16<true>, awq_gemm_cpu_lut.h): dword 2p + u of register w
//    holds 16-bit unit u of word w of rows 2p (low half) and 2p + 1 (high half);
//  * the even (unit 0) or odd (unit 1) dwords of two such 16-row transposes (rows 0..15 and
//    16..31 of a step) make one register of 32 16-bit lanes, lane k = unit u of row k: the four
//    nibbles e of that unit are columns 8w + 2e + u (AutoAWQ's nibble order {0,4,1,5,2,6,3,7});
//  * shifted right by 4e, the register's lanes index the column's table: vpermw reads 5 bits,
//    and the table is its 16 values twice over (one 32-byte load broadcast to both halves), so
//    the bit above the nibble does not matter.
// The activations are the B operand: per 16 rows of x and step of 32 k, a 16 x 16 transpose of
// bf16 pairs (tile row j = the pairs (x[m, 2j], x[m, 2j + 1]) of rows m = 0..15), built once
// per call (amx_t_x_tiles). C tiles are [16 columns][16 rows of x], transposed on the way out.
//
// fp16 (kSplit): as the other tile path does it (cpu/amx_bf16.h amx_split_half), every fp16
// value is split into bf16 hi and lo parts: x as its split rows (8-row blocks of hi then lo
// rows: one B tile holds both parts of 8 rows), each column's table as the hi and the lo parts
// of its 16 weights rounded to fp16, two lookups per 32 weights (hi and lo A rows), and per
// step the four C tiles take the hi products, then the lo ones; row m of the output is its hi
// row plus its lo row, rounded to fp16 once.
//
// Numerics: the same exact bf16 products as the other tile path, and per output the same steps
// of 32 k in k order (aligned to k = 0): a tile step pairs the same products whichever operand
// is A, so the bits are those of the other AMX path (tested), the same for every thread count.
// Runs where K and the group size are multiples of 32 (a step never straddles a group), by
// default at M = 3..64 (awq_gemm_cpu.h amx_t_applies, awq_gemm_cpu_lut.h kLutMaxMBf16AmxT).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "cpu/amx_bf16.h"
#include "cpu/awq_gemm_cpu_lut.h"

namespace w4k {
namespace awq_cpu {

#ifdef W4K_HAVE_AMX_PATH

#define W4K_AWQ_AMX_T                                                                    \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vbmi,f16c," \
                        "fma,amx-tile,amx-bf16")))

constexpr int64_t kAmxTLine = 128;   // columns per line: the 64 bytes (16 words) of a row
constexpr int64_t kAmxTStep = 32;    // k per tile step
constexpr int64_t kAmxTStrip = 128;  // k decoded per line before its products (32 KiB of A rows)
constexpr int64_t kAmxTItemLines = 4;  // lines per work item (each strip's rows: 256 bytes)
constexpr int64_t kAmxTALo = kAmxTStrip / kAmxTStep * kAmxTLine * 32;  // lo A rows: after hi
// Prefetch distance of the weight rows into L1, in rows: the next step's (the next strip's go
// into L2, amx_t_strip rows ahead: one pass of the work item over its lines).
constexpr int64_t kAmxTPrefetchL1 = kAmxTStep;
// At M <= 16 (one row block of x^T; bf16 only, fp16's split rows take two from 8 rows) the
// weight stream is the cost, and it wants long runs of each row: one work item per thread (at
// most 64 lines, 8192 columns) and strips of one 32-row step, as awq_gemm_cpu_rows.h measured.
// 2026-12-02 (AMX Xeon VM, 2 threads, weights rotated, medians of 5, bf16 g128), ms, 4 lines x
// 128-row strips -> wide items x 32-row strips: 11008 x 4096 M = 3 4.52 -> 2.42, M = 4 4.45-4.51
// -> 2.18-2.48 (64-row strips 2.68-2.93; half-width items 3.58-3.76), M = 8 4.46 -> 2.62, M = 16
// 4.47 -> 2.78; 4096 x 11008 M = 2 / 4 / 8 / 16 4.98 / 4.77 / 5.15 / 5.05 -> 3.16 / 3.02 / 2.81 /
// 2.98; 4096 x 4096 M = 16 1.94 -> 1.19. From two row blocks (M = 32, 64) the products are the
// cost and wide items only crowd L2 with their C tiles (M = 64: 6.5 -> 6.7-7.6 ms): the old
// items there. W4K_AWQ_AMX_T_LINES sets the width.
constexpr int64_t kAmxTFewStrip = kAmxTStep;
inline int64_t amx_t_strip(int64_t blocks) { return blocks == 1 ? kAmxTFewStrip : kAmxTStrip; }
inline int64_t amx_t_item_lines(int64_t blocks, int64_t size_n, int64_t threads) {
  if (const char* env = std::getenv("W4K_AWQ_AMX_T_LINES"))
    return std::clamp<int64_t>(std::atoll(env), 1, 64);
  if (blocks > 1) return kAmxTItemLines;
  return std::max(kAmxTItemLines, lines_per_thread(size_n, threads));
}

inline int64_t amx_t_row_blocks(int64_t size_m) { return (size_m + 15) / 16; }
// The B tiles of x: 16 rows x K / 2 pairs per block of 16 rows.
inline int64_t amx_t_tile_rows(const Problem& pb);
inline int64_t amx_t_x_dwords(const Problem& pb) {
  return amx_t_row_blocks(amx_t_tile_rows(pb)) * 16 * (pb.size_k / 2);
}
// Per-thread scratch floats of chunk_amx_t (tile_rows: the rows of x as B tile columns: M, or
// amx_split_tile_rows(M) for fp16).
inline int64_t amx_t_scratch_floats(int64_t tile_rows, int64_t lines) {
  return lines * amx_t_row_blocks(tile_rows) * 8 * 256  // C tiles [line][block][8][256]
         + 2 * lines * kAmxTLine * 8   // tables [line][column][16 bf16] (fp16: hi, lo)
         + 2 * kAmxTStrip / kAmxTStep * kAmxTLine * 16  // A rows [step][column][32 bf16] (+ lo)
         + 256;                                         // a transposed half step
}

// The rows of x as B tile columns: x itself (bf16), or for fp16 its split rows (pb.xs, 8-row
// blocks of hi then lo parts: cpu/amx_bf16.h amx_split_row).
inline int64_t amx_t_tile_rows(const Problem& pb) {
  return pb.xs ? cpu::amx_split_tile_rows(pb.size_m) : pb.size_m;
}

// x as B tiles for rows [16 rb, 16 rb + 16) of amx_t_tile_rows:
// xt[((rb * steps + s) * 16 + j) * 16 + i] = the bf16 pair (x[m, 32 s + 2j], x[m, 32 s + 2j + 1])
// of row m = 16 rb + i (zero past the rows). xt 64-byte aligned.
W4K_AWQ_AMX_T inline void amx_t_x_tiles(const Problem& pb, int64_t rb, uint32_t* xt) {
  const int64_t steps = pb.size_k / kAmxTStep, rows = amx_t_tile_rows(pb);
  const uint16_t* x = pb.xs ? pb.xs : pb.x;
  const int64_t ldx = pb.xs ? pb.ldxs : pb.ldx;
  for (int64_t s = 0; s < steps; ++s) {
    __m512i r[16];
    for (int i = 0; i < 16; ++i) {
      const int64_t m = 16 * rb + i;
      r[i] = m < rows ? _mm512_loadu_si512(x + m * ldx + s * kAmxTStep) : _mm512_setzero_si512();
    }
    transpose16(r);
    uint32_t* dst = xt + (rb * steps + s) * 256;
    for (int j = 0; j < 16; ++j) _mm512_store_si512(dst + 16 * j, r[j]);
  }
}

// Tables of group g for the columns [n, n + ncols) of a line (ncols <= 128, a multiple of 8):
// bf16: tab[c * 16 + v] = T(fma(v, s, (-z) * s)) of column n + c, v = 0..15; zero past ncols.
// kSplit (fp16): the weight rounded to fp16 as its bf16 hi and lo parts (cpu/amx_bf16.h
// amx_split_half): hi at tab[c * 16 + v], lo at tab[kAmxTLine * 16 + c * 16 + v].
template <bool kSplit>
W4K_AWQ_AMX_T inline void amx_t_tables(const Problem& pb, int64_t g, int64_t n, int64_t ncols,
                                       uint16_t* tab) {
  alignas(64) float s[kAmxTLine], zs[kAmxTLine];
  const int32_t* qz = pb.qzeros + g * (pb.size_n / 8) + n / 8;
  for (int64_t c0 = 0; c0 < kAmxTLine; c0 += 16) {
    const int64_t left = std::clamp<int64_t>(ncols - c0, 0, 16);  // a multiple of 8
    const __mmask16 cm = static_cast<__mmask16>((1u << left) - 1);
    const __m512 sv =
        f16_to_f32(_mm256_maskz_loadu_epi16(cm, pb.scales + g * pb.size_n + n + c0),
                   kSplit ? Dtype::kHalf : Dtype::kBFloat16);
    const __m512i z = awq_codes16(qz + c0 / 8, static_cast<int>(left / 8));
    // (-z) by a sign flip, so z = 0 gives -0 exactly as the portable (-z) * s does
    const __m512 negz = _mm512_castsi512_ps(_mm512_xor_si512(
        _mm512_castps_si512(_mm512_cvtepi32_ps(z)), _mm512_set1_epi32(INT32_MIN)));
    _mm512_store_ps(s + c0, sv);
    _mm512_store_ps(zs + c0, _mm512_mul_ps(negz, sv));
  }
  const __m512 v = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  // words 2i (column c) and 2i + 1 (column c + 1) -> word i and word 16 + i
  alignas(64) static constexpr int16_t kPack[32] = {0,  2,  4,  6,  8,  10, 12, 14, 16, 18, 20,
                                                    22, 24, 26, 28, 30, 1,  3,  5,  7,  9,  11,
                                                    13, 15, 17, 19, 21, 23, 25, 27, 29, 31};
  const __m512i kPackIdx = _mm512_load_si512(kPack);
  for (int64_t c = 0; c < kAmxTLine; c += 2) {
    __m512 e[2];
    for (int h = 0; h < 2; ++h)
      e[h] = _mm512_fmadd_ps(v, _mm512_set1_ps(s[c + h]), _mm512_set1_ps(zs[c + h]));
    if constexpr (kSplit) {
      constexpr int kRne = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
      __m512i hi[2], lo[2];
      for (int h = 0; h < 2; ++h)
        cpu::amx_split_half(_mm512_cvtph_ps(_mm512_cvtps_ph(e[h], kRne)), hi[h], lo[h]);
      // the high halves (each part's bf16 bits) of columns c and c + 1: imm 0xd8 = "c ? b : a"
      const __m512i high = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
      for (int part = 0; part < 2; ++part) {  // 16 words of column c, then 16 of column c + 1
        const __m512i* p = part ? lo : hi;
        _mm512_store_si512(tab + part * kAmxTLine * 16 + c * 16,
                           _mm512_permutexvar_epi16(
                               kPackIdx, _mm512_ternarylogic_epi32(_mm512_srli_epi32(p[0], 16),
                                                                   p[1], high, 0xd8)));
      }
    } else {
      _mm512_store_si512(tab + c * 16,
                         reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(e[1], e[0])));
    }
  }
}

// Rows [k0, k0 + kb) (kb a multiple of 32) of a line (first word w0, `words` of its 16 words
// valid) as A rows: abuf[(s * 128 + c) * 32 + i] = the bf16 weight of column c at row
// k0 + 32 s + i (kSplit: its hi part, the lo part kAmxTALo further). tbuf: 256 dwords, 64-byte
// aligned. The same line of the next strip's rows is prefetched into L2 (AutoAWQ rows are N / 2
// bytes apart: no hardware prefetcher follows them).
template <bool kSplit>
W4K_AWQ_AMX_T inline void amx_t_decode(const Problem& pb, int64_t k0, int64_t kb, int64_t w0,
                                       int64_t words, const uint16_t* tab, uint16_t* abuf,
                                       uint32_t* tbuf, int64_t ahead) {
  const int64_t ldq = pb.size_n / 8;
  const __mmask16 wmask = static_cast<__mmask16>((1u << words) - 1);
  // dword j of a step's unit register: dword 2j (unit 0) or 2j + 1 (unit 1) of the rows 0..15
  // transpose (j < 8), of the rows 16..31 one (j >= 8): lane k = row k
  const __m512i unit0 = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28,
                                          30);
  const __m512i unit1 = _mm512_add_epi32(unit0, _mm512_set1_epi32(1));
  for (int64_t s = 0; s < kb / kAmxTStep; ++s) {
    const int32_t* row = pb.qweight + (k0 + kAmxTStep * s) * ldq + w0;
    __m512i r[16];
    for (int i = 0; i < 16; ++i) r[i] = _mm512_maskz_loadu_epi32(wmask, row + i * ldq);
    transpose16<true>(r);
    for (int w = 0; w < 16; ++w) _mm512_store_si512(tbuf + 16 * w, r[w]);
    for (int i = 0; i < 16; ++i) r[i] = _mm512_maskz_loadu_epi32(wmask, row + (i + 16) * ldq);
    transpose16<true>(r);
    uint16_t* a = abuf + s * kAmxTLine * 32;
#pragma GCC unroll 16
    for (int w = 0; w < 16; ++w) {
      // spread over the lookups (in one burst with the loads they stall on the miss queue):
      // this step's rows of the next strip into L2, the next step's rows into L1
      for (int64_t i = 2 * w; i < 2 * w + 2; ++i) {
        _mm_prefetch(reinterpret_cast<const char*>(row + (i + ahead) * ldq),
                     _MM_HINT_T1);
        _mm_prefetch(reinterpret_cast<const char*>(row + (i + kAmxTPrefetchL1) * ldq),
                     _MM_HINT_T0);
      }
      const __m512i lo = _mm512_load_si512(tbuf + 16 * w);
#pragma GCC unroll 2
      for (int u = 0; u < 2; ++u) {
        const __m512i units = _mm512_permutex2var_epi32(lo, u ? unit1 : unit0, r[w]);
#pragma GCC unroll 4
        for (int e = 0; e < 4; ++e) {
          const int c = 8 * w + 2 * e + u;
          const __m512i idx = e == 0 ? units : _mm512_srli_epi16(units, 4 * e);
          for (int h = 0; h < (kSplit ? 2 : 1); ++h) {  // fp16: the hi, then the lo parts
            const __m512i t = _mm512_broadcast_i64x4(_mm256_load_si256(
                reinterpret_cast<const __m256i*>(tab + h * kAmxTLine * 16 + c * 16)));
            _mm512_store_si512(a + h * kAmxTALo + c * 32, _mm512_permutexvar_epi16(idx, t));
          }
        }
      }
    }
  }
}

// acc[t * 256 + c * 16 + i] += sum over the strip's steps of A rows (column 16 t + c) times
// the x pairs of row i, t = 0..7: C tiles 0..3 hold four column tiles at a time over the
// strip, tile 4 the x step, tiles 5 and 6 the A rows in turn (awq AmxTileScope's layout).
template <bool kSplit>
W4K_AWQ_AMX_T inline void amx_t_products(const uint16_t* abuf, int64_t steps,
                                         const uint32_t* xt, float* acc) {
  cpu::amx_stores_before_tile_load();  // the decode's A rows, the acc memset, x tiles
  for (int q = 0; q < 2; ++q) {
    float* c = acc + q * 4 * 256;
    _tile_loadd(0, c, 64);
    _tile_loadd(1, c + 256, 64);
    _tile_loadd(2, c + 512, 64);
    _tile_loadd(3, c + 768, 64);
    for (int64_t s = 0; s < steps; ++s) {
      _tile_loadd(4, xt + s * 256, 64);
      // fp16: the hi parts' products into the four C tiles, then the lo parts' (each C tile's
      // two products four apart, and in the other tile path's order: the same bits)
      for (int h = 0; h < (kSplit ? 2 : 1); ++h) {
        const uint16_t* a = abuf + h * kAmxTALo + (s * kAmxTLine + 64 * q) * 32;
        _tile_loadd(5, a, 64);
        _tile_dpbf16ps(0, 5, 4);
        _tile_loadd(6, a + 16 * 32, 64);
        _tile_dpbf16ps(1, 6, 4);
        _tile_loadd(5, a + 32 * 32, 64);
        _tile_dpbf16ps(2, 5, 4);
        _tile_loadd(6, a + 48 * 32, 64);
        _tile_dpbf16ps(3, 6, 4);
      }
    }
    _tile_stored(0, c, 64);
    _tile_stored(1, c + 256, 64);
    _tile_stored(2, c + 512, 64);
    _tile_stored(3, c + 768, 64);
  }
  cpu::amx_stores_before_tile_load();  // the next strip's decode refills abuf
}

// Columns [n_begin, n_end) of the output (n_begin a multiple of 128, the lines scratch was sized
// for, amx_t_item_lines; n_end a multiple of 8), every row: strips of the group's rows outside
// (amx_t_strip rows; their rows' pages stay in the TLB while every line of the item is read),
// lines inside.
template <bool kSplit>
W4K_AWQ_AMX_T void chunk_amx_t(const Problem& pb, const uint32_t* xt, int64_t n_begin,
                               int64_t n_end, float* scratch) {
  const int64_t blocks = amx_t_row_blocks(amx_t_tile_rows(pb)), steps = pb.size_k / kAmxTStep;
  const int64_t group_size = pb.size_k / pb.groups;
  const int64_t words_all = (n_end - n_begin) / 8, lines = (words_all + 15) / 16;
  const int64_t strip = amx_t_strip(blocks);
  float* acc = scratch;  // [line][row block][8 column tiles][16 columns][16 rows]
  uint16_t* tabs = reinterpret_cast<uint16_t*>(acc + lines * blocks * 8 * 256);
  uint16_t* abuf = tabs + 2 * lines * kAmxTLine * 16;  // tables: [line][hi, lo][...]
  uint32_t* tbuf = reinterpret_cast<uint32_t*>(abuf + 2 * kAmxTALo);
  std::memset(acc, 0, sizeof(float) * lines * blocks * 8 * 256);
  cpu::AmxTileScope amx_tiles(true);
  for (int64_t g = 0; g < pb.groups; ++g) {
    for (int64_t l = 0; l < lines; ++l)
      amx_t_tables<kSplit>(pb, g, n_begin + kAmxTLine * l,
                           std::min(kAmxTLine, n_end - n_begin - kAmxTLine * l),
                           tabs + l * 2 * kAmxTLine * 16);
    for (int64_t k0 = g * group_size; k0 < (g + 1) * group_size; k0 += strip) {
      const int64_t kb = std::min(strip, (g + 1) * group_size - k0);
      for (int64_t l = 0; l < lines; ++l) {
        amx_t_decode<kSplit>(pb, k0, kb, n_begin / 8 + 16 * l,
                             std::min<int64_t>(16, words_all - 16 * l),
                             tabs + l * 2 * kAmxTLine * 16, abuf, tbuf, strip);
        for (int64_t rb = 0; rb < blocks; ++rb)
          amx_t_products<kSplit>(abuf, kb / kAmxTStep, xt + (rb * steps + k0 / kAmxTStep) * 256,
                         acc + (l * blocks + rb) * 8 * 256);
      }
    }
  }
  // C tile (column tile t of line l, row block rb): [16 columns][16 rows] -> out rows.
  for (int64_t l = 0; l < lines; ++l)
    for (int64_t rb = 0; rb < blocks; ++rb)
      for (int t = 0; t < 8; ++t) {
        const int64_t n = n_begin + kAmxTLine * l + 16 * t;
        if (n >= n_end) break;
        const __mmask16 cm = n_end - n >= 16 ? 0xFFFF : static_cast<__mmask16>(0xFF);
        const float* c = acc + ((l * blocks + rb) * 8 + t) * 256;
        __m512i r[16];
        for (int i = 0; i < 16; ++i) r[i] = _mm512_load_si512(c + 16 * i);
        transpose16(r);
        if constexpr (kSplit) {  // row 8 rb + i: its hi row i plus its lo row 8 + i
          for (int i = 0; i < 8 && 8 * rb + i < pb.size_m; ++i)
            _mm256_mask_storeu_epi16(
                pb.out + (8 * rb + i) * pb.size_n + n, cm,
                _mm512_cvtps_ph(_mm512_add_ps(_mm512_castsi512_ps(r[i]),
                                              _mm512_castsi512_ps(r[8 + i])),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        } else {
          for (int i = 0; i < 16 && 16 * rb + i < pb.size_m; ++i)
            _mm256_mask_storeu_epi16(pb.out + (16 * rb + i) * pb.size_n + n, cm,
                                     reinterpret_cast<__m256i>(
                                         _mm512_cvtneps_pbh(_mm512_castsi512_ps(r[i]))));
        }
      }
}

#endif  // W4K_HAVE_AMX_PATH

}  // namespace awq_cpu
}  // namespace w4k
