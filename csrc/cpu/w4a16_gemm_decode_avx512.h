// AVX-512 decode path of the CPU w4a16_gemm kernel (torch-free): few rows of a (M <= 8),
// where streaming and decoding the int4 weight is most of the cost; bf16
// activations with vdpbf16ps (AVX512-BF16; without it each vdpbf16ps is emulated by two FMAs,
// the same bits, and so at 2-4 rows where two FMAs are cheaper: w4a16_fma_min_rows) and fp16
// activations with fp32 FMAs.
//
// Idea: decode the Marlin words in place, with no transposition, straight into bf16 k-pairs for
// vdpbf16ps. The 16 words of line c of a chunk's k-tile (words 16c .. 16c + 15) sit in lanes
// L = 4t + j and hold (MarlinChunkTables) nibble e of word L at
//     row = 2t + (e >> 2) + 8 * (e & 1),   col = 16j + c + 8 * ((e >> 1) & 1).
// A 16-bit shift by 4e' (e' = 0..3) puts nibble e' in the low half of every lane and nibble
// e' + 4 in the high half: the even row 2t + 8h and the odd row 2t + 8h + 1 (h = e' & 1) of
// column 16j + c + 8*b2 (b2 = e' >> 1), i.e. exactly the (low, high) bf16 pair vdpbf16ps
// multiplies with the pair (a[2t + 8h], a[2t + 8h + 1]). The four columns j of a lane group
// differ, so the lookup is a 64-entry table of 16-bit weights, index 16j + code: one vpermt2w
// (_mm512_permutex2var_epi16) over two registers. Per 32 weights: a shift, a vpternlogd (mask
// the code, add 16j), a vpermt2w and a vdpbf16ps; a[] is permuted once per k-tile and row.
//
// Numerics: the table entry of column n, group g, code q is bf16((q - z) * s), the product
// exact in fp32 and rounded once to bf16 (round-to-nearest-even on the bits, as every other
// path); per channel s = 1 (decode_chunk_groups) and the entries are the exact integers q - z.
// a * w is exact in fp32 and vdpbf16ps adds two products per lane to the fp32 accumulator: the
// contract up to the fp32 summation order (lane (t, j) keeps 4 partial sums per column over t,
// added at the end). bf16/fp32 subnormal inputs are flushed by vdpbf16ps, as on the blocked
// vdpbf16ps path.
//
// Memory: the 128 words of a chunk's k-tile are 512 contiguous bytes, but consecutive k-tiles
// are 8 * size_n bytes apart (a different page for every tile), which the hardware prefetchers
// do not follow; the first pass over a chunk's block of tiles prefetches the same tiles of the
// chunk kPrefetchChunks further on (pair_chunks_avx512).
#pragma once

#include "cpu/amx_bf16.h"
#include "cpu/w4a16_gemm_avx512.h"

#include "cpu/dot_form.h"

#include <cstdlib>
#include <cstring>

#ifdef W4K_HAVE_AVX512_PATH

namespace w4k::cpu {

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// The lookup tables of one chunk and group: bf16: tbl[(2c + b2) * 64 + 16j + q] = the bf16
// bits of (q - z) * s of column n = 16j + c + 8*b2 (s = 1 per channel: the scale goes to the
// epilogue); fp16: tbl[(2c + b2) * 128 + 16j + q] and tbl[(2c + b2) * 128 + 64 + 16j + q] = the
// high and low 16 bits of the fp32 encoding of that value rounded to fp16 (kPairTable entries
// per chunk and group). Marlin's scale perm puts the scales of line c at s_row[8c + 2j + b2]
// (position 8(n % 8) + n / 8 of the chunk's 64), and its zero-point word c holds z of (j, b2)
// in nibble 4*b2 + j. The rounding is vcvtneps2bf16 (round to nearest even; a subnormal result is
// flushed to zero, as vdpbf16ps would flush it when multiplying); fp16 tables (kFp16) round
// with vcvtps2ph (nearest even, subnormals kept, as round_to_fp16). s_row: scale bits of the
// half type, nullptr per channel; z_words: nullptr -> z = 8.
// Cost: this runs once per chunk and group (1024 entries for 64 x group_size weights), so at
// group 128 it is one entry per 8 weights: the per-column s and z * s are formed for all 64
// columns at once (in table order), then each 16 entries are one fma from broadcasts.
template <bool kFp16>
constexpr int64_t kPairTable = kFp16 ? 2048 : 1024;

// bf16 bits (low 16 of each lane) of w as vcvtne2ps2bf16 rounds it, without AVX512-BF16: NaN made
// quiet, |w| below FLT_MIN (zero, subnormal) a signed zero, else round to nearest even.
__attribute__((target("avx512f"))) inline __m512i bf16_like_cvtne_avx512(__m512 w) {
  const __m512i b = _mm512_castps_si512(w);
  const __m512i mag = _mm512_and_si512(b, _mm512_set1_epi32(0x7fffffff));
  __m512i r = _mm512_srli_epi32(bf16_rne_bits(w), 16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(mag, _mm512_set1_epi32(0x7f800000));
  const __mmask16 tiny = _mm512_cmplt_epu32_mask(mag, _mm512_set1_epi32(0x00800000));
  r = _mm512_mask_mov_epi32(
      r, nan, _mm512_or_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(0x40)));
  return _mm512_mask_mov_epi32(
      r, tiny, _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(0x8000)));
}

