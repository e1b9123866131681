// Calls every wrapper of csrc/kernels/ptx.cuh once, plus the cuda_compat.cuh macros, so that
// tests/test_simt_emulator.py can check the nvcc side compiles (sm_80, sm_90) and emits each
// instruction. Compiled by nvcc only (the .cu suffix keeps it out of the g++ self-test build).
#include "kernels/ptx.cuh"

__global__ void all_wrappers(const int4* g, float* out, int* locks, uint32_t sel) {
  W4K_EXTERN_SHARED(int4, sh);
  using namespace w4k;
  const unsigned t = threadIdx.x;
  uint32_t a[4] = {t, 1, 2, 3}, b[2] = {4, 5}, r[4];
  float c[4] = {0, 0, 0, 0};
  ptx::cp_async16_ca(&sh[t], &g[t]);
  ptx::cp_async16_cg(&sh[t + 32], &g[t]);
  ptx::cp_async16_cg_pred(&sh[t + 64], &g[t], t & 1);
  ptx::cp_async16_cg_zfill(&sh[t + 96], &g[t], t & 2);
  ptx::cp_async4_ca(reinterpret_cast<int*>(&sh[t + 128]), reinterpret_cast<const int*>(g));
  const uint64_t policy = ptx::createpolicy_evict_first();
  const ptx::HintDst dst = ptx::hint_dst(&sh[t + 160]);
  ptx::cp_async16_cg_hint(dst, &g[t], policy);
  ptx::cp_async16_cg_zfill_hint(dst + 32 * 16, &g[t], t & 4, policy);
  ptx::cp_async_commit_group();
  ptx::cp_async_wait_group<1>();
  ptx::cp_async_wait_group<0>();
  ptx::cp_async_wait_all();
  __syncthreads();
  ptx::ldmatrix_x1(r, &sh[t]);
  ptx::ldmatrix_x2(r, &sh[t]);
  ptx::ldmatrix_x4(r, &sh[t]);
  ptx::ldmatrix_x1_trans(r, &sh[t]);
  ptx::ldmatrix_x2_trans(r, &sh[t]);
  ptx::ldmatrix_x4_trans(r, &sh[t]);
  a[0] ^= r[0] + r[3];
  ptx::mma_m16n8k16_f16f32(a, b, c);
  ptx::mma_m16n8k16_bf16f32(a, b, c);
  uint32_t x = ptx::lop3<0x96>(a[0], a[1], b[0]) + ptx::prmt(a[0], a[1], sel);
  if (t == 0) {
    while (ptx::ld_acquire_gpu(&locks[0]) != int(blockIdx.x)) {
    }
    ptx::red_release_gpu_add(&locks[1], 1);
    ptx::st_release_gpu(&locks[0], blockIdx.x + 1);
  }
  ptx::barrier_sync(1, 32);
  half2 h = __floats2half2_rn(c[0], c[1]);
  h = __hfma2(h, h, h);
  __nv_bfloat162 bh = __floats2bfloat162_rn(c[2], c[3]);
  bh = __hfma2(bh, bh, bh);
  x += __shfl_xor_sync(0xffffffffu, x, 1) + __ballot_sync(0xffffffffu, x & 1);
  out[t] = c[0] + c[1] + c[2] + c[3] + float(x) + __low2float(h) + __low2float(bh);
}

cudaError_t launch_all_wrappers(const int4* g, float* out, int* locks, cudaStream_t stream) {
  auto* kernel = &all_wrappers;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 160 * 16);
  W4K_LAUNCH(kernel, dim3(2), dim3(32), 160 * 16, stream, g, out, locks, 0x3210u);
  return cudaGetLastError();
}
