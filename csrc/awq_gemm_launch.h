// The typed awq_gemm launch shared by the CUDA and SIMT bindings (after the argument checks):
// the dequantize-then-matmul dispatch for many tokens, operand copies for alignment, the
// split-K scratch and counters, and the launchers of kernels/awq_gemm.cuh for x's dtype.
// Include after kernels/awq_gemm.cuh (built by nvcc, or by g++ with -DW4K_SIMT=1).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <cstdlib>

#include "aligned.h"
#include "dispatch_threshold.h"
#include "kernels/awq_gemm.cuh"

namespace w4k {

// vLLM's AWQ layer runs awq_dequantize + a dense matmul once the layer sees this many tokens
// (rows of x): the fp16 GEMM then beats re-dequantizing the weight in every M tile. Overridden
// per call by the environment variable W4K_AWQ_DEQUANT_THRESHOLD (a non-negative integer).
constexpr int64_t kAwqGemmDequantThreshold = 256;

inline int64_t awq_gemm_dequant_threshold() {
  return dispatch_threshold("W4K_AWQ_DEQUANT_THRESHOLD", kAwqGemmDequantThreshold);
}

// t [rows, cols] as a 16-byte aligned tensor whose row stride is a multiple of `multiple`
// elements: t itself when it already is one, else a zero-padded copy [rows, round_up(cols)].
inline at::Tensor awq_padded_rows(const at::Tensor& t, int64_t multiple) {
  const int64_t cols = t.size(1);
  if (t.stride(1) == 1 && t.stride(0) % multiple == 0 && cols % multiple == 0 && is_aligned16(t))
    return t;
  at::Tensor padded =
      at::zeros({t.size(0), (cols + multiple - 1) / multiple * multiple}, t.options());
  padded.narrow(1, 0, cols).copy_(t);
  return padded;
}

// w [K, N] = awq_dequantize(qweight, scales, qzeros) with the CUDA kernel (the first half of
// the many-token path; the binding then runs at::matmul(x, w)).
inline cudaError_t awq_gemm_dequantize_weight(const at::Tensor& qweight, const at::Tensor& scales,
                                              const at::Tensor& qzeros, const at::Tensor& w,
                                              cudaStream_t stream) {
  const int64_t size_k = qweight.size(0), size_n = 8 * qweight.size(1);
  const int64_t group_size = size_k / scales.size(0);
  const at::Tensor s = aligned16(scales);
  const auto* q = reinterpret_cast<const uint32_t*>(qweight.data_ptr<int32_t>());
  const auto* z = reinterpret_cast<const uint32_t*>(qzeros.data_ptr<int32_t>());
  if (scales.scalar_type() == at::kHalf) {
    return launch_awq_dequantize<half>(q, reinterpret_cast<const half*>(s.data_ptr<at::Half>()), z,
                                       reinterpret_cast<half*>(w.data_ptr<at::Half>()), size_k,
                                       size_n, group_size, 0, 0, stream);
  }
  return launch_awq_dequantize<__nv_bfloat16>(
      q, reinterpret_cast<const __nv_bfloat16*>(s.data_ptr<at::BFloat16>()), z,
      reinterpret_cast<__nv_bfloat16*>(w.data_ptr<at::BFloat16>()), size_k, size_n, group_size, 0,
      0, stream);
}

// The tensor-core kernel on x [M, K] (M below the dequant threshold); `out` is [M, N] in x's
// dtype. Copies, only where needed: x when its rows are not 16-byte aligned or K % 8 != 0
// (zero-padded to a multiple of 8 columns: 16-byte cp.async of A); qweight / qzeros when N % 32
// != 0 (rows padded to 16 bytes; AutoAWQ checkpoints have N % 64 == 0), qweight also when its
// rows are narrower than an N tile (N < 128 or 256: padded to the tile); misaligned scales.
inline cudaError_t awq_gemm_launch(const at::Tensor& x, const at::Tensor& qweight,
                                   const at::Tensor& scales, const at::Tensor& qzeros,
                                   int64_t split_k_iters, const at::Tensor& out,
                                   cudaStream_t stream) {
  const int64_t size_m = x.size(0), size_k = qweight.size(0), size_n = 8 * qweight.size(1);
  const int64_t group_size = size_k / scales.size(0);
  const AwqGemmPlan plan = awq_gemm_plan(size_m, size_n, size_k, group_size, split_k_iters);
  const at::Tensor xa = awq_padded_rows(x, 8);
  // qweight rows hold at least a tile's words (launch_awq_gemm: the last N tile is shifted left
  // to end at the row stride), so narrow weights (N < 256) are padded to a tile's width.
  const int64_t tile_words = plan.tile_n / 8;
  const at::Tensor qa = awq_padded_rows(qweight, qweight.size(1) < tile_words ? tile_words : 4);
  const at::Tensor za = awq_padded_rows(qzeros, 4);
  const at::Tensor sa = aligned16(scales);
  at::Tensor scratch, counters;
  if (plan.splits > 1) {
    scratch = at::empty({plan.scratch_floats}, x.options().dtype(at::kFloat));
    counters = at::zeros({plan.counters}, x.options().dtype(at::kInt));
  }
  float* sp = plan.splits > 1 ? scratch.data_ptr<float>() : nullptr;
  int* cp = plan.splits > 1 ? counters.data_ptr<int32_t>() : nullptr;
  const auto* q = reinterpret_cast<const uint32_t*>(qa.data_ptr<int32_t>());
  const auto* z = reinterpret_cast<const uint32_t*>(za.data_ptr<int32_t>());
  if (x.scalar_type() == at::kHalf) {
    return launch_awq_gemm<half>(reinterpret_cast<const half*>(xa.data_ptr<at::Half>()),
                                 xa.stride(0), q, qa.stride(0),
                                 reinterpret_cast<const half*>(sa.data_ptr<at::Half>()), z,
                                 za.stride(0), reinterpret_cast<half*>(out.data_ptr<at::Half>()),
                                 sp, cp, size_m, size_n, size_k, group_size, plan, stream);
  }
  return launch_awq_gemm<__nv_bfloat16>(
      reinterpret_cast<const __nv_bfloat16*>(xa.data_ptr<at::BFloat16>()), xa.stride(0), q,
      qa.stride(0), reinterpret_cast<const __nv_bfloat16*>(sa.data_ptr<at::BFloat16>()), z,
      za.stride(0), reinterpret_cast<__nv_bfloat16*>(out.data_ptr<at::BFloat16>()), sp, cp, size_m,
      size_n, size_k, group_size, plan, stream);
}

}  // namespace w4k
