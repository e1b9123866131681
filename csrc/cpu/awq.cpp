// CPU kernels of awq_dequantize and awq_gemm (AutoAWQ WQLinear_GEMM weights).
//
// Both decode 64 columns (8 int32 words) of a weight row at a time. Decoding nibble i of the 8
// words gives columns 8c + kAwqOrder[i] (c = 0..7), so a decoded block is kept in "nibble-major"
// order: lane l = 8i + c holds column 8c + kAwqOrder[i]. Scales, zeros and the GEMM accumulators
// use the same lane order, and columns are put back in place only when the output is written.
// Weights are rounded once to the activation dtype ((q - z) * s is exact in fp32), as the GPU
// kernels do before their fp32-accumulating mma.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "awq_checks.h"

namespace w4k {
namespace {

constexpr int kAwqOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};  // nibble i holds column 8c + order[i]
constexpr int64_t kBlockN = 64;                          // columns decoded together (8 words)
constexpr int64_t kBlockK = 128;                         // rows of K per GEMM block

// Column (within a 64-column block) held by lane l of the nibble-major order.
constexpr int lane_column(int l) { return 8 * (l % 8) + kAwqOrder[l / 8]; }

// Round float -> fp16/bf16 -> float, round-to-nearest-even (the weight's one rounding).
__attribute__((target("avx2,f16c"))) void round_fp16_f16c(float* v, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(v + i), _MM_FROUND_TO_NEAREST_INT);
    _mm256_storeu_ps(v + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) v[i] = static_cast<float>(c10::Half(v[i]));
}

void round_fp16(float* v, int64_t n) {
  static const bool f16c = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
  if (f16c) return round_fp16_f16c(v, n);
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(c10::Half(v[i]));
}

void round_bf16(float* v, int64_t n) {
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(c10::BFloat16(v[i]));
}

template <typename scalar_t>
void round_to(float* v, int64_t n) {
  if constexpr (std::is_same_v<scalar_t, at::Half>) round_fp16(v, n); else round_bf16(v, n);
}

// Decode the 8 words at `w` into 64 codes in nibble-major lane order.
__attribute__((target_clones("avx512f", "avx2", "default")))
void decode_words(const uint32_t* w, int32_t* codes) {
  for (int l = 0; l < 64; ++l) codes[l] = (w[l % 8] >> (4 * (l / 8))) & 15;
}

// One K-row of a 64-column block: out[l] = (q[l] - z[l]) * s[l] (exact in fp32; + 0.0f turns
// -0 into +0 like the GPU's fma(q - z, s, +0)).
__attribute__((target_clones("avx512f", "avx2", "default")))
void dequant_row(const int32_t* q, const int32_t* z, const float* s, float* out) {
  for (int l = 0; l < 64; ++l) out[l] = static_cast<float>(q[l] - z[l]) * s[l] + 0.0f;
}

// Per-group parameters of one 64-column block in lane order (missing tail columns: zero).
struct GroupParams {
  int32_t z[64];
  float s[64];
};

template <typename scalar_t>
void load_group(const int32_t* qzeros, const scalar_t* scales, int64_t size_n, int64_t g,
                int64_t n0, int64_t words, GroupParams& p) {
  uint32_t zw[8] = {0};
  std::memcpy(zw, qzeros + g * (size_n / 8) + n0 / 8, words * sizeof(uint32_t));
  decode_words(zw, p.z);
  for (int l = 0; l < 64; ++l) {
    const int64_t n = n0 + lane_column(l);
    p.s[l] = n < size_n ? static_cast<float>(scales[g * size_n + n]) : 0.0f;
  }
}

template <typename scalar_t>
void awq_dequantize_kernel(const int32_t* qweight, const scalar_t* scales, const int32_t* qzeros,
                           int64_t size_k, int64_t size_n, int64_t groups, scalar_t* out) {
  const int64_t group_size = size_k / groups;
  const int64_t blocks_n = (size_n + kBlockN - 1) / kBlockN;
  at::parallel_for(0, groups * blocks_n, 1, [&](int64_t begin, int64_t end) {
    GroupParams p;
    alignas(64) int32_t q[64];
    alignas(64) float w[64];
    for (int64_t task = begin; task < end; ++task) {
      const int64_t g = task / blocks_n, n0 = (task % blocks_n) * kBlockN;
      const int64_t words = std::min<int64_t>(8, (size_n - n0) / 8);
      load_group(qzeros, scales, size_n, g, n0, words, p);
      for (int64_t k = g * group_size; k < (g + 1) * group_size; ++k) {
        uint32_t qw[8] = {0};
        std::memcpy(qw, qweight + k * (size_n / 8) + n0 / 8, words * sizeof(uint32_t));
        decode_words(qw, q);
        dequant_row(q, p.z, p.s, w);
        scalar_t* dst = out + k * size_n + n0;
        for (int l = 0; l < 64; ++l) {
          const int col = lane_column(l);
          if (col < words * 8) dst[col] = static_cast<scalar_t>(w[l]);
        }
      }
    }
  });
}

