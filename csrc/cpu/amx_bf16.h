// AMX-BF16 micro-kernel shared by the blocked bf16 paths of w4a16_gemm and awq_gemm (torch-free).
//
// Both paths decode a k-block of 64 weight columns into "pair rows": pair row P is 64 32-bit
// lanes, lane x holding the bf16 weights of k-rows 2P (low half) and 2P + 1 (high half) of
// column x. That is exactly the B operand of TDPBF16PS (16 pair rows x 16 columns x 2 bf16 per
// tile row), so a 64-column pair block is four B tiles side by side (row stride 256 bytes), and
// the bf16 activations [M, K] are the A operand as they lie in memory (16 rows x 32 k, row
// stride lda). Per 16 rows of a: four C tiles (16 x 64 fp32) stay in tile registers over the
// k-block, each step of 32 k is one A load, four B loads and four TDPBF16PS (16 x 16 x 32
// multiply-adds each).
//
// Numerics: the products a * w are exact in fp32 (bf16 x bf16), as on the vdpbf16ps path, but
// TDPBF16PS adds the 32 products of a step into the fp32 accumulator in its own way, which is
// not the vdpbf16ps chain (odd k before even, one rounding per product) the other paths share:
// measured on this project's Intel Xeon (Sapphire/Emerald Rapids class), one pair alone is
// added as fl(c + fl(p_even + p_odd)), and 2..16 pairs match neither a sequential nor a tree
// order of rounded fp32 additions nor one exact sum rounded once. So the AMX path gives its
// own bits: a float32 summation of the same exact products, inside the contract's tolerance
// (fp32 accumulation), and the same for every thread count and work split (the 32-k steps are
// aligned to k = 0 and each output is summed by one chain of steps in k order). Where all the
// sums are exact (small-integer inputs) it gives the contract's bits. W4K_CPU_AMX=0 turns the
// path off (the vdpbf16ps path, whose bits every other ISA shares).
//
// fp16 activations (no AMX-FP16 on the CPUs this was written for) run on the same tiles with
// every fp16 value split into two bf16 (amx_split_half): exact products, fp32 accumulation.
//
// Edges: a last k-step of fewer than 32 k (K a multiple of 16 but not of 32; awq_gemm's odd K)
// and a last row block of fewer than 16 rows go through zero-padded copies of their A rows, B
// pair rows and C rows, so no tile load reads past an operand (and no stale value, which might
// be an Inf or a NaN, meets a zero).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(W4K_NO_AVX512)
#define W4K_HAVE_AMX_SPLIT 1  // amx_split_half (AVX-512 code the decoders share)
#include <immintrin.h>
#if defined(__linux__)
#define W4K_HAVE_AMX_PATH 1
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif
#endif

