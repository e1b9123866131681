// AVX-512 (VNNI, and VBMI for AWQ) path of the int8-activation mode, torch-free: the weight
// decodes, the register-tiled vpdpbusd kernels and the driver of one work item. The scheme,
// the layouts and the epilogue order it shares with the portable path are described in
// cpu/w4a8_gemm_kernel.h. Every function carries its target attribute; the binding calls the
// driver only after the runtime check (a8_avx512_supported and cpu_isa()).
#pragma once

#include "cpu/amx_bf16.h"
#include "cpu/w4a8_gemm_kernel.h"

namespace w4k::cpu {

// ---- AVX-512 VNNI path ----

// The AVX-512 path runs when the CPU has AVX-512 F/BW/VL + VNNI (cpu_isa() == kAvx512, not
// capped by W4K_CPU_ISA) and, for the AWQ format, VBMI.
inline bool a8_avx512_supported(A8Format f) {
#ifdef W4K_HAVE_A8_AVX512
  static const bool vbmi = __builtin_cpu_supports("avx512vbmi");
  return f == A8Format::kMarlin || vbmi;
#else
  (void)f;
  return false;
#endif
}

#ifdef W4K_HAVE_A8_AVX512

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#define W4K_A8_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")))
// The AWQ decode also needs VBMI (vpermt2b); those functions are called, not inlined, from the
// driver, which runs them only after the runtime check (a8_avx512_supported).
#define W4K_A8_TARGET_VBMI \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx512dq,avx512vbmi")))

// Four zmm (row cc, 128-bit block t) -> four zmm (row t, block cc): a 4 x 4 block transpose.
W4K_A8_TARGET inline void transpose_blocks(__m512i v[4]) {
  const __m512i t0 = _mm512_shuffle_i64x2(v[0], v[1], 0x44);
  const __m512i t1 = _mm512_shuffle_i64x2(v[0], v[1], 0xee);
  const __m512i t2 = _mm512_shuffle_i64x2(v[2], v[3], 0x44);
  const __m512i t3 = _mm512_shuffle_i64x2(v[2], v[3], 0xee);
  v[0] = _mm512_shuffle_i64x2(t0, t2, 0x88);
  v[1] = _mm512_shuffle_i64x2(t0, t2, 0xdd);
  v[2] = _mm512_shuffle_i64x2(t1, t3, 0x88);
  v[3] = _mm512_shuffle_i64x2(t1, t3, 0xdd);
}

// One zmm of Marlin words -> the two zmm of their codes: per 128-bit block (words j = 0..3),
// d1 = dwords (A, B) of word 0, (A, B) of word 1 and d2 the same for words 2, 3, where A holds
// the low and high nibbles of bytes 0 and 2 (column A, rows 2t, 2t + 8, 2t + 1, 2t + 9) and B
// those of bytes 1 and 3 (column A + 8). Only shifts, masks, byte blends and in-lane unpacks:
// on Zen 4 a vpshufb or vpternlogd takes issue slots from vpdpbusd, these mostly don't
// (measured: 8 vpternlogd next to 8 vpdpbusd add 8 cycles, 8 vpandd or vpsrld none).
W4K_A8_TARGET inline __attribute__((always_inline)) void decode_marlin_words(__m512i w,
                                                                           __m512i& d1,
                                                                           __m512i& d2) {
  // lo: bytes (n0, n2, n4, n6), hi: (n1, n3, n5, n7); a = bytes (lo0, hi0, lo2, hi2) = column
  // A, b = (lo1, hi1, lo3, hi3) = column B, by byte blends
  const __m512i nib = _mm512_set1_epi32(0x0f0f0f0f);
  const __m512i lo = _mm512_and_si512(w, nib), hi = _mm512_and_si512(_mm512_srli_epi32(w, 4), nib);
  constexpr __mmask64 kOddBytes = 0xaaaaaaaaaaaaaaaaull;
  const __m512i a = _mm512_mask_blend_epi8(kOddBytes, lo, _mm512_slli_epi32(hi, 8));
  const __m512i b = _mm512_mask_blend_epi8(kOddBytes, _mm512_srli_epi32(lo, 8), hi);
  d1 = _mm512_unpacklo_epi32(a, b);
  d2 = _mm512_unpackhi_epi32(a, b);
}

// The same two zmm by byte shuffles: one vpshufb per output zmm puts a word's bytes 0, 2 (or
// 1, 3) at bytes 0 and 2 of a dword, and (x | x << 4) & 0x0f0f0f0f spreads the nibbles. Fewer
// instructions than decode_marlin_words (6 against 9 per zmm of words), but 4 of them compete
// with vpdpbusd: the better choice where few rows share a decode (1-2 rows, measured).
W4K_A8_TARGET inline __attribute__((always_inline)) void decode_marlin_words_shuf(__m512i w,
                                                                                __m512i& d1,
                                                                                __m512i& d2) {
  const __m512i lo = _mm512_broadcast_i32x4(
      _mm_setr_epi8(0, -1, 2, -1, 1, -1, 3, -1, 4, -1, 6, -1, 5, -1, 7, -1));
  const __m512i hi = _mm512_broadcast_i32x4(
      _mm_setr_epi8(8, -1, 10, -1, 9, -1, 11, -1, 12, -1, 14, -1, 13, -1, 15, -1));
  const __m512i nib = _mm512_set1_epi32(0x0f0f0f0f);
  const __m512i x1 = _mm512_shuffle_epi8(w, lo), x2 = _mm512_shuffle_epi8(w, hi);
  d1 = _mm512_ternarylogic_epi32(x1, _mm512_slli_epi32(x1, 4), nib, 0xa8);
  d2 = _mm512_ternarylogic_epi32(x2, _mm512_slli_epi32(x2, 4), nib, 0xa8);
}

// Four named int32 accumulators p##0 .. p##3, zeroed (named, not an array: GCC kept arrays of
// zmm accumulators on the stack), and p##k += u8 e_k x s8 a (vpdpbusd) for the four of them.
#define W4K_A8_ZERO4(p)                                                       \
  __m512i p##0 = _mm512_setzero_si512(), p##1 = _mm512_setzero_si512(),       \
          p##2 = _mm512_setzero_si512(), p##3 = _mm512_setzero_si512();
#define W4K_A8_DOT4(p, e0, e1, e2, e3, a) \
  p##0 = _mm512_dpbusd_epi32(p##0, e0, a); \
  p##1 = _mm512_dpbusd_epi32(p##1, e1, a); \
  p##2 = _mm512_dpbusd_epi32(p##2, e2, a); \
  p##3 = _mm512_dpbusd_epi32(p##3, e3, a);

// The next block's `lines` 64-byte lines of the 4 AutoAWQ weight rows of a quad (rows ldq words
// apart, the next block ahead_words on) into L2, as the quad is decoded.
W4K_A8_TARGET inline __attribute__((always_inline)) void prefetch_quad_rows(
    const int32_t* words, int64_t ldq, int64_t ahead_words, int lines) {
  for (int r = 0; r < 4; ++r) {
    const char* next = reinterpret_cast<const char*>(words + r * ldq + ahead_words);
    for (int l = 0; l < lines; ++l) _mm_prefetch(next + 64 * l, _MM_HINT_T1);
  }
}

// The 512 bytes of one Marlin k-tile of one chunk into L2, one block ahead of their use (k-tiles
// are 8N bytes apart, which the hardware prefetchers don't follow). Issued tile by tile as the
// current block is read: a block's worth at once overflows the miss buffers. Not into L1: with
// N a power of two the tiles of a block map to the same few L1 sets.
W4K_A8_TARGET inline void prefetch_tile(const int32_t* tile) {
  const char* base = reinterpret_cast<const char*>(tile);
  for (int l = 0; l < 512; l += 64) _mm_prefetch(base + l, _MM_HINT_T1);
}

// One Marlin k-tile of one chunk (128 words) -> 4 quads of the panel (4 x 256 bytes).
W4K_A8_TARGET inline void decode_marlin_tile(const int32_t* words, uint8_t* panel) {
  for (int h = 0; h < 2; ++h) {
    __m512i raw[4];  // transposed before the decode (they commute): 8 vshufi64x2, not 16
    for (int cc = 0; cc < 4; ++cc) raw[cc] = _mm512_loadu_si512(words + 16 * (4 * h + cc));
    transpose_blocks(raw);
    for (int t = 0; t < 4; ++t) {
      __m512i d1, d2;
      decode_marlin_words(raw[t], d1, d2);
      _mm512_storeu_si512(panel + 256 * t + 64 * h, d1);
      _mm512_storeu_si512(panel + 256 * t + 64 * (2 + h), d2);
    }
  }
}

// AWQ: one quad (rows k .. k + 3, 64 columns: 8 words per row, row stride ldq words) -> 4 zmm,
// dword = rows (k, k + 1, k + 2, k + 3) of one column. The 4 rows' 32 bytes sit in two zmm
// (rows 0 | 1, rows 2 | 3); one vpermt2b per output zmm gathers byte 4w + b of every row
// (w = 4(e % 2) + lane / 4, b = lane % 4), then the low (e < 2) or high nibble is kept: byte
// 4w + b of an AWQ row holds columns 8w + AWQ_ORDER[2b] (low) and 8w + AWQ_ORDER[2b + 1].
struct AwqQuadIdx {
  __m512i idx[2];
};
W4K_A8_TARGET_VBMI inline AwqQuadIdx awq_quad_idx() {
  alignas(64) uint8_t t[2][64];
  for (int e = 0; e < 2; ++e)
    for (int lane = 0; lane < 16; ++lane)
      for (int r = 0; r < 4; ++r)
        t[e][4 * lane + r] = static_cast<uint8_t>(32 * r + 4 * (4 * e + lane / 4) + lane % 4);
  return {{_mm512_load_si512(t[0]), _mm512_load_si512(t[1])}};
}

W4K_A8_TARGET_VBMI inline void decode_awq_quad_regs(const int32_t* words, int64_t ldq,
                                               const AwqQuadIdx& ix, __m512i out[4]) {
  const __m512i nib = _mm512_set1_epi8(0x0f);
  const __m512i x01 = _mm512_inserti64x4(
      _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(words))),
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words + ldq)), 1);
  const __m512i x23 = _mm512_inserti64x4(
      _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(words + 2 * ldq))),
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(words + 3 * ldq)), 1);
  const __m512i t0 = _mm512_permutex2var_epi8(x01, ix.idx[0], x23);
  const __m512i t1 = _mm512_permutex2var_epi8(x01, ix.idx[1], x23);
  out[0] = _mm512_and_si512(t0, nib);
  out[1] = _mm512_and_si512(t1, nib);
  out[2] = _mm512_and_si512(_mm512_srli_epi16(t0, 4), nib);
  out[3] = _mm512_and_si512(_mm512_srli_epi16(t1, 4), nib);
}

