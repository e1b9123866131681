// AVX2 path of the int8-activation mode (w4a8_gemm, awq_gemm_a8), torch-free: for CPUs without
// AVX-512 VNNI (AWQ: without VBMI), or W4K_CPU_ISA=avx2. The scheme, the layouts and the fp32
// epilogue order it shares with the other paths are in cpu/w4a8_gemm_kernel.h; this path keeps
// them exactly (the same panel column order, PanelTables, the same quantized activations), so
// it gives their bits with any thread count.
//
// Per (block of K, 64-column chunk) the weight codes are decoded into an L1 panel, the layout
// of the AVX-512 path's panels: quad q (4 k-rows, kernel k order) at byte 256 q, panel column p
// at dword p of the quad, its 4 bytes the codes of rows 4q .. 4q + 3 of column col[p]:
//   panel[256 q + 4 p + i] = code(k0 + 4 q + i, col[p])        (q < block / 4, p < 64, i < 4)
// * Marlin: shifts, masks and two in-lane vpunpck per 8 words, as the AVX-512 decode (a
//   128-bit block t of the result is 4 panel dwords of quad t); vperm2i128 pairs two word
//   groups' block t into one 32-byte store.
// * AWQ: the 4 rows of a quad (32 bytes each: 64 columns) are byte-interleaved by vpunpck
//   (dword B = byte B of rows 0..3), vperm2i128 puts the dwords in byte order, and the low and
//   high nibbles give panel columns 0..31 and 32..63. A pair of chunks is decoded together, so
//   each 64-byte line of a weight row is read once (rows N / 2 bytes apart share few L1 sets).
// Then a register tile of R rows x 8 NV panel columns sums the block exactly in int32:
// * AVX-VNNI (CPUs with the avxvnni flag; W4K_A8_AVXVNNI=0 turns it off): vpdpbusd ymm
//   (VEX), u8 code x s8 activation, 4 products per dword lane, one instruction per quad;
// * otherwise vpmaddubsw + vpmaddwd: vpmaddubsw sums the u8 x s8 products of a byte pair
//   into int16 with saturation, but a pair here is at most 2 * 15 * 127 = 3810 in magnitude
//   (codes 0..15, |qa| <= 127), and two quads' pairs added in int16 at most 7620 < 32767, so
//   nothing saturates and the sums stay exact; vpmaddwd by 1 widens the pairs to int32.
// and then the shared epilogue per block: isum = dot - z * sumqa, t = sa * sw, c = fma(float
// (isum), t, c), blocks ascending; natural column order, + bias, one rounding at the end.
#pragma once

#include <cstdlib>
#include <cstring>

#include "cpu/w4a8_gemm_kernel.h"

