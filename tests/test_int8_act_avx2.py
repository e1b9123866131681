"""The AVX2 path of the int8-activation mode (``csrc/cpu/w4a8_gemm_avx2.h``): ``w4a8_gemm`` and
``awq_gemm_a8`` with ``W4K_CPU_ISA=avx2`` give the bits of the AVX-512 VNNI path
(``W4K_CPU_ISA=avx512``, the best path this CPU has) and of the portable C++ loop
(``W4K_CPU_ISA=scalar``), with 1 and 2 threads. The reference and the error bound of the mode
are checked in ``test_int8_act.py``; this file only proves the paths agree.

The AVX2 path sums with AVX-VNNI ``vpdpbusd`` where the CPU has the ``avxvnni`` flag, else with
``vpmaddubsw`` + ``vpmaddwd``; ``W4K_A8_AVXVNNI=0`` forces the latter, and the test comparing
the two variants needs the flag.
"""

import time

import pytest
import torch

from conftest import cpu_flags
from test_int8_act import (BF, FP, _bits, assert_paths_agree, awq_case, cpu_isa,
                           marlin_case, threads)
from w4kernels import ops

M_SWEEP = [1, 3, 4, 7, 16, 33, 300]


FLAGS = cpu_flags()
needs_avx2 = pytest.mark.skipif(not {"avx2", "fma", "f16c"} <= FLAGS,
                                reason="the AVX2 path needs the avx2, fma and f16c CPU flags")


def _marlin_args(m, k, n, group, dtype, act_order=None, zp=False, bias=False, seed=0):
    return marlin_case(m, k, n, group, dtype, act_order, zp, bias, seed=seed)[0]


def _awq_args(m, k, n, group, dtype, seed=0):
    return awq_case(m, k, n, group, dtype, seed=seed)[0]


# ---- M sweep: every row count the AVX2 driver tiles differently ---------------------------------


@needs_avx2
@pytest.mark.parametrize("dtype", [BF, FP], ids=["bf16", "fp16"])
@pytest.mark.parametrize("m", M_SWEEP)
def test_w4a8_gemm_avx2_m_sweep(m, dtype):
    # N = 320: 5 chunks, an odd count (items of 2 chunks and one of 1); zero points and bias
    args = _marlin_args(m, 512, 320, 64, dtype, None, True, True, seed=m)
    out = assert_paths_agree(ops.w4a8_gemm, args)
    assert out.shape == (m, 320) and out.dtype == dtype and out.isfinite().all()


@needs_avx2
@pytest.mark.parametrize("dtype", [BF, FP], ids=["bf16", "fp16"])
@pytest.mark.parametrize("m", M_SWEEP)
def test_awq_gemm_a8_avx2_m_sweep(m, dtype):
    # N = 192: 3 chunks, a pair of chunks decoded together and one alone
    out = assert_paths_agree(ops.awq_gemm_a8, _awq_args(m, 512, 192, 128, dtype, seed=m))
    assert out.shape == (m, 192) and out.dtype == dtype and out.isfinite().all()


# ---- groups, zero points, act order, K --------------------------------------------------------

# (M, K, N, group, act_order, zero points, bias, dtype)
MARLIN_CASES = [
    (4, 1024, 192, -1, None, False, False, BF),      # per channel: blocks of 128
    (7, 1040, 64, -1, None, True, True, FP),         # per channel, K = 1040: blocks of 16
    (3, 1056, 320, 32, None, True, False, BF),       # K = 33 groups of 32 (not a multiple of 128)
    (16, 1088, 192, 64, "k_full", False, True, FP),  # K = 17 groups of 64, act order
    (33, 384, 320, 128, "k_full", True, True, BF),   # act order + zero points
    (1, 256, 64, 32, "k_full", False, False, FP),    # smallest N, act order
    (300, 256, 192, 128, None, False, True, FP),
    (1, 11008, 192, 128, None, False, False, BF),    # the LLM down-projection K
    (7, 11008, 320, 64, "k_full", True, False, FP),
    (33, 11008, 192, -1, None, False, True, BF),
]


def _mid(c):
    m, k, n, g, ao, zp, bias, dt = c
    return f"m{m}-k{k}-n{n}-g{g}-{ao or 'plain'}{'-zp' if zp else ''}{'-bias' if bias else ''}-" \
           f"{'bf16' if dt == BF else 'fp16'}"