// Marlin: the panel of block [k0, k0 + block) of chunk ch (the next block's tiles prefetched).
W4K_A8_TARGET inline void decode_panel(const W4a8Problem& p, int64_t k0, int64_t ch,
                                       uint8_t* panel) {
  const bool ahead = k0 + 2 * p.block <= p.size_k;
  for (int64_t kt = k0 / 16; kt < (k0 + p.block) / 16; ++kt) {
    const int32_t* tile = p.qweight + kt * 2 * p.size_n + 128 * ch;
    if (ahead) prefetch_tile(tile + (p.block / 16) * 2 * p.size_n);
    decode_marlin_tile(tile, panel + (kt - k0 / 16) * 1024);
  }
}

// 16 zero points from the zero-point words zw (one zmm): the nibble at bit shift[i] of word
// word[i] (tables of a panel or pair order).
W4K_A8_TARGET inline __m512i zero_points16(__m512i zw, const int8_t* word, const int8_t* shift) {
  const __m512i w = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(word)));
  const __m512i sh =
      _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(shift)));
  return _mm512_and_si512(_mm512_srlv_epi32(_mm512_permutexvar_epi32(w, zw), sh),
                          _mm512_set1_epi32(15));
}

// Scales and zero points of group g, chunk ch, in panel order (vector gathers of the 64).
W4K_A8_TARGET inline void gather_scales_zeros_avx512(const W4a8Problem& p, const PanelTables& tb,
                                                     int64_t g, int64_t ch, float* sw, int32_t* z) {
  const uint16_t* s_row = p.scales + g * p.size_n + 64 * ch;
  const bool per_channel_marlin = p.format == A8Format::kMarlin && p.num_groups == 1;
  const int8_t* src = per_channel_marlin ? tb.scale_src_pc : tb.scale_src;
  const __m512i s_lo = _mm512_loadu_si512(s_row), s_hi = _mm512_loadu_si512(s_row + 32);
  const int32_t* z_words = p.zeros ? p.zeros + g * (p.size_n / 8) + 8 * ch : nullptr;
  const __m512i zw = z_words ? _mm512_castsi256_si512(_mm256_loadu_si256(
                                   reinterpret_cast<const __m256i*>(z_words)))
                             : _mm512_setzero_si512();
  // 64 halves zero-extended to 4 x 16 dwords, gathered with two vpermt2d and a blend.
  const __m512i s0 = _mm512_cvtepu16_epi32(_mm512_castsi512_si256(s_lo));
  const __m512i s1 = _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(s_lo, 1));
  const __m512i s2 = _mm512_cvtepu16_epi32(_mm512_castsi512_si256(s_hi));
  const __m512i s3 = _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(s_hi, 1));
  for (int q = 0; q < 4; ++q) {
    const __m512i idx = _mm512_cvtepi8_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 16 * q)));
    const __m512i a01 = _mm512_permutex2var_epi32(s0, idx, s1);
    const __m512i a23 = _mm512_permutex2var_epi32(s2, idx, s3);
    const __m512i bits = _mm512_mask_mov_epi32(
        a01, _mm512_cmpge_epi32_mask(idx, _mm512_set1_epi32(32)), a23);
    const __m512 f = p.type == HalfType::kFloat16
                         ? _mm512_cvtph_ps(_mm512_cvtepi32_epi16(bits))
                         : _mm512_castsi512_ps(_mm512_slli_epi32(bits, 16));
    _mm512_storeu_ps(sw + 16 * q, f);
    _mm512_storeu_si512(z + 16 * q, z_words ? zero_points16(zw, tb.zp_word + 16 * q,
                                                           tb.zp_shift + 16 * q)
                                            : _mm512_set1_epi32(8));
  }
}

// Epilogue of panel zmm g (16 columns) of one row into the fp32 sums c.
W4K_A8_TARGET inline void epilogue_one_a8(__m512i dots, int g, float sa, int32_t sumqa,
                                          const float* sw, const int32_t* z, float* c) {
  const __m512i isum = _mm512_sub_epi32(
      dots, _mm512_mullo_epi32(_mm512_loadu_si512(z + 16 * g), _mm512_set1_epi32(sumqa)));
  const __m512 t = _mm512_mul_ps(_mm512_set1_ps(sa), _mm512_loadu_ps(sw + 16 * g));
  _mm512_storeu_ps(c + 16 * g,
                   _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), t, _mm512_loadu_ps(c + 16 * g)));
}

// Epilogue of one row's 4 accumulators (64 panel columns) into the fp32 sums c.
W4K_A8_TARGET inline void epilogue_row_a8(__m512i i0, __m512i i1, __m512i i2, __m512i i3,
                                          float sa, int32_t sumqa, const float* sw,
                                          const int32_t* z, float* c) {
  const __m512i sq = _mm512_set1_epi32(sumqa);
  const __m512 sav = _mm512_set1_ps(sa);
  const __m512i acc[4] = {i0, i1, i2, i3};
  for (int g = 0; g < 4; ++g) {
    const __m512i isum =
        _mm512_sub_epi32(acc[g], _mm512_mullo_epi32(_mm512_loadu_si512(z + 16 * g), sq));
    const __m512 t = _mm512_mul_ps(sav, _mm512_loadu_ps(sw + 16 * g));
    _mm512_storeu_ps(c + 16 * g,
                     _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), t, _mm512_loadu_ps(c + 16 * g)));
  }
}

// Marlin, few rows: the words of zmm c of a k-tile decoded as d1 (columns c + 8d) and d2
// (32 + c + 8d) without the block transpose: 128-bit block t holds quad t of the tile. Each
// row's activation zmm holds quad t in block t (one vpermd per tile), and the 16 accumulators
// (c, d1/d2) are reduced over t once per block by the same transpose. One row, decoded in
// registers (two rows: marlin_2rows_half_a8).
W4K_A8_TARGET __attribute__((noinline)) void marlin_row_a8(
    const int32_t* words, int64_t tile_stride, bool ahead, int64_t ntiles,
    const int8_t* qa, float sa, int32_t sumqa, const float* sw, const int32_t* z, float* c) {
  const __m512i quad_of_block = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
#define W4K_A8_DECL(i) __m512i s##i = _mm512_setzero_si512(), u##i = _mm512_setzero_si512();
  W4K_A8_DECL(0) W4K_A8_DECL(1) W4K_A8_DECL(2) W4K_A8_DECL(3)
  W4K_A8_DECL(4) W4K_A8_DECL(5) W4K_A8_DECL(6) W4K_A8_DECL(7)
#undef W4K_A8_DECL
  for (int64_t kt = 0; kt < ntiles; ++kt) {
    const __m512i av = _mm512_permutexvar_epi32(
        quad_of_block,
        _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qa + 16 * kt))));
    const int32_t* w = words + kt * tile_stride;
    if (ahead) prefetch_tile(w + ntiles * tile_stride);
#define W4K_A8_STEP(i)                                                                      \
  {                                                                                         \
    __m512i d1, d2;                                                                         \
    decode_marlin_words_shuf(_mm512_loadu_si512(w + 16 * i), d1, d2);                       \
    s##i = _mm512_dpbusd_epi32(s##i, d1, av);                                               \
    u##i = _mm512_dpbusd_epi32(u##i, d2, av);                                               \
  }
    W4K_A8_STEP(0) W4K_A8_STEP(1) W4K_A8_STEP(2) W4K_A8_STEP(3)
    W4K_A8_STEP(4) W4K_A8_STEP(5) W4K_A8_STEP(6) W4K_A8_STEP(7)
#undef W4K_A8_STEP
  }
  // Panel zmm g = 2 * (d2) + (c >= 4): the sum over t of the block-transposed 4 accumulators.
  __m512i v0[4] = {s0, s1, s2, s3}, v1[4] = {s4, s5, s6, s7};
  __m512i v2[4] = {u0, u1, u2, u3}, v3[4] = {u4, u5, u6, u7};
  __m512i* vs[4] = {v0, v1, v2, v3};
  __m512i g[4];
  for (int i = 0; i < 4; ++i) {
    transpose_blocks(vs[i]);
    g[i] = _mm512_add_epi32(_mm512_add_epi32(vs[i][0], vs[i][1]),
                            _mm512_add_epi32(vs[i][2], vs[i][3]));
  }
  epilogue_row_a8(g[0], g[1], g[2], g[3], sa, sumqa, sw, z, c);
}

