"""The CUDA kernel of awq_gemm (csrc/kernels/awq_gemm.cuh) under the SIMT emulator, on the shapes
and options that exercise its structure, beyond tests/test_awq.py (which runs its numerical
parametrization on 'simt' too, with split_k_iters = 8).

* Numerics: against ``reference.awq_gemm`` (float64) within the fp32-accumulation bound of
  tests/numerics.py: M tile masking (M = 1, 3, 16, 33, 128 and 65, 130 across 64-row tiles), N
  not a multiple of the 64-column tile, K not a multiple of the 32-row k-tile, groups smaller than
  or not aligned with a k-tile, split_k_iters 1, 2, 8 and more splits than k-tiles, strided x.
* Split-K determinism: the fp32 partials are added in a fixed order, so repeated calls give
  identical bits; and one split computes each output from a single fp32 accumulator chain per
  tile, so the result must not depend on the split count by more than the error bound.
* Exactness: x = I gives out = the dequantized weight bit for bit (one product per output).
"""

import pytest
import torch

import golden
from conftest import backend_or_skip
from numerics import assert_gemm_close
from test_awq import _random_awq
from w4kernels import reference

DTYPES = [torch.float16, torch.bfloat16]


def simt():
    return backend_or_skip("simt", "awq_gemm")


def _case(size_m, size_k, size_n, group_size, dtype, seed):
    groups = 1 if group_size == -1 else size_k // group_size
    qw, s, qz = _random_awq(size_k, size_n, groups, dtype, seed=seed)
    s[0, :5] = -s[0, :5]  # negative scales: q == z still dequantizes to +0
    x = torch.randn(size_m, size_k, generator=torch.Generator().manual_seed(seed + 1)).to(dtype)
    return x, qw, s, qz


def _check(x, qw, s, qz, split):
    out = simt().op("awq_gemm")(x, qw, s, qz, split)
    assert out.dtype == x.dtype and out.shape == (x.shape[0], s.shape[1])
    assert_gemm_close(out, reference.awq_gemm(x, qw, s, qz), x, reference.awq_dequantize(qw, s, qz))
    return out


@pytest.mark.parametrize("split", [1, 2, 8])
@pytest.mark.parametrize("group_size", [32, 64, 128, -1])
@pytest.mark.parametrize("size_m", [1, 3, 16, 33, 128])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_tiles_groups_splits(dtype, size_m, group_size, split):
    _check(*_case(size_m, 256, 128, group_size, dtype, seed=size_m + split), split)


@pytest.mark.parametrize("size_m,size_k,size_n,group_size,split", [
    (65, 64, 64, 32, 1),     # M ends one row into the second 64-row tile
    (130, 96, 72, 32, 2),    # N = 72: a 64-column tile plus one masked 8-column tile
    (5, 48, 200, 16, 2),     # K = 48: a partial k-tile; groups of 16 inside a k-tile
    (7, 40, 8, 8, 3),        # N = 8, groups of 8, K tail of 8 rows
    (9, 96, 136, 24, 4),     # groups of 24 straddle the 32-row k-tiles
    (4, 64, 64, 64, 32),     # more splits than k-tiles (2): the empty splits are dropped
    (2, 33, 16, 11, 5),      # odd K and group size: element-wise A loads, k >= K zero-filled
])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_edges(dtype, size_m, size_k, size_n, group_size, split):
    _check(*_case(size_m, size_k, size_n, group_size, dtype, seed=size_k + size_n), split)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_strided_x(dtype):
    """x a column slice of a wider buffer (row stride 200, offset not 16-byte aligned)."""
    _, qw, s, qz = _case(6, 128, 64, 32, dtype, seed=3)
    wide = torch.randn(6, 200, generator=torch.Generator().manual_seed(4)).to(dtype)
    x = wide[:, 3:131]
    out = _check(x, qw, s, qz, 2)
    assert golden.same_bits(out, simt().op("awq_gemm")(x.contiguous(), qw, s, qz, 2))


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_deterministic_split_k(dtype):
    x, qw, s, qz = _case(33, 512, 128, 64, dtype, seed=11)
    op = simt().op("awq_gemm")
    first = op(x, qw, s, qz, 8)
    for _ in range(2):
        assert golden.same_bits(op(x, qw, s, qz, 8), first)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_identity_gives_dequantized_weight(dtype):
    """x = I (K x K): each output is one product 1 * w[k, n] in fp32, rounded back to the dtype:
    exactly awq_dequantize's output, which pins the nibble order and the weight rounding."""
    _, qw, s, qz = _case(1, 96, 136, 32, dtype, seed=5)
    x = torch.eye(96, dtype=dtype)
    for split in (1, 3):
        out = simt().op("awq_gemm")(x, qw, s, qz, split)
        assert golden.same_bits(out, reference.awq_dequantize(qw, s, qz))
