// bench_w4a16_kernel.cu: w4a16_gemm's CUDA kernel alone, without torch, for A/B runs of
// compile-time variants on a GPU machine: one nvcc call per variant (a minute, all variants in
// parallel) instead of a build of the whole extension per variant.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -I csrc [-DW4K_W4A16_STAGES_16ROW=8] \
//        -o /tmp/bench benchmarks/gpu/bench_w4a16_kernel.cu && /tmp/bench [M ...]
//
// (scripts/gpu_kernel_ab.sh builds and runs several variants.) fp16, group 128 (GPTQ,
// symmetric), shapes (K, N) as bench_gpu_gemm.py: 4096 x 4096, 4096 x 11008, 11008 x 4096,
// 8192 x 28672 (W4K_BENCH_SHAPE=KxN: that one alone); M = 1 and 16 unless given. The weights
// and scales of each call come from the next of several copies, together four times the L2, so
// that they are read from HBM. The kernel is launched through the same host entry points as the
// binding (w4a16_gemm_plan, launch_w4a16_gemm), split-K as the planner chooses and with no
// split.
//
// Each time is a CUDA graph of kCalls launches, replayed: median over kSamples replays / kCalls.
// Columns: planner split blocks, us per call (planner, then no split), weight GB/s (int4 weight +
// scales) and its share of the device-to-device copy bandwidth measured in this run (read +
// write bytes), "read us": a plain streaming-read kernel over the same bytes, same rotation, same
// graph (what reading this much costs at this size, launch and ramp-up included), "floor us": an
// empty kernel's time per call in the same graph, and an FNV-1a hash of the output bits
// (planner run): it must be the same for every variant that changes no sum (stage depth).
// W4K_BENCH_SPLITS="2 3" adds columns: the time with 2 (3) balanced split-K blocks per SM.
// Inputs are a fixed hash of their index: the same on every run and variant.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <utility>
#include <vector>

#include "kernels/w4a16_gemm.cuh"

namespace {

using namespace w4k;

constexpr int kCalls = 30;    // launches per graph
constexpr int kSamples = 9;   // timed replays (after 3 untimed)
constexpr int kGroup = 128;

#define CHECK(call)                                                                    \
  do {                                                                                 \
    const cudaError_t err_ = (call);                                                   \
    if (err_ != cudaSuccess) {                                                         \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,               \
                   cudaGetErrorString(err_));                                          \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

__host__ __device__ uint32_t mix(uint64_t x) {  // splitmix64's finalizer, low 32 bits
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return static_cast<uint32_t>(x ^ (x >> 31));
}

__global__ void fill_words(uint32_t* w, int64_t n, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    w[i] = mix(seed + i);
}

// fp16 values: activations in [-1, 1), scales in [2^-9, 2^-8).
__global__ void fill_half(half* x, int64_t n, uint64_t seed, float lo, float span) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    x[i] = __float2half(lo + span * static_cast<float>(mix(seed + i) >> 8) * (1.f / (1 << 24)));
}

// Reads n 16-byte words, 4 loads in flight per thread; stores only if the xor of everything is
// an impossible value, so the loads cannot be dropped.
__global__ void stream_read(const int4* __restrict__ src, int64_t n, int* sink) {
  int acc = 0;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    int4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = __ldcs(src + i + u * stride);
#pragma unroll
    for (int u = 0; u < 4; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n; i += stride) {
    const int4 v = __ldcs(src + i);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x7fedcba9) *sink = acc;
}

__global__ void empty_kernel() {}

struct Copy {  // one copy of a layer's weights: [b_q_weight | scales], one allocation
  char* base = nullptr;
  const uint32_t* q() const { return reinterpret_cast<const uint32_t*>(base); }
};

// Median over `samples` runs of `work` (after `warmup` untimed ones), timed with events, in ms.
template <typename F>
double median_event_ms(cudaStream_t stream, int warmup, int samples, F&& work) {
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  std::vector<float> ms;
  for (int s = 0; s < warmup + samples; ++s) {
    CHECK(cudaEventRecord(e0, stream));
    work();
    CHECK(cudaEventRecord(e1, stream));
    CHECK(cudaEventSynchronize(e1));
    float t = 0.f;
    CHECK(cudaEventElapsedTime(&t, e0, e1));
    if (s >= warmup) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  CHECK(cudaEventDestroy(e0));
  CHECK(cudaEventDestroy(e1));
  return ms[ms.size() / 2];
}

// Median time per call of kCalls calls of `launch(i)` captured in one graph, in us.
template <typename F>
double graph_us(cudaStream_t stream, F&& launch) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < kCalls; ++i) launch(i);
  CHECK(cudaStreamEndCapture(stream, &graph));
  CHECK(cudaGraphInstantiate(&exec, graph, 0));
  const double ms =
      median_event_ms(stream, 3, kSamples, [&] { CHECK(cudaGraphLaunch(exec, stream)); });
  CHECK(cudaGraphExecDestroy(exec));
  CHECK(cudaGraphDestroy(graph));
  return 1e3 * ms / kCalls;
}

