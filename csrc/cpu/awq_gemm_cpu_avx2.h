// CPU awq_gemm, the AVX2 + FMA + F16C path (CPUs without the AVX-512 path's BF16 / VBMI, or
// W4K_CPU_ISA=avx2). Shares Problem, the helpers and the numerics of awq_gemm_cpu.h.
//
// One kernel serves both summation orders the portable code defines, so the bits equal the
// portable mirror of whichever path the shape selects (and so the AVX-512 path's):
//  * tile order (chunk_scalar): one fp32 chain per output; fp16 rows k = 0, 1, ...; bf16 pairs
//    (k + 1, k), and with K odd the last row as fma(x, w, acc + 0) (vdpbf16ps on (x, 0) x (w, 0));
//  * lookup order (chunk_lut_scalar, when lut_path_applies): L lane chains per output, lane j
//    taking rows 16t + 2j + 1, 16t + 2j (bf16, L = 8) or 16t + j (fp16, L = 16) for t = 0, 1, ...,
//    then out = ((a0 + a1) + a2) + ... in lane order.
// Each chain is run as a list of strip rows in chain order ("seq") by one micro-kernel.
//
// Layout: columns in a block of 64 (8 words a row) stay in column order: word w of a row is
// broadcast and shifted by 4 * kAwqNibble[j] in lane j, so lane j holds column 8w + j. A strip of
// kStripK rows is decoded once into `tile` [row][64] fp32 (the weight rounded to T and widened:
// exact), then the micro-kernel multiplies it by MR <= 6 rows of x (fp32, exact) into MR x 16
// accumulators (12 ymm + 2 weights + 1 broadcast of the 16).
// Weight rounding: fp16 by vcvtps2ph (RNE, denormals kept; = round_half); bf16 in integer ops
// as round_bf16 (= vcvtne2ps2bf16: RNE, NaN made quiet, |v| < FLT_MIN to a signed zero).
// Products are exact in fp32 (11- or 8-bit mantissas), and vfmadd231ps is the fma of
// chunk_scalar: no flush of denormal partial sums (unlike vdpbf16ps, see awq_gemm_cpu.h).
#pragma once

#include <immintrin.h>

#include <cfloat>

#include "cpu/awq_gemm_cpu.h"
#include "cpu/awq_gemm_cpu_lut.h"

namespace w4k {
namespace awq_cpu {

#define W4K_AWQ_AVX2 __attribute__((target("avx2,fma,f16c")))

// Lane chains per output column: 1 in tile order, 8 (bf16) / 16 (fp16) in lookup order.
template <Dtype D>
constexpr int64_t avx2_lanes(bool lut_order) {
  return !lut_order ? 1 : D == Dtype::kBFloat16 ? 8 : 16;
}

// Per-thread scratch floats of chunk_avx2 (columns of up to kChunkBlocks blocks).
inline int64_t avx2_scratch_floats(int64_t size_m, int64_t lanes) {
  return size_m * lanes * kChunkBlocks * kBlockN  // accumulators [block][m][lane][64]
         + kStripK * kBlockN                      // one decoded strip [row][64]
         + (kStripK + 2) * 2 * kBlockN;           // BlockParams of the strip's groups
}

// Lane j of word w holds column 8w + j: shift by 4 * kAwqNibble[j].
W4K_AWQ_AVX2 inline __m256i avx2_nibble_shifts() {
  return _mm256_setr_epi32(0, 16, 4, 20, 8, 24, 12, 28);
}

W4K_AWQ_AVX2 inline __m256 avx2_codes(int32_t word, __m256i shifts) {
  const __m256i v = _mm256_srlv_epi32(_mm256_set1_epi32(word), shifts);
  return _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(15)));
}

template <Dtype D>
W4K_AWQ_AVX2 inline __m256 avx2_widen(__m128i h) {
  if constexpr (D == Dtype::kHalf)
    return _mm256_cvtph_ps(h);
  else
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// T(v) widened back to fp32; the bf16 case is round_bf16 lane by lane. kPlain: the caller
// knows v is finite and 0 or |v| >= FLT_MIN (see avx2_load_params), where round_bf16 is plain
// RNE (a zero keeps its sign under RNE too).
template <Dtype D, bool kPlain>
W4K_AWQ_AVX2 inline __m256 avx2_round(__m256 v) {
  if constexpr (D == Dtype::kHalf) {
    return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  } else {
    const __m256i u = _mm256_castps_si256(v);
    const __m256i hi = _mm256_set1_epi32(static_cast<int32_t>(0xFFFF0000u));
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i rne = _mm256_and_si256(
        _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF))), hi);
    if constexpr (kPlain) return _mm256_castsi256_ps(rne);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 tiny = _mm256_cmp_ps(_mm256_andnot_ps(sign, v), _mm256_set1_ps(FLT_MIN), _CMP_LT_OQ);
    const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    const __m256 quiet = _mm256_castsi256_ps(
        _mm256_and_si256(_mm256_or_si256(u, _mm256_set1_epi32(0x00400000)), hi));
    const __m256 r = _mm256_blendv_ps(_mm256_castsi256_ps(rne), _mm256_and_ps(v, sign), tiny);
    return _mm256_blendv_ps(r, quiet, nan);
  }
}

