"""The AMX-BF16 path of the CPU GEMMs (csrc/cpu/amx_bf16.h): bf16 activations on the blocked
path of w4a16_gemm (M >= 5) and the tile path of awq_gemm (M >= 5), on CPUs with AMX tiles.

TDPBF16PS multiplies exactly (bf16 x bf16 in fp32) but adds the 32 products of a step into the
fp32 accumulator in its own way (amx_bf16.h), so this path does not give the bits of the
vdpbf16ps chain that every other ISA shares (those tests run with W4K_CPU_AMX=0). What it must
give, and what is checked here:

* the float64 reference within the fp32-accumulation bound (test_w4a16_gemm.tolerance,
  numerics.assert_gemm_close) on the shapes that reach its edges: a last step of 16 k
  (K = 1040: a k-block of 1024 and one of 16), odd K (awq_gemm), row blocks of 16 with a
  partial last one, act-order tiles whose rows span groups (the fp32 decode), zero points,
  per channel with bias, K = 11008;
* the contract's bits where every sum is exact (small integers, power-of-two scales);
* the same bits for 1 and 2 threads (every output is summed by one chain of 32-k steps aligned
  to k = 0, whatever the work split or the k-block);
* that it runs: on a cancelling input (test_w4a16_gemm.make_case's `cancel`) its bits differ
  from the vdpbf16ps path's.

Everything here skips on a CPU without AMX-BF16: the path cannot run there (the kernels check
CPUID, XCR0 and ask Linux for the tile state before they use it).
"""

import pytest
import torch

import golden
from conftest import backend_or_skip, cpu_flags
from numerics import assert_gemm_close
from test_awq_gemm_cpu_paths import _awq
from test_w4a16_gemm import OP, call, check_against_reference, make_case
from test_w4a16_gemm_cpu_paths import assert_threads_same_bits
from w4kernels import reference

pytestmark = pytest.mark.skipif(
    not {"amx_tile", "amx_bf16", "avx512_bf16", "avx512vbmi"} <= cpu_flags(),
    reason="this CPU has no AMX-BF16 (with AVX512-BF16 and VBMI): the AMX path cannot run")

AMX_ON = {"W4K_CPU_AMX": "1", "W4K_W4A16_DEQUANT_THRESHOLD": "1000000"}


def _env(monkeypatch, env):
    for key, value in env.items():
        monkeypatch.setenv(key, value)


# ---- w4a16_gemm --------------------------------------------------------------------------------

W4A16_CONFIGS = {"g128": (128, None, False, False), "g32_zp": (32, None, True, False),
                 "chan_zp_bias": (-1, None, True, True), "act_zp": (128, "k_full", True, True),
                 "shard_zp": (64, "shard", True, True)}


@pytest.mark.parametrize("m", [5, 8, 9, 16, 17, 33, 64, 65, 200, 300])
@pytest.mark.parametrize("size_k", [1040, 2048])
@pytest.mark.parametrize("config", list(W4A16_CONFIGS))
def test_w4a16_amx_against_reference(monkeypatch, config, size_k, m):
    b = backend_or_skip("cpu", OP)
    _env(monkeypatch, AMX_ON)
    group, act, zp, bias = W4A16_CONFIGS[config]
    if size_k == 1040 and group == 128:
        group = 80  # groups of whole k-tiles that divide K
    if size_k == 1040 and group in (32, 64):
        group = 16
    case = make_case(m, size_k, 192, group, torch.bfloat16, act, zp, bias, seed=m + size_k)
    check_against_reference(b, case)


@pytest.mark.parametrize("m", [9, 37, 300])
def test_w4a16_amx_k11008_and_threads(monkeypatch, m):
    """K = 11008: 10 k-blocks of 1024 and one of 768; 1 and 2 threads give the same bits."""
    b = backend_or_skip("cpu", OP)
    _env(monkeypatch, AMX_ON)
    case = make_case(m, 11008, 320, 128, torch.bfloat16, None, True, True, seed=m)
    check_against_reference(b, case)
    assert_threads_same_bits(b, case)


