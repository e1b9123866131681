// Per-dtype pieces of the fp16/bf16 tensor-core GEMMs (w4a16_gemm, awq_gemm): the
// mma.m16n8k16 flavour with fp32 accumulators, conversions, the int4 -> float magic constant,
// and 32-bit <-> pair reinterpretation. Torch-free, nvcc and SIMT emulator alike.
#pragma once

#include <cstdint>

#include "kernels/cuda_compat.cuh"
#include "kernels/ptx.cuh"

namespace w4k {
namespace mma {

template <typename T>
struct Dtype;

template <>
struct Dtype<half> {
  using T2 = half2;
  // half2(1024, 1024): OR-ing a nibble into mantissa bits 0..3 gives 1024 + q exactly.
  static constexpr uint32_t kMagic = 0x64006400u;
  __device__ __forceinline__ static void mma(const uint32_t a[4], const uint32_t b[2], float c[4]) {
    ptx::mma_m16n8k16_f16f32(a, b, c);
  }
  __device__ __forceinline__ static T2 pack(float lo, float hi) {
    return __floats2half2_rn(lo, hi);
  }
  __device__ __forceinline__ static float to_float(half x) { return __half2float(x); }
  __device__ __forceinline__ static half from_float(float x) { return __float2half_rn(x); }
};

template <>
struct Dtype<__nv_bfloat16> {
  using T2 = __nv_bfloat162;
  // bfloat162(128, 128): 7 mantissa bits, so 128 + q (q < 16) is exact too.
  static constexpr uint32_t kMagic = 0x43004300u;
  __device__ __forceinline__ static void mma(const uint32_t a[4], const uint32_t b[2], float c[4]) {
    ptx::mma_m16n8k16_bf16f32(a, b, c);
  }
  __device__ __forceinline__ static T2 pack(float lo, float hi) {
    return __floats2bfloat162_rn(lo, hi);
  }
  __device__ __forceinline__ static float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
  __device__ __forceinline__ static __nv_bfloat16 from_float(float x) {
    return __float2bfloat16_rn(x);
  }
};

template <typename T2>
__device__ __forceinline__ T2 bits_as(uint32_t u) {
  return *reinterpret_cast<const T2*>(&u);
}
template <typename T2>
__device__ __forceinline__ uint32_t as_bits(T2 v) {
  return *reinterpret_cast<const uint32_t*>(&v);
}

}  // namespace mma
}  // namespace w4k
