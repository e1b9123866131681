"""CPU w4a16_gemm: the AVX2 path (csrc/cpu/w4a16_gemm_avx2.h; W4K_CPU_ISA=avx2, or a CPU with
AVX2 + FMA + F16C but not the AVX-512 set) gives the portable path's bits (W4K_CPU_ISA=scalar):
it rounds every weight the same way and adds the same fp32 products in the same order per
output. Checked bit for bit on random activations (not only where the sums are exact), with 1
and 2 threads, and against the float64 reference with the tolerance of test_w4a16_gemm.py.

The dense route (grouped, many rows: torch's matmul on the decoded weight) is turned off here
with W4K_W4A16_DEQUANT_THRESHOLD, so M = 300 runs the kernel.
"""

import functools

import pytest
import torch

import golden
from conftest import backend_or_skip, cpu_flags
from test_w4a16_gemm import OP, call, check_against_reference, make_case


pytestmark = pytest.mark.skipif(
    not {"avx2", "fma", "f16c"} <= cpu_flags(),
    reason="this CPU lacks AVX2 + FMA + F16C: W4K_CPU_ISA=avx2 would run the portable path")


def _run(monkeypatch, b, case, isa, threads):
    monkeypatch.setenv("W4K_CPU_ISA", isa)
    monkeypatch.setenv("W4K_W4A16_DEQUANT_THRESHOLD", "1000000")  # the kernel, not the dense route
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return call(b, case)
    finally:
        torch.set_num_threads(saved)


# config -> (group size, act-order, zero points, bias); group sizes for K = 11008 / K = 1040
# (65 k-tiles: not a multiple of the path's 64-row block, whose last block is one tile).
CONFIGS = {
    "chan": ((-1, -1), None, False, True),
    "g32_zp": ((32, 16), None, True, False),
    "g128": ((128, 80), None, False, True),
    "act_zp": ((128, 80), "k_full", True, False),
    "shard": ((64, 16), "shard", True, True),
}
# (K, M): K = 11008 (a Llama MLP) at decode-like M, K = 1040 up to M = 300 (50 x 6-row tiles).
K_M = [(11008, 1), (11008, 4), (11008, 16), (11008, 37), (1040, 1), (1040, 2), (1040, 3),
       (1040, 37), (1040, 300)]
MAX_M = {k: max(m for kk, m in K_M if kk == k) for k, _ in K_M}


@functools.lru_cache(maxsize=None)
def _base_case(config, size_k, dtype):
    """One case per (config, K, dtype) at the largest M; smaller M take its first rows (making
    the Marlin operands in Python is most of a case's time)."""
    (g_large, g_small), act, zp, bias = CONFIGS[config]
    group = g_large if size_k == 11008 else g_small
    return make_case(MAX_M[size_k], size_k, 192, group, dtype, act, zp, bias, seed=size_k)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("size_k,m", K_M, ids=[f"K{k}-M{m}" for k, m in K_M])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_avx2_same_bits_as_portable(monkeypatch, config, size_k, m, dtype):
    b = backend_or_skip("cpu", OP)
    base = _base_case(config, size_k, dtype)
    case = dict(base, a=base["a"][:m].contiguous(), size_m=m)
    portable = _run(monkeypatch, b, case, "scalar", 1)
    avx2_two = _run(monkeypatch, b, case, "avx2", 2)
    avx2_one = _run(monkeypatch, b, case, "avx2", 1)
    assert golden.same_bits(avx2_two, avx2_one), "AVX2 path: threads 1 and 2 differ"
    assert golden.same_bits(avx2_two, portable), "AVX2 and portable paths differ"
    if m in (1, MAX_M[size_k]):  # the other M have the same bits as the portable path, which
        check_against_reference(b, case)  # test_w4a16_gemm*.py check; here: avx2, 1 thread


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_avx2_lookup_decode_same_bits_as_per_weight_decode(monkeypatch, config, m, dtype):
    """At M <= 8 (the decode path's rows) the AVX2 path decodes the weight by table lookups
    (w4a16_gemm_lookup_avx2.h); W4K_W4A16_AVX2_LOOKUP=0 runs the per-weight decode instead (the
    one act-order tiles that span groups still use). Both must give the portable path's bits."""
    b = backend_or_skip("cpu", OP)
    base = _base_case(config, 1040, dtype)
    case = dict(base, a=base["a"][:m].contiguous(), size_m=m)
    lookup = _run(monkeypatch, b, case, "avx2", 2)
    monkeypatch.setenv("W4K_W4A16_AVX2_LOOKUP", "0")
    per_weight = _run(monkeypatch, b, case, "avx2", 1)
    assert golden.same_bits(lookup, per_weight), "lookup and per-weight decodes differ"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("m", [1, 2, 4, 5, 8])
@pytest.mark.parametrize("config", ["chan", "g32_zp", "g128"])
def test_avx2_summation_order_on_cancelling_input(monkeypatch, config, m, dtype):
    """The same on an input where the fp32 summation order shows in the output (make_case's
    `cancel`): the lookup decode (M <= 8), the per-weight decode and the portable path add
    every output's products in the same order. (Random inputs alone would hide an order
    change: it moves the fp32 sums by about an ulp, below the rounding to fp16 / bf16.)"""
    b = backend_or_skip("cpu", OP)
    (_, group), _, zp, bias = CONFIGS[config]  # the group size for K = 1040
    case = make_case(m, 1040, 192, group, dtype, None, zp, bias, seed=5 + m, cancel=True)
    portable = _run(monkeypatch, b, case, "scalar", 1)
    avx2 = _run(monkeypatch, b, case, "avx2", 2)
    monkeypatch.setenv("W4K_W4A16_AVX2_LOOKUP", "0")
    per_weight = _run(monkeypatch, b, case, "avx2", 1)
    assert golden.same_bits(avx2, portable), "AVX2 and portable paths differ"
    assert golden.same_bits(per_weight, portable), "AVX2 per-weight decode and portable differ"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("m", [1, 3, 4, 8])
