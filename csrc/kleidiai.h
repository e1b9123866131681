// KleidiAI int4 formats on x86: torch-free kernels (raw pointers, sizes; no ATen).
//
// Vocabulary (KleidiAI's): the RHS is the N x K weight, the LHS the M x K activation.
//   nr  rows of N packed together (the micro-kernel's output width)
//   kr  K values of one row stored contiguously before moving to the next row, over sr steps
//   sr  split ratio; one "segment" of a row holds B = kr / sr packed bytes
//   bl  K block length of the per-block (c32) scales, a multiple of 32
//   mr  LHS rows interleaved together
//
// Packed RHS, one nr-block (rows n0 .. n0+nr-1; rows >= N are padding), K_i = roundup(K, 32):
//   per-channel qsi4cxp:  [nr * K_i / 2 B weights][nr x int32 rsum][nr x f32 scale][nr x f32 bias]
//   per-block qsi4c32p:   for each K block: [nr * bl / 2 B weights][nr x bf16 scale],
//                         then [nr x f32 rsum][nr x f32 bias]
// Weights: byte i of a nr*L/2-byte weight area (L = K_i or bl) is, with s = i / B, b = i % B,
//   kk = (s / nr) * B + b, row r = s % nr, k0 = kk + (kk / 16) * 16 (+ block start), k1 = k0 + 16:
//   low nibble = w(n0 + r, k0), high nibble = w(n0 + r, k1); each nibble is the signed int4
//   two's-complement value q - rhs_zero_point (0 where k >= K).
// rsum: per-channel int32 16 * sum_k w(n, k); per-block f32 sum over blocks of scale * sum w,
//   accumulated one B-byte segment at a time in increasing k.  Per-channel scale is stored / 16.
//
// Packed LHS qai8dxp, one mr-group, K_i = roundup(K, 32):
//   [mr * K_i int8, row r's k-segment t (B values) at (t * mr + r) * B][mr x int32 -zero_point]
//   [mr x f32 1/scale];  values for k >= K repeat x[K-1].
#pragma once

#include <cstdint>

namespace w4k {
namespace kai {

// Kernel paths. avx2 uses vpmaddubsw + vpmaddwd; avxvnni the same kernel with the VEX vpdpbusd;
// avx512 the AVX-512 VNNI vpdpbusd on zmm. All produce identical int32 dot products.
enum class Isa { scalar = 0, avx2 = 1, avxvnni = 2, avx512 = 3 };

// The best ISA this CPU supports (avx512 > avxvnni > avx2 > scalar).
bool cpu_has(Isa isa);
Isa best_isa();
// "auto" -> env W4K_KLEIDIAI_ISA if set, else best_isa();
// "scalar"/"avx2"/"avxvnni"/"avx512" as named. Returns false (with *why set) for an unknown
// name or an ISA this CPU lacks.
bool parse_isa(const char* name, Isa* out, const char** why);
const char* isa_name(Isa isa);

inline int64_t roundup(int64_t a, int64_t b) { return (a + b - 1) / b * b; }
inline int64_t k_internal(int64_t k) { return roundup(k, 32); }

// ---- sizes ------------------------------------------------------------------------------
inline int64_t rhs_packed_stride_qsi4cxp(int64_t k, int64_t nr) {
  return nr * (k_internal(k) / 2 + 4 + 4 + 4);
}
inline int64_t rhs_packed_size_qsi4cxp(int64_t n, int64_t k, int64_t nr) {
  return roundup(n, nr) / nr * rhs_packed_stride_qsi4cxp(k, nr);
}
inline int64_t rhs_packed_stride_qsi4c32p(int64_t k, int64_t nr, int64_t bl) {
  return nr * ((bl / 2 + 2) * (roundup(k, bl) / bl) + 4 + 4);
}
inline int64_t rhs_packed_size_qsi4c32p(int64_t n, int64_t k, int64_t nr, int64_t bl) {
  return roundup(n, nr) / nr * rhs_packed_stride_qsi4c32p(k, nr, bl);
}
inline int64_t lhs_packed_stride_qai8dxp(int64_t k, int64_t mr) {
  return mr * (k_internal(k) + 4 + 4);
}
inline int64_t lhs_packed_size_qai8dxp(int64_t m, int64_t k, int64_t mr) {
  return roundup(m, mr) / mr * lhs_packed_stride_qai8dxp(k, mr);
}

// ---- packers (byte-identical to KleidiAI's scalar C packers) -----------------------------
// rhs: kxn=false: [n, ceil(k/2)] bytes, low nibble = even k; kxn=true: [k, ceil(n/2)], low
// nibble = even n. rhs_zero_point 8 (unsigned nibbles) or 0 (signed int4). bias may be null.
void rhs_pack_qsi4cxp(bool kxn, int64_t n, int64_t k, int64_t nr, int64_t kr, int64_t sr,
                      const uint8_t* rhs, const float* scale, const float* bias,
                      int64_t rhs_zero_point, uint8_t* rhs_packed);
// rhs as above with zero point 8; scale_bf16 [n, k/bl] raw bf16 bits; bias may be null.
void rhs_pack_qsi4c32p(bool kxn, int64_t n, int64_t k, int64_t nr, int64_t kr, int64_t sr,
                       int64_t bl, const uint8_t* rhs, const uint16_t* scale_bf16,
                       const float* bias, uint8_t* rhs_packed);
// Quantizes rows [m_begin, m_end) of lhs (row stride lhs_stride floats) into the packed
// buffer (whole-buffer layout; mr-groups are addressed from m_begin). Unwritten slots of the
// last mr-group (rows >= m) are left as they are. Finite inputs assumed.
void lhs_quant_pack_qai8dxp(int64_t m_begin, int64_t m_end, int64_t k, int64_t mr, int64_t kr,
                            int64_t sr, const float* lhs, int64_t lhs_stride,
                            uint8_t* lhs_packed);

// ---- matmul --------------------------------------------------------------------------------
struct MatmulArgs {
  int64_t m, n, k;
  int64_t mr, nr, kr, sr;
  int64_t bl;  // 0 = per-channel (qsi4cxp), else per-block (qsi4c32p) block length
  const uint8_t* lhs_packed;
  const uint8_t* rhs_packed;
  // [m, num_kblocks] int32: sum of the packed LHS int8 values of each row over each K block
  // (per-channel: one block of K_i values, padding included); see lhs_block_sums. The SIMD
  // kernels multiply unsigned codes (w + 8) and subtract 8 * this sum; the scalar one ignores it.
  const int32_t* lhs_sums;
  float* dst;  // [m, n] row-major, row stride dst_stride floats
  int64_t dst_stride;
  float clamp_min, clamp_max;
};

inline int64_t num_kblocks(const MatmulArgs& a) { return a.bl > 0 ? a.k / a.bl : 1; }
void lhs_block_sums(const MatmulArgs& a, int64_t m_begin, int64_t m_end, int32_t* sums);

// Whether `isa` has a SIMD kernel for these parameters (else the scalar kernel runs).
bool simd_supports(Isa isa, const MatmulArgs& a);
// Computes dst rows [m_begin, m_end) x nr-blocks [nb_begin, nb_end) (block b = columns
// b*nr .. b*nr+nr-1, clipped to n). Thread-safe for disjoint ranges.
void matmul(Isa isa, const MatmulArgs& a, int64_t m_begin, int64_t m_end, int64_t nb_begin,
            int64_t nb_end);

}  // namespace kai
}  // namespace w4k
