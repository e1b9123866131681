// All inline PTX of w4kernels: one small wrapper per instruction. On nvcc each is an
// `asm volatile`; under the SIMT emulator (W4K_SIMT=1) the same name calls the emulator's
// model of the instruction (csrc/simt/), which follows the PTX ISA bit for bit and checks the
// instruction's requirements (convergence, alignment, shared-memory operands).
//
// Nothing else in csrc/ may contain asm (CI greps for it).
#pragma once

#include <cstdint>

#include "kernels/cuda_compat.cuh"

#if W4K_SIMT
// The wrappers must inline into the kernel so that the emulator sees each kernel call site as
// a distinct collective call site.
#define W4K_PTX __attribute__((always_inline)) inline
#else
#define W4K_PTX __device__ __forceinline__
#endif

namespace w4k {
namespace ptx {

#if !W4K_SIMT
// 32-bit shared-state-space address of a generic pointer into shared memory.
W4K_PTX uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
#endif

// ---------------------------------------------------------------------------------------------
// threadIdx.x read afresh (mov from %tid.x, volatile): values derived from it after a long loop
// are recomputed there instead of being kept in registers (or spilled) across the loop, which
// a plain threadIdx.x read (a common subexpression to the compiler) does not ensure.
W4K_PTX int thread_index_x() {
#if W4K_SIMT
  return static_cast<int>(threadIdx.x);
#else
  int t;
  asm volatile("mov.u32 %0, %%tid.x;\n" : "=r"(t));
  return t;
#endif
}

// ---------------------------------------------------------------------------------------------
// Tensor core mma: D = A*B + C, m16n8k16, A row-major, B column-major ("row.col"), f32
// accumulators in place (c is read and written). Fragment layout, g = lane/4, t = lane%4:
//   a[0] = A[g][2t..2t+1], a[1] = A[g+8][2t..2t+1], a[2] = A[g][2t+8..], a[3] = A[g+8][2t+8..]
//   b[0] = B[2t..2t+1][g], b[1] = B[2t+8..2t+9][g]
//   c[0..1] = C[g][2t..2t+1], c[2..3] = C[g+8][2t..2t+1]
// All 32 lanes of the warp must execute the same mma.

// fp16 inputs.
W4K_PTX void mma_m16n8k16_f16f32(const uint32_t a[4], const uint32_t b[2], float c[4]) {
#if W4K_SIMT
  simt::mma_m16n8k16<simt::__half>("mma.m16n8k16.f32.f16", a, b, c);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// bf16 inputs (same fragment layout).
W4K_PTX void mma_m16n8k16_bf16f32(const uint32_t a[4], const uint32_t b[2], float c[4]) {
#if W4K_SIMT
  simt::mma_m16n8k16<simt::__nv_bfloat16>("mma.m16n8k16.f32.bf16", a, b, c);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// ---------------------------------------------------------------------------------------------
// ldmatrix: loads 1/2/4 8x8 matrices of b16 from shared memory into the mma fragment layout.
// Lane 8i+r gives the 16-byte aligned shared address of row r of matrix i (lanes beyond the
// matrices used are ignored); lane t gets r[i] = M_i[t/4][2(t%4) .. 2(t%4)+1] (.trans: the
// same element pair of M_i transposed). Used for the A operand straight from shared memory.

W4K_PTX void ldmatrix_x1(uint32_t* r, const void* smem) {
#if W4K_SIMT
  simt::ldmatrix<1, false>("ldmatrix.x1", r, smem);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n"
               : "=r"(r[0]) : "r"(smem_addr(smem)));
#endif
}
W4K_PTX void ldmatrix_x2(uint32_t* r, const void* smem) {
#if W4K_SIMT
  simt::ldmatrix<2, false>("ldmatrix.x2", r, smem);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1]) : "r"(smem_addr(smem)));
#endif
}
W4K_PTX void ldmatrix_x4(uint32_t* r, const void* smem) {
#if W4K_SIMT
  simt::ldmatrix<4, false>("ldmatrix.x4", r, smem);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(smem)));
#endif
}
W4K_PTX void ldmatrix_x1_trans(uint32_t* r, const void* smem) {
#if W4K_SIMT
  simt::ldmatrix<1, true>("ldmatrix.x1.trans", r, smem);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n"
               : "=r"(r[0]) : "r"(smem_addr(smem)));
#endif
}
W4K_PTX void ldmatrix_x2_trans(uint32_t* r, const void* smem) {
#if W4K_SIMT
  simt::ldmatrix<2, true>("ldmatrix.x2.trans", r, smem);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1]) : "r"(smem_addr(smem)));
#endif
}
W4K_PTX void ldmatrix_x4_trans(uint32_t* r, const void* smem) {
#if W4K_SIMT
  simt::ldmatrix<4, true>("ldmatrix.x4.trans", r, smem);
#else
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(smem)));
#endif
}

// ---------------------------------------------------------------------------------------------
// cp.async: asynchronous global -> shared copies, completed by commit_group / wait_group.
// The data may only be read after the wait that retires its group (and a barrier if other
// threads read it). .ca caches in L1, .cg in L2 only (streamed weights).

