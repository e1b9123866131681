// Torch-free basics of the CPU w4a16_gemm kernel: the problem description, the Marlin chunk
// index tables, the fp32 epilogue and scalar rounding to fp16/bf16 precision. Used by
// w4a16_gemm_avx512.h and w4a16_gemm_kernel.h.
//
// Marlin chunk layout (derived from vLLM's weight perm; tests check it against golden vectors):
// the 128 words of k-tile kt, chunk ch are b_q_weight[kt, 128*ch .. 128*ch + 127]; word
// w = 16c + 4t + j (c = 0..7, t = 0..3, j = 0..3 is the 16x16 tile, i.e. columns 16j..),
// nibble e (bits 4e..4e+3) holds
//     row = 2t + (e >> 2) + 8 * (e & 1),   col = 16j + c + 8 * ((e >> 1) & 1).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace w4k::cpu {

enum class HalfType { kFloat16, kBFloat16 };

struct W4a16GemmProblem {
  const float* a;              // [size_m, size_k] fp32, row stride lda; act-order already applied
  int64_t lda;
  const uint16_t* a_bf16;      // the same rows as bf16 bits (bf16 activations; fp16 on AMX:
  int64_t lda_bf16;            //   split rows, amx_split_row) or nullptr
  const int32_t* b_q_weight;   // [size_k / 16, 2 * size_n], Marlin layout
  const uint16_t* scales;      // [num_groups, size_n], Marlin-permuted, bits of weight_type
  const int32_t* zeros;        // [num_groups, size_n / 8] Marlin zero points, or nullptr (z = 8)
  const int32_t* g_idx;        // [size_k] group of each Marlin row (sorted), or nullptr
  const float* bias;           // [size_n] or nullptr
  float* c;                    // [size_m, size_n] fp32 result, row stride size_n
  uint16_t* out16 = nullptr;   // or, on the blocked path: the result rounded to weight_type
  int64_t size_m, size_n, size_k;
  int64_t num_groups;          // G, rows of scales (and zeros)
  int64_t group_size;          // rows per group when g_idx == nullptr (K / G; K for G == 1)
  HalfType weight_type;        // the half type w is rounded to (= a's dtype)
  // fp16 on AMX tiles: the activations have no infinity and the scales are at most 4096 in
  // magnitude, so every value splits into bf16 hi and lo parts (cpu/amx_bf16.h; the binding)
  bool amx_split_ok = false;
  // the decode split runs on AMX tiles (w4a16_amx_decode_applies, decided once by the binding)
  bool amx_decode = false;
  // fp16 activations given as bf16: the AMX path's split rows (the binding makes them only there)
  bool a_split() const { return weight_type == HalfType::kFloat16 && a_bf16 != nullptr; }
};

// ---- layout tables ---------------------------------------------------------------------------

// All per-chunk index maps, built once from the formulas (never per element).
struct MarlinChunkTables {
  int8_t colperm[64];        // wbuf column x -> chunk column n
  int8_t xcol[64];           // chunk column n -> wbuf column x (inverse of colperm)
  int8_t scale_src64[64];    // chunk column n -> position in its permuted 64-chunk (G > 1)
  int8_t scale_src32[32];    // column n of a 32-chunk -> position in permuted 32-chunk (G == 1)
  int8_t zp_word[64];        // chunk column n -> word (0..7) of the chunk's zero-point words
  int8_t zp_shift[64];       // ... and the bit offset of its nibble
  int8_t wsrc_word[16][64];  // (row, wbuf column x) -> word 0..127 of the chunk (generic path)
  int8_t wsrc_shift[16][64]; // ... and the bit offset of its nibble

  MarlinChunkTables() {
    // wbuf column x = 16q + L, q = 2*cg + b2, L = 4*cl + j  <->  col = 16j + 4cg + cl + 8*b2
    // (the AVX-512 decode transposes 128-bit blocks so a vector holds one row: see below).
    for (int x = 0; x < 64; ++x) {
      int q = x / 16, lane = x % 16, cg = q / 2, b2 = q % 2, cl = lane / 4, j = lane % 4;
      colperm[x] = static_cast<int8_t>(16 * j + 4 * cg + cl + 8 * b2);
      xcol[colperm[x]] = static_cast<int8_t>(x);
    }
    // Marlin scale perms: permuted[x] = orig[perm[x]], so orig column perm[x] sits at x.
    for (int i = 0; i < 8; ++i)
      for (int j = 0; j < 8; ++j) scale_src64[i + 8 * j] = static_cast<int8_t>(8 * i + j);
    const int single[8] = {0, 1, 8, 9, 16, 17, 24, 25};
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 8; ++j) scale_src32[2 * i + single[j]] = static_cast<int8_t>(8 * i + j);
    // Zero points: 64-perm, then per 8 columns nibble i holds position 8a + [0,2,4,6,1,3,5,7][i].
    const int awq_nibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};  // inverse of [0,2,4,6,1,3,5,7]
    for (int n = 0; n < 64; ++n) {
      int x = scale_src64[n];
      zp_word[n] = static_cast<int8_t>(x / 8);
      zp_shift[n] = static_cast<int8_t>(4 * awq_nibble[x % 8]);
    }
    for (int w = 0; w < 128; ++w) {
      int c = w / 16, t = (w / 4) % 4, j = w % 4;
      for (int e = 0; e < 8; ++e) {
        int row = 2 * t + (e >> 2) + 8 * (e & 1);
        int col = 16 * j + c + 8 * ((e >> 1) & 1);
        int x = xcol[col];
        wsrc_word[row][x] = static_cast<int8_t>(w);
        wsrc_shift[row][x] = static_cast<int8_t>(4 * e);
      }
    }
  }
};

