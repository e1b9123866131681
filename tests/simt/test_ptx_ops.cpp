// lop3 / prmt against their PTX ISA definitions, and fp16 / bf16 conversions and arithmetic
// against an independent reference: the exact value (in __float128, exact for these operand
// ranges) rounded by searching the sorted table of all representable values, ties to the even
// encoding.
#include <algorithm>
#include <utility>

#include "harness.h"

using w4k::ptx::lop3;
using w4k::ptx::prmt;

namespace {

// ---- lop3: bit k of the result is bit (4*a_k + 2*b_k + c_k) of the LUT ----
uint32_t lop3_reference(int lut, uint32_t a, uint32_t b, uint32_t c) {
  uint32_t r = 0;
  for (int k = 0; k < 32; ++k) {
    int idx = int(((a >> k) & 1) << 2 | ((b >> k) & 1) << 1 | ((c >> k) & 1));
    r |= uint32_t((lut >> idx) & 1) << k;
  }
  return r;
}

template <int... luts>
void check_all_luts(std::integer_sequence<int, luts...>, uint32_t a, uint32_t b, uint32_t c) {
  auto one = [&](int lut, uint32_t got) {
    if (got != lop3_reference(lut, a, b, c))
      harness::fail(__FILE__, __LINE__, "lop3 LUT " + std::to_string(lut) + " wrong");
  };
  (one(luts, lop3<luts>(a, b, c)), ...);
}

// ---- prmt default mode: byte i of d = byte (s_i & 7) of {b:a}, sign-replicated if s_i & 8 ----
uint32_t prmt_reference(uint32_t a, uint32_t b, uint32_t s) {
  unsigned char bytes[8];
  for (int i = 0; i < 4; ++i) {
    bytes[i] = (unsigned char)(a >> (8 * i));
    bytes[4 + i] = (unsigned char)(b >> (8 * i));
  }
  uint32_t d = 0;
  for (int i = 0; i < 4; ++i) {
    unsigned nib = (s >> (4 * i)) & 0xF;
    unsigned char byte = bytes[nib & 7];
    if (nib & 8) byte = (byte & 0x80) ? 0xFF : 0x00;
    d |= uint32_t(byte) << (8 * i);
  }
  return d;
}

// ---- reference fp16 / bf16 ----
struct Format {
  int exp_bits, mant_bits;
  uint16_t inf_bits;
  std::vector<double> value;  // value[p] for p = 0 .. inf_bits; value[inf_bits] = 2^(emax+1)

  Format(int e, int m) : exp_bits(e), mant_bits(m) {
    inf_bits = uint16_t(((1 << e) - 1) << m);
    const int bias = (1 << (e - 1)) - 1;
    for (int p = 0; p <= inf_bits; ++p) {
      int ex = p >> m, mant = p & ((1 << m) - 1);
      // (-1)^0 * 2^(ex - bias) * (1 + mant / 2^m), subnormals 2^(1 - bias) * mant / 2^m
      double scale = std::pow(2.0, (ex ? ex : 1) - bias);
      double frac = (ex ? 1.0 : 0.0) + double(mant) / double(1 << m);
      value.push_back(scale * frac);
    }
  }
  double decode(uint16_t bits) const {
    uint16_t mag = bits & 0x7FFF;
    if (mag > inf_bits) return NAN;
    double v = mag == inf_bits ? INFINITY : value[mag];
    return (bits & 0x8000) ? -v : v;
  }
  // Nearest encoding of x, ties to the even encoding; inf is the "next" value after the largest
  // finite one, so the overflow threshold is its midpoint, as IEEE round-to-nearest-even says.
  uint16_t nearest(__float128 x) const {
    if (x != x) return 0x7FFF;
    uint16_t sign = 0;
    if (__builtin_signbit(x)) {  // includes -0 (exact IEEE arithmetic gives signed zeros)
      sign = 0x8000;
      x = -x;
    }
    if (x >= (__float128)value[inf_bits]) return sign | inf_bits;
    // largest p with value[p] <= x
    auto it = std::upper_bound(value.begin(), value.end(), x,
                               [](__float128 v, double t) { return v < (__float128)t; });
    int lo = int(it - value.begin()) - 1, hi = lo + 1;
    __float128 dlo = x - (__float128)value[lo], dhi = (__float128)value[hi] - x;
    int p = dlo < dhi ? lo : dhi < dlo ? hi : ((lo & 1) ? hi : lo);
    return uint16_t(sign | p);
  }
};
const Format& f16() {
  static Format f(5, 10);
  return f;
}
const Format& bf16() {
  static Format f(8, 7);
  return f;
}

template <class T>
uint16_t bits_of(T h) {
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}

// fp16/bf16 result vs reference bits (any NaN matches any NaN).
void check_bits(uint16_t got, uint16_t want, const char* what, uint16_t a, uint16_t b, uint16_t c) {
  bool both_nan = (got & 0x7FFF) > 0x7C00 && (want & 0x7FFF) > 0x7C00;
  if (got == want || both_nan) return;
  char buf[160];
  std::snprintf(buf, sizeof buf, "%s(0x%04x, 0x%04x, 0x%04x) = 0x%04x, want 0x%04x", what, a, b, c,
                got, want);
  throw harness::Failure(buf);
}

}  // namespace

