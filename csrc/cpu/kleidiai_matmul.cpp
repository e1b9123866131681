// qai8dxp (int8 LHS, per-row asymmetric) x qsi4cxp / qsi4c32p (int4 RHS) -> f32, on x86.
//
// Integer part: for each output (m, n) and K block, dot = sum_k a[m, k] * w[n, k], where a is
// the packed int8 LHS and w the signed int4 weight. The scalar kernel computes it directly.
// The SIMD kernels feed vpdpbusd / vpmaddubsw the *unsigned* code u = w + 8 (nibble ^ 8) against
// the signed LHS and subtract 8 * sum_k a[m, k] (lhs_sums), which gives the same integer.
//
// Epilogue, in KleidiAI's order (their NEON dotprod micro-kernels; 16 * dot is what their
// kernels accumulate, since they read each nibble as 16 * w):
//   per-channel: iacc = 16 * dot + lhs_offset * rsum            (int32; rsum = 16 * sum w)
//                out = ((float(iacc) * rhs_scale) * lhs_scale) + bias, clamp    (rhs_scale = s / 16)
//   per-block:   acc = 0; for each block: acc = fma(float(16 * dot_b), bf16(s_b) * 0.0625, acc)
//                acc = fma(rsum, float(lhs_offset), acc)      (rsum = f32 sum of s_b * sum w)
//                out = (acc * lhs_scale) + bias, clamp  (max with clamp_min, then min with max)
// Every float op is rounded on its own except the two explicit fmas; rounded() keeps the
// compiler from contracting a multiply into the add after it.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

#include "kleidiai.h"

// GCC 12 reports the deliberately undefined upper lanes inside its own AVX-512 intrinsic
// headers (_mm512_undefined_*) as "may be used uninitialized"; nothing of ours is.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#define W4K_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma")))
#define W4K_AVX2 __attribute__((target("avx2,fma")))
#define W4K_AVXVNNI __attribute__((target("avx2,fma,avxvnni")))

