"""CPU w4a16_gemm dispatch by M: from W4K_W4A16_DEQUANT_THRESHOLD rows on (grouped weights
only) the op dequantizes the Marlin weight once to the activation dtype T and calls torch's
matmul (csrc/cpu/w4a16_gemm_dequant.h); below it, and always per channel, the kernel runs.

References: ``reference.w4a16_gemm`` (float64) with test_w4a16_gemm.py's derived tolerance
(which covers any fp32 summation order, so it holds for oneDNN's too), and, where every sum is
exact (power-of-two scales, small-integer activations), the contract's own bits.
"""

import pytest
import torch

import golden
from conftest import backend_or_skip
from test_w4a16_gemm import OP, call, check_against_reference, make_case

ENV = "W4K_W4A16_DEQUANT_THRESHOLD"
DENSE = "0"            # every M takes the dense route (grouped)
KERNEL = str(1 << 40)  # no M does
# The op's default (kW4a16DequantThreshold* in csrc/cpu/w4a16_gemm_dequant.h).
DEFAULT_THRESHOLD = {torch.bfloat16: None, torch.float16: None}  # never: the kernel
DTYPES = [torch.float16, torch.bfloat16]

# (group, act_order, zero points, bias): every grouped scale mode, act-order (k_full and a
# row-parallel shard whose g_idx indexes more groups than K / group), bias.
CONFIGS = {"g128": (128, None, False, False), "g32_zp_bias": (32, None, True, True),
           "g80": (80, None, False, True), "act": (128, "k_full", False, False),
           "act_zp_bias": (80, "k_full", True, True), "shard_zp": (64, "shard", True, True)}


def _run(monkeypatch, b, case, value):
    with monkeypatch.context() as mp:
        mp.setenv(ENV, value)
        return call(b, case)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("route,m", [(DENSE, 1), (DENSE, 37), (KERNEL, 300)],
                         ids=["dense-M1", "dense-M37", "kernel-M300"])
def test_forced_route_against_reference(monkeypatch, route, m, config, dtype):
    """The override in both directions: the dense route at M = 1 and 37, the kernel at M = 300,
    every grouped mode, both half types, within the float64 reference's bound."""
    b = backend_or_skip("cpu", OP)
    group, act, zp, bias = CONFIGS[config]
    size_k = 1040 if group == 80 else 1024
    case = make_case(m, size_k, 192, group, dtype, act, zp, bias, seed=m + group)
    with monkeypatch.context() as mp:
        mp.setenv(ENV, route)
        check_against_reference(b, case)


def _default_route_bits(monkeypatch, b, case, expected_route):
    """The op's output with the variable unset and unparsable: both are expected_route's bits."""
    for unset in (None, "not-a-number"):
        with monkeypatch.context() as mp:
            if unset is None:
                mp.delenv(ENV, raising=False)
            else:
                mp.setenv(ENV, unset)
            out = call(b, case)
        assert golden.same_bits(out, _run(monkeypatch, b, case, expected_route)), unset
    return out


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_default_stays_on_the_kernel(monkeypatch, dtype):
    """No default threshold (measured: the kernel is ahead of the dense route at M = 256 and
    512 for bf16, and torch's fp16 GEMM is slower than the kernel on this kind of CPU): M = 600
    gives the kernel's bits, unset or unparsable. The routes sum in different orders, so some
    bits differ from the forced dense route's (asserted: it is what makes the comparison tell
    the routes apart)."""
    b = backend_or_skip("cpu", OP)
    assert DEFAULT_THRESHOLD[dtype] is None
    # bf16 outputs are coarse: K = 4160 (52 groups of 80) makes some sums round apart
    size_k = 1040 if dtype == torch.float16 else 4160
    case = make_case(600, size_k, 64, 80, dtype, "k_full", True, True, seed=6)
    out = _default_route_bits(monkeypatch, b, case, KERNEL)
    assert not golden.same_bits(out, _run(monkeypatch, b, case, DENSE))
    check_against_reference(b, case)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("act", [None, "k_full"], ids=["plain", "act"])