TEST(lop3_all_luts_vs_definition) {
  std::mt19937 rng(1);
  for (int it = 0; it < 64; ++it)
    check_all_luts(std::make_integer_sequence<int, 256>{}, rng(), rng(), rng());
  const uint32_t a = 0x12345678, b = 0x9abcdef0, c = 0x0f0f00ff;
  CHECK_EQ(lop3<0xF0>(a, b, c), a);
  CHECK_EQ(lop3<0xCC>(a, b, c), b);
  CHECK_EQ(lop3<0xAA>(a, b, c), c);
  CHECK_EQ(lop3<0x96>(a, b, c), a ^ b ^ c);
  CHECK_EQ(lop3<(0xF0 & 0xCC) | 0xAA>(a, b, c), (a & b) | c);
  CHECK_EQ(lop3<0x00>(a, b, c), 0u);
  CHECK_EQ(lop3<0xFF>(a, b, c), 0xFFFFFFFFu);
}

TEST(prmt_vs_byte_select_definition) {
  const uint32_t a = 0x33221100, b = 0x77665544;
  CHECK_EQ(prmt(a, b, 0x3210), a);
  CHECK_EQ(prmt(a, b, 0x7654), b);
  CHECK_EQ(prmt(a, b, 0x0123), 0x00112233u);
  CHECK_EQ(prmt(a, b, 0x5140), 0x55114400u);
  CHECK_EQ(prmt(0x00000080u, 0, 0x8888), 0xFFFFFFFFu);  // sign of 0x80 replicated
  CHECK_EQ(prmt(0x0000007Fu, 0, 0x0008), 0x7F7F7F00u);  // sign of 0x7F is 0
  std::mt19937 rng(2);
  for (int it = 0; it < 50000; ++it) {
    uint32_t x = rng(), y = rng(), s = rng() & 0xFFFF;
    if (prmt(x, y, s) != prmt_reference(x, y, s)) CHECK_EQ(prmt(x, y, s), prmt_reference(x, y, s));
  }
}

TEST(half_bf16_decode_exhaustive) {
  for (int p = 0; p < 65536; ++p) {
    double want = f16().decode(uint16_t(p));
    double got = __half2float(__ushort_as_half(uint16_t(p)));
    if (!(got == want || (std::isnan(got) && std::isnan(want))))
      harness::fail(__FILE__, __LINE__, "fp16 decode of " + std::to_string(p));
    want = bf16().decode(uint16_t(p));
    got = __bfloat162float(__ushort_as_bfloat16(uint16_t(p)));
    if (!(got == want || (std::isnan(got) && std::isnan(want))))
      harness::fail(__FILE__, __LINE__, "bf16 decode of " + std::to_string(p));
  }
}

// Every representable value, every midpoint between neighbours (ties to even) and the floats
// just beside each midpoint, both signs; for fp16 also through double (one rounding).
TEST(float_to_half_bf16_rounding_exhaustive) {
  for (const Format* fmt : {&f16(), &bf16()}) {
    const bool is_half = fmt == &f16();
    auto conv = [&](float x) {
      return is_half ? bits_of(__float2half(x)) : bits_of(__float2bfloat16(x));
    };
    for (int p = 0; p < fmt->inf_bits; ++p) {
      const double v = fmt->value[p], mid = (v + fmt->value[p + 1]) / 2;
      for (int s = 0; s < 2; ++s) {
        const double sg = s ? -1.0 : 1.0;
        const uint16_t sb = s ? 0x8000 : 0;
        for (double x : {v, mid}) {
          float xf = float(sg * x);
          CHECK(double(xf) == sg * x);  // midpoints need <= 12 bits: exact in float
          check_bits(conv(xf), fmt->nearest(sg * x), "cvt", uint16_t(p), sb, 0);
          float up = std::nextafter(xf, INFINITY), down = std::nextafter(xf, -INFINITY);
          check_bits(conv(up), fmt->nearest(up), "cvt up", uint16_t(p), sb, 0);
          check_bits(conv(down), fmt->nearest(down), "cvt down", uint16_t(p), sb, 0);
          if (is_half) {
            double upd = std::nextafter(sg * x, INFINITY);
            check_bits(simt::double_to_half_bits(upd), fmt->nearest(upd), "cvt double", uint16_t(p),
                       sb, 0);
          }
        }
      }
    }
    check_bits(conv(INFINITY), fmt->inf_bits, "cvt inf", 0, 0, 0);
    check_bits(conv(-INFINITY), uint16_t(0x8000 | fmt->inf_bits), "cvt -inf", 0, 0, 0);
    check_bits(conv(NAN), 0x7FFF, "cvt nan", 0, 0, 0);
    std::mt19937 rng(3);
    for (int it = 0; it < 100000; ++it) {
      uint32_t u = rng();
      float x;
      std::memcpy(&x, &u, 4);
      check_bits(conv(x), fmt->nearest(x), "cvt random", uint16_t(u >> 16), uint16_t(u), 0);
    }
  }
}

