// Helpers shared by the emulator bindings (ops_simt.cpp, w4a16_gemm_simt.cpp): compiled with
// -DW4K_SIMT=1 only, after the kernel headers (which bring in the emulator).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

#include "aligned.h"
#include "kernels/cuda_compat.cuh"

namespace w4k {
namespace simt_binding {

// The emulator has no streams: every launch runs to completion before returning.
constexpr cudaStream_t kNoStream = nullptr;

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