namespace w4k {
namespace kai {

// ---- ISA selection -------------------------------------------------------------------------

bool cpu_has(Isa isa) {
  switch (isa) {
    case Isa::scalar:
      return true;
    case Isa::avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Isa::avxvnni:
      return cpu_has(Isa::avx2) && __builtin_cpu_supports("avxvnni");
    case Isa::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
             __builtin_cpu_supports("fma");
  }
  return false;
}

Isa best_isa() {
  for (Isa isa : {Isa::avx512, Isa::avxvnni, Isa::avx2})
    if (cpu_has(isa)) return isa;
  return Isa::scalar;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::scalar: return "scalar";
    case Isa::avx2: return "avx2";
    case Isa::avxvnni: return "avxvnni";
    case Isa::avx512: return "avx512";
  }
  return "?";
}

bool parse_isa(const char* name, Isa* out, const char** why) {
  std::string s = name ? name : "auto";
  if (s == "auto") {
    const char* env = std::getenv("W4K_KLEIDIAI_ISA");
    if (env == nullptr || *env == '\0' || std::string(env) == "auto") {
      // The library-wide cap W4K_CPU_ISA (scalar | avx2 | avx512) applies too.
      Isa best = best_isa();
      if (const char* cap = std::getenv("W4K_CPU_ISA")) {
        const std::string c = cap;
        if (c == "scalar") best = Isa::scalar;
        else if (c == "avx2" && best > Isa::avx2) best = cpu_has(Isa::avxvnni) ? Isa::avxvnni : Isa::avx2;
      }
      *out = best;
      return true;
    }
    s = env;
  }
  for (Isa isa : {Isa::scalar, Isa::avx2, Isa::avxvnni, Isa::avx512}) {
    if (s == isa_name(isa)) {
      if (!cpu_has(isa)) {
        *why = "this CPU does not support it";
        return false;
      }
      *out = isa;
      return true;
    }
  }
  *why = "expected one of auto, scalar, avx2, avxvnni, avx512";
  return false;
}

// ---- shared helpers ---------------------------------------------------------------------------

namespace {

struct LhsRow {  // where row m's values and quantization parameters live in the packed LHS
  const int8_t* q;  // segment t (seg bytes) at q + t * mr * seg
  int32_t offset;   // -zero_point
  float scale;      // 1 / quantization scale
};

inline LhsRow lhs_row(const MatmulArgs& a, int64_t m) {
  const int64_t seg = a.kr / a.sr, k_i = k_internal(a.k);
  const uint8_t* group = a.lhs_packed + (m / a.mr) * lhs_packed_stride_qai8dxp(a.k, a.mr);
  const int64_t r = m % a.mr;
  LhsRow row;
  row.q = reinterpret_cast<const int8_t*>(group) + r * seg;
  std::memcpy(&row.offset, group + a.mr * k_i + 4 * r, 4);
  std::memcpy(&row.scale, group + a.mr * k_i + 4 * a.mr + 4 * r, 4);
  return row;
}

inline int64_t rhs_stride(const MatmulArgs& a) {
  return a.bl > 0 ? rhs_packed_stride_qsi4c32p(a.k, a.nr, a.bl)
                  : rhs_packed_stride_qsi4cxp(a.k, a.nr);
}

inline float bf16_to_f32(uint16_t bits) {
  const uint32_t u = uint32_t(bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float clampf(float v, float lo, float hi) {
  v = v > lo ? v : lo;  // fmax / fmin order as KleidiAI
  return v < hi ? v : hi;
}

// Rounds x to its type by a store and reload, so the multiply that produced it cannot be fused
// with the add that follows (GCC contracts a * b + c into an fma wherever FMA is enabled: in
// the SIMD target functions, and everywhere under -march=native).
// (The SIMD kernels do the same with a volatile vector.)
inline float rounded(float x) {
  volatile float t = x;
  return t;
}

// ---- scalar kernel: any (mr, nr, kr, sr, bl) ----------------------------------------------------

void matmul_scalar(const MatmulArgs& a, int64_t m0, int64_t m1, int64_t nb) {
  const int64_t nr = a.nr, seg = a.kr / a.sr;
  const int64_t k_i = k_internal(a.k);
  const bool per_block = a.bl > 0;
  const int64_t block_k = per_block ? a.bl : k_i;
  const int64_t nkb = num_kblocks(a);
  const uint8_t* w_base = a.rhs_packed + nb * rhs_stride(a);
  const int64_t cols = std::min(nr, a.n - nb * nr);
  int32_t dot[256];
  float facc[256];

  for (int64_t m = m0; m < m1; ++m) {
    const LhsRow row = lhs_row(a, m);
    auto lhs_at = [&](int64_t kk) { return int32_t(row.q[(kk / seg) * a.mr * seg + kk % seg]); };
    const uint8_t* w = w_base;
    std::fill(facc, facc + nr, 0.0f);
    for (int64_t kb = 0; kb < nkb; ++kb) {
      std::fill(dot, dot + nr, 0);
      const int64_t num_segments = nr * (block_k / 2) / seg;
      for (int64_t s = 0; s < num_segments; ++s) {
        const int64_t r = s % nr, super = s / nr;
        for (int64_t b = 0; b < seg; ++b) {
          const int64_t kk0 = super * seg + b;
          const int64_t k0 = kb * block_k + kk0 + (kk0 / 16) * 16;
          const uint8_t byte = *w++;
          const int32_t lo = (byte & 0x0F) ^ 0x08, hi = (byte >> 4) ^ 0x08;  // w + 8
          dot[r] += lhs_at(k0) * (lo - 8) + lhs_at(k0 + 16) * (hi - 8);
        }
      }
      if (per_block) {
        for (int64_t r = 0; r < nr; ++r) {
          uint16_t sb;
          std::memcpy(&sb, w + 2 * r, 2);
          facc[r] = std::fma(float(dot[r] * 16), bf16_to_f32(sb) * 0.0625f, facc[r]);
        }
        w += 2 * nr;
      }
    }
    float* out = a.dst + m * a.dst_stride + nb * nr;
    for (int64_t r = 0; r < cols; ++r) {
      float v;
      if (per_block) {
        float rsum, bias;
        std::memcpy(&rsum, w + 4 * r, 4);
        std::memcpy(&bias, w + 4 * nr + 4 * r, 4);
        v = std::fma(rsum, float(row.offset), facc[r]);
        v = rounded(v * row.scale);
        v = v + bias;
      } else {
        int32_t rsum;
        float scale, bias;
        std::memcpy(&rsum, w + 4 * r, 4);
        std::memcpy(&scale, w + 4 * nr + 4 * r, 4);
        std::memcpy(&bias, w + 8 * nr + 4 * r, 4);
        const int32_t iacc = dot[r] * 16 + row.offset * rsum;
        v = float(iacc) * scale;
        v = rounded(v * row.scale);
        v = v + bias;
      }
      out[r] = clampf(v, a.clamp_min, a.clamp_max);
    }
  }
}

// KleidiAI's epilogue for the 8 columns of one output row, from the nr-block trailer at `w`
// (per-channel: int32 rsum, f32 scale, f32 bias; per-block: f32 rsum, f32 bias), in its order:
// per-channel (16 * dot + offset * rsum) * scale, per-block fma(rsum, offset, facc); then times
// the LHS scale, plus bias, clamped.
W4K_AVX2 inline __m256 epilogue8(const uint8_t* w, bool per_block, const LhsRow& row, __m256 facc,
                                 __m256i dot, __m256 lo, __m256 hi) {
  __m256 v, bias;
  if (per_block) {
    const __m256 rsum = _mm256_loadu_ps(reinterpret_cast<const float*>(w));
    bias = _mm256_loadu_ps(reinterpret_cast<const float*>(w + 32));
    v = _mm256_fmadd_ps(rsum, _mm256_set1_ps(float(row.offset)), facc);
  } else {
    const __m256i rsum = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
    const __m256 scale = _mm256_loadu_ps(reinterpret_cast<const float*>(w + 32));
    bias = _mm256_loadu_ps(reinterpret_cast<const float*>(w + 64));
    const __m256i iacc = _mm256_add_epi32(
        _mm256_slli_epi32(dot, 4), _mm256_mullo_epi32(_mm256_set1_epi32(row.offset), rsum));
    v = _mm256_mul_ps(_mm256_cvtepi32_ps(iacc), scale);
  }
  volatile __m256 scaled = _mm256_mul_ps(v, _mm256_set1_ps(row.scale));  // see rounded()
  v = _mm256_add_ps(scaled, bias);
  return _mm256_min_ps(_mm256_max_ps(v, lo), hi);
}

// ---- AVX-512 VNNI kernel: nr = 8, kr / sr = 8 --------------------------------------------------
// One 32-k chunk of an nr-block is 128 bytes: s0 = 8 rows x 8 bytes (k 0-7 low, 16-23 high),
// then s1 (k 8-15 low, 24-31 high). Row r owns dword lanes 2r, 2r+1 of a zmm; the LHS 8-byte
// segment for those k is broadcast to every qword.

template <int MT>
W4K_AVX512 void tile_avx512(const MatmulArgs& a, int64_t m0, int64_t nb) {
  const int64_t k_i = k_internal(a.k);
  const bool per_block = a.bl > 0;
  const int64_t nkb = num_kblocks(a);
  const int64_t chunks = (per_block ? a.bl : k_i) / 32;
  const int64_t seg_step = a.mr * 8;  // bytes between consecutive 8-value segments of a row
  const uint8_t* w = a.rhs_packed + nb * rhs_stride(a);
  const int64_t w_ahead = rhs_stride(a);

  LhsRow rows[MT];
#pragma GCC unroll 8
  for (int i = 0; i < MT; ++i) rows[i] = lhs_row(a, m0 + i);
  const __m512i flip = _mm512_set1_epi8(0x08 | 0x80);
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  // Lane j of the pair sums: the even dword lanes 2r of row i's accumulator hold row r's first
  // half, the odd ones its second half; two rows fill one zmm.
  const __m512i even_lanes = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd_lanes = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  // Every loop over the rows is unrolled (#pragma GCC unroll), so that the accumulator arrays
  // stay in registers: with one loop rolled GCC kept them in memory too and stored them on every
  // k-block (17 stack slots per block at MT = 8 on the per-block path).
  __m256 facc[MT];
  __m512 facc2[(MT + 1) / 2];
  __m256i dots[MT] = {};
#pragma GCC unroll 8
  for (int i = 0; i < MT; ++i) facc[i] = _mm256_setzero_ps();
#pragma GCC unroll 8
  for (int i = 0; i < (MT + 1) / 2; ++i) facc2[i] = _mm512_setzero_ps();

  for (int64_t kb = 0; kb < nkb; ++kb) {
    // Start each row's even lanes at -8 * (its LHS sum over this block): the pair sums then
    // come out as the signed dot products directly.
    // Tiles of >= 4 rows have enough independent chains with one accumulator per row; smaller
    // ones use two (kTwo) so the vpdpbusd latency does not serialize them.
    constexpr bool kTwo = MT < 4;
    __m512i acc0[MT], acc1[MT];
#pragma GCC unroll 8
    for (int i = 0; i < MT; ++i) {
      acc0[i] = _mm512_maskz_set1_epi32(0x5555, -8 * a.lhs_sums[(m0 + i) * nkb + kb]);
      acc1[i] = _mm512_setzero_si512();
    }
#define W4K_ROW_SUM(i) (kTwo ? _mm512_add_epi32(acc0[i], acc1[i]) : acc0[i])
    const int8_t* lq[MT];
#pragma GCC unroll 8
    for (int i = 0; i < MT; ++i) lq[i] = rows[i].q + kb * chunks * 4 * seg_step;
    for (int64_t c = 0; c < chunks; ++c) {
      // The next nr-block's weights, one chunk ahead per chunk: they arrive while this block
      // computes (no fault past the buffer's end: prefetches never fault).
      _mm_prefetch(reinterpret_cast<const char*>(w + w_ahead), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(w + w_ahead + 64), _MM_HINT_T0);
      const __m512i s0 = _mm512_xor_si512(_mm512_loadu_si512(w), flip);
      const __m512i s1 = _mm512_xor_si512(_mm512_loadu_si512(w + 64), flip);
      w += 128;
      const __m512i s0l = _mm512_and_si512(s0, low4);
      const __m512i s1l = _mm512_and_si512(s1, low4);
      const __m512i s0h = _mm512_and_si512(_mm512_srli_epi16(s0, 4), low4);
      const __m512i s1h = _mm512_and_si512(_mm512_srli_epi16(s1, 4), low4);
#pragma GCC unroll 8
      for (int i = 0; i < MT; ++i) {
        const int8_t* p = lq[i];
        int64_t v0, v1, v2, v3;
        std::memcpy(&v0, p, 8);
        std::memcpy(&v1, p + seg_step, 8);
        std::memcpy(&v2, p + 2 * seg_step, 8);
        std::memcpy(&v3, p + 3 * seg_step, 8);
        __m512i& acc_b = kTwo ? acc1[i] : acc0[i];
        acc0[i] = _mm512_dpbusd_epi32(acc0[i], s0l, _mm512_set1_epi64(v0));
        acc_b = _mm512_dpbusd_epi32(acc_b, s1l, _mm512_set1_epi64(v1));
        acc0[i] = _mm512_dpbusd_epi32(acc0[i], s0h, _mm512_set1_epi64(v2));
        acc_b = _mm512_dpbusd_epi32(acc_b, s1h, _mm512_set1_epi64(v3));
        lq[i] = p + 4 * seg_step;
      }
    }
    if (!per_block) {
#pragma GCC unroll 8
      for (int i = 0; i < MT; ++i) {
        const __m512i sum = W4K_ROW_SUM(i);
        const __m256i pair = _mm512_cvtepi64_epi32(_mm512_add_epi32(sum, _mm512_srli_epi64(sum, 32)));
        dots[i] = pair;
      }
      continue;
    }
    // Per-block: rows i, i+1 share one zmm (row i in the low 8 lanes), so the pair sums,
    // the conversion and the fma run once per two rows.
    const __m128i sb = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w));
    w += 16;
    __m256 d = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(sb), 16));
    d = _mm256_mul_ps(d, _mm256_set1_ps(0.0625f));
    const __m512 d2 = _mm512_castpd_ps(
        _mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(d)), _mm256_castps_pd(d), 1));