double copy_bandwidth_gbs(cudaStream_t stream) {  // 1 GiB device-to-device, read + write bytes
  const size_t bytes = size_t{1} << 30;
  void *src, *dst;
  CHECK(cudaMalloc(&src, bytes));
  CHECK(cudaMalloc(&dst, bytes));
  const double ms = median_event_ms(stream, 2, 6, [&] {
    CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
  });
  CHECK(cudaFree(src));
  CHECK(cudaFree(dst));
  return 2.0 * bytes / (1e-3 * ms) / 1e9;
}

uint64_t fnv1a(const std::vector<uint16_t>& v) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint16_t x : v) {
    h = (h ^ (x & 0xff)) * 0x100000001b3ull;
    h = (h ^ (x >> 8)) * 0x100000001b3ull;
  }
  return h;
}

void run_shape(int64_t k, int64_t n, const std::vector<int>& ms, const std::vector<int>& per_sm,
               const cudaDeviceProp& prop, double copy_gbs, cudaStream_t stream) {
  const int64_t groups = k / kGroup;
  const size_t q_bytes = static_cast<size_t>(k / 16) * 2 * n * 4;
  const size_t s_bytes = static_cast<size_t>(groups) * n * 2;
  const size_t copy_bytes = q_bytes + s_bytes;  // q_bytes is a multiple of 16
  const int copies = static_cast<int>(
      std::max<size_t>(2, (4 * static_cast<size_t>(prop.l2CacheSize) + copy_bytes - 1) /
                              copy_bytes));
  std::vector<Copy> w(copies);
  for (int c = 0; c < copies; ++c) {
    CHECK(cudaMalloc(&w[c].base, copy_bytes));
    // Every copy holds the same values (seed independent of c): the output is the same.
    fill_words<<<1024, 256, 0, stream>>>(reinterpret_cast<uint32_t*>(w[c].base),
                                         static_cast<int64_t>(q_bytes / 4), 1);
    fill_half<<<1024, 256, 0, stream>>>(reinterpret_cast<half*>(w[c].base + q_bytes),
                                        groups * n, 2, 1.f / 512, 1.f / 512);
  }
  const int max_m = *std::max_element(ms.begin(), ms.end());
  half *a, *out;
  CHECK(cudaMalloc(&a, sizeof(half) * max_m * k));
  CHECK(cudaMalloc(&out, sizeof(half) * max_m * n));
  fill_half<<<1024, 256, 0, stream>>>(a, max_m * k, 3, -1.f, 2.f);
  int* counters;  // one per tile at most: N / 128 x M / 16
  const int64_t max_tiles = (n / 128 + 1) * (max_m / 16 + 1);
  CHECK(cudaMalloc(&counters, sizeof(int) * max_tiles));
  CHECK(cudaMemsetAsync(counters, 0, sizeof(int) * max_tiles, stream));
  int* sink;
  CHECK(cudaMalloc(&sink, sizeof(int)));
  CHECK(cudaStreamSynchronize(stream));

  const double read_us = graph_us(stream, [&](int i) {
    stream_read<<<prop.multiProcessorCount * 8, 256, 0, stream>>>(
        reinterpret_cast<const int4*>(w[i % copies].base), copy_bytes / 16, sink);
  });
  const double floor_us = graph_us(stream, [&](int) { empty_kernel<<<1, 32, 0, stream>>>(); });

  const int configs = 2 + static_cast<int>(per_sm.size());
  for (int m : ms) {
    std::vector<double> us(configs);
    std::vector<int64_t> blocks(configs);
    uint64_t hash = 0;
    // v = 0: the planner's split-K; 1: no split; 2..: per_sm[v - 2] balanced blocks per SM.
    for (int v = 0; v < configs; ++v) {
      const int64_t split =
          v == 0 ? -1 : v == 1 ? 0 : int64_t{per_sm[v - 2]} * prop.multiProcessorCount;
      W4a16Plan plan;
      CHECK(w4a16_gemm_plan<half>(m, n, k, groups, false, false, prop.multiProcessorCount,
                                  max_tiles, int64_t{1} << 40, &plan, split));
      blocks[v] = plan.split_blocks;
      float* c_tmp = nullptr;
      if (plan.c_tmp_floats > 0) CHECK(cudaMalloc(&c_tmp, sizeof(float) * plan.c_tmp_floats));
      auto launch = [&](int i) {
        const Copy& c = w[i % copies];
        CHECK(launch_w4a16_gemm<half>(plan, a, k, c.q(),
                                      reinterpret_cast<const half*>(c.base + q_bytes), nullptr,
                                      nullptr, nullptr, nullptr, nullptr, nullptr, out, m, n, k,
                                      groups, c_tmp, counters, nullptr, stream));
      };
      us[v] = graph_us(stream, launch);
      if (v == 0) {
        CHECK(cudaMemsetAsync(out, 0xff, sizeof(half) * m * n, stream));  // poison, then once
        launch(0);
        std::vector<uint16_t> host(static_cast<size_t>(m) * n);
        CHECK(cudaMemcpyAsync(host.data(), out, host.size() * 2, cudaMemcpyDeviceToHost, stream));
        CHECK(cudaStreamSynchronize(stream));
        hash = fnv1a(host);
      }
      if (c_tmp != nullptr) CHECK(cudaFree(c_tmp));
    }
    const double gbs = copy_bytes / (1e-6 * us[0]) / 1e9;
    std::printf("%6lld %6lld %5d %7lld %9.2f %9.2f %8.0f %6.1f%% %8.2f %8.2f  %016llx",
                static_cast<long long>(k), static_cast<long long>(n), m,
                static_cast<long long>(blocks[0]), us[0], us[1], gbs, 100.0 * gbs / copy_gbs,
                read_us, floor_us, static_cast<unsigned long long>(hash));
    for (int v = 2; v < configs; ++v) std::printf(" %8.2f", us[v]);
    std::printf("\n");
  }
  for (Copy& c : w) CHECK(cudaFree(c.base));
  CHECK(cudaFree(a));
  CHECK(cudaFree(out));
  CHECK(cudaFree(counters));
  CHECK(cudaFree(sink));
}

}  // namespace

