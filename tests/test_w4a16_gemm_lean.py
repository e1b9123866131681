"""The register-lean 16-row kernel of w4a16_gemm (w4a16_gemm_lean_kernel in
csrc/kernels/w4a16_gemm.cuh, chosen per call with W4K_W4A16_CUDA_LEAN=1 at M <= 16) against the
default kernel: the same tile, warp split, pipeline and mma sequence, so the same bits.

* Emulator ('simt'): every scale path (per-channel with and without zero points, groups of
  32/64/128 with and without zero points, act-order in group order, act-order with a row out of
  group order, a row-parallel act-order shard), fp16 and bf16, M in {1, 7, 8, 9, 16}, N = 64 x 3
  (the second 128-column tile half empty), split-K (K = 1024: two splits of 4 stages on the
  emulated 8 SMs) and one split (K = 256, N = 64 x 5), under the forward, reverse and shuffle
  thread schedules: bit for bit the default kernel's output, and within the reference's bound.
* GPU ('cuda', skipped without one): the same cases; bits compared where neither kernel splits K
  (K <= 512: at most 4 stages). With more stages the lean plan may split K differently (it
  fills 3 blocks per SM, the default 2), which changes the fp32 summation order, so those are
  checked against the reference's bound only.
* The switch: read per call; "0" and unset give the default kernel.
"""

import pytest
import torch

import golden
from conftest import backend_or_skip
from test_w4a16_gemm import DTYPES, OP, call, check_against_reference, make_case
from test_w4a16_gemm_simt import rows_out_of_group_order

LEAN = "W4K_W4A16_CUDA_LEAN"
STAGE_K = 128  # rows per pipeline stage; K <= 4 stages never splits

# id -> (group size, act-order, zero points)
SCALE_PATHS = {
    "chan": (-1, None, False),
    "chan-zp": (-1, None, True),
    "g32": (32, None, False),
    "g32-zp": (32, None, True),
    "g64": (64, None, False),
    "g128": (128, None, False),
    "g128-zp": (128, None, True),
    "act-g128": (128, "k_full", False),       # act-order in group order: lean group path
    "act-g64-zp": (64, "k_full", True),
    "act-rows": (128, "unordered", False),    # a row out of group order: default row path
    "act-rows-zp": (64, "unordered", True),
    "shard-g64": (64, "shard", True),         # is_k_full = False: row-group path (default)
}


def lean_and_default(monkeypatch, backend, case):
    monkeypatch.setenv(LEAN, "1")
    lean = call(backend, case)
    assert int(case["workspace"].abs().sum()) == 0  # split-K counters left zero
    monkeypatch.delenv(LEAN)
    default = call(backend, case)
    return lean, default


def make(m, size_k, size_n, path, dtype, seed):
    group_size, act_order, zp = SCALE_PATHS[path]
    unordered = act_order == "unordered"
    case = make_case(m, size_k, size_n, group_size, dtype, "k_full" if unordered else act_order,
                     zp=zp, bias=True, seed=seed)
    if unordered:
        case = rows_out_of_group_order(case, group_size)
    return case


@pytest.mark.parametrize("schedule", ["forward", "reverse", "shuffle"])
@pytest.mark.parametrize("path", list(SCALE_PATHS))
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_lean_kernel_same_bits_split_k(monkeypatch, dtype, path, schedule):
    """Split-K (K = 1024), N = 64 x 3, M = 1, 7, 8, 9, 16: lean == default, bit for bit, under
    every emulator schedule; within the reference's bound."""
    b = backend_or_skip("simt", OP)
    monkeypatch.setenv("W4K_SIMT_SCHEDULE", schedule)
    monkeypatch.setenv("W4K_SIMT_SEED", "5")
    for m in (1, 7, 8, 9, 16):
        case = make(m, 1024, 192, path, dtype, seed=m + 17)
        lean, default = lean_and_default(monkeypatch, b, case)
        assert golden.same_bits(lean, default), f"M = {m}"
        if m in (1, 16):
            monkeypatch.setenv(LEAN, "1")
            check_against_reference(b, case)
            monkeypatch.delenv(LEAN)


@pytest.mark.parametrize("path", list(SCALE_PATHS))
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("backend", ["simt", "cuda"])
def test_lean_kernel_same_bits_one_split(monkeypatch, backend, dtype, path):
    """K = 256 (no split-K), N = 64 x 5 (three tiles, the last half empty), M = 1, 9, 16; on the
    GPU too (the same bits there: neither plan can split 2 stages)."""
    b = backend_or_skip(backend, OP)
    for m in (1, 9, 16):
        case = make(m, 256, 320, path, dtype, seed=m + 31)
        lean, default = lean_and_default(monkeypatch, b, case)
        assert golden.same_bits(lean, default), f"M = {m}"
        monkeypatch.setenv(LEAN, "1")
        check_against_reference(b, case)
        monkeypatch.delenv(LEAN)


@pytest.mark.parametrize("path", ["chan-zp", "g128", "g32-zp", "act-g64-zp", "act-rows"])
@pytest.mark.parametrize("m", [1, 16])
def test_lean_kernel_cuda_split_k(monkeypatch, m, path):
    """On a GPU: the lean kernel (3 blocks per SM, its own split-K plan) within the reference's
    bound on a split-K shape, and the same bits as the default where neither splits K."""
    b = backend_or_skip("cuda", OP)
    case = make(m, 2048, 576, path, torch.float16, seed=m)
    monkeypatch.setenv(LEAN, "1")
    check_against_reference(b, case)
    assert int(case["workspace"].abs().sum()) == 0
    small = make(m, 4 * STAGE_K, 576, path, torch.float16, seed=m + 1)
    lean, default = lean_and_default(monkeypatch, b, small)
    assert golden.same_bits(lean, default)


def test_switch_is_read_per_call(monkeypatch):
    """'0' and unset run the default kernel, '1' the lean one, changed between calls of one
    process; M > 16 ignores it (no lean kernel for taller tiles)."""
    b = backend_or_skip("simt", OP)
    case = make(9, 512, 192, "g128-zp", torch.bfloat16, seed=3)
    outs = {}
    for value in ("1", "0", None, "1"):
        if value is None:
            monkeypatch.delenv(LEAN, raising=False)
        else:
            monkeypatch.setenv(LEAN, value)
        outs.setdefault(value, []).append(call(b, case))
    for out in [o for v in outs.values() for o in v]:
        assert golden.same_bits(out, outs["1"][0])
    tall = make(17, 512, 192, "g64", torch.float16, seed=4)
    monkeypatch.setenv(LEAN, "1")
    check_against_reference(b, tall)