#pragma GCC unroll 8
    for (int i = 0; i < MT; i += 2) {
      const __m512i s0 = W4K_ROW_SUM(i);
      const __m512i s1 = i + 1 < MT ? W4K_ROW_SUM(i + 1) : s0;
      const __m512i pair = _mm512_add_epi32(_mm512_permutex2var_epi32(s0, even_lanes, s1),
                                            _mm512_permutex2var_epi32(s0, odd_lanes, s1));
      const __m512 f = _mm512_cvtepi32_ps(_mm512_slli_epi32(pair, 4));
      facc2[i / 2] = _mm512_fmadd_ps(f, d2, facc2[i / 2]);
    }
  }
  if (per_block) {
#pragma GCC unroll 8
    for (int i = 0; i < MT; ++i) {
      const __m512d v = _mm512_castps_pd(facc2[i / 2]);
      facc[i] = _mm256_castpd_ps(i % 2 ? _mm512_extractf64x4_pd(v, 1) : _mm512_castpd512_pd256(v));
    }
  }

  const int64_t cols = std::min<int64_t>(8, a.n - nb * 8);
  const __mmask8 store_mask = __mmask8((1u << cols) - 1);
  const __m256 lo = _mm256_set1_ps(a.clamp_min), hi = _mm256_set1_ps(a.clamp_max);