// kEmu: for a CPU without AVX512-BF16 (the decode path's vdpbf16ps emulated by two FMAs), the
// bf16 rounding done by bf16_like_cvtne_avx512 instead of vcvtne2ps2bf16: the same bits.
// kSplit (with kFp16): the AMX path's tables instead, two bf16 tables in the bf16 layout: the
// value rounded to fp16, split into hi (tbl[cb * 64 + 16j + q]) and lo (tbl[1024 + ...]) by
// amx_split_half.
template <bool kFp16, bool kEmu = false, bool kSplit = false>
__attribute__((target("avx512f,avx512bw,avx512bf16,fma,f16c"))) void build_pair_table_avx512(
    const uint16_t* s_row, const int32_t* z_words, uint16_t* tbl) {
  // Table-order index i = (2c + b2) * 4 + j (c = i / 8, b2 = (i / 4) % 2, j = i % 4): the scale
  // sits at s_row[8c + 2j + b2], i.e. within the same 16 as i, at 8 (i' / 8) + 2 (i' % 4) +
  // (i' / 4) % 2 (i' = i % 16); the zero point is nibble i % 8 of word i / 8.
  const __m512i s_perm = _mm512_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15);
  const __m512i z_word = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  const __m512i z_shift = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20,
                                            24, 28);
  alignas(64) float s_tab[64], z_tab[64];
  const __m256i zw = z_words ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(z_words))
                             : _mm256_set1_epi32(static_cast<int>(0x88888888u));
  const __m512i zw512 = _mm512_castsi256_si512(zw);
  for (int o = 0; o < 4; ++o) {
    __m512 sv = _mm512_set1_ps(1.0f);
    if (s_row) {  // bf16 -> fp32: the bits in the high half
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s_row + 16 * o));
      sv = kFp16 ? _mm512_cvtph_ps(h)
                 : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
      sv = _mm512_permutexvar_ps(s_perm, sv);
    }
    const __m512i words =
        _mm512_permutexvar_epi32(_mm512_add_epi32(z_word, _mm512_set1_epi32(2 * o)), zw512);
    const __m512 z = _mm512_cvtepi32_ps(
        _mm512_and_si512(_mm512_srlv_epi32(words, z_shift), _mm512_set1_epi32(15)));
    _mm512_store_ps(s_tab + 16 * o, sv);
    _mm512_store_ps(z_tab + 16 * o, z);
  }
  const __m512 code = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512 code_minus_8 = _mm512_sub_ps(code, _mm512_set1_ps(8.0f));
  // fp16: vpermt2w indices of the high (2k + 1) and low (2k) 16-bit halves of entries k = 0..31
  // of two fp32 vectors.
  alignas(64) int16_t half_idx[2][32];
  for (int k = 0; k < 32; ++k) {
    half_idx[0][k] = static_cast<int16_t>(2 * k + 1);
    half_idx[1][k] = static_cast<int16_t>(2 * k);
  }
  const __m512i high_halves = _mm512_load_si512(half_idx[0]);
  const __m512i low_halves = _mm512_load_si512(half_idx[1]);
  for (int cb = 0; cb < 16; ++cb) {  // cb = 2c + b2
    // (q - z) * s in the other paths' order: q - z is an exact small integer, so the one
    // rounding is the product's, the same bits as the fma q * s - z * s for every finite s;
    // an infinite scale gives what the portable loop gives (NaN only where q == z; the fma
    // form made inf - inf = NaN wherever q and z were both nonzero). Also the faster of the
    // two on the Zen 4 (1.01-1.03x at M = 1): no z * s to form, and sub and mul issue on
    // separate pipes.
    // Symmetric (z = 8, no zero-point words): q - 8 is one constant vector, no sub per column.
    __m512 w[4];
    for (int j = 0; j < 4; ++j)
      w[j] = _mm512_mul_ps(z_words ? _mm512_sub_ps(code, _mm512_set1_ps(z_tab[4 * cb + j]))
                                   : code_minus_8,
                           _mm512_set1_ps(s_tab[4 * cb + j]));
    if constexpr (kFp16 && kSplit) {
      constexpr int kRne = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
      for (int j = 0; j < 4; ++j) {
        __m512i hi, lo;
        amx_split_half(_mm512_cvtph_ps(_mm512_cvtps_ph(w[j], kRne)), hi, lo);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(tbl + cb * 64 + 16 * j),
                            _mm512_cvtepi32_epi16(_mm512_srli_epi32(hi, 16)));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(tbl + 1024 + cb * 64 + 16 * j),
                            _mm512_cvtepi32_epi16(_mm512_srli_epi32(lo, 16)));
      }
    } else if constexpr (kFp16) {
      // The value rounded to fp16 and widened back (exact), split into the high and low 16
      // bits of its fp32 encoding: entry 16j + q of the high table is the high half of w[j][q]
      // (16-bit element 2q + 1 of w[j]), of the low table the low half (element 2q).
      constexpr int kRne = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
      __m512i bits[4];
      for (int j = 0; j < 4; ++j)
        bits[j] = _mm512_castps_si512(_mm512_cvtph_ps(_mm512_cvtps_ph(w[j], kRne)));
      uint16_t* t = tbl + cb * 128;
      for (int jj = 0; jj < 2; ++jj) {
        _mm512_storeu_si512(t + 32 * jj,
                            _mm512_permutex2var_epi16(bits[2 * jj], high_halves, bits[2 * jj + 1]));
        _mm512_storeu_si512(t + 64 + 32 * jj,
                            _mm512_permutex2var_epi16(bits[2 * jj], low_halves, bits[2 * jj + 1]));
      }
    } else if constexpr (kEmu) {  // the same 16-bit values, in the same order
      uint16_t* t = tbl + cb * 64;
      for (int j = 0; j < 4; ++j)
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(t + 16 * j),
                            _mm512_cvtepi32_epi16(bf16_like_cvtne_avx512(w[j])));
    } else {  // vcvtne2ps2bf16(a, b): b's 16 values in the low half, a's in the high half
      uint16_t* t = tbl + cb * 64;
      _mm512_storeu_si512(t, (__m512i)_mm512_cvtne2ps_pbh(w[1], w[0]));
      _mm512_storeu_si512(t + 32, (__m512i)_mm512_cvtne2ps_pbh(w[3], w[2]));
    }
  }
}