namespace w4k::cpu {

// std::vector storage on 64-byte boundaries: every row a tile loads or stores is then one cache
// line (std::vector<float> gives 16 bytes, and rows split across two lines halved the tiles'
// rate: 2026-11-27, 11008 x 4096, one thread, the tile work alone at M = 16 3.8 -> 1.6 ms).
template <typename T>
struct Align64Allocator {
  using value_type = T;
  Align64Allocator() = default;
  template <typename U>
  Align64Allocator(const Align64Allocator<U>&) {}
  T* allocate(size_t n) {
    return static_cast<T*>(::operator new(n * sizeof(T), std::align_val_t(64)));
  }
  void deallocate(T* ptr, size_t) { ::operator delete(ptr, std::align_val_t(64)); }
  template <typename U>
  bool operator==(const Align64Allocator<U>&) const { return true; }
  template <typename U>
  bool operator!=(const Align64Allocator<U>&) const { return false; }
};
template <typename T>
using Vector64 = std::vector<T, Align64Allocator<T>>;

// n values of T on 64-byte boundaries, left uninitialized (for buffers that are written whole
// before they are read, where Vector64 would zero them first: the tile paths' x / qa B tiles,
// the size of x).
template <typename T>
struct Aligned64Delete {
  void operator()(T* p) const { ::operator delete(p, std::align_val_t(64)); }
};
template <typename T>
using Uninit64 = std::unique_ptr<T[], Aligned64Delete<T>>;
template <typename T>
Uninit64<T> make_uninit64(int64_t n) {
  return Uninit64<T>(static_cast<T*>(::operator new(sizeof(T) * n, std::align_val_t(64))));
}

// Rows of storage past M of an A operand that the tiles load 16 rows at a time, also for a last
// row block of fewer (the bf16 activations of amx_bf16_rows(..., a_rows16 = true), the int8
// mode's qa): the rows past the block's own only make C rows that are not kept, and no
// partial block is copied into a zero-padded buffer every step (a tile load of bytes just
// stored waits for the stores to reach L1: 35 % of amx_a8_rows' samples at M = 8).
constexpr int64_t kAmxPadRows = 15;

// fp16 activations on the tiles: rows m of a as split rows (amx_split_half) in blocks of 8
// rows, block b = rows 8b .. 8b + 7 as 16 rows of the tile operand: the hi parts of the 8 rows,
// then their lo parts (rows past M zero). One A tile then gives both parts, and the C tile
// rows hold sum_k hi * w (rows 0..7) and sum_k lo * w (rows 8..15) of the same 8 rows: four
// independent C tiles per step as for bf16 (a second A tile for the lo parts, added into the
// same C tiles, made each C tile's products a chain: 2026-11-28, w4a16_gemm 4096 x 4096 g128,
// one thread, M = 256 82.5 ms against 39.2 this way). The two sums are added once, at the end
// (amx_fold_split_rows).
constexpr int64_t kAmxSplitRows = 8;
inline int64_t amx_split_tile_rows(int64_t rows) {
  return (rows + kAmxSplitRows - 1) / kAmxSplitRows * 2 * kAmxSplitRows;
}
// Row m of the split operand for its hi (h = 0) or lo (h = 1) part.
inline int64_t amx_split_row(int64_t m, int h) {
  return m / kAmxSplitRows * 2 * kAmxSplitRows + h * kAmxSplitRows + m % kAmxSplitRows;
}
// acc [amx_split_tile_rows(rows), 64] in that layout -> acc [rows, 64]: row m = the sum of its
// hi and lo rows. In place (row m is written after every row below it was read).
inline void amx_fold_split_rows(float* acc, int64_t rows) {
  for (int64_t m = 0; m < rows; ++m) {
    const float* hi = acc + amx_split_row(m, 0) * 64;
    const float* lo = acc + amx_split_row(m, 1) * 64;
    for (int x = 0; x < 64; ++x) acc[m * 64 + x] = hi[x] + lo[x];
  }
}

#ifdef W4K_HAVE_AMX_SPLIT
// fp16 values on bf16 tiles (a CPU with AMX-BF16 but not AMX-FP16). An fp16 value v (11
// significant bits; as fp32, mantissa bits 22..13) is exactly hi + lo with hi = v truncated to
// bf16 (the high 16 bits of its fp32 encoding: 8 significant bits) and lo = v - hi (exact in
// fp32: the value of mantissa bits 15..13, at most 3 significant bits, at least 2^-24 in
// magnitude unless zero, so exact in bf16 too; the same sign as v). A product a * w of two
// fp16 values (22 bits, exact in fp32) is then the sum of four exact bf16 products
// ah * wh + al * wh + ah * wl + al * wl, each of which TDPBF16PS forms exactly: four tile
// products per product, and the fp32 accumulation the contract asks for (with 4 K additions
// instead of K; the tests' bound counts them). Where a value is an integer of up to 8 bits
// (the per-channel weights q - z) its lo is zero and that half of the products is skipped.
// A NaN gives a NaN lo (and a NaN or an infinite hi), so the sum is a NaN as it should be. An
// infinity cannot go through the split: at best hi = +-inf and lo = 0, and then a cross
// product inf * 0 (the other operand's lo or hi part zero) is a NaN where the product is
// +-inf. So the split path runs only where no value is infinite: activations without an infinity
// (amx_split_activations_ok) and scales of at most 4096 in magnitude (amx_split_scales_ok:
// then |(q - z) * s| <= 15 * 4096 < 65504, no weight overflows fp16); elsewhere the calls
// take the fp32 FMA path.
inline bool amx_split_activations_ok(const uint16_t* x, int64_t rows, int64_t cols,
                                     int64_t ld) {
  for (int64_t m = 0; m < rows; ++m) {
    bool inf = false;
    for (int64_t k = 0; k < cols; ++k) inf |= (x[m * ld + k] & 0x7fff) == 0x7c00;
    if (inf) return false;
  }
  return true;
}
inline bool amx_split_scales_ok(const uint16_t* s, int64_t n) {
  bool big = false;  // |s| > 4096 (0x6c00), a NaN included
  for (int64_t i = 0; i < n; ++i) big |= (s[i] & 0x7fff) > 0x6c00;
  return !big;
}

// Lane i of v (16 fp32 values, each an fp16 value widened exactly) -> hi and lo as fp32 bit
// patterns whose low 16 bits are zero (each exactly a bf16 value: its bits are the high half).
// AVX-512F only, so every decoder can inline it.
// No lane may be infinite (the callers' checks above).
__attribute__((target("avx512f"))) inline void amx_split_half(__m512 v, __m512i& hi,
                                                              __m512i& lo) {
  const __m512i high_half = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  hi = _mm512_and_si512(_mm512_castps_si512(v), high_half);
  lo = _mm512_castps_si512(_mm512_sub_ps(v, _mm512_castsi512_ps(hi)));
}

// n fp16 values (bits) -> their hi and lo parts as bf16 bits (amx_split_half).
__attribute__((target("avx512f,avx512bw,avx512vl,f16c"))) inline void amx_split_half_row(
    const uint16_t* src, int64_t n, uint16_t* hi, uint16_t* lo) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? 0xffff : static_cast<__mmask16>((1u << (n - i)) - 1);
    __m512i h, l;
    amx_split_half(_mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, src + i)), h, l);
    _mm256_mask_storeu_epi16(hi + i, m, _mm512_cvtepi32_epi16(_mm512_srli_epi32(h, 16)));
    _mm256_mask_storeu_epi16(lo + i, m, _mm512_cvtepi32_epi16(_mm512_srli_epi32(l, 16)));
  }
}