#pragma GCC unroll 8
  for (int i = 0; i < MT; ++i) {
    const __m256 v = epilogue8(w, per_block, rows[i], facc[i], dots[i], lo, hi);
    _mm256_mask_storeu_ps(a.dst + (m0 + i) * a.dst_stride + nb * 8, store_mask, v);
  }
}

#undef W4K_ROW_SUM

// ---- AVX2 kernel (optionally AVX-VNNI): nr = 8, kr / sr = 8 ------------------------------------
// Same chunk as above, split into two ymm halves (rows 0-3, rows 4-7). Without VNNI, the four
// u8 x s8 products of a chunk are summed as int16 (|sum| <= 4 * 2 * 15 * 128 < 2^15) before one
// vpmaddwd widens them. Both instances are compiled with the avxvnni target (a template's target
// is shared); the VNNI=false one contains AVX2 instructions only, so it runs without AVX-VNNI.

template <int MT, bool VNNI>
W4K_AVXVNNI void tile_avx2(const MatmulArgs& a, int64_t m0, int64_t nb) {
  const int64_t k_i = k_internal(a.k);
  const bool per_block = a.bl > 0;
  const int64_t nkb = num_kblocks(a);
  const int64_t chunks = (per_block ? a.bl : k_i) / 32;
  const int64_t seg_step = a.mr * 8;
  const uint8_t* w = a.rhs_packed + nb * rhs_stride(a);
  const int64_t w_ahead = rhs_stride(a);

  LhsRow rows[MT];
  for (int i = 0; i < MT; ++i) rows[i] = lhs_row(a, m0 + i);
  const __m256i flip = _mm256_set1_epi8(char(0x88));
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i ones16 = _mm256_set1_epi16(1);
  __m256 facc[MT];
  __m256i dots[MT] = {};
  for (int i = 0; i < MT; ++i) facc[i] = _mm256_setzero_ps();

  for (int64_t kb = 0; kb < nkb; ++kb) {
    __m256i acc[MT][2];
    for (int i = 0; i < MT; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_si256();
    const int8_t* lq[MT];
    for (int i = 0; i < MT; ++i) lq[i] = rows[i].q + kb * chunks * 4 * seg_step;
    for (int64_t c = 0; c < chunks; ++c) {
      _mm_prefetch(reinterpret_cast<const char*>(w + w_ahead), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(w + w_ahead + 64), _MM_HINT_T0);
      for (int h = 0; h < 2; ++h) {
        const __m256i s0 = _mm256_xor_si256(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 32 * h)), flip);
        const __m256i s1 = _mm256_xor_si256(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 64 + 32 * h)), flip);
        const __m256i s0l = _mm256_and_si256(s0, low4);
        const __m256i s1l = _mm256_and_si256(s1, low4);
        const __m256i s0h = _mm256_and_si256(_mm256_srli_epi16(s0, 4), low4);
        const __m256i s1h = _mm256_and_si256(_mm256_srli_epi16(s1, 4), low4);
        for (int i = 0; i < MT; ++i) {
          const int8_t* p = lq[i];
          long long v0, v1, v2, v3;
          std::memcpy(&v0, p, 8);
          std::memcpy(&v1, p + seg_step, 8);
          std::memcpy(&v2, p + 2 * seg_step, 8);
          std::memcpy(&v3, p + 3 * seg_step, 8);
          const __m256i a0 = _mm256_set1_epi64x(v0), a1 = _mm256_set1_epi64x(v1);
          const __m256i a2 = _mm256_set1_epi64x(v2), a3 = _mm256_set1_epi64x(v3);
          if constexpr (VNNI) {
            acc[i][h] = _mm256_dpbusd_avx_epi32(acc[i][h], s0l, a0);
            acc[i][h] = _mm256_dpbusd_avx_epi32(acc[i][h], s1l, a1);
            acc[i][h] = _mm256_dpbusd_avx_epi32(acc[i][h], s0h, a2);
            acc[i][h] = _mm256_dpbusd_avx_epi32(acc[i][h], s1h, a3);
          } else {
            const __m256i p01 = _mm256_add_epi16(_mm256_maddubs_epi16(s0l, a0),
                                                 _mm256_maddubs_epi16(s1l, a1));
            const __m256i p23 = _mm256_add_epi16(_mm256_maddubs_epi16(s0h, a2),
                                                 _mm256_maddubs_epi16(s1h, a3));
            acc[i][h] = _mm256_add_epi32(
                acc[i][h], _mm256_madd_epi16(_mm256_add_epi16(p01, p23), ones16));
          }
        }
      }
      w += 128;
      for (int i = 0; i < MT; ++i) lq[i] += 4 * seg_step;
    }
    for (int i = 0; i < MT; ++i) {
      // hadd gives rows [0 1 4 5 | 2 3 6 7]; the qword permute restores 0..7.
      const __m256i pair = _mm256_permute4x64_epi64(_mm256_hadd_epi32(acc[i][0], acc[i][1]), 0xD8);
      const int32_t corr = 8 * a.lhs_sums[(m0 + i) * nkb + kb];
      dots[i] = _mm256_sub_epi32(pair, _mm256_set1_epi32(corr));
    }
    if (per_block) {
      const __m128i sb = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w));
      w += 16;
      __m256 d = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(sb), 16));
      d = _mm256_mul_ps(d, _mm256_set1_ps(0.0625f));
      for (int i = 0; i < MT; ++i) {
        const __m256 f = _mm256_cvtepi32_ps(_mm256_slli_epi32(dots[i], 4));
        facc[i] = _mm256_fmadd_ps(f, d, facc[i]);
      }
    }
  }

  const int64_t cols = std::min<int64_t>(8, a.n - nb * 8);
  const __m256 lo = _mm256_set1_ps(a.clamp_min), hi = _mm256_set1_ps(a.clamp_max);
  for (int i = 0; i < MT; ++i) {
    const __m256 v = epilogue8(w, per_block, rows[i], facc[i], dots[i], lo, hi);
    float* out = a.dst + (m0 + i) * a.dst_stride + nb * 8;
    if (cols == 8) {
      _mm256_storeu_ps(out, v);
    } else {
      alignas(32) float tmp[8];
      _mm256_store_ps(tmp, v);
      std::memcpy(out, tmp, cols * 4);
    }
  }
}