// acc[m, :] += x[m, k] * w[k, :] over a kb x 64 block, for all rows m.
__attribute__((target_clones("avx512f", "avx2", "default")))
void gemm_block(const float* x, int64_t ldx, int64_t size_m, const float* w, int64_t kb,
                float* acc) {
  for (int64_t m = 0; m < size_m; ++m) {
    float* a = acc + m * 64;
    const float* xm = x + m * ldx;
    for (int64_t k = 0; k < kb; ++k) {
      const float xv = xm[k];
      const float* wk = w + k * 64;
      for (int l = 0; l < 64; ++l) a[l] += xv * wk[l];
    }
  }
}

template <typename scalar_t>
void awq_gemm_kernel(const scalar_t* x, int64_t ldx, const int32_t* qweight,
                     const scalar_t* scales, const int32_t* qzeros, int64_t size_m,
                     int64_t size_k, int64_t size_n, int64_t groups, scalar_t* out) {
  const int64_t group_size = size_k / groups;
  // Activations in fp32 once, so the inner loop is a plain fp32 FMA stream.
  std::vector<float> xf(size_m * size_k);
  at::parallel_for(0, size_m, 16, [&](int64_t b, int64_t e) {
    for (int64_t m = b; m < e; ++m)
      for (int64_t k = 0; k < size_k; ++k) xf[m * size_k + k] = static_cast<float>(x[m * ldx + k]);
  });
  const int64_t blocks_n = (size_n + kBlockN - 1) / kBlockN;
  at::parallel_for(0, blocks_n, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> acc(size_m * 64);
    std::vector<float> w(kBlockK * 64);
    GroupParams p;
    alignas(64) int32_t q[64];
    for (int64_t nb = begin; nb < end; ++nb) {
      const int64_t n0 = nb * kBlockN;
      const int64_t words = std::min<int64_t>(8, (size_n - n0) / 8);
      std::fill(acc.begin(), acc.end(), 0.0f);
      int64_t loaded_group = -1;
      for (int64_t k0 = 0; k0 < size_k; k0 += kBlockK) {
        const int64_t kb = std::min(kBlockK, size_k - k0);
        for (int64_t k = k0; k < k0 + kb; ++k) {
          if (k / group_size != loaded_group) {
            loaded_group = k / group_size;
            load_group(qzeros, scales, size_n, loaded_group, n0, words, p);
          }
          uint32_t qw[8] = {0};
          std::memcpy(qw, qweight + k * (size_n / 8) + n0 / 8, words * sizeof(uint32_t));
          decode_words(qw, q);
          dequant_row(q, p.z, p.s, w.data() + (k - k0) * 64);
        }
        round_to<scalar_t>(w.data(), kb * 64);
        gemm_block(xf.data() + k0, size_k, size_m, w.data(), kb, acc.data());
      }
      for (int64_t m = 0; m < size_m; ++m) {
        for (int l = 0; l < 64; ++l) {
          const int col = lane_column(l);
          if (col < words * 8) out[m * size_n + n0 + col] = static_cast<scalar_t>(acc[m * 64 + l]);
        }
      }
    }
  });
}

at::Tensor awq_dequantize_cpu(const at::Tensor& qweight, const at::Tensor& scales,
                              const at::Tensor& qzeros, c10::SymInt split_k_iters, int64_t thx,
                              int64_t thy) {
  check_awq_dequantize_args(qweight, scales, qzeros, c10::DeviceType::CPU);
  const int64_t size_k = qweight.size(0), size_n = qweight.size(1) * 8;
  at::Tensor out = at::empty({size_k, size_n}, scales.options());
  AT_DISPATCH_REDUCED_FLOATING_TYPES(scales.scalar_type(), "awq_dequantize_cpu", [&] {
    awq_dequantize_kernel<scalar_t>(qweight.data_ptr<int32_t>(), scales.data_ptr<scalar_t>(),
                                    qzeros.data_ptr<int32_t>(), size_k, size_n, scales.size(0),
                                    out.data_ptr<scalar_t>());
  });
  return out;
}

at::Tensor awq_gemm_cpu(const at::Tensor& x, const at::Tensor& qweight, const at::Tensor& scales,
                        const at::Tensor& qzeros, c10::SymInt split_k_iters) {
  check_awq_gemm_args(x, qweight, scales, qzeros, split_k_iters.expect_int(),
                      c10::DeviceType::CPU);
  const int64_t size_m = x.size(0), size_k = qweight.size(0), size_n = qweight.size(1) * 8;
  at::Tensor out = at::empty({size_m, size_n}, x.options());
  if (size_m == 0) return out;
  AT_DISPATCH_REDUCED_FLOATING_TYPES(x.scalar_type(), "awq_gemm_cpu", [&] {
    awq_gemm_kernel<scalar_t>(x.data_ptr<scalar_t>(), x.stride(0), qweight.data_ptr<int32_t>(),
                              scales.data_ptr<scalar_t>(), qzeros.data_ptr<int32_t>(), size_m,
                              size_k, size_n, scales.size(0), out.data_ptr<scalar_t>());
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(w4kernels, CPU, m) {
  m.impl("awq_dequantize", &awq_dequantize_cpu);
  m.impl("awq_gemm", &awq_gemm_cpu);
}

}  // namespace w4k