#endif

#ifdef W4K_HAVE_AMX_PATH

// XCR0, the state components the OS saves (OSXSAVE checked by the caller).
__attribute__((target("xsave"))) inline unsigned long long xcr0() { return _xgetbv(0); }

// The CPU has AMX-TILE and AMX-BF16, the OS saves their state (XCR0 bits 17 and 18), and Linux
// granted this process the tile data state (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA;
// Linux 5.16+). Asked once per process.
inline bool amx_bf16_available() {
  static const bool ok = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 27))) return false;  // OSXSAVE
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
    if (!(d & (1u << 24)) || !(d & (1u << 22))) return false;  // AMX-TILE, AMX-BF16
    if ((xcr0() & (3u << 17)) != (3u << 17)) return false;
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return ok;
}

// The AMX path runs where the CPU has it and W4K_CPU_AMX is not "0" (read at each call, so
// tests and benchmarks can compare it with the vdpbf16ps path in one process).
inline bool amx_bf16_enabled() {
  const char* env = std::getenv("W4K_CPU_AMX");
  if (env && std::strcmp(env, "0") == 0) return false;
  return amx_bf16_available();
}

// AMX-INT8 (TDPBSSD, the int8-activation mode): the same tiles, CPUID.7.0:EDX bit 25; the same
// switch.
inline bool amx_int8_enabled() {
  static const bool int8 = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d & (1u << 25));
  }();
  return int8 && amx_bf16_enabled();
}

