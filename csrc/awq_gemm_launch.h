// The typed awq_gemm launch shared by the CUDA and SIMT bindings (after the argument checks):
// allocates the output and the fp32 split-K scratch and calls launch_awq_gemm for x's dtype.
// Include after kernels/awq_gemm.cuh (built by nvcc, or by g++ with -DW4K_SIMT=1).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

#include "kernels/awq_gemm.cuh"

namespace w4k {

// Returns the launcher's status; `out` is [M, N] in x's dtype. scales is copied when it is not
// 16-byte aligned (the kernel reads 8 scales as one 16-byte vector).
inline cudaError_t awq_gemm_launch(const at::Tensor& x, const at::Tensor& qweight,
                                   const at::Tensor& scales, const at::Tensor& qzeros,
                                   int64_t split_k_iters, const at::Tensor& out,
                                   cudaStream_t stream) {
  const int64_t size_m = x.size(0), size_k = qweight.size(0), size_n = 8 * qweight.size(1);
  const int64_t group_size = size_k / scales.size(0);
  const at::Tensor scales16 =
      reinterpret_cast<uintptr_t>(scales.data_ptr()) % 16 == 0 ? scales : scales.clone();
  at::Tensor partial = at::empty({awq_gemm_splits(size_k, split_k_iters), size_m, size_n},
                                 x.options().dtype(at::kFloat));
  const auto* q = reinterpret_cast<const uint32_t*>(qweight.data_ptr<int32_t>());
  const auto* z = reinterpret_cast<const uint32_t*>(qzeros.data_ptr<int32_t>());
  float* p = partial.data_ptr<float>();
  if (x.scalar_type() == at::kHalf) {
    return launch_awq_gemm<half>(
        reinterpret_cast<const half*>(x.data_ptr<at::Half>()), x.stride(0), q,
        reinterpret_cast<const half*>(scales16.data_ptr<at::Half>()), z, p,
        reinterpret_cast<half*>(out.data_ptr<at::Half>()), size_m, size_n, size_k, group_size,
        split_k_iters, stream);
  }
  return launch_awq_gemm<__nv_bfloat16>(
      reinterpret_cast<const __nv_bfloat16*>(x.data_ptr<at::BFloat16>()), x.stride(0), q,
      reinterpret_cast<const __nv_bfloat16*>(scales16.data_ptr<at::BFloat16>()), z, p,
      reinterpret_cast<__nv_bfloat16*>(out.data_ptr<at::BFloat16>()), size_m, size_n, size_k,
      group_size, split_k_iters, stream);
}

}  // namespace w4k