// Scales and (-z) * s of group g for the block at column n0, column order; words past the
// valid ones get 0. Returns whether every scale is finite with |s| >= FLT_MIN: then every
// weight fma(q, s, (-z) s) = (q - z) s is +-0 or has magnitude >= FLT_MIN (q - z an integer),
// and is never NaN (an overflow gives +-inf, which plain RNE keeps), so the bf16 rounding is
// plain RNE (avx2_round<.., true>).
template <Dtype D>
W4K_AWQ_AVX2 bool avx2_load_params(const Problem& pb, int64_t g, int64_t n0, int64_t words,
                                   BlockParams& p) {
  const __m256i shifts = avx2_nibble_shifts();
  __m256 odd = _mm256_setzero_ps();  // lanes with a NaN, inf or denormal scale
  for (int64_t w = 0; w < 8; ++w) {
    __m256 s = _mm256_setzero_ps(), zs = _mm256_setzero_ps();
    if (w < words) {
      s = avx2_widen<D>(_mm_loadu_si128(
          reinterpret_cast<const __m128i*>(pb.scales + g * pb.size_n + n0 + 8 * w)));
      const __m256 z = avx2_codes(pb.qzeros[g * (pb.size_n / 8) + n0 / 8 + w], shifts);
      // (-z) by a sign flip, so z = 0 gives -0 exactly as the portable (-z) * s does.
      zs = _mm256_mul_ps(_mm256_xor_ps(z, _mm256_set1_ps(-0.0f)), s);
      const __m256 a = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), s);
      odd = _mm256_or_ps(odd, _mm256_cmp_ps(a, _mm256_set1_ps(FLT_MIN), _CMP_NGE_UQ));  // < or NaN
      odd = _mm256_or_ps(odd, _mm256_cmp_ps(a, _mm256_set1_ps(FLT_MAX), _CMP_GT_OQ));
    }
    _mm256_store_ps(p.s + 8 * w, s);
    _mm256_store_ps(p.zs + 8 * w, zs);
  }
  return _mm256_movemask_ps(odd) == 0;
}

// Rows [0, kb) of one block (q = its first word of row k0) into tile [row][64]:
// T(fma(q, s, (-z) s)) widened to fp32; invalid words give 0.
template <Dtype D, bool kPlain>
W4K_AWQ_AVX2 void avx2_decode_strip(const int32_t* q, int64_t ldq, int64_t kb, int64_t words,
                                    const BlockParams* const* rows, float* tile) {
  const __m256i shifts = avx2_nibble_shifts();
  for (int64_t r = 0; r < kb; ++r) {
    const int32_t* qr = q + r * ldq;
    _mm_prefetch(reinterpret_cast<const char*>(qr + kStripK * ldq), _MM_HINT_T0);
    const BlockParams& p = *rows[r];
    float* t = tile + r * kBlockN;
    int64_t w = 0;
    for (; w < words; ++w)
      _mm256_store_ps(t + 8 * w, avx2_round<D, kPlain>(_mm256_fmadd_ps(avx2_codes(qr[w], shifts),
                                                               _mm256_load_ps(p.s + 8 * w),
                                                               _mm256_load_ps(p.zs + 8 * w))));
    for (; w < 8; ++w) _mm256_store_ps(t + 8 * w, _mm256_setzero_ps());
  }
}