// Tiles 0..3: C (16 rows x 16 fp32), 4: A (16 rows x 32 bf16), 5 and 6: B (16 pair rows x 16
// columns); 7 (16 x 64 bytes) for w4a16_gemm_decode_amx.h's second x^T tile. Configured for the
// scope of one work item on its thread, released at its end (a released thread has no tile
// state for the OS to save on a context switch).
class AmxTileScope {
 public:
  explicit AmxTileScope(bool on) : on_(on) {
    if (on_) configure();
  }
  ~AmxTileScope() {
    if (on_) release();
  }
  AmxTileScope(const AmxTileScope&) = delete;
  AmxTileScope& operator=(const AmxTileScope&) = delete;

 private:
  struct Config {
    uint8_t palette_id, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
  };
  // Palette 1, tiles 0..7 of 16 rows x 64 bytes. A constant in read-only data: GCC 12's
  // _tile_loadconfig declares only 8 of the 64 bytes as read by its asm, so a configuration
  // built on the stack lost the stores to the rest as dead and ldtilecfg faulted on garbage.
  __attribute__((target("amx-tile"))) static void configure() {
    alignas(64) static constexpr Config kConfig = {
        1, 0, {}, {64, 64, 64, 64, 64, 64, 64, 64}, {16, 16, 16, 16, 16, 16, 16, 16}};
    _tile_loadconfig(&kConfig);
  }
  __attribute__((target("amx-tile"))) static void release() { _tile_release(); }
  bool on_;
};

// GCC's _tile_loadd is an asm with the pointer as a plain register operand and no "memory"
// clobber, so the compiler does not know it reads the buffer: stores that fill a buffer just
// before a tile load of it may be moved after the load (or dropped), and stores that refill it
// for the next tile load may be moved before the last one. Every padded copy a tile loads is
// preceded and followed by this compiler barrier (it emits no instruction), and so is the
// entry of each tile kernel (its callers' stores of the operands). _tile_stored has the
// clobber.
inline void amx_stores_before_tile_load() {
  std::atomic_signal_fence(std::memory_order_seq_cst);
}