// Lane 4t + j of a_pairs[(kt - kt0) * 2 * rows + 2i + h] is the bf16 pair (a[i, 16kt + 2t +
// 8h], a[i, 16kt + 2t + 8h + 1]): what lane (t, j) of the decoded weights multiplies. Built
// once per block of tiles and row block, shared by every chunk.
__attribute__((target("avx512f"))) inline void build_a_pairs_avx512(
    const uint16_t* a, int64_t lda, int64_t rows, int64_t kt0, int64_t kt1, __m512i* a_pairs) {
  const __m512i idx[2] = {_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                          _mm512_setr_epi32(4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7)};
  for (int64_t kt = kt0; kt < kt1; ++kt)
    for (int64_t i = 0; i < rows; ++i) {
      const __m512i a_tile = _mm512_castsi256_si512(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + i * lda + 16 * kt)));
      for (int h = 0; h < 2; ++h)
        _mm512_storeu_si512(a_pairs + ((kt - kt0) * rows + i) * 2 + h,
                            _mm512_permutexvar_epi32(idx[h], a_tile));
    }
}

// fp16: the weights of lane (t, j) come as fp32 from vpunpck{l,h}wd of the low- and high-half
// lookups: element i of the unpacked vector u (0: columns j = 0, 1; 1: j = 2, 3) is 16-bit
// element 8(i / 4) + i % 4 (+ 4 for u = 1) of the lookup, i.e. t = i / 4, j = 2u + (i % 4) / 2,
// row 2t + 8h + i % 2. a_pairs[((kt - kt0) * rows + i) * 2 + h] holds those fp32 activations
// (the same for both u; one vpermps of the tile each).
__attribute__((target("avx512f"))) inline void build_a_fp32_avx512(
    const float* a, int64_t lda, int64_t rows, int64_t kt0, int64_t kt1, __m512i* a_pairs) {
  __m512i idx[2];
  for (int h = 0; h < 2; ++h) {
    int v[16];
    for (int i = 0; i < 16; ++i) v[i] = 2 * (i / 4) + 8 * h + i % 2;
    idx[h] = _mm512_loadu_si512(v);
  }
  for (int64_t kt = kt0; kt < kt1; ++kt)
    for (int64_t i = 0; i < rows; ++i) {
      const __m512 a_tile = _mm512_loadu_ps(a + i * lda + 16 * kt);
      for (int h = 0; h < 2; ++h)
        _mm512_storeu_si512(a_pairs + ((kt - kt0) * rows + i) * 2 + h,
                            _mm512_castps_si512(_mm512_permutexvar_ps(idx[h], a_tile)));
    }
}

// Nibbles e and e + 4 (e = 0..3) of every 32-bit lane of the words w as the table indices
// 16j + q of their 16-bit halves: (w >> 4e & code_mask) | col_bits (imm 0xea = (A & B) | C).
__attribute__((target("avx512f,avx512bw"), always_inline)) inline __m512i pair_index(
    __m512i w, int e, __m512i code_mask, __m512i col_bits) {
  const __m512i shifted = e == 0 ? w : _mm512_srli_epi16(w, 4 * e);
  return _mm512_ternarylogic_epi32(shifted, code_mask, col_bits, 0xea);
}

// pair_index, with kTop e = 3 in one instruction (AVX512-VBMI2): vpshldw by 4 of (col_j : w)
// shifts the top nibble of each 16-bit half of w down and j (col_j = col_bits >> 4) in above
// it, the same index as the shift and the vpternlogd. On the Zen 4 the M = 1..3 decode ran
// 1.02-1.04x faster with it (one of the line's 15 vector instructions less), M = 4 0.97-0.98x
// (one register more, at a pass that already spills), so pair_tiles_avx512 uses it at up to
// kPairTopRows rows.
constexpr int64_t kPairTopRows = 3;

template <bool kTop>
__attribute__((target("avx512f,avx512bw,avx512vbmi2"), always_inline)) inline __m512i
pair_index_at(__m512i w, int e, __m512i code_mask, __m512i col_bits, __m512i col_j) {
  return kTop && e == 3 ? _mm512_shldi_epi16(col_j, w, 4)
                        : pair_index(w, e, code_mask, col_bits);
}

// Whether pair_tiles_avx512 may use pair_index_at<true>: the CPU has AVX512-VBMI2, and
// W4K_CPU_VBMI2 is not 0 (tests run both index forms on one machine; read at each call).
inline bool pair_index_top_enabled() {
  static const bool vbmi2 = __builtin_cpu_supports("avx512vbmi2");
  const char* env = std::getenv("W4K_CPU_VBMI2");
  return vbmi2 && !(env && std::strcmp(env, "0") == 0);
}

// Whether pair_pass_avx512 loads each line of words once into a register (bf16;
// pair_load_line): otherwise GCC folds the load into every shift, vpshldw and vpternlogd of the
// line, 3-4 loads of the same 64 bytes per line. And whether it takes the line's lookups h outer
// (from 4 rows): the two lookups of h and per row its a vector of h, so that two weight vectors
// are live instead of four (each accumulator still takes h = 0 first: the same bits); at 4 rows
// the line's register alone made the pass spill (0.76-0.80x, one thread, the passes alone), with h
// outer it fits. Measured on the Zen 5 VM (2026-12-06; the op in one process with and without,
// alternating, 2 threads, weights rotated past the L3, medians of 9 rounds; 4096 x 4096, 11008 x
// 4096, 4096 x 11008): M = 1 1.00-1.25x, 2 1.14-1.19x, 3 1.04-1.10x (act-order 1.03-1.08x), 4
// 1.16-1.31x, 5 0.98-1.07x, 6 1.02-1.10x, 7 1.05-1.07x, 8 1.04-1.11x. fp16 measured 0.97-1.05x at
// M = 1-2 and 0.91-0.96x at 3-4 with the register, so it keeps the folded loads, as does the
// emulated dot product (kEmu; not measured). (Measured with an empty asm after the load; the
// volatile load of pair_load_line folds no line load either and ran 0.99-1.03x that form.)
template <bool kFp16, bool kEmu>
constexpr bool kPairLineInRegister = !kEmu && !kFp16;
template <int MR>
constexpr bool kPairHOuter = MR >= 4;