template <int MAX_MT, typename Tile>
inline void run_tiles(int64_t m0, int64_t m1, Tile tile) {
  // Full MAX_MT tiles, then one smaller tile for the remainder.
  int64_t m = m0;
  for (; m + MAX_MT <= m1; m += MAX_MT) tile(m, std::integral_constant<int, MAX_MT>{});
  const int64_t rest = m1 - m;
  if (rest <= 0) return;
  if constexpr (MAX_MT > 4) {
    if (rest >= 4) { tile(m, std::integral_constant<int, 4>{}); m += 4; }
    const int64_t r2 = m1 - m;
    if (r2 >= 2) { tile(m, std::integral_constant<int, 2>{}); m += 2; }
    if (m < m1) tile(m, std::integral_constant<int, 1>{});
  } else {
    if (rest >= 2) { tile(m, std::integral_constant<int, 2>{}); m += 2; }
    if (m < m1) tile(m, std::integral_constant<int, 1>{});
  }
}

}  // namespace

bool simd_supports(Isa isa, const MatmulArgs& a) {
  if (isa == Isa::scalar) return false;
  return a.nr == 8 && a.kr == 8 * a.sr && (a.bl == 0 || a.bl % 32 == 0);
}

void lhs_block_sums(const MatmulArgs& a, int64_t m_begin, int64_t m_end, int32_t* sums) {
  const int64_t seg = a.kr / a.sr, nkb = num_kblocks(a);
  const int64_t segs_per_block = (a.bl > 0 ? a.bl : k_internal(a.k)) / seg;
  for (int64_t m = m_begin; m < m_end; ++m) {
    const LhsRow row = lhs_row(a, m);
    for (int64_t kb = 0; kb < nkb; ++kb) {
      int32_t s = 0;
      for (int64_t t = kb * segs_per_block; t < (kb + 1) * segs_per_block; ++t) {
        const int8_t* p = row.q + t * a.mr * seg;
        for (int64_t b = 0; b < seg; ++b) s += p[b];
      }
      sums[m * nkb + kb] = s;
    }
  }
}

