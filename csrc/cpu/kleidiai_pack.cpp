// KleidiAI packers on raw pointers: int4 RHS (per-channel qsi4cxp, per-block qsi4c32p; NxK and
// KxN sources) and the int8 LHS quantize-and-pack qai8dxp. The packed layouts are spelled out
// in kleidiai.h; the output bytes equal KleidiAI's portable C packers, padding included.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include <immintrin.h>

#include "kleidiai.h"

namespace w4k {
namespace kai {
namespace {

// The two source layouts. Padded rows (n >= N) read the last row's bytes; for KxN the nibble
// is still chosen by the parity of the *unclamped* n, as KleidiAI does, so padded rows of an
// even-N matrix alternate between rows N-2 and N-1 (and odd N reads the source pad nibble).
struct Source {
  bool kxn;
  int64_t n, k;
  const uint8_t* rhs;
  int64_t stride;  // bytes per source row: ceil(k/2) for NxK, ceil(n/2) for KxN

  // Raw 4-bit code of element (n_row, kk), or `pad` when kk >= K.
  inline uint8_t code(int64_t n_row, int64_t kk, uint8_t pad) const {
    if (kk >= k) return pad;
    const int64_t nv = n_row < n ? n_row : n - 1;
    if (kxn) return (rhs[kk * stride + nv / 2] >> ((n_row & 1) * 4)) & 0x0F;
    return (rhs[nv * stride + kk / 2] >> ((kk & 1) * 4)) & 0x0F;
  }
};

inline int32_t sign_extend4(uint8_t v) { return (v & 0x08) ? int32_t(v) - 16 : int32_t(v); }

inline float bf16_to_f32(uint16_t bits) {
  const uint32_t u = uint32_t(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// k index of the low nibble of byte `b` of segment-row `super` (B bytes per segment), relative
// to the start of its K area: the k / k+16 pairing packs 32 consecutive k into 16 bytes.
inline int64_t k_low(int64_t super, int64_t b, int64_t seg_bytes) {
  const int64_t kk = super * seg_bytes + b;
  return kk + (kk / 16) * 16;
}

// q[i] = clamp(roundf(x[i] * scale) + zp, -128, 127). roundf (ties away from zero) is trunc
// plus a correction; |x * scale| <= 255 for finite x in [rmin, rmax], and the clamp to
// +-65536 keeps the float -> int conversion defined anyway.
void quantize_row_scalar(const float* x, int64_t k, float scale, int32_t zp, int8_t* q) {
  for (int64_t i = 0; i < k; ++i) {
    float v = x[i] * scale;
    __asm__("" : "+v"(v));  // v - trunc(v) below must not become an fma
    v = v < 65536.0f ? v : 65536.0f;
    v = v > -65536.0f ? v : -65536.0f;
    int32_t iv = int32_t(v);
    const float frac = v - float(iv);
    iv += int32_t(frac >= 0.5f) - int32_t(frac <= -0.5f);
    iv += zp;
    iv = iv < -128 ? -128 : iv;
    iv = iv > 127 ? 127 : iv;
    q[i] = int8_t(iv);
  }
}

void minmax_scalar(const float* x, int64_t k, float* mn, float* mx) {
  for (int64_t i = 0; i < k; ++i) {  // KleidiAI's comparisons: max = x > max ? x : max
    *mx = x[i] > *mx ? x[i] : *mx;
    *mn = x[i] < *mn ? x[i] : *mn;
  }
}

// The same two loops on AVX2, 8 floats at a time: identical results (maxps(x, m) is exactly
// x > m ? x : m; the order of a min / max only decides the sign of a zero, which rmin / rmax
// erase; int32 -> int8 packing with signed saturation is the clamp to [-128, 127]).
__attribute__((target("avx2"))) void minmax_avx2(const float* x, int64_t k, float* mn,
                                                 float* mx) {
  __m256 vmx = _mm256_set1_ps(*mx), vmn = _mm256_set1_ps(*mn);
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    vmx = _mm256_max_ps(v, vmx);
    vmn = _mm256_min_ps(v, vmn);
  }
  alignas(32) float hx[8], hn[8];
  _mm256_store_ps(hx, vmx);
  _mm256_store_ps(hn, vmn);
  for (int j = 0; j < 8; ++j) {
    *mx = hx[j] > *mx ? hx[j] : *mx;
    *mn = hn[j] < *mn ? hn[j] : *mn;
  }
  minmax_scalar(x + i, k - i, mn, mx);
}

__attribute__((target("avx2"))) void quantize_row_avx2(const float* x, int64_t k, float scale,
                                                       int32_t zp, int8_t* q) {
  const __m256 vs = _mm256_set1_ps(scale), hi = _mm256_set1_ps(65536.0f);
  const __m256 lo = _mm256_set1_ps(-65536.0f), half = _mm256_set1_ps(0.5f);
  const __m256 nhalf = _mm256_set1_ps(-0.5f);
  const __m256i vzp = _mm256_set1_epi32(zp);
  int64_t i = 0;
  for (; i + 32 <= k; i += 32) {
    __m256i r[4];
    for (int j = 0; j < 4; ++j) {
      __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i + 8 * j), vs);
      v = _mm256_max_ps(_mm256_min_ps(v, hi), lo);
      __m256i iv = _mm256_cvttps_epi32(v);
      const __m256 frac = _mm256_sub_ps(v, _mm256_cvtepi32_ps(iv));
      // compare masks are all-ones (-1) where true
      iv = _mm256_sub_epi32(iv, _mm256_castps_si256(_mm256_cmp_ps(frac, half, _CMP_GE_OQ)));
      iv = _mm256_add_epi32(iv, _mm256_castps_si256(_mm256_cmp_ps(frac, nhalf, _CMP_LE_OQ)));
      r[j] = _mm256_add_epi32(iv, vzp);
    }
    // packs work per 128-bit lane: [0 1 | 0 1] words, then bytes [0 1 2 3 | 0 1 2 3] in
    // dword order 0,2,4,6,1,3,5,7 -> fix with a dword permute.
    const __m256i w01 = _mm256_packs_epi32(r[0], r[1]);
    const __m256i w23 = _mm256_packs_epi32(r[2], r[3]);
    const __m256i b = _mm256_packs_epi16(w01, w23);
    const __m256i fixed = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i), fixed);
  }
  quantize_row_scalar(x + i, k - i, scale, zp, q + i);
}

}  // namespace

