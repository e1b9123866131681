// Run-time choice of the CPU instruction set a kernel uses.
//
// Kernels pick the best path the CPU supports; the environment variable W4K_CPU_ISA
// (scalar | avx2 | avx512) caps the choice, so tests can run every path on one machine and
// force the portable fallback. The variable is read at each call (a getenv is negligible next
// to a kernel), so a test can change it between calls.
#pragma once

#include <cpuid.h>

#include <cstdlib>
#include <cstring>

namespace w4k {

enum class Isa { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

inline Isa detected_isa() {
  static const Isa best = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni"))
      return Isa::kAvx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("f16c"))
      return Isa::kAvx2;
    return Isa::kScalar;
  }();
  return best;
}

inline Isa cpu_isa() {
  Isa isa = detected_isa();
  if (const char* cap = std::getenv("W4K_CPU_ISA")) {
    Isa want = std::strcmp(cap, "scalar") == 0 ? Isa::kScalar
               : std::strcmp(cap, "avx2") == 0 ? Isa::kAvx2
                                               : Isa::kAvx512;
    if (want < isa) isa = want;
  }
  return isa;
}

// The CPU family of an AMD x86-64 CPU (cpuid leaf 1: base family, plus the extended family where
// the base is 0xF; 0x19 Zen 3/4, 0x1A Zen 5), 0 on any other vendor. For path choices measured
// to differ between such generations (not a feature test: the instructions are the same).
inline int amd_cpu_family() {
  static const int family = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(0, &a, &b, &c, &d) || b != 0x68747541u)  // "Auth" of AuthenticAMD
      return 0;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    const int base = (a >> 8) & 0xf;
    return base == 0xf ? base + static_cast<int>((a >> 20) & 0xff) : base;
  }();
  return family;
}

inline const char* isa_name(Isa isa) {
  return isa == Isa::kAvx512 ? "avx512" : isa == Isa::kAvx2 ? "avx2" : "scalar";
}

}  // namespace w4k