inline const MarlinChunkTables& chunk_tables() {
  static const MarlinChunkTables tables;
  return tables;
}

// ---- scales and zero points of a chunk ------------------------------------------------------

// The value of fp16 / bf16 bits as a float (exact).
inline float half_bits_to_float(uint16_t h, HalfType type) {
  uint32_t u;
  if (type == HalfType::kBFloat16) {
    u = static_cast<uint32_t>(h) << 16;
  } else {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu,
                   man = h & 0x3ffu;
    if (exp == 0) {  // zero or subnormal: man * 2^-24, exact in fp32
      const float v = static_cast<float>(man) * 0x1p-24f;
      return sign ? -v : v;
    }
    u = sign | (exp == 0x1f ? 0x7f800000u | (man << 13) : ((exp + 112) << 23) | (man << 13));
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Scales and zero points of one chunk for every group, in wbuf column order: sc[g][x] is the
// scale of column colperm[x]. The scale perm is per 64 columns when G > 1 (aligned with the
// chunk) and per 32 columns when G == 1. Per-channel (G == 1, chan_scale != nullptr) the scales
// go to chan_scale[n] (chunk column order) for the epilogue and sc is all ones, so every path
// dequantizes to the exact q - z without a per-channel variant of its own.
// decode_group_scales: one group g into sc64 / zf64; decode_chunk_groups: all, into sc[g][x].
inline void decode_group_scales(const W4a16GemmProblem& p, int64_t ch, int64_t g, float* sc64,
                                float* zf64, float* chan_scale) {
  const MarlinChunkTables& tb = chunk_tables();
  const uint16_t* s_row = p.scales + g * p.size_n + 64 * ch;
  for (int x = 0; x < 64; ++x) {
    int n = tb.colperm[x];
    int src = p.num_groups > 1 ? tb.scale_src64[n] : 32 * (n / 32) + tb.scale_src32[n % 32];
    const float s = half_bits_to_float(s_row[src], p.weight_type);
    if (chan_scale) {
      chan_scale[n] = s;
      sc64[x] = 1.0f;
    } else {
      sc64[x] = s;
    }
    if (zf64) {
      const int32_t* z_words = p.zeros + g * (p.size_n / 8) + 8 * ch;
      uint32_t word = static_cast<uint32_t>(z_words[tb.zp_word[n]]);
      zf64[x] = static_cast<float>((word >> tb.zp_shift[n]) & 0xf);
    }
  }
}
inline void decode_chunk_groups(const W4a16GemmProblem& p, int64_t ch, float* sc, float* zf,
                                float* chan_scale) {
  for (int64_t g = 0; g < p.num_groups; ++g)
    decode_group_scales(p, ch, g, sc + g * 64, zf ? zf + g * 64 : nullptr, chan_scale);
}

// The sum of the lookup-table path's 16 lane sums of one column (lut_chunk_avx512; the portable
// and AVX2 paths mirror it), in this fixed tree: t[i] = v[i] + v[i + 8], u[i] = t[i] + t[i + 4],
// (u[0] + u[2]) + (u[1] + u[3]). v[l * stride] is lane l.
inline float lane_tree_sum16(const float* v, int64_t stride) {
  float t[8], u[4];
  for (int i = 0; i < 8; ++i) t[i] = v[i * stride] + v[(i + 8) * stride];
  for (int i = 0; i < 4; ++i) u[i] = t[i] + t[i + 4];
  return (u[0] + u[2]) + (u[1] + u[3]);
}

// ---- epilogue -----------------------------------------------------------------------------------

// The fp32 epilogue of one output element, shared by every path so that they agree to the bit.
// Grouped (chan_scale == nullptr): acc + bias. Per-channel: y = acc * s[n], then y + bias, two
// fp32 roundings in this order (the contract). The volatile store keeps the compiler from
// contracting them into one fma, which GCC does wherever FMA is enabled (in the AVX-512 target
// functions, or everywhere under -march=native) and which would change the bits per path.
inline float epilogue(float acc, const float* chan_scale, int n, float bias) {
  if (chan_scale == nullptr) return acc + bias;
  volatile float y = acc * chan_scale[n];
  return y + bias;
}

// ---- scalar half-precision rounding (generic path; AVX-512 uses vcvtps2ph) ---------------------

inline uint32_t f32_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float f32_from_bits(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

// Round a float to the nearest fp16 value (ties to even, subnormals, overflow to inf), as float.
inline float round_to_fp16(float f) {
  uint32_t x = f32_bits(f);
  uint32_t sign = x & 0x80000000u, ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return f;                              // inf / nan
  if (ax >= 0x477ff000u) return f32_from_bits(sign | 0x7f800000u);  // >= 65520 -> inf
  if (ax < 0x38800000u) {                                       // below 2^-14: fp16 subnormal
    float units = std::nearbyint(std::fabs(f) * 0x1p24f);       // multiples of 2^-24, RNE
    return f32_from_bits(sign | f32_bits(units * 0x1p-24f));
  }
  uint32_t lsb = (ax >> 13) & 1u;                               // keep 10 mantissa bits, RNE
  return f32_from_bits(sign | ((ax + 0xfffu + lsb) & ~0x1fffu));
}

inline float round_to_bf16(float f) {
  uint32_t x = f32_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return f;                // nan stays nan
  return f32_from_bits((x + 0x7fffu + ((x >> 16) & 1u)) & 0xffff0000u);
}

}  // namespace w4k::cpu