@pytest.mark.parametrize("m", [5, 16, 21])
@pytest.mark.parametrize("zp", [False, True], ids=["sym", "zp"])
def test_w4a16_amx_exact_sums_give_the_contract_bits(monkeypatch, zp, m):
    """Activations in [-8, 8] and scales +-2^-e, e in 4..8: every weight (q - z) * s is exact
    in bf16, every product a multiple of 2^-8 below 8 * 15 * 2^-4 = 7.5 in magnitude, so every
    partial sum of K = 1040 of them is a multiple of 2^-8 below 2^13 (2^21 steps < 2^24): exact
    in fp32 in any order. The output is the exact result rounded once to bf16."""
    b = backend_or_skip("cpu", OP)
    _env(monkeypatch, AMX_ON)
    size_k, size_n, group = 1040, 192, 80
    case = make_case(m, size_k, size_n, group, torch.bfloat16, None, zp, False, seed=m)
    gen = torch.Generator().manual_seed(m)
    groups = size_k // group
    exps = torch.randint(4, 9, (groups, size_n), generator=gen)
    signs = torch.where(torch.rand(groups, size_n, generator=gen) < 0.5, -1.0, 1.0)
    s = (signs * torch.pow(2.0, -exps.double())).to(torch.bfloat16)
    case["b_scales"] = reference.marlin_permute_scales(s, size_k, size_n, group)
    case["a"] = torch.randint(-8, 9, (m, size_k), generator=gen).to(torch.bfloat16)
    w = case["_qz"].double() * s.double().repeat_interleave(group, dim=0)
    expected = (case["a"].double() @ w).to(torch.bfloat16)
    assert golden.same_bits(call(b, case), expected)


def test_w4a16_amx_path_runs(monkeypatch):
    """On an input where the fp32 summation order shows, the AMX bits differ from the
    vdpbf16ps path's (which every other ISA shares): the AMX path is the one that ran."""
    b = backend_or_skip("cpu", OP)
    case = make_case(16, 1040, 192, 80, torch.bfloat16, seed=3, cancel=True)
    with monkeypatch.context() as mp:
        _env(mp, AMX_ON)
        amx = call(b, case)
    with monkeypatch.context() as mp:
        _env(mp, {**AMX_ON, "W4K_CPU_AMX": "0"})
        dot = call(b, case)
    assert not golden.same_bits(amx, dot)


# ---- awq_gemm ----------------------------------------------------------------------------------

# (M, K, N, group size): odd K (a last pair (x, 0) and a last step of 9 k), a strip cut inside
# a step, a partial row block, a 1-word tail (N = 136), K = 11008; from 64 rows work items of 8
# blocks: N = 1096 is items of 8, 8 and 1 block plus a 1-word tail.
AWQ_CASES = [(5, 1001, 136, 77), (9, 105, 64, 35), (16, 4096, 64, 32), (17, 1040, 320, 1040),
             (37, 1001, 136, 77), (64, 512, 192, 128), (300, 256, 128, 64),
             (21, 11008, 192, 128), (65, 1040, 1096, 80), (64, 1001, 1096, 77)]


@pytest.mark.parametrize("size_m,size_k,size_n,group_size", AWQ_CASES)
def test_awq_amx_against_reference_and_threads(monkeypatch, size_m, size_k, size_n, group_size):
    _env(monkeypatch, {"W4K_CPU_AMX": "1"})
    qw, s, qz = _awq(size_k, size_n, group_size, torch.bfloat16, seed=size_m + size_k)
    x = torch.randn(size_m, size_k, generator=torch.Generator().manual_seed(size_n))
    x = x.to(torch.bfloat16)
    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = torch.ops.w4kernels.awq_gemm(x, qw, s, qz, 8)
        torch.set_num_threads(2)
        two = torch.ops.w4kernels.awq_gemm(x, qw, s, qz, 8)
    finally:
        torch.set_num_threads(saved)
    assert golden.same_bits(one, two)
    w = reference.awq_dequantize(qw, s, qz).double()
    assert_gemm_close(one, x.double() @ w, x.double(), w)


def test_awq_amx_at_few_rows_when_forced(monkeypatch):
    """W4K_AWQ_LUT_ROWS=0: the tile path (AMX) at M = 1..4 too, where its row block is mostly
    zero padding."""
    _env(monkeypatch, {"W4K_CPU_AMX": "1", "W4K_AWQ_LUT_ROWS": "0"})
    qw, s, qz = _awq(1040, 192, 80, torch.bfloat16, seed=1)
    for m in (1, 2, 4):
        x = torch.randn(m, 1040, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16)
        w = reference.awq_dequantize(qw, s, qz).double()
        assert_gemm_close(torch.ops.w4kernels.awq_gemm(x, qw, s, qz, 8), x.double() @ w,
                          x.double(), w)