// acc[r][16 columns] = chain over the strip rows seq[0..n) for MR rows of x; with odd_tail the
// last seq row is the lone row of an odd K: acc + 0 first (the (x, 0) x (w, 0) pair).
//   x: fp32 activations at (row m0, column k0), row stride ldx; tile: the strip at the 16
//   columns; acc: row stride ldacc.
template <int MR>
W4K_AWQ_AVX2 inline void avx2_chain(const float* x, int64_t ldx, const int32_t* seq, int64_t n,
                                    bool odd_tail, const float* tile, float* acc, int64_t ldacc) {
  __m256 c[MR][2];
  for (int r = 0; r < MR; ++r) {
    c[r][0] = _mm256_loadu_ps(acc + r * ldacc);
    c[r][1] = _mm256_loadu_ps(acc + r * ldacc + 8);
  }
  const int64_t body = n - (odd_tail ? 1 : 0);
  for (int64_t i = 0; i < body; ++i) {
    const int64_t k = seq[i];
    const __m256 w0 = _mm256_load_ps(tile + k * kBlockN), w1 = _mm256_load_ps(tile + k * kBlockN + 8);
    for (int r = 0; r < MR; ++r) {
      const __m256 xv = _mm256_broadcast_ss(x + r * ldx + k);
      c[r][0] = _mm256_fmadd_ps(xv, w0, c[r][0]);
      c[r][1] = _mm256_fmadd_ps(xv, w1, c[r][1]);
    }
  }
  if (odd_tail) {
    const int64_t k = seq[n - 1];
    const __m256 w0 = _mm256_load_ps(tile + k * kBlockN), w1 = _mm256_load_ps(tile + k * kBlockN + 8);
    for (int r = 0; r < MR; ++r) {
      const __m256 xv = _mm256_broadcast_ss(x + r * ldx + k);
      c[r][0] = _mm256_fmadd_ps(xv, w0, _mm256_add_ps(c[r][0], _mm256_setzero_ps()));
      c[r][1] = _mm256_fmadd_ps(xv, w1, _mm256_add_ps(c[r][1], _mm256_setzero_ps()));
    }
  }
  for (int r = 0; r < MR; ++r) {
    _mm256_storeu_ps(acc + r * ldacc, c[r][0]);
    _mm256_storeu_ps(acc + r * ldacc + 8, c[r][1]);
  }
}

// One chain (seq) over all M rows of x and the block's 64 columns.
W4K_AWQ_AVX2 inline void avx2_chain_all(const Problem& pb, const float* xf, int64_t k0,
                                        const int32_t* seq, int64_t n, bool odd_tail,
                                        const float* tile, float* acc, int64_t ldacc) {
  constexpr int kMR = 6;
  for (int64_t col = 0; col < kBlockN; col += 16) {
    int64_t m = 0;
    auto at = [&](int64_t row) { return xf + row * pb.size_k + k0; };
    for (; m + kMR <= pb.size_m; m += kMR)
      avx2_chain<kMR>(at(m), pb.size_k, seq, n, odd_tail, tile + col, acc + m * ldacc + col, ldacc);
    float* a = acc + m * ldacc + col;
    switch (pb.size_m - m) {
      case 5: avx2_chain<5>(at(m), pb.size_k, seq, n, odd_tail, tile + col, a, ldacc); break;
      case 4: avx2_chain<4>(at(m), pb.size_k, seq, n, odd_tail, tile + col, a, ldacc); break;
      case 3: avx2_chain<3>(at(m), pb.size_k, seq, n, odd_tail, tile + col, a, ldacc); break;
      case 2: avx2_chain<2>(at(m), pb.size_k, seq, n, odd_tail, tile + col, a, ldacc); break;
      case 1: avx2_chain<1>(at(m), pb.size_k, seq, n, odd_tail, tile + col, a, ldacc); break;
      default: break;
    }
  }
}