namespace w4k::cpu {

// The AVX2 path needs AVX2 + FMA + F16C (F16C: the fp16 output rounding).
inline bool a8_avx2_supported() {
#ifdef W4K_HAVE_A8_AVX512
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                         __builtin_cpu_supports("f16c");
  return ok;
#else
  return false;
#endif
}

// Whether the AVX2 path sums with AVX-VNNI vpdpbusd: the CPU's avxvnni flag, unless the
// environment variable W4K_A8_AVXVNNI is "0" (read per call, as W4K_CPU_ISA: tests compare the
// two variants on a CPU that has it). Either variant gives the same bits.
inline bool a8_avx2_use_vnni() {
#ifdef W4K_HAVE_A8_AVX512
  static const bool has = __builtin_cpu_supports("avxvnni");
  if (!has) return false;
  const char* env = std::getenv("W4K_A8_AVXVNNI");
  return env == nullptr || std::strcmp(env, "0") != 0;
#else
  return false;
#endif
}

#ifdef W4K_HAVE_A8_AVX512

#define W4K_A8_AVX2 __attribute__((target("avx2,fma,f16c")))
#define W4K_A8_AVXVNNI __attribute__((target("avx2,fma,f16c,avxvnni")))

// ---- weight decode into the panel ----------------------------------------------------------

// One Marlin k-tile of one chunk (128 words) -> 4 quads of the panel (4 x 256 bytes). Words
// 16c + 4t + j (c = 4h + cc): 128-bit block t of the vector of words 16c + 4t' .. (t' = t, t + 1)
// gives, after the pair shuffle and the nibble spread, panel dwords 16g + 4cc .. + 3 of quad t
// (g = h for byte pairs (0, 2) / (1, 3) of words j = 0, 1, g = 2 + h for words 2, 3).
W4K_A8_AVX2 inline void decode_marlin_tile_avx2(const int32_t* words, uint8_t* panel) {
  const __m256i even = _mm256_set1_epi32(0x000f000f), odd = _mm256_set1_epi32(0x0f000f00);
  for (int h = 0; h < 2; ++h) {
    for (int tp = 0; tp < 4; tp += 2) {  // quads tp, tp + 1
      for (int cc = 0; cc < 4; cc += 2) {  // word groups cc, cc + 1: 32 bytes of the panel
        __m256i d[2][2];  // [word group][words 0, 1 / words 2, 3 of each 128-bit block]
        for (int i = 0; i < 2; ++i) {
          const __m256i w = _mm256_loadu_si256(
              reinterpret_cast<const __m256i*>(words + 16 * (4 * h + cc + i) + 4 * tp));
          // column A (bytes 0, 2) and column B (bytes 1, 3) of each word, nibbles to bytes
          const __m256i a = _mm256_or_si256(_mm256_and_si256(w, even),
                                            _mm256_and_si256(_mm256_slli_epi32(w, 4), odd));
          const __m256i b = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(w, 8), even),
                                            _mm256_and_si256(_mm256_srli_epi32(w, 4), odd));
          d[i][0] = _mm256_unpacklo_epi32(a, b);
          d[i][1] = _mm256_unpackhi_epi32(a, b);
        }
        for (int e = 0; e < 2; ++e) {
          uint8_t* dst = panel + 64 * (2 * e + h) + 16 * cc;
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 256 * tp),
                              _mm256_permute2x128_si256(d[0][e], d[1][e], 0x20));
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 256 * (tp + 1)),
                              _mm256_permute2x128_si256(d[0][e], d[1][e], 0x31));
        }
      }
    }
  }
}

// AWQ: one quad (rows k .. k + 3 of one chunk: 8 words per row, row stride ldq words) -> one
// panel quad. Panel dword p = 16 g + lane holds byte B = 16 (g % 2) + lane of the 4 rows, its
// low nibble for g < 2, its high nibble for g >= 2 (PanelTables' AWQ column order).
W4K_A8_AVX2 inline void decode_awq_quad_avx2(const int32_t* words, int64_t ldq, uint8_t* panel) {
  const __m256i r0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words));
  const __m256i r1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words + ldq));
  const __m256i r2 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words + 2 * ldq));
  const __m256i r3 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words + 3 * ldq));
  const __m256i a_lo = _mm256_unpacklo_epi8(r0, r1), a_hi = _mm256_unpackhi_epi8(r0, r1);
  const __m256i b_lo = _mm256_unpacklo_epi8(r2, r3), b_hi = _mm256_unpackhi_epi8(r2, r3);
  // u0 = bytes 0-3 | 16-19, u1 = 4-7 | 20-23, u2 = 8-11 | 24-27, u3 = 12-15 | 28-31
  const __m256i u0 = _mm256_unpacklo_epi16(a_lo, b_lo), u1 = _mm256_unpackhi_epi16(a_lo, b_lo);
  const __m256i u2 = _mm256_unpacklo_epi16(a_hi, b_hi), u3 = _mm256_unpackhi_epi16(a_hi, b_hi);
  const __m256i v[4] = {_mm256_permute2x128_si256(u0, u1, 0x20),   // bytes 0-7
                        _mm256_permute2x128_si256(u2, u3, 0x20),   // 8-15
                        _mm256_permute2x128_si256(u0, u1, 0x31),   // 16-23
                        _mm256_permute2x128_si256(u2, u3, 0x31)};  // 24-31
  const __m256i nib = _mm256_set1_epi8(0x0f);
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(panel + 32 * i), _mm256_and_si256(v[i], nib));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(panel + 128 + 32 * i),
                        _mm256_and_si256(_mm256_srli_epi16(v[i], 4), nib));
  }
}