namespace {
// Random finite operand: fp16 any finite encoding; bf16 with |exponent| <= 20 so that a*b + c
// is exact in __float128 (113 bits).
uint16_t random_operand(std::mt19937& rng, bool is_half) {
  for (;;) {
    uint16_t p = uint16_t(rng());
    if (is_half) {
      if ((p & 0x7C00) != 0x7C00) return p;
    } else {
      int e = (p >> 7) & 0xFF;
      if (e >= 127 - 20 && e <= 127 + 20) return p;
    }
  }
}

template <class S, class P>
void check_ops(const Format& fmt, uint32_t seed) {
  std::mt19937 rng(seed);
  const bool is_half = std::is_same_v<S, __half>;
  auto mk = [](uint16_t b) {
    S s;
    std::memcpy(&s, &b, 2);
    return s;
  };
  for (int it = 0; it < 60000; ++it) {
    uint16_t a = random_operand(rng, is_half), b = random_operand(rng, is_half),
             c = random_operand(rng, is_half);
    __float128 xa = fmt.decode(a), xb = fmt.decode(b), xc = fmt.decode(c);
    S sa = mk(a), sb = mk(b), sc = mk(c);
    check_bits(bits_of(__hadd(sa, sb)), fmt.nearest(xa + xb), "hadd", a, b, 0);
    check_bits(bits_of(__hsub(sa, sb)), fmt.nearest(xa - xb), "hsub", a, b, 0);
    check_bits(bits_of(__hmul(sa, sb)), fmt.nearest(xa * xb), "hmul", a, b, 0);
    check_bits(bits_of(__hfma(sa, sb, sc)), fmt.nearest(xa * xb + xc), "hfma", a, b, c);
    // the paired forms compute each half independently
    P pa{sa, sb}, pb{sb, sc}, pc{sc, sa};
    P r = __hfma2(pa, pb, pc);
    check_bits(bits_of(r.x), fmt.nearest(xa * xb + xc), "hfma2.x", a, b, c);
    check_bits(bits_of(r.y), fmt.nearest(xb * xc + xa), "hfma2.y", b, c, a);
    r = __hmul2(pa, pb);
    check_bits(bits_of(r.y), fmt.nearest(xb * xc), "hmul2.y", b, c, 0);
    r = __hsub2(pa, pb);
    check_bits(bits_of(r.x), fmt.nearest(xa - xb), "hsub2.x", a, b, 0);
    r = __hadd2(pa, pb);
    check_bits(bits_of(r.y), fmt.nearest(xb + xc), "hadd2.y", b, c, 0);
  }
}
}  // namespace

TEST(half_arithmetic_correctly_rounded) { check_ops<__half, __half2>(f16(), 4); }
TEST(bf16_arithmetic_correctly_rounded) { check_ops<__nv_bfloat16, __nv_bfloat162>(bf16(), 5); }

// The case a plain double fma gets wrong: a*b exactly halfway between two bf16 values and c
// far below double's precision. The exact a*b + c lies just above/below the midpoint.
TEST(bf16_fma_midpoint_plus_tiny_c) {
  int found = 0;
  for (int pa = 0x3F80; pa < 0x4000 && found < 20; ++pa)
    for (int pb = 0x3F80; pb < 0x4000 && found < 20; ++pb) {
      double ab = bf16().decode(uint16_t(pa)) * bf16().decode(uint16_t(pb));  // exact
      uint16_t lo = bf16().nearest(ab);
      if (bf16().decode(lo) > ab) --lo;
      double vlo = bf16().decode(lo), vhi = bf16().decode(uint16_t(lo + 1));
      if (ab != (vlo + vhi) / 2) continue;  // not a midpoint
      ++found;
      const __nv_bfloat16 a = __ushort_as_bfloat16(uint16_t(pa)),
                          b = __ushort_as_bfloat16(uint16_t(pb));
      const __nv_bfloat16 tiny = __float2bfloat16(std::ldexp(1.0f, -100));
      CHECK_EQ(bits_of(__hfma(a, b, tiny)), uint16_t(lo + 1));
      CHECK_EQ(bits_of(__hfma(a, b, __hneg(tiny))), lo);
    }
  CHECK(found == 20);
}
