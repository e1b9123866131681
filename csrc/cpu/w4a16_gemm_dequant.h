// Many-rows route of the CPU w4a16_gemm: the Marlin weight dequantized once into a dense
// [K, N] matrix of the activation's half type T (torch-free; the binding then calls torch's
// matmul). Each element is w[r, n] = T((q - z) * s), rounded once, exactly the weight the
// grouped contract multiplies with (w4a16_gemm_kernel.h "Numerics"); rows r are Marlin rows
// (act-order: the binding multiplies with a[:, perm]).
//
// Work unit: one 64-column chunk x a range of k-tiles. A k-tile (16 rows) of the chunk decodes
// with the blocked path's tile decoder into 16 x 64 fp32 values in wbuf column order
// (x -> column colperm[x]); each row is put back into column order and narrowed to T bits
// (exact: the values are already rounded to T).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "cpu/w4a16_gemm_avx512.h"
#include "cpu/w4a16_gemm_convert.h"
#include "cpu/w4a16_gemm_kernel.h"
#include "cpu/w4a16_gemm_layout.h"

namespace w4k::cpu {

// Rows M from which w4a16_gemm (G > 1) dequantizes once and calls torch's matmul instead of
// running the kernel: the dense bf16 / fp16 GEMM (oneDNN, fp32 accumulation) then beats the
// kernel's re-dequantization per row block. Measured with benchmarks/bench_w4a16_cpu.py (README
// "CPU w4a16_gemm"). Overridden per call by W4K_W4A16_DEQUANT_THRESHOLD (a non-negative
// integer; 0 sends every M to the dense route, a huge value none); unparsable -> the default.
constexpr int64_t kW4a16DequantThresholdBf16 = 64;
constexpr int64_t kW4a16DequantThresholdFp16 = 64;

inline int64_t w4a16_gemm_dequant_threshold(HalfType type) {
  if (const char* v = std::getenv("W4K_W4A16_DEQUANT_THRESHOLD")) {
    char* end = nullptr;
    const long long t = std::strtoll(v, &end, 10);
    if (end != v && *end == '\0' && t >= 0) return t;
  }
  return type == HalfType::kBFloat16 ? kW4a16DequantThresholdBf16 : kW4a16DequantThresholdFp16;
}

#if defined(W4K_HAVE_AVX512_PATH) && defined(W4K_CONVERT_AVX512)
// 64 fp32 values of one tile row in wbuf column order -> T bits in chunk column order:
// out[n] = tile[xcol[n]]. Column vector j (n = 16j .. 16j + 15) takes lane xcol[n] % 32 of the
// pair (tile[0:16], tile[16:32]) where xcol[n] < 32, else of (tile[32:48], tile[48:64]): two
// vpermt2ps and one blend per 16 columns, indices from the layout table.
__attribute__((target("avx512f,avx512bw"))) inline void unpermute_row_avx512(
    const float* tile_row, HalfType type, uint16_t* out) {
  const MarlinChunkTables& tb = chunk_tables();
  alignas(64) int32_t idx[64];
  uint32_t hi_mask[4] = {0, 0, 0, 0};
  for (int n = 0; n < 64; ++n) {
    idx[n] = tb.xcol[n] & 31;
    if (tb.xcol[n] >= 32) hi_mask[n / 16] |= 1u << (n % 16);
  }
  const __m512 v0 = _mm512_loadu_ps(tile_row), v1 = _mm512_loadu_ps(tile_row + 16);
  const __m512 v2 = _mm512_loadu_ps(tile_row + 32), v3 = _mm512_loadu_ps(tile_row + 48);
  alignas(64) float row[64];
  for (int j = 0; j < 4; ++j) {
    const __m512i ix = _mm512_load_si512(idx + 16 * j);
    const __m512 lo = _mm512_permutex2var_ps(v0, ix, v1);
    const __m512 hi = _mm512_permutex2var_ps(v2, ix, v3);
    _mm512_store_ps(row + 16 * j,
                    _mm512_mask_blend_ps(static_cast<__mmask16>(hi_mask[j]), lo, hi));
  }
  narrow_row_avx512(row, 64, type, out);
}
#endif

// w[kt0 * 16 .. kt1 * 16, 64 ch .. 64 ch + 64] (row stride ldw halves) of the dequantized
// weight, for G > 1 (per-channel has no rounded weight: its scale comes after the sum).
// sc / zf: scratch of num_groups * 64 floats (zf only with zero points).
inline void dequant_chunk_to_half(const W4a16GemmProblem& p, int64_t ch, int64_t kt0, int64_t kt1,
                                  CpuIsa isa, float* sc, float* zf, uint16_t* w, int64_t ldw) {
  const MarlinChunkTables& tb = chunk_tables();
  const bool has_zp = p.zeros != nullptr;
  const bool fp16 = p.weight_type == HalfType::kFloat16;
  const bool avx512 = isa != CpuIsa::kGeneric;
  decode_chunk_groups(p, ch, sc, has_zp ? zf : nullptr, nullptr);
  alignas(64) float tile[16 * 64];
  const float* srow[16];
  const float* zrow[16];
  for (int64_t kt = kt0; kt < kt1; ++kt) {
    for (int r = 0; r < 16; ++r) {
      const int64_t g = p.g_idx ? p.g_idx[16 * kt + r] : (16 * kt + r) / p.group_size;
      srow[r] = sc + g * 64;
      zrow[r] = has_zp ? zf + g * 64 : nullptr;
    }
    const int32_t* words = p.b_q_weight + kt * 2 * p.size_n + 128 * ch;
    uint16_t* w_tile = w + 16 * kt * ldw + 64 * ch;
#if defined(W4K_HAVE_AVX512_PATH) && defined(W4K_CONVERT_AVX512)
    if (avx512) {
      if (has_zp && fp16) dequant_tile_avx512<true, true>(words, srow, zrow, tile);
      else if (has_zp) dequant_tile_avx512<true, false>(words, srow, zrow, tile);
      else if (fp16) dequant_tile_avx512<false, true>(words, srow, zrow, tile);
      else dequant_tile_avx512<false, false>(words, srow, zrow, tile);
      for (int r = 0; r < 16; ++r)
        unpermute_row_avx512(tile + 64 * r, p.weight_type, w_tile + r * ldw);
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

}  // namespace w4k::cpu