// acc[i][0:64] += sum_k a[i * lda + k] * w[k][0:64] for i < rows, k < kc: a bf16 (16-bit
// patterns), w as ceil(kc / 2) pair rows of 64 lanes (row stride 64; an odd kc's last pair row
// holds (w[kc - 1], 0)), acc fp32 with row stride 64. Needs an AmxTileScope on this thread.
// With wpairs_lo (same layout as wpairs): w means wpairs + wpairs_lo (the hi and lo parts of
// split fp16 weights, amx_split_half), both products added into the same accumulators.
// a_rows16: a has 16 readable rows from each row block's first (rows rounded up to 16, plus
// whatever the caller's buffer holds there), so a last block of fewer rows loads its A tile
// from a directly, the rows past its own giving C rows that are not kept (a tile load of a
// buffer just written waits for the stores to reach L1, every step).
template <bool kWLo>
__attribute__((target("amx-tile,amx-bf16,avx512f"))) inline void amx_rows_impl(
    const uint16_t* a, int64_t lda, const uint32_t* wpairs, const uint32_t* wpairs_lo,
    int64_t kc, float* acc, int64_t rows, bool a_rows16) {
  constexpr int64_t kStepK = 32, kRowBlock = 16, kCStride = 64 * 4, kBStride = 64 * 4;
  const int64_t full_k = kc / kStepK * kStepK, tail_k = kc - full_k;
  alignas(64) uint32_t b_tail[2][16 * 64];  // the last step's pair rows, zero-padded to 16
  alignas(64) uint16_t a_pad[16 * 32];      // one step's A rows, zero-padded
  alignas(64) float c_pad[16 * 64];         // a partial row block's accumulators
  amx_stores_before_tile_load();  // the caller's stores of a, the pair rows and acc
  if (tail_k) {
    const int64_t pairs = (tail_k + 1) / 2;
    for (int h = 0; h < (kWLo ? 2 : 1); ++h) {
      std::memcpy(b_tail[h], (h ? wpairs_lo : wpairs) + full_k / 2 * 64,
                  sizeof(uint32_t) * 64 * pairs);
      std::memset(b_tail[h] + 64 * pairs, 0, sizeof(uint32_t) * 64 * (16 - pairs));
    }
    amx_stores_before_tile_load();
  }
  // Step k0 of rows [i0, i0 + r) into tile 4: straight from a when the step is whole, else
  // through a_pad (rows >= r and k >= kc - k0 zero). A whole-width copy overwrites rows < r
  // entirely, so a_pad is cleared only when r changes or a step is narrower.
  int64_t a_pad_rows = -1;  // a_pad is zero in rows >= a_pad_rows (-1: not known)
  auto load_a = [&](int64_t i0, int64_t r, int64_t k0) {
    const int64_t width = std::min(kStepK, kc - k0);
    if ((r == kRowBlock || a_rows16) && width == kStepK) {
      _tile_loadd(4, a + i0 * lda + k0, lda * 2);
      return;
    }
    amx_stores_before_tile_load();  // the last step's tile load of a_pad came first
    if (width < kStepK || r != a_pad_rows) std::memset(a_pad, 0, sizeof(a_pad));
    a_pad_rows = width < kStepK ? -1 : r;
    for (int64_t i = 0; i < r; ++i)
      std::memcpy(a_pad + i * 32, a + (i0 + i) * lda + k0, sizeof(uint16_t) * width);
    amx_stores_before_tile_load();
    _tile_loadd(4, a_pad, 64);
  };
  for (int64_t i0 = 0; i0 < rows; i0 += kRowBlock) {
    const int64_t r = std::min(kRowBlock, rows - i0);
    float* c = acc + i0 * 64;
    if (r < kRowBlock) {
      std::memcpy(c_pad, c, sizeof(float) * 64 * r);
      std::memset(c_pad + 64 * r, 0, sizeof(float) * 64 * (kRowBlock - r));
      c = c_pad;
      amx_stores_before_tile_load();
    }
    _tile_loadd(0, c, kCStride);
    _tile_loadd(1, c + 16, kCStride);
    _tile_loadd(2, c + 32, kCStride);
    _tile_loadd(3, c + 48, kCStride);
    for (int64_t k0 = 0; k0 < kc; k0 += kStepK) {
      load_a(i0, r, k0);
      const bool whole = k0 < full_k;
      // B tiles 5 and 6 in turn, so each load overlaps the product before it; the four C
      // tiles in turn, so no product waits for the one before it (with the lo parts each C
      // tile's two products are four apart).
      auto products = [&](const uint32_t* w) {  // the step's 64 columns of pair rows w
        _tile_loadd(5, w, kBStride);
        _tile_dpbf16ps(0, 4, 5);
        _tile_loadd(6, w + 16, kBStride);
        _tile_dpbf16ps(1, 4, 6);
        _tile_loadd(5, w + 32, kBStride);
        _tile_dpbf16ps(2, 4, 5);
        _tile_loadd(6, w + 48, kBStride);
        _tile_dpbf16ps(3, 4, 6);
      };
      products(whole ? wpairs + k0 / 2 * 64 : b_tail[0]);
      if constexpr (kWLo) products(whole ? wpairs_lo + k0 / 2 * 64 : b_tail[1]);
    }
    _tile_stored(0, c, kCStride);
    _tile_stored(1, c + 16, kCStride);
    _tile_stored(2, c + 32, kCStride);
    _tile_stored(3, c + 48, kCStride);
    if (r < kRowBlock) std::memcpy(acc + i0 * 64, c_pad, sizeof(float) * 64 * r);
  }
}

inline void amx_bf16_rows(const uint16_t* a, int64_t lda, const uint32_t* wpairs, int64_t kc,
                          float* acc, int64_t rows, const uint32_t* wpairs_lo = nullptr,
                          bool a_rows16 = false) {
  if (wpairs_lo) amx_rows_impl<true>(a, lda, wpairs, wpairs_lo, kc, acc, rows, a_rows16);
  else amx_rows_impl<false>(a, lda, wpairs, nullptr, kc, acc, rows, a_rows16);
}

#else

inline bool amx_bf16_enabled() { return false; }
inline bool amx_int8_enabled() { return false; }
class AmxTileScope {
 public:
  explicit AmxTileScope(bool) {}
};

#endif

}  // namespace w4k::cpu
