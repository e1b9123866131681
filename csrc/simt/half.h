// fp16 / bf16 for the SIMT emulator: storage types with the CUDA names and correctly rounded
// arithmetic (round to nearest even, one rounding per operation, as the GPU's HFMA2/HMUL2/...).
//
// How one rounding is guaranteed: the operands are converted to double exactly; a product of two
// fp16 (11-bit significands) or bf16 (8-bit) values has at most 22 significant bits and an
// exponent far inside double's range, so it is exact. The sum/difference/fma's addition is done
// with TwoSum and rounded to odd in double (s = fl(x + y); if the discarded part e != 0 and s is
// even, step s one ulp towards e). Rounding to odd at 53 bits and then to nearest even at
// p <= 51 bits equals one direct rounding of the exact value (Boldo & Melquiond, "Emulation of
// FMA and correctly rounded sums: proved algorithms using rounding to odd"). For fp16 plain
// double would already do (the exact a*b+c fits in 53 bits whenever the result is finite), but
// bf16's exponent range lets a*b be a bf16 midpoint while c is 2^-100, where a plain double sum
// would round twice.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace simt {

// double -> binary format with `mant_bits` stored fraction bits and `exp_bits` exponent bits,
// round to nearest even, overflow to inf, NaN -> canonical 0x7FFF (what CUDA's conversions
// return). Works directly on the double's bits so there is exactly one rounding.
template <int exp_bits, int mant_bits>
inline uint16_t round_double_to(double x) {
  uint64_t u;
  std::memcpy(&u, &x, 8);
  const uint16_t sign = uint16_t((u >> 63) << 15);
  const int dexp = int((u >> 52) & 0x7FF);
  uint64_t dmant = u & ((uint64_t(1) << 52) - 1);
  constexpr int bias = (1 << (exp_bits - 1)) - 1;
  constexpr uint16_t inf = uint16_t(((1 << exp_bits) - 1) << mant_bits);
  if (dexp == 0x7FF) return dmant ? uint16_t(0x7FFF) : uint16_t(sign | inf);
  if (dexp == 0 && dmant == 0) return sign;  // +-0 (double subnormals are far below any target)
  // value = 1.dmant * 2^e (double subnormals: tiny, they round to zero below)
  const int e = dexp - 1023;
  uint64_t sig = dmant | (uint64_t(1) << 52);  // 53-bit significand
  if (dexp == 0) return sign;
  int target_e = e + bias;  // biased exponent in the target format
  int shift;                // how many low bits of sig are dropped
  if (target_e >= 1) {
    shift = 52 - mant_bits;
  } else {
    // subnormal in the target: the significand is aligned to the fixed exponent 1 - bias
    shift = 52 - mant_bits + (1 - target_e);
    target_e = 0;
    if (shift > 60) return sign;  // < half of the smallest subnormal: rounds to 0
  }
  uint64_t kept = sig >> shift;
  const uint64_t rem = sig & ((uint64_t(1) << shift) - 1);
  const uint64_t halfway = uint64_t(1) << (shift - 1);
  if (rem > halfway || (rem == halfway && (kept & 1))) kept += 1;
  // Assemble: for normals, kept has the implicit bit at position mant_bits; a carry out of the
  // significand bumps the exponent, which the addition below does by itself.
  uint32_t bits;
  if (target_e == 0) {
    bits = uint32_t(kept);  // may carry into the smallest normal, which is the right encoding
  } else {
    bits = (uint32_t(target_e - 1) << mant_bits) + uint32_t(kept);
  }
  if (bits >= inf) return uint16_t(sign | inf);
  return uint16_t(sign | bits);
}

template <int exp_bits, int mant_bits>
inline double widen_to_double(uint16_t h) {
  constexpr int bias = (1 << (exp_bits - 1)) - 1;
  const bool neg = h >> 15;
  const int e = (h >> mant_bits) & ((1 << exp_bits) - 1);
  const int m = h & ((1 << mant_bits) - 1);
  double v;
  if (e == (1 << exp_bits) - 1) {
    v = m ? std::nan("") : INFINITY;
  } else if (e == 0) {
    v = std::ldexp(double(m), 1 - bias - mant_bits);
  } else {
    v = std::ldexp(double(m | (1 << mant_bits)), e - bias - mant_bits);
  }
  return neg ? -v : v;
}

