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

fp16 activations run on the same tiles with every fp16 value split exactly into two bf16 (four
tile products per product): the reference within the bound of 4 K + 1 fp32 additions, threads,
inputs whose lo parts matter, infinities (which take the FMA path), and a witness that it ran.
The int8-activation mode runs its blocks on AMX-INT8 (TDPBSSD): exact integer sums, so the same
bits as the vpdpbusd and portable paths.

Everything here skips on a CPU without AMX-BF16 (the int8 tests without AMX-INT8): the path
cannot run there (the kernels check CPUID, XCR0 and ask Linux for the tile state before they
use it).
"""

import pytest
import torch

import golden
from conftest import backend_or_skip, cpu_flags
from numerics import assert_gemm_close
from test_awq_gemm_cpu_paths import _awq
from test_w4a16_gemm import OP, call, check_against_reference, make_case, op_args, tolerance
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


def _w4a16_config_case(config, size_k, m, dtype):
    """make_case for a W4A16_CONFIGS entry on N = 192; at K = 1040 the groups are whole k-tiles
    that divide K (80 for 128, 16 for 32 and 64)."""
    group, act, zp, bias = W4A16_CONFIGS[config]
    if size_k == 1040 and group == 128:
        group = 80
    if size_k == 1040 and group in (32, 64):
        group = 16
    return make_case(m, size_k, 192, group, dtype, act, zp, bias, seed=m + size_k)


@pytest.mark.parametrize("m", [5, 8, 9, 16, 17, 33, 64, 65, 200, 300])
@pytest.mark.parametrize("size_k", [1040, 2048])
@pytest.mark.parametrize("config", list(W4A16_CONFIGS))
def test_w4a16_amx_against_reference(monkeypatch, config, size_k, m):
    b = backend_or_skip("cpu", OP)
    _env(monkeypatch, AMX_ON)
    check_against_reference(b, _w4a16_config_case(config, size_k, m, torch.bfloat16))


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


@pytest.mark.parametrize("m", [5, 21])
def test_w4a16_amx_partial_row_block_ignores_stale_rows(monkeypatch, m):
    """A last row block of fewer than 16 rows loads 16 rows of the op's bf16 activation copy,
    whose rows past M hold what an earlier call left there: after a call whose activations are
    all NaN, the same call as before gives the same, finite, bits (each C row depends on its own
    A row only, and the rows past M are not kept)."""
    b = backend_or_skip("cpu", OP)
    _env(monkeypatch, AMX_ON)
    case = make_case(m, 1040, 192, 80, torch.bfloat16, None, True, False, seed=m)
    before = call(b, case)
    poisoned = dict(case)
    poisoned["a"] = torch.full((m + 32, 1040), float("nan"), dtype=torch.bfloat16)
    poisoned["size_m"] = m + 32
    assert torch.isnan(call(b, poisoned)).all()
    after = call(b, case)
    assert torch.isfinite(after).all() and golden.same_bits(after, before)


def test_w4a16_amx_fp16_extreme_values(monkeypatch):
    """The split at fp16's edges: subnormal activations (hi and lo both below fp16's normal
    range, still normal in bf16), activations near 65504, scales of exactly 4096 (the largest
    the split takes: (q - z) * 4096 <= 61440) and subnormal scales; a NaN activation gives its
    row NaNs and leaves the others alone."""
    b = backend_or_skip("cpu", OP)
    _env(monkeypatch, AMX_ON)
    size_k, size_n, group, m = 512, 128, 128, 12
    case = make_case(m, size_k, size_n, group, torch.float16, seed=9)
    gen = torch.Generator().manual_seed(9)
    groups = size_k // group
    s = (torch.rand(groups, size_n, generator=gen) * 0.02 + 1e-3)
    s[0, :32] = 4096.0
    s[1, :32] = 3e-7  # fp16 subnormals (below 6.1e-5)
    case["b_scales"] = reference.marlin_permute_scales(s.half(), size_k, size_n, group)
    a = torch.randn(m, size_k, generator=gen)
    a[:, :group] *= 2.0 ** -10  # group 0 (scales of 4096 in 32 columns): outputs stay finite
    a[0] = a[0] * 2.0 ** -20    # subnormal activations
    a[1, 256::16] = 30000.0     # large ones, in groups of small scales
    a[2, :64] = 5.96e-8         # the smallest fp16 subnormal
    case["a"] = a.half()
    case.pop("_w")
    case["_w_ref"] = reference.w4a16_weight(case["b_q_weight"], case["b_scales"],
                                            case["b_zeros"], None, size_k, size_n)
    assert reference.w4a16_gemm(**op_args(case)).abs().max() < 60000  # no fp16 overflow
    check_split_against_reference(b, case)
    case["a"][5, 100] = float("nan")
    out = call(b, case)
    assert out[5].isnan().all() and not out[torch.arange(m) != 5].isnan().any()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_w4a16_amx_path_runs(monkeypatch, dtype):
    """On an input where the fp32 summation order shows, the AMX bits differ from those of the
    path without tiles (bf16: vdpbf16ps, which every other ISA shares; fp16: fp32 FMAs, against
    the split into bf16 parts): the AMX path is the one that ran."""
    b = backend_or_skip("cpu", OP)
    case = make_case(16, 1040, 192, 80, dtype, seed=3, cancel=True)
    with monkeypatch.context() as mp:
        _env(mp, AMX_ON)
        amx = call(b, case)
    with monkeypatch.context() as mp:
        _env(mp, {**AMX_ON, "W4K_CPU_AMX": "0"})
        other = call(b, case)
    assert not golden.same_bits(amx, other)


# ---- w4a16_gemm at few rows (bf16 1..12, fp16 3..16): the decode split on tiles, weights as A
# (cpu/w4a16_gemm_decode_amx.h: each tile row one output column over 32 k, x^T the B operand)

# The tile path with the weights as B (the blocked path, amx_bf16.h) at every M, for comparison.
TILES_AS_B = {**AMX_ON, "W4K_W4A16_AMX_DECODE_ROWS": "0", "W4K_W4A16_PAIR_ROWS": "0"}
# Groups for K = 1008 (63 k-tiles): 112 and 48 rows are odd numbers of k-tiles, so some 32-k
# steps take two groups (the [T(g0) | T(g1)] lookups); 1008 itself has a last step of one tile.
DECODE_CONFIGS = {"g112": (112, None, False, False), "g48_zp": (48, None, True, False),
                  "chan_zp_bias": (-1, None, True, True), "act112_zp": (112, "k_full", True, True),
                  "g128_zp_bias": (128, None, True, True)}


def _decode_case(config, size_k, m, cancel, dtype=torch.bfloat16):
    group, act, zp, bias = DECODE_CONFIGS[config]
    if size_k % group:
        group = 16
    return make_case(m, size_k, 192, group, dtype, act, zp, bias, seed=m + size_k,
                     cancel=cancel and act is None)


def _assert_decode_bits_are_tiles_as_b(monkeypatch, case):
    """The op on the decode split's tiles (every row it takes, forced on) and on the tile path
    with the weights as B: the same bits."""
    b = backend_or_skip("cpu", OP)
    with monkeypatch.context() as mp:
        _env(mp, {**AMX_ON, "W4K_W4A16_AMX_DECODE_ROWS": "16",
                  "W4K_W4A16_AMX_DECODE_MIN_ROWS": "1"})
        decode = call(b, case)
    with monkeypatch.context() as mp:
        _env(mp, TILES_AS_B)
        tiles = call(b, case)
    assert golden.same_bits(decode, tiles)


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 8, 12])
@pytest.mark.parametrize("size_k", [512, 1008])
@pytest.mark.parametrize("config", list(DECODE_CONFIGS))
def test_w4a16_amx_decode_same_bits_as_tiles_as_b(monkeypatch, config, size_k, m):
    """Within one slice of K (<= 1024 k) the decode split on the tiles forms every output as the
    tile path with the weights as B does: the same exact products, the same 32-k steps in k
    order from zero (a step pairs the same products whichever operand is A). So its bits are
    that path's, on an input where the summation order shows (`cancel`; plain random inputs
    for act-order) and where the checks catch a wrong lookup, group, column or k order: an odd
    number of k-tiles (the last step's missing tile masked), steps across two groups, zero
    points, per channel with bias, act-order."""
    _assert_decode_bits_are_tiles_as_b(monkeypatch, _decode_case(config, size_k, m, cancel=True))


@pytest.mark.parametrize("m", [1, 3, 4, 9, 12])
@pytest.mark.parametrize("config", ["g128_zp_bias", "act112_zp", "chan_zp_bias"])
def test_w4a16_amx_decode_k11008_and_threads(monkeypatch, config, m):
    """K = 11008: 11 slices of K (the last of 48 k-tiles), their sums added in slice order; the
    reference within the fp32-accumulation bound, and 1 and 2 threads give the same bits."""
    b = backend_or_skip("cpu", OP)
    _env(monkeypatch, AMX_ON)
    group, act, zp, bias = DECODE_CONFIGS[config]
    case = make_case(m, 11008, 320, 128 if group == 112 else group, torch.bfloat16, act, zp,
                     bias, seed=m)
    check_against_reference(b, case)
    assert_threads_same_bits(b, case)


@pytest.mark.parametrize("m", [1, 2, 3, 4])
def test_w4a16_amx_decode_runs_by_default(monkeypatch, m):
    """At M <= 4 the default (no override) is the tiles: the bits differ from the vdpbf16ps
    decode path's (W4K_W4A16_AMX_DECODE_ROWS=0) on a cancelling input."""
    b = backend_or_skip("cpu", OP)
    monkeypatch.delenv("W4K_W4A16_AMX_DECODE_ROWS", raising=False)
    monkeypatch.delenv("W4K_CPU_AMX", raising=False)
    case = make_case(m, 1040, 192, 80, torch.bfloat16, None, True, False, seed=3, cancel=True)
    tiles = call(b, case)
    monkeypatch.setenv("W4K_W4A16_AMX_DECODE_ROWS", "0")
    assert not golden.same_bits(tiles, call(b, case))


@pytest.mark.parametrize("m", [3, 4, 6, 8, 9, 12, 16])
@pytest.mark.parametrize("size_k", [512, 1008])
@pytest.mark.parametrize("config", list(DECODE_CONFIGS))
def test_w4a16_amx_decode_fp16_same_bits_as_tiles_as_b(monkeypatch, config, size_k, m):
    """fp16 at 3..16 rows: every value split into bf16 hi and lo parts, x^T's columns 0..7 the
    hi parts of 8 rows and 8..15 their lo parts (a second x^T tile for rows 8..15, each chunk
    then in two passes over its column halves), per step the hi A tiles' products then the lo
    ones (per channel no lo parts: the weights are integers), each output its hi column plus its
    lo column: within one slice of K the bits of the tile path with the weights as B."""
    _assert_decode_bits_are_tiles_as_b(
        monkeypatch, _decode_case(config, size_k, m, cancel=True, dtype=torch.float16))


@pytest.mark.parametrize("m", [3, 8, 13])
@pytest.mark.parametrize("config", ["g128_zp_bias", "chan_zp_bias"])
def test_w4a16_amx_decode_fp16_k11008_and_threads(monkeypatch, config, m):
    b = backend_or_skip("cpu", OP)
    _env(monkeypatch, AMX_ON)
    group, act, zp, bias = DECODE_CONFIGS[config]
    case = make_case(m, 11008, 320, group, torch.float16, act, zp, bias, seed=m)
    check_split_against_reference(b, case)
    assert_threads_same_bits(b, case)


@pytest.mark.parametrize("m", [1, 2, 3, 6, 17])
def test_w4a16_amx_decode_fp16_rows(monkeypatch, m):
    """fp16 takes the tiles at 3..16 rows by default: at 3..6 the bits differ from those with the
    path off (the fp16 decode path's fp32 FMAs; from 7 rows that is the tile path with the
    weights as B, whose bits these are within a slice of K: next test), and at 1..2 and 17 they
    are the same."""
    b = backend_or_skip("cpu", OP)
    monkeypatch.delenv("W4K_W4A16_AMX_DECODE_ROWS", raising=False)
    monkeypatch.delenv("W4K_W4A16_AMX_DECODE_MIN_ROWS", raising=False)
    monkeypatch.delenv("W4K_CPU_AMX", raising=False)
    case = make_case(m, 1040, 192, 80, torch.float16, None, True, False, seed=3, cancel=True)
    default = call(b, case)
    monkeypatch.setenv("W4K_W4A16_AMX_DECODE_ROWS", "0")
    assert golden.same_bits(default, call(b, case)) == (m not in (3, 6))


@pytest.mark.parametrize("dtype, m", [(torch.bfloat16, 5), (torch.bfloat16, 12),
                                      (torch.float16, 7), (torch.float16, 16)])
def test_w4a16_amx_decode_runs_where_the_tiles_as_b_ran(monkeypatch, dtype, m):
    """A witness that the decode split's tiles run at the rows where the tile path with the
    weights as B ran before (bf16 5..12, fp16 7..16), whose bits they share within a slice of K:
    over two slices they differ from it. Per channel, K = 2048, column k = 3 and k = 1027 hold
    the same codes and the activations there are +L and -L: the tile path adds L w in the first
    slice's chain and -L w in the second's, so the small products between pass through sums of
    size L w; the split adds the two slices' sums once. (The same with the split forced off is
    the tile path both times: same bits, as the same-bits tests show.)"""
    b = backend_or_skip("cpu", OP)
    case = make_case(m, 2048, 192, -1, dtype, None, False, False, seed=m)
    q = case["_qz"] + 8  # the codes (symmetric: z = 8)
    q[1027] = q[3]
    case["b_q_weight"] = reference.marlin_pack(q)
    big = 60000.0 if dtype == torch.float16 else 2.0 ** 24
    case["a"][:, 3] = big
    case["a"][:, 1027] = -big
    with monkeypatch.context() as mp:
        _env(mp, {**AMX_ON, "W4K_W4A16_AMX_DECODE_ROWS": "16"})
        decode = call(b, case)
    with monkeypatch.context() as mp:
        _env(mp, TILES_AS_B)
        tiles = call(b, case)
    assert not golden.same_bits(decode, tiles)


def test_w4a16_amx_decode_fp16_infinities(monkeypatch):
    """An infinite activation cannot be split (amx_split_activations_ok): at 4 rows the call
    takes the fp16 decode path, +-inf and NaN where the reference has them."""
    b = backend_or_skip("cpu", OP)
    _env(monkeypatch, AMX_ON)
    case = make_case(4, 256, 64, 128, torch.float16, seed=2)
    case["a"][0, 5] = float("inf")
    case["a"][3, 200] = -float("inf")
    out = call(b, case).double()
    ref = reference.w4a16_gemm(**op_args(case))
    assert torch.equal(out.isnan(), ref.isnan()) and torch.equal(out.isinf(), ref.isinf())
    assert out.isinf().any()
    fin = ref.isfinite()
    assert bool(((out - ref).abs()[fin] <= tolerance(case, ref)[fin]).all())


def test_w4a16_amx_decode_ignores_stale_x_columns(monkeypatch):
    """x^T's B tiles are kept per calling thread and a call writes only its M columns: after a
    call of 12 rows of NaNs, calls of 1 and 3 rows give the same, finite, bits as before (a C
    column depends on its own B column only, and the columns past M are not read); K = 1008
    ends with a step of one k-tile, whose rows past K are zeroed for every column written."""
    b = backend_or_skip("cpu", OP)
    _env(monkeypatch, {**AMX_ON, "W4K_W4A16_AMX_DECODE_ROWS": "12"})
    cases = [_decode_case("g48_zp", 1008, m, cancel=False) for m in (1, 3)]
    before = [call(b, c) for c in cases]
    poisoned = _decode_case("g48_zp", 1008, 12, cancel=False)
    poisoned["a"] = torch.full((12, 1008), float("nan"), dtype=torch.bfloat16)
    assert torch.isnan(call(b, poisoned)).all()
    for c, out in zip(cases, before):
        again = call(b, c)
        assert torch.isfinite(again).all() and golden.same_bits(again, out)


# ---- fp16 on the tiles: every value split into two bf16 (amx_bf16.h, amx_split_half) ------------


def split_tolerance(case, ref):
    """test_w4a16_gemm.tolerance for the fp16 split: each product a * w reaches the fp32 sums as
    four exact partial products (ah wh, al wh, ah wl, al wl; |ah| + |al| = |a|, so their
    magnitudes add up to |a * w|), and the hi and lo rows' sums are added once at the end: at
    most 4 K + 1 additions instead of K (per channel 2 K + 1, bounded by the same)."""
    return tolerance(dict(case, size_k=4 * case["size_k"] + 1), ref)


def check_split_against_reference(b, case):
    out = call(b, case)
    ref = reference.w4a16_gemm(**op_args(case))
    err = (out.double() - ref).abs()
    tol = split_tolerance(case, ref)
    assert bool((err <= tol).all()), f"max err / tol {(err / tol).max().item():.3g}"


@pytest.mark.parametrize("m", [7, 8, 9, 16, 17, 33, 64, 65, 200, 300])
@pytest.mark.parametrize("size_k", [1040, 2048])
@pytest.mark.parametrize("config", list(W4A16_CONFIGS))
def test_w4a16_amx_fp16_against_reference(monkeypatch, config, size_k, m):
    """fp16 from 7 rows (the decode path keeps 1..6): act-order tiles whose rows span groups
    (the fp32 decode's split), per channel (only a split), K with a last step of 16 k, row
    blocks of 8 rows with a partial last one, row blocks of the work split (M = 200, 300 on
    N = 192: rows cut into 8-row multiples)."""
    b = backend_or_skip("cpu", OP)
    _env(monkeypatch, AMX_ON)
    check_split_against_reference(b, _w4a16_config_case(config, size_k, m, torch.float16))


@pytest.mark.parametrize("m", [9, 300])
def test_w4a16_amx_fp16_k11008_and_threads(monkeypatch, m):
    b = backend_or_skip("cpu", OP)
    _env(monkeypatch, AMX_ON)
    case = make_case(m, 11008, 320, 128, torch.float16, None, True, True, seed=m)
    check_split_against_reference(b, case)
    assert_threads_same_bits(b, case)


def test_w4a16_amx_fp16_lo_parts_count(monkeypatch):
    """Without the lo parts (or with them on the wrong rows) the products would be off by up
    to 2^-8 relative, far above the bound: here every activation and weight has bits below
    bf16's 8 (a = 1 + 2^-10 j, scales 1 + 2^-10 i), so each lo part matters."""
    b = backend_or_skip("cpu", OP)
    _env(monkeypatch, AMX_ON)
    size_k, size_n, group, m = 1024, 128, 128, 12
    case = make_case(m, size_k, size_n, group, torch.float16, seed=5)
    gen = torch.Generator().manual_seed(5)
    s = 1 + torch.randint(1, 1024, (size_k // group, size_n), generator=gen) * 2.0**-10
    case["b_scales"] = reference.marlin_permute_scales(s.half(), size_k, size_n, group)
    sign = torch.where(torch.rand(m, size_k, generator=gen) < 0.5, -1.0, 1.0)
    case["a"] = (sign * (1 + torch.randint(1, 1024, (m, size_k), generator=gen) * 2.0**-10)).half()
    case.pop("_w")
    case["_w_ref"] = reference.w4a16_weight(case["b_q_weight"], case["b_scales"],
                                            case["b_zeros"], None, size_k, size_n)
    check_split_against_reference(b, case)


def test_w4a16_amx_fp16_infinities(monkeypatch):
    """An infinite activation gives +-inf (NaN where its weight is 0), an fp16 weight that
    overflows to inf likewise, as in the reference: the split could not carry them (a cross
    product inf * 0), so such calls take the FMA path (amx_split_activations_ok,
    amx_split_scales_ok)."""
    b = backend_or_skip("cpu", OP)
    _env(monkeypatch, AMX_ON)
    size_k, size_n, m = 256, 64, 9
    case = make_case(m, size_k, size_n, 128, torch.float16, seed=2)
    case["a"][0, 5] = float("inf")
    case["a"][3, 200] = -float("inf")
    out = call(b, case).double()
    ref = reference.w4a16_gemm(**op_args(case))
    assert torch.equal(out.isnan(), ref.isnan()) and torch.equal(out.isinf(), ref.isinf())
    assert out.isinf().any() and out.isnan().any()  # both kinds occur (weights of 0 exist)
    assert torch.equal(out[out.isinf()], ref[ref.isinf()])
    fin = ref.isfinite()
    assert bool(((out - ref).abs()[fin] <= split_tolerance(case, ref)[fin]).all())
    # scales of 40000: (q - 8) * 40000 overflows fp16 for |q - 8| >= 2 (weights of both signs:
    # every output is a NaN, as in the reference)
    big = make_case(m, size_k, size_n, 128, torch.float16, seed=3)
    big["b_scales"] = torch.full_like(big["b_scales"], 40000.0)
    out = call(b, big).double()
    ref = reference.w4a16_gemm(**op_args(big))
    assert torch.equal(out.isnan(), ref.isnan()) and torch.equal(out.isinf(), ref.isinf())
    assert not ref.isfinite().any()


# ---- awq_gemm ----------------------------------------------------------------------------------

# (M, K, N, group size): odd K (a last pair (x, 0) and a last step of 9 k), a strip cut inside
# a step, a partial row block, a 1-word tail (N = 136), K = 11008; from 64 rows work items of 8
# blocks: N = 1096 is items of 8, 8 and 1 block plus a 1-word tail; below 64 rows items of 16
# blocks: N = 1096 is 16 and 1 plus the tail.
AWQ_CASES = [(5, 1001, 136, 77), (9, 105, 64, 35), (16, 4096, 64, 32), (17, 1040, 320, 1040),
             (37, 1001, 136, 77), (64, 512, 192, 128), (300, 256, 128, 64),
             (21, 11008, 192, 128), (65, 1040, 1096, 80), (64, 1001, 1096, 77),
             (37, 1040, 1096, 80)]


def _check_awq_against_reference_and_threads(dtype, size_m, size_k, size_n, group_size,
                                             terms=None):
    """awq_gemm on 1 and 2 threads: the same bits, and the float64 reference within the fp32
    bound of `terms` additions (default K)."""
    qw, s, qz = _awq(size_k, size_n, group_size, dtype, seed=size_m + size_k)
    x = torch.randn(size_m, size_k, generator=torch.Generator().manual_seed(size_n)).to(dtype)
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
    assert_gemm_close(one, x.double() @ w, x.double(), w, terms=terms)


@pytest.mark.parametrize("size_m,size_k,size_n,group_size", AWQ_CASES)
def test_awq_amx_against_reference_and_threads(monkeypatch, size_m, size_k, size_n, group_size):
    _env(monkeypatch, {"W4K_CPU_AMX": "1"})
    _check_awq_against_reference_and_threads(torch.bfloat16, size_m, size_k, size_n, group_size)


# The tiles with the weights as the A operand (awq_gemm_cpu_amx.h: K and the group size
# multiples of 32; by default bf16 at 3 to 64 rows, fp16 at 12 to 48): (M, K, N, group size): a
# 1-word last line (N = 136), items of 4 lines with a partial one (N = 1096), strips of one step
# (group 32), strips of 128 over a group of K (per channel, K = 11008: 86 strips), 19 row blocks
# with a partial one (M = 300; fp16: 38 blocks of 8 rows' hi and lo parts).
AWQ_T_CASES = [(3, 1024, 136, 128), (4, 2048, 1096, 32), (16, 4096, 512, 128),
               (17, 1024, 1096, 1024), (33, 11008, 136, 11008), (64, 512, 192, 64),
               (300, 256, 128, 64)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("size_m,size_k,size_n,group_size", AWQ_T_CASES)
def test_awq_amx_weights_as_a(monkeypatch, size_m, size_k, size_n, group_size, dtype):
    """The transposed tile product gives the bits of the other tile path (W4K_AWQ_AMX_T=0: the
    same exact products, the same 32-k steps in k order, fp16's hi then lo products per step; a
    TDPBF16PS step adds a column's pairs the same way whichever operand it is), with strided
    rows of x too, and the reference within the fp32 bound (fp16: 4 K additions, the split), the
    same bits on 1 and 2 threads. W4K_AWQ_AMX_T=1 and W4K_AWQ_AMX_T_FP16_ROWS=0 take it at every
    M; the other path runs its fp16 split at every M with W4K_AWQ_AMX_FP16_ROWS=0."""
    _env(monkeypatch, {"W4K_CPU_AMX": "1", "W4K_AWQ_AMX_T": "1", "W4K_AWQ_AMX_T_FP16_ROWS": "0",
                       "W4K_AWQ_LUT_ROWS": "0", "W4K_AWQ_ROW_ROWS": "0"})
    fp16 = dtype == torch.float16
    _check_awq_against_reference_and_threads(dtype, size_m, size_k, size_n, group_size,
                                             terms=4 * size_k if fp16 else None)
    qw, s, qz = _awq(size_k, size_n, group_size, dtype, seed=size_m)
    wide = torch.randn(size_m, size_k + 48, generator=torch.Generator().manual_seed(size_n))
    x = wide.to(dtype)[:, 16:16 + size_k]  # rows 2 (K + 48) bytes apart, offset 32
    new, ran = _awq_gemm_and_path(x, qw, s, qz)
    assert ran  # its bits are the other path's by design: the profiler event says it ran
    with monkeypatch.context() as mp:
        _env(mp, {"W4K_AWQ_AMX_T": "0", "W4K_AWQ_AMX_FP16_ROWS": "0"})
        other, ran = _awq_gemm_and_path(x, qw, s, qz)
    assert not ran
    assert golden.same_bits(new, other)


AMX_T_EVENT = "w4kernels::awq_gemm[amx weights as A]"


def _awq_gemm_and_path(x, qw, s, qz):
    """awq_gemm's output, and whether the weights-as-A tiles ran (their profiler event)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out = torch.ops.w4kernels.awq_gemm(x, qw, s, qz, 8)
    return out, any(e.name == AMX_T_EVENT for e in prof.events())


@pytest.mark.parametrize("dtype,rows", [(torch.bfloat16, {1: False, 2: True, 16: True,
                                                           17: True, 64: True, 65: False}),
                                        (torch.float16, {1: False, 2: True, 48: True,
                                                         49: False})])
def test_awq_amx_weights_as_a_default_rows(monkeypatch, dtype, rows):
    """By default the path takes bf16 at 2..64 rows (1: the row path, awq_gemm_cpu_rows.h)
    and fp16 at 2..48 (K and the group size multiples of 32), and nothing where K is not
    (K = 1040, group 80)."""
    _env(monkeypatch, {"W4K_CPU_AMX": "1"})
    for key in ("W4K_AWQ_AMX_T", "W4K_AWQ_AMX_T_FP16_ROWS", "W4K_AWQ_LUT_ROWS",
                "W4K_AWQ_AMX_FP16_ROWS", "W4K_AWQ_ROW_ROWS"):
        monkeypatch.delenv(key, raising=False)
    for size_k, group_size in ((1024, 128), (1040, 80)):
        qw, s, qz = _awq(size_k, 256, group_size, dtype, seed=5)
        for m, expected in rows.items():
            x = torch.randn(m, size_k, generator=torch.Generator().manual_seed(m)).to(dtype)
            out, ran = _awq_gemm_and_path(x, qw, s, qz)
            assert ran == (expected and size_k == 1024), (size_k, m)
            w = reference.awq_dequantize(qw, s, qz).double()
            assert_gemm_close(out, x.double() @ w, x.double(), w,
                              terms=4 * size_k if dtype == torch.float16 else None)


@pytest.mark.parametrize("size_m", [2, 16, 20])
def test_awq_amx_weights_as_a_item_width_keeps_bits(monkeypatch, size_m):
    """At M <= 16 the weights-as-A tiles take one wide work item per thread and 32-row strips
    (awq_gemm_cpu_amx.h amx_t_item_lines, amx_t_strip), from 17 rows 4-line items and 128-row
    strips; W4K_AWQ_AMX_T_LINES forces a width. N = 4232: 33 lines and a 1-word tail. Every width
    and thread count gives the default's bits."""
    _env(monkeypatch, {"W4K_CPU_AMX": "1"})
    monkeypatch.delenv("W4K_AWQ_AMX_T_LINES", raising=False)
    qw, s, qz = _awq(512, 4232, 64, torch.bfloat16, seed=size_m)
    x = torch.randn(size_m, 512, generator=torch.Generator().manual_seed(1)).bfloat16()
    default, ran = _awq_gemm_and_path(x, qw, s, qz)
    assert ran
    for lines in ("1", "4", "33", "64"):
        monkeypatch.setenv("W4K_AWQ_AMX_T_LINES", lines)
        for threads in (1, 2):
            old = torch.get_num_threads()
            torch.set_num_threads(threads)
            try:
                out = torch.ops.w4kernels.awq_gemm(x, qw, s, qz, 8)
            finally:
                torch.set_num_threads(old)
            assert golden.same_bits(out, default), f"{lines} lines, {threads} threads"
    w = reference.awq_dequantize(qw, s, qz).double()
    assert_gemm_close(default, x.double() @ w, x.double(), w)


def test_awq_amx_at_few_rows_when_forced(monkeypatch):
    """W4K_AWQ_LUT_ROWS=0 (and the row path off): the tile path (AMX) at M = 1..4 too, where its
    row block is mostly zero padding."""
    _env(monkeypatch, {"W4K_CPU_AMX": "1", "W4K_AWQ_LUT_ROWS": "0", "W4K_AWQ_ROW_ROWS": "0"})
    qw, s, qz = _awq(1040, 192, 80, torch.bfloat16, seed=1)
    for m in (1, 2, 4):
        x = torch.randn(m, 1040, generator=torch.Generator().manual_seed(m)).to(torch.bfloat16)
        w = reference.awq_dequantize(qw, s, qz).double()
        assert_gemm_close(torch.ops.w4kernels.awq_gemm(x, qw, s, qz, 8), x.double() @ w,
                          x.double(), w)


# awq_gemm's fp16 split at every M (by default from 32 rows, awq_gemm_cpu.h kAmxFp16MinRows)
AWQ_SPLIT_ON = {"W4K_CPU_AMX": "1", "W4K_AWQ_LUT_ROWS": "0", "W4K_AWQ_AMX_FP16_ROWS": "0",
                "W4K_AWQ_ROW_ROWS": "0"}


@pytest.mark.parametrize("size_m,size_k,size_n,group_size", AWQ_CASES)
def test_awq_amx_fp16_against_reference_and_threads(monkeypatch, size_m, size_k, size_n,
                                                   group_size):
    """fp16 on the tiles (from 32 rows; forced below that): the split rows of x and of each
    strip's weights, odd K (a last pair (w, 0) in both parts), partial 8-row blocks."""
    _env(monkeypatch, AWQ_SPLIT_ON)
    _check_awq_against_reference_and_threads(torch.float16, size_m, size_k, size_n, group_size,
                                             terms=4 * size_k + 1)


def test_awq_amx_fp16_infinities_and_path(monkeypatch):
    """inf activations through the split (lo = 0): the reference's inf / NaN pattern; and the
    tile path ran: its bits differ from the FMA path's on a cancelling input."""
    qw, s, qz = _awq(1024, 128, 128, torch.float16, seed=7)
    x = torch.randn(12, 1024, generator=torch.Generator().manual_seed(7)).half()
    x[2, 17] = float("inf")
    w = reference.awq_dequantize(qw, s, qz).double()
    with monkeypatch.context() as mp:
        _env(mp, AWQ_SPLIT_ON)
        out = torch.ops.w4kernels.awq_gemm(x, qw, s, qz, 8).double()
    ref = x.double() @ w
    assert torch.equal(out.isinf(), ref.isinf()) and torch.equal(out.isnan(), ref.isnan())
    assert out.isinf().any()
    # rows 16j + 1 and 16j + 2 of the weight equal (one group), x there +L and -L: the two
    # products cancel exactly, but the fp32 sums they pass through lose low bits to L * w, and
    # which bits depends on the order of the additions
    qw[2::16] = qw[1::16]
    x[2, 17] = 0
    x[:, 1::16] = 30000.0
    x[:, 2::16] = -30000.0
    with monkeypatch.context() as mp:
        _env(mp, AWQ_SPLIT_ON)
        amx = torch.ops.w4kernels.awq_gemm(x, qw, s, qz, 8)
    with monkeypatch.context() as mp:
        _env(mp, {**AWQ_SPLIT_ON, "W4K_CPU_AMX": "0"})
        fma = torch.ops.w4kernels.awq_gemm(x, qw, s, qz, 8)
    assert not golden.same_bits(amx, fma)


# ---- the int8-activation mode on AMX-INT8 tiles (w4a8_gemm_avx512.h, amx_a8_rows) ----------------

A8_CASES = [  # (format, M, K, N, group, act_order, zero points, bias, dtype)
    ("marlin", 16, 256, 64, 128, None, False, False, torch.bfloat16),
    ("marlin", 17, 1024, 320, 128, "k_full", True, True, torch.float16),  # partial row block
    ("marlin", 33, 512, 192, 64, None, True, False, torch.bfloat16),      # blocks of 64
    ("marlin", 200, 11008, 128, 128, None, False, True, torch.bfloat16),
    ("marlin", 37, 1024, 64, -1, None, True, False, torch.float16),      # per channel: 128
    ("marlin", 20, 256, 64, 32, None, False, False, torch.bfloat16),     # blocks of 32: vpdpbusd
    ("awq", 12, 512, 704, 128, None, None, None, torch.bfloat16),        # items of 8: 2 x 2 pairs
    ("awq", 24, 384, 704, 64, None, None, None, torch.float16),          # items of 4, a lone chunk
    ("awq", 64, 256, 320, 128, None, None, None, torch.bfloat16),        # pairs + a lone chunk
    ("awq", 65, 1024, 192, 64, None, None, None, torch.float16),
    ("awq", 300, 512, 128, 128, None, None, None, torch.bfloat16),
]


@pytest.mark.skipif("amx_int8" not in cpu_flags(), reason="this CPU has no AMX-INT8")
@pytest.mark.parametrize("case", A8_CASES,
                         ids=[f"{c[0]}-m{c[1]}-k{c[2]}-g{c[4]}" for c in A8_CASES])
@pytest.mark.parametrize("amx_rows", ["default", "1"])
def test_int8_mode_amx_same_bits(monkeypatch, case, amx_rows):
    """The int8 mode's integer sums are exact in any order, so the tiles give the bits of the
    vpdpbusd path and of the portable loop, and the reference's within its bound (from 11 rows
    for Marlin, 10 for AWQ, whose chunk pairs go to the tiles as half-pair panels;
    W4K_A8_AMX_ROWS=1 takes the tiles at every M these cases have)."""
    from test_int8_act import _tight_tol, awq_case, marlin_case
    from w4kernels import ops
    fmt, m, k, n, g, act, zp, bias, dt = case
    if fmt == "marlin":
        args, a_rows, w, group = marlin_case(m, k, n, g, dt, act, zp, bias, seed=m + k)
        op, ref_op, b = ops.w4a8_gemm, reference.w4a8_gemm, args[-1]
    else:
        args, a_rows, w, group = awq_case(m, k, n, g, dt, seed=m)
        op, ref_op, b = ops.awq_gemm_a8, reference.awq_gemm_a8, None
    if amx_rows != "default":
        monkeypatch.setenv("W4K_A8_AMX_ROWS", amx_rows)
    monkeypatch.setenv("W4K_CPU_AMX", "1")
    amx = op(*args)
    ref = ref_op(*args)
    assert ((amx.double() - ref).abs() <= _tight_tol(ref, a_rows, w, group, b)).all()
    monkeypatch.setenv("W4K_CPU_AMX", "0")
    assert golden.same_bits(op(*args), amx)
    monkeypatch.setenv("W4K_CPU_ISA", "scalar")
    assert golden.same_bits(op(*args), amx)
