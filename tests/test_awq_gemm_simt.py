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
* Configurations: M on both sides of every per-M tile (16 / 32 / 64 rows), every group path
  (k-tiles of 128 and 64 rows, groups of 32 and of 96, 160 in 64-row k-tiles with a last
  k-tile of 32 rows when K % 64 == 32, the general per-row path on 32-row k-tiles),
  N = 64 x odd (partial 256- and 128-column tiles), large K with many splits.
* Schedules: every split path gives the same bits under the forward, reverse and shuffle thread
  orders and with 1 or 4 concurrently running blocks (the last-arriving split, not a fixed one,
  sums the partials: the sum order must not depend on which block arrives last).
* Dispatch: from W4K_AWQ_DEQUANT_THRESHOLD rows on, awq_dequantize + matmul (both sides tested).
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
@pytest.mark.parametrize("size_k,group_size",
                         [(96, 32), (160, 32), (128, 32), (128, 64), (256, 128), (288, 96)])
def test_identity_gives_dequantized_weight(dtype, size_k, group_size):
    """x = I (K x K): each output is one product 1 * w[k, n] in fp32, rounded back to the dtype:
    exactly awq_dequantize's output, which pins the nibble order and the weight rounding (on each
    k-tile path; scales from subnormal to large, both signs, so that every rounding shows)."""
    _, qw, s, qz = _case(1, size_k, 136, group_size, dtype, seed=5)
    gen = torch.Generator().manual_seed(size_k)
    mag = torch.exp2(torch.randint(-24, 10, s.shape, generator=gen).to(torch.float32))
    s = (s.float() * mag).to(dtype)
    s[:, 1::3] = -s[:, 1::3]
    x = torch.eye(size_k, dtype=dtype)
    for split in (1, 3):
        out = simt().op("awq_gemm")(x, qw, s, qz, split)
        assert golden.same_bits(out, reference.awq_dequantize(qw, s, qz))


# ---- per-M configurations, group paths, splits ----------------------------------------------

M_ALL_CONFIGS = [1, 7, 8, 9, 16, 17, 33, 64, 65, 200]  # 16 / 32 / 64-row tiles, their edges


