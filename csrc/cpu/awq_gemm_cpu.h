// CPU kernel of awq_gemm: x [M, K] (fp16/bf16) times an AutoAWQ weight, read in AutoAWQ's own
// layout on every call (qweight int32 [K, N/8], qzeros int32 [G, N/8], scales [G, N]).
//
// Torch-free: raw pointers and sizes; the binding (awq.cpp) checks the tensors and runs
// chunk_avx512 / chunk_scalar (this file, the tile path) or chunk_lut / chunk_lut_scalar
// (awq_gemm_cpu_lut.h, the lookup path for M <= 8 bf16 / 7 fp16) over work items on its threads.
//
// Numerics of the tile path (README "Numerics"; identical on every ISA path, and independent of
// threads and of the K strips, because every output column is summed by one chain in one fixed
// order; the lookup path rounds the weights the same way and gives its own order there):
//   w[k, n] = T(fma(q, s, (-z) * s)),   q, z the codes, s the scale of group k / (K / G),
// where (-z) * s and q * s are exact in fp32 (a 4-bit integer times an 8- or 11-bit mantissa),
// so the fma is the exact (q - z) * s, +0 when q == z, and T() is the one rounding to the
// activation dtype (round to nearest even). Then, in fp32:
//   fp16: acc = fma(x[m, k], w[k, n], acc) for k = 0, 1, ..., K-1;
//   bf16: per pair (k, k+1), k even: acc = fma(x[k+1], w[k+1], acc); acc = fma(x[k], w[k], acc),
//         which is what vdpbf16ps computes (its bf16 x bf16 products are exact in fp32; it adds
//         the odd element first: measured on this CPU and as Intel's pseudocode states); with K
//         odd the last pair is (x[K-1], 0) x (w[K-1], 0).
// The bf16 rounding follows vcvtne2ps2bf16: RNE, a NaN made quiet, a denormal fp32 value
// flushed to a signed zero (a weight below 1.2e-38: only a denormal scale gives one). vdpbf16ps
// flushes denormal sums too; the portable path does not, so the two can differ only where a
// partial sum falls below 1.2e-38 in magnitude.
// The output is rounded once to T.
//
// Column block: 64 columns = 8 words per row. The SIMD decode reads the block's 32 bytes as
// two runs of 16 and zero-extends each byte to an int32 lane; a lane's low nibble is one column
// and its high nibble another (AutoAWQ stores column 8w + j at nibble {0,4,1,5,2,6,3,7}[j] of
// word w), so the four vectors of a row hold the columns in "lane order":
//   lane p = 16 v + l  <->  column 32 (v / 2) + 8 (l / 4) + kLaneCol[v % 2][l % 4].
// Scales and zero points are permuted into lane order once per group and block; the
// accumulators are put back into column order when the output is written.
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <algorithm>

#include "cpu/amx_bf16.h"

