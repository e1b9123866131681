// Helpers shared by the emulator bindings (ops_simt.cpp, w4a16_gemm_simt.cpp): compiled with
// -DW4K_SIMT=1 only, after the kernel headers (which bring in the emulator).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

#include "kernels/cuda_compat.cuh"

namespace w4k {
namespace simt_binding {

// The emulator has no streams: every launch runs to completion before returning.
constexpr cudaStream_t kNoStream = nullptr;

// cp.async and the 16-byte vector accesses need 16-byte aligned global pointers, exactly as on
// the GPU (the emulator checks): a misaligned view is copied to a fresh allocation first.
inline at::Tensor aligned16(const at::Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 ? t : t.clone();
}

// Runs one launcher; an emulator-detected fault (simt::Error names block, thread, warp, lane)
// or an error status becomes a RuntimeError naming the op.
template <typename Launch>
void run_simt(const char* op, Launch&& launch) {
  cudaError_t err;
  try {
    err = launch();
  } catch (const simt::Error& e) {
    TORCH_CHECK(false, op, ": SIMT emulator fault: ", e.what());
  }
  TORCH_CHECK(err == cudaSuccess, op, ": SIMT kernel launch failed: ", cudaGetErrorString(err));
}

}  // namespace simt_binding
}  // namespace w4k
