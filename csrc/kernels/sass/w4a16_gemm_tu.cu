// Torch-free translation unit for SASS measurement (scripts/sass_report.sh): instantiates the
// w4a16_gemm launchers for both dtypes, i.e. every kernel configuration.
#include "kernels/w4a16_gemm.cuh"

template cudaError_t w4k::w4a16_gemm_plan<half>(int64_t, int64_t, int64_t, int64_t, bool, bool,
                                                int, int64_t, int64_t, W4a16Plan*, int64_t);
template cudaError_t w4k::w4a16_gemm_plan<__nv_bfloat16>(int64_t, int64_t, int64_t, int64_t,
                                                         bool, bool, int, int64_t, int64_t,
                                                         W4a16Plan*, int64_t);
template cudaError_t w4k::launch_w4a16_gemm<half>(const W4a16Plan&, const half*, int64_t,
                                                  const uint32_t*, const half*, const uint32_t*,
                                                  const int32_t*, const int32_t*, half*, int*,
                                                  const half*, half*, int64_t, int64_t, int64_t,
                                                  int64_t, float*, int*, half*, cudaStream_t);
template cudaError_t w4k::launch_w4a16_gemm<__nv_bfloat16>(
    const W4a16Plan&, const __nv_bfloat16*, int64_t, const uint32_t*, const __nv_bfloat16*,
    const uint32_t*, const int32_t*, const int32_t*, __nv_bfloat16*, int*, const __nv_bfloat16*,
    __nv_bfloat16*, int64_t, int64_t, int64_t, int64_t, float*, int*, __nv_bfloat16*,
    cudaStream_t);
