// Warp collectives against their definitions: shfl variants (CUDA programming guide semantics),
// votes, ldmatrix x1/x2/x4/.trans (per-lane element table), mma.m16n8k16 f16/bf16 (PTX ISA
// fragment tables, checked against a float64 matmul of the matrices the fragments encode).
#include "harness.h"

namespace {

// ---- shuffles ----
enum { kIdx, kUp, kDown, kXor };

__global__ void shfl_kernel(const int* in, int* out, int mode, int b, int width) {
  const int v = in[threadIdx.x];
  int r = 0;
  switch (mode) {
    case kIdx:
      r = __shfl_sync(0xffffffffu, v, b, width);
      break;
    case kUp:
      r = __shfl_up_sync(0xffffffffu, v, unsigned(b), width);
      break;
    case kDown:
      r = __shfl_down_sync(0xffffffffu, v, unsigned(b), width);
      break;
    case kXor:
      r = __shfl_xor_sync(0xffffffffu, v, b, width);
      break;
  }
  out[threadIdx.x] = r;
}

// Source lane per the CUDA programming guide: lanes form segments of `width`; idx reads lane
// srcLane % width of its segment; up/down read lane -/+ delta unless that leaves the segment
// (then the own value); xor reads lane ^ laneMask unless that lies in a later segment.
int shfl_source(int mode, int lane, int b, int width) {
  const int seg = lane / width * width;
  switch (mode) {
    case kIdx:
      return seg + (b % width);
    case kUp:
      return lane - b >= seg ? lane - b : lane;
    case kDown:
      return lane + b < seg + width ? lane + b : lane;
    default:
      return (lane ^ b) / width <= lane / width ? (lane ^ b) : lane;
  }
}

}  // namespace

TEST(shfl_all_modes_widths_offsets) {
  const int nthreads = 64;  // two warps: lanes are per warp
  std::vector<int> in(nthreads), out(nthreads);
  for (int i = 0; i < nthreads; ++i) in[i] = 1000 + 7 * i;
  for (int mode : {kIdx, kUp, kDown, kXor})
    for (int width : {1, 2, 4, 8, 16, 32})
      for (int b : {0, 1, 2, 3, 5, 7, 13, 16, 31}) {
        W4K_LAUNCH(shfl_kernel, dim3(1), dim3(nthreads), 0, nullptr, in.data(), out.data(), mode, b,
                   width);
        CHECK_EQ(cudaGetLastError(), cudaSuccess);
        for (int t = 0; t < nthreads; ++t) {
          int want = in[t / 32 * 32 + shfl_source(mode, t % 32, b, width)];
          if (out[t] != want)
            harness::fail(__FILE__, __LINE__,
                          "mode " + std::to_string(mode) + " width " + std::to_string(width) +
                              " b " + std::to_string(b) + " thread " + std::to_string(t) +
                              ": got " + std::to_string(out[t]) + " want " + std::to_string(want));
        }
      }
}

namespace {
__global__ void shfl_types_kernel(double* d, half2* h, int* out) {
  const int lane = threadIdx.x;
  d[lane] = __shfl_xor_sync(0xffffffffu, d[lane], 5);
  h[lane] = __shfl_sync(0xffffffffu, h[lane], 31 - lane);
  // two disjoint masks at two call sites at the same time are legal
  if (lane < 16)
    out[lane] = __shfl_xor_sync(0x0000ffffu, lane * 10, 1);
  else
    out[lane] = __shfl_down_sync(0xffff0000u, lane * 10, 2, 16);
}
}  // namespace

TEST(shfl_64bit_half2_and_disjoint_masks) {
  std::vector<double> d(32);
  std::vector<half2> h(32);
  std::vector<int> out(32);
  for (int i = 0; i < 32; ++i) {
    d[i] = 1e300 / (i + 1);
    h[i] = __floats2half2_rn(float(i), float(-i));
  }
  auto d0 = d;
  auto h0 = h;
  W4K_LAUNCH(shfl_types_kernel, dim3(1), dim3(32), 0, nullptr, d.data(), h.data(), out.data());
  for (int i = 0; i < 32; ++i) {
    CHECK(d[i] == d0[i ^ 5]);
    CHECK(__low2float(h[i]) == __low2float(h0[(31 - i) % 32]) &&
          __high2float(h[i]) == __high2float(h0[(31 - i) % 32]));
    int want = i < 16 ? (i ^ 1) * 10 : (i + 2 < 32 ? (i + 2) * 10 : i * 10);
    CHECK_EQ(out[i], want);
  }
}