// AWQ, 1-2 rows, a lone chunk (the last of an odd count): one block of it decoded quad by quad
// in registers (no panel), R x 4 accumulators; the next block's rows of this chunk prefetched
// into L2 as it goes.
template <int R>
W4K_A8_TARGET_VBMI __attribute__((noinline)) void awq_rows_a8(
    const int32_t* words, int64_t ldq, int64_t nq, bool ahead, int64_t ahead_words,
    const int8_t* qa, int64_t lda_q, const float* sa, const int32_t* sumqa, int64_t lds,
    const float* sw, const int32_t* z, float* c, int64_t ldc) {
  static const AwqQuadIdx ix = awq_quad_idx();
  static_assert(R == 1 || R == 2);
  W4K_A8_ZERO4(c0) W4K_A8_ZERO4(c1)
  for (int64_t q = 0; q < nq; ++q, words += 4 * ldq) {
    if (ahead) prefetch_quad_rows(words, ldq, ahead_words, 1);
    __m512i e[4];
    decode_awq_quad_regs(words, ldq, ix, e);
#define W4K_A8_ROW(r)                                                                         \
  if constexpr (R > r) {                                                                      \
    const __m512i a = _mm512_set1_epi32(*reinterpret_cast<const int32_t*>(qa + r * lda_q + 4 * q)); \
    W4K_A8_DOT4(c##r, e[0], e[1], e[2], e[3], a)                                              \
  }
    W4K_A8_ROW(0) W4K_A8_ROW(1)
#undef W4K_A8_ROW
  }
  epilogue_row_a8(c00, c01, c02, c03, sa[0], sumqa[0], sw, z, c);
  if constexpr (R > 1)
    epilogue_row_a8(c10, c11, c12, c13, sa[lds], sumqa[lds], sw, z, c + ldc);
}

// ---- AWQ: chunk pairs decoded by byte unpacks ----
//
// A quad's four 64-byte lines W0..W3 (rows k .. k + 3 of a chunk pair: 16 words, 128 columns)
// become the dwords vpdpbusd takes (4 k-rows of one column) in two unpack stages: t0 / t1 =
// unpacklo / hi_epi8(W0, W1) (per 128-bit lane l: words 4l, 4l + 1 / 4l + 2, 4l + 3 of the two
// rows interleaved byte by byte), t2 / t3 the same of W2, W3, then u_i = unpacklo_epi16 (i even)
// or unpackhi_epi16 (i odd) of t_{i / 2} and t_{2 + i / 2}: dword (l, d) of u_i holds byte d of
// word 4l + i of the four rows. Its low nibbles (& 0x0f) are codes, its high nibbles (& 0xf0)
// codes times 16, taken out of the exact int32 sums by an arithmetic shift before the
// epilogue: the sums, and so the bits, are every path's. The zmm are the pair order of
// AwqPairTables. 8 unpacks and 8 ands per 8 zmm of codes, one uop each, where the vpermt2b
// decode (decode_awq_quad_regs) spends 2 vpermt2b (about 2 cycles each on a Sapphire Rapids
// class Xeon, measured), 2 vinserti64x4, 2 shifts and 4 ands per 4 zmm.

// Whether the AVX-512 path takes the AWQ chunk pairs (AWQ, not turned off).
inline bool awq_pairs_apply(const W4a8Problem& p) {
  return p.format == A8Format::kAwq && awq_pairs_enabled();
}

// u_kI of a quad's four lines w0..w3 (above). Callers take several u_i of the same lines; the
// t stage they share is computed once (the compiler merges the identical unpacks).
template <int kI>
W4K_A8_TARGET inline __attribute__((always_inline)) __m512i awq_pair_u(__m512i w0, __m512i w1,
                                                                      __m512i w2, __m512i w3) {
  const __m512i ta = kI / 2 ? _mm512_unpackhi_epi8(w0, w1) : _mm512_unpacklo_epi8(w0, w1);
  const __m512i tb = kI / 2 ? _mm512_unpackhi_epi8(w2, w3) : _mm512_unpacklo_epi8(w2, w3);
  return kI % 2 ? _mm512_unpackhi_epi16(ta, tb) : _mm512_unpacklo_epi16(ta, tb);
}

// Scales and zero points of group g for the chunk pair (ch, ch + 1), in pair order (128 each).
W4K_A8_TARGET inline void gather_awq_pair_avx512(const W4a8Problem& p, int64_t g, int64_t ch,
                                                 float* sw2, int32_t* z2) {
  const AwqPairTables& t = awq_pair_tables();
  const uint16_t* s_row = p.scales + g * p.size_n + 64 * ch;
  const __m512i s0 = _mm512_loadu_si512(s_row), s1 = _mm512_loadu_si512(s_row + 32);
  const __m512i s2 = _mm512_loadu_si512(s_row + 64), s3 = _mm512_loadu_si512(s_row + 96);
  for (int m = 0; m < 4; ++m) {  // 32 positions: the first chunk's scale or the second's
    const __m512i idx = _mm512_loadu_si512(t.scale_idx + 32 * m);
    const __m512i v = _mm512_mask_mov_epi16(_mm512_permutex2var_epi16(s0, idx, s1),
                                            t.scale_hi[m], _mm512_permutex2var_epi16(s2, idx, s3));
    for (int hh = 0; hh < 2; ++hh) {
      const __m256i h16 = hh ? _mm512_extracti64x4_epi64(v, 1) : _mm512_castsi512_si256(v);
      const __m512 f = p.type == HalfType::kFloat16
                           ? _mm512_cvtph_ps(h16)
                           : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h16), 16));
      _mm512_storeu_ps(sw2 + 32 * m + 16 * hh, f);
    }
  }
  const __m512i zw = p.zeros ? _mm512_loadu_si512(p.zeros + g * (p.size_n / 8) + 8 * ch)
                             : _mm512_setzero_si512();
  for (int j = 0; j < 8; ++j)
    _mm512_storeu_si512(z2 + 16 * j, p.zeros ? zero_points16(zw, t.zp_word + 16 * j,
                                                             t.zp_shift + 16 * j)
                                             : _mm512_set1_epi32(8));
}

// ---- AWQ, 1-4 rows: sweeps of whole strips ----
//
// Why. The kernel these replaced (main c274b05: awq_pairs_a8) walked each 128-byte piece of its
// item down a block's 128 rows with its accumulators in registers, so the memory saw, per
// weight row, runs of 128-256 bytes N / 2 bytes apart, visited once per item. A read probe on
// the AMX Xeon VM (2 threads, 256 MB of AutoAWQ-shaped buffers rotated) read that order at
// 20-23.5 GB/s, and sweeps of 8-16 rows across a strip of every row, one strip per thread (the
// two strips covering each row at the same time), at 27-31 GB/s (the probe: 29-31; four strips,
// two per thread: 19-22). So at M <= 4 an item is one thread's strip of the columns
// (w4a8_gemm.cpp), and each block is read in sweeps of awq_sweep_quads_per_sweep(R) quads over
// sub-strips of at most awq_sweep_pairs(R) chunk pairs, the block's int32 sums kept in L1
// between sweeps; each sweep prefetches the next one's lines into L2 (without any prefetch:
// 0.55-0.8x on the AMX Xeon, 0.67x at M = 1 and 4 on the Zen 4). 1.16-1.45x the old kernel at M = 1, 2, 4
// on 4096 x 4096, 11008 x 4096, 4096 x 11008 (AMX Xeon VM, 2 threads, weights rotated, fresh
// processes alternating). L2, not L1: on the Xeon (48 KiB of L1) the two hints were level, on
// the Zen 4 (32 KiB of L1, which the next sweep's lines and the sums overflow: at N = 4096 16
// KiB of lines per sweep per thread and 8-32 KiB of sums) prefetcht0 evicted lines before their
// use. Measured 2026-12-02 on the Zen 4 (2 threads, weights rotated, the hints alternating in
// one process, medians): prefetcht1 over prefetcht0 1.38-1.45x at M = 1 and 2, 1.16-1.17x at
// M = 4 on 4096 x 4096, 1.12x at M = 2 on 11008 x 4096; prefetcht2 level with prefetcht1. The
// int32 sums of a block are exact whatever the order, and the epilogue is the chunk-pair one,
// per block in k order: every path's bits.
//
// Quads per sweep (weight rows read across the sub-strip: 16 at one row of a, 8 above). Measured
// (2 threads, rotated weights, 4096 x 4096 and 11008 x 4096, two rounds): 4 quads against 2
// 1.01-1.05x at M = 1, 2 quads against 4 1.03-1.13x at M = 2..4; 8 quads 0.87-0.97x.
constexpr int awq_sweep_quads_per_sweep(int R) { return R == 1 ? 4 : 2; }
// Chunk pairs per sub-strip at R rows: the block's int32 sums (R x 512 bytes per pair) within
// 32 KiB of L1. 11008 x 4096 (43 pairs per item), ms: M = 4 1.05-1.26 against 1.42-1.70 within
// 24 KiB (4 sub-strips) and 1.38-1.49 within 48 (2); M = 2 0.91-1.07 against 1.5-2.2 with the
// whole 44 KiB strip.
constexpr int64_t awq_sweep_pairs(int R) { return 64 / R; }
constexpr int64_t kAwqSweepAccInts = 64 * 128;  // the sums' scratch: R x awq_sweep_pairs(R) pairs

