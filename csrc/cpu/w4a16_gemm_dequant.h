// Many-rows route of the CPU w4a16_gemm: the Marlin weight dequantized once into a dense
// [K, N] matrix of the activation's half type T (torch-free; the binding then calls torch's
// matmul). Each element is w[r, n] = T((q - z) * s), rounded once, exactly the weight the
// grouped contract multiplies with (w4a16_gemm_kernel.h "Numerics"); rows r are Marlin rows
// (act-order: the binding multiplies with a[:, perm]).
//
// Work unit: a range of k-tiles x every 64-column chunk. A k-tile (16 rows) of a chunk decodes
// with the blocked path's tile decoder into 16 x 64 fp32 values in wbuf column order
// (x -> column colperm[x]); each row is put back into column order and narrowed to T bits
// (exact: the values are already rounded to T).
#pragma once

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "cpu/w4a16_gemm_avx512.h"
#include "cpu/w4a16_gemm_convert.h"
#include "cpu/w4a16_gemm_kernel.h"
#include "cpu/w4a16_gemm_layout.h"
#include "dispatch_threshold.h"

namespace w4k::cpu {

// GCC 12's avx512fintrin.h initializes its "undefined" vectors from themselves, which
// -Wuninitialized reports wherever they get inlined (as in w4a16_gemm_avx512.h).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// Rows M from which w4a16_gemm (G > 1) dequantizes once and calls torch's matmul instead of
// running the kernel. Measured with `benchmarks/bench_w4a16_cpu.py --routes` (README "CPU
// w4a16_gemm", dispatch by M): bf16 never by default since the blocked vdpbf16ps path decodes
// by table lookups (2026-11-24 10:06 UTC, shared machine: the kernel was ahead on 8 of the 9
// (shape, variant) rows at M = 256 and on all 9 at M = 512, dense / kernel 0.97-1.35 and
// 1.02-1.32; before that change the dense route led from M = 256); fp16 never: this
// CPU has no AVX512-FP16, torch's fp16 GEMM ran 4x slower than the kernel at M = 512 (and 700x
// slower with the weight as [K, N]), so fp16 stays on the kernel unless forced. Overridden per
// call by W4K_W4A16_DEQUANT_THRESHOLD (a non-negative integer, both dtypes; 0 sends every M to
// the dense route); unset or unparsable -> these defaults.
constexpr int64_t kW4a16DequantThresholdBf16 = INT64_MAX;
constexpr int64_t kW4a16DequantThresholdFp16 = INT64_MAX;

inline int64_t w4a16_gemm_dequant_threshold(HalfType type) {
  return dispatch_threshold("W4K_W4A16_DEQUANT_THRESHOLD", type == HalfType::kBFloat16
                                                              ? kW4a16DequantThresholdBf16
                                                              : kW4a16DequantThresholdFp16);
}

#if defined(W4K_HAVE_AVX512_PATH) && defined(W4K_CONVERT_AVX512)
// The unpermute indices of unpermute_row_avx512, from the layout table.
struct UnpermuteIndex {
  alignas(64) int32_t idx[64];  // xcol[n] % 32
  uint16_t hi_mask[4];          // bit n % 16 of word n / 16: xcol[n] >= 32
  UnpermuteIndex() : hi_mask{0, 0, 0, 0} {
    const MarlinChunkTables& tb = chunk_tables();
    for (int n = 0; n < 64; ++n) {
      idx[n] = tb.xcol[n] & 31;
      if (tb.xcol[n] >= 32) hi_mask[n / 16] |= static_cast<uint16_t>(1u << (n % 16));
    }
  }
};

// 64 fp32 values of one tile row in wbuf column order, each already a T value -> T bits in
// chunk column order: out[n] = tile[xcol[n]]. Column vector j (n = 16j .. 16j + 15) takes lane
// xcol[n] % 32 of the pair (tile[0:16], tile[16:32]) where xcol[n] < 32, else of (tile[32:48],
// tile[48:64]): two vpermt2ps and one blend per 16 columns. The narrowing is exact (bf16: the
// high half of the fp32 bits; fp16: vcvtps2ph of an fp16 value).
template <bool kFp16>
__attribute__((target("avx512f,avx512bw"))) inline void unpermute_row_avx512(
    const float* tile_row, const UnpermuteIndex& ui, uint16_t* out) {
  const __m512 v0 = _mm512_loadu_ps(tile_row), v1 = _mm512_loadu_ps(tile_row + 16);
  const __m512 v2 = _mm512_loadu_ps(tile_row + 32), v3 = _mm512_loadu_ps(tile_row + 48);
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    const __m512i ix = _mm512_load_si512(ui.idx + 16 * j);
    const __m512 w = _mm512_mask_blend_ps(ui.hi_mask[j], _mm512_permutex2var_ps(v0, ix, v1),
                                          _mm512_permutex2var_ps(v2, ix, v3));
    const __m256i h =
        kFp16 ? _mm512_cvtps_ph(w, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
              : _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(w), 16));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 16 * j), h);
  }
}
#endif