// Marlin: the panel of block [k0, k0 + block) of chunk ch; the next block's tiles of the chunk
// prefetched into L2 (k-tiles are 8N bytes apart: the hardware prefetchers don't follow).
W4K_A8_AVX2 inline void decode_marlin_panel_avx2(const W4a8Problem& p, int64_t k0, int64_t ch,
                                                 uint8_t* panel) {
  const bool ahead = k0 + 2 * p.block <= p.size_k;
  for (int64_t kt = k0 / 16; kt < (k0 + p.block) / 16; ++kt) {
    const int32_t* tile = p.qweight + kt * 2 * p.size_n + 128 * ch;
    if (ahead) {
      const char* next = reinterpret_cast<const char*>(tile + (p.block / 16) * 2 * p.size_n);
      for (int l = 0; l < 512; l += 64) _mm_prefetch(next + l, _MM_HINT_T1);
    }
    decode_marlin_tile_avx2(tile, panel + (kt - k0 / 16) * 1024);
  }
}

// AWQ: the panels of block [k0, k0 + block) of chunks [ch0, ch1) (one or two), row quad by row
// quad across the chunks; the next block's rows prefetched into L2.
W4K_A8_AVX2 inline void decode_awq_panels_avx2(const W4a8Problem& p, int64_t k0, int64_t ch0,
                                               int64_t ch1, uint8_t* panels) {
  const int64_t ldq = p.size_n / 8, panel_bytes = p.block * 64;
  const bool ahead = k0 + 2 * p.block <= p.size_k;
  for (int64_t k = k0; k < k0 + p.block; k += 4) {
    if (ahead)
      for (int r = 0; r < 4; ++r)
        _mm_prefetch(reinterpret_cast<const char*>(p.qweight + (k + r + p.block) * ldq + 8 * ch0),
                     _MM_HINT_T1);
    for (int64_t ch = ch0; ch < ch1; ++ch)
      decode_awq_quad_avx2(p.qweight + k * ldq + 8 * ch, ldq,
                           panels + (ch - ch0) * panel_bytes + (k - k0) * 64);
  }
}

// ---- register tiles --------------------------------------------------------------------------

// The block's epilogue for R rows x 8 NV panel columns from panel column c0: isum = dot -
// z * sumqa, t = sa * sw, c = fma(float(isum), t, c) (the order of w4a8_gemm_kernel.h).
template <int R, int NV>
W4K_A8_AVX2 inline __attribute__((always_inline)) void epilogue_tile_avx2(
    const __m256i (&dot)[R][NV], const float* sa, const int32_t* sumqa, int64_t lds,
    const float* sw, const int32_t* z, float* c, int64_t ldc) {
#pragma GCC unroll 6
  for (int r = 0; r < R; ++r) {
    const __m256i sq = _mm256_set1_epi32(sumqa[r * lds]);
    const __m256 sav = _mm256_set1_ps(sa[r * lds]);
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      const __m256i isum = _mm256_sub_epi32(
          dot[r][v],
          _mm256_mullo_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(z + 8 * v)), sq));
      const __m256 t = _mm256_mul_ps(sav, _mm256_loadu_ps(sw + 8 * v));
      float* cv = c + r * ldc + 8 * v;
      _mm256_storeu_ps(cv, _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), t, _mm256_loadu_ps(cv)));
    }
  }
}

// R rows x 8 NV panel columns (panel, sw, z, c already offset to the first column) over one
// block of nq quads (nq even), vpmaddubsw + vpmaddwd: two quads' u8 x s8 pair sums added in
// int16 (|.| <= 2 * 3810, see the top), then widened and added in int32.
template <int R, int NV>
W4K_A8_AVX2 __attribute__((noinline)) void tile_a8_avx2(
    const uint8_t* panel, int64_t nq, const int8_t* qa, int64_t lda_q, const float* sa,
    const int32_t* sumqa, int64_t lds, const float* sw, const int32_t* z, float* c,
    int64_t ldc) {
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i dot[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) dot[r][v] = _mm256_setzero_si256();
  for (int64_t q = 0; q < nq; q += 2, panel += 512) {
    __m256i a0[R], a1[R];
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      int32_t x0, x1;
      std::memcpy(&x0, qa + r * lda_q + 4 * q, 4);
      std::memcpy(&x1, qa + r * lda_q + 4 * q + 4, 4);
      a0[r] = _mm256_set1_epi32(x0);
      a1[r] = _mm256_set1_epi32(x1);
    }
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      const __m256i w0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + 32 * v));
      const __m256i w1 =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + 256 + 32 * v));
