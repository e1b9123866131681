// Tensor -> raw-pointer preparation of w4a16_gemm shared by the CUDA and SIMT bindings (both
// call the planner and launcher of kernels/w4a16_gemm.cuh). Include after the kernel header.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <cstdlib>
#include <optional>

#include "aligned.h"
#include "dispatch_threshold.h"
#include "w4a16_checks.h"

namespace w4k {

// From this many rows of a on, a grouped layer (G > 1) is dequantized once into a dense weight
// and multiplied with at::mm (the dense path of kernels/w4a16_gemm.cuh): measured on an H100
// (bench_gpu_gemm.py, 2026-11-24), the tensor-core kernel won up to M = 128 and dequantize +
// cuBLAS from 256 on (1.03-1.19x at 256, 2.2-3x at 1024-4096), as for awq_gemm (vLLM's AWQ rule).
// Overridden per call by W4K_W4A16_DEQUANT_THRESHOLD, the variable of the CPU backend's own
// dense route (csrc/cpu/w4a16_gemm_dequant.h, other defaults): one name per op for "dequantize
// from this M on", whatever the device.
constexpr int64_t kW4a16DequantThresholdCuda = 256;

// W4K_W4A16_SPLIT_BLOCKS, read per call: a number replaces the planner's split-K choice ("0":
// no split; N > 0: N blocks share the tiles' stages, at most one per stage), where split-K may
// run at all (the tile counters fit the workspace). Unset or empty: the planner's model. For
// measuring partitions on a GPU (benchmarks/bench_gpu_gemm.py --split-blocks) and for tests; the
// emulator binding reads it too.
inline int64_t w4a16_split_blocks_override() {
  const char* v = std::getenv("W4K_W4A16_SPLIT_BLOCKS");
  if (v == nullptr || v[0] == '\0') return -1;
  char* end = nullptr;
  const long long n = std::strtoll(v, &end, 10);
  TORCH_CHECK(*end == '\0' && n >= 0, "W4K_W4A16_SPLIT_BLOCKS: expected a number >= 0, got '", v,
              "'");
  return n;
}

// Operands of launch_w4a16_gemm, each a tensor kept alive here (copies made for alignment).
struct W4a16LaunchTensors {
  W4a16Plan plan;
  at::Tensor a;           // rows 16-byte aligned (cp.async): row stride % 8 == 0
  at::Tensor b_q_weight;  // 16-byte aligned
  at::Tensor b_scales;    // 16-byte aligned (copied 16 bytes at a time)
  at::Tensor g_idx;       // act-order g_idx, or r / group_size for odd group sizes; aligned
  at::Tensor perm;        // act-order only; 16-byte aligned
  at::Tensor a_perm;      // [M, K] scratch for a[:, perm] (act-order)
  at::Tensor row_group_flags;  // act-order: the gather kernel's g_idx checks (plan)
  at::Tensor out;         // [M, N]
  at::Tensor c_tmp;       // fp32 split-K partial tiles (undefined without a split)
  at::Tensor w_dense;     // plan.dense: the dequantized weight [K, N] (Marlin row order)
  int* counters = nullptr;  // the workspace: one arrival counter per output tile (split-K)
};

// num_sms: the SM count the split-K plan fills (the device's; the emulator's W4K_SIMT_SMS).
template <typename T>
inline W4a16LaunchTensors w4a16_prepare(const at::Tensor& a, const at::Tensor& b_q_weight,
                                        const at::Tensor& b_scales,
                                        const std::optional<at::Tensor>& g_idx,
                                        const std::optional<at::Tensor>& perm,
                                        at::Tensor& workspace, const W4a16GemmArgs& args,
                                        int64_t size_m, int64_t size_n, int64_t size_k,
                                        int num_sms) {
  // The kernel indexes with 32-bit sizes (and 8 * 2N words per stage); size_m < 2^31 is
  // already a check of every backend (check_w4a16_gemm_args).
  TORCH_CHECK(size_k < (int64_t{1} << 30) && size_n <= (int64_t{1} << 26),
              "w4a16_gemm: the GPU kernel takes size_k < 2^30 and size_n <= 2^26, got size_n = ",
              size_n, ", size_k = ", size_k);
  W4a16LaunchTensors t;
  t.out = at::empty({size_m, size_n}, a.options());
  if (size_m == 0) return t;
  const cudaError_t err =
      w4a16_gemm_plan<T>(size_m, size_n, size_k, args.num_groups, args.has_act_order, args.has_zp,
                         num_sms, workspace.numel(),
                         dispatch_threshold("W4K_W4A16_DEQUANT_THRESHOLD", kW4a16DequantThresholdCuda),
                         &t.plan, w4a16_split_blocks_override());
  TORCH_CHECK(err == cudaSuccess, "w4a16_gemm: kernel configuration failed: ",
              cudaGetErrorString(err));
  const bool a_ok = a.stride(0) % 8 == 0 && reinterpret_cast<uintptr_t>(a.data_ptr()) % 16 == 0;
  t.a = a_ok ? a : aligned16(a.contiguous());  // copied if strided or misaligned
  t.b_q_weight = aligned16(b_q_weight);
  t.b_scales = aligned16(b_scales);
  if (args.has_act_order) {
    t.perm = aligned16(*perm);
    t.a_perm = at::empty({size_m, size_k}, a.options());
    if (t.plan.mode == w4a16::ScaleMode::kRow) t.g_idx = aligned16(*g_idx);
    if (t.plan.check_row_groups) {
      t.row_group_flags =
          at::empty({t.plan.row_group_flags_count(size_k)}, a.options().dtype(at::kInt));
    }
  } else if (t.plan.mode == w4a16::ScaleMode::kRow) {
    // A group size the per-stage scale path does not take (not 32, 64 or 128): the row-group
    // path with g_idx = r / group_size.
    t.g_idx = at::arange(size_k, a.options().dtype(at::kInt)).div_(args.group_size, "floor");
  }
  if (t.plan.dense) t.w_dense = at::empty({size_k, size_n}, a.options());
  if (t.plan.split_blocks > 0) {
    t.c_tmp = at::empty({t.plan.c_tmp_floats}, a.options().dtype(at::kFloat));
    t.counters = workspace.data_ptr<int32_t>();
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
  // The group paths copy zero-point rows 16 bytes at a time (cp.async). A copy made here may be
  // freed on return while the kernel still reads it: the caching allocator reuses it only in
  // stream order.
  const at::Tensor zeros = args.has_zp ? aligned16(*b_zeros) : at::Tensor();
  return launch_w4a16_gemm<T>(
      t.plan, ptr(t.a), t.a.stride(0),
      reinterpret_cast<const uint32_t*>(t.b_q_weight.data_ptr<int32_t>()), ptr(t.b_scales),
      args.has_zp ? reinterpret_cast<const uint32_t*>(zeros.data_ptr<int32_t>()) : nullptr,
      t.g_idx.defined() ? t.g_idx.data_ptr<int32_t>() : nullptr,
      t.perm.defined() ? t.perm.data_ptr<int32_t>() : nullptr,
      t.a_perm.defined() ? reinterpret_cast<T*>(t.a_perm.data_ptr<AtT>()) : nullptr,
      t.row_group_flags.defined() ? t.row_group_flags.data_ptr<int>() : nullptr,
      args.has_bias ? ptr(*b_bias) : nullptr, reinterpret_cast<T*>(t.out.data_ptr<AtT>()), size_m,
      size_n, size_k, args.num_groups, t.c_tmp.defined() ? t.c_tmp.data_ptr<float>() : nullptr,
      t.counters, t.w_dense.defined() ? reinterpret_cast<T*>(t.w_dense.data_ptr<AtT>()) : nullptr,
      stream);
}

// The two calls of a binding for a's dtype (fp16 or bf16), shared by the CUDA and SIMT bindings.
inline W4a16LaunchTensors w4a16_prepare_for_dtype(
    const at::Tensor& a, const at::Tensor& b_q_weight, const at::Tensor& b_scales,
    const std::optional<at::Tensor>& g_idx, const std::optional<at::Tensor>& perm,
    at::Tensor& workspace, const W4a16GemmArgs& args, int64_t size_m, int64_t size_n,
    int64_t size_k, int num_sms) {
  return a.scalar_type() == at::kHalf
             ? w4a16_prepare<half>(a, b_q_weight, b_scales, g_idx, perm, workspace, args, size_m,
                                   size_n, size_k, num_sms)
             : w4a16_prepare<__nv_bfloat16>(a, b_q_weight, b_scales, g_idx, perm, workspace, args,
                                            size_m, size_n, size_k, num_sms);
}

inline cudaError_t launch_w4a16_for_dtype(const at::Tensor& a, const W4a16LaunchTensors& t,
                                          const std::optional<at::Tensor>& b_zeros,
                                          const std::optional<at::Tensor>& b_bias,
                                          const W4a16GemmArgs& args, int64_t size_m,
                                          int64_t size_n, int64_t size_k, cudaStream_t stream) {
  return a.scalar_type() == at::kHalf
             ? launch_w4a16_typed<half, at::Half>(t, b_zeros, b_bias, args, size_m, size_n,
                                                  size_k, stream)
             : launch_w4a16_typed<__nv_bfloat16, at::BFloat16>(t, b_zeros, b_bias, args, size_m,
                                                              size_n, size_k, stream);
}

// After the launch: the dense path's matmul, a (a[:, perm] with act-order) times the weight the
// launch dequantized, plus the bias (one rounding of the fp32 sum, as the kernel path), on the
// current stream (the CUDA binding) or the CPU (the emulator's).
inline void w4a16_finish(const W4a16LaunchTensors& t, const std::optional<at::Tensor>& b_bias) {
  if (!t.plan.dense || t.out.size(0) == 0) return;
  const at::Tensor x = t.a_perm.defined() ? t.a_perm : t.a;
  at::Tensor out = t.out;
  if (b_bias.has_value()) {
    at::addmm_out(out, *b_bias, x, t.w_dense);
  } else {
    at::mm_out(out, x, t.w_dense);
  }
}

}  // namespace w4k
