// Torch-free translation unit for SASS measurement (scripts/sass_report.sh): instantiates the
// awq_gemm launcher for both dtypes, i.e. every kernel configuration (3 M tiles x {k-tile 128,
// 64, 32, general group size}).
#include "kernels/awq_gemm.cuh"

template cudaError_t w4k::launch_awq_gemm<half>(const half*, int64_t, const uint32_t*, int64_t,
                                                const half*, const uint32_t*, int64_t, half*,
                                                float*, int*, int64_t, int64_t, int64_t, int64_t,
                                                const AwqGemmPlan&, cudaStream_t);
template cudaError_t w4k::launch_awq_gemm<__nv_bfloat16>(const __nv_bfloat16*, int64_t,
                                                         const uint32_t*, int64_t,
                                                         const __nv_bfloat16*, const uint32_t*,
                                                         int64_t, __nv_bfloat16*, float*, int*,
                                                         int64_t, int64_t, int64_t, int64_t,
                                                         const AwqGemmPlan&, cudaStream_t);