int main(int argc, char** argv) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    std::printf("bench_w4a16_kernel: no GPU visible; nothing to measure\n");
    return 0;
  }
  std::vector<int> ms;
  for (int i = 1; i < argc; ++i) ms.push_back(std::atoi(argv[i]));
  if (ms.empty()) ms = {1, 16};
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t stream;
  CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const double copy_gbs = copy_bandwidth_gbs(stream);
  std::printf("# %s, %d SMs, L2 %d MB; 16-row pipeline %d stages; copy %.0f GB/s\n", prop.name,
              prop.multiProcessorCount, prop.l2CacheSize >> 20, W4K_W4A16_STAGES_16ROW,
              copy_gbs);
  std::vector<int> per_sm;  // W4K_BENCH_SPLITS="2 3": also 2 and 3 balanced blocks per SM
  if (const char* splits = std::getenv("W4K_BENCH_SPLITS")) {
    for (const char* c = splits; *c != '\0';) {
      char* end = nullptr;
      const long v = std::strtol(c, &end, 10);
      if (end == c) break;
      if (v > 0) per_sm.push_back(static_cast<int>(v));
      c = end;
    }
  }
  std::printf("%6s %6s %5s %7s %9s %9s %8s %7s %8s %8s  %-16s", "K", "N", "M", "split", "us",
              "nosplit", "GB/s", "%copy", "read us", "floor us", "output hash");
  for (int v : per_sm) std::printf(" %5dx us", v);
  std::printf("\n");
  std::vector<std::pair<int64_t, int64_t>> shapes = {
      {4096, 4096}, {4096, 11008}, {11008, 4096}, {8192, 28672}};
  if (const char* only = std::getenv("W4K_BENCH_SHAPE")) {  // "KxN": that shape alone
    long long k = 0, n = 0;
    if (std::sscanf(only, "%lldx%lld", &k, &n) != 2 || k % kGroup != 0 || n % 64 != 0 ||
        k <= 0 || n <= 0) {
      std::fprintf(stderr, "W4K_BENCH_SHAPE=%s: expected KxN, K %% %d == 0, N %% 64 == 0\n",
                   only, kGroup);
      return 2;
    }
    shapes = {{k, n}};
  }
  for (const auto& s : shapes) run_shape(s.first, s.second, ms, per_sm, prop, copy_gbs, stream);
  CHECK(cudaStreamDestroy(stream));
  return 0;
}