namespace {
__global__ void vote_kernel(const int* pred, unsigned* out) {
  const int t = threadIdx.x;
  const unsigned m = __activemask();  // the lanes that exist: a partial last warp has fewer
  out[4 * t + 0] = __ballot_sync(m, pred[t]);
  out[4 * t + 1] = unsigned(__any_sync(m, pred[t] & 2));
  out[4 * t + 2] = unsigned(__all_sync(m, pred[t] >= 0));
  out[4 * t + 3] = m;
}
}  // namespace

TEST(ballot_any_all_activemask) {
  std::mt19937 rng(7);
  const int n = 40;  // warp 1 is partial: lanes 0..7
  std::vector<int> pred(n);
  std::vector<unsigned> out(4 * n);
  for (int& p : pred) p = int(rng() % 3);
  W4K_LAUNCH(vote_kernel, dim3(1), dim3(n), 0, nullptr, pred.data(), out.data());
  for (int w = 0; w < 2; ++w) {
    const int lanes = w == 0 ? 32 : 8;
    unsigned want = 0;
    bool any2 = false;
    for (int l = 0; l < lanes; ++l) {
      if (pred[32 * w + l]) want |= 1u << l;
      any2 |= (pred[32 * w + l] & 2) != 0;
    }
    for (int l = 0; l < lanes; ++l) {
      const int t = 32 * w + l;
      CHECK_EQ(out[4 * t + 0], want);
      CHECK_EQ(out[4 * t + 1], unsigned(any2));
      CHECK_EQ(out[4 * t + 2], 1u);
      CHECK_EQ(out[4 * t + 3], lanes == 32 ? 0xffffffffu : 0xffu);
    }
  }
}

namespace {
// ---- ldmatrix ----
// Matrix i, row r, column c holds the b16 value (i << 8) | (r << 4) | c. Rows are scattered in
// shared memory (row slot = a permutation), so only per-lane addresses can find them.
constexpr int kSlots = 37;
int row_slot(int i, int r) { return (7 * (8 * i + r) + 3) % kSlots; }

template <int num, bool trans>
__global__ void ldmatrix_kernel(const uint4* rows, uint32_t* out) {
  W4K_EXTERN_SHARED(uint4, sh);
  for (int s = threadIdx.x; s < kSlots; s += 32) sh[s] = rows[s];
  __syncthreads();
  const int lane = threadIdx.x;
  // lanes beyond 8*num pass a garbage address: the instruction ignores it
  const void* addr = lane < 8 * num ? static_cast<const void*>(&sh[row_slot(lane / 8, lane % 8)])
                                    : reinterpret_cast<const void*>(uintptr_t(0x3));
  uint32_t r[4] = {0, 0, 0, 0};
  if (num == 1) trans ? w4k::ptx::ldmatrix_x1_trans(r, addr) : w4k::ptx::ldmatrix_x1(r, addr);
  if (num == 2) trans ? w4k::ptx::ldmatrix_x2_trans(r, addr) : w4k::ptx::ldmatrix_x2(r, addr);
  if (num == 4) trans ? w4k::ptx::ldmatrix_x4_trans(r, addr) : w4k::ptx::ldmatrix_x4(r, addr);
  for (int i = 0; i < 4; ++i) out[4 * lane + i] = r[i];
}

template <int num, bool trans>
void check_ldmatrix() {
  std::vector<uint4> rows(kSlots);
  for (int i = 0; i < 4; ++i)
    for (int r = 0; r < 8; ++r) {
      uint16_t v[8];
      for (int c = 0; c < 8; ++c) v[c] = uint16_t((i << 8) | (r << 4) | c);
      std::memcpy(&rows[row_slot(i, r)], v, 16);
    }
  std::vector<uint32_t> out(128);
  auto* k = &ldmatrix_kernel<num, trans>;
  W4K_LAUNCH(k, dim3(1), dim3(32), kSlots * 16, nullptr, rows.data(), out.data());
  CHECK_EQ(cudaGetLastError(), cudaSuccess);
  // thread t receives (row t/4, cols 2(t%4), 2(t%4)+1) of matrix i (of its transpose if .trans)
  for (int t = 0; t < 32; ++t)
    for (int i = 0; i < 4; ++i) {
      uint32_t want = 0;
      if (i < num) {
        int r = t / 4, c = 2 * (t % 4);
        auto elem = [&](int row, int col) {
          return trans ? uint32_t((i << 8) | (col << 4) | row)
                       : uint32_t((i << 8) | (row << 4) | col);
        };
        want = elem(r, c) | (elem(r, c + 1) << 16);
      }
      if (out[4 * t + i] != want)
        harness::fail(__FILE__, __LINE__,
                      "ldmatrix x" + std::to_string(num) + (trans ? ".trans" : "") + " lane " +
                          std::to_string(t) + " reg " + std::to_string(i));
    }
}
}  // namespace

