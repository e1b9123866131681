// Argument checks of the Marlin repack ops, shared by the CPU, CUDA and SIMT bindings and the
// Meta kernels (meta_kernels.h). The value checks (index ranges, permutation, sortedness) read
// host memory only: they run in the CPU and SIMT bindings, never in a Meta kernel (no data) and
// not on CUDA tensors (a device sync per call); there they are the caller's contract.
#pragma once

#include <optional>
#include <vector>

#include "checks.h"

namespace w4k {

// True when `perm` asks for act-order (vLLM passes an empty tensor for "no perm").
inline bool has_perm(const std::optional<at::Tensor>& perm) {
  return perm.has_value() && perm->sym_numel() > 0;
}

// Every value of an int32 index tensor lies in [0, bound). Host tensors only: on a GPU this
// would cost a device sync, so GPU callers check what they can without reading the data.
inline void check_index_range(const char* op, const char* name, const at::Tensor& idx,
                              int64_t bound) {
  if (idx.device().type() != c10::DeviceType::CPU) return;
  const int32_t* p = idx.data_ptr<int32_t>();
  for (int64_t i = 0; i < idx.numel(); ++i) {
    TORCH_CHECK(p[i] >= 0 && p[i] < bound, op, ": ", name, " values must lie in [0, ", bound,
                "), got ", name, "[", i, "] = ", p[i]);
  }
}

// perm is a permutation of [0, K): in range (check_index_range first) and no value twice. A
// repeated index would silently drop an activation column (e.g. an all-zero perm). Host only.
inline void check_permutation(const char* op, const char* name, const at::Tensor& perm) {
  if (perm.device().type() != c10::DeviceType::CPU) return;
  const int32_t* p = perm.data_ptr<int32_t>();
  std::vector<int64_t> first(perm.numel(), -1);  // where each value was first seen
  for (int64_t i = 0; i < perm.numel(); ++i) {
    TORCH_CHECK(first[p[i]] < 0, op, ": ", name, " must be a permutation of [0, ", perm.numel(),
                "), got ", name, "[", first[p[i]], "] = ", name, "[", i, "] = ", p[i]);
    first[p[i]] = i;
  }
}

// g_idx in the Marlin row order is sorted (vLLM's marlin_sort_g_idx): the checkpoint's
// unsorted g_idx passed as is gives wrong groups for every row. Host only.
inline void check_sorted(const char* op, const char* name, const at::Tensor& idx) {
  if (idx.device().type() != c10::DeviceType::CPU) return;
  const int32_t* p = idx.data_ptr<int32_t>();
  for (int64_t i = 1; i < idx.numel(); ++i) {
    TORCH_CHECK(p[i - 1] <= p[i], op, ": ", name, " must be sorted (the checkpoint's g_idx "
                "indexed by perm, as vLLM's marlin_sort_g_idx returns), got ", name, "[", i - 1,
                "] = ", p[i - 1], " > ", name, "[", i, "] = ", p[i]);
  }
}

inline void check_marlin_sizes(const char* op, int64_t size_k, int64_t size_n,
                               int64_t num_bits) {
  check_num_bits(op, num_bits);
  check_positive(op, "size_k", size_k);
  check_positive(op, "size_n", size_n);
  check_dim_bound(op, "size_k", size_k);
  check_dim_bound(op, "size_n", size_n);
  check_multiple(op, "size_k", size_k, 16);  // one Marlin tile is 16 rows of K
  check_multiple(op, "size_n", size_n, 64);  // one Marlin chunk is 64 columns of N
}

inline void check_marlin_repack_args(const at::Tensor& b_q_weight,
                                     const std::optional<at::Tensor>& perm, int64_t size_k,
                                     int64_t size_n, int64_t num_bits, c10::DeviceType device) {
  const char* op = "marlin_repack";
  check_marlin_sizes(op, size_k, size_n, num_bits);
  check_device(op, "b_q_weight", b_q_weight, device);
  check_dtype(op, "b_q_weight", b_q_weight, at::kInt);
  check_dim(op, "b_q_weight", b_q_weight, 2);
  check_shape(op, "b_q_weight", b_q_weight, {size_k / 8, size_n});
  check_contiguous(op, "b_q_weight", b_q_weight);
  if (has_perm(perm)) {
    check_same_device(op, "perm", *perm, "b_q_weight", b_q_weight);
    check_dtype(op, "perm", *perm, at::kInt);
    check_shape(op, "perm", *perm, {size_k});
    check_contiguous(op, "perm", *perm);
    check_index_range(op, "perm", *perm, size_k);
    check_permutation(op, "perm", *perm);
  }
}

inline void check_awq_marlin_repack_args(const at::Tensor& b_q_weight, int64_t size_k,
                                         int64_t size_n, int64_t num_bits,
                                         c10::DeviceType device) {
  const char* op = "awq_marlin_repack";
  check_marlin_sizes(op, size_k, size_n, num_bits);
  check_device(op, "b_q_weight", b_q_weight, device);
  check_dtype(op, "b_q_weight", b_q_weight, at::kInt);
  check_dim(op, "b_q_weight", b_q_weight, 2);
  check_shape(op, "b_q_weight", b_q_weight, {size_k, size_n / 8});
  check_contiguous(op, "b_q_weight", b_q_weight);
}

}  // namespace w4k