// Columns [n_begin, n_end) (n_begin a multiple of 64, at most kChunkBlocks blocks; n_end a
// multiple of 8), all M rows. xf: fp32 activations [M, K] (exact widening of x). lut_order:
// sum in the lookup path's order (the caller passes lut_path_applies).
template <Dtype D>
W4K_AWQ_AVX2 void chunk_avx2(const Problem& pb, const float* xf, int64_t n_begin, int64_t n_end,
                             bool lut_order, float* scratch) {
  const int64_t lanes = avx2_lanes<D>(lut_order);
  const int64_t group_size = pb.size_k / pb.groups, ldq = pb.size_n / 8;
  const int64_t nblocks = (n_end - n_begin + kBlockN - 1) / kBlockN;
  const int64_t block_floats = pb.size_m * lanes * kBlockN;  // acc of a block: [m][lane][64]
  float* acc = scratch;
  float* tile = acc + kChunkBlocks * block_floats;
  BlockParams* params = reinterpret_cast<BlockParams*>(tile + kStripK * kBlockN);
  const BlockParams* rows[kStripK];
  alignas(64) int32_t seq[kStripK];
  std::memset(acc, 0, sizeof(float) * nblocks * block_floats);
  for (int64_t k0 = 0; k0 < pb.size_k; k0 += kStripK) {
    const int64_t kb = std::min(kStripK, pb.size_k - k0);
    const int64_t g0 = k0 / group_size, g1 = (k0 + kb - 1) / group_size;
    // each row's group parameters (filled per block below; the rows' groups are the same)
    for (int64_t r = 0; r < kb; ++r) rows[r] = &params[(k0 + r) / group_size - g0];
    for (int64_t b = 0; b < nblocks; ++b) {
      const int64_t n0 = n_begin + b * kBlockN;
      const int64_t words = std::min<int64_t>(8, (n_end - n0) / 8);
      bool plain = true;
      for (int64_t g = g0; g <= g1; ++g) plain &= avx2_load_params<D>(pb, g, n0, words, params[g - g0]);
      const int32_t* q = pb.qweight + k0 * ldq + n0 / 8;
      if (plain)
        avx2_decode_strip<D, true>(q, ldq, kb, words, rows, tile);
      else
        avx2_decode_strip<D, false>(q, ldq, kb, words, rows, tile);
      float* accb = acc + b * block_floats;
      if (!lut_order) {
        int64_t n = 0;
        bool odd = false;
        if constexpr (D == Dtype::kBFloat16) {
          for (int64_t r = 0; r + 2 <= kb; r += 2) seq[n++] = r + 1, seq[n++] = r;
          if (kb % 2) seq[n++] = kb - 1, odd = true;  // only in the last strip of an odd K
        } else {
          for (int64_t r = 0; r < kb; ++r) seq[n++] = r;
        }
        avx2_chain_all(pb, xf, k0, seq, n, odd, tile, accb, kBlockN);
      } else {  // kb is a multiple of 16 (K is, and strips start at multiples of 128)
        for (int64_t j = 0; j < lanes; ++j) {
          int64_t n = 0;
          for (int64_t t = 0; t < kb; t += 16) {
            if constexpr (D == Dtype::kBFloat16)
              seq[n++] = t + 2 * j + 1, seq[n++] = t + 2 * j;
            else
              seq[n++] = t + j;
          }
          avx2_chain_all(pb, xf, k0, seq, n, false, tile, accb + j * kBlockN, lanes * kBlockN);
        }
      }
    }
  }
  for (int64_t b = 0; b < nblocks; ++b) {
    const int64_t n0 = n_begin + b * kBlockN;
    const int64_t ncols = std::min(kBlockN, n_end - n0);
    for (int64_t m = 0; m < pb.size_m; ++m) {
      const float* a = acc + b * block_floats + m * lanes * kBlockN;
      uint16_t* o = pb.out + m * pb.size_n + n0;
      for (int64_t col = 0; col < ncols; ++col) {
        float sum = a[col];
        for (int64_t j = 1; j < lanes; ++j) sum += a[j * kBlockN + col];  // lane order
        o[col] = round_to<D>(sum);
      }
    }
  }
}

// ---- Lookup order by table lookups (lut_path_applies: M <= 8 bf16 / 7 fp16, K and groups
// multiples of 16) ----
// Per (group, column) the 16 possible weights T(fma(q, s, (-z) s)), rounded as
// avx2_decode_strip rounds them, become two 16-byte vpshufb tables: the low and the high bytes
// of their bits. The nibbles of 16 rows are transposed to index bytes, one ymm per column pair
// (c, c + 4) of a word: [c rows 0..15 | c + 4 rows 0..15]. Two vpshufb and two byte unpacks
// give the pair's 16-bit weights, rows 0..7 and rows 8..15, and then
//  * bf16: dword lane j of each holds rows (2j, 2j + 1) (+ 8): a mask gives row 2j + 1, a shift
//    row 2j; lane chain j (rows 8..15: chain 4 + j) takes them odd row first;
//  * fp16: vcvtph2ps of each 128-bit half: chains 0..7 (rows 0..7) and 8..15;
// exactly the chains of the lookup order, summed in lane order at the end: the same bits as
// chunk_avx2 in lookup order (and so the AVX-512 lookup path), with ~12 vector ops per 16
// weights at M = 1 where the fp32 strip decode takes ~26.

constexpr int64_t kLutPairs = kBlockN / 2;      // column pairs of a block (4 per word)
constexpr int64_t kLutRowGroups = kStripK / 16; // 16-row groups of a strip

// Floats of one pair's chain sums per row of x: 8 (bf16: rows 0..7 / 8..15 parts of the pair's
// two columns) x 2, or 8 (fp16) x 4.
template <Dtype D>
constexpr int64_t lut_avx2_pair_floats() {
  return D == Dtype::kBFloat16 ? 16 : 32;
}

