"""Hostile sizes: dimensions so large that the byte counts derived from them would wrap around
int64 (and come back as small sizes a later check accepts) are rejected up front with a message
naming the argument and the bound; NaN clamp bounds are rejected by the ops and the reference
alike. Regressions for the reliability issue's cases."""

import math

import pytest
import torch

from w4kernels import ops, reference

MAX_DIM = 2**31 - 1


@pytest.mark.parametrize("call,message", [
    (lambda: ops.rhs_packed_size_qsi4cxp(2**62, 128), r"rhs_packed_size_qsi4cxp: n must be <= "),
    (lambda: ops.rhs_packed_size_qsi4cxp(2**63 - 1, 128), r"n must be <= 2147483647, got "),
    (lambda: ops.rhs_packed_size_qsi4c32p(64, 2**40, 32), r"k must be <= 2147483647"),
    (lambda: ops.lhs_packed_size_qai8dxp(2**61 + 1, 131072), r"m must be <= 2147483647"),
    (lambda: ops.lhs_packed_size_qai8dxp(4, 128, mr=2**31), r"mr must be <= 256, got 2147483648"),
    (lambda: ops.rhs_packed_size_qsi4cxp(64, 128, kr=2**40, sr=2**36), r"kr must be <= 256"),
], ids=["n-2^62", "n-int64max", "k-2^40", "m-2^61", "mr-2^31", "kr-2^40"])
def test_size_queries_reject_wrapping_sizes(call, message):
    with pytest.raises(RuntimeError, match=message):
        call()


def test_size_queries_at_the_bound_do_not_wrap():
    """The largest accepted sizes give the exact (positive, monotone) byte counts."""
    n = MAX_DIM
    size = ops.rhs_packed_size_qsi4cxp(n, MAX_DIM)
    k_i = (MAX_DIM + 31) // 32 * 32
    assert size == (n + 7) // 8 * 8 * (k_i // 2 + 12)
    assert ops.lhs_packed_size_qai8dxp(MAX_DIM, MAX_DIM) == MAX_DIM * (k_i + 8)


def test_lhs_quant_pack_rejects_huge_mr_by_name():
    with pytest.raises(RuntimeError, match=r"lhs_quant_pack_qai8dxp_f32: mr must be <= 256, got "):
        ops.lhs_quant_pack_qai8dxp_f32(torch.randn(2, 64), mr=2**31)


@pytest.mark.parametrize("namespace", ["w4kernels", "w4kernels_simt"])
def test_marlin_sizes_are_bounded(namespace):
    """No shape error with an overflowed expected size (e.g. [16, -9223372036854775808])."""
    import w4kernels
    if namespace == "w4kernels_simt" and not w4kernels.HAS_SIMT:
        pytest.skip("simt backend: w4kernels._simt was not built (W4K_SIMT=0)")
    op = getattr(torch.ops, namespace).marlin_repack
    with pytest.raises(RuntimeError, match=r"marlin_repack: size_n must be <= 2147483647, got "):
        op(torch.zeros(2, 64, dtype=torch.int32), None, 16, 2**62, 4)


@pytest.mark.parametrize("bound", ["clamp_min", "clamp_max"])
def test_nan_clamp_bounds_are_rejected_by_op_and_reference(bound):
    m, n, k = 2, 8, 64
    gen = torch.Generator().manual_seed(0)
    rhs = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=gen)
    scale = torch.rand(n, generator=gen) + 0.5
    rhs_packed = ops.rhs_pack_nxk_qsi4cxp_qs4cxs1s0(rhs, scale, None, n, k)
    lhs_packed = ops.lhs_quant_pack_qai8dxp_f32(torch.randn(m, k, generator=gen))
    kwargs = {bound: math.nan}
    with pytest.raises(RuntimeError, match=rf"{bound} must not be NaN"):
        ops.matmul_clamp_f32_qai8dxp_qsi4cxp(lhs_packed, rhs_packed, m, n, k, **kwargs)
    with pytest.raises(ValueError, match=rf"{bound} must not be NaN"):
        reference.matmul_clamp_f32_qai8dxp_qsi4cxp(lhs_packed, rhs_packed, m, n, k, **kwargs)
