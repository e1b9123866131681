// SIMT emulator: runs CUDA kernel sources (csrc/kernels/*.cuh) on the CPU, thread by thread.
// Included through csrc/kernels/cuda_compat.cuh when W4K_SIMT=1; build with
// -fno-strict-aliasing (kernels type-pun through reinterpret_cast) and link
// csrc/simt/fiber_switch_x86_64.S (or define W4K_SIMT_UCONTEXT).
//
// Execution model
// - Every CUDA thread is a fiber (own mmap'ed stack, hand-written x86-64 switch, fiber.h). A
//   block's fibers run on one OS thread, cooperatively: a fiber runs until it reaches a barrier,
//   a warp collective, an acquire load or an atomic, or returns. The scheduler goes round-robin
//   in thread order, so "thread 0 runs ahead to the barrier first" is deterministic;
//   W4K_SIMT_SCHEDULE=reverse|shuffle runs the rounds in other orders (race hunting).
// - Each block runs on a fresh OS thread; at most W4K_SIMT_WORKERS (default min(4, cores)) of
//   them run at a time. When all runnable threads of a block keep re-reading an unchanged value
//   with ld_acquire_gpu / atomics (a split-K lock waiting for another block), or one thread has
//   re-read the same value 64 times in a row (barriers or votes in the spin loop), the block gives
//   its run slot away and the next pending block starts on a new OS thread, so every block that
//   waits for another can eventually see it run (as if all blocks were co-resident). A block
//   spinning for W4K_SIMT_SPIN_TIMEOUT_S (30) seconds is an error. Plain or volatile loads in a
//   spin loop never yield: use ld_acquire_gpu (the GPU needs the acquire anyway).
// - Static __shared__ is `thread_local`: per OS thread, and every block has its own OS thread,
//   so it is per block even when several blocks are alive. It starts zeroed (fresh thread), not
//   poisoned, and ASan does not put redzones around it. Dynamic shared memory is a heap block of
//   exactly the launch size (ASan sees overflows), 128-byte aligned, filled with 0xFF bytes
//   (NaN as fp16/bf16/fp32, -1 as integers) at block start. Declare it with
//   W4K_EXTERN_SHARED(type, name) (`extern __shared__ type name[]` on nvcc).
// - __syncthreads: every thread of the block must arrive, at the same call site. A thread that
//   has exited never arrives (an error here; the hardware would let it count, but CUDA calls
//   that undefined). bar.sync id, n (named barriers) counts arrivals only.
// - Warps are 32 consecutive linear thread ids (x fastest). Collectives (shfl, vote, ldmatrix,
//   mma) rendezvous the lanes of their member mask and are computed once all have arrived,
//   bit-exactly per the PTX ISA. All lanes must come with the same mask from the same call site
//   (return address of the emulator entry point: distinct after inlining); anything else is a
//   divergent collective and throws.
// - cp.async captures the source at issue, poisons the destination (0xFF; plus ASan poisoning
//   for 16-byte copies) and lands the data at the cp.async.wait_group that retires its group
//   (a store into the destination meanwhile is reported there). Copies still pending when a
//   thread exits land at its exit.
// - Atomics, ld.acquire / red.release / st.release: std::atomic_ref (C++20) on host memory.
//
// Faults throw simt::Error (a std::runtime_error) from the launch, e.g.
//   simt: divergent mma.m16n8k16 at call site 0x7f..: lanes 0x0000ffff (first: block (0,0,0),
//   thread (0,0,0) [warp 0, lane 0]) wait in mma.m16n8k16 at call site 0x7f.. (...)
//   (block (0,0,0), thread (16,0,0) [warp 0, lane 16])
// With W4K_SIMT_ABORT=1 the emulator prints the message and aborts on the faulting fiber's stack
// instead (run under gdb to see the kernel frame). Kernel exceptions are rethrown likewise.
#pragma once

#if __cplusplus < 202002L
#error "the SIMT emulator needs C++20 (std::atomic_ref); torch extensions build with -std=c++20"
#endif

#include <atomic>
#include <cstdint>

#include "simt/bitops.h"
#include "simt/collectives.h"
#include "simt/cuda_types.h"
#include "simt/launch.h"
#include "simt/memory.h"
#include "simt/runtime.h"

// ---- CUDA keywords ----
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ thread_local
#define __constant__
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define W4K_EXTERN_SHARED(type, name) \
  type* const name = reinterpret_cast<type*>(::simt::current_block().smem)

#define threadIdx (::simt::tl_fiber->thread_idx)
#define blockIdx (::simt::tl_fiber->block->block_idx)
#define blockDim (::simt::tl_fiber->block->block_dim)
#define gridDim (::simt::tl_fiber->block->grid_dim)
constexpr int warpSize = 32;

#define W4K_LAUNCH(kernel, grid, block, smem_bytes, stream, ...) \
  ::simt::launch(kernel, grid, block, smem_bytes, stream, __VA_ARGS__)

// The call site identifying a collective / barrier: where the (inlined) kernel code called the
// non-inlined emulator entry point.
#define W4K_SIMT_SITE __builtin_return_address(0)
#define W4K_SIMT_ENTRY __attribute__((noinline))