@needs_avx2
@pytest.mark.parametrize("case", MARLIN_CASES, ids=[_mid(c) for c in MARLIN_CASES])
def test_w4a8_gemm_avx2_groups_and_act_order(case):
    m, k, n, g, ao, zp, bias, dt = case
    assert_paths_agree(ops.w4a8_gemm, _marlin_args(m, k, n, g, dt, ao, zp, bias, seed=k + n))


# (M, K, N, group, dtype); AutoAWQ always has zero points
AWQ_CASES = [
    (4, 1024, 192, 1024, BF),   # one group (per channel): blocks of 128
    (7, 1056, 320, 32, FP),     # K not a multiple of 128
    (3, 1088, 192, 64, BF),
    (16, 384, 320, 128, FP),
    (33, 256, 64, 32, BF),      # smallest N: one chunk alone
    (300, 256, 192, 64, FP),
    (1, 11008, 192, 128, BF),
    (7, 11008, 320, 64, FP),
    (33, 11008, 192, 128, BF),
]


@needs_avx2
@pytest.mark.parametrize("case", AWQ_CASES, ids=[f"m{c[0]}-k{c[1]}-n{c[2]}-g{c[3]}-"
                                                 f"{'bf16' if c[4] == BF else 'fp16'}"
                                                 for c in AWQ_CASES])
def test_awq_gemm_a8_avx2_groups(case):
    m, k, n, g, dt = case
    assert_paths_agree(ops.awq_gemm_a8, _awq_args(m, k, n, g, dt, seed=k + n))


# ---- special values -----------------------------------------------------------------------------


@needs_avx2
@pytest.mark.parametrize("dtype", [BF, FP], ids=["bf16", "fp16"])
def test_avx2_zero_and_nonfinite_blocks(dtype):
    """The AVX2 activation quantization and output rounding: an all-zero block, an inf and a NaN
    activation (their rows NaN, with the NaN bits of the other paths)."""
    args = _marlin_args(3, 256, 128, 128, dtype, seed=11)
    a = args[0].clone()
    a[0, :128] = 0
    a[1, 7] = float("inf")
    a[2, 200] = float("nan")
    args[0] = a
    out = assert_paths_agree(ops.w4a8_gemm, args)
    assert out[0].isfinite().all() and out[1:].isnan().all()
    xa = _awq_args(3, 256, 128, 64, dtype, seed=12)
    xa[0] = a.clone()
    assert assert_paths_agree(ops.awq_gemm_a8, xa)[1:].isnan().all()


# ---- the VNNI and vpmaddubsw variants ---------------------------------------------------------


@needs_avx2
@pytest.mark.skipif("avx_vnni" not in FLAGS,
                    reason="the AVX-VNNI variant needs the avxvnni CPU flag (avx_vnni in "
                           "/proc/cpuinfo), which this CPU lacks")
@pytest.mark.parametrize("m", [1, 7, 33])
def test_avxvnni_and_vpmaddubsw_variants_agree(m, monkeypatch):
    monkeypatch.setenv("W4K_CPU_ISA", "avx2")
    margs = _marlin_args(m, 1088, 320, 64, BF, "k_full", True, True, seed=m)
    aargs = _awq_args(m, 1088, 320, 64, FP, seed=m)
    monkeypatch.delenv("W4K_A8_AVXVNNI", raising=False)
    vnni = [ops.w4a8_gemm(*margs), ops.awq_gemm_a8(*aargs)]
    monkeypatch.setenv("W4K_A8_AVXVNNI", "0")
    plain = [ops.w4a8_gemm(*margs), ops.awq_gemm_a8(*aargs)]
    for v, p in zip(vnni, plain):
        assert torch.equal(_bits(v), _bits(p))


# ---- it is the AVX2 kernel that runs ------------------------------------------------------------


def _best_ms(fn, reps=3):
    fn()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best * 1e3


@needs_avx2
def test_avx2_path_runs_not_the_portable_loop():
    """Regression guard on the dispatch: the bit-identity tests above pass whichever path runs,
    so W4K_CPU_ISA=avx2 must also be much faster than the portable loop (measured ~50x on a
    2-core Zen 4 at M = 16; asked here: > 4x, best of 3, so a busy machine does not fail it)."""
    args = _marlin_args(16, 1024, 1024, 128, BF, seed=1)
    aargs = _awq_args(16, 1024, 1024, 128, BF, seed=1)
    for op, a in [(ops.w4a8_gemm, args), (ops.awq_gemm_a8, aargs)]:
        with cpu_isa("avx2"):
            fast = _best_ms(lambda: op(*a))
        with cpu_isa("scalar"):
            slow = _best_ms(lambda: op(*a))
        assert slow > 4 * fast, (op, fast, slow)
