// Tensor -> raw-pointer preparation of w4a16_gemm shared by the CUDA and SIMT bindings (both
// call the launcher of kernels/w4a16_gemm.cuh). Include after the kernel header.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>

#include "w4a16_checks.h"

namespace w4k {

// Operands of launch_w4a16_gemm, each a tensor kept alive here (copies made for alignment).
struct W4a16LaunchTensors {
  at::Tensor a;                  // rows 16-byte aligned (cp.async): row stride % 8 == 0
  at::Tensor b_q_weight;         // 16-byte aligned
  at::Tensor b_scales;           // 16-byte aligned (a lane loads its 8 scales of a group at once)
  at::Tensor g_idx, perm;        // undefined without act-order; g_idx 16-byte aligned
  at::Tensor a_perm;             // [M, K] scratch for a[:, perm] (act-order)
  at::Tensor out;                // [M, N]
  int64_t stages_per_split = 0;  // split-K slices of K (>= ceil(K / 64): no split)
  at::Tensor c_tmp;              // [M, N] fp32 split-K partial sums (undefined without a split)
  int* locks = nullptr;          // the workspace: one zeroed lock per (64 columns, block row)
};

inline at::Tensor w4a16_aligned16(const at::Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 ? t : t.clone();
}

// target_blocks: about how many blocks the launch should have (split-K fills up to it).
inline W4a16LaunchTensors w4a16_prepare(const at::Tensor& a, const at::Tensor& b_q_weight,
                                        const at::Tensor& b_scales,
                                        const std::optional<at::Tensor>& g_idx,
                                        const std::optional<at::Tensor>& perm,
                                        at::Tensor& workspace, const W4a16GemmArgs& args,
                                        int64_t size_m, int64_t size_n, int64_t size_k,
                                        int64_t target_blocks) {
  W4a16LaunchTensors t;
  t.out = at::empty({size_m, size_n}, a.options());
  if (size_m == 0) return t;
  const bool a_ok = a.stride(0) % 8 == 0 && reinterpret_cast<uintptr_t>(a.data_ptr()) % 16 == 0;
  t.a = a_ok ? a : w4a16_aligned16(a.contiguous());  // copied if strided or misaligned
  t.b_q_weight = w4a16_aligned16(b_q_weight);
  t.b_scales = w4a16_aligned16(b_scales);
  if (args.has_act_order) {
    t.g_idx = w4a16_aligned16(*g_idx);
    t.perm = *perm;
    t.a_perm = at::empty({size_m, size_k}, a.options());
  }
  t.stages_per_split = w4a16_gemm_stages_per_split(size_m, size_n, size_k, target_blocks);
  if (t.stages_per_split * 64 < size_k) {
    t.c_tmp = at::empty({size_m, size_n}, a.options().dtype(at::kFloat));
    t.locks = workspace.data_ptr<int32_t>();
  }
  return t;
}

// The typed launcher call on prepared tensors (T: the kernel's half type, AtT: torch's).
template <typename T, typename AtT>
cudaError_t launch_w4a16_typed(const W4a16LaunchTensors& t,
                               const std::optional<at::Tensor>& b_zeros,
                               const std::optional<at::Tensor>& b_bias, const W4a16GemmArgs& args,
                               int64_t size_m, int64_t size_n, int64_t size_k,
                               cudaStream_t stream) {
  const auto ptr = [](const at::Tensor& x) {
    return reinterpret_cast<const T*>(x.data_ptr<AtT>());
  };
  return launch_w4a16_gemm<T>(
      ptr(t.a), t.a.stride(0), reinterpret_cast<const uint32_t*>(t.b_q_weight.data_ptr<int32_t>()),
      ptr(t.b_scales),
      args.has_zp ? reinterpret_cast<const uint32_t*>(b_zeros->data_ptr<int32_t>()) : nullptr,
      args.has_act_order ? t.g_idx.data_ptr<int32_t>() : nullptr,
      args.has_act_order ? t.perm.data_ptr<int32_t>() : nullptr,
      args.has_act_order ? reinterpret_cast<T*>(t.a_perm.data_ptr<AtT>()) : nullptr,
      args.has_bias ? ptr(*b_bias) : nullptr, reinterpret_cast<T*>(t.out.data_ptr<AtT>()), size_m,
      size_n, size_k, args.num_groups, args.group_size, t.stages_per_split,
      t.c_tmp.defined() ? t.c_tmp.data_ptr<float>() : nullptr, t.locks, stream);
}

}  // namespace w4k