namespace w4k {
namespace awq_cpu {

constexpr int64_t kBlockN = 64;     // columns per block (8 words, half a 64-byte line)
constexpr int64_t kChunkBlocks = 4; // blocks per thread work item: 256 columns, 2 lines a row
// On AMX tiles from 64 rows (kAmxManyRows): 8 blocks per item, so each strip's activations
// (M x 256, in L2) serve twice the columns (awq.cpp, awq_gemm_run). Measured 2026-11-27 (2
// threads, min of 6 calls, the sizes alternating), ms for 4 / 8 / 16 blocks: 11008 x 4096 M = 64 7.27 / 7.13 /
// 6.91, M = 256 19.4 / 15.3 / 15.8; 4096 x 11008 M = 64 8.58 / 7.94 / 10.7, M = 256 30.7 / 29.8
// / 30.4; 4096 x 4096 M = 64 2.74 / 2.62 / 3.19, M = 256 5.88 / 5.35 / 5.40.
constexpr int64_t kChunkBlocksAmx = 8;
// Below this many rows on the tiles the decode is the cost: 16 blocks per item (1 KiB of each
// weight row: fewer pages per item), and the L1 prefetches of prefetch_strip_row. 2026-11-28 (2
// threads, bf16, medians of 15 calls alternating), M = 16, ms for 4 / 16 blocks: 11008 x 4096
// 8.38 / 7.69, 4096 x 11008 8.04 / 7.18, 4096 x 4096 2.73 / 2.41; 8 blocks at M = 8 and 32 within
// 3 % of 16.
constexpr int64_t kChunkBlocksAmxFewRows = 16, kAmxManyRows = 64;
// fp16 on AMX tiles (x and the weights split into bf16 hi and lo parts, four tile products per
// product) from 32 rows; below, the fp32 FMA tile path. Measured 2026-11-28 (2 threads,
// medians of 8 calls alternating, weights rotated), x speed-up of the tiles: M = 16 0.90 /
// 0.85 / 0.95 on 11008 x 4096 / 4096 x 11008 / 4096 x 4096, M = 24 1.02 / 0.95 / 1.03, M = 32
// 1.03 / 1.09 / 1.09, M = 48 1.12 / 1.18 / 1.22. (The split decode, ~10 more instructions
// per 16 weights, weighs as much as the 4x tile work.)
// W4K_AWQ_AMX_FP16_ROWS overrides it (tests run the split at every M with it). Where K and the
// group size are multiples of 32, the weights-as-A tiles take fp16 at 12..48 rows first
// (amx_t_fp16_applies below).
constexpr int64_t kAmxFp16MinRows = 32;
inline int64_t amx_fp16_min_rows() {
  const char* env = std::getenv("W4K_AWQ_AMX_FP16_ROWS");
  return env ? std::atoll(env) : kAmxFp16MinRows;
}
constexpr int64_t kStripK = 128;    // rows of K per strip (the decoded tile stays in L1)
// The AVX-512 bf16 tile path's strips: 256 rows as bf16 pairs take the 32 KiB of 128 fp32 rows,
// and spread each load / store of the 6 x 64 accumulators over twice the vdpbf16ps.
constexpr int64_t kStripKBf16 = 256;
constexpr int kLaneCol[2][4] = {{0, 4, 1, 5}, {2, 6, 3, 7}};
constexpr int kAwqNibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};  // column 8w + j is nibble kAwqNibble[j]

constexpr int lane_column(int p) {
  return 32 * (p / 32) + 8 * ((p % 16) / 4) + kLaneCol[(p / 16) % 2][p % 4];
}

enum class Dtype { kHalf, kBFloat16 };

// Rows per strip of the AVX-512 tile path for activations of type D.
template <Dtype D>
inline constexpr int64_t kTileStripRows = D == Dtype::kHalf ? kStripK : kStripKBf16;

// ---- scalar helpers (shared by every path) ---------------------------------------------------

inline float bits_to_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// fp32 -> bf16 as vcvtne2ps2bf16 does it (RNE, quiet NaN, denormal -> signed zero).
inline uint16_t round_bf16(float v) {
  const uint32_t u = float_to_bits(v);
  if (std::isnan(v)) return static_cast<uint16_t>((u >> 16) | 0x40);
  if (std::fabs(v) < std::numeric_limits<float>::min()) return static_cast<uint16_t>((u >> 16) & 0x8000);
  return static_cast<uint16_t>((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}
inline float bf16_to_float(uint16_t h) { return bits_to_float(static_cast<uint32_t>(h) << 16); }

// fp32 -> fp16 bits, RNE with denormals and NaN kept (what vcvtps2ph does).
inline uint16_t round_half(float v) {
  const uint32_t u = float_to_bits(v);
  const uint32_t sign = (u >> 16) & 0x8000;
  const uint32_t a = u & 0x7FFFFFFF;
  if (a > 0x7F800000) return static_cast<uint16_t>(sign | 0x7E00 | ((a >> 13) & 0x3FF));
  if (a >= 0x477FF000) return static_cast<uint16_t>(sign | 0x7C00);  // rounds to >= 65520: inf
  if (a < 0x38800000) {                                              // below 2^-14: denormal
    // Exact via the float adder: 0.5 (2^-1) has ulp 2^-24 = the fp16 denormal step.
    const float d = bits_to_float(a) + 0.5f;
    return static_cast<uint16_t>(sign | (float_to_bits(d) - float_to_bits(0.5f)));
  }
  const uint32_t r = a + 0xFFF + ((a >> 13) & 1) - (112u << 23);  // rebias 127 -> 15, RNE
  return static_cast<uint16_t>(sign | (r >> 13));
}
inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t e = (h >> 10) & 31, m = h & 0x3FF;
  if (e == 0) return bits_to_float(sign) + (sign ? -1.0f : 1.0f) * static_cast<float>(m) * 0x1p-24f;
  if (e == 31) return bits_to_float(sign | 0x7F800000 | (m << 13));
  return bits_to_float(sign | ((e + 112) << 23) | (m << 13));
}

template <Dtype D>
inline float to_float(uint16_t h) {
  return D == Dtype::kHalf ? half_to_float(h) : bf16_to_float(h);
}
template <Dtype D>
inline uint16_t round_to(float v) {
  return D == Dtype::kHalf ? round_half(v) : round_bf16(v);
}

// The arguments of one call; pointers to 16-bit patterns of T.
struct Problem {
  const uint16_t* x;  // [M, K], row stride ldx
  int64_t ldx;
  const int32_t* qweight;  // [K, N/8]
  const uint16_t* scales;  // [G, N]
  const int32_t* qzeros;   // [G, N/8]
  int64_t size_m, size_k, size_n, groups;
  uint16_t* out;  // [M, N], contiguous
  // fp16 on AMX tiles: x as split rows (cpu/amx_bf16.h, amx_split_row: bf16 hi and lo parts,
  // [amx_split_tile_rows(M), K], row stride ldxs), or nullptr
  const uint16_t* xs = nullptr;
  int64_t ldxs = 0;
};

// bf16 on AMX tiles up to kAmxTMaxRows rows, wherever K and the group size are multiples of
// 32: the weights as the A operand (awq_gemm_cpu_amx.h; from 3 rows, awq_gemm_cpu_lut.h
// kLutMaxMBf16AmxT). Elsewhere, and with W4K_AWQ_AMX_T=0 (tests and benchmarks compare the
// two), chunk_avx512 below; W4K_AWQ_AMX_T=1 lifts the upper row limit (tests).
// Measured 2026-11-28 (2 threads, wall clock, medians of 9 calls alternating with the other
// path and torch's F.linear, 50 ms apart, weights rotated), x speed-up over the previous
// default (the lookup path at M = 4, chunk_avx512 above): M = 4..32 1.08-1.66x on 4096 x 4096,
// 11008 x 4096 and 4096 x 11008, M = 64 1.03 / 1.06 / 1.31x; M = 128 1.07x on 4096 x 4096 but
// 0.80x on 11008 x 4096, M = 256 0.82 / 0.87x (there the decode is amortized and the other
// path's C tiles stay over 256 k, not 128).
constexpr int64_t kAmxTMaxRows = 64;
inline bool amx_t_applies(const Problem& pb) {
  const char* env = std::getenv("W4K_AWQ_AMX_T");
  if (env && std::strcmp(env, "0") == 0) return false;
  const bool rows = pb.size_m <= kAmxTMaxRows || (env && std::strcmp(env, "1") == 0);
  return rows && pb.size_k % 32 == 0 && (pb.size_k / pb.groups) % 32 == 0;
}
// fp16 on that path (x and the weights split into bf16 hi and lo parts, cpu/amx_bf16.h: the
// bits of the other tile path's split) at M = kAmxTFp16MinRows..kAmxTFp16MaxRows. Measured
// 2026-11-28 (2 threads, wall clock, medians of 7 calls alternating, 20 ms apart), x speed-up
// over the previous default (the fp32 FMA tile path below 32 rows, the split from 32) on
// 11008 x 4096 / 4096 x 11008 / 4096 x 4096: M = 8 0.94 / 1.32 / 0.92, M = 12 1.23 / 1.10,
// M = 16 1.40 / 1.28 / 1.51, M = 32 1.03 / 1.07 / 1.17, M = 48 1.06 / 1.01, M = 64 1.00 / 0.79
// / 0.96. W4K_AWQ_AMX_T_FP16_ROWS moves the lower limit, W4K_AWQ_AMX_T=1 lifts the upper one.
// 2026-12-02, with the wide items at M <= 8 (x's split rows in one block of x^T,
// awq_gemm_cpu_amx.h amx_t_item_lines; 2 threads, weights rotated, two rounds alternating in
// fresh processes, best of each), x the paths before (the lookups at M <= 7, the fp32 FMA tile
// path at 8..11) on 4096 x 4096 / 11008 x 4096 / 4096 x 11008: M = 2 1.04 / 1.08 / 1.08, M = 4
// 1.22 / 1.23 / 1.75, M = 6 1.41 / 1.63 / 1.62, M = 8 1.65 / 1.59 / 2.06, M = 10 1.32 / 1.15 /
// 1.06 (M = 1 0.90-1.01: the lookups keep it). The lower limit moved from 12 to 2.
constexpr int64_t kAmxTFp16MinRows = 2, kAmxTFp16MaxRows = 48;
inline bool amx_t_fp16_applies(const Problem& pb) {
  const char* rows = std::getenv("W4K_AWQ_AMX_T_FP16_ROWS");
  const char* env = std::getenv("W4K_AWQ_AMX_T");
  const bool forced = env && std::strcmp(env, "1") == 0;
  return pb.size_m >= (rows ? std::atoll(rows) : kAmxTFp16MinRows) &&
         (pb.size_m <= kAmxTFp16MaxRows || forced) && amx_t_applies(pb);
}

// 128-column lines per work item for one item per thread (at most 64 lines, 8192 columns): the
// row path's and the few-row weights-as-A tiles' items (awq_gemm_cpu_rows.h row_lines,
// awq_gemm_cpu_amx.h amx_t_item_lines), whose weight rows want long runs.
inline int64_t lines_per_thread(int64_t size_n, int64_t threads) {
  const int64_t all = (size_n + 127) / 128;
  return std::clamp<int64_t>((all + threads - 1) / threads, 1, 64);
}

// Per-thread scratch: sized by scratch_floats().
inline int64_t scratch_floats(int64_t size_m, int64_t chunk_blocks = kChunkBlocks) {
  return size_m * chunk_blocks * kBlockN      // accumulators of one chunk, lane order
         + kStripK * kBlockN                  // a strip: 128 fp32 rows, or 256 as bf16 pairs
         + (kStripKBf16 + 2) * 2 * kBlockN;   // scales / zero products of the strip's groups
}

// ---- portable path: the same operations, column by column ------------------------------------

template <Dtype D>
void chunk_scalar(const Problem& pb, int64_t n_begin, int64_t n_end) {
  const int64_t group_size = pb.size_k / pb.groups, words = pb.size_n / 8;
  for (int64_t n = n_begin; n < n_end; ++n) {
    const int shift = 4 * kAwqNibble[n % 8];
    for (int64_t m = 0; m < pb.size_m; ++m) {
      const uint16_t* xr = pb.x + m * pb.ldx;
      auto weight = [&](int64_t k) {
        const int64_t g = k / group_size;
        const float s = to_float<D>(pb.scales[g * pb.size_n + n]);
        const float z = static_cast<float>((static_cast<uint32_t>(pb.qzeros[g * words + n / 8]) >> shift) & 15);
        const float q = static_cast<float>((static_cast<uint32_t>(pb.qweight[k * words + n / 8]) >> shift) & 15);
        return to_float<D>(round_to<D>(std::fma(q, s, (-z) * s)));
      };
      float acc = 0.0f;
      if (D == Dtype::kHalf) {
        for (int64_t k = 0; k < pb.size_k; ++k) acc = std::fma(to_float<D>(xr[k]), weight(k), acc);
      } else {
        int64_t k = 0;
        for (; k + 2 <= pb.size_k; k += 2) {
          acc = std::fma(to_float<D>(xr[k + 1]), weight(k + 1), acc);
          acc = std::fma(to_float<D>(xr[k]), weight(k), acc);
        }
        if (k < pb.size_k) acc = std::fma(to_float<D>(xr[k]), weight(k), acc + 0.0f);
      }
      pb.out[m * pb.size_n + n] = round_to<D>(acc);
    }
  }
}

// ---- AVX-512 path (tile) ---------------------------------------------------------------------

#define W4K_AWQ_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,avx512vbmi,f16c,fma")))

// Scales and (-z) * s of one group for one block, lane order.
struct alignas(64) BlockParams {
  float s[kBlockN];
  float zs[kBlockN];
};

W4K_AWQ_AVX512 inline __m512 f16_to_f32(__m256i h, Dtype d) {
  return d == Dtype::kHalf ? _mm512_cvtph_ps(h)
                           : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// The zero-point codes of 16 consecutive columns 8w .. 8w + 15 in column order (lane l: word
// l / 8, nibble kAwqNibble[l % 8]) from their 2 qzeros words, of which `words` (0..2) are read
// (the others count as 0).
W4K_AWQ_AVX512 inline __m512i awq_codes16(const int32_t* qz, int words) {
  const __m512i word = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  const __m512i shift = _mm512_setr_epi32(0, 16, 4, 20, 8, 24, 12, 28, 0, 16, 4, 20, 8, 24, 12,
                                          28);
  const __m128i zw = _mm_maskz_loadu_epi32(static_cast<__mmask8>((1u << words) - 1), qz);
  return _mm512_and_si512(
      _mm512_srlv_epi32(_mm512_permutexvar_epi32(word, _mm512_castsi128_si512(zw)), shift),
      _mm512_set1_epi32(15));
}

// The 4 code vectors of one row of a block (lane order); `words` = valid words (1..8).
template <bool kFull>
W4K_AWQ_AVX512 inline void decode_codes(const int32_t* q, int64_t words, __m512i c[4]) {
  __m128i lo, hi;
  if constexpr (kFull) {
    lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
    hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 4));
  } else {
    const unsigned mask = (1u << words) - 1;
    lo = _mm_maskz_loadu_epi32(static_cast<__mmask8>(mask & 15), q);
    hi = _mm_maskz_loadu_epi32(static_cast<__mmask8>(mask >> 4), q + 4);
  }
  const __m512i b0 = _mm512_cvtepu8_epi32(lo), b1 = _mm512_cvtepu8_epi32(hi);
  const __m512i low4 = _mm512_set1_epi32(15);
  c[0] = _mm512_and_si512(b0, low4);
  c[1] = _mm512_srli_epi32(b0, 4);
  c[2] = _mm512_and_si512(b1, low4);
  c[3] = _mm512_srli_epi32(b1, 4);
}

// Lane-order indices for _mm512_permutex2var_ps: lanes of vector v (0/1) from columns 0..31.
W4K_AWQ_AVX512 inline __m512i lane_index(int v) {
  alignas(64) int32_t idx[16];
  for (int l = 0; l < 16; ++l) idx[l] = lane_column(16 * v + l);
  return _mm512_load_si512(idx);
}

template <Dtype D>
W4K_AWQ_AVX512 void load_params(const Problem& pb, int64_t g, int64_t n0, int64_t words,
                                BlockParams& p) {
  __m512i zc[4];
  const int32_t* qz = pb.qzeros + g * (pb.size_n / 8) + n0 / 8;
  if (words == 8)
    decode_codes<true>(qz, 8, zc);
  else
    decode_codes<false>(qz, words, zc);
  const uint16_t* s = pb.scales + g * pb.size_n + n0;
  const int64_t ncols = 8 * words;
  __m512 cols[4];
  for (int j = 0; j < 4; ++j) {
    const int64_t left = ncols - 16 * j;
    const __mmask16 m = left >= 16 ? 0xFFFF : left <= 0 ? 0 : static_cast<__mmask16>((1u << left) - 1);
    cols[j] = f16_to_f32(_mm256_maskz_loadu_epi16(m, s + 16 * j), D);
  }
  const __m512i i0 = lane_index(0), i1 = lane_index(1);
  const __m512 sv[4] = {_mm512_permutex2var_ps(cols[0], i0, cols[1]),
                        _mm512_permutex2var_ps(cols[0], i1, cols[1]),
                        _mm512_permutex2var_ps(cols[2], i0, cols[3]),
                        _mm512_permutex2var_ps(cols[2], i1, cols[3])};
  for (int j = 0; j < 4; ++j) {
    // (-z) by a sign flip, so z = 0 gives -0 exactly as the portable (-z) * s does.
    const __m512 negz = _mm512_castsi512_ps(_mm512_xor_si512(
        _mm512_castps_si512(_mm512_cvtepi32_ps(zc[j])), _mm512_set1_epi32(INT32_MIN)));
    _mm512_store_ps(p.s + 16 * j, sv[j]);
    _mm512_store_ps(p.zs + 16 * j, _mm512_mul_ps(negz, sv[j]));
  }
}

// Exact (q - z) * s of one row, 4 vectors in lane order.
template <bool kFull>
W4K_AWQ_AVX512 inline void decode_row(const int32_t* q, int64_t words, const BlockParams& p,
                                      __m512 w[4]) {
  __m512i c[4];
  decode_codes<kFull>(q, words, c);
  for (int j = 0; j < 4; ++j)
    w[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c[j]), _mm512_load_ps(p.s + 16 * j),
                           _mm512_load_ps(p.zs + 16 * j));
}