// Blocks of 64 columns per work item of chunk_lut_avx2: at M <= 4, 16 (1024 columns: runs of
// 512 bytes per row of the weight) where that still leaves two items per thread, else 8, else 4;
// 4 above (there the chain sums of 16 blocks outgrow L2: fp16 at M = 7 would take 458 KiB).
// Measured on the Zen 3 VM (AVX2 only, 2026-12-08; 2 threads, weights rotated, 7-11 rounds
// alternating in one process, g128), 16 against 4 blocks: bf16 M = 1 1.13-1.22x, M = 4
// 1.08-1.12x on 4096 x 4096, 11008 x 4096, 4096 x 11008 (8 blocks: 0.97-1.06x); fp16 M = 1
// 1.05-1.17x, M = 4 1.01-1.10x; with two busy processes on the cores (means) 1.03-1.12x; at
// M = 7-8 0.94-1.21x, so not taken there. W4K_AWQ_LUT_LINES (lines of 128 columns, as on the
// AVX-512 path) forces 2 blocks a line at every M; the bits do not depend on it.
inline int64_t lut_avx2_blocks(int64_t size_m, int64_t size_n, int64_t threads) {
  if (std::getenv("W4K_AWQ_LUT_LINES")) return 2 * lut_lines(size_m, size_n, threads);
  if (size_m > 4) return kChunkBlocks;
  const int64_t all = (size_n + kBlockN - 1) / kBlockN;
  for (int64_t blocks : {16, 8})
    if (all / blocks >= 2 * threads) return blocks;
  return kChunkBlocks;
}

// Tables kept per block: those of the groups one strip spans (at most one per 16-row group).
inline int64_t lut_avx2_strip_groups(int64_t group_size) {
  return std::min(kLutRowGroups, (kStripK + group_size - 1) / group_size + 1);
}

// Per-thread scratch floats of chunk_lut_avx2 over `blocks` blocks of columns: chain sums
// [block][pair][m][pair floats], the strip's index bytes [row group][pair][32] and each block's
// tables of the strip's groups [block][group][pair][lo 32, hi 32], then the group each block's
// tables hold (int64_t).
template <Dtype D>
inline int64_t lut_avx2_scratch_floats(int64_t size_m, int64_t blocks, int64_t group_size) {
  return blocks * kLutPairs * size_m * lut_avx2_pair_floats<D>() +
         (kLutRowGroups * kLutPairs * 32 +
          blocks * lut_avx2_strip_groups(group_size) * kLutPairs * 64) / 4 +
         2 * blocks + 16;
}

// bf16 only: x rearranged per 16-row group t into the four chain operands of the lookup, each
// repeated in both halves: x[2j + 1], x[2j], x[8 + 2j + 1], x[8 + 2j] (j = 0..3).
inline void lut_avx2_bf16_x(const float* xf, int64_t size_m, int64_t size_k, float* xe) {
  for (int64_t m = 0; m < size_m; ++m)
    for (int64_t t = 0; t < size_k / 16; ++t) {
      const float* x = xf + m * size_k + 16 * t;
      float* o = xe + (m * (size_k / 16) + t) * 32;
      for (int h = 0; h < 2; ++h)
        for (int j = 0; j < 4; ++j) {
          o[16 * h + j] = o[16 * h + 4 + j] = x[8 * h + 2 * j + 1];
          o[16 * h + 8 + j] = o[16 * h + 12 + j] = x[8 * h + 2 * j];
        }
    }
}

// Column c's 16 weights T(fma(q, s, (-z) s)), q = 0..15, as [low bytes | high bytes] of their
// 16-bit patterns (split: per 128-bit half, the low bytes of 8 16-bit values, then their high
// bytes).
template <Dtype D>
W4K_AWQ_AVX2 inline __m256i lut_avx2_column(const BlockParams& p, int64_t c, bool plain,
                                            __m256i split) {
  const __m256 q0 = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256 q1 = _mm256_setr_ps(8, 9, 10, 11, 12, 13, 14, 15);
  const __m256 s = _mm256_set1_ps(p.s[c]), zs = _mm256_set1_ps(p.zs[c]);
  const __m256 v0 = _mm256_fmadd_ps(q0, s, zs), v1 = _mm256_fmadd_ps(q1, s, zs);
  __m256i bits;  // the 16 weights' 16-bit patterns, q = 0..15
  if constexpr (D == Dtype::kHalf) {
    const int r = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    bits = _mm256_set_m128i(_mm256_cvtps_ph(v1, r), _mm256_cvtps_ph(v0, r));
  } else {
    const __m256i b0 = _mm256_srli_epi32(
        _mm256_castps_si256(plain ? avx2_round<D, true>(v0) : avx2_round<D, false>(v0)), 16);
    const __m256i b1 = _mm256_srli_epi32(
        _mm256_castps_si256(plain ? avx2_round<D, true>(v1) : avx2_round<D, false>(v1)), 16);
    bits = _mm256_permute4x64_epi64(_mm256_packus_epi32(b0, b1), 0xd8);
  }
  // [lo q0-7, lo q8-15 | hi q0-7, hi q8-15]
  return _mm256_permute4x64_epi64(_mm256_shuffle_epi8(bits, split), 0xd8);
}