void rhs_pack_qsi4cxp(bool kxn, int64_t n, int64_t k, int64_t nr, int64_t kr, int64_t sr,
                      const uint8_t* rhs, const float* scale, const float* bias,
                      int64_t rhs_zero_point, uint8_t* rhs_packed) {
  const Source src{kxn, n, k, rhs, kxn ? (n + 1) / 2 : (k + 1) / 2};
  const int64_t seg_bytes = kr / sr;
  const int64_t k_i = k_internal(k);
  const int64_t stride = rhs_packed_stride_qsi4cxp(k, nr);
  const int64_t num_blocks = roundup(n, nr) / nr;
  // Unsigned codes are stored as q ^ 8 (= q - 8 as two's-complement int4); signed codes as is.
  const uint8_t flip = rhs_zero_point == 8 ? 0x08 : 0x00;
  const uint8_t pad = uint8_t(rhs_zero_point);  // value of k >= K: stores as nibble 0

  for (int64_t blk = 0; blk < num_blocks; ++blk) {
    uint8_t* dst = rhs_packed + blk * stride;
    int32_t rsum[256] = {0};  // nr <= 256 is checked by the binding
    const int64_t num_segments = nr * (k_i / 2) / seg_bytes;
    for (int64_t s = 0; s < num_segments; ++s) {
      const int64_t r = s % nr, super = s / nr, n_row = blk * nr + r;
      for (int64_t b = 0; b < seg_bytes; ++b) {
        const int64_t k0 = k_low(super, b, seg_bytes);
        const uint8_t lo = src.code(n_row, k0, pad) ^ flip;
        const uint8_t hi = src.code(n_row, k0 + 16, pad) ^ flip;
        rsum[r] += sign_extend4(lo) + sign_extend4(hi);
        *dst++ = uint8_t(lo | (hi << 4));
      }
    }
    float* tail = reinterpret_cast<float*>(dst);
    for (int64_t r = 0; r < nr; ++r) {
      const int32_t v = rsum[r] * 16;  // the kernels see each nibble as 16 * w
      std::memcpy(dst + 4 * r, &v, 4);
    }
    for (int64_t r = 0; r < nr; ++r) {
      const int64_t nv = std::min<int64_t>(blk * nr + r, n - 1);
      tail[nr + r] = scale[nv] * 0.0625f;
      tail[2 * nr + r] = bias ? bias[nv] : 0.0f;
    }
  }
}