#pragma GCC unroll 6
      for (int r = 0; r < R; ++r) {
        const __m256i pairs =
            _mm256_add_epi16(_mm256_maddubs_epi16(w0, a0[r]), _mm256_maddubs_epi16(w1, a1[r]));
        dot[r][v] = _mm256_add_epi32(dot[r][v], _mm256_madd_epi16(pairs, ones));
      }
    }
  }
  epilogue_tile_avx2<R, NV>(dot, sa, sumqa, lds, sw, z, c, ldc);
}

// The same tile with AVX-VNNI: one vpdpbusd (VEX) per quad, row and 8 columns.
template <int R, int NV>
W4K_A8_AVXVNNI __attribute__((noinline)) void tile_a8_avxvnni(
    const uint8_t* panel, int64_t nq, const int8_t* qa, int64_t lda_q, const float* sa,
    const int32_t* sumqa, int64_t lds, const float* sw, const int32_t* z, float* c,
    int64_t ldc) {
  __m256i dot[R][NV];
  for (int r = 0; r < R; ++r)
    for (int v = 0; v < NV; ++v) dot[r][v] = _mm256_setzero_si256();
  for (int64_t q = 0; q < nq; ++q, panel += 256) {
    __m256i w[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v)
      w[v] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(panel + 32 * v));
#pragma GCC unroll 6
    for (int r = 0; r < R; ++r) {
      int32_t x;
      std::memcpy(&x, qa + r * lda_q + 4 * q, 4);
      const __m256i a = _mm256_set1_epi32(x);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) dot[r][v] = _mm256_dpbusd_avx_epi32(dot[r][v], w[v], a);
    }
  }
  epilogue_tile_avx2<R, NV>(dot, sa, sumqa, lds, sw, z, c, ldc);
}

// Rows of tile_a8_avx2 / tile_a8_avxvnni per pass at 2+ rows (x 16 columns: 2 ymm per row).
// vpmaddubsw: 3 x 2 accumulators + 2 x 2 weights + the broadcasts and products fit the 16 ymm
// (with 4 rows GCC 12 kept 7 accumulators on the stack; the two timed alike on a shared
// machine); VNNI needs no second quad: 6 x 2 accumulators + 2 weights + 1 broadcast.
constexpr int kA8Avx2Rows = 3;
constexpr int kA8AvxVnniRows = 6;

// One block of one chunk's panel for `rows` rows: one row takes all 64 columns at once (8
// independent accumulators); more rows go 16 columns at a time in tiles of kRows rows.
template <bool kVnni>
W4K_A8_AVX2 inline void panel_rows_avx2(const uint8_t* panel, int64_t nq, const int8_t* qa,
                                        int64_t lda_q, const float* sa, const int32_t* sumqa,
                                        int64_t lds, const float* sw, const int32_t* z, float* c,
                                        int64_t ldc, int64_t rows) {
#define W4K_A8_TILE(R, NV, c0, r0)                                                             \
  (kVnni ? tile_a8_avxvnni<R, NV> : tile_a8_avx2<R, NV>)(                                      \
      panel + 4 * (c0), nq, qa + (r0) * lda_q, lda_q, sa + (r0) * lds, sumqa + (r0) * lds, lds, \
      sw + (c0), z + (c0), c + (r0) * ldc + (c0), ldc)
  if (rows == 1) {
    W4K_A8_TILE(1, 8, 0, 0);
    return;
  }
  constexpr int kRows = kVnni ? kA8AvxVnniRows : kA8Avx2Rows;
  for (int c0 = 0; c0 < 64; c0 += 16) {
    int64_t r = 0;
    for (; r + kRows <= rows; r += kRows) W4K_A8_TILE(kRows, 2, c0, r);
    switch (rows - r) {
      case 5: W4K_A8_TILE(5, 2, c0, r); break;
      case 4: W4K_A8_TILE(4, 2, c0, r); break;
      case 3: W4K_A8_TILE(3, 2, c0, r); break;
      case 2: W4K_A8_TILE(2, 2, c0, r); break;
      case 1: W4K_A8_TILE(1, 2, c0, r); break;
      default: break;
    }
  }
#undef W4K_A8_TILE
}

// ---- output ------------------------------------------------------------------------------------