inline uint16_t double_to_half_bits(double x) { return round_double_to<5, 10>(x); }
inline uint16_t double_to_bf16_bits(double x) { return round_double_to<8, 7>(x); }
inline double half_bits_to_double(uint16_t h) { return widen_to_double<5, 10>(h); }
inline double bf16_bits_to_double(uint16_t h) { return widen_to_double<8, 7>(h); }

// Exact x + y rounded to odd in double (see the file comment). Inputs are finite or not; on
// inf/nan/overflow the plain sum is already the right answer for the later rounding.
inline double add_round_to_odd(double x, double y) {
  double s = x + y;
  if (!std::isfinite(s)) return s;
  double bp = s - x;  // TwoSum (Knuth): e = (x - (s - bp)) + (y - bp) exactly
  double e = (x - (s - bp)) + (y - bp);
  if (e == 0) return s;
  uint64_t u;
  std::memcpy(&u, &s, 8);
  if (u & 1) return s;  // already odd
  return std::nextafter(s, e > 0 ? INFINITY : -INFINITY);
}

// Storage types. Layout-compatible with CUDA's (2 bytes; pairs are 4 bytes with .x in the low
// half), so reinterpret_cast between uint32_t and half2 works as in kernels.
struct __half {
  uint16_t __x;
  __half() = default;
  __half(float f) : __x(double_to_half_bits(f)) {}
  __half(double f) : __x(double_to_half_bits(f)) {}
  __half(int i) : __x(double_to_half_bits(double(i))) {}
  __half(unsigned i) : __x(double_to_half_bits(double(i))) {}
  __half(long long i) : __x(double_to_half_bits(double(i))) {}
  operator float() const { return float(half_bits_to_double(__x)); }
};
struct __half2 {
  __half x, y;
};
struct __nv_bfloat16 {
  uint16_t __x;
  __nv_bfloat16() = default;
  __nv_bfloat16(float f) : __x(double_to_bf16_bits(f)) {}
  __nv_bfloat16(double f) : __x(double_to_bf16_bits(f)) {}
  __nv_bfloat16(int i) : __x(double_to_bf16_bits(double(i))) {}
  __nv_bfloat16(unsigned i) : __x(double_to_bf16_bits(double(i))) {}
  __nv_bfloat16(long long i) : __x(double_to_bf16_bits(double(i))) {}
  operator float() const { return float(bf16_bits_to_double(__x)); }
};
struct __nv_bfloat162 {
  __nv_bfloat16 x, y;
};
static_assert(sizeof(__half2) == 4 && sizeof(__nv_bfloat162) == 4, "CUDA layout");

inline double to_double(__half h) { return half_bits_to_double(h.__x); }
inline double to_double(__nv_bfloat16 h) { return bf16_bits_to_double(h.__x); }
inline __half make_half_bits(uint16_t b) {
  __half h;
  h.__x = b;
  return h;
}
inline __nv_bfloat16 make_bf16_bits(uint16_t b) {
  __nv_bfloat16 h;
  h.__x = b;
  return h;
}
template <class T>
inline T from_bits(uint16_t b) {
  T h;
  h.__x = b;
  return h;
}
template <class T>
inline T round_to(double x);
template <>
inline __half round_to<__half>(double x) {
  return make_half_bits(double_to_half_bits(x));
}
template <>
inline __nv_bfloat16 round_to<__nv_bfloat16>(double x) {
  return make_bf16_bits(double_to_bf16_bits(x));
}

// One correctly rounded operation each (products exact in double, sums rounded to odd first).
template <class T>
inline T op_add(T a, T b) {
  return round_to<T>(add_round_to_odd(to_double(a), to_double(b)));
}
template <class T>
inline T op_sub(T a, T b) {
  return round_to<T>(add_round_to_odd(to_double(a), -to_double(b)));
}
template <class T>
inline T op_mul(T a, T b) {
  return round_to<T>(to_double(a) * to_double(b));
}
template <class T>
inline T op_fma(T a, T b, T c) {
  return round_to<T>(add_round_to_odd(to_double(a) * to_double(b), to_double(c)));
}
template <class T>
inline T op_neg(T a) {
  a.__x ^= 0x8000;
  return a;
}

}  // namespace simt