// Word order that turns cvtne2ps2bf16(row k+1, row k) (row k in words 0..15, row k+1 in
// 16..31) into pairs: 32-bit lane i = (w[k, i], w[k+1, i]).
W4K_AWQ_AVX512 inline __m512i pair_index() {
  alignas(64) int16_t idx[32];
  for (int i = 0; i < 16; ++i) idx[2 * i] = static_cast<int16_t>(i), idx[2 * i + 1] = static_cast<int16_t>(16 + i);
  return _mm512_load_si512(idx);
}

// Prefetches for row r of a strip's decode (q: the block's first word of the strip's row 0):
// the row one strip ahead into L2, and with `near` the row 16 ahead into L1. AutoAWQ rows are
// N / 2 bytes apart (5.5 KB at N = 11008: a page each), which the hardware prefetchers do not
// follow, and on the AMX tiles below 64 rows the decode's loads were its stalls (perf: the
// vpmovzxbd of the words and the prefetch after it, half the decode's samples at M = 16).
// `near` (chunk_avx512's few-row AMX case): 2026-11-28, 2 threads, bf16, medians of 11-15 calls
// alternating in one process, 3-8 % faster at M = 8..32 (8, 16 or 32 rows ahead within 3 % of
// each other), level at 64.
W4K_AWQ_AVX512 inline void prefetch_strip_row(const int32_t* q, int64_t ldq, int64_t r,
                                              int64_t strip, bool near) {
  _mm_prefetch(reinterpret_cast<const char*>(q + (r + strip) * ldq), _MM_HINT_T1);
  if (near) _mm_prefetch(reinterpret_cast<const char*>(q + (r + 16) * ldq), _MM_HINT_T0);
}