// One line of words; kOnce: by a volatile load, which the compiler may not repeat, so it keeps
// the line in a register rather than folding the load into each instruction that reads it.
template <bool kOnce>
__attribute__((target("avx512f"), always_inline)) inline __m512i pair_load_line(
    const int32_t* p) {
  if constexpr (kOnce)
    return *reinterpret_cast<const volatile __m512i_u*>(p);
  else
    return _mm512_loadu_si512(p);
}

// MR rows of a x the columns of lines c0 .. c0 + NCP - 1 over tiles [kt0, kt1) of one chunk.
// words: the chunk's words of tile kt0; a_pairs: build_a_pairs_avx512 of these MR rows; tbl:
// the chunk's tables of groups g_first .. (kPairTable entries each).
// bf16: acc[i * 256 + (2c + b2) * 16 + 4t + j]: fp32 partial sums (t) of column 16j + c +
// 8*b2. fp16 (kFp16, fp32 FMAs on the widened weights): acc[i * 512 + (2c + b2) * 32 + 16u + e]
// with the element order of build_a_fp32_avx512.
// Registers: 2*NCP*MR (bf16) or 4*NCP*MR (fp16) accumulators and 4*NCP (bf16) or 8*NCP (fp16)
// table registers (<= 24 of 32); a from memory.
// kSplitA (with kEmu): a_pairs holds each a vector pre-split into its odd and even fp32 halves
// (split_a_pairs_avx512), so the fma form costs no split per use (the FMA form on a CPU whose
// vdpbf16ps is slower than two FMAs, w4a16_fma_min_rows).
// kTop: e = 3 by vpshldw (pair_index_at; the one instantiation that may hold VBMI2 instructions: the
// target below lets the compiler use them, so it is called only where pair_index_top_enabled).
template <int MR, int NCP, bool kFp16, bool kEmu, bool kSplitA = false, bool kTop = false>
__attribute__((target("avx512f,avx512bw,avx512bf16,f16c,avx512vbmi2"))) void pair_pass_avx512(
    const __m512i* a_pairs, const int32_t* words, int64_t word_stride, int64_t kt0,
    int64_t kt1, const int32_t* prefetch_words, int64_t prefetch_tiles, const uint16_t* tbl,
    const int32_t* tile_group, int64_t g_first, int c0, float* acc) {
  constexpr int kAccRow = kFp16 ? 512 : 256, kAccCb = kFp16 ? 32 : 16, kU = kFp16 ? 2 : 1;
  // The loops over the accumulators are unrolled so that acc_v stays in registers (without
  // the pragmas GCC kept it in memory too and stored all of it on every tile: at 8 rows 16
  // stores per 32 vdpbf16ps).
  __m512 acc_v[MR][2 * NCP][kU];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int cb = 0; cb < 2 * NCP; ++cb)