// ---- barriers and fences ----
W4K_SIMT_ENTRY inline void __syncthreads() {
  ::simt::barrier_arrive(0, ::simt::current_block().nthreads, W4K_SIMT_SITE, true);
}
W4K_SIMT_ENTRY inline int __syncthreads_count(int pred) {
  return ::simt::barrier_arrive(0, ::simt::current_block().nthreads, W4K_SIMT_SITE, true, pred);
}
W4K_SIMT_ENTRY inline int __syncthreads_and(int pred) {
  return ::simt::barrier_arrive(0, ::simt::current_block().nthreads, W4K_SIMT_SITE, true, pred) ==
         ::simt::current_block().nthreads;
}
W4K_SIMT_ENTRY inline int __syncthreads_or(int pred) {
  return ::simt::barrier_arrive(0, ::simt::current_block().nthreads, W4K_SIMT_SITE, true, pred) !=
         0;
}
W4K_SIMT_ENTRY inline void __syncwarp(unsigned mask = 0xffffffffu) {
  ::simt::rendezvous("__syncwarp", &::simt::syncwarp_compute, mask, nullptr, nullptr, nullptr);
}
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }

// ---- warp shuffles and votes ----
template <class T>
W4K_SIMT_ENTRY T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32) {
  return ::simt::shfl<::simt::ShflMode::Idx>("__shfl_sync", mask, var, src_lane, width,
                                             W4K_SIMT_SITE);
}
template <class T>
W4K_SIMT_ENTRY T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32) {
  return ::simt::shfl<::simt::ShflMode::Up>("__shfl_up_sync", mask, var, int(delta), width,
                                            W4K_SIMT_SITE);
}
template <class T>
W4K_SIMT_ENTRY T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32) {
  return ::simt::shfl<::simt::ShflMode::Down>("__shfl_down_sync", mask, var, int(delta), width,
                                              W4K_SIMT_SITE);
}
template <class T>
W4K_SIMT_ENTRY T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32) {
  return ::simt::shfl<::simt::ShflMode::Bfly>("__shfl_xor_sync", mask, var, lane_mask, width,
                                              W4K_SIMT_SITE);
}
W4K_SIMT_ENTRY inline unsigned __ballot_sync(unsigned mask, int pred) {
  return ::simt::ballot("__ballot_sync", mask, pred, W4K_SIMT_SITE);
}
W4K_SIMT_ENTRY inline int __any_sync(unsigned mask, int pred) {
  return ::simt::ballot("__any_sync", mask, pred, W4K_SIMT_SITE) != 0;
}
W4K_SIMT_ENTRY inline int __all_sync(unsigned mask, int pred) {
  return ::simt::ballot("__all_sync", mask, pred, W4K_SIMT_SITE) == mask;
}
// Lanes of the calling warp that have not exited (the emulator runs no lane "inactive").
inline unsigned __activemask() {
  const auto& w = ::simt::current_block().warps[::simt::current().warp];
  return w.valid & ~w.exited;
}

// ---- atomics (device-wide, sequentially consistent) ----
#define W4K_SIMT_ATOMIC(name, T, expr)                                    \
  W4K_SIMT_ENTRY inline T name(T* p, T v) {                               \
    return ::simt::atomic_rmw(                                            \
        p, [v](T old) -> T { return (void)old, (expr); }, W4K_SIMT_SITE); \
  }
W4K_SIMT_ATOMIC(atomicAdd, int, old + v)
W4K_SIMT_ATOMIC(atomicAdd, unsigned, old + v)
W4K_SIMT_ATOMIC(atomicAdd, unsigned long long, old + v)
W4K_SIMT_ATOMIC(atomicAdd, float, old + v)
W4K_SIMT_ATOMIC(atomicAdd, double, old + v)
W4K_SIMT_ATOMIC(atomicSub, int, old - v)
W4K_SIMT_ATOMIC(atomicSub, unsigned, old - v)
W4K_SIMT_ATOMIC(atomicExch, int, v)
W4K_SIMT_ATOMIC(atomicExch, unsigned, v)
W4K_SIMT_ATOMIC(atomicExch, unsigned long long, v)
W4K_SIMT_ATOMIC(atomicExch, float, v)
W4K_SIMT_ATOMIC(atomicMax, int, old < v ? v : old)
W4K_SIMT_ATOMIC(atomicMax, unsigned, old < v ? v : old)
W4K_SIMT_ATOMIC(atomicMin, int, v < old ? v : old)
W4K_SIMT_ATOMIC(atomicMin, unsigned, v < old ? v : old)
W4K_SIMT_ATOMIC(atomicAnd, int, old& v)
W4K_SIMT_ATOMIC(atomicAnd, unsigned, old& v)
W4K_SIMT_ATOMIC(atomicOr, int, old | v)
W4K_SIMT_ATOMIC(atomicOr, unsigned, old | v)
W4K_SIMT_ATOMIC(atomicXor, int, old ^ v)
W4K_SIMT_ATOMIC(atomicXor, unsigned, old ^ v)
#undef W4K_SIMT_ATOMIC
#define W4K_SIMT_ATOMIC_CAS(T)                                                            \
  W4K_SIMT_ENTRY inline T atomicCAS(T* p, T compare, T v) {                               \
    return ::simt::atomic_rmw(                                                            \
        p, [compare, v](T old) -> T { return old == compare ? v : old; }, W4K_SIMT_SITE); \
  }
W4K_SIMT_ATOMIC_CAS(int)
W4K_SIMT_ATOMIC_CAS(unsigned)
W4K_SIMT_ATOMIC_CAS(unsigned long long)
#undef W4K_SIMT_ATOMIC_CAS

// ---- plain loads with cache hints ----
template <class T>
inline T __ldg(const T* p) {
  return *p;
}
// fp32 arithmetic with one IEEE rounding each, never contracted into an fma (the host build
// has no -mfma; the functions exist so kernels can say "no fma here" on nvcc too).
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
// ld.global.cg (L2 only, no stale L1 line): the emulator has one coherent memory.
template <class T>
inline T __ldcg(const T* p) {
  return *p;
}
