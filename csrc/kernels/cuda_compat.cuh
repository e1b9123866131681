// The one platform header of every kernel in csrc/kernels/.
//
// nvcc (W4K_SIMT undefined): the CUDA runtime and fp16/bf16 headers.
// g++ -DW4K_SIMT=1: the SIMT emulator (csrc/simt/simt.h), which provides the same names on
// the CPU (keywords, threadIdx & co, half/bf16, vector types, warp intrinsics, atomics, the
// runtime calls launchers use).
//
// Both sides provide:
//   W4K_LAUNCH(kernel, grid, block, smem_bytes, stream, args...)
//       kernel<<<grid, block, smem_bytes, stream>>>(args...) on nvcc; on the emulator the grid
//       runs synchronously on the CPU. `kernel` must be one macro argument: for a template
//       instance with commas take a pointer first (auto* kernel = &my_kernel<a, b>;).
//       Launchers return cudaGetLastError() afterwards on both sides.
//   W4K_EXTERN_SHARED(type, name)
//       dynamic shared memory, `extern __shared__ type name[]` on nvcc; a `type* const name`
//       on the emulator. Use it at the top of the kernel body.
#pragma once

#if W4K_SIMT

#include "simt/simt.h"

#else  // nvcc

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#define W4K_LAUNCH(kernel, grid, block, smem_bytes, stream, ...) \
  kernel<<<(grid), (block), (smem_bytes), (stream)>>>(__VA_ARGS__)
#define W4K_EXTERN_SHARED(type, name) extern __shared__ __align__(16) type name[]

#endif
