// 16-byte alignment of the tensors handed to the GPU kernels (and to the same kernels under the
// SIMT emulator, which checks it as the GPU would): cp.async copies and the kernels' vector
// loads and stores move 16 bytes at a time, so a view whose data pointer breaks that alignment
// (a storage offset, a slice) is copied to a fresh allocation first.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace w4k {

inline bool is_aligned16(const at::Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

// t itself when its data pointer is 16-byte aligned, else a contiguous copy (which is).
inline at::Tensor aligned16(const at::Tensor& t) { return is_aligned16(t) ? t : t.clone(); }

}  // namespace w4k