// The tables of group g for the block at n0 (words valid words; the rest get zero tables):
// tab [pair][lo 32 bytes, hi 32 bytes], column 8w + i in pair 4w + i % 4, half i / 4. A pair's
// two columns are built together, so that its low and its high tables are one 32-byte store
// each. Against one column at a time (two 16-byte stores per column), on a Zen 3 VM (AVX2
// only, 2026-12-07, 2 threads, weights rotated, 15 rounds in one process, g128, 4096 x 4096,
// 11008 x 4096, 4096 x 11008): M = 1 1.01-1.07x, M = 4 1.00-1.03x, never slower.
template <Dtype D>
W4K_AWQ_AVX2 void lut_avx2_tables(const Problem& pb, int64_t g, int64_t n0, int64_t words,
                                  uint8_t* tab) {
  alignas(64) BlockParams p;
  const bool plain = avx2_load_params<D>(pb, g, n0, words, p);
  const __m256i split = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
                                         0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  for (int64_t w = 0; w < kBlockN / 8; ++w)
    for (int64_t i = 0; i < 4; ++i) {
      const __m256i a = lut_avx2_column<D>(p, 8 * w + i, plain, split);
      const __m256i b = lut_avx2_column<D>(p, 8 * w + i + 4, plain, split);
      uint8_t* pt = tab + (4 * w + i) * 64;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(pt), _mm256_permute2x128_si256(a, b, 0x20));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(pt + 32),
                          _mm256_permute2x128_si256(a, b, 0x31));
    }
}

// Index bytes of rows [k, k + 16) of the block (q: its first word of row k; words valid words,
// the rest read as 0): idx [pair][32 bytes] = [c rows 0..15 | c + 4 rows 0..15].
W4K_AWQ_AVX2 inline void lut_avx2_indices(const int32_t* q, int64_t ldq, int64_t words,
                                          uint8_t* idx) {
  const __m256i valid = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int32_t>(words)),
                                           _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  __m256i w[2][8];  // [rows 0-7 / 8-15][word]: the 8 rows' dwords of each word
  for (int h = 0; h < 2; ++h) {
    __m256i r[8];
    for (int i = 0; i < 8; ++i) {
      const int32_t* row = q + (8 * h + i) * ldq;
      // the next strip's row into L2 (rows N / 2 bytes apart share few L1 sets)
      _mm_prefetch(reinterpret_cast<const char*>(row + kStripK * ldq), _MM_HINT_T1);
      r[i] = words == 8 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row))
                        : _mm256_maskload_epi32(row, valid);
    }
    __m256i t[8], u[8];
    for (int i = 0; i < 4; ++i) {
      t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; ++i) {
      u[4 * i] = _mm256_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
      u[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
      u[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
      u[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    for (int i = 0; i < 4; ++i) {
      w[h][i] = _mm256_permute2x128_si256(u[i], u[4 + i], 0x20);
      w[h][4 + i] = _mm256_permute2x128_si256(u[i], u[4 + i], 0x31);
    }
  }
  const __m256i nib = _mm256_set1_epi8(0x0f);
  // per 128-bit half (4 rows): byte b of the 4 rows together, b = 0..3
  const __m256i by_byte = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,
                                           0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t wd = 0; wd < 8; ++wd) {
    const __m256i a = w[0][wd], b = w[1][wd];
    // low nibbles: bytes 0, 1 -> columns 0, 4 (nibbles 0, 2); bytes 2, 3 -> columns 1, 5;
    // high nibbles: columns 2, 6 and 3, 7 (kAwqNibble)
    const __m256i a_hi = _mm256_srli_epi16(a, 4), b_hi = _mm256_srli_epi16(b, 4);
    const __m256i x[2] = {_mm256_shuffle_epi8(_mm256_and_si256(a, nib), by_byte),
                          _mm256_shuffle_epi8(_mm256_and_si256(a_hi, nib), by_byte)};
    const __m256i y[2] = {_mm256_shuffle_epi8(_mm256_and_si256(b, nib), by_byte),
                          _mm256_shuffle_epi8(_mm256_and_si256(b_hi, nib), by_byte)};
    for (int n = 0; n < 2; ++n) {
      uint8_t* o = idx + (4 * wd + 2 * n) * 32;
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o),
                          _mm256_permutevar8x32_epi32(_mm256_unpacklo_epi32(x[n], y[n]), order));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + 32),
                          _mm256_permutevar8x32_epi32(_mm256_unpackhi_epi32(x[n], y[n]), order));
    }
  }
}