@pytest.mark.parametrize("config", ["g32_zp", "act_zp"])
def test_avx2_lookup_bands_of_chunks(monkeypatch, config, m, dtype):
    """The lookup decode takes up to 8 chunks of 64 columns side by side, k-tile by k-tile (its
    bands: 8 at M = 1 and 2, fewer as the lane sums grow: bf16 M = 4 5, M = 8 3; fp16 M = 4 3,
    M = 8 1) within each work item (8 per thread). N = 88 chunks: items of 11 chunks on 1
    thread (bands 8 + 3 at M = 1), of 5 and 6 on 2; every chunk keeps its own sums, so the bits
    are the portable path's. The cancelling input makes an order change visible where it can
    be (no act-order: its tiles that span groups are summed apart)."""
    b = backend_or_skip("cpu", OP)
    (_, group), act, zp, bias = CONFIGS[config]
    case = make_case(m, 1040, 64 * 88, group, dtype, act, zp, bias, seed=40 + m,
                     cancel=act is None)
    portable = _run(monkeypatch, b, case, "scalar", 1)
    avx2_one = _run(monkeypatch, b, case, "avx2", 1)
    avx2_two = _run(monkeypatch, b, case, "avx2", 2)
    assert golden.same_bits(avx2_one, portable), "AVX2 (1 thread) and portable paths differ"
    assert golden.same_bits(avx2_two, portable), "AVX2 (2 threads) and portable paths differ"


def _edge_scales(case, values):
    """Overwrites scale entries of group 0 (Marlin-permuted, so the columns they land on do
    not matter: every column goes through the same code)."""
    s = case["b_scales"].clone()
    s[0, : len(values)] = torch.tensor(values, dtype=torch.float32).to(s.dtype)
    case["b_scales"] = s
    for key in ("_w", "_w_ref"):
        case.pop(key, None)
    return case


@pytest.mark.parametrize("m", [1, 4])
def test_avx2_lookup_fma_only_where_products_are_exact(monkeypatch, m):
    """The lookup decode adds its products by FMA only where every product of a group is exact
    in fp32 (lookup_products_exact; bf16 products can overflow). Here group 0's scales are 2^120
    and its activations alternate -2^10, +2^10 (rows 2t, 2t + 1: a lane's first two products),
    so its products overflow: multiply-then-add gives inf + -inf = NaN wherever a lane sees
    weights of both signs, an FMA keeps the first inf (inf plus a finite exact product). The
    other groups are ordinary and take the FMA: the same bits as the portable path and as the
    AVX2 path without FMA (W4K_W4A16_AVX2_FMA=0), NaN included."""
    b = backend_or_skip("cpu", OP)
    case = make_case(m, 256, 128, 64, torch.bfloat16, zp=True, seed=21 + m)
    _edge_scales(case, [2.0 ** 120] * case["b_scales"].shape[1])
    a = case["a"].clone()
    a[:, 0:64:2] = -(2.0 ** 10)
    a[:, 1:64:2] = 2.0 ** 10
    case["a"] = a
    portable = _run(monkeypatch, b, case, "scalar", 1)
    avx2 = _run(monkeypatch, b, case, "avx2", 2)
    monkeypatch.setenv("W4K_W4A16_AVX2_FMA", "0")
    avx2_mul_add = _run(monkeypatch, b, case, "avx2", 2)
    assert torch.isnan(portable).any()
    assert golden.same_bits(avx2_mul_add, portable)
    assert golden.same_bits(avx2, portable), "the FMA ran where a product overflows"


@pytest.mark.parametrize("m", [1, 7])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_avx2_weight_rounding_edges(monkeypatch, dtype, m):
    """The rounding of T((q - z) * s) where it is not the plain case: fp16 results that overflow
    to inf (s near 65504 times |q - z| > 1), land in the fp16 subnormals (s = 2^-14 times
    small integers is exact; s = 1.5 * 2^-17 rounds), a NaN scale; bf16 denormal products (integer
    rounding of denormal bits), products that overflow fp32, a NaN scale; and an infinite scale
    (q - z = 0 gives x86's default NaN, which the AVX2 bf16 rounding must keep). Compared with the portable path only (inf and
    NaN have no float64 reference to check a tolerance against)."""
    b = backend_or_skip("cpu", OP)
    case = make_case(m, 256, 128, 64, dtype, zp=True, seed=3 + m)
    if dtype == torch.float16:
        values = [60000.0, -65504.0, 2.0 ** -14, 1.5 * 2.0 ** -17, 3 * 2.0 ** -24, float("nan"),
                  float("inf")]
    else:
        values = [1e-39, -3e-39, 2.0 ** -130, 1e38, float("nan"), float("-inf")]
    _edge_scales(case, values)
    portable = _run(monkeypatch, b, case, "scalar", 1)
    avx2 = _run(monkeypatch, b, case, "avx2", 2)
    assert golden.same_bits(avx2, portable)
    assert torch.isnan(avx2).any()
