// Argument checks of the AWQ ops, shared by the CPU, CUDA and SIMT bindings and the Meta kernels.
#pragma once

#include "checks.h"

namespace w4k {

// qweight int32 [K, N/8], scales fp16/bf16 [G, N] with G dividing K, qzeros int32 [G, N/8].
inline void check_awq_weight_args(const char* op, const at::Tensor& qweight,
                                  const at::Tensor& scales, const at::Tensor& qzeros,
                                  c10::DeviceType device) {
  check_device(op, "qweight", qweight, device);
  check_same_device(op, "scales", scales, "qweight", qweight);
  check_same_device(op, "qzeros", qzeros, "qweight", qweight);
  check_dtype(op, "qweight", qweight, at::kInt);
  check_half_dtype(op, "scales", scales);
  check_dtype(op, "qzeros", qzeros, at::kInt);
  check_dim(op, "qweight", qweight, 2);
  check_dim(op, "scales", scales, 2);
  check_dim(op, "qzeros", qzeros, 2);
  const c10::SymInt size_k = qweight.sym_size(0), size_n = qweight.sym_size(1) * 8;
  TORCH_CHECK(size_k > 0 && size_n > 0, op, ": qweight must be non-empty [K, N/8], got shape ",
              qweight.sym_sizes());
  const c10::SymInt groups = scales.sym_size(0);
  TORCH_CHECK(scales.sym_size(1) == size_n, op, ": scales must have N = 8 * qweight.size(1) = ",
              size_n, " columns, got shape ", scales.sym_sizes());
  TORCH_CHECK(groups > 0 && size_k % groups == 0, op,
              ": scales.size(0) (the number of groups) must divide K = qweight.size(0) = ", size_k,
              ", got ", groups);
  // One group count for both: when they disagree, name both shapes instead of blaming qzeros.
  TORCH_CHECK(qzeros.sym_size(0) == groups, op, ": scales and qzeros must have the same number ",
              "of groups (size(0)), got scales ", scales.sym_sizes(), " and qzeros ",
              qzeros.sym_sizes());
  check_shape(op, "qzeros", qzeros, {groups, size_n / 8});
  check_contiguous(op, "qweight", qweight);
  check_contiguous(op, "scales", scales);
  check_contiguous(op, "qzeros", qzeros);
}

inline void check_awq_dequantize_args(const at::Tensor& qweight, const at::Tensor& scales,
                                      const at::Tensor& qzeros, c10::DeviceType device) {
  check_awq_weight_args("awq_dequantize", qweight, scales, qzeros, device);
}

// The activation x [M, K] (unit stride along K, the dtype of scales) and the AutoAWQ weight
// tensors of a GEMM op (awq_gemm, awq_gemm_a8).
inline void check_awq_x_and_weight_args(const char* op, const at::Tensor& x,
                                        const at::Tensor& qweight, const at::Tensor& scales,
                                        const at::Tensor& qzeros, c10::DeviceType device) {
  check_awq_weight_args(op, qweight, scales, qzeros, device);
  check_same_device(op, "x", x, "qweight", qweight);
  TORCH_CHECK(x.scalar_type() == scales.scalar_type(), op,
              ": x must have the dtype of scales (", scales.scalar_type(), "), got ",
              x.scalar_type());
  check_dim(op, "x", x, 2);
  TORCH_CHECK(x.sym_size(1) == qweight.sym_size(0), op, ": x must have K = qweight.size(0) = ",
              qweight.sym_size(0), " columns, got shape ", x.sym_sizes());
  TORCH_CHECK(x.sym_stride(1) == 1, op, ": x must have unit stride along K, got strides ",
              x.sym_strides());
}

inline void check_awq_gemm_args(const at::Tensor& x, const at::Tensor& qweight,
                                const at::Tensor& scales, const at::Tensor& qzeros,
                                int64_t split_k_iters, c10::DeviceType device) {
  const char* op = "awq_gemm";
  check_awq_x_and_weight_args(op, x, qweight, scales, qzeros, device);
  TORCH_CHECK(split_k_iters >= 1 && split_k_iters <= 32, op,
              ": split_k_iters must lie in [1, 32], got ", split_k_iters);
}

}  // namespace w4k