// Rows r and r + 1 of a strip of kb rows (r + 1 == kb: zeros, an odd K's last pair), exact
// (q - z) * s in lane order, with their prefetches.
template <bool kFull>
W4K_AWQ_AVX512 inline void decode_row_pair(const int32_t* q, int64_t ldq, int64_t kb, int64_t r,
                                           int64_t strip, int64_t words,
                                           const BlockParams* const* rows, bool near, __m512 w0[4],
                                           __m512 w1[4]) {
  prefetch_strip_row(q, ldq, r, strip, near);
  prefetch_strip_row(q, ldq, r + 1, strip, near);
  decode_row<kFull>(q + r * ldq, words, *rows[r], w0);
  if (r + 1 < kb) {
    decode_row<kFull>(q + (r + 1) * ldq, words, *rows[r + 1], w1);
  } else {
    for (int j = 0; j < 4; ++j) w1[j] = _mm512_setzero_ps();
  }
}

// Decode rows [k0, k0 + kb) of one block into `tile`:
//   fp16: row r as 4 fp32 vectors, w rounded through fp16: tile[(r * 4 + j) * 16 + lane];
//   bf16: row pair r/2 as 4 vectors of bf16 pairs: tile[(r/2 * 4 + j) * 16 + lane] (32 bits).
// `rows` holds each row's BlockParams.
template <Dtype D, bool kFull>
W4K_AWQ_AVX512 void decode_strip(const int32_t* q, int64_t ldq, int64_t kb, int64_t words,
                                 const BlockParams* const* rows, float* tile, bool near) {
  constexpr int64_t kStrip = kTileStripRows<D>;  // the next strip's rows: prefetched into L2
  if constexpr (D == Dtype::kHalf) {
    for (int64_t r = 0; r < kb; ++r) {
      __m512 w[4];
      prefetch_strip_row(q, ldq, r, kStrip, near);
      decode_row<kFull>(q + r * ldq, words, *rows[r], w);
      for (int j = 0; j < 4; ++j)
        _mm512_store_ps(tile + (r * 4 + j) * 16,
                        _mm512_cvtph_ps(_mm512_cvtps_ph(w[j], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
    }
  } else {
    const __m512i pidx = pair_index();
    for (int64_t r = 0; r < kb; r += 2) {
      __m512 w0[4], w1[4];
      decode_row_pair<kFull>(q, ldq, kb, r, kStrip, words, rows, near, w0, w1);
      for (int j = 0; j < 4; ++j) {
        const __m512i t = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(w1[j], w0[j]));
        _mm512_store_si512(tile + (r / 2 * 4 + j) * 16, _mm512_permutexvar_epi16(pidx, t));
      }
    }
  }
}

// fp16 on AMX tiles: rows [k0, k0 + kb) of one block as the bf16 pair rows of the hi parts
// (tile, as decode_strip's bf16 layout) and of the lo parts (tile + kAmxLoOffset) of each
// weight rounded to fp16 (cpu/amx_bf16.h, amx_split_half); an odd K's last pair (w, 0).
constexpr int64_t kAmxLoOffset = kStripK / 2 * kBlockN;  // floats: after 64 pair rows
template <bool kFull>
W4K_AWQ_AVX512 void decode_strip_split(const int32_t* q, int64_t ldq, int64_t kb, int64_t words,
                                       const BlockParams* const* rows, float* tile, bool near) {
  constexpr int kRne = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  for (int64_t r = 0; r < kb; r += 2) {
    __m512 w0[4], w1[4];
    decode_row_pair<kFull>(q, ldq, kb, r, kStripK, words, rows, near, w0, w1);
    for (int j = 0; j < 4; ++j) {
      __m512i hi0, lo0, hi1, lo1;
      cpu::amx_split_half(_mm512_cvtph_ps(_mm512_cvtps_ph(w0[j], kRne)), hi0, lo0);
      cpu::amx_split_half(_mm512_cvtph_ps(_mm512_cvtps_ph(w1[j], kRne)), hi1, lo1);
      // lane i = (row r, row r + 1): (w1 & 0xffff0000) | (w0 >> 16), imm 0xd8 = "c ? b : a"
      float* dst = tile + (r / 2 * 4 + j) * 16;
      _mm512_store_si512(dst,
                         _mm512_ternarylogic_epi32(_mm512_srli_epi32(hi0, 16), hi1, high, 0xd8));
      _mm512_store_si512(dst + kAmxLoOffset,
                         _mm512_ternarylogic_epi32(_mm512_srli_epi32(lo0, 16), lo1, high, 0xd8));
    }
  }
}

// acc[m, 64 lanes] += the strip's products for MR rows of x (registers across the strip).
//   fp16: xf = fp32 activations [M, K] (row stride K); bf16: x pairs read from pb.x.
template <Dtype D, int MR>
W4K_AWQ_AVX512 inline void strip_rows(const Problem& pb, const float* xf, int64_t m0, int64_t k0,
                                      int64_t kb, const float* tile, float* acc, int64_t ldacc) {
  // Unrolled loops over the accumulators: GCC then keeps c in registers across the strip
  // instead of copying it through the stack before and after.
  __m512 c[MR][4];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) c[r][j] = _mm512_loadu_ps(acc + (m0 + r) * ldacc + 16 * j);
  if constexpr (D == Dtype::kHalf) {
    for (int64_t k = 0; k < kb; ++k) {
      const float* t = tile + k * 64;
      const __m512 w0 = _mm512_load_ps(t), w1 = _mm512_load_ps(t + 16), w2 = _mm512_load_ps(t + 32),
                   w3 = _mm512_load_ps(t + 48);
      for (int r = 0; r < MR; ++r) {
        const __m512 xv = _mm512_set1_ps(xf[(m0 + r) * pb.size_k + k0 + k]);
        c[r][0] = _mm512_fmadd_ps(xv, w0, c[r][0]);
        c[r][1] = _mm512_fmadd_ps(xv, w1, c[r][1]);
        c[r][2] = _mm512_fmadd_ps(xv, w2, c[r][2]);
        c[r][3] = _mm512_fmadd_ps(xv, w3, c[r][3]);
      }
    }
  } else {
    const int64_t pairs = kb / 2;
    for (int64_t k = 0; k < pairs; ++k) {
      const float* t = tile + k * 64;
      const __m512bh w0 = reinterpret_cast<__m512bh>(_mm512_load_si512(t)),
                     w1 = reinterpret_cast<__m512bh>(_mm512_load_si512(t + 16)),
                     w2 = reinterpret_cast<__m512bh>(_mm512_load_si512(t + 32)),
                     w3 = reinterpret_cast<__m512bh>(_mm512_load_si512(t + 48));
      for (int r = 0; r < MR; ++r) {
        int32_t xp;
        std::memcpy(&xp, pb.x + (m0 + r) * pb.ldx + k0 + 2 * k, 4);
        const __m512bh xv = reinterpret_cast<__m512bh>(_mm512_set1_epi32(xp));
        c[r][0] = _mm512_dpbf16_ps(c[r][0], xv, w0);
        c[r][1] = _mm512_dpbf16_ps(c[r][1], xv, w1);
        c[r][2] = _mm512_dpbf16_ps(c[r][2], xv, w2);
        c[r][3] = _mm512_dpbf16_ps(c[r][3], xv, w3);
      }
    }
    if (kb % 2) {  // the last row of an odd K: pair (x[K-1], 0)
      const float* t = tile + pairs * 64;
      for (int r = 0; r < MR; ++r) {
        const int32_t xp = pb.x[(m0 + r) * pb.ldx + k0 + kb - 1];
        const __m512bh xv = reinterpret_cast<__m512bh>(_mm512_set1_epi32(xp));
        for (int j = 0; j < 4; ++j)
          c[r][j] = _mm512_dpbf16_ps(c[r][j], xv, reinterpret_cast<__m512bh>(_mm512_load_si512(t + 16 * j)));
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) _mm512_storeu_ps(acc + (m0 + r) * ldacc + 16 * j, c[r][j]);
}

template <Dtype D>
W4K_AWQ_AVX512 void strip_all_rows(const Problem& pb, const float* xf, int64_t k0, int64_t kb,
                                   const float* tile, float* acc, int64_t ldacc) {
  constexpr int kMR = 6;  // 24 accumulators + 4 weights + 1 broadcast of 32 zmm
  int64_t m = 0;
  for (; m + kMR <= pb.size_m; m += kMR) strip_rows<D, kMR>(pb, xf, m, k0, kb, tile, acc, ldacc);
  switch (pb.size_m - m) {
    case 5: strip_rows<D, 5>(pb, xf, m, k0, kb, tile, acc, ldacc); break;
    case 4: strip_rows<D, 4>(pb, xf, m, k0, kb, tile, acc, ldacc); break;
    case 3: strip_rows<D, 3>(pb, xf, m, k0, kb, tile, acc, ldacc); break;
    case 2: strip_rows<D, 2>(pb, xf, m, k0, kb, tile, acc, ldacc); break;
    case 1: strip_rows<D, 1>(pb, xf, m, k0, kb, tile, acc, ldacc); break;
    default: break;
  }
}

// Columns [n_begin, n_end) (n_begin a multiple of 64; n_end a multiple of 8) of the output.
// The strip loop is outside the block loop so a chunk's rows (2 lines each) are read once.
// amx: the strips' products on AMX tiles (cpu/amx_bf16.h: the same pair rows as B tiles, x as
// the A tiles; its own fp32 summation inside each step of 32 k); fp16: x and the weights split
// into bf16 hi and lo parts (pb.xs, decode_strip_split), the accumulators in split rows
// (amx_split_row: acc_rows of them per block), folded before the output.
// acc_rows: amx_split_tile_rows(M) for fp16 on AMX, else M (scratch_floats sized for it).
inline int64_t chunk_acc_rows(const Problem& pb) {
  return pb.xs ? cpu::amx_split_tile_rows(pb.size_m) : pb.size_m;
}
template <Dtype D>
W4K_AWQ_AVX512 void chunk_avx512(const Problem& pb, const float* xf, int64_t n_begin, int64_t n_end,
                                 float* scratch, bool amx = false,
                                 int64_t chunk_blocks = kChunkBlocks) {
  const int64_t group_size = pb.size_k / pb.groups, ldq = pb.size_n / 8;
  const int64_t nblocks = (n_end - n_begin + kBlockN - 1) / kBlockN;
  const int64_t ldacc = kBlockN;  // acc of block b: scratch + b * acc_rows * 64, [m][lane]
  const bool split = D == Dtype::kHalf && amx;  // pb.xs set
  const bool near = amx && pb.size_m < kAmxManyRows;  // decode-bound: prefetch_strip_row
  const int64_t acc_rows = chunk_acc_rows(pb);
  float* acc = scratch;
  float* tile = acc + acc_rows * chunk_blocks * kBlockN;
  BlockParams* params = reinterpret_cast<BlockParams*>(tile + kStripK * kBlockN);
  constexpr int64_t kStrip = kTileStripRows<D>;
  const BlockParams* rows[kStrip];
  std::memset(acc, 0, sizeof(float) * acc_rows * nblocks * kBlockN);
  cpu::AmxTileScope amx_tiles(amx);
  for (int64_t k0 = 0; k0 < pb.size_k; k0 += kStrip) {
    const int64_t kb = std::min(kStrip, pb.size_k - k0);
    const int64_t g0 = k0 / group_size, g1 = (k0 + kb - 1) / group_size;
    // each row's group parameters (filled per block below; the rows' groups are the same)
    for (int64_t r = 0; r < kb; ++r) rows[r] = &params[(k0 + r) / group_size - g0];
    for (int64_t b = 0; b < nblocks; ++b) {
      const int64_t n0 = n_begin + b * kBlockN;
      const int64_t words = std::min<int64_t>(8, (n_end - n0) / 8);
      for (int64_t g = g0; g <= g1; ++g) load_params<D>(pb, g, n0, words, params[g - g0]);
      const int32_t* q = pb.qweight + k0 * ldq + n0 / 8;
      if (split && words == 8)
        decode_strip_split<true>(q, ldq, kb, words, rows, tile, near);
      else if (split)
        decode_strip_split<false>(q, ldq, kb, words, rows, tile, near);
      else if (words == 8)
        decode_strip<D, true>(q, ldq, kb, words, rows, tile, near);
      else
        decode_strip<D, false>(q, ldq, kb, words, rows, tile, near);
      float* acc_b = acc + b * acc_rows * kBlockN;
#ifdef W4K_HAVE_AMX_PATH
      if (amx) {
        const uint32_t* pairs = reinterpret_cast<const uint32_t*>(tile);
        if (split)
          cpu::amx_bf16_rows(pb.xs + k0, pb.ldxs, pairs, kb, acc_b, acc_rows,
                             reinterpret_cast<const uint32_t*>(tile + kAmxLoOffset));
        else
          cpu::amx_bf16_rows(pb.x + k0, pb.ldx, pairs, kb, acc_b, acc_rows);
        continue;
      }
#endif
      strip_all_rows<D>(pb, xf, k0, kb, tile, acc_b, ldacc);
    }
  }
  if (split)
    for (int64_t b = 0; b < nblocks; ++b)
      cpu::amx_fold_split_rows(acc + b * acc_rows * kBlockN, pb.size_m);
  // Lane index of each column (inverse of lane_column), per 16 columns; lane_column keeps the
  // 32-column halves, so half h reads lanes 32h .. 32h + 31 only.
  alignas(64) int32_t lane_of[kBlockN];
  for (int p = 0; p < kBlockN; ++p) lane_of[lane_column(p)] = p % 32;
  for (int64_t b = 0; b < nblocks; ++b) {
    const int64_t n0 = n_begin + b * kBlockN;
    const int64_t ncols = std::min(kBlockN, n_end - n0);
    for (int64_t m = 0; m < pb.size_m; ++m) {
      const float* a = acc + (b * acc_rows + m) * kBlockN;
      uint16_t* o = pb.out + m * pb.size_n + n0;
      if (ncols == kBlockN) {
        // vcvtneps2bf16 / vcvtps2ph round exactly as round_to<D> (RNE; bf16: NaN made quiet,
        // denormal -> signed zero), so this is the scalar loop below, 16 columns at a time.
        for (int v = 0; v < 4; ++v) {
          const float* half = a + 32 * (v / 2);
          const __m512 col = _mm512_permutex2var_ps(
              _mm512_load_ps(half), _mm512_load_si512(lane_of + 16 * v), _mm512_load_ps(half + 16));
          const __m256i bits =
              D == Dtype::kHalf ? _mm512_cvtps_ph(col, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
                                : reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(col));
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 16 * v), bits);
        }
        continue;
      }
      for (int p = 0; p < kBlockN; ++p)
        if (lane_column(p) < ncols) o[lane_column(p)] = round_to<D>(a[p]);
    }
  }
}


}  // namespace awq_cpu
}  // namespace w4k
