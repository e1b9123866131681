// CUDA binding of awq_dequantize: argument checks (shared with the CPU and SIMT backends),
// device guard, dtype dispatch, stream, and the launch of kernels/awq_dequantize.cuh.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cstdint>

#include "aligned.h"
#include "awq_checks.h"
#include "kernels/awq_dequantize.cuh"

namespace w4k {
namespace {

// split_k_iters does not apply to a dequantization (vLLM ignores it too); thx/thy, when both
// positive, are the block shape (threads along qweight words, along rows), as in vLLM.
at::Tensor awq_dequantize_cuda(const at::Tensor& qweight, const at::Tensor& scales,
                               const at::Tensor& qzeros, int64_t split_k_iters, int64_t thx,
                               int64_t thy) {
  (void)split_k_iters;
  check_awq_dequantize_args(qweight, scales, qzeros, c10::DeviceType::CUDA);
  const c10::cuda::CUDAGuard device_guard(qweight.device());
  const int64_t size_k = qweight.size(0), size_n = 8 * qweight.size(1);
  const int64_t group_size = size_k / scales.size(0);
  at::Tensor out = at::empty({size_k, size_n}, scales.options());
  const at::Tensor scales16 = aligned16(scales);
  const int block_x = thx > 0 && thx <= 1024 ? static_cast<int>(thx) : 0;
  const int block_y = thy > 0 && thy <= 1024 ? static_cast<int>(thy) : 0;
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const auto* q = reinterpret_cast<const uint32_t*>(qweight.data_ptr<int32_t>());
  const auto* z = reinterpret_cast<const uint32_t*>(qzeros.data_ptr<int32_t>());
  cudaError_t err;
  if (scales.scalar_type() == at::kHalf) {
    err = launch_awq_dequantize<half>(
        q, reinterpret_cast<const half*>(scales16.data_ptr<at::Half>()), z,
        reinterpret_cast<half*>(out.data_ptr<at::Half>()), size_k, size_n, group_size, block_x,
        block_y, stream);
  } else {
    err = launch_awq_dequantize<__nv_bfloat16>(
        q, reinterpret_cast<const __nv_bfloat16*>(scales16.data_ptr<at::BFloat16>()), z,
        reinterpret_cast<__nv_bfloat16*>(out.data_ptr<at::BFloat16>()), size_k, size_n,
        group_size, block_x, block_y, stream);
  }
  TORCH_CHECK(err == cudaSuccess, "awq_dequantize: CUDA kernel launch failed: ",
              cudaGetErrorString(err));
  return out;
}

}  // namespace
}  // namespace w4k

TORCH_LIBRARY_IMPL(w4kernels, CUDA, m) { m.impl("awq_dequantize", &w4k::awq_dequantize_cuda); }