def test_dense_weight_is_the_rounded_weight(monkeypatch, dtype, act):
    """One-hot activation rows pick single weights: the dense route's output is then exactly
    T((q - z) * s) of every (Marlin row, column), i.e. the decoded buffer is exact (including
    the column un-permutation and zero points) up to the sign of zero."""
    b = backend_or_skip("cpu", OP)
    size_k, size_n = 256, 320
    case = make_case(size_k, size_k, size_n, 64, dtype, act, zp=True, seed=5)
    eye = torch.eye(size_k, dtype=torch.float64)
    # a[:, perm] = identity  <=>  a = identity with columns scattered by perm
    a = eye if act is None else eye[:, torch.argsort(case["perm"].long())]
    case["a"] = a.to(dtype)
    out = _run(monkeypatch, b, case, DENSE)
    # torch.equal, not same_bits: a weight -0.0 ((q - z) = 0 times a negative scale) comes out
    # of the sum as +0.0 (-0.0 + 0 * w' = +0.0); every other element must match to the bit.
    assert torch.equal(out, case["_w"])
    nonzero = case["_w"] != 0
    assert golden.same_bits(out[nonzero], case["_w"][nonzero])


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_dense_bias_added_in_fp32_before_one_rounding(monkeypatch, dtype):
    """Power-of-two scales and small-integer activations make every fp32 sum exact, so the
    contract's bits are known: T(fp32(sum) + bias), one rounding. A second rounding (matmul to
    T, then + bias) would differ on many of these elements."""
    b = backend_or_skip("cpu", OP)
    size_k, size_n, m = 512, 256, 40
    case = make_case(m, size_k, size_n, 128, dtype, zp=True, bias=True, seed=9)
    gen = torch.Generator().manual_seed(9)
    s = torch.full((size_k // 128, size_n), 2.0 ** -4)
    from w4kernels import reference
    case["b_scales"] = reference.marlin_permute_scales(s.to(dtype), size_k, size_n, 128)
    case["a"] = torch.randint(-8, 9, (m, size_k), generator=gen).to(dtype)
    # bias in (-1, 1) with T's full precision: the sums are multiples of 2^-4 up to ~2^9
    case["b_bias"] = (torch.rand(size_n, generator=gen) * 2 - 1).to(dtype)
    acc = (case["a"].double() @ (case["_qz"].double() * 2.0 ** -4)).float()  # exact
    expected = (acc + case["b_bias"].float()).to(dtype)
    twice = (acc.to(dtype).float() + case["b_bias"].float()).to(dtype)
    assert not golden.same_bits(expected, twice)  # the test can tell the two apart
    assert golden.same_bits(_run(monkeypatch, b, case, DENSE), expected)
    assert golden.same_bits(_run(monkeypatch, b, case, KERNEL), expected)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("act", [None, "k_full"], ids=["sym", "act_zp"])
def test_per_channel_keeps_the_exact_epilogue(monkeypatch, dtype, act):
    """Per channel the contract scales the fp32 sum (T(acc * s + bias), two fp32 roundings);
    torch has no CPU half matmul with an fp32 result, so even with the threshold at 0 the
    kernel runs: with small-integer activations the bits are exactly the contract's."""
    b = backend_or_skip("cpu", OP)
    size_k, size_n, m = 1040, 192, 70
    case = make_case(m, size_k, size_n, -1, dtype, act, zp=act is not None, bias=True, seed=21)
    gen = torch.Generator().manual_seed(21)
    case["a"] = torch.randint(-8, 9, (m, size_k), generator=gen).to(dtype)
    a = case["a"].double()
    if act:
        a = a[:, case["perm"].long()]
    acc = (a @ case["_qz"].double()).float()
    expected = ((acc * case["_s"].float()) + case["b_bias"].float()).to(dtype)
    assert golden.same_bits(_run(monkeypatch, b, case, DENSE), expected)


def _cpu_has_amx_bf16():
    try:
        with open("/proc/cpuinfo") as f:
            return "amx_bf16" in f.read().split()
    except OSError:
        return False


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_dense_route_threads(monkeypatch, dtype):
    """What the dense route gives up: its sums are oneDNN's, whose order may depend on the
    thread count. Both thread counts stay within the reference's bound; and this records what
    holds for M = 97 and 300 on this torch: 1 and 2 threads give the same bits, except bf16 on
    CPUs with AMX-BF16, where oneDNN's AMX kernels split the sums by thread (seen on a Xeon,
    2026-11-27, M = 97; README "CPU w4a16_gemm")."""
    b = backend_or_skip("cpu", OP)
    saved = torch.get_num_threads()
    for m in (97, 300):
        case = make_case(m, 1040, 320, 80, dtype, zp=True, bias=True, seed=m)
        outs = []
        for threads in (1, 2):
            try:
                torch.set_num_threads(threads)
                with monkeypatch.context() as mp:
                    mp.setenv(ENV, DENSE)
                    check_against_reference(b, case)
                outs.append(_run(monkeypatch, b, case, DENSE))
            finally:
                torch.set_num_threads(saved)
        if dtype == torch.bfloat16 and _cpu_has_amx_bf16():
            continue
        assert golden.same_bits(outs[0], outs[1]), m


def test_a_with_row_stride_dense(monkeypatch):
    """a may have a row stride > K (a slice of a wider buffer): the dense route multiplies the
    view (and gathers from it under act-order)."""
    b = backend_or_skip("cpu", OP)
    for act in (None, "k_full"):
        case = make_case(9, 256, 128, 64, torch.bfloat16, act, seed=3)
        wide = torch.randn(9, 300).to(torch.bfloat16)
        wide[:, :256] = case["a"]
        case["a"] = wide[:, :256]
        with monkeypatch.context() as mp:
            mp.setenv(ENV, DENSE)
            check_against_reference(b, case)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_dense_decode_portable_and_avx512_agree(monkeypatch, dtype):
    """The portable decode (W4K_CPU_ISA=scalar) and the AVX-512 one write the same dense weight,
    so the dense route gives the same bits on both (act-order, zero points, bias)."""
    b = backend_or_skip("cpu", OP)
    case = make_case(40, 1040, 192, 80, dtype, "k_full", zp=True, bias=True, seed=4)
    fast = _run(monkeypatch, b, case, DENSE)
    with monkeypatch.context() as mp:
        mp.setenv("W4K_CPU_ISA", "scalar")
        portable = _run(mp, b, case, DENSE)
    assert golden.same_bits(fast, portable)
    check_against_reference(b, case)
