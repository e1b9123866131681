// Argument checks of the int8-activation ops w4a8_gemm (Marlin format) and awq_gemm_a8 (AutoAWQ
// format), shared by the CPU binding (cpu/w4a8_gemm.cpp) and the Meta kernels (meta.cpp). They
// follow w4a16_gemm's and awq_gemm's checks and add what the int8 mode needs: a group size that
// is a multiple of 16 (activation blocks of whole 16-row tiles), act-order only with is_k_full
// and g_idx in group order, and (AWQ) N a multiple of 64 (the kernel's 64-column panels).
#pragma once

#include <optional>

#include "awq_checks.h"
#include "w4a16_checks.h"

namespace w4k {

struct W4a8GemmArgs {
  bool has_act_order;
  bool has_zp;
  bool has_bias;
  int64_t num_groups;
  int64_t group_size;  // rows of K per weight group (K for per-channel)
};

inline void check_a8_group_size(const char* op, int64_t group_size, int64_t size_k,
                                int64_t num_groups) {
  TORCH_CHECK(group_size % 16 == 0, op, ": the group size K / G = ", size_k, " / ", num_groups,
              " = ", group_size, " must be a multiple of 16 (the int8 activation blocks are ",
              "whole 16-row tiles of one weight group)");
}

inline W4a8GemmArgs check_w4a8_gemm_args(
    const at::Tensor& a, const at::Tensor& b_q_weight, const at::Tensor& b_scales,
    const std::optional<at::Tensor>& b_zeros, const std::optional<at::Tensor>& g_idx,
    const std::optional<at::Tensor>& perm, int64_t num_bits, const c10::SymInt& size_m,
    int64_t size_n, int64_t size_k, bool is_k_full, const std::optional<at::Tensor>& b_bias,
    c10::DeviceType device) {
  const char* op = "w4a8_gemm";
  W4a8GemmArgs args{};
  check_marlin_gemm_operands(op, a, b_q_weight, b_scales, num_bits, size_m, size_n, size_k,
                             device);
  args.num_groups = b_scales.sym_size(0).guard_int(__FILE__, __LINE__);
  TORCH_CHECK(size_k % args.num_groups == 0, op, ": the number of groups (b_scales.size(0) = ",
              args.num_groups, ") must divide size_k = ", size_k);
  args.group_size = size_k / args.num_groups;
  check_a8_group_size(op, args.group_size, size_k, args.num_groups);

  args.has_zp = check_marlin_zeros(op, b_zeros, b_scales, args.num_groups, size_n, device, a);

  args.has_act_order = check_act_order_operands(op, g_idx, perm, device, a, size_k);
  if (args.has_act_order) {
    TORCH_CHECK(is_k_full, op, ": act-order (g_idx, perm) needs is_k_full=True in the int8 "
                "mode (a row-parallel shard's groups are not whole blocks of its rows), got "
                "is_k_full=False");
    // The int8 blocks are consecutive Marlin rows of one group: g_idx (sorted, in Marlin row
    // order) must be r / group_size, which every full GPTQ desc_act layer gives.
    if (g_idx->device().type() == c10::DeviceType::CPU) {
      const int32_t* gi = g_idx->data_ptr<int32_t>();
      for (int64_t r = 0; r < size_k; ++r)
        TORCH_CHECK(gi[r] == r / args.group_size, op, ": g_idx values must lie in group order ",
                    "for the int8 mode (g_idx[r] == r / (K / G) = r / ", args.group_size,
                    ", the sorted g_idx of a full GPTQ act-order layer), got g_idx[", r, "] = ",
                    gi[r]);
    }
  }

  args.has_bias = check_marlin_bias(op, b_bias, size_n, device, a);
  return args;
}

inline W4a8GemmArgs check_awq_gemm_a8_args(const at::Tensor& x, const at::Tensor& qweight,
                                           const at::Tensor& scales, const at::Tensor& qzeros,
                                           c10::DeviceType device) {
  const char* op = "awq_gemm_a8";
  check_awq_x_and_weight_args(op, x, qweight, scales, qzeros, device);
  const int64_t size_k = qweight.sym_size(0).guard_int(__FILE__, __LINE__);
  const int64_t size_n = 8 * qweight.sym_size(1).guard_int(__FILE__, __LINE__);
  check_dim_bound(op, "qweight.size(0)", size_k);
  TORCH_CHECK(size_n % 64 == 0, op, ": qweight must have N = 8 * qweight.size(1) a multiple of ",
              "64 in the int8 mode (64-column panels), got N = ", size_n);
  W4a8GemmArgs args{};
  args.num_groups = scales.sym_size(0).guard_int(__FILE__, __LINE__);
  args.group_size = size_k / args.num_groups;
  check_a8_group_size(op, args.group_size, size_k, args.num_groups);
  args.has_zp = true;
  return args;
}

}  // namespace w4k
