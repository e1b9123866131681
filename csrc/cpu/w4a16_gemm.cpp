// CPU binding of w4a16_gemm (vLLM gptq_marlin_gemm semantics): checks, the torch-side
// preparation (a -> fp32 with the act-order column permutation applied, scales/bias -> fp32),
// the parallel split over 64-column chunks, and the final rounding to a's dtype.
// The kernel itself is torch-free: cpu/w4a16_gemm_kernel.h.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <optional>

#include "cpu/w4a16_gemm_kernel.h"
#include "w4a16_checks.h"

namespace w4k {
namespace {

at::Tensor w4a16_gemm_cpu(const at::Tensor& a, const at::Tensor& b_q_weight,
                          const at::Tensor& b_scales, const std::optional<at::Tensor>& b_zeros,
                          const std::optional<at::Tensor>& g_idx,
                          const std::optional<at::Tensor>& perm, at::Tensor& workspace,
                          int64_t num_bits, int64_t size_m, int64_t size_n, int64_t size_k,
                          bool is_k_full, const std::optional<at::Tensor>& b_bias,
                          bool use_fp32_reduce) {
  // use_fp32_reduce: the CPU kernel never splits K, every sum is one fp32 accumulator.
  (void)use_fp32_reduce;
  const W4a16GemmArgs args =
      check_w4a16_gemm_args(a, b_q_weight, b_scales, b_zeros, g_idx, perm, workspace, num_bits,
                            size_m, size_n, size_k, is_k_full, b_bias, c10::DeviceType::CPU);
  if (size_m == 0) return at::empty({0, size_n}, a.options());

  // a_perm[:, r] = a[:, perm[r]] in fp32 (this also absorbs a row stride > K). The fp32 copy
  // gets a row stride of K + 16: with K a multiple of 1024, rows K floats apart would all map to
  // the same L1 sets, and the microkernel reads 6 rows at once.
  const int64_t lda = size_k + 16;
  at::Tensor a32 = at::empty({size_m, lda}, a.options().dtype(at::kFloat)).narrow(1, 0, size_k);
  if (args.has_act_order)
    a32.copy_(a.index_select(1, perm->to(at::kLong)));
  else
    a32.copy_(a);
  // bf16 activations also go to the kernel as bf16 (its vdpbf16ps path reads pairs of them).
  at::Tensor a_bf16;
  if (a.scalar_type() == at::kBFloat16)
    a_bf16 = args.has_act_order ? a.index_select(1, perm->to(at::kLong)).contiguous() : a;
  at::Tensor scales32 = b_scales.to(at::kFloat).contiguous();
  at::Tensor bias32;
  if (args.has_bias) bias32 = b_bias->to(at::kFloat).contiguous();
  at::Tensor c32 = at::empty({size_m, size_n}, a.options().dtype(at::kFloat));

  cpu::W4a16GemmProblem p{};
  p.a = a32.data_ptr<float>();
  p.lda = lda;
  if (a_bf16.defined()) {
    p.a_bf16 = reinterpret_cast<const uint16_t*>(a_bf16.data_ptr<at::BFloat16>());
    p.lda_bf16 = a_bf16.stride(0);
  }
  p.b_q_weight = b_q_weight.data_ptr<int32_t>();
  p.scales = scales32.data_ptr<float>();
  p.zeros = args.has_zp ? b_zeros->data_ptr<int32_t>() : nullptr;
  p.g_idx = args.has_act_order ? g_idx->data_ptr<int32_t>() : nullptr;
  p.bias = args.has_bias ? bias32.data_ptr<float>() : nullptr;
  p.c = c32.data_ptr<float>();
  p.size_m = size_m;
  p.size_n = size_n;
  p.size_k = size_k;
  p.num_groups = args.num_groups;
  p.group_size = args.group_size;
  p.weight_type =
      a.scalar_type() == at::kHalf ? cpu::HalfType::kFloat16 : cpu::HalfType::kBFloat16;

  // Work items = (chunk, row block). Every item dequantizes its chunk's weights once, so rows
  // are split only when there are too few chunks to keep every thread busy.
  const int64_t num_chunks = size_n / 64;
  const int64_t threads = at::get_num_threads();
  int64_t row_blocks = 1;
  if (num_chunks < 4 * threads)
    row_blocks = std::max<int64_t>(1, std::min((4 * threads + num_chunks - 1) / num_chunks,
                                               size_m / 48));
  const int64_t rows_per_block = (size_m + row_blocks - 1) / row_blocks;
  const cpu::CpuIsa isa = cpu::w4a16_gemm_cpu_isa();
  at::parallel_for(0, num_chunks * row_blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t ch = item % num_chunks, rb = item / num_chunks;
      const int64_t m0 = rb * rows_per_block, m1 = std::min(size_m, m0 + rows_per_block);
      // Consecutive chunks of one row block go to the same call (one scratch allocation).
      int64_t ch_end = ch + 1;
      while (item + 1 < end && (item + 1) % num_chunks == ch_end && (item + 1) / num_chunks == rb) {
        ++item;
        ++ch_end;
      }
      if (m0 < m1) cpu::w4a16_gemm_cpu_chunks(p, ch, ch_end, m0, m1, isa);
    }
  });
  // One rounding of the fp32 result (bias included) to a's dtype.
  return c32.to(a.scalar_type());
}

}  // namespace

TORCH_LIBRARY_IMPL(w4kernels, CPU, m) { m.impl("w4a16_gemm", &w4a16_gemm_cpu); }

}  // namespace w4k