// 16 bytes, cached in L1.
W4K_PTX void cp_async16_ca(void* smem, const void* glob) {
#if W4K_SIMT
  simt::cp_async("cp.async.ca 16", smem, glob, 16, false);
#else
  asm volatile("cp.async.ca.shared.global [%0], [%1], 16;\n"
               :: "r"(smem_addr(smem)), "l"(glob) : "memory");
#endif
}
#if !W4K_SIMT
// cp_async16_cg and cp_async16_cg_zfill below to a 32-bit shared address (also the hinted
// copies' form when built without hints).
W4K_PTX void cp_async16_cg_at(uint32_t smem, const void* glob) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"(smem), "l"(glob) : "memory");
}
W4K_PTX void cp_async16_cg_zfill_at(uint32_t smem, const void* glob, bool pred) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
               :: "r"(smem), "l"(glob), "r"(pred ? 16 : 0) : "memory");
}
#endif
// 16 bytes, bypassing L1.
W4K_PTX void cp_async16_cg(void* smem, const void* glob) {
#if W4K_SIMT
  simt::cp_async("cp.async.cg 16", smem, glob, 16, false);
#else
  cp_async16_cg_at(smem_addr(smem), glob);
#endif
}
// 16 bytes if pred, otherwise no copy at all (the destination keeps its old contents).
W4K_PTX void cp_async16_cg_pred(void* smem, const void* glob, bool pred) {
#if W4K_SIMT
  if (pred) simt::cp_async("cp.async.cg 16 (predicated)", smem, glob, 16, false);
#else
  asm volatile(
      "{\n"
      "  .reg .pred p;\n"
      "  setp.ne.b32 p, %0, 0;\n"
      "  @p cp.async.cg.shared.global [%1], [%2], 16;\n"
      "}\n" :: "r"(int(pred)), "r"(smem_addr(smem)), "l"(glob) : "memory");
#endif
}
// 16 bytes if pred, otherwise 16 zero bytes (src-size 0: the source is not read).
W4K_PTX void cp_async16_cg_zfill(void* smem, const void* glob, bool pred) {
#if W4K_SIMT
  simt::cp_async("cp.async.cg 16 (zfill)", smem, glob, 16, !pred);
#else
  cp_async16_cg_zfill_at(smem_addr(smem), glob, pred);
#endif
}
// L2 cache hints on the streamed weights (evict_first), on unless built with
// W4K_L2_CACHE_HINTS=0 (setup.py passes the environment variable of that name to nvcc).
// The first H100 run (driver 580.159, nvcc 13.0, sm_90 code, 2026-11-24) failed every GEMM with
// "an illegal instruction was encountered" at the hinted weight copies. The cause, read off the
// SASS since (and reported the same for Marlin with nvcc 13.1): where ptxas forms a hinted
// copy's shared address as [R + UR + imm] (the stage base in a uniform register), the LDGSTS
// names its cache-policy descriptor as desc[UR1], a uniform register nothing in the kernel
// writes. Where ptxas does materialize the descriptor it is a constant
// (createpolicy.fractional.L2::evict_first 1.0 becomes 0x12f00000'00000000). So the hinted
// copies take their shared destination as a HintDst made once per kernel by hint_dst(), whose
// address passes through a shfl (one instruction at the kernel's start): ptxas cannot split it
// into a uniform base and a per-thread offset, uses [R + imm] and materializes the descriptor
// (0 such LDGSTS in the build, 713 before). tests/test_cuda_sass.py checks on the compiled SASS
// that no global load of any kernel names a descriptor register the kernel never writes. The
// hint only orders L2 eviction: results do not depend on it (the emulator executes the hinted
// forms as plain copies).
#ifndef W4K_L2_CACHE_HINTS
#define W4K_L2_CACHE_HINTS 1
#endif

// An L2 cache policy that marks lines for eviction first: for data read once (streamed
// weights), so it does not push reused data (activations, scales) out of L2.
W4K_PTX uint64_t createpolicy_evict_first() {
#if W4K_SIMT || !W4K_L2_CACHE_HINTS
  return 0;  // the emulator has no cache; without hints the policy is unused
#else
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
#endif
}

// Shared destination of a hinted copy: a pointer under the emulator, a 32-bit shared address
// on the GPU; either moves on by adding a byte offset (hint_dst(p) + 512).
#if W4K_SIMT
using HintDst = char*;
#else
using HintDst = uint32_t;
#endif
// Made once per kernel from a thread's shared pointer (see the note above), by all 32 lanes of
// the warp together (a shfl.sync with the full mask): before any lane-dependent branch.
W4K_PTX HintDst hint_dst(void* p) {
#if W4K_SIMT
  return static_cast<char*>(p);
#elif W4K_L2_CACHE_HINTS
  return __shfl_sync(0xffffffffu, smem_addr(p), static_cast<int>(threadIdx.x) & 31);
#else
  return smem_addr(p);
#endif
}

