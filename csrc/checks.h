// Argument checks shared by the CPU, CUDA and SIMT bindings and the Meta kernels (meta.cpp).
// Every failure names the op, the argument, what was expected and what was passed.
//
// Sizes are read as SymInts (sym_size, sym_sizes, sym_numel): the Meta kernels run these very
// checks under FakeTensorMode, where a dynamic dimension (torch.compile's batch size) has no
// concrete value and sizes() would throw. A comparison of SymInts returns a bool (guarding on
// the symbol); on real tensors every SymInt is a plain integer and costs nothing more.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/SymInt.h>
#include <c10/util/Exception.h>

#include <initializer_list>

namespace w4k {

inline void check_dtype(const char* op, const char* name, const at::Tensor& t,
                        at::ScalarType expected) {
  TORCH_CHECK(t.scalar_type() == expected, op, ": ", name, " must have dtype ", expected,
              ", got ", t.scalar_type());
}

// fp16 or bf16, the activation/scale types of every w4a16 op.
inline void check_half_dtype(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK(t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16, op, ": ", name,
              " must have dtype float16 or bfloat16, got ", t.scalar_type());
}

inline void check_dim(const char* op, const char* name, const at::Tensor& t, int64_t dim) {
  TORCH_CHECK(t.dim() == dim, op, ": ", name, " must be a ", dim, "-D tensor, got ", t.dim(),
              "-D with shape ", t.sym_sizes());
}

inline bool same_sizes(c10::SymIntArrayRef sizes, c10::SymIntArrayRef expected) {
  if (sizes.size() != expected.size()) return false;
  for (size_t i = 0; i < sizes.size(); ++i)
    if (sizes[i] != expected[i]) return false;
  return true;
}

inline void check_shape(const char* op, const char* name, const at::Tensor& t,
                        std::initializer_list<c10::SymInt> expected) {
  TORCH_CHECK(same_sizes(t.sym_sizes(), expected), op, ": ", name, " must have shape ",
              c10::SymIntArrayRef(expected), ", got ", t.sym_sizes());
}

inline void check_device(const char* op, const char* name, const at::Tensor& t,
                         c10::DeviceType expected) {
  TORCH_CHECK(t.device().type() == expected, op, ": ", name, " must be on a ", expected,
              " device, got ", t.device());
}

inline void check_same_device(const char* op, const char* name, const at::Tensor& t,
                              const char* ref_name, const at::Tensor& ref) {
  TORCH_CHECK(t.device() == ref.device(), op, ": ", name, " must be on the same device as ",
              ref_name, " (", ref.device(), "), got ", t.device());
}

inline void check_contiguous(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK(t.is_contiguous(), op, ": ", name, " must be contiguous (row-major), got strides ",
              t.sym_strides(), " for shape ", t.sym_sizes());
}

inline void check_multiple(const char* op, const char* name, const c10::SymInt& value,
                           int64_t multiple) {
  TORCH_CHECK(value % multiple == 0, op, ": ", name, " must be a multiple of ", multiple,
              ", got ", value);
}

// Dimensions are bounded so that every byte count derived from them (packed sizes, K * N / 2,
// 2 * N words) stays far inside int64 instead of wrapping around into a size some later check
// would accept; no tensor that large fits in memory anyway.
constexpr int64_t kMaxDim = (int64_t{1} << 31) - 1;
inline void check_dim_bound(const char* op, const char* name, const c10::SymInt& value,
                            int64_t bound = kMaxDim) {
  TORCH_CHECK(value <= bound, op, ": ", name, " must be <= ", bound, ", got ", value);
}

inline void check_positive(const char* op, const char* name, const c10::SymInt& value) {
  TORCH_CHECK(value > 0, op, ": ", name, " must be positive, got ", value);
}

inline void check_num_bits(const char* op, int64_t num_bits) {
  TORCH_CHECK(num_bits == 4, op, ": num_bits must be 4 (only 4-bit weights are supported), got ",
              num_bits);
}

}  // namespace w4k
