// CUDA bindings of marlin_repack and awq_marlin_repack: argument checks (shared with the CPU and
// SIMT backends, so messages are identical), device guard, stream, and the launch of the
// torch-free kernel in kernels/marlin_repack.cuh.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>

#include "aligned.h"
#include "kernels/marlin_repack.cuh"
#include "marlin_checks.h"

namespace w4k {
namespace {

void check_launch(const char* op, cudaError_t err) {
  TORCH_CHECK(err == cudaSuccess, op, ": CUDA kernel launch failed: ", cudaGetErrorString(err));
}

at::Tensor marlin_repack_cuda(const at::Tensor& b_q_weight, const std::optional<at::Tensor>& perm,
                              int64_t size_k, int64_t size_n, int64_t num_bits) {
  check_marlin_repack_args(b_q_weight, perm, size_k, size_n, num_bits, c10::DeviceType::CUDA);
  const c10::cuda::CUDAGuard device_guard(b_q_weight.device());
  at::Tensor out = at::empty({size_k / 16, 2 * size_n}, b_q_weight.options());
  const bool act_order = has_perm(perm);
  const at::Tensor src = aligned16(b_q_weight);
  check_launch("marlin_repack",
               launch_marlin_repack(reinterpret_cast<const uint32_t*>(src.data_ptr<int32_t>()),
                                    act_order ? perm->data_ptr<int32_t>() : nullptr,
                                    reinterpret_cast<uint32_t*>(out.data_ptr<int32_t>()), size_k,
                                    size_n, at::cuda::getCurrentCUDAStream()));
  return out;
}

at::Tensor awq_marlin_repack_cuda(const at::Tensor& b_q_weight, int64_t size_k, int64_t size_n,
                                  int64_t num_bits) {
  check_awq_marlin_repack_args(b_q_weight, size_k, size_n, num_bits, c10::DeviceType::CUDA);
  const c10::cuda::CUDAGuard device_guard(b_q_weight.device());
  at::Tensor out = at::empty({size_k / 16, 2 * size_n}, b_q_weight.options());
  const at::Tensor src = aligned16(b_q_weight);
  check_launch("awq_marlin_repack",
               launch_awq_marlin_repack(reinterpret_cast<const uint32_t*>(src.data_ptr<int32_t>()),
                                        reinterpret_cast<uint32_t*>(out.data_ptr<int32_t>()),
                                        size_k, size_n, at::cuda::getCurrentCUDAStream()));
  return out;
}

}  // namespace
}  // namespace w4k

TORCH_LIBRARY_IMPL(w4kernels, CUDA, m) {
  m.impl("marlin_repack", &w4k::marlin_repack_cuda);
  m.impl("awq_marlin_repack", &w4k::awq_marlin_repack_cuda);
}