// One sweep: kQ quads (rows 4 q0 .. of the block: words, qa at the sweep's first row) over
// `npairs` chunk pairs (lines of 64 bytes), R rows of a; acc: the int32 sums of each pair in
// pair order (8 code zmm of 16), [row r][pair][128], row stride acc_ld. Per half h of the byte
// unpack (u_2h, u_2h+1: their low and high nibbles, 4 code zmm), the 4R sums are loaded, take
// the kQ quads' products and are stored back: 8R loads and stores per pair per sweep.
template <int R, int kQ>
W4K_A8_TARGET inline __attribute__((always_inline)) void awq_sweep_quads(
    const int32_t* words, int64_t ldq, int64_t npairs, const int8_t* qa, int64_t lda_q,
    int32_t* acc, int64_t acc_ld, const int32_t* next, int64_t next_pairs) {
  const __m512i lo = _mm512_set1_epi8(0x0f), hi = _mm512_set1_epi8(static_cast<char>(0xf0));
  __m512i a4[R][kQ];  // the rows' 4 activation bytes of each quad, broadcast once per sweep
  for (int r = 0; r < R; ++r)
    for (int qq = 0; qq < kQ; ++qq)
      a4[r][qq] = _mm512_set1_epi32(*reinterpret_cast<const int32_t*>(qa + r * lda_q + 4 * qq));
  for (int64_t pr = 0; pr < npairs; ++pr) {
    const int32_t* wp = words + 16 * pr;
    int32_t* ap = acc + 128 * pr;
    if (pr < next_pairs) {  // this pair's line of each row of the next sweep, into L2
      const char* nx = reinterpret_cast<const char*>(next + 16 * pr);
      for (int r = 0; r < 4 * kQ; ++r) _mm_prefetch(nx + r * 4 * ldq, _MM_HINT_T1);
    }
    for (int h = 0; h < 2; ++h) {
      // sums of code zmm 4h .. 4h + 3 (u_2h lo, hi; u_2h+1 lo, hi) of every row
      __m512i x[R][4];
      for (int r = 0; r < R; ++r)
        for (int e = 0; e < 4; ++e) x[r][e] = _mm512_load_si512(ap + r * acc_ld + 16 * (4 * h + e));
      for (int qq = 0; qq < kQ; ++qq) {
        const int32_t* wq = wp + 4 * qq * ldq;
        const __m512i w0 = _mm512_loadu_si512(wq), w1 = _mm512_loadu_si512(wq + ldq);
        const __m512i w2 = _mm512_loadu_si512(wq + 2 * ldq), w3 = _mm512_loadu_si512(wq + 3 * ldq);
        const __m512i ta = h ? _mm512_unpackhi_epi8(w0, w1) : _mm512_unpacklo_epi8(w0, w1);
        const __m512i tb = h ? _mm512_unpackhi_epi8(w2, w3) : _mm512_unpacklo_epi8(w2, w3);
        const __m512i u0 = _mm512_unpacklo_epi16(ta, tb), u1 = _mm512_unpackhi_epi16(ta, tb);
        const __m512i e[4] = {_mm512_and_si512(u0, lo), _mm512_and_si512(u0, hi),
                              _mm512_and_si512(u1, lo), _mm512_and_si512(u1, hi)};
        for (int r = 0; r < R; ++r)
          for (int f = 0; f < 4; ++f) x[r][f] = _mm512_dpbusd_epi32(x[r][f], e[f], a4[r][qq]);
      }
      for (int r = 0; r < R; ++r)
        for (int f = 0; f < 4; ++f) _mm512_store_si512(ap + r * acc_ld + 16 * (4 * h + f), x[r][f]);
    }
  }
}

// One block of chunk pairs [0, npairs) (words: the block's first row, the first pair), R = 1..4
// rows: sub-strips of at most awq_sweep_pairs(R) pairs, each swept awq_sweep_quads_per_sweep(R)
// quads at a time, then the epilogue of each pair (its scales and zero points of group g
// gathered) into the fp32 sums c (pair order, row stride ldc). acc: scratch of kAwqSweepAccInts
// int32, 64-byte aligned. ahead: a next block follows (its rows are prefetched by the last
// sweep).
template <int R>
W4K_A8_TARGET __attribute__((noinline)) void awq_sweep_block_a8(
    const W4a8Problem& p, int64_t g, int64_t ch, const int32_t* words, int64_t ldq, int64_t nq,
    int64_t npairs, const int8_t* qa, int64_t lda_q, const float* sa, const int32_t* sumqa,
    int64_t lds, float* c, int64_t ldc, int32_t* acc, bool ahead) {
  constexpr int kQ = awq_sweep_quads_per_sweep(R);
  static_assert(R * awq_sweep_pairs(R) * 128 <= kAwqSweepAccInts, "sums scratch");
  const int64_t subs = (npairs + awq_sweep_pairs(R) - 1) / awq_sweep_pairs(R);
  for (int64_t sub = 0; sub < subs; ++sub) {
    // sub-strip [p0, p1), as even as the pairs allow; the next one's first rows are prefetched
    // by this one's last sweep (the last one's: the next block's first sub-strip)
    const int64_t p0 = sub * npairs / subs, p1 = (sub + 1) * npairs / subs;
    const int64_t np = p1 - p0, acc_ld = 128 * np;
    const bool last = sub + 1 == subs;
    // (no pointer past the weight when no block follows)
    const int32_t* after = !last ? words + 16 * p1 : ahead ? words + 4 * nq * ldq : nullptr;
    const int64_t after_pairs = !last ? (sub + 2) * npairs / subs - p1 : ahead ? npairs / subs : 0;
    for (int64_t i = 0; i < R * acc_ld; i += 16)
      _mm512_store_si512(acc + i, _mm512_setzero_si512());
    const int32_t* w = words + 16 * p0;
    for (int64_t q = 0; q < nq; q += kQ) {  // blocks of 16-128 rows: nq % 4 == 0
      const bool end = q + kQ == nq;
      awq_sweep_quads<R, kQ>(w + 4 * q * ldq, ldq, np, qa + 4 * q, lda_q, acc, acc_ld,
                             end ? after : w + 4 * (q + kQ) * ldq, end ? after_pairs : np);
    }
    for (int64_t pr = 0; pr < np; ++pr) {
      alignas(64) float sw2[128];
      alignas(64) int32_t z2[128];
      gather_awq_pair_avx512(p, g, ch + 2 * (p0 + pr), sw2, z2);
      for (int r = 0; r < R; ++r)
        for (int j = 0; j < 8; ++j) {
          const __m512i d = _mm512_load_si512(acc + r * acc_ld + 128 * pr + 16 * j);
          epilogue_one_a8(j % 2 ? _mm512_srai_epi32(d, 4) : d, j, sa[r * lds], sumqa[r * lds],
                          sw2, z2, c + r * ldc + 128 * (p0 + pr));
        }
    }
  }
}

// Marlin, two rows, half a chunk (words c = 4h .. 4h + 3 of every k-tile: panel zmm g = h and
// 2 + h) decoded in registers: 2 rows x 8 accumulators. Two rows share each decode; the two
// halves are separate passes over the block, so no word is decoded twice per row pair.
W4K_A8_TARGET __attribute__((noinline)) void marlin_2rows_half_a8(
    const int32_t* words, int64_t tile_stride, bool ahead, int64_t ntiles, int h,
    const int8_t* qa, int64_t lda_q, const float* sa, const int32_t* sumqa, int64_t lds,
    const float* sw, const int32_t* z, float* c, int64_t ldc) {
  const __m512i quad_of_block = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
#define W4K_A8_DECL(i)                                                     \
  __m512i s0##i = _mm512_setzero_si512(), u0##i = _mm512_setzero_si512(), \
          s1##i = _mm512_setzero_si512(), u1##i = _mm512_setzero_si512();
  W4K_A8_DECL(0) W4K_A8_DECL(1) W4K_A8_DECL(2) W4K_A8_DECL(3)
#undef W4K_A8_DECL
  words += 64 * h;
  for (int64_t kt = 0; kt < ntiles; ++kt) {
    const __m512i a0 = _mm512_permutexvar_epi32(
        quad_of_block,
        _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qa + 16 * kt))));
    const __m512i a1 = _mm512_permutexvar_epi32(
        quad_of_block, _mm512_castsi128_si512(_mm_loadu_si128(
                           reinterpret_cast<const __m128i*>(qa + lda_q + 16 * kt))));
    const int32_t* w = words + kt * tile_stride;
#define W4K_A8_STEP(i)                                                                     \
  {                                                                                        \
    if (ahead)                                                                             \
      _mm_prefetch(reinterpret_cast<const char*>(w + 16 * i + ntiles * tile_stride),       \
                   _MM_HINT_T1);                                                           \
    __m512i d1, d2;                                                                        \
    decode_marlin_words_shuf(_mm512_loadu_si512(w + 16 * i), d1, d2);                      \
    s0##i = _mm512_dpbusd_epi32(s0##i, d1, a0);                                            \
    u0##i = _mm512_dpbusd_epi32(u0##i, d2, a0);                                            \
    s1##i = _mm512_dpbusd_epi32(s1##i, d1, a1);                                            \
    u1##i = _mm512_dpbusd_epi32(u1##i, d2, a1);                                            \
  }
    W4K_A8_STEP(0) W4K_A8_STEP(1) W4K_A8_STEP(2) W4K_A8_STEP(3)
#undef W4K_A8_STEP
  }
  __m512i v[4][4] = {{s00, s01, s02, s03}, {u00, u01, u02, u03},
                     {s10, s11, s12, s13}, {u10, u11, u12, u13}};
  for (int i = 0; i < 4; ++i) {
    transpose_blocks(v[i]);
    const __m512i dots = _mm512_add_epi32(_mm512_add_epi32(v[i][0], v[i][1]),
                                          _mm512_add_epi32(v[i][2], v[i][3]));
    const int r = i / 2, g = 2 * (i % 2) + h;
    epilogue_one_a8(dots, g, sa[r * lds], sumqa[r * lds], sw, z, c + r * ldc);
  }
}