// MR rows of x, one column pair, row groups t = 0 .. nt - 1 of a strip (idx: the strip's index
// bytes of this pair, row group stride kLutPairs * 32; tab + tab_off[t]: the pair's tables for
// row group t): the chain sums acc [m][pair floats] continued. x, row stride ldx: bf16:
// lut_avx2_bf16_x's rows at the strip's first row group; fp16: xf at the strip's first row.
template <Dtype D, int MR>
W4K_AWQ_AVX2 inline void lut_avx2_pair(const uint8_t* idx, const uint8_t* tab,
                                       const int64_t* tab_off, int64_t nt, const float* x,
                                       int64_t ldx, float* acc) {
  constexpr int kV = D == Dtype::kBFloat16 ? 2 : 4;  // ymm of chain sums per row
  __m256 c[MR][kV];
  for (int m = 0; m < MR; ++m)
    for (int v = 0; v < kV; ++v) c[m][v] = _mm256_loadu_ps(acc + m * 8 * kV + 8 * v);
  const __m256i odd_mask = _mm256_set1_epi32(static_cast<int32_t>(0xFFFF0000u));
  for (int64_t t = 0; t < nt; ++t) {
    const __m256i i =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(idx + t * kLutPairs * 32));
    const uint8_t* tt = tab + tab_off[t];
    const __m256i lo =
        _mm256_shuffle_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(tt)), i);
    const __m256i hi =
        _mm256_shuffle_epi8(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(tt + 32)), i);
    const __m256i wa = _mm256_unpacklo_epi8(lo, hi);  // [c rows 0-7 | c + 4 rows 0-7]
    const __m256i wb = _mm256_unpackhi_epi8(lo, hi);  // rows 8-15
    if constexpr (D == Dtype::kBFloat16) {
      const __m256 oa = _mm256_castsi256_ps(_mm256_and_si256(wa, odd_mask));
      const __m256 ea = _mm256_castsi256_ps(_mm256_slli_epi32(wa, 16));
      const __m256 ob = _mm256_castsi256_ps(_mm256_and_si256(wb, odd_mask));
      const __m256 eb = _mm256_castsi256_ps(_mm256_slli_epi32(wb, 16));
      for (int m = 0; m < MR; ++m) {
        const float* xm = x + m * ldx + t * 32;
        c[m][0] = _mm256_fmadd_ps(_mm256_loadu_ps(xm), oa, c[m][0]);
        c[m][0] = _mm256_fmadd_ps(_mm256_loadu_ps(xm + 8), ea, c[m][0]);
        c[m][1] = _mm256_fmadd_ps(_mm256_loadu_ps(xm + 16), ob, c[m][1]);
        c[m][1] = _mm256_fmadd_ps(_mm256_loadu_ps(xm + 24), eb, c[m][1]);
      }
    } else {
      const __m256 f[4] = {_mm256_cvtph_ps(_mm256_castsi256_si128(wa)),
                           _mm256_cvtph_ps(_mm256_extracti128_si256(wa, 1)),
                           _mm256_cvtph_ps(_mm256_castsi256_si128(wb)),
                           _mm256_cvtph_ps(_mm256_extracti128_si256(wb, 1))};
      for (int m = 0; m < MR; ++m) {
        const __m256 x0 = _mm256_loadu_ps(x + m * ldx + 16 * t);
        const __m256 x1 = _mm256_loadu_ps(x + m * ldx + 16 * t + 8);
        c[m][0] = _mm256_fmadd_ps(x0, f[0], c[m][0]);
        c[m][1] = _mm256_fmadd_ps(x0, f[1], c[m][1]);
        c[m][2] = _mm256_fmadd_ps(x1, f[2], c[m][2]);
        c[m][3] = _mm256_fmadd_ps(x1, f[3], c[m][3]);
      }
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int v = 0; v < kV; ++v) _mm256_storeu_ps(acc + m * 8 * kV + 8 * v, c[m][v]);
}

