"""Error bounds for GEMM results checked against a float64 reference.

A kernel that rounds the weights exactly as the reference does (the reference dequantizes in
the activation dtype too) and accumulates K products in fp32 can differ from the float64 result
by at most ``gamma_K * sum_k |a[m,k] * w[k,n]|`` with ``gamma_K ~= K * 2^-24`` (the standard
bound for recursive summation; blocked or pairwise orders only do better), plus the final
rounding of the output to fp16 (2^-11 relative) or bf16 (2^-8 relative).
"""

import torch

UNIT_ROUNDOFF = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8, torch.float32: 2.0**-24}


def gemm_error_bound(a: torch.Tensor, w: torch.Tensor, ref: torch.Tensor,
                     out_dtype: torch.dtype, terms: int | None = None) -> torch.Tensor:
    """Elementwise bound on |kernel - ref| for out = a @ w (a [M, K], w [K, N] as float64).
    ``terms``: fp32 additions per output when the kernel sums more than the K products (the
    AMX path's fp16 split adds 4 exact partial products per product, whose magnitudes sum to
    |a * w|); default K."""
    size_k = a.shape[1] if terms is None else terms
    absprod = a.double().abs() @ w.double().abs()
    return (size_k * 2.0**-24) * absprod + UNIT_ROUNDOFF[out_dtype] * ref.abs() + 1e-30


def assert_gemm_close(out: torch.Tensor, ref: torch.Tensor, a: torch.Tensor, w: torch.Tensor,
                      terms: int | None = None):
    bound = gemm_error_bound(a, w, ref, out.dtype, terms)
    err = (out.double().cpu() - ref).abs()
    worst = (err / bound).max().item()
    assert worst <= 1.0, f"error exceeds the fp32-accumulation bound by {worst:.3g}x " \
                         f"(max abs err {err.max().item():.3g})"