// One row of 64 fp32 results rounded once to the half type, as float_to_half_bits (the same
// NaN bits as torch: fp16 sign | 0x7e00, bf16 0x7fc0; narrow_row_avx512 in AVX2).
W4K_A8_AVX2 inline void narrow_row64_avx2(const float* src, HalfType type, uint16_t* dst) {
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  for (int n = 0; n < 64; n += 16) {
    __m256i h[2];
    for (int i = 0; i < 2; ++i) {
      const __m256 f = _mm256_loadu_ps(src + n + 8 * i);
      const __m256i x = _mm256_castps_si256(f);
      const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, abs_mask), inf);
      if (type == HalfType::kFloat16) {
        const __m256i r = _mm256_cvtepu16_epi32(
            _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        const __m256i qnan = _mm256_or_si256(
            _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x8000)),
            _mm256_set1_epi32(0x7e00));
        h[i] = _mm256_blendv_epi8(r, qnan, nan);
      } else {
        const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
        const __m256i r = _mm256_srli_epi32(
            _mm256_add_epi32(x, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
        h[i] = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc0), nan);
      }
    }
    // 16 dwords <= 0xffff -> 16 halves in order (vpackusdw packs per 128-bit lane)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + n),
                        _mm256_permute4x64_epi64(_mm256_packus_epi32(h[0], h[1]), 0xd8));
  }
}

// ---- driver ------------------------------------------------------------------------------------

// Columns of chunks [ch0, ch1), rows [m0, m1). Blocks of K outer (ascending: the epilogue's
// order), chunks inner, as the AVX-512 driver.
template <bool kVnni>
W4K_A8_AVX2 void w4a8_chunks_avx2(const W4a8Problem& p, int64_t ch0, int64_t ch1, int64_t m0,
                                  int64_t m1) {
  const PanelTables& tb = panel_tables(p.format);
  const int64_t nch = ch1 - ch0, rows = m1 - m0, ldc = 64 * nch, lds = p.num_blocks;
  thread_local std::vector<float> acc_buf;
  thread_local std::vector<uint8_t> panel_buf;
  acc_buf.assign(rows * ldc, 0.0f);
  const bool awq = p.format == A8Format::kAwq;
  const int64_t panel_bytes = p.block * 64;  // Marlin: one chunk's panel; AWQ: a pair of chunks
  panel_buf.resize((awq ? 2 : 1) * panel_bytes);
  alignas(32) float sw[64];
  alignas(32) int32_t z[64];
  const int64_t nq = p.block / 4;
  for (int64_t b = 0; b < p.num_blocks; ++b) {
    const int64_t k0 = b * p.block, g = k0 / p.group_size;
    for (int64_t ch = ch0; ch < ch1; ++ch) {
      uint8_t* panel = panel_buf.data() + (awq ? (ch - ch0) % 2 * panel_bytes : 0);
      if (!awq)
        decode_marlin_panel_avx2(p, k0, ch, panel);
      else if ((ch - ch0) % 2 == 0)
        decode_awq_panels_avx2(p, k0, ch, std::min(ch + 2, ch1), panel_buf.data());
      gather_scales_zeros(p, tb, g, ch, sw, z);
      panel_rows_avx2<kVnni>(panel, nq, p.qa + m0 * p.lda_q + k0, p.lda_q,
                             p.sa + m0 * lds + b, p.sumqa + m0 * lds + b, lds, sw, z,
                             acc_buf.data() + 64 * (ch - ch0), ldc, rows);
    }
  }
  // Back to natural column order (+ bias), one rounding to T.
  alignas(32) float y[64];
  for (int64_t m = m0; m < m1; ++m)
    for (int64_t ch = ch0; ch < ch1; ++ch) {
      const float* c = acc_buf.data() + (m - m0) * ldc + 64 * (ch - ch0);
      for (int n = 0; n < 64; ++n) y[n] = c[tb.pos[n]];
      if (p.bias)
        for (int n = 0; n < 64; n += 8)
          _mm256_storeu_ps(y + n, _mm256_add_ps(_mm256_loadu_ps(y + n),
                                                _mm256_loadu_ps(p.bias + 64 * ch + n)));
      narrow_row64_avx2(y, p.type, p.out + m * p.size_n + 64 * ch);
    }
}

#undef W4K_A8_AVX2
#undef W4K_A8_AVXVNNI

#endif  // W4K_HAVE_A8_AVX512

}  // namespace w4k::cpu