void matmul(Isa isa, const MatmulArgs& a, int64_t m_begin, int64_t m_end, int64_t nb_begin,
            int64_t nb_end) {
  if (!simd_supports(isa, a)) isa = Isa::scalar;
  // 64 LHS rows (<= 64 * K bytes) stay in L2 while the weights of [nb_begin, nb_end) stream
  // past them once per chunk.
  constexpr int64_t kMChunk = 64;
  for (int64_t mc = m_begin; mc < m_end; mc += kMChunk) {
    const int64_t me = std::min(m_end, mc + kMChunk);
    for (int64_t nb = nb_begin; nb < nb_end; ++nb) {
      switch (isa) {
        case Isa::avx512:
          run_tiles<8>(mc, me, [&](int64_t m, auto mt) { tile_avx512<decltype(mt)::value>(a, m, nb); });
          break;
        case Isa::avxvnni:
          run_tiles<4>(mc, me, [&](int64_t m, auto mt) { tile_avx2<decltype(mt)::value, true>(a, m, nb); });
          break;
        case Isa::avx2:
          run_tiles<4>(mc, me, [&](int64_t m, auto mt) { tile_avx2<decltype(mt)::value, false>(a, m, nb); });
          break;
        default:
          matmul_scalar(a, mc, me, nb);
      }
    }
  }
}

}  // namespace kai
}  // namespace w4k
