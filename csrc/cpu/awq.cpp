// CPU kernels of awq_dequantize and awq_gemm (AutoAWQ WQLinear_GEMM weights).
//
// Work is cut in blocks of 64 columns (8 int32 words per row). A weight element is
//   w[k, n] = round_to_dtype((q[k, n] - z[g, n]) * s[g, n]),   g = k / group_size,
// where the product is exact in fp32 (a 5-bit integer times a 16-bit float), so rounding it to
// fp16/bf16 is the single rounding the GPU kernels do before their fp32-accumulating mma.
// awq_gemm accumulates out[m, n] = fma(x[m, k], w[k, n], acc) in increasing k, in fp32; every
// ISA path (isa.h) performs exactly these operations, so all paths agree bit for bit.
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "awq_checks.h"
#include "cpu/isa.h"

namespace w4k {
namespace {

constexpr int kAwqNibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};  // column 8c + j is nibble kAwqNibble[j]
constexpr int64_t kBlockN = 64;                          // columns per block (8 words)
constexpr int64_t kBlockK = 128;                         // rows of K per GEMM block

// One group's zero points and scales for a 64-column block, as floats in column order
// (columns past N: zero, so they dequantize to 0).
struct GroupParams {
  alignas(64) float z[64];
  alignas(64) float s[64];
};

template <typename scalar_t>
void load_group(const int32_t* qzeros, const scalar_t* scales, int64_t size_n, int64_t g,
                int64_t n0, int64_t ncols, GroupParams& p) {
  for (int64_t j = 0; j < kBlockN; ++j) {
    if (j < ncols) {
      const uint32_t word = qzeros[g * (size_n / 8) + (n0 + j) / 8];
      p.z[j] = static_cast<float>((word >> (4 * kAwqNibble[j % 8])) & 15);
      p.s[j] = static_cast<float>(scales[g * size_n + n0 + j]);
    } else {
      p.z[j] = p.s[j] = 0.0f;
    }
  }
}

// ---- portable path ---------------------------------------------------------------------------

template <typename scalar_t>
inline scalar_t dequant_scalar(uint32_t word, int64_t j, const GroupParams& p) {
  const float q = static_cast<float>((word >> (4 * kAwqNibble[j % 8])) & 15);
  return static_cast<scalar_t>((q - p.z[j]) * p.s[j] + 0.0f);  // + 0: -0 -> +0, as fma(.., +0)
}

template <typename scalar_t>
void dequant_rows_scalar(const int32_t* qrow, int64_t ldq, int64_t rows, int64_t ncols,
                         const GroupParams& p, scalar_t* out, int64_t ldo) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < ncols; ++j)
      out[r * ldo + j] = dequant_scalar<scalar_t>(qrow[r * ldq + j / 8], j, p);
}

template <typename scalar_t>
void dequant_block_f32_scalar(const int32_t* qrow, int64_t ldq, int64_t rows, int64_t ncols,
                              const GroupParams* const* params, float* w) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < kBlockN; ++j)
      w[r * kBlockN + j] =
          j < ncols ? static_cast<float>(dequant_scalar<scalar_t>(qrow[r * ldq + j / 8], j, *params[r]))
                    : 0.0f;
}

// acc[m, :] = fma(x[m, k], w[k, :], acc[m, :]) for k in [0, kb), every m.
void gemm_block_scalar(const float* x, int64_t ldx, int64_t size_m, const float* w, int64_t kb,
                       float* acc) {
  for (int64_t m = 0; m < size_m; ++m)
    for (int64_t k = 0; k < kb; ++k)
      for (int64_t j = 0; j < kBlockN; ++j)
        acc[m * kBlockN + j] = std::fma(x[m * ldx + k], w[k * kBlockN + j], acc[m * kBlockN + j]);
}

// ---- AVX-512 path ----------------------------------------------------------------------------

#define W4K_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,f16c,fma")))

// Codes of columns 16*pair .. 16*pair+15 from the 8 words in lanes 0..7 of `words`: lane l
// takes word 2*pair + l/8 and shifts it by 4 * kAwqNibble[l % 8].
W4K_AVX512 inline __m512 decode16(__m512i words, int pair) {
  const __m512i idx = _mm512_add_epi32(
      _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1), _mm512_set1_epi32(2 * pair));
  const __m512i shifts =
      _mm512_setr_epi32(0, 16, 4, 20, 8, 24, 12, 28, 0, 16, 4, 20, 8, 24, 12, 28);
  const __m512i q = _mm512_and_si512(
      _mm512_srlv_epi32(_mm512_permutexvar_epi32(idx, words), shifts), _mm512_set1_epi32(15));
  return _mm512_cvtepi32_ps(q);
}

