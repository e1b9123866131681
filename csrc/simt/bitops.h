// Integer instructions of the SIMT emulator that need no warp: lop3 and prmt, per the PTX ISA.
#pragma once

#include <cstdint>

namespace simt {

// lop3.b32 d, a, b, c, lut: bit k of d is bit (4*a_k + 2*b_k + c_k) of lut. Evaluated as the
// OR of the LUT's minterms (one full-width AND per set LUT bit).
inline uint32_t lop3(int lut, uint32_t a, uint32_t b, uint32_t c) {
  uint32_t r = 0;
  for (int i = 0; i < 8; ++i)
    if ((lut >> i) & 1) r |= ((i & 4) ? a : ~a) & ((i & 2) ? b : ~b) & ((i & 1) ? c : ~c);
  return r;
}

// prmt.b32 d, a, b, s (default mode): bytes 0..7 are a's bytes 0..3 then b's bytes 0..3;
// byte i of d is byte (s >> 4i) & 7, replaced by its sign bit replicated if (s >> 4i) & 8.
inline uint32_t prmt(uint32_t a, uint32_t b, uint32_t selector) {
  const uint64_t bytes = uint64_t(a) | (uint64_t(b) << 32);
  uint32_t r = 0;
  for (int i = 0; i < 4; ++i) {
    const uint32_t sel = (selector >> (4 * i)) & 0xF;
    uint32_t byte = uint32_t(bytes >> (8 * (sel & 7))) & 0xFF;
    if (sel & 8) byte = (byte & 0x80) ? 0xFF : 0x00;
    r |= byte << (8 * i);
  }
  return r;
}

}  // namespace simt