// Rows [16 kt0, 16 kt1) of the dequantized weight, all N columns, into w (row stride ldw
// halves), for G > 1 (per-channel has no rounded weight: its scale comes after the sum). Items
// of whole rows keep every write a contiguous run of N halves per row (column-chunk items would
// touch one page per row). Only the groups of these rows are decoded per chunk.
inline void dequant_rows_to_half(const W4a16GemmProblem& p, int64_t kt0, int64_t kt1, CpuIsa isa,
                                 uint16_t* w, int64_t ldw) {
  const MarlinChunkTables& tb = chunk_tables();
  const bool has_zp = p.zeros != nullptr;
  const bool fp16 = p.weight_type == HalfType::kFloat16;
  const bool avx512 = is_avx512(isa);
  const int64_t r0 = 16 * kt0, r1 = 16 * kt1;
  auto group_of = [&](int64_t r) { return p.g_idx ? p.g_idx[r] : r / p.group_size; };
  int64_t g0 = group_of(r0), g1 = g0;
  for (int64_t r = r0; r < r1; ++r) {
    g0 = std::min<int64_t>(g0, group_of(r));
    g1 = std::max<int64_t>(g1, group_of(r));
  }
  const int64_t ng = g1 - g0 + 1;
  std::vector<float> sc(ng * 64), zf(has_zp ? ng * 64 : 0);
  alignas(64) float tile[16 * 64];
  const float* srow[16];
  const float* zrow[16];
  for (int64_t ch = 0; ch < p.size_n / 64; ++ch) {
    // scales (and zero points) of groups g0..g1 in wbuf column order, as decode_chunk_groups
    // gives them for G > 1
    for (int64_t g = g0; g <= g1; ++g) {
      const uint16_t* s_row = p.scales + g * p.size_n + 64 * ch;
      const int32_t* z_words = has_zp ? p.zeros + g * (p.size_n / 8) + 8 * ch : nullptr;
      for (int x = 0; x < 64; ++x) {
        const int n = tb.colperm[x];
        sc[(g - g0) * 64 + x] = half_bits_to_float(s_row[tb.scale_src64[n]], p.weight_type);
        if (has_zp)
          zf[(g - g0) * 64 + x] = static_cast<float>(
              (static_cast<uint32_t>(z_words[tb.zp_word[n]]) >> tb.zp_shift[n]) & 0xf);
      }
    }
    for (int64_t kt = kt0; kt < kt1; ++kt) {
      for (int r = 0; r < 16; ++r) {
        const int64_t g = group_of(16 * kt + r) - g0;
        srow[r] = sc.data() + g * 64;
        zrow[r] = has_zp ? zf.data() + g * 64 : nullptr;
      }
      const int32_t* words = p.b_q_weight + kt * 2 * p.size_n + 128 * ch;
      uint16_t* w_tile = w + 16 * kt * ldw + 64 * ch;
#if defined(W4K_HAVE_AVX512_PATH) && defined(W4K_CONVERT_AVX512)
      if (avx512) {
        static const UnpermuteIndex ui;
        if (has_zp && fp16) dequant_tile_avx512<true, true>(words, srow, zrow, tile);
        else if (has_zp) dequant_tile_avx512<true, false>(words, srow, zrow, tile);
        else if (fp16) dequant_tile_avx512<false, true>(words, srow, zrow, tile);
        else dequant_tile_avx512<false, false>(words, srow, zrow, tile);
        for (int r = 0; r < 16; ++r) {
          if (fp16) unpermute_row_avx512<true>(tile + 64 * r, ui, w_tile + r * ldw);
          else unpermute_row_avx512<false>(tile + 64 * r, ui, w_tile + r * ldw);
        }
        continue;
      }
#endif
      (void)avx512;
      dequant_tile_generic(words, srow, has_zp ? zrow : nullptr, p.weight_type, tile);
      for (int r = 0; r < 16; ++r)
        for (int x = 0; x < 64; ++x)
          w_tile[r * ldw + tb.colperm[x]] = float_to_half_bits(tile[64 * r + x], p.weight_type);
    }
  }
}

#pragma GCC diagnostic pop

}  // namespace w4k::cpu