// Marlin, 3-8 rows (a 9-16-row item runs two of these): the half h of a chunk (words
// c = 4h .. 4h + 3 of each k-tile, panel zmm g = h and 2 + h: 32 columns) decoded in registers
// and used by every row at once (2R accumulators); the 128-bit block transpose gives one zmm
// per quad t, whose 4 activation bytes each row broadcasts. No panel store and reload, and no
// word decoded twice per row group.
template <int R>
W4K_A8_TARGET __attribute__((noinline)) void marlin_rows_h_a8(
    const int32_t* words, int64_t tile_stride, bool ahead, int64_t ntiles, int h,
    const int8_t* qa, int64_t lda_q, const float* sa, const int32_t* sumqa, int64_t lds,
    const float* sw, const int32_t* z, float* c, int64_t ldc) {
#define W4K_A8_DECL(r) __m512i lo##r = _mm512_setzero_si512(), hi##r = _mm512_setzero_si512();
  W4K_A8_DECL(0) W4K_A8_DECL(1) W4K_A8_DECL(2) W4K_A8_DECL(3)
  W4K_A8_DECL(4) W4K_A8_DECL(5) W4K_A8_DECL(6) W4K_A8_DECL(7)
#undef W4K_A8_DECL
  words += 64 * h;
  for (int64_t kt = 0; kt < ntiles; ++kt) {
    const int32_t* w = words + kt * tile_stride;
    // The next block's k-tile of this chunk (512 bytes) into L2, two lines per quad t rather
    // than the 8 at once (prefetch_tile) that perf saw stall on the miss buffers (16 % of this
    // kernel's samples at M = 8): 1.01-1.10x at M = 4-8, 2 threads.
    const char* pf = reinterpret_cast<const char*>(w - 64 * h + ntiles * tile_stride);
    // The block transpose commutes with the lane-wise decode: done on the 4 word zmm, it costs
    // half of what the 8 decoded zmm would.
    __m512i raw[4];
    for (int cc = 0; cc < 4; ++cc) raw[cc] = _mm512_loadu_si512(w + 16 * cc);
    transpose_blocks(raw);
    const int8_t* q0 = qa + 16 * kt;
    for (int t = 0; t < 4; ++t) {
      if (ahead) {
        _mm_prefetch(pf + 128 * t, _MM_HINT_T1);
        _mm_prefetch(pf + 128 * t + 64, _MM_HINT_T1);
      }
      __m512i v1, v2;
      decode_marlin_words(raw[t], v1, v2);
#define W4K_A8_ROW(r)                                                                   \
  if constexpr (R > r) {                                                                \
    const __m512i a =                                                                   \
        _mm512_set1_epi32(*reinterpret_cast<const int32_t*>(q0 + r * lda_q + 4 * t));   \
    lo##r = _mm512_dpbusd_epi32(lo##r, v1, a);                                          \
    hi##r = _mm512_dpbusd_epi32(hi##r, v2, a);                                          \
  }
      W4K_A8_ROW(0) W4K_A8_ROW(1) W4K_A8_ROW(2) W4K_A8_ROW(3)
      W4K_A8_ROW(4) W4K_A8_ROW(5) W4K_A8_ROW(6) W4K_A8_ROW(7)
#undef W4K_A8_ROW
    }
  }
#define W4K_A8_EPI(r)                                                                   \
  if constexpr (R > r) {                                                                \
    epilogue_one_a8(lo##r, h, sa[r * lds], sumqa[r * lds], sw, z, c + r * ldc);         \
    epilogue_one_a8(hi##r, 2 + h, sa[r * lds], sumqa[r * lds], sw, z, c + r * ldc);     \
  }
  W4K_A8_EPI(0) W4K_A8_EPI(1) W4K_A8_EPI(2) W4K_A8_EPI(3)
  W4K_A8_EPI(4) W4K_A8_EPI(5) W4K_A8_EPI(6) W4K_A8_EPI(7)
#undef W4K_A8_EPI
}

// Lines of weights to prefetch into L2 while a tile runs, spread evenly over its quads: rows
// r0 .. r0 + nr - 1 of base (row stride ld bytes), one line each. base == nullptr: none.
struct RowPrefetch {
  const char* base = nullptr;
  int64_t ld = 0, r0 = 0, nr = 0;
  int lines = 1;  // consecutive lines per row
};

// The body shared by the register tiles below: R (<= 6) rows x 64 columns, 4R named int32
// accumulators (named, not an array: GCC spills an array of __m512i to the stack on every
// iteration). Per quad q, W4K_A8_TILE_WEIGHTS sets the 4 weight zmm w0 .. w3; the rows' 4
// activation bytes are broadcast and summed by vpdpbusd; then the epilogue into the fp32
// accumulators c (panel order, row stride ldc). pf's lines are issued a few per quad.
#define W4K_A8_TILE_ROW(r)                                                                \
  if constexpr (R > r) {                                                                  \
    const __m512i a = _mm512_set1_epi32(*reinterpret_cast<const int32_t*>(q0 + r * lda_q)); \
    W4K_A8_DOT4(c##r, w0, w1, w2, w3, a)                                                  \
  }
#define W4K_A8_TILE_EPI(r)                                                                \
  if constexpr (R > r)                                                                    \
    epilogue_row_a8(c##r##0, c##r##1, c##r##2, c##r##3, sa[r * lds], sumqa[r * lds], sw, z, \
                    c + r * ldc);
#define W4K_A8_TILE(W4K_A8_TILE_WEIGHTS)                                                  \
  W4K_A8_ZERO4(c0) W4K_A8_ZERO4(c1) W4K_A8_ZERO4(c2)                                      \
  W4K_A8_ZERO4(c3) W4K_A8_ZERO4(c4) W4K_A8_ZERO4(c5)                                      \
  const int8_t* q0 = qa;                                                                  \
  const char* pf_row = pf.base ? pf.base + pf.r0 * pf.ld : nullptr;                       \
  int64_t pf_due = 0;                                                                     \
  for (int64_t q = 0; q < nq; ++q, q0 += 4) {                                             \
    if (pf_row) /* pf.nr lines over nq quads, evenly (no division in the loop) */         \
      for (pf_due += pf.nr; pf_due >= nq; pf_due -= nq, pf_row += pf.ld)                  \
        for (int l = 0; l < pf.lines; ++l) _mm_prefetch(pf_row + 64 * l, _MM_HINT_T1);     \
    W4K_A8_TILE_WEIGHTS                                                                   \
    W4K_A8_TILE_ROW(0) W4K_A8_TILE_ROW(1) W4K_A8_TILE_ROW(2)                              \
    W4K_A8_TILE_ROW(3) W4K_A8_TILE_ROW(4) W4K_A8_TILE_ROW(5)                              \
  }                                                                                       \
  W4K_A8_TILE_EPI(0) W4K_A8_TILE_EPI(1) W4K_A8_TILE_EPI(2)                                \
  W4K_A8_TILE_EPI(3) W4K_A8_TILE_EPI(4) W4K_A8_TILE_EPI(5)

// R rows x 64 columns over one block's decoded panel (Marlin at 17+ rows; AWQ: the tiles after
// a chunk pair's first). Not inlined: inside the driver the register allocator copied and
// stored the accumulators on every iteration.
template <int R>
W4K_A8_TARGET __attribute__((noinline)) void tile_a8(const uint8_t* panel, int64_t nq, const int8_t* qa,
                                  int64_t lda_q, const float* sa, const int32_t* sumqa,
                                  int64_t lds, const float* sw, const int32_t* z, float* c,
                                  int64_t ldc, RowPrefetch pf = {}) {
  W4K_A8_TILE(const __m512i w0 = _mm512_loadu_si512(panel + 256 * q);
              const __m512i w1 = _mm512_loadu_si512(panel + 256 * q + 64);
              const __m512i w2 = _mm512_loadu_si512(panel + 256 * q + 128);
              const __m512i w3 = _mm512_loadu_si512(panel + 256 * q + 192);)
}

// One quad of an AWQ chunk pair for tile_awq_a8: chunk 1 (if panel1) decoded and stored, chunk
// 0 decoded into e and stored.
W4K_A8_TARGET_VBMI inline __attribute__((always_inline)) void decode_awq_pair_quad(
    const int32_t* words, int64_t ldq, const AwqQuadIdx& ix, uint8_t* panel0, uint8_t* panel1,
    __m512i e[4]) {
  if (panel1) {
    decode_awq_quad_regs(words + 8, ldq, ix, e);
    for (int i = 0; i < 4; ++i) _mm512_storeu_si512(panel1 + 64 * i, e[i]);
  }
  decode_awq_quad_regs(words, ldq, ix, e);
  for (int i = 0; i < 4; ++i) _mm512_storeu_si512(panel0 + 64 * i, e[i]);
}

// AWQ, 5+ rows: the first tile of a chunk pair decodes the weights: per quad, the pair's 4 rows
// (one 64-byte line each) decoded, chunk 0's 4 zmm used in registers and stored to panel0,
// chunk 1's stored to panel1 (nullptr: a lone chunk) for the pair's other tiles (tile_a8).
// Decoding inside the tile instead of in a pass of its own over the block lets the decode's
// loads overlap the dot products (one thread, L3-resident, M = 5 / 8 / 16: 7-15 % faster).
template <int R>
W4K_A8_TARGET_VBMI __attribute__((noinline)) void tile_awq_a8(
    const int32_t* words, int64_t ldq, uint8_t* panel0, uint8_t* panel1, int64_t nq,
    const int8_t* qa, int64_t lda_q, const float* sa, const int32_t* sumqa, int64_t lds,
    const float* sw, const int32_t* z, float* c, int64_t ldc, RowPrefetch pf) {
  static const AwqQuadIdx ix = awq_quad_idx();
  W4K_A8_TILE(__m512i e[4];
              decode_awq_pair_quad(words + 4 * q * ldq, ldq, ix, panel0 + 256 * q,
                                   panel1 ? panel1 + 256 * q : nullptr, e);
              const __m512i w0 = e[0]; const __m512i w1 = e[1];
              const __m512i w2 = e[2]; const __m512i w3 = e[3];)
}

// One quad of kPairs AWQ chunk pairs for tile_awq_pairs_a8, decoded by byte unpacks as in
// awq_sweep_quads but with the high nibbles shifted down (the panels hold codes, for tile_a8):
// half pair h (zmm 4h .. 4h + 3 of the pair order) stored to panel + h panel_bytes, half pair
// 0 also returned in e.
template <int kPairs>
W4K_A8_TARGET inline __attribute__((always_inline)) void decode_awq_pairs_quad(
    const int32_t* words, int64_t ldq, uint8_t* panel, int64_t panel_bytes, __m512i e[4]) {
  const __m512i lo = _mm512_set1_epi8(0x0f);
#pragma GCC unroll 2
  for (int pr = 0; pr < kPairs; ++pr) {
    const int32_t* wp = words + 16 * pr;
    const __m512i w0 = _mm512_loadu_si512(wp), w1 = _mm512_loadu_si512(wp + ldq);
    const __m512i w2 = _mm512_loadu_si512(wp + 2 * ldq), w3 = _mm512_loadu_si512(wp + 3 * ldq);
    const __m512i us[4] = {awq_pair_u<0>(w0, w1, w2, w3), awq_pair_u<1>(w0, w1, w2, w3),
                           awq_pair_u<2>(w0, w1, w2, w3), awq_pair_u<3>(w0, w1, w2, w3)};
#pragma GCC unroll 4
    for (int i = 0; i < 4; ++i) {  // u_i: zmm 2i (low nibbles), 2i + 1 (high) of the pair order
      const __m512i u = us[i];
      const __m512i c_lo = _mm512_and_si512(u, lo);
      const __m512i c_hi = _mm512_and_si512(_mm512_srli_epi16(u, 4), lo);
      uint8_t* dst = panel + (2 * pr + i / 2) * panel_bytes + 128 * (i % 2);
      _mm512_storeu_si512(dst, c_lo);
      _mm512_storeu_si512(dst + 64, c_hi);
      if (pr == 0 && i < 2) {
        e[2 * i] = c_lo;
        e[2 * i + 1] = c_hi;
      }
    }
  }
}

// AWQ, 5+ rows, kPairs chunk pairs (kPairs contiguous lines of each weight row): the first
// tile decodes them (decode_awq_pairs_quad, panels of half pairs in pair order) and multiplies
// half pair 0 in registers; tile_a8 runs the other tiles and half pairs over the panels.
template <int R, int kPairs>
W4K_A8_TARGET __attribute__((noinline)) void tile_awq_pairs_a8(
    const int32_t* words, int64_t ldq, uint8_t* panel, int64_t panel_bytes, int64_t nq,
    const int8_t* qa, int64_t lda_q, const float* sa, const int32_t* sumqa, int64_t lds,
    const float* sw, const int32_t* z, float* c, int64_t ldc, RowPrefetch pf) {
  W4K_A8_TILE(__m512i e[4];
              decode_awq_pairs_quad<kPairs>(words + 4 * q * ldq, ldq, panel + 256 * q,
                                            panel_bytes, e);
              const __m512i w0 = e[0]; const __m512i w1 = e[1];
              const __m512i w2 = e[2]; const __m512i w3 = e[3];)
}
#undef W4K_A8_TILE
#undef W4K_A8_TILE_ROW
#undef W4K_A8_TILE_EPI

constexpr int kA8TileRows = 6;  // rows of tile_a8's register tile (24 accumulators)

#ifdef W4K_HAVE_AMX_PATH
// ---- AMX-INT8 tiles ----
//
// A block's panel (quad rows of 256 bytes: 64 panel columns x the 4 codes of k-rows 4q .. 4q + 3)
// is a TDPBSSD B operand as it lies: 16 quad rows x 16 columns per tile, four tiles side by
// side (row stride 256 bytes), and the quantized activations (signed, the same k order) its A
// operand straight from qa (16 rows x 64 k, row stride lda_q). Per 16 rows and block: four C
// tiles (16 x 16 int32) from zero, each step of 64 k one A load, four B loads and four
// TDPBSSD; then the int32 sums go through the fp32 epilogue every other path has. The integer
// sums are exact in any order, so the bits are those of the vpdpbusd paths.
// Blocks of 64 and 128 rows (a whole number of steps); smaller blocks keep the register tiles.
// From this many rows per work item (below, the register tiles): measured 2026-11-28
// (bench_cpu_gemm.py, 2 threads, group 128, bf16, medians of 7, tiles / vpdpbusd ms on
// 11008 x 4096 and 4096 x 4096): Marlin M = 8 3.72 / 2.77 and 1.41 / 1.35, M = 16 3.71 / 4.98
// and 1.57 / 2.29, M = 32 4.88 / 6.95, M = 64 7.60 / 11.9, M = 256 27.5 / 41.9 and 12.3 /
// 16.2; AWQ (which loses its decode fused into the first register tile) M = 16 5.11 / 4.77 and
// 2.29 / 2.21, M = 32 7.17 / 7.21 and 3.14 / 3.09, M = 64 9.92 / 13.3 and 4.50 / 5.48, M = 256
// 29.3 / 46.4 and 12.7 / 15.8. AWQ since its chunk pairs decode by byte unpacks (2026-11-28,
// 2 threads, rotated, medians of 7-9 calls alternating in one process, tiles / AMX ms on
// 11008 x 4096, 4096 x 11008, 4096 x 4096): M = 8 2.96 / 3.30, 3.35 / 3.50, 1.53 / 1.61; M = 12
// 3.75 / 3.51, 3.78 / 3.49, 1.75 / 1.57; M = 16 4.09 / 3.71, 4.00 / 3.29, 1.93 / 1.79; M = 64
// 11.0 / 6.60, 12.8 / 7.75, 4.86 / 3.17 (and 1.13-1.31x the weights-as-A tiles of
// w4a8_gemm_amx_t.h, removed: at M = 12-256 they were never faster). Marlin at M = 12 / 14,
// same protocol: 3.66 / 3.67 and 3.94 / 3.30, 4.26 / 3.99 and 4.81 / 4.10, 1.81 / 1.82 and
// 2.08 / 1.84 (M = 8-10: the register tiles 0.98-1.26x the speed). Since a partial row block
// loads its A tile from qa directly (no zero-padded copy per step; same protocol, 2 and 3 rounds,
// AMX / register-tile speed on the three shapes): Marlin M = 10 0.97-1.04, 11 1.03-1.07, 12
// 1.06-1.13, 13-14 1.07-1.23, M = 8 0.78-0.91; AWQ M = 8 0.86-1.06, 9 0.97-1.07, 10 0.98-1.14
// (5 of 6 cells >= 1.06), 11 1.06-1.10. W4K_A8_AMX_ROWS overrides both.
constexpr int64_t kA8AmxMinRowsMarlin = 11, kA8AmxMinRowsAwq = 10;
inline int64_t a8_amx_min_rows(A8Format f) {
  const char* env = std::getenv("W4K_A8_AMX_ROWS");
  return env ? std::atoll(env) : f == A8Format::kMarlin ? kA8AmxMinRowsMarlin : kA8AmxMinRowsAwq;
}
// Whether a work item of `rows` rows runs on the AMX-INT8 tiles (blocks of 64 or 128).
inline bool a8_amx_applies(const W4a8Problem& p, int64_t rows) {
  return p.block % 64 == 0 && rows >= a8_amx_min_rows(p.format) && amx_int8_enabled();
}

// The zero points go into the weights first: the panel's codes q become q - z (signed bytes,
// -15..15, one vpsubb per 64 bytes), so TDPBSSD sums (q - z) * qa directly, the same integer
// as sum q * qa - z * sum qa, and the epilogue is the fp32 part alone (the vpmulld and vpsubd
// per 16 outputs gone: with them the epilogue took a third of this kernel's profile samples
// at M = 64, 11008 x 4096). The panel
// is rewritten in place (the AMX path reads each panel once).
__attribute__((target("amx-tile,amx-int8,avx512f,avx512bw,avx512vl,avx512vnni,avx512dq")))
__attribute__((noinline)) void amx_a8_rows(uint8_t* panel, int64_t block, const int8_t* qa,
                                           int64_t lda_q, const float* sa, int64_t lds,
                                           const float* sw, const int32_t* z, float* c,
                                           int64_t ldc, int64_t rows) {
  constexpr int64_t kRowBlock = 16, kStepK = 64, kCStride = 64 * 4, kBStride = 256;
  __m512i zb[4];  // z of each panel column in the 4 bytes of its dword
  for (int g = 0; g < 4; ++g)
    zb[g] = _mm512_mullo_epi32(_mm512_loadu_si512(z + 16 * g), _mm512_set1_epi32(0x01010101));
  for (int64_t q = 0; q < block / 4; ++q)
    for (int g = 0; g < 4; ++g) {
      uint8_t* d = panel + 256 * q + 64 * g;
      _mm512_storeu_si512(d, _mm512_sub_epi8(_mm512_loadu_si512(d), zb[g]));
    }
  alignas(64) int32_t cbuf[kRowBlock * 64];
  amx_stores_before_tile_load();  // the panel's stores
  for (int64_t i0 = 0; i0 < rows; i0 += kRowBlock) {
    const int64_t r = std::min(kRowBlock, rows - i0);
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (int64_t k0 = 0; k0 < block; k0 += kStepK) {
      // 16 rows of qa also for a last row block of r < 16 (kAmxPadRows): the rows past r
      // hold other rows' or stale codes, and their C rows are not read.
      _tile_loadd(4, qa + i0 * lda_q + k0, lda_q);
      const uint8_t* w = panel + k0 / 4 * kBStride;  // quad rows k0 / 4 ..
      _tile_loadd(5, w, kBStride);
      _tile_dpbssd(0, 4, 5);
      _tile_loadd(6, w + 64, kBStride);
      _tile_dpbssd(1, 4, 6);
      _tile_loadd(5, w + 128, kBStride);
      _tile_dpbssd(2, 4, 5);
      _tile_loadd(6, w + 192, kBStride);
      _tile_dpbssd(3, 4, 6);
    }
    _tile_stored(0, cbuf, kCStride);
    _tile_stored(1, cbuf + 16, kCStride);
    _tile_stored(2, cbuf + 32, kCStride);
    _tile_stored(3, cbuf + 48, kCStride);
    // epilogue_row_a8's fp32 part: t = sa * sw, acc = fma(float(isum), t, acc)
    for (int64_t i = 0; i < r; ++i) {
      const __m512 sav = _mm512_set1_ps(sa[(i0 + i) * lds]);
      float* ci = c + (i0 + i) * ldc;
      for (int g = 0; g < 4; ++g) {
        const __m512 t = _mm512_mul_ps(sav, _mm512_loadu_ps(sw + 16 * g));
        const __m512 isum = _mm512_cvtepi32_ps(_mm512_load_si512(cbuf + i * 64 + 16 * g));
        _mm512_storeu_ps(ci + 16 * g, _mm512_fmadd_ps(isum, t, _mm512_loadu_ps(ci + 16 * g)));
      }
    }
  }
}

// AWQ on the AMX-INT8 tiles: the panels of kPairs chunk pairs (half pairs, pair order, as
// tile_awq_pairs_a8 writes them), decoded alone by byte unpacks; the next block's lines
// (ahead) prefetched into L2 as it goes.
template <int kPairs>
W4K_A8_TARGET __attribute__((noinline)) void decode_awq_pairs_panels(
    const int32_t* words, int64_t ldq, int64_t nq, bool ahead, int64_t ahead_words,
    uint8_t* panels, int64_t panel_bytes) {
  for (int64_t q = 0; q < nq; ++q, words += 4 * ldq) {
    if (ahead) prefetch_quad_rows(words, ldq, ahead_words, kPairs);
    __m512i e[4];
    decode_awq_pairs_quad<kPairs>(words, ldq, panels + 256 * q, panel_bytes, e);
  }
}

// AWQ: the panels of a chunk pair (chunk 1's only if panel1), decoded alone (no register tile).
W4K_A8_TARGET_VBMI __attribute__((noinline)) void decode_awq_pair_panels(
    const int32_t* words, int64_t ldq, int64_t nq, uint8_t* panel0, uint8_t* panel1) {
  static const AwqQuadIdx ix = awq_quad_idx();
  for (int64_t q = 0; q < nq; ++q) {
    __m512i e[4];
    decode_awq_pair_quad(words + 4 * q * ldq, ldq, ix, panel0 + 256 * q,
                         panel1 ? panel1 + 256 * q : nullptr, e);
  }
}
#endif

// Whether an item of `rows` rows takes the AWQ sweeps (awq_sweep_block_a8): the chunk pairs at
// 1-4 rows, off the AMX-INT8 tiles.
inline bool awq_sweep_applies(const W4a8Problem& p, int64_t rows) {
#ifdef W4K_HAVE_AMX_PATH
  if (a8_amx_applies(p, rows)) return false;
#endif
  return awq_pairs_apply(p) && rows <= kA8AwqPairRows;
}

// Columns of chunks [ch0, ch1), rows [m0, m1). Blocks of K outer (ascending: the epilogue's
// order), chunks inner, so one item reads its chunks' words of a k-tile as one contiguous run.
W4K_A8_TARGET inline void w4a8_chunks_avx512(const W4a8Problem& p, int64_t ch0, int64_t ch1,
                                             int64_t m0, int64_t m1) {
  const PanelTables& tb = panel_tables(p.format);
  const int64_t nch = ch1 - ch0, rows = m1 - m0, ldc = 64 * nch;
  thread_local std::vector<float> acc_buf, y_buf;
  thread_local std::vector<uint8_t> panel_buf;
  acc_buf.assign(rows * ldc, 0.0f);
  y_buf.resize(128);
  const bool awq = p.format == A8Format::kAwq;
  // Marlin: one chunk's panel at a time; AWQ: a pair of chunks (decoded row by row).
  const int64_t panel_bytes = std::max<int64_t>(p.block * 64, p.block / 16 * 1024);
  panel_buf.resize((awq ? 4 : 1) * panel_bytes + 64);
  alignas(64) float sw[64];
  alignas(64) int32_t z[64];
  const int64_t nq = p.block / 4, ntiles = p.block / 16;
#ifdef W4K_HAVE_AMX_PATH
  const bool amx = a8_amx_applies(p, rows);
  AmxTileScope amx_tiles(amx);
#else
  const bool amx = false;
#endif
  // AWQ: every chunk pair of the item decoded by byte unpacks, in sweeps (awq_sweep_block_a8, up
  // to kA8AwqPairRows rows) or into panels for register tiles (more rows) or the AMX-INT8 tiles;
  // an odd last chunk alone by the paths below. The pairs' sums are kept in pair order.
  const bool pairs = awq_pairs_apply(p);
  // chunk ch starts a pair of the item (the item's chunks pair up from ch0; an odd last one not)
  auto pair_starts = [&](int64_t ch) { return pairs && (ch - ch0) % 2 == 0 && ch + 2 <= ch1; };
  uint8_t* panels = reinterpret_cast<uint8_t*>(
      (reinterpret_cast<uintptr_t>(panel_buf.data()) + 63) & ~uintptr_t{63});
  // AWQ, 1-4 rows: the item's chunk pairs in sweeps (awq_sweep_block_a8; an odd last chunk
  // alone, below).
  const int64_t sweep_pairs = awq_sweep_applies(p, rows) ? (ch1 - ch0) / 2 : 0;
  thread_local Vector64<int32_t> sweep_acc;
  if (sweep_pairs) sweep_acc.resize(kAwqSweepAccInts);
  for (int64_t b = 0; b < p.num_blocks; ++b) {
    const int64_t k0 = b * p.block, g = k0 / p.group_size;
    const bool ahead = b + 1 < p.num_blocks;
    if (sweep_pairs) {
      const int64_t ldq = p.size_n / 8, lds = p.num_blocks;
      const int32_t* words = p.qweight + k0 * ldq + 8 * ch0;
      const int8_t* qa = p.qa + m0 * p.lda_q + k0;
      const float* sa = p.sa + m0 * lds + b;
      const int32_t* sq = p.sumqa + m0 * lds + b;
#define W4K_A8_CASE(n)                                                                         \
  case n:                                                                                      \
    awq_sweep_block_a8<n>(p, g, ch0, words, ldq, nq, sweep_pairs, qa, p.lda_q, sa, sq, lds,    \
                          acc_buf.data(), ldc, sweep_acc.data(), ahead);                       \
    break;
      switch (rows) {
        W4K_A8_CASE(1) W4K_A8_CASE(2) W4K_A8_CASE(3) W4K_A8_CASE(4)
        default: break;
      }
#undef W4K_A8_CASE
    }
    for (int64_t ch = ch0 + 2 * sweep_pairs; ch < ch1; ++ch) {
      if (pair_starts(ch)) {
        // two pairs at a time where the item has them
        const int64_t np = (ch - ch0) % 4 == 0 && ch + 4 <= ch1 ? 2 : 1;
        alignas(64) float sw2[256];
        alignas(64) int32_t z2[256];
        const int64_t gn = (k0 + p.block) / p.group_size;
        for (int64_t j = 0; j < np; ++j) {
          const int64_t cj = ch + 2 * j;
          gather_awq_pair_avx512(p, g, cj, sw2 + 128 * j, z2 + 128 * j);
          if (ahead) {  // the next block's 128 scales (4 lines) and 16 zero-point words
            const char* sn = reinterpret_cast<const char*>(p.scales + gn * p.size_n + 64 * cj);
            for (int l = 0; l < 256; l += 64) _mm_prefetch(sn + l, _MM_HINT_T0);
            if (p.zeros)
              _mm_prefetch(reinterpret_cast<const char*>(p.zeros + gn * (p.size_n / 8) + 8 * cj),
                           _MM_HINT_T0);
          }
        }
        const int64_t ldq = p.size_n / 8, lds = p.num_blocks;
        const int32_t* words = p.qweight + k0 * ldq + 8 * ch;
#ifdef W4K_HAVE_AMX_PATH
        if (amx) {  // the pairs' panels, then the tiles per half pair
          if (np == 2)
            decode_awq_pairs_panels<2>(words, ldq, nq, ahead, p.block * ldq, panels, panel_bytes);
          else
            decode_awq_pairs_panels<1>(words, ldq, nq, ahead, p.block * ldq, panels, panel_bytes);
          for (int64_t hp = 0; hp < 2 * np; ++hp)
            amx_a8_rows(panels + hp * panel_bytes, p.block, p.qa + m0 * p.lda_q + k0, p.lda_q,
                        p.sa + m0 * lds + b, lds, sw2 + 64 * hp, z2 + 64 * hp,
                        acc_buf.data() + 64 * (ch - ch0) + 64 * hp, ldc, rows);
          ch += 2 * np - 1;
          continue;
        }
#endif
        // More rows than the sweeps take (above; at 1-4 rows off the AMX tiles the sweeps take
        // every pair, so this sees at least 5 rows): row tiles of at most kA8TileRows (3..6
        // rows each) over the half pairs, the first decoding (tile_awq_pairs_a8) into panels;
        // the next block's lines prefetched spread over the tiles.
        const int64_t row_tiles = (rows + kA8TileRows - 1) / kA8TileRows;
        const int64_t calls = row_tiles * 2 * np;
        for (int64_t hp = 0, call = 0; hp < 2 * np; ++hp) {
          for (int64_t t = 0, r = 0; t < row_tiles; ++t, ++call) {
            const int64_t n = (rows - r) / (row_tiles - t);
            RowPrefetch pf;
            if (ahead) {
              pf.base = reinterpret_cast<const char*>(words + p.block * ldq);
              pf.ld = p.size_n / 2;
              pf.r0 = call * p.block / calls;
              pf.nr = (call + 1) * p.block / calls - pf.r0;
              pf.lines = static_cast<int>(np);
            }
            const int8_t* qr = p.qa + (m0 + r) * p.lda_q + k0;
            const float* sr = p.sa + (m0 + r) * lds + b;
            const int32_t* sqr = p.sumqa + (m0 + r) * lds + b;
            float* cr = acc_buf.data() + r * ldc + 64 * (ch - ch0) + 64 * hp;
#define W4K_A8_CASE(n)                                                                        \
  case n:                                                                                     \
    if (hp > 0 || t > 0)                                                                      \
      tile_a8<n>(panels + hp * panel_bytes, nq, qr, p.lda_q, sr, sqr, lds, sw2 + 64 * hp,     \
                 z2 + 64 * hp, cr, ldc, pf);                                                  \
    else if (np == 2)                                                                         \
      tile_awq_pairs_a8<n, 2>(words, ldq, panels, panel_bytes, nq, qr, p.lda_q, sr, sqr, lds, \
                              sw2, z2, cr, ldc, pf);                                          \
    else                                                                                      \
      tile_awq_pairs_a8<n, 1>(words, ldq, panels, panel_bytes, nq, qr, p.lda_q, sr, sqr, lds, \
                              sw2, z2, cr, ldc, pf);                                          \
    break;
            switch (n) {  // more than 4 rows: n = rows / ceil(rows / 6) >= 3
              W4K_A8_CASE(6) W4K_A8_CASE(5) W4K_A8_CASE(4) W4K_A8_CASE(3)
              default: break;
            }
#undef W4K_A8_CASE
            r += n;
          }
        }
        ch += 2 * np - 1;
        continue;
      }
      // AWQ panels: a pair of chunks (one 64-byte line per row), decoded by the pair's first
      // tile (tile_awq_a8).
      uint8_t* panel = panel_buf.data() + (awq ? (ch - ch0) % 2 * panel_bytes : 0);
      gather_scales_zeros_avx512(p, tb, g, ch, sw, z);
      if (ahead) {  // the next block's scales (128 bytes) and zero points (32 bytes) of this chunk
        const int64_t gn = (k0 + p.block) / p.group_size;
        const char* sn = reinterpret_cast<const char*>(p.scales + gn * p.size_n + 64 * ch);
        _mm_prefetch(sn, _MM_HINT_T0);
        _mm_prefetch(sn + 64, _MM_HINT_T0);
        if (p.zeros)
          _mm_prefetch(reinterpret_cast<const char*>(p.zeros + gn * (p.size_n / 8) + 8 * ch),
                       _MM_HINT_T0);
      }
      float* c = acc_buf.data() + 64 * (ch - ch0);
      const int8_t* qa = p.qa + m0 * p.lda_q + k0;
      const float* sa = p.sa + m0 * p.num_blocks + b;
      const int32_t* sq = p.sumqa + m0 * p.num_blocks + b;
#ifdef W4K_HAVE_AMX_PATH
      if (amx) {  // the block's panel (AWQ: the pair's, by its first chunk), then the tiles
        const int64_t pair0 = ch0 + (ch - ch0) / 2 * 2;
        if (!awq)
          decode_panel(p, k0, ch, panel);
        else if (ch == pair0)
          decode_awq_pair_panels(p.qweight + k0 * (p.size_n / 8) + 8 * ch, p.size_n / 8, nq,
                                 panel, ch + 1 < ch1 ? panel + panel_bytes : nullptr);
        amx_a8_rows(panel, p.block, qa, p.lda_q, sa, p.num_blocks, sw, z, c, ldc, rows);
        continue;
      }
#endif
      if (awq && rows <= kA8AwqRegRows) {
        const int64_t ldq = p.size_n / 8;
        const int32_t* words = p.qweight + k0 * ldq + 8 * ch;
        const int64_t lds = p.num_blocks;
        // ahead: the next block's rows, prefetched by the even chunk of a pair (one line)
        const bool pf = ahead && (ch - ch0) % 2 == 0;
        const int64_t ahead_words = p.block * ldq;
        if (rows == 2)
          awq_rows_a8<2>(words, ldq, nq, pf, ahead_words, qa, p.lda_q, sa, sq, lds, sw, z, c, ldc);
        else
          awq_rows_a8<1>(words, ldq, nq, pf, ahead_words, qa, p.lda_q, sa, sq, lds, sw, z, c, ldc);
        continue;
      }
      if (!awq && rows <= 2) {
        const int32_t* words = p.qweight + (k0 / 16) * 2 * p.size_n + 128 * ch;
        if (rows == 1)
          marlin_row_a8(words, 2 * p.size_n, ahead, ntiles, qa, sa[0], sq[0], sw, z, c);
        else  // half a chunk per pass
          for (int h = 0; h < 2; ++h)
            marlin_2rows_half_a8(words, 2 * p.size_n, ahead, ntiles, h, qa, p.lda_q, sa, sq,
                                 p.num_blocks, sw, z, c, ldc);
        continue;
      }
      if (!awq && rows <= kA8GroupRows) {
        // one or two row groups of at most 8 (9 .. 16 rows: halves, the first the larger)
        const int64_t first = rows <= 8 ? rows : (rows + 1) / 2;
        const int32_t* words = p.qweight + (k0 / 16) * 2 * p.size_n + 128 * ch;
        const int64_t lds = p.num_blocks, ts = 2 * p.size_n;
        for (int64_t r0 = 0; r0 < rows; r0 += first) {
          const int64_t nr = std::min(first, rows - r0);
          for (int h = 0; h < 2; ++h) {
            const bool pf = ahead && h == 0 && r0 == 0;
            const int8_t* qr = qa + r0 * p.lda_q;
            const float* sr = sa + r0 * lds;
            const int32_t* sqr = sq + r0 * lds;
            float* cr = c + r0 * ldc;
#define W4K_A8_CASE(n)                                                                       \
  case n:                                                                                    \
    marlin_rows_h_a8<n>(words, ts, pf, ntiles, h, qr, p.lda_q, sr, sqr, lds, sw, z, cr, ldc); \
    break;
            switch (nr) {
              W4K_A8_CASE(3) W4K_A8_CASE(4) W4K_A8_CASE(5) W4K_A8_CASE(6) W4K_A8_CASE(7)
              W4K_A8_CASE(8)
              default: break;
            }
#undef W4K_A8_CASE
          }
        }
        continue;
      }
      if (!awq) decode_panel(p, k0, ch, panel);
      // AWQ: the next block's line of each row of this chunk pair, prefetched into L2 spread
      // over all the pair's tiles (issued with the decode, 2 x 128 misses in a few hundred
      // cycles stalled on the miss buffers: 32 % of the decode's samples).
      const int64_t pair0 = ch0 + (ch - ch0) / 2 * 2;
      const int64_t row_tiles = (rows + kA8TileRows - 1) / kA8TileRows;
      const int64_t pf_calls = row_tiles * (std::min(pair0 + 2, ch1) - pair0);
      int64_t pf_call = (ch - pair0) * row_tiles;
      auto tile_prefetch = [&]() {
        RowPrefetch pf;
        if (awq && ahead) {
          pf.base = reinterpret_cast<const char*>(p.qweight + (k0 + p.block) * (p.size_n / 8) +
                                                  8 * pair0);
          pf.ld = p.size_n / 2;
          pf.r0 = pf_call * p.block / pf_calls;
          pf.nr = (pf_call + 1) * p.block / pf_calls - pf.r0;
        }
        ++pf_call;
        return pf;
      };
      // Row tiles of at most kA8TileRows, as even as possible (8 rows: 4 + 4, not 6 + 2: GCC
      // reloads a small tile's weight zmm for each row, so a 2-row tile runs at load speed).
      for (int64_t t = 0, r = 0; t < row_tiles; ++t) {
        const int64_t n = (rows - r) / (row_tiles - t);
        const int8_t* qr = qa + r * p.lda_q;
        const float* sr = sa + r * p.num_blocks;
        const int32_t* sqr = sq + r * p.num_blocks;
        float* cr = c + r * ldc;
        const RowPrefetch pf = tile_prefetch();
        // AWQ: the pair's first tile decodes its panels (tile_awq_a8); the others read them
        const bool decode = awq && t == 0 && ch == pair0;
        const int32_t* words = p.qweight + k0 * (p.size_n / 8) + 8 * ch;
        uint8_t* panel1 = ch + 1 < ch1 ? panel + panel_bytes : nullptr;
#define W4K_A8_CASE(n)                                                                   \
  case n:                                                                                \
    if (decode)                                                                          \
      tile_awq_a8<n>(words, p.size_n / 8, panel, panel1, nq, qr, p.lda_q, sr, sqr,       \
                     p.num_blocks, sw, z, cr, ldc, pf);                                 \
    else                                                                                 \
      tile_a8<n>(panel, nq, qr, p.lda_q, sr, sqr, p.num_blocks, sw, z, cr, ldc, pf);     \
    break;
        switch (n) {
          W4K_A8_CASE(6) W4K_A8_CASE(5) W4K_A8_CASE(4) W4K_A8_CASE(3) W4K_A8_CASE(2)
          W4K_A8_CASE(1)
#undef W4K_A8_CASE
          default: break;
        }
        r += n;
      }
    }
  }
  // Back to natural column order (+ bias), one rounding to T.
  __m512i idx[4];
  for (int o = 0; o < 4; ++o)
    idx[o] = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(tb.pos + 16 * o)));
  const AwqPairTables& pt = awq_pair_tables();
  for (int64_t m = m0; m < m1; ++m) {
    for (int64_t ch = ch0; ch < ch1; ++ch) {
      const float* c = acc_buf.data() + (m - m0) * ldc + 64 * (ch - ch0);
      if (pair_starts(ch)) {  // a pair's 128 sums, pair order
        for (int o = 0; o < 8; ++o) {
          const float* h = c + 64 * (o % 2);
          const __m512i ix = _mm512_cvtepi8_epi32(
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(pt.out_idx[o])));
          const __m512 lo = _mm512_permutex2var_ps(_mm512_loadu_ps(h), ix, _mm512_loadu_ps(h + 16));
          const __m512 hi =
              _mm512_permutex2var_ps(_mm512_loadu_ps(h + 32), ix, _mm512_loadu_ps(h + 48));
          __m512 y = _mm512_mask_mov_ps(lo, _mm512_cmpge_epi32_mask(ix, _mm512_set1_epi32(32)), hi);
          if (p.bias) y = _mm512_add_ps(y, _mm512_loadu_ps(p.bias + 64 * ch + 16 * o));
          _mm512_storeu_ps(y_buf.data() + 16 * o, y);
        }
        narrow_c_row(y_buf.data(), 128, p.type, true, p.out + m * p.size_n + 64 * ch);
        ++ch;
        continue;
      }
      const __m512 c0 = _mm512_loadu_ps(c), c1 = _mm512_loadu_ps(c + 16);
      const __m512 c2 = _mm512_loadu_ps(c + 32), c3 = _mm512_loadu_ps(c + 48);
      for (int o = 0; o < 4; ++o) {
        const __m512 lo = _mm512_permutex2var_ps(c0, idx[o], c1);
        const __m512 hi = _mm512_permutex2var_ps(c2, idx[o], c3);
        __m512 y = _mm512_mask_mov_ps(lo, _mm512_cmpge_epi32_mask(idx[o], _mm512_set1_epi32(32)),
                                      hi);
        if (p.bias) y = _mm512_add_ps(y, _mm512_loadu_ps(p.bias + 64 * ch + 16 * o));
        _mm512_storeu_ps(y_buf.data() + 16 * o, y);
      }
      narrow_c_row(y_buf.data(), 64, p.type, true, p.out + m * p.size_n + 64 * ch);
    }
  }
}

#undef W4K_A8_ZERO4
#undef W4K_A8_DOT4
#undef W4K_A8_TARGET
#undef W4K_A8_TARGET_VBMI
#pragma GCC diagnostic pop

#endif  // W4K_HAVE_A8_AVX512

}  // namespace w4k::cpu