#pragma GCC unroll 2
      for (int u = 0; u < kU; ++u)
        acc_v[i][cb][u] = _mm512_loadu_ps(acc + i * kAccRow + (2 * c0 + cb) * kAccCb + 16 * u);
  // Table index 16j + q: the code in bits 0..3 of each 16-bit half, j in bits 4..5
  // (vpermt2w reads bits 0..5 only).
  const __m512i code_mask = _mm512_set1_epi32(0x000f000f);
  const __m512i col_bits = _mm512_setr_epi32(0, 0x100010, 0x200020, 0x300030, 0, 0x100010,
                                             0x200020, 0x300030, 0, 0x100010, 0x200020,
                                             0x300030, 0, 0x100010, 0x200020, 0x300030);
  const __m512i col_j = _mm512_srli_epi32(col_bits, 4);
  // Entries 0..31 and 32..63 of each table (fp16: of the high-half table; low_* of the
  // low-half one).
  __m512i tbl_0[2 * NCP], tbl_1[2 * NCP], low_0[kFp16 ? 2 * NCP : 1], low_1[kFp16 ? 2 * NCP : 1];
  int64_t g_loaded = -1;
  for (int64_t kt = kt0; kt < kt1; ++kt) {
    const int32_t* wt = words + (kt - kt0) * word_stride;
    if (kt - kt0 < prefetch_tiles)  // only the first pass over the block prefetches
      for (int l = 0; l < 8; ++l)
        _mm_prefetch(reinterpret_cast<const char*>(prefetch_words + (kt - kt0) * word_stride +
                                                   16 * l),
                     _MM_HINT_T1);
    const int64_t g = tile_group[kt];
    if (g < 0) continue;  // a tile whose rows span two groups: see pair_chunk_avx512
    if (g != g_loaded) {
      constexpr int kCbEntries = kFp16 ? 128 : 64;
      const uint16_t* tg = tbl + (g - g_first) * kPairTable<kFp16> + 2 * c0 * kCbEntries;
      for (int cb = 0; cb < 2 * NCP; ++cb) {
        tbl_0[cb] = _mm512_loadu_si512(tg + cb * kCbEntries);
        tbl_1[cb] = _mm512_loadu_si512(tg + cb * kCbEntries + 32);
        if constexpr (kFp16) {
          low_0[cb] = _mm512_loadu_si512(tg + cb * kCbEntries + 64);
          low_1[cb] = _mm512_loadu_si512(tg + cb * kCbEntries + 96);
        }
      }
      g_loaded = g;
    }
    const __m512i* av = a_pairs + (kt - kt0) * (kSplitA ? 4 : 2) * MR;
#pragma GCC unroll 8
    for (int cc = 0; cc < NCP; ++cc) {
      const __m512i w = pair_load_line<kPairLineInRegister<kFp16, kEmu>>(wt + 16 * (c0 + cc));
      if constexpr (!kFp16 && !kEmu) {
        // Per row its two a vectors (h = 0, 1) each serve two of the line's four weight vectors:
        // half the a loads of one load per vdpbf16ps, which left the loop load-bound at 5..8
        // rows. Each accumulator takes h = 0 before h = 1 in both orders below (the same bits):
        // from 4 rows h outer (kPairHOuter), else the four weight vectors first.
        if constexpr (kPairHOuter<MR>) {
#pragma GCC unroll 2
          for (int h = 0; h < 2; ++h) {
            __m512i wv[2];
#pragma GCC unroll 2
            for (int b2 = 0; b2 < 2; ++b2)
              wv[b2] = _mm512_permutex2var_epi16(
                  tbl_0[2 * cc + b2],
                  pair_index_at<kTop>(w, 2 * b2 + h, code_mask, col_bits, col_j),
                  tbl_1[2 * cc + b2]);
#pragma GCC unroll 8
            for (int i = 0; i < MR; ++i) {
              const __m512bh ah = (__m512bh)_mm512_loadu_si512(av + 2 * i + h);
              acc_v[i][2 * cc][0] = _mm512_dpbf16_ps(acc_v[i][2 * cc][0], ah, (__m512bh)wv[0]);
              acc_v[i][2 * cc + 1][0] =
                  _mm512_dpbf16_ps(acc_v[i][2 * cc + 1][0], ah, (__m512bh)wv[1]);
            }
          }
        } else {
          __m512i wv[4];
#pragma GCC unroll 4
          for (int e = 0; e < 4; ++e)
            wv[e] = _mm512_permutex2var_epi16(
                tbl_0[2 * cc + (e >> 1)], pair_index_at<kTop>(w, e, code_mask, col_bits, col_j),
                tbl_1[2 * cc + (e >> 1)]);
#pragma GCC unroll 8
          for (int i = 0; i < MR; ++i) {
            const __m512bh a0 = (__m512bh)_mm512_loadu_si512(av + 2 * i);
            const __m512bh a1 = (__m512bh)_mm512_loadu_si512(av + 2 * i + 1);
            acc_v[i][2 * cc][0] = _mm512_dpbf16_ps(acc_v[i][2 * cc][0], a0, (__m512bh)wv[0]);
            acc_v[i][2 * cc + 1][0] =
                _mm512_dpbf16_ps(acc_v[i][2 * cc + 1][0], a0, (__m512bh)wv[2]);
            acc_v[i][2 * cc][0] = _mm512_dpbf16_ps(acc_v[i][2 * cc][0], a1, (__m512bh)wv[1]);
            acc_v[i][2 * cc + 1][0] =
                _mm512_dpbf16_ps(acc_v[i][2 * cc + 1][0], a1, (__m512bh)wv[3]);
          }
        }
      } else if constexpr (kEmu) {
        // vdpbf16ps without AVX512-BF16: each pair's odd row (high half) then its even row, each
        // an exact product added by an fma (no flush of subnormals, as vdpbf16ps does). h outer:
        // the two weight vectors of h (b2 = 0, 1) share the row's a vector of h, split once.
#pragma GCC unroll 2
        for (int h = 0; h < 2; ++h) {
          __m512 w_odd[2], w_even[2];
#pragma GCC unroll 2
          for (int b2 = 0; b2 < 2; ++b2) {
            const __m512i wv = _mm512_permutex2var_epi16(
                tbl_0[2 * cc + b2], pair_index(w, 2 * b2 + h, code_mask, col_bits),
                tbl_1[2 * cc + b2]);
            w_odd[b2] = bf16_pair_odd(wv);
            w_even[b2] = bf16_pair_even(wv);
          }
#pragma GCC unroll 8
          for (int i = 0; i < MR; ++i) {
            __m512 a_odd, a_even;
            if constexpr (kSplitA) {
              a_odd = _mm512_castsi512_ps(_mm512_loadu_si512(av + 4 * i + 2 * h));
              a_even = _mm512_castsi512_ps(_mm512_loadu_si512(av + 4 * i + 2 * h + 1));
            } else {
              const __m512i a = _mm512_loadu_si512(av + 2 * i + h);
              a_odd = bf16_pair_odd(a), a_even = bf16_pair_even(a);
            }
#pragma GCC unroll 2
            for (int b2 = 0; b2 < 2; ++b2) {
              __m512& c = acc_v[i][2 * cc + b2][0];
              c = _mm512_fmadd_ps(a_odd, w_odd[b2], c);
              c = _mm512_fmadd_ps(a_even, w_even[b2], c);
            }
          }
        }
      } else {
        // fp16: the fp32 weights whole, without vcvtph2ps (1.8 cycles a vector on this Zen 4):
        // the low halves looked up with the same indices, interleaved with the high ones.
#pragma GCC unroll 4
        for (int e = 0; e < 4; ++e) {
          const __m512i idx = pair_index_at<kTop>(w, e, code_mask, col_bits, col_j);
          const int cb = 2 * cc + (e >> 1);
          const __m512i wv = _mm512_permutex2var_epi16(tbl_0[cb], idx, tbl_1[cb]);
          const __m512i wl = _mm512_permutex2var_epi16(low_0[cb], idx, low_1[cb]);
          const __m512 w_u0 = _mm512_castsi512_ps(_mm512_unpacklo_epi16(wl, wv));
          const __m512 w_u1 = _mm512_castsi512_ps(_mm512_unpackhi_epi16(wl, wv));
#pragma GCC unroll 8
          for (int i = 0; i < MR; ++i) {
            const __m512 a_i =
                _mm512_loadu_ps(reinterpret_cast<const float*>(av + 2 * i + (e & 1)));
            acc_v[i][cb][0] = _mm512_fmadd_ps(a_i, w_u0, acc_v[i][cb][0]);
            acc_v[i][cb][1] = _mm512_fmadd_ps(a_i, w_u1, acc_v[i][cb][1]);
          }
        }
      }
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 8
    for (int cb = 0; cb < 2 * NCP; ++cb)
#pragma GCC unroll 2
      for (int u = 0; u < kU; ++u)
        _mm512_storeu_ps(acc + i * kAccRow + (2 * c0 + cb) * kAccCb + 16 * u, acc_v[i][cb][u]);
}

// How far ahead pair_chunks_avx512 prefetches: while a chunk decodes a block of k-tiles it
// prefetches the same tiles of the chunk kPrefetchChunks further on (16 KiB of weight ahead in
// blocks of 8 tiles), the last chunks of the range the next block's first ones. Until 2026-12-01
// each chunk prefetched its own tiles of the next block, a whole block ahead (128-256 KiB per
// thread); on the Zen 5 machine of that day the nearer target streamed faster: M = 1-2 bf16
// 1.10-1.20x (2 threads, weights rotated, the two builds alternating over 4 rounds), fp16 M = 1
// and AWQ zero points 1.01-1.25x, M = 4 and 8 level (0.95-1.07x). benchmarks/probe_cpu_ops.py
// --traversal shows the same on a bare loop with this path's instruction mix: 8-tile blocks
// with a block-ahead prefetch stream at ~65 % of a plain read, with a 1-8 chunks-ahead one at
// ~77 %.
constexpr int64_t kPrefetchChunks = 4;

// Rows per row block: bf16 8 (at 5..8 rows one line per pass: 2 * MR accumulators), fp16 4
// (its accumulators are twice as many).
template <bool kFp16>
constexpr int64_t kPairRowBlock = kFp16 ? 4 : 8;

// All 8 lines for rows [0, rows) (rows <= kPairRowBlock), in as many passes as the registers
// need. top: pair_index_top_enabled() (used at up to kPairTopRows rows, not by kEmu, whose
// lookups take pair_index).
template <bool kFp16, bool kEmu, bool kSplitA = false>
__attribute__((target("avx512f,avx512bw,avx512bf16,f16c"))) void pair_tiles_avx512(
    const __m512i* a_pairs, int64_t rows, const int32_t* words, int64_t word_stride,
    int64_t kt0, int64_t kt1, const int32_t* prefetch_words, int64_t prefetch_tiles,
    const uint16_t* tbl, const int32_t* tile_group, int64_t g_first, float* acc,
    bool top = false) {
  auto passes = [&](auto mr, auto ncp) {
    constexpr int kMr = decltype(mr)::value, kNcp = decltype(ncp)::value;
    constexpr bool kMayTop = !kEmu && kMr <= kPairTopRows;
    for (int c0 = 0; c0 < 8; c0 += kNcp, prefetch_tiles = 0)
      (kMayTop && top ? pair_pass_avx512<kMr, kNcp, kFp16, kEmu, kSplitA, kMayTop>
                      : pair_pass_avx512<kMr, kNcp, kFp16, kEmu, kSplitA>)(
          a_pairs, words, word_stride, kt0, kt1, prefetch_words, prefetch_tiles, tbl,
          tile_group, g_first, c0, acc);
  };
  using std::integral_constant;
  if constexpr (kFp16) {
    switch (rows) {
      case 1: passes(integral_constant<int, 1>{}, integral_constant<int, 2>{}); break;
      case 2: passes(integral_constant<int, 2>{}, integral_constant<int, 1>{}); break;
      case 3: passes(integral_constant<int, 3>{}, integral_constant<int, 1>{}); break;
      default: passes(integral_constant<int, 4>{}, integral_constant<int, 1>{}); break;
    }
  } else {
    switch (rows) {
      case 1:  // the fma form with split a: 4 lines a pass spill (registers)
        passes(integral_constant<int, 1>{}, integral_constant<int, kSplitA ? 2 : 4>{});
        break;
      case 2: passes(integral_constant<int, 2>{}, integral_constant<int, 2>{}); break;
      case 3: passes(integral_constant<int, 3>{}, integral_constant<int, kEmu ? 1 : 2>{}); break;
      case 4: passes(integral_constant<int, 4>{}, integral_constant<int, kEmu ? 1 : 2>{}); break;
      case 5: passes(integral_constant<int, 5>{}, integral_constant<int, 1>{}); break;
      case 6: passes(integral_constant<int, 6>{}, integral_constant<int, 1>{}); break;
      case 7: passes(integral_constant<int, 7>{}, integral_constant<int, 1>{}); break;
      default: passes(integral_constant<int, 8>{}, integral_constant<int, 1>{}); break;
    }
  }
}

// Scratch of pair_chunks_avx512, kept by the caller across calls.
struct PairScratch {
  std::vector<uint16_t> tbl;     // [chunk][group of the block][kPairTable]
  std::vector<float> acc;        // [chunk][row][256 (bf16) or 512 partial sums + 64 `extra`]
  std::vector<float> chan_scale; // [chunk][64] per channel
  std::vector<float> sc, zf;     // [chunk][group][64] (decode_chunk_groups), mixed tiles only
  std::vector<uint32_t> a_pairs; // build_a_pairs_avx512 of every row block, one k-block
  std::vector<uint32_t> a_split; // kSplitA: a_pairs split into odd / even fp32 vectors
};

// Each bf16 pair vector of a_pairs (n of them) as its odd and even halves widened to fp32, the
// two operands the fma form of vdpbf16ps multiplies (pair_pass_avx512's kSplitA).
__attribute__((target("avx512f"))) inline void split_a_pairs_avx512(const __m512i* a_pairs,
                                                                    int64_t n, __m512i* out) {
  for (int64_t j = 0; j < n; ++j) {
    const __m512i a = _mm512_loadu_si512(a_pairs + j);
    _mm512_storeu_si512(out + 2 * j, _mm512_castps_si512(bf16_pair_odd(a)));
    _mm512_storeu_si512(out + 2 * j + 1, _mm512_castps_si512(bf16_pair_even(a)));
  }
}

// Chunks [ch0, ch1) x rows [m0, m0 + rows) x k-tiles [kt_begin, kt_end) through the decode path
// (bf16: vdpbf16ps; fp16 (kFp16): the weights widened to fp32 by vcvtph2ps, fp32 FMAs). Order:
// blocks of 16 k-tiles outer, chunks inner, so that each k-tile row is read as one contiguous
// run of (ch1 - ch0) * 512 bytes and the pages in use stay few; a chunk's tables are built right
// before its tiles are decoded (they are then in L1). part == nullptr: the epilogue's results
// go to p.c (kt range: all of K); else the raw fp32 sums over the k-tile range go to
// part[i * p.size_n + n] (row m0 + i, column n), for the caller to add up. tile_group[kt]:
// the group of every row of k-tile kt, or -1 when its rows span groups (act-order boundaries):
// those tiles are dequantized row by row (dequant_tile_avx512) and accumulated in fp32 into the
// chunk's `extra` sums (wbuf column order), as on the lookup-table path.
// kEmu (bf16 only): a CPU without AVX512-BF16, vdpbf16ps emulated (pair_pass_avx512); with
// kSplitA the same fma form on a CPU that has it (w4a16_fma_min_rows), the activations split
// once per block and the tables rounded by vcvtne2ps2bf16 (the same bits either way).
template <bool kFp16, bool kEmu = false, bool kSplitA = false>
__attribute__((target("avx512f,avx512bw,avx512bf16,f16c"))) void pair_chunks_avx512(
    const W4a16GemmProblem& p, int64_t ch0, int64_t ch1, int64_t m0, int64_t rows,
    const int32_t* tile_group, bool any_mixed_tile, PairScratch& s, int64_t kt_begin,
    int64_t kt_end, float* part, int64_t tiles_per_block = 16) {
  const int64_t kTilesPerBlock = tiles_per_block;
  const int64_t word_stride = 2 * p.size_n;
  const int64_t num_chunks = ch1 - ch0;
  constexpr int64_t kAccRow = kFp16 ? 512 : 256;
  constexpr int64_t kAPairs = 2;  // a vectors per tile and row
  const int64_t acc_per_chunk = rows * (kAccRow + 64);
  const bool per_channel = p.num_groups == 1;
  const MarlinChunkTables& tb = chunk_tables();
  s.acc.assign(num_chunks * acc_per_chunk, 0.0f);
  if (per_channel || any_mixed_tile) {
    s.chan_scale.resize(num_chunks * 64);
    s.sc.resize(num_chunks * p.num_groups * 64);
    s.zf.resize(p.zeros ? num_chunks * p.num_groups * 64 : 0);
    for (int64_t ch = ch0; ch < ch1; ++ch)
      decode_chunk_groups(p, ch, s.sc.data() + (ch - ch0) * p.num_groups * 64,
                          p.zeros ? s.zf.data() + (ch - ch0) * p.num_groups * 64 : nullptr,
                          per_channel ? s.chan_scale.data() + (ch - ch0) * 64 : nullptr);
  }
  float wtile[16 * 64];
  const bool top = pair_index_top_enabled();
  int64_t built_first = -1, built_last = -1, groups_per_block = 0;
  for (int64_t kt0 = kt_begin; kt0 < kt_end; kt0 += kTilesPerBlock) {
    const int64_t kt1 = std::min(kt_end, kt0 + kTilesPerBlock);
    int64_t g_first = INT64_MAX, g_last = -1;
    for (int64_t kt = kt0; kt < kt1; ++kt) {
      if (tile_group[kt] < 0) continue;
      g_first = std::min<int64_t>(g_first, tile_group[kt]);
      g_last = std::max<int64_t>(g_last, tile_group[kt]);
    }
    const bool build_tables = g_last >= 0 && (g_first != built_first || g_last != built_last);
    if (build_tables) {
      groups_per_block = g_last - g_first + 1;
      s.tbl.resize(num_chunks * groups_per_block * kPairTable<kFp16>);
      built_first = g_first;
      built_last = g_last;
    }
    // What each chunk prefetches while it decodes (its first pass, the row block of row 0): the
    // same tiles kPrefetchChunks chunks further on, and for the last chunks of the range the
    // first chunks of the next block, past kt_end too (the K-sliced split's next slice of these
    // columns follows in memory and is usually the next item one of the threads runs).
    const int64_t next_tiles = std::min(kTilesPerBlock, p.size_k / 16 - kt1);
    constexpr int64_t kRb = kPairRowBlock<kFp16>;
    s.a_pairs.resize((kt1 - kt0) * kAPairs * ((rows + kRb - 1) / kRb * kRb) * 16);
    __m512i* a_pairs = reinterpret_cast<__m512i*>(s.a_pairs.data());
    for (int64_t i0 = 0; i0 < rows; i0 += kRb) {
      if (kFp16)
        build_a_fp32_avx512(p.a + (m0 + i0) * p.lda, p.lda, std::min(kRb, rows - i0), kt0,
                            kt1, a_pairs + (kt1 - kt0) * kAPairs * i0);
      else
        build_a_pairs_avx512(p.a_bf16 + (m0 + i0) * p.lda_bf16, p.lda_bf16,
                             std::min(kRb, rows - i0), kt0, kt1,
                             a_pairs + (kt1 - kt0) * kAPairs * i0);
    }
    constexpr int64_t kASplit = kSplitA ? 2 : 1;  // a vectors per pair vector
    const __m512i* a_operand = a_pairs;
    if constexpr (kSplitA) {
      const int64_t n = static_cast<int64_t>(s.a_pairs.size()) / 16;
      s.a_split.resize(2 * s.a_pairs.size());
      split_a_pairs_avx512(a_pairs, n, reinterpret_cast<__m512i*>(s.a_split.data()));
      a_operand = reinterpret_cast<const __m512i*>(s.a_split.data());
    }
    for (int64_t ch = ch0; ch < ch1; ++ch) {
      float* acc = s.acc.data() + (ch - ch0) * acc_per_chunk;
      const int32_t* chunk_words = p.b_q_weight + 128 * ch;
      if (any_mixed_tile) {
        const float* sc = s.sc.data() + (ch - ch0) * p.num_groups * 64;
        const float* zf = p.zeros ? s.zf.data() + (ch - ch0) * p.num_groups * 64 : nullptr;
        for (int64_t kt = kt0; kt < kt1; ++kt) {
          if (tile_group[kt] >= 0) continue;
          dequant_mixed_tile_avx512<kFp16>(p, kt, chunk_words + kt * word_stride, sc, zf, wtile);
          micro_avx512_rows(p.a + m0 * p.lda + 16 * kt, p.lda, wtile, 16, acc + rows * kAccRow,
                            rows);
        }
      }
      if (g_last < 0) continue;  // every tile of the block was mixed
      uint16_t* tbl = s.tbl.data() + (ch - ch0) * groups_per_block * kPairTable<kFp16>;
      if (build_tables)
        for (int64_t g = g_first; g <= g_last; ++g)
          build_pair_table_avx512<kFp16, kEmu && !kSplitA>(
              per_channel ? nullptr : p.scales + g * p.size_n + 64 * ch,
              p.zeros ? p.zeros + g * (p.size_n / 8) + 8 * ch : nullptr,
              tbl + (g - g_first) * kPairTable<kFp16>);
      const int64_t ahead = ch + kPrefetchChunks;
      const bool in_block = ahead < ch1;
      const int64_t prefetch_tiles = in_block ? kt1 - kt0 : next_tiles;
      const int32_t* prefetch_words =
          prefetch_tiles == 0
              ? chunk_words
              : p.b_q_weight + 128 * (in_block ? ahead : ch0 + (ahead - ch1) % num_chunks) +
                    (in_block ? kt0 : kt1) * word_stride;
      for (int64_t i0 = 0; i0 < rows; i0 += kPairRowBlock<kFp16>)
        pair_tiles_avx512<kFp16, kEmu, kSplitA>(a_operand + (kt1 - kt0) * kAPairs * i0 * kASplit,
                          std::min(kPairRowBlock<kFp16>, rows - i0),
                          chunk_words + kt0 * word_stride, word_stride, kt0, kt1,
                          prefetch_words, i0 == 0 ? prefetch_tiles : 0, tbl, tile_group,
                          g_first, acc + i0 * kAccRow, top);
    }
  }
  for (int64_t ch = ch0; ch < ch1; ++ch) {
    const float* acc = s.acc.data() + (ch - ch0) * acc_per_chunk;
    const float* extra = acc + rows * kAccRow;
    const float* chan_scale = per_channel ? s.chan_scale.data() + (ch - ch0) * 64 : nullptr;
    const float* bias = p.bias ? p.bias + 64 * ch : nullptr;
    for (int64_t i = 0; i < rows; ++i) {
      float* c_row = p.c + (m0 + i) * p.size_n + 64 * ch;
      for (int cb = 0; cb < 16; ++cb) {
        float col_sum[4];
        if (kFp16) {
          // element i of u: t = i / 4, j = 2u + (i % 4) / 2 -> column j sums the 8 elements
          // 4t + o, 4t + o + 1 (o = 2 (j % 2)) of u = j / 2
          for (int j = 0; j < 4; ++j) {
            const float* v = acc + i * kAccRow + cb * 32 + 16 * (j / 2) + 2 * (j % 2);
            col_sum[j] = ((v[0] + v[1]) + (v[4] + v[5])) + ((v[8] + v[9]) + (v[12] + v[13]));
          }
        } else {
          // lanes 4t + j: add the four 128-bit blocks (t) -> columns j = 0..3
          const __m512 v = _mm512_loadu_ps(acc + i * kAccRow + cb * 16);
          const __m128 sum = _mm_add_ps(
              _mm_add_ps(_mm512_extractf32x4_ps(v, 0), _mm512_extractf32x4_ps(v, 1)),
              _mm_add_ps(_mm512_extractf32x4_ps(v, 2), _mm512_extractf32x4_ps(v, 3)));
          _mm_storeu_ps(col_sum, sum);
        }
        for (int j = 0; j < 4; ++j) {
          const int col = 16 * j + cb / 2 + 8 * (cb % 2);
          const float sum = col_sum[j] + extra[i * 64 + tb.xcol[col]];
          if (part)
            part[i * p.size_n + 64 * ch + col] = sum;
          else
            c_row[col] = epilogue(sum, chan_scale, col, bias ? bias[col] : 0.0f);
        }
      }
    }
  }
}

#pragma GCC diagnostic pop

}  // namespace w4k::cpu

#endif  // W4K_HAVE_AVX512_PATH
