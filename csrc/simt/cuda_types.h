// CUDA vocabulary types for the SIMT emulator, in the global namespace like CUDA's own headers:
// dim3/uint3, the vector types, cudaError_t and friends, and the fp16/bf16 intrinsics.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "simt/half.h"

struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return uint3{x, y, z}; }
};

// Vector types with CUDA's sizes and alignments (int4/uint4/float4 are 16-byte aligned, which
// 16-byte shared/global copies rely on).
#define W4K_SIMT_VEC2(T, name, al) \
  struct alignas(al) name {        \
    T x, y;                        \
  };                               \
  inline name make_##name(T x, T y) { return name{x, y}; }
#define W4K_SIMT_VEC4(T, name, al) \
  struct alignas(al) name {        \
    T x, y, z, w;                  \
  };                               \
  inline name make_##name(T x, T y, T z, T w) { return name{x, y, z, w}; }
W4K_SIMT_VEC2(int, int2, 8)
W4K_SIMT_VEC2(unsigned, uint2, 8)
W4K_SIMT_VEC2(float, float2, 8)
W4K_SIMT_VEC2(short, short2, 4)
W4K_SIMT_VEC2(unsigned short, ushort2, 4)
W4K_SIMT_VEC4(int, int4, 16)
W4K_SIMT_VEC4(unsigned, uint4, 16)
W4K_SIMT_VEC4(float, float4, 16)
W4K_SIMT_VEC4(signed char, char4, 4)
W4K_SIMT_VEC4(unsigned char, uchar4, 4)
#undef W4K_SIMT_VEC2
#undef W4K_SIMT_VEC4
inline uint3 make_uint3(unsigned x, unsigned y, unsigned z) { return uint3{x, y, z}; }

// ---- runtime API subset ----
enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorLaunchFailure = 719,
};
typedef cudaError_t cudaError;
typedef struct CUstream_st* cudaStream_t;
enum cudaFuncAttribute {
  cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
};
enum cudaDeviceAttr {
  cudaDevAttrMaxThreadsPerBlock = 1,
  cudaDevAttrMaxSharedMemoryPerBlock = 8,
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrComputeCapabilityMajor = 75,
  cudaDevAttrComputeCapabilityMinor = 76,
  cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
};
enum cudaMemcpyKind {
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4
};

// ---- fp16 / bf16 (cuda_fp16.h / cuda_bf16.h names) ----
using ::simt::__half;
using ::simt::__half2;
using ::simt::__nv_bfloat16;
using ::simt::__nv_bfloat162;
typedef __half half;
typedef __half2 half2;
typedef __nv_bfloat16 nv_bfloat16;
typedef __nv_bfloat162 nv_bfloat162;

inline __half __float2half(float f) { return __half(f); }
inline __half __float2half_rn(float f) { return __half(f); }
inline float __half2float(__half h) { return float(h); }
inline __half __int2half_rn(int i) { return simt::round_to<__half>(double(i)); }
inline __half __uint2half_rn(unsigned i) { return simt::round_to<__half>(double(i)); }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline short __half_as_short(__half h) { return short(h.__x); }
inline __half __ushort_as_half(unsigned short u) { return simt::make_half_bits(u); }
inline __half __short_as_half(short u) { return simt::make_half_bits(uint16_t(u)); }
inline __half2 make_half2(__half x, __half y) { return __half2{x, y}; }
inline __half2 __halves2half2(__half lo, __half hi) { return __half2{lo, hi}; }
inline __half2 __half2half2(__half h) { return __half2{h, h}; }
inline __half2 __float2half2_rn(float f) { return __half2{__half(f), __half(f)}; }
inline __half2 __floats2half2_rn(float lo, float hi) { return __half2{__half(lo), __half(hi)}; }
inline __half2 __float22half2_rn(float2 f) { return __half2{__half(f.x), __half(f.y)}; }
inline float2 __half22float2(__half2 h) { return float2{float(h.x), float(h.y)}; }
inline __half2 __low2half2(__half2 h) { return __half2{h.x, h.x}; }
inline __half2 __high2half2(__half2 h) { return __half2{h.y, h.y}; }
inline __half __low2half(__half2 h) { return h.x; }
inline __half __high2half(__half2 h) { return h.y; }
inline float __low2float(__half2 h) { return float(h.x); }
inline float __high2float(__half2 h) { return float(h.y); }
inline __half2 __lows2half2(__half2 a, __half2 b) { return __half2{a.x, b.x}; }
inline __half2 __highs2half2(__half2 a, __half2 b) { return __half2{a.y, b.y}; }

inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline float __bfloat162float(__nv_bfloat16 h) { return float(h); }
inline __nv_bfloat16 __int2bfloat16_rn(int i) { return simt::round_to<__nv_bfloat16>(double(i)); }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { return simt::make_bf16_bits(u); }
inline __nv_bfloat162 make_bfloat162(__nv_bfloat16 x, __nv_bfloat16 y) {
  return __nv_bfloat162{x, y};
}
inline __nv_bfloat162 __halves2bfloat162(__nv_bfloat16 lo, __nv_bfloat16 hi) {
  return __nv_bfloat162{lo, hi};
}
inline __nv_bfloat162 __bfloat162bfloat162(__nv_bfloat16 h) { return __nv_bfloat162{h, h}; }
inline __nv_bfloat162 __float2bfloat162_rn(float f) {
  return __nv_bfloat162{__nv_bfloat16(f), __nv_bfloat16(f)};
}
inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi) {
  return __nv_bfloat162{__nv_bfloat16(lo), __nv_bfloat16(hi)};
}
inline __nv_bfloat162 __float22bfloat162_rn(float2 f) {
  return __nv_bfloat162{__nv_bfloat16(f.x), __nv_bfloat16(f.y)};
}
inline float2 __bfloat1622float2(__nv_bfloat162 h) { return float2{float(h.x), float(h.y)}; }
inline __nv_bfloat162 __low2bfloat162(__nv_bfloat162 h) { return __nv_bfloat162{h.x, h.x}; }
inline __nv_bfloat162 __high2bfloat162(__nv_bfloat162 h) { return __nv_bfloat162{h.y, h.y}; }
inline __nv_bfloat16 __low2bfloat16(__nv_bfloat162 h) { return h.x; }
inline __nv_bfloat16 __high2bfloat16(__nv_bfloat162 h) { return h.y; }
inline float __low2float(__nv_bfloat162 h) { return float(h.x); }
inline float __high2float(__nv_bfloat162 h) { return float(h.y); }
inline __nv_bfloat162 __lows2bfloat162(__nv_bfloat162 a, __nv_bfloat162 b) {
  return __nv_bfloat162{a.x, b.x};
}
inline __nv_bfloat162 __highs2bfloat162(__nv_bfloat162 a, __nv_bfloat162 b) {
  return __nv_bfloat162{a.y, b.y};
}

// Arithmetic: one correctly rounded operation per element (see simt/half.h).
#define W4K_SIMT_HALF_OPS(S, P)                                                            \
  inline S __hadd(S a, S b) { return simt::op_add(a, b); }                                 \
  inline S __hsub(S a, S b) { return simt::op_sub(a, b); }                                 \
  inline S __hmul(S a, S b) { return simt::op_mul(a, b); }                                 \
  inline S __hfma(S a, S b, S c) { return simt::op_fma(a, b, c); }                         \
  inline S __hneg(S a) { return simt::op_neg(a); }                                         \
  inline P __hadd2(P a, P b) { return P{simt::op_add(a.x, b.x), simt::op_add(a.y, b.y)}; } \
  inline P __hsub2(P a, P b) { return P{simt::op_sub(a.x, b.x), simt::op_sub(a.y, b.y)}; } \
  inline P __hmul2(P a, P b) { return P{simt::op_mul(a.x, b.x), simt::op_mul(a.y, b.y)}; } \
  inline P __hfma2(P a, P b, P c) {                                                        \
    return P{simt::op_fma(a.x, b.x, c.x), simt::op_fma(a.y, b.y, c.y)};                    \
  }                                                                                        \
  inline P __hneg2(P a) { return P{simt::op_neg(a.x), simt::op_neg(a.y)}; }                \
  inline P operator+(P a, P b) { return __hadd2(a, b); }                                   \
  inline P operator-(P a, P b) { return __hsub2(a, b); }                                   \
  inline P operator*(P a, P b) { return __hmul2(a, b); }
W4K_SIMT_HALF_OPS(__half, __half2)
W4K_SIMT_HALF_OPS(__nv_bfloat16, __nv_bfloat162)
#undef W4K_SIMT_HALF_OPS

// ---- bit reinterpretation and integer intrinsics ----
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline int __float_as_int(float f) { return int(__float_as_uint(f)); }
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline float __int_as_float(int i) { return __uint_as_float(unsigned(i)); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(unsigned(x)); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline unsigned __brev(unsigned x) {
  unsigned r = 0;
  for (int i = 0; i < 32; ++i) r |= ((x >> i) & 1u) << (31 - i);
  return r;
}
inline float __fdividef(float a, float b) { return a / b; }

// CUDA's global min/max overloads (device code calls them unqualified).
template <class A, class B,
          class = std::enable_if_t<std::is_arithmetic_v<A> && std::is_arithmetic_v<B>>>
inline std::common_type_t<A, B> min(A a, B b) {
  return b < a ? std::common_type_t<A, B>(b) : std::common_type_t<A, B>(a);
}
template <class A, class B,
          class = std::enable_if_t<std::is_arithmetic_v<A> && std::is_arithmetic_v<B>>>
inline std::common_type_t<A, B> max(A a, B b) {
  return a < b ? std::common_type_t<A, B>(b) : std::common_type_t<A, B>(a);
}