// 16 bytes, bypassing L1, with an L2 cache policy (from createpolicy_*) on the global read.
W4K_PTX void cp_async16_cg_hint(HintDst smem, const void* glob, uint64_t policy) {
  (void)policy;
#if W4K_SIMT
  simt::cp_async("cp.async.cg 16 (L2 hint)", smem, glob, 16, false);
#elif !W4K_L2_CACHE_HINTS
  cp_async16_cg_at(smem, glob);
#else
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n"
               :: "r"(smem), "l"(glob), "l"(policy) : "memory");
#endif
}
// cp_async16_cg_zfill with an L2 cache policy (from createpolicy_*) on the global read.
W4K_PTX void cp_async16_cg_zfill_hint(HintDst smem, const void* glob, bool pred, uint64_t policy) {
  (void)policy;
#if W4K_SIMT
  simt::cp_async("cp.async.cg 16 (zfill, L2 hint)", smem, glob, 16, !pred);
#elif !W4K_L2_CACHE_HINTS
  cp_async16_cg_zfill_at(smem, glob, pred);
#else
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n"
               :: "r"(smem), "l"(glob), "r"(pred ? 16 : 0), "l"(policy) : "memory");
#endif
}
// 4 bytes, cached in L1 (cp.async.cg only supports 16).
W4K_PTX void cp_async4_ca(void* smem, const void* glob) {
#if W4K_SIMT
  simt::cp_async("cp.async.ca 4", smem, glob, 4, false);
#else
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n"
               :: "r"(smem_addr(smem)), "l"(glob) : "memory");
#endif
}
// Closes the current group of this thread's cp.async operations (possibly empty).
W4K_PTX void cp_async_commit_group() {
#if W4K_SIMT
  simt::cp_async_commit();
#else
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
// Waits until at most N of this thread's most recently committed groups are still pending.
template <int N>
W4K_PTX void cp_async_wait_group() {
  static_assert(N >= 0 && N <= 7, "cp.async.wait_group takes 0..7");
#if W4K_SIMT
  simt::cp_async_wait(N);
#else
  asm volatile("cp.async.wait_group %0;\n" :: "n"(N) : "memory");
#endif
}
// Commits the current group and waits for all groups (= commit_group + wait_group 0).
W4K_PTX void cp_async_wait_all() {
#if W4K_SIMT
  simt::cp_async_commit();
  simt::cp_async_wait(0);
#else
  asm volatile("cp.async.wait_all;\n" ::: "memory");
#endif
}

// ---------------------------------------------------------------------------------------------
// Bit manipulation.

// Any 3-input bitwise function: bit i of lut is the result for inputs (a, b, c) bits with
// i = 4a + 2b + c, i.e. lut = F(0xF0, 0xCC, 0xAA). Used to splice int4 nibbles into fp16
// exponents in one instruction.
template <int lut>
W4K_PTX uint32_t lop3(uint32_t a, uint32_t b, uint32_t c) {
  static_assert(lut >= 0 && lut <= 255, "lop3 LUT is 8 bits");
#if W4K_SIMT
  return simt::lop3(lut, a, b, c);
#else
  uint32_t r;
  asm volatile("lop3.b32 %0, %1, %2, %3, %4;\n" : "=r"(r) : "r"(a), "r"(b), "r"(c), "n"(lut));
  return r;
#endif
}

// Byte permute (default mode): bytes 0..7 are a's bytes 0..3 then b's bytes 0..3; result byte
// i is byte (s >> 4i) & 7, replaced by its sign bit replicated (0x00/0xFF) if (s >> 4i) & 8.
W4K_PTX uint32_t prmt(uint32_t a, uint32_t b, uint32_t selector) {
#if W4K_SIMT
  return simt::prmt(a, b, selector);
#else
  uint32_t r;
  asm volatile("prmt.b32 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(selector));
  return r;
#endif
}

// ---------------------------------------------------------------------------------------------
// Inter-block synchronization (split-K locks): acquire/release at GPU scope.

// Load with acquire semantics: later loads see what the releasing block wrote before its
// release. Spin on this (the emulator yields here; plain loads in a spin loop would hang it).
W4K_PTX int ld_acquire_gpu(const int* p) {
#if W4K_SIMT
  return simt::ld_acquire(p);
#else
  int v;
  asm volatile("ld.global.acquire.gpu.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
#endif
}
// Atomic add with release semantics, no return value.
W4K_PTX void red_release_gpu_add(int* p, int v) {
#if W4K_SIMT
  simt::red_release_add(p, v);
#else
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" :: "l"(p), "r"(v) : "memory");
#endif
}
// Store with release semantics.
W4K_PTX void st_release_gpu(int* p, int v) {
#if W4K_SIMT
  simt::st_release(p, v);
#else
  asm volatile("st.release.gpu.global.b32 [%0], %1;\n" :: "l"(p), "r"(v) : "memory");
#endif
}

// bar.sync id, nthreads: named barrier for a subset of the block (nthreads a multiple of 32).
W4K_PTX void barrier_sync(int id, int nthreads) {
#if W4K_SIMT
  simt::barrier_arrive(id, nthreads, nullptr, false);
#else
  asm volatile("bar.sync %0, %1;\n" :: "r"(id), "r"(nthreads) : "memory");
#endif
}

}  // namespace ptx
}  // namespace w4k

#undef W4K_PTX