// chunk_avx2 in lookup order by table lookups: columns [n_begin, n_end), all M (<= 8 bf16,
// 7 fp16) rows. x: bf16: lut_avx2_bf16_x of the activations; fp16: xf.
template <Dtype D>
W4K_AWQ_AVX2 void chunk_lut_avx2(const Problem& pb, const float* x, int64_t n_begin,
                                 int64_t n_end, float* scratch) {
  constexpr bool kBf16 = D == Dtype::kBFloat16;
  constexpr int64_t kPF = lut_avx2_pair_floats<D>();
  const int64_t group_size = pb.size_k / pb.groups, ldq = pb.size_n / 8, M = pb.size_m;
  const int64_t nblocks = (n_end - n_begin + kBlockN - 1) / kBlockN;
  const int64_t ldx = kBf16 ? pb.size_k * 2 : pb.size_k;  // bf16: 32 floats per 16 rows
  float* acc = scratch;
  uint8_t* idx = reinterpret_cast<uint8_t*>(acc + nblocks * kLutPairs * M * kPF);
  uint8_t* tabs = idx + kLutRowGroups * kLutPairs * 32;
  std::memset(acc, 0, sizeof(float) * nblocks * kLutPairs * M * kPF);
  // one block's tables
  const int64_t tab_bytes = lut_avx2_strip_groups(group_size) * kLutPairs * 64;
  int64_t tab_off[kLutRowGroups];  // row group t's tables: (its group - g0) * kLutPairs * 64
  // the one group whose tables each block keeps (-1: none)
  int64_t* built = reinterpret_cast<int64_t*>(tabs + nblocks * tab_bytes);
  std::fill(built, built + nblocks, -1);
  for (int64_t k0 = 0; k0 < pb.size_k; k0 += kStripK) {
    const int64_t nt = std::min(kStripK, pb.size_k - k0) / 16;  // K is a multiple of 16
    const int64_t g0 = k0 / group_size, g1 = (k0 + 16 * nt - 1) / group_size;
    for (int64_t t = 0; t < nt; ++t)
      tab_off[t] = ((k0 + 16 * t) / group_size - g0) * kLutPairs * 64;
    for (int64_t b = 0; b < nblocks; ++b) {
      const int64_t n0 = n_begin + b * kBlockN;
      const int64_t words = std::min<int64_t>(8, (n_end - n0) / 8);
      uint8_t* tab = tabs + b * tab_bytes;
      // a group longer than the strip keeps its tables for the next strips
      if (g0 != g1 || built[b] != g0)
        for (int64_t g = g0; g <= g1; ++g)
          lut_avx2_tables<D>(pb, g, n0, words, tab + (g - g0) * kLutPairs * 64);
      built[b] = g0 == g1 ? g0 : -1;
      const int32_t* q = pb.qweight + k0 * ldq + n0 / 8;
      for (int64_t t = 0; t < nt; ++t)
        lut_avx2_indices(q + 16 * t * ldq, ldq, words, idx + t * kLutPairs * 32);
      const float* xs = x + (kBf16 ? 2 * k0 : k0);
      for (int64_t p = 0; p < 4 * words; ++p) {
        const uint8_t* tp = tab + p * 64;
        float* a = acc + (b * kLutPairs + p) * M * kPF;
        const uint8_t* ip = idx + p * 32;
        // Rows in passes of kRows, then the rest (a row's chain sums take 2 ymm for bf16, 4 for
        // fp16, of the 16; fp16 in 3s: 3 rows = 12 ymm, 1.03-1.07x faster at M = 5-7 than 2s).
        constexpr int64_t kRows = kBf16 ? 4 : 3;
        int64_t m = 0;
        for (; m + kRows <= M; m += kRows)
          lut_avx2_pair<D, kRows>(ip, tp, tab_off, nt, xs + m * ldx, ldx, a + m * kPF);
        const float* xm = xs + m * ldx;
        float* am = a + m * kPF;
        if constexpr (kRows > 3) {
          if (M - m == 3) lut_avx2_pair<D, 3>(ip, tp, tab_off, nt, xm, ldx, am);
        }
        if constexpr (kRows > 2) {
          if (M - m == 2) lut_avx2_pair<D, 2>(ip, tp, tab_off, nt, xm, ldx, am);
        }
        if (M - m == 1) lut_avx2_pair<D, 1>(ip, tp, tab_off, nt, xm, ldx, am);
      }
    }
  }
  // Each column's chains summed in lane order, then rounded to T.
  for (int64_t b = 0; b < nblocks; ++b) {
    const int64_t n0 = n_begin + b * kBlockN;
    const int64_t ncols = std::min(kBlockN, n_end - n0);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t col = 0; col < ncols; ++col) {
        const int64_t p = col / 8 * 4 + col % 4, half = (col % 8) / 4;
        const float* a = acc + ((b * kLutPairs + p) * M + m) * kPF;
        float sum;
        if constexpr (kBf16) {  // chains 0-3: a[4 half + j]; 4-7: a[8 + 4 half + j]
          sum = a[4 * half];
          for (int j = 1; j < 4; ++j) sum += a[4 * half + j];
          for (int j = 0; j < 4; ++j) sum += a[8 + 4 * half + j];
        } else {  // chains 0-7: a[8 half + j]; 8-15: a[16 + 8 half + j]
          sum = a[8 * half];
          for (int j = 1; j < 8; ++j) sum += a[8 * half + j];
          for (int j = 0; j < 8; ++j) sum += a[16 + 8 * half + j];
        }
        pb.out[m * pb.size_n + n0 + col] = round_to<D>(sum);
      }
  }
}

}  // namespace awq_cpu
}  // namespace w4k
