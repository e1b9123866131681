// The project's only x86 inline assembly: single instructions the compiler will not emit from
// intrinsics. CPU code only (no .cu / .cuh includes this); the PTX wrappers live in
// csrc/kernels/ptx.cuh, and tests/test_simt_emulator.py keeps every other source asm-free.
#pragma once

#include <cstdint>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

namespace w4k::cpu {

// acc += u8 w x s8 (the dword at p broadcast to all 16 lanes): vpdpbusd with an embedded
// {1to16} broadcast of its memory operand. GCC does not fold _mm512_set1_epi32(*p) into
// vpdpbusd (it emits a separate vpbroadcastd per product, and at 8 rows ~10 register moves per
// loop), so the instruction is written out.
__attribute__((target("avx512f,avx512vnni"), always_inline)) inline __m512i dpbusd_bcst(
    __m512i acc, __m512i w, const int8_t* p) {
  asm("vpdpbusd %2%{1to16%}, %1, %0"
      : "+v"(acc)
      : "v"(w), "m"(*reinterpret_cast<const int32_t*>(p)));
  return acc;
}

}  // namespace w4k::cpu

#endif