TEST(ldmatrix_x1_x2_x4_and_trans_lane_table) {
  check_ldmatrix<1, false>();
  check_ldmatrix<2, false>();
  check_ldmatrix<4, false>();
  check_ldmatrix<1, true>();
  check_ldmatrix<2, true>();
  check_ldmatrix<4, true>();
}

namespace {
// ---- mma.m16n8k16 ----
// Fragment tables of the PTX ISA, element-indexed (groupID = lane >> 2, tig = lane % 4):
//   A: a_i, i = 0..7: row = groupID + 8 * ((i >> 1) & 1), col = 2 * tig + (i & 1) + 8 * (i >= 4)
//   B: b_i, i = 0..3: row = 2 * tig + (i & 1) + 8 * (i >= 2), col = groupID
//   C: c_i, i = 0..3: row = groupID + 8 * (i >= 2), col = 2 * tig + (i & 1)
// Element i sits in register i / 2, low half for even i.
struct MmaFrags {
  uint32_t a[32][4], b[32][2];
  float c[32][4];
};

template <class T>
uint16_t bits16(float x) {
  T h = T(x);
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}

template <class T>
MmaFrags encode(const float A[16][16], const float B[16][8], const float C[16][8]) {
  MmaFrags f{};
  for (int lane = 0; lane < 32; ++lane) {
    const int g = lane >> 2, tig = lane % 4;
    for (int i = 0; i < 8; ++i) {
      int row = g + 8 * ((i >> 1) & 1), col = 2 * tig + (i & 1) + 8 * (i >= 4);
      f.a[lane][i / 2] |= uint32_t(bits16<T>(A[row][col])) << (16 * (i & 1));
    }
    for (int i = 0; i < 4; ++i) {
      int row = 2 * tig + (i & 1) + 8 * (i >= 2), col = g;
      f.b[lane][i / 2] |= uint32_t(bits16<T>(B[row][col])) << (16 * (i & 1));
      f.c[lane][i] = C[g + 8 * (i >= 2)][2 * tig + (i & 1)];
    }
  }
  return f;
}

template <bool bf16>
__global__ void mma_kernel(const MmaFrags* f, float* d) {
  const int lane = threadIdx.x;
  float c[4] = {f->c[lane][0], f->c[lane][1], f->c[lane][2], f->c[lane][3]};
  if (bf16)
    w4k::ptx::mma_m16n8k16_bf16f32(f->a[lane], f->b[lane], c);
  else
    w4k::ptx::mma_m16n8k16_f16f32(f->a[lane], f->b[lane], c);
  for (int i = 0; i < 4; ++i) d[4 * lane + i] = c[i];
}

template <class T, bool bf16>
void check_mma(bool small_integers, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  float A[16][16], B[16][8], C[16][8];
  auto val = [&] {
    // operands are rounded to the input type first, so A and B hold exactly what the mma sees
    float x = small_integers ? float(int(rng() % 9) - 4) : normal(rng);
    return float(T(x));
  };
  for (auto& row : A)
    for (float& x : row) x = val();
  for (auto& row : B)
    for (float& x : row) x = val();
  for (auto& row : C)
    for (float& x : row) x = small_integers ? float(int(rng() % 101) - 50) : normal(rng);
  MmaFrags f = encode<T>(A, B, C);
  std::vector<float> d(128);
  auto* k = &mma_kernel<bf16>;
  W4K_LAUNCH(k, dim3(1), dim3(32), 0, nullptr, &f, d.data());
  for (int lane = 0; lane < 32; ++lane)
    for (int i = 0; i < 4; ++i) {
      const int row = (lane >> 2) + 8 * (i >= 2), col = 2 * (lane % 4) + (i & 1);
      double want = C[row][col], mag = std::fabs(C[row][col]);
      for (int kk = 0; kk < 16; ++kk) {
        want += double(A[row][kk]) * double(B[kk][col]);
        mag += std::fabs(double(A[row][kk]) * double(B[kk][col]));
      }
      const double got = d[4 * lane + i];
      // f32 accumulation of 17 terms: |error| <= 17 * 2^-24 * sum |terms|; exact for integers
      const double tol = small_integers ? 0.0 : 17 * std::ldexp(1.0, -24) * mag;
      if (!(std::fabs(got - want) <= tol))
        harness::fail(__FILE__, __LINE__,
                      std::string(bf16 ? "bf16" : "f16") + " mma D[" + std::to_string(row) + "][" +
                          std::to_string(col) + "] = " + std::to_string(got) +
                          ", float64 reference " + std::to_string(want));
    }
}
}  // namespace