// fp32 -> fp16/bf16 bit patterns, round to nearest even (NaN stays NaN).
template <typename scalar_t>
W4K_AVX512 inline __m256i round_bits(__m512 v) {
  if constexpr (std::is_same_v<scalar_t, at::Half>) {
    return _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  } else {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(u, 16),
                                                      _mm512_set1_epi32(0x40)));
    return _mm512_cvtepi32_epi16(r);
  }
}

template <typename scalar_t>
W4K_AVX512 inline __m512 bits_to_f32(__m256i h) {
  if constexpr (std::is_same_v<scalar_t, at::Half>) {
    return _mm512_cvtph_ps(h);
  } else {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

// Rounded weights of 16 columns: (q - z) * s + 0, as 16-bit patterns.
template <typename scalar_t>
W4K_AVX512 inline __m256i dequant16(__m512i words, int pair, const GroupParams& p) {
  const __m512 q = decode16(words, pair);
  const __m512 z = _mm512_load_ps(p.z + 16 * pair), s = _mm512_load_ps(p.s + 16 * pair);
  return round_bits<scalar_t>(_mm512_add_ps(_mm512_mul_ps(_mm512_sub_ps(q, z), s),
                                            _mm512_setzero_ps()));
}

template <typename scalar_t>
W4K_AVX512 void dequant_rows_avx512(const int32_t* qrow, int64_t ldq, int64_t rows,
                                    int64_t ncols, const GroupParams& p, scalar_t* out,
                                    int64_t ldo) {
  const __mmask8 word_mask = static_cast<__mmask8>((1u << (ncols / 8)) - 1);
  for (int64_t r = 0; r < rows; ++r) {
    const __m512i words = _mm512_castsi256_si512(_mm256_maskz_loadu_epi32(word_mask, qrow + r * ldq));
    for (int pair = 0; 16 * pair < ncols; ++pair) {
      const __mmask16 col_mask = ncols - 16 * pair >= 16 ? 0xFFFF : 0x00FF;
      _mm256_mask_storeu_epi16(out + r * ldo + 16 * pair, col_mask,
                               dequant16<scalar_t>(words, pair, p));
    }
  }
}

template <typename scalar_t>
W4K_AVX512 void dequant_block_f32_avx512(const int32_t* qrow, int64_t ldq, int64_t rows,
                                         int64_t ncols, const GroupParams* const* params, float* w) {
  const __mmask8 word_mask = static_cast<__mmask8>((1u << (ncols / 8)) - 1);
  for (int64_t r = 0; r < rows; ++r) {
    const __m512i words = _mm512_castsi256_si512(_mm256_maskz_loadu_epi32(word_mask, qrow + r * ldq));
    for (int pair = 0; pair < 4; ++pair)
      _mm512_store_ps(w + r * kBlockN + 16 * pair,
                      bits_to_f32<scalar_t>(dequant16<scalar_t>(words, pair, *params[r])));
  }
}

// MR rows of the output block: 4 * MR zmm accumulators live in registers across the k loop.
template <int MR>
W4K_AVX512 void gemm_rows_avx512(const float* x, int64_t ldx, const float* w, int64_t kb,
                                 float* acc) {
  __m512 c[MR][4];
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < 4; ++j) c[r][j] = _mm512_loadu_ps(acc + r * kBlockN + 16 * j);
  for (int64_t k = 0; k < kb; ++k) {
    const __m512 w0 = _mm512_load_ps(w + k * kBlockN), w1 = _mm512_load_ps(w + k * kBlockN + 16),
                 w2 = _mm512_load_ps(w + k * kBlockN + 32), w3 = _mm512_load_ps(w + k * kBlockN + 48);
    for (int r = 0; r < MR; ++r) {
      const __m512 xv = _mm512_set1_ps(x[r * ldx + k]);
      c[r][0] = _mm512_fmadd_ps(xv, w0, c[r][0]);
      c[r][1] = _mm512_fmadd_ps(xv, w1, c[r][1]);
      c[r][2] = _mm512_fmadd_ps(xv, w2, c[r][2]);
      c[r][3] = _mm512_fmadd_ps(xv, w3, c[r][3]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int j = 0; j < 4; ++j) _mm512_storeu_ps(acc + r * kBlockN + 16 * j, c[r][j]);
}

W4K_AVX512 void gemm_block_avx512(const float* x, int64_t ldx, int64_t size_m, const float* w,
                                  int64_t kb, float* acc) {
  int64_t m = 0;
  for (; m + 4 <= size_m; m += 4) gemm_rows_avx512<4>(x + m * ldx, ldx, w, kb, acc + m * kBlockN);
  for (; m < size_m; ++m) gemm_rows_avx512<1>(x + m * ldx, ldx, w, kb, acc + m * kBlockN);
}

// ---- kernels ---------------------------------------------------------------------------------

template <typename scalar_t>
void awq_dequantize_kernel(const int32_t* qweight, const scalar_t* scales, const int32_t* qzeros,
                           int64_t size_k, int64_t size_n, int64_t groups, scalar_t* out) {
  const int64_t group_size = size_k / groups;
  const int64_t blocks_n = (size_n + kBlockN - 1) / kBlockN;
  const bool simd = cpu_isa() == Isa::kAvx512;
  at::parallel_for(0, groups * blocks_n, 1, [&](int64_t begin, int64_t end) {
    GroupParams p;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t g = task / blocks_n, n0 = (task % blocks_n) * kBlockN;
      const int64_t ncols = std::min(kBlockN, size_n - n0);
      load_group(qzeros, scales, size_n, g, n0, ncols, p);
      const int32_t* qrow = qweight + g * group_size * (size_n / 8) + n0 / 8;
      scalar_t* dst = out + g * group_size * size_n + n0;
      if (simd)
        dequant_rows_avx512(qrow, size_n / 8, group_size, ncols, p, dst, size_n);
      else
        dequant_rows_scalar(qrow, size_n / 8, group_size, ncols, p, dst, size_n);
    }
  });
}

template <typename scalar_t>
void awq_gemm_kernel(const scalar_t* x, int64_t ldx, const int32_t* qweight,
                     const scalar_t* scales, const int32_t* qzeros, int64_t size_m,
                     int64_t size_k, int64_t size_n, int64_t groups, scalar_t* out) {
  const int64_t group_size = size_k / groups;
  const bool simd = cpu_isa() == Isa::kAvx512;
  // Activations in fp32 once (exact), so the inner loop is a plain fp32 FMA stream.
  std::vector<float> xf(size_m * size_k);
  at::parallel_for(0, size_m, 16, [&](int64_t b, int64_t e) {
    for (int64_t m = b; m < e; ++m)
      for (int64_t k = 0; k < size_k; ++k) xf[m * size_k + k] = static_cast<float>(x[m * ldx + k]);
  });
  const int64_t blocks_n = (size_n + kBlockN - 1) / kBlockN;
  at::parallel_for(0, blocks_n, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> acc(size_m * kBlockN);
    float* w = static_cast<float*>(std::aligned_alloc(64, kBlockK * kBlockN * sizeof(float)));
    std::vector<GroupParams> params(std::min(groups, kBlockK + 1));
    std::vector<const GroupParams*> row_params(kBlockK);
    for (int64_t nb = begin; nb < end; ++nb) {
      const int64_t n0 = nb * kBlockN, ncols = std::min(kBlockN, size_n - n0);
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t k0 = 0; k0 < size_k; k0 += kBlockK) {
        const int64_t kb = std::min(kBlockK, size_k - k0);
        const int64_t g0 = k0 / group_size;
        for (int64_t g = g0; g <= (k0 + kb - 1) / group_size; ++g)
          load_group(qzeros, scales, size_n, g, n0, ncols, params[g - g0]);
        for (int64_t r = 0; r < kb; ++r) row_params[r] = &params[(k0 + r) / group_size - g0];
        const int32_t* qrow = qweight + k0 * (size_n / 8) + n0 / 8;
        if (simd) {
          dequant_block_f32_avx512<scalar_t>(qrow, size_n / 8, kb, ncols, row_params.data(), w);
          gemm_block_avx512(xf.data() + k0, size_k, size_m, w, kb, acc.data());
        } else {
          dequant_block_f32_scalar<scalar_t>(qrow, size_n / 8, kb, ncols, row_params.data(), w);
          gemm_block_scalar(xf.data() + k0, size_k, size_m, w, kb, acc.data());
        }
      }
      for (int64_t m = 0; m < size_m; ++m)
        for (int64_t j = 0; j < ncols; ++j)
          out[m * size_n + n0 + j] = static_cast<scalar_t>(acc[m * kBlockN + j]);
    }
    std::free(w);
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
