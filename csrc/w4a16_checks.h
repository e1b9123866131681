// Argument checks of w4a16_gemm (vLLM gptq_marlin_gemm), shared by the CPU, CUDA and SIMT
// bindings and the Meta kernel: `device` is the device type the binding serves. Value checks
// that read tensor data (perm / g_idx ranges, a permutation, sorted g_idx, a zero workspace) only
// run for host tensors (see marlin_checks.h): never in the Meta kernel.
#pragma once

#include <optional>

#include "marlin_checks.h"

namespace w4k {

// What the checked arguments mean for the kernel.
struct W4a16GemmArgs {
  bool has_act_order;   // perm and g_idx given (non-empty)
  bool has_zp;          // b_zeros given (non-empty)
  bool has_bias;        // b_bias given (non-empty)
  int64_t num_groups;   // G = b_scales.size(0)
  int64_t group_size;   // K / G without act-order (K for G == 1); 0 with act-order (g_idx rules)
};

inline bool has_values(const std::optional<at::Tensor>& t) {
  return t.has_value() && t->sym_numel() > 0;
}

// Dtype, device, rank, contiguity and shape of one optional int32 tensor.
inline void check_int32_operand(const char* op, const char* name, const at::Tensor& t,
                                c10::DeviceType device, const at::Tensor& a,
                                std::initializer_list<c10::SymInt> shape) {
  check_device(op, name, t, device);
  check_same_device(op, name, t, "a", a);
  check_dtype(op, name, t, at::kInt);
  check_dim(op, name, t, static_cast<int64_t>(shape.size()));
  check_shape(op, name, t, shape);
  check_contiguous(op, name, t);
}

// Sizes, a [M, K] (unit stride along K, fp16/bf16), b_q_weight (Marlin int32 [K/16, 2N]) and
// b_scales ([G, N], a's dtype) of a Marlin-format GEMM op (w4a16_gemm, w4a8_gemm).
inline void check_marlin_gemm_operands(const char* op, const at::Tensor& a,
                                       const at::Tensor& b_q_weight, const at::Tensor& b_scales,
                                       int64_t num_bits, const c10::SymInt& size_m,
                                       int64_t size_n, int64_t size_k, c10::DeviceType device) {
  check_marlin_sizes(op, size_k, size_n, num_bits);
  TORCH_CHECK(size_m >= 0, op, ": size_m must be non-negative, got ", size_m);
  check_dim_bound(op, "size_m", size_m);

  check_device(op, "a", a, device);
  check_half_dtype(op, "a", a);
  check_dim(op, "a", a, 2);
  check_shape(op, "a", a, {size_m, size_k});
  TORCH_CHECK(a.sym_stride(1) == 1 || size_m == 0, op,
              ": a must be unit-stride along K (row stride may exceed K), got strides ",
              a.sym_strides());

  check_device(op, "b_q_weight", b_q_weight, device);
  check_same_device(op, "b_q_weight", b_q_weight, "a", a);
  check_dtype(op, "b_q_weight", b_q_weight, at::kInt);
  check_dim(op, "b_q_weight", b_q_weight, 2);
  check_shape(op, "b_q_weight", b_q_weight, {size_k / 16, 2 * size_n});
  check_contiguous(op, "b_q_weight", b_q_weight);

  check_device(op, "b_scales", b_scales, device);
  check_same_device(op, "b_scales", b_scales, "a", a);
  TORCH_CHECK(b_scales.scalar_type() == a.scalar_type(), op, ": b_scales must have the dtype of a (",
              a.scalar_type(), "), got ", b_scales.scalar_type());
  check_dim(op, "b_scales", b_scales, 2);
  TORCH_CHECK(b_scales.sym_size(0) >= 1 && b_scales.sym_size(1) == size_n, op,
              ": b_scales must have shape [num_groups >= 1, size_n = ", size_n, "], got ",
              b_scales.sym_sizes());
  check_contiguous(op, "b_scales", b_scales);
}

// Optional Marlin zero points b_zeros int32 [G, N/8] (G = b_scales.size(0)); returns whether given.
inline bool check_marlin_zeros(const char* op, const std::optional<at::Tensor>& b_zeros,
                               const at::Tensor& b_scales, int64_t num_groups, int64_t size_n,
                               c10::DeviceType device, const at::Tensor& a) {
  if (!has_values(b_zeros)) return false;
  // One group count for both: when they disagree, name both shapes instead of blaming b_zeros.
  TORCH_CHECK(b_zeros->dim() != 2 || b_zeros->sym_size(0) == num_groups, op,
              ": b_scales and b_zeros must have the same number of groups (size(0)), got "
              "b_scales ", b_scales.sym_sizes(), " and b_zeros ", b_zeros->sym_sizes());
  check_int32_operand(op, "b_zeros", *b_zeros, device, a, {num_groups, size_n / 8});
  return true;
}

// Optional bias b_bias [N] in a's dtype; returns whether given.
inline bool check_marlin_bias(const char* op, const std::optional<at::Tensor>& b_bias,
                              int64_t size_n, c10::DeviceType device, const at::Tensor& a) {
  if (!has_values(b_bias)) return false;
  check_device(op, "b_bias", *b_bias, device);
  check_same_device(op, "b_bias", *b_bias, "a", a);
  TORCH_CHECK(b_bias->scalar_type() == a.scalar_type(), op,
              ": b_bias must have the dtype of a (", a.scalar_type(), "), got ",
              b_bias->scalar_type());
  check_dim(op, "b_bias", *b_bias, 1);
  check_shape(op, "b_bias", *b_bias, {size_n});
  check_contiguous(op, "b_bias", *b_bias);
  return true;
}

// Act-order operands of a Marlin-format GEMM op: g_idx and perm come together (returns whether
// they are given); when they are, both int32 [K] and perm a permutation of [0, K) (host tensors).
inline bool check_act_order_operands(const char* op, const std::optional<at::Tensor>& g_idx,
                                     const std::optional<at::Tensor>& perm,
                                     c10::DeviceType device, const at::Tensor& a,
                                     int64_t size_k) {
  const bool has_g_idx = has_values(g_idx), has_perm_ = has_perm(perm);
  TORCH_CHECK(has_g_idx == has_perm_, op,
              ": g_idx and perm must both be given (act-order) or both be None/empty, got g_idx ",
              has_g_idx ? "given" : "absent", " and perm ", has_perm_ ? "given" : "absent");
  if (!has_g_idx) return false;
  check_int32_operand(op, "g_idx", *g_idx, device, a, {size_k});
  check_int32_operand(op, "perm", *perm, device, a, {size_k});
  check_index_range(op, "perm", *perm, size_k);
  check_permutation(op, "perm", *perm);
  return true;
}

// Conventions (vLLM): None and empty tensors both mean "absent" for b_zeros, g_idx, perm and
// b_bias. `a` may have a row stride larger than K (it must be unit-stride along K); every other
// tensor must be contiguous. size_m == 0 is legal (empty result); size_k, size_n must be > 0.
inline W4a16GemmArgs check_w4a16_gemm_args(
    const at::Tensor& a, const at::Tensor& b_q_weight, const at::Tensor& b_scales,
    const std::optional<at::Tensor>& b_zeros, const std::optional<at::Tensor>& g_idx,
    const std::optional<at::Tensor>& perm, const at::Tensor& workspace, int64_t num_bits,
    const c10::SymInt& size_m, int64_t size_n, int64_t size_k, bool is_k_full,
    const std::optional<at::Tensor>& b_bias, c10::DeviceType device) {
  const char* op = "w4a16_gemm";
  W4a16GemmArgs args{};
  check_marlin_gemm_operands(op, a, b_q_weight, b_scales, num_bits, size_m, size_n, size_k,
                             device);
  // The group count selects the kernel's scale path: a Meta kernel specializes on it.
  args.num_groups = b_scales.sym_size(0).guard_int(__FILE__, __LINE__);

  args.has_zp = check_marlin_zeros(op, b_zeros, b_scales, args.num_groups, size_n, device, a);

  args.has_act_order = check_act_order_operands(op, g_idx, perm, device, a, size_k);
  if (args.has_act_order) {
    // A full-K act-order layer has K / G rows per group (vLLM derives group_size from it).
    if (is_k_full)
      TORCH_CHECK(size_k % args.num_groups == 0, op, ": with act-order and is_k_full, the ",
                  "number of groups (b_scales.size(0) = ", args.num_groups,
                  ") must divide size_k = ", size_k);
    check_index_range(op, "g_idx", *g_idx, args.num_groups);
    check_sorted(op, "g_idx", *g_idx);
    args.group_size = 0;
  } else {
    TORCH_CHECK(size_k % args.num_groups == 0, op, ": the number of groups (b_scales.size(0) = ",
                args.num_groups, ") must divide size_k = ", size_k);
    args.group_size = size_k / args.num_groups;
  }

  // The workspace holds split-K arrival counters, one per output tile that splits (the GPU
  // kernels split only when every tile's counter fits, so any size >= 1 is legal; vLLM's
  // marlin_make_workspace_new, one int per SM, and the older N / 64 * 16 both work). It must be
  // zero on first use and is left zero. Host tensors are checked for it here; device memory
  // cannot be read without a sync.
  check_device(op, "workspace", workspace, device);
  check_same_device(op, "workspace", workspace, "a", a);
  check_dtype(op, "workspace", workspace, at::kInt);
  TORCH_CHECK(workspace.sym_numel() >= 1, op,
              ": workspace must have at least 1 element, got shape ", workspace.sym_sizes());
  check_contiguous(op, "workspace", workspace);
  if (workspace.device().type() == c10::DeviceType::CPU) {
    const int32_t* w = workspace.data_ptr<int32_t>();
    for (int64_t i = 0; i < workspace.numel(); ++i) {
      TORCH_CHECK(w[i] == 0, op, ": workspace must be all zeros (split-K arrival counters; make "
                  "it with torch.zeros and reuse it), got workspace[", i, "] = ", w[i]);
    }
  }

  args.has_bias = check_marlin_bias(op, b_bias, size_n, device, a);
  return args;
}

}  // namespace w4k