void rhs_pack_qsi4c32p(bool kxn, int64_t n, int64_t k, int64_t nr, int64_t kr, int64_t sr,
                       int64_t bl, const uint8_t* rhs, const uint16_t* scale_bf16,
                       const float* bias, uint8_t* rhs_packed) {
  const Source src{kxn, n, k, rhs, kxn ? (n + 1) / 2 : (k + 1) / 2};
  const int64_t seg_bytes = kr / sr;
  const int64_t num_kblocks = roundup(k, bl) / bl;
  const int64_t stride = rhs_packed_stride_qsi4c32p(k, nr, bl);
  const int64_t num_blocks = roundup(n, nr) / nr;
  const int64_t segs_per_kblock = nr * (bl / 2) / seg_bytes;

  for (int64_t blk = 0; blk < num_blocks; ++blk) {
    uint8_t* dst = rhs_packed + blk * stride;
    float rsum[256] = {0.0f};
    for (int64_t kb = 0; kb < num_kblocks; ++kb) {
      uint16_t* scales = reinterpret_cast<uint16_t*>(dst + nr * (bl / 2));
      for (int64_t r = 0; r < nr; ++r) {
        const int64_t nv = std::min<int64_t>(blk * nr + r, n - 1);
        std::memcpy(&scales[r], &scale_bf16[nv * num_kblocks + kb], 2);
      }
      for (int64_t s = 0; s < segs_per_kblock; ++s) {
        const int64_t r = s % nr, super = s / nr, n_row = blk * nr + r;
        int32_t seg_sum = 0;
        for (int64_t b = 0; b < seg_bytes; ++b) {
          const int64_t k0 = kb * bl + k_low(super, b, seg_bytes);
          const uint8_t lo = src.code(n_row, k0, 8) ^ 0x08;
          const uint8_t hi = src.code(n_row, k0 + 16, 8) ^ 0x08;
          seg_sum += sign_extend4(lo) + sign_extend4(hi);
          *dst++ = uint8_t(lo | (hi << 4));
        }
        // One f32 add per segment, in increasing k: the order KleidiAI's packer uses (the
        // segment's own partial sum, seg_sum * scale, is exact).
        rsum[r] += float(seg_sum) * bf16_to_f32(scales[r]);
      }
      dst += nr * 2;  // past the scales
    }
    float* tail = reinterpret_cast<float*>(dst);
    for (int64_t r = 0; r < nr; ++r) {
      const int64_t nv = std::min<int64_t>(blk * nr + r, n - 1);
      tail[r] = rsum[r];
      tail[nr + r] = bias ? bias[nv] : 0.0f;
    }
  }
}

void lhs_quant_pack_qai8dxp(int64_t m_begin, int64_t m_end, int64_t k, int64_t mr, int64_t kr,
                            int64_t sr, const float* lhs, int64_t lhs_stride,
                            uint8_t* lhs_packed) {
  const int64_t seg = kr / sr;
  const int64_t k_i = k_internal(k);
  const int64_t group_stride = lhs_packed_stride_qai8dxp(k, mr);
  const float qmin = -128.0f, qmax = 127.0f;
  std::vector<int8_t> row_q(k_i);
  // W4K_KLEIDIAI_ISA=scalar forces the scalar loops here too (tests compare both with golden).
  Isa isa = Isa::scalar;
  const char* why = nullptr;
  if (!parse_isa("auto", &isa, &why)) isa = Isa::scalar;
  const bool simd = isa != Isa::scalar;

  for (int64_t row = m_begin; row < m_end; ++row) {
    const float* x = lhs + row * lhs_stride;
    float mx = -3.40282347e+38f, mn = 3.40282347e+38f;
    if (simd) minmax_avx2(x, k, &mn, &mx);
    else minmax_scalar(x, k, &mn, &mx);
    const float rmin = mn < 0.0f ? mn : 0.0f;
    const float rmax = mx > 0.0f ? mx : 0.0f;
    const float scale = rmin == rmax ? 1.0f : (qmax - qmin) / (rmax - rmin);
    const float recip = scale != 0.0f ? 1.0f / scale : 0.0f;
    // Each product is rounded on its own, as in KleidiAI (built without FP contraction).
    float dmin = rmin * scale, dmax = rmax * scale;
    __asm__("" : "+v"(dmin), "+v"(dmax));  // no fused multiply-add even if FMA is enabled
    float zp = (qmin + dmin) + (qmax + dmax) > 0.0f ? qmin - dmin : qmax - dmax;
    zp = zp > qmin ? zp : qmin;
    zp = zp < qmax ? zp : qmax;
    const int32_t zp_i = int32_t(std::nearbyint(zp));  // ties to even, like rintf

    const int64_t g = row / mr, r = row % mr;
    int8_t* q = reinterpret_cast<int8_t*>(lhs_packed + g * group_stride);
    // Quantize the row contiguously (k >= K repeats x[K-1]), then scatter its segments.
    if (simd) quantize_row_avx2(x, k, scale, zp_i, row_q.data());
    else quantize_row_scalar(x, k, scale, zp_i, row_q.data());
    std::fill(row_q.begin() + k, row_q.end(), row_q[k - 1]);
    for (int64_t t = 0; t < k_i / seg; ++t)
      std::memcpy(q + (t * mr + r) * seg, row_q.data() + t * seg, seg);
    uint8_t* params = lhs_packed + g * group_stride + mr * k_i;
    const int32_t neg_zp = -zp_i;
    std::memcpy(params + 4 * r, &neg_zp, 4);
    std::memcpy(params + 4 * mr + 4 * r, &recip, 4);
  }
}

}  // namespace kai
}  // namespace w4k