TEST(mma_m16n8k16_f16_fragments_vs_float64) {
  for (uint32_t seed = 0; seed < 20; ++seed) check_mma<__half, false>(false, seed);
  for (uint32_t seed = 0; seed < 5; ++seed) check_mma<__half, false>(true, 100 + seed);
}

TEST(mma_m16n8k16_bf16_fragments_vs_float64) {
  for (uint32_t seed = 0; seed < 20; ++seed) check_mma<__nv_bfloat16, true>(false, seed);
  for (uint32_t seed = 0; seed < 5; ++seed) check_mma<__nv_bfloat16, true>(true, 100 + seed);
}

namespace {
// The usual pipeline on static __shared__ (thread_local in the emulator): cp.async rows in,
// wait, barrier, ldmatrix.x4 out. Lane l copies row l % 8 of matrix l / 8.
__global__ void static_smem_pipeline_kernel(const uint4* rows, uint32_t* out) {
  __shared__ uint4 tile[32];
  const int lane = threadIdx.x;
  w4k::ptx::cp_async16_ca(&tile[lane], &rows[lane]);
  w4k::ptx::cp_async_commit_group();
  w4k::ptx::cp_async_wait_group<0>();
  __syncthreads();
  uint32_t r[4];
  w4k::ptx::ldmatrix_x4(r, &tile[lane]);
  for (int i = 0; i < 4; ++i) out[128 * blockIdx.x + 4 * lane + i] = r[i];
}
}  // namespace

TEST(cp_async_and_ldmatrix_on_static_shared) {
  std::vector<uint4> rows(32);
  for (int i = 0; i < 4; ++i)
    for (int r = 0; r < 8; ++r) {
      uint16_t v[8];
      for (int c = 0; c < 8; ++c) v[c] = uint16_t((i << 8) | (r << 4) | c);
      std::memcpy(&rows[8 * i + r], v, 16);
    }
  std::vector<uint32_t> out(3 * 128);
  W4K_LAUNCH(static_smem_pipeline_kernel, dim3(3), dim3(32), 0, nullptr, rows.data(), out.data());
  for (int b = 0; b < 3; ++b)
    for (int t = 0; t < 32; ++t)
      for (int i = 0; i < 4; ++i) {
        const uint32_t r = t / 4, c = 2 * (t % 4), base = uint32_t(i << 8) | (r << 4);
        CHECK_EQ(out[128 * b + 4 * t + i], (base | c) | ((base | (c + 1)) << 16));
      }
}