@pytest.mark.parametrize("group_size", [128, 64, 32, -1])
@pytest.mark.parametrize("size_m", M_ALL_CONFIGS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_every_config(dtype, size_m, group_size):
    """K = 256: group 128 and per-channel take 128-row k-tiles, 64 and 32 their own; N = 192 =
    64 x 3 leaves the 256-column tile (M <= 32) and the second 128-column tile (M > 32)
    partial."""
    _check(*_case(size_m, 256, 192, group_size, dtype, seed=size_m + group_size), 2)


@pytest.mark.parametrize("size_k,group_size,split", [(384, 96, 3), (480, 160, 4)])
@pytest.mark.parametrize("size_m", M_ALL_CONFIGS)
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_long_groups_every_config(dtype, size_m, size_k, group_size, split):
    """Groups of 96 and 160 (odd multiples of 32) on 64-row k-tiles: each 32-row half of a stage
    counts its own group, so a group ends in the middle of a k-tile every 3 or 5 halves; K = 480
    ends in a 32-row k-tile."""
    _check(*_case(size_m, size_k, 192, group_size, dtype, seed=size_m + group_size), split)


@pytest.mark.parametrize("split", range(1, 9))
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_large_k_many_splits(dtype, split):
    """K = 4096 (32 k-tiles of 128 rows), N = 320 = 64 x 5: up to 8 splits of a long K."""
    _check(*_case(5, 4096, 320, 128, dtype, seed=split), split)


# Each split path: (M, K, N, group size, split_k_iters): k-tile 128, 64, 32, the general path
# (group 24 and a K tail), each with one split and several.
SPLIT_PATHS = [
    (9, 512, 192, 128, 1), (9, 512, 192, 128, 4), (20, 512, 320, -1, 3),
    (40, 256, 192, 64, 4), (3, 256, 64, 64, 2),
    (17, 256, 192, 32, 8), (70, 128, 128, 32, 3),
    (5, 200, 136, 40, 1), (12, 216, 72, 24, 5), (33, 216, 200, 8, 4),
    # groups spanning several k-tiles, splits starting inside a group (k-tile 128, 64, 32)
    (9, 1024, 192, 256, 3), (6, 576, 128, 192, 5), (7, 384, 64, 96, 3),
    # groups of 32 with K % 64 == 32: 64-row k-tiles, K's last one of 32 rows (only k-tile,
    # fetched by the prologue, by the tail after the steady-state loop, in one of 3 / 9 splits)
    (1, 32, 64, 32, 1), (5, 96, 64, 32, 2), (17, 672, 192, 32, 1), (40, 608, 128, 32, 3),
    (3, 1056, 320, 32, 16),
    # groups of 96, 160 (64-row k-tiles, one counted scales/qzeros row per 32-row half): splits
    # starting inside a group and inside a half's group, K % 64 == 32, every M tile
    (3, 288, 64, 96, 2), (5, 480, 128, 160, 4), (20, 480, 256, 160, 1), (40, 672, 128, 96, 3),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_split_paths_bit_identical_across_schedules(dtype, monkeypatch):
    """Same bits under every thread order and block concurrency, and on repeated calls (the
    arrival counters are reset by the kernel, the scratch is reused in place)."""
    cases = [_case(*shape[:4], dtype, seed=i) for i, shape in enumerate(SPLIT_PATHS)]
    op = simt().op("awq_gemm")
    first = None
    for schedule, workers in [("forward", "4"), ("reverse", "1"), ("shuffle", "4"),
                              ("shuffle", "1"), ("reverse", "4")]:
        monkeypatch.setenv("W4K_SIMT_SCHEDULE", schedule)
        monkeypatch.setenv("W4K_SIMT_SEED", "7")
        monkeypatch.setenv("W4K_SIMT_WORKERS", workers)
        outs = [op(*c, shape[4]) for c, shape in zip(cases, SPLIT_PATHS)]
        if first is None:
            first = outs
            for c, shape, out in zip(cases, SPLIT_PATHS, outs):
                x, qw, s, qz = c
                assert_gemm_close(out, reference.awq_gemm(x, qw, s, qz), x,
                                  reference.awq_dequantize(qw, s, qz))
        for shape, out, ref in zip(SPLIT_PATHS, outs, first):
            assert golden.same_bits(out, ref), (schedule, workers, shape)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_scratch_bound_caps_the_splits(dtype):
    """M = 65, N = 2048: 8 splits would need 8 MiB of fp32 scratch, the plan keeps 4 (4 MiB)."""
    _check(*_case(65, 256, 2048, 32, dtype, seed=1), 8)


# ---- dispatch: dequantize + matmul from the token threshold on ------------------------------


@pytest.mark.parametrize("size_m", [7, 8, 9])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_dequant_threshold_both_sides(dtype, size_m, monkeypatch):
    """W4K_AWQ_DEQUANT_THRESHOLD=8: M = 7 runs the tensor-core kernel, M = 8 and 9 the emulated
    awq_dequantize + a CPU matmul; both meet the same error bound."""
    monkeypatch.setenv("W4K_AWQ_DEQUANT_THRESHOLD", "8")
    _check(*_case(size_m, 256, 192, 64, dtype, seed=size_m), 4)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_dequant_path_identity(dtype, monkeypatch):
    """x = I on the dequantize + matmul path (M = K = 96 >= threshold 8): out is awq_dequantize's
    output bit for bit, as on the kernel path."""
    monkeypatch.setenv("W4K_AWQ_DEQUANT_THRESHOLD", "8")
    _, qw, s, qz = _case(1, 96, 136, 32, dtype, seed=5)
    out = simt().op("awq_gemm")(torch.eye(96, dtype=dtype), qw, s, qz, 2)
    assert golden.same_bits(out, reference.awq_dequantize(qw, s, qz))


def test_dequant_threshold_default_is_vllms(monkeypatch):
    """Unset or unparsable, the threshold is vLLM's 256: M = 255 (kernel) and M = 256
    (dequantize + matmul) both meet the reference's error bound."""
    monkeypatch.delenv("W4K_AWQ_DEQUANT_THRESHOLD", raising=False)
    for size_m in (255, 256):
        _check(*_case(size_m, 64, 64, 32, torch.float16, seed=size_m), 1)
    monkeypatch.setenv("W4K_AWQ_DEQUANT_THRESHOLD", "not-a-number")
    _check(*_case(255, 64, 64, 32, torch.float16, seed=2), 1)
