"""CPU w4a16_gemm: the decode path (M <= 8), the work queue, and what every CPU path must
share: bits across thread counts, K-blocked shapes, M from 1 to 300, odd multiples of 64 for N.

References: ``reference.w4a16_gemm`` (float64) with the derived tolerance of
test_w4a16_gemm.py, and, where the sums are exact (small-integer activations), the contract's
own bits.
"""

import threading

import pytest
import torch

import golden
from conftest import backend_or_skip, cpu_flags
from test_w4a16_gemm import OP, call, check_against_reference, make_case
from test_w4a16_gemm_avx2 import _edge_scales
from w4kernels import reference

# The decode path is the default at M <= 8 (bf16 and fp16) on an AVX-512 CPU;
# W4K_W4A16_PAIR_ROWS moves that limit (test_decode_path raises it to 16 for its larger M) and
# 0 turns the path off (then the lookup tables, or the blocked path).
DECODE_OFF = {"W4K_W4A16_PAIR_ROWS": "0"}


def assert_threads_same_bits(b, case):
    """The op's result with 1 and with 2 threads: the same bits (the work splits differ)."""
    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = call(b, case)
        torch.set_num_threads(2)
        two = call(b, case)
    finally:
        torch.set_num_threads(saved)
    assert golden.same_bits(one, two)


# (K, N): K = 11008 (a Llama MLP: 43 blocks of 16 k-tiles), K = 1040 (65 tiles: a last block
# of one tile), N odd multiples of 64.
# Every register tiling of the decode path: bf16 row blocks of 1..8 rows (M = 13: 8 + 5,
# M = 16: 8 + 8), fp16 of 1..4 (the tilings of 3 and 4 share code there; M = 13: 4 + 4 + 4 + 1).
DTYPE_M = ([(torch.bfloat16, m) for m in (1, 2, 3, 4, 6, 7, 13, 16)] +
           [(torch.float16, m) for m in (1, 3, 4, 13)])


@pytest.mark.parametrize("dtype,m", DTYPE_M, ids=[f"{str(d)[6:]}-M{m}" for d, m in DTYPE_M])
@pytest.mark.parametrize("size_k,size_n", [(11008, 192), (1040, 320)])
@pytest.mark.parametrize("config", ["g128", "g32_zp", "chan_zp_bias", "act", "shard_zp"])
def test_decode_path(monkeypatch, config, size_k, size_n, dtype, m):
    b = backend_or_skip("cpu", OP)
    monkeypatch.setenv("W4K_W4A16_PAIR_ROWS", "16")  # M = 13 and 16: two row blocks
    # groups of whole k-tiles that divide K: 128 or 80 rows; 32 or 16 (one tile)
    large, small = (128, 32) if size_k % 128 == 0 else (80, 16)
    group, act, zp, bias = {"g128": (large, None, False, False),
                            "g32_zp": (small, None, True, False),
                            "chan_zp_bias": (-1, None, True, True),
                            "act": (large, "k_full", False, False),
                            "shard_zp": (64, "shard", True, True)}[config]
    case = make_case(m, size_k, size_n, group, dtype, act, zp, bias, seed=m + size_k)
    check_against_reference(b, case)


# The decode path at M <= 4 runs over slices of 64 k-tiles (cpu/w4a16_gemm_decode_split.h):
# K = 11008 is 10 whole slices and one of 48 tiles, K = 1040 one of 64 and one of 1; N = 1088
# (17 chunks) is split into two column parts of 9 and 8 chunks. Shard / act-order cases have
# k-tiles whose rows span groups.
KSPLIT_CASES = [(torch.bfloat16, 1, "g128", 11008), (torch.bfloat16, 4, "act", 11008),
                (torch.float16, 3, "shard_zp", 11008), (torch.float16, 1, "chan_zp_bias", 11008),
                (torch.bfloat16, 2, "g32_zp", 1040), (torch.float16, 4, "g128", 1040),
                (torch.bfloat16, 8, "act", 11008), (torch.bfloat16, 5, "shard_zp", 11008),
                (torch.bfloat16, 7, "g32_zp", 1040), (torch.float16, 8, "act", 11008)]


@pytest.mark.parametrize("dtype,m,config,size_k", KSPLIT_CASES,
                         ids=[f"{str(d)[6:]}-M{m}-{c}-K{k}" for d, m, c, k in KSPLIT_CASES])
def test_decode_k_slices(monkeypatch, dtype, m, config, size_k):
    """The K-sliced split: within the float64 bound (its slices add the fp32 sums in another
    order), 1 and 2 threads the same bits (the slices are fixed by K), and the column split it
    replaces (W4K_W4A16_KSPLIT=0) within the same bound."""
    b = backend_or_skip("cpu", OP)
    size_n = 1088
    group = {"g128": 128, "act": 128, "shard_zp": 64, "chan_zp_bias": -1, "g32_zp": 32}[config]
    if size_k % group != 0 and group > 0:
        group = 16
    act = {"act": "k_full", "shard_zp": "shard"}.get(config)
    zp = config.endswith("zp") or config == "chan_zp_bias"
    case = make_case(m, size_k, size_n, group, dtype, act, zp, config.endswith("bias"),
                     seed=7 * m + size_k)
    check_against_reference(b, case)
    assert_threads_same_bits(b, case)
    monkeypatch.setenv("W4K_W4A16_KSPLIT", "0")
    check_against_reference(b, case)


@pytest.mark.parametrize("m", [1, 3, 4, 8])
@pytest.mark.parametrize("zp,act_order", [(False, None), (True, "k_full")], ids=["sym", "act_zp"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_decode_path_per_channel_bits(monkeypatch, dtype, zp, act_order, m):
    """Per channel with small-integer activations every fp32 partial sum is an exact integer, so
    the decode path, the path it replaces and the portable one give the contract's bits:
    T((acc * s) + bias)."""
    b = backend_or_skip("cpu", OP)
    size_k, size_n = 1040, 192
    case = make_case(m, size_k, size_n, -1, dtype, act_order, zp, bias=True, seed=21)
    gen = torch.Generator().manual_seed(21)
    case["a"] = torch.randint(-8, 9, (m, size_k), generator=gen).to(dtype)
    a = case["a"].double()
    if act_order:
        a = a[:, case["perm"].long()]
    acc = (a @ case["_qz"].double()).float()
    expected = ((acc * case["_s"].float()) + case["b_bias"].float()).to(dtype)
    for env in [{}, DECODE_OFF, {"W4K_CPU_ISA": "scalar"}]:
        with monkeypatch.context() as mp:
            for key, value in env.items():
                mp.setenv(key, value)
            assert golden.same_bits(call(b, case), expected), env


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("m", [1, 4, 8, 97, 300])
def test_threads_same_bits(dtype, m):
    """1 and 2 threads split the work differently (row blocks, items) but every output is summed
    by one thread in a fixed order: the same bits. Also checks M up to 300 against float64."""
    b = backend_or_skip("cpu", OP)
    case = make_case(m, 1040, 320, 80, dtype, zp=True, bias=True, seed=m)
    assert_threads_same_bits(b, case)
    if m in (4, 300):
        check_against_reference(b, case)


def test_concurrent_callers_share_the_work_queue():
    """Calls from several Python threads at once: one owns the queue, the others run their items
    inline; every result must be the single-call result."""
    b = backend_or_skip("cpu", OP)
    cases = [make_case(m, 512, 256, 128, torch.bfloat16, zp=True, seed=m) for m in (1, 4, 33)]
    expected = [call(b, c) for c in cases]
    errors = []

    def worker(i):
        for _ in range(20):
            if not golden.same_bits(call(b, cases[i % 3]), expected[i % 3]):
                errors.append(i)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_fp16_output_overflow_rounds_like_torch():
    """The result's rounding to a's dtype (done on the kernel's queue, not by Tensor.to) gives
    torch's bits where fp16 overflows: +-inf."""
    b = backend_or_skip("cpu", OP)
    size_k, size_n = 16, 64
    q = torch.full((size_k, size_n), 15, dtype=torch.int32)  # q - 8 = 7
    s = torch.full((1, size_n), 60000.0).to(torch.float16)
    s[0, 1::2] *= -1
    case = make_case(1, size_k, size_n, -1, torch.float16, bias=True)
    a = torch.ones(1, size_k)
    case.update(a=a.half(), b_q_weight=reference.marlin_pack(q),
                b_scales=reference.marlin_permute_scales(s, size_k, size_n, -1),
                b_bias=torch.zeros(size_n).half())
    out = call(b, case)
    acc = torch.full((1, size_n), 7.0 * size_k)
    assert golden.same_bits(out, ((acc * s.float()) + 0.0).to(torch.float16))
    assert bool(out.isinf().all())


# The blocked vdpbf16ps path (bf16, M above the decode path's rows) decodes k-tiles of one
# group by table lookups; W4K_W4A16_PAIR_LUT=0 computes each weight in fp32 instead. Both give
# the same rounded weights in the same layout and the same summation order, so the same bits
# on any input. Shapes: K = 11008 (86 k-blocks of 128 rows) and K = 1040 (65 k-tiles: a last
# k-block of one tile), N odd multiples of 64; M = 5 and 17 (row-block remainders 5 and 5) and
# 300; act-order puts group boundaries inside k-tiles (decoded the fp32 way on both).
BLOCKED = {"W4K_W4A16_PAIR_ROWS": "0", "W4K_W4A16_LUT_ROWS": "0"}


@pytest.mark.parametrize("m", [5, 17, 300])
@pytest.mark.parametrize("size_k,size_n", [(11008, 192), (1040, 320)])
@pytest.mark.parametrize("config", ["g128", "g32_zp", "chan_zp_bias", "act_zp"])
def test_blocked_bf16_table_decode_same_bits(monkeypatch, config, size_k, size_n, m):
    b = backend_or_skip("cpu", OP)
    if m == 300 and size_k == 11008:
        size_n = 64  # keeps the float64 reference cheap
    large, small = (128, 32) if size_k % 128 == 0 else (80, 16)
    group, act, zp, bias = {"g128": (large, None, False, False),
                            "g32_zp": (small, None, True, False),
                            "chan_zp_bias": (-1, None, True, True),
                            "act_zp": (large, "k_full", True, True)}[config]
    case = make_case(m, size_k, size_n, group, torch.bfloat16, act, zp, bias, seed=m + size_n)
    outs = []
    for env in [BLOCKED, {**BLOCKED, "W4K_W4A16_PAIR_LUT": "0"}]:
        with monkeypatch.context() as mp:
            for key, value in env.items():
                mp.setenv(key, value)
            outs.append(call(b, case))
    assert golden.same_bits(outs[0], outs[1])
    with monkeypatch.context() as mp:
        for key, value in BLOCKED.items():
            mp.setenv(key, value)
        check_against_reference(b, case)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("m", [37, 300])
def test_threads_same_bits_k11008(dtype, m):
    """K = 11008 (43 k-blocks of 256 rows on the bf16 blocked path), N = 192 (3 chunks: with 1
    and 2 threads the rows are split into different row blocks at M = 300), act-order with
    zero points and bias: 1 and 2 threads give the same bits."""
    b = backend_or_skip("cpu", OP)
    case = make_case(m, 11008, 192, 128, dtype, "k_full", zp=True, bias=True, seed=m + 1)
    assert_threads_same_bits(b, case)


def test_large_call_own_scratch():
    """A call whose scratch exceeds what the binding keeps per thread (64 MiB) gets a buffer of
    its own; rows are independent, so its result must equal the two half calls' (which use the
    kept buffer). fp16 at M = 2048, K = 11008 on the blocked path: a as fp32, 2048 x 11024 x 4
    bytes = 90 MB (no fp32 result there: the blocked path rounds its outputs itself; bf16 would
    need only the bf16 copy of a, half of that)."""
    b = backend_or_skip("cpu", OP)
    case = make_case(2048, 11008, 64, 128, torch.float16, zp=True, bias=True, seed=3)
    whole = call(b, case)
    halves = []
    for rows in (slice(0, 1024), slice(1024, 2048)):
        half = dict(case, a=case["a"][rows].contiguous(), size_m=1024)
        halves.append(call(b, half))
    assert golden.same_bits(whole, torch.cat(halves))


# Every ISA, the same bits (issue 9 item 6). At M <= 8 every path adds the
# products in the AVX-512 decode path's order (lane sums per column, over K slices of 64 k-tiles
# at M <= 4 and all of K in one slice above; decode_order_chunk in w4a16_gemm_kernel.h; bf16 on
# an AVX-512 CPU without BF16, which W4K_W4A16_DPBF16=0 selects, runs the decode path with
# vdpbf16ps emulated); fp16 at 5..8 rows with W4K_W4A16_PAIR_ROWS=4 (the "lut" cases) takes the
# AVX-512 lookup tables, and the other paths their order (lut_order_chunk: 16 lane sums per
# column); above the decode path's rows every blocked path adds each output's products in one
# fp32 chain in the same order (bf16: k = 1, 0, 3, 2, ..., the order vdpbf16ps adds a k-pair's
# two products). So the portable C++,
# the AVX2 path, the AVX-512 fp32 path and the vdpbf16ps path give the same bits on random
# inputs (no subnormal products here: vdpbf16ps flushes those, fma keeps them). Shapes: K =
# 11008 (11 slices; k-blocks of 64 and 256 rows) and 1040 (65 k-tiles: 2 slices), N = 192,
# act-order (k-tiles whose rows span groups: the fp32 decode), zero points, per channel + bias.
ISA_ENVS = {
    "scalar": {"W4K_CPU_ISA": "scalar"},
    "avx2": {"W4K_CPU_ISA": "avx2"},
    "avx512-fp32": {"W4K_W4A16_DPBF16": "0"},
    "avx512-dpbf16": {"W4K_W4A16_FMA_ROWS": "1000"},
    # the decode path's fma form on a CPU with AVX512-BF16 (the default at 2-4 rows where two
    # FMAs beat a vdpbf16ps; here at every M it takes)
    "avx512-dpbf16-fma": {"W4K_W4A16_FMA_ROWS": "1"},
    # the decode path at M <= 3 without its VBMI2 index (pair_index_at<true>): the shift and
    # vpternlogd form every CPU without VBMI2 runs (bf16 here on the vdpbf16ps path, or the
    # emulated one where the CPU has no BF16; fp16 on its own)
    "avx512-no-vbmi2": {"W4K_W4A16_FMA_ROWS": "1000", "W4K_CPU_VBMI2": "0"},
}
ISA_NEEDS = {"scalar": set(), "avx2": {"avx2", "fma", "f16c"},
             "avx512-fp32": {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"},
             "avx512-dpbf16": {"avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16"},
             "avx512-dpbf16-fma": {"avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                                   "avx512_bf16"},
             # only a path of its own where the default takes VBMI2
             "avx512-no-vbmi2": {"avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                                 "avx512_vbmi2"}}
BLOCKED_CASES = [(torch.bfloat16, 1), (torch.bfloat16, 3), (torch.bfloat16, 4),
                 (torch.float16, 1), (torch.float16, 4), (torch.float16, 5), (torch.float16, 8),
                 (torch.bfloat16, 5), (torch.bfloat16, 8), (torch.bfloat16, 9),
                 (torch.bfloat16, 37),
                 (torch.float16, 9), (torch.float16, 16),
                 (torch.float16, 37), (torch.bfloat16, 300), (torch.float16, 300)]
# fp16 through the lookup tables (W4K_W4A16_PAIR_ROWS=4) and, on the other ISAs, their order.
LUT_CASES = [(torch.float16, 5), (torch.float16, 8)]


# M = 300 at K = 1040 only (the portable path at K = 11008 would take seconds per case).
ISA_CASES = ([(d, m, k, False) for d, m in BLOCKED_CASES for k in (11008, 1040)
              if not (m == 300 and k == 11008)] +
             [(d, m, k, True) for d, m in LUT_CASES for k in (11008, 1040)])


@pytest.mark.parametrize("dtype,m,size_k,lut", ISA_CASES,
                         ids=[f"{str(d)[6:]}-M{m}-K{k}" + ("-lut" if lut else "")
                              for d, m, k, lut in ISA_CASES])
@pytest.mark.parametrize("config", ["g128", "g32_zp", "chan_zp_bias", "act_zp"])
def test_paths_same_bits_every_isa(monkeypatch, config, size_k, dtype, m, lut):
    b = backend_or_skip("cpu", OP)
    large, small = (128, 32) if size_k % 128 == 0 else (80, 16)
    group, act, zp, bias = {"g128": (large, None, False, False),
                            "g32_zp": (small, None, True, False),
                            "chan_zp_bias": (-1, None, True, True),
                            "act_zp": (large, "k_full", True, True)}[config]
    case = make_case(m, size_k, 192, group, dtype, act, zp, bias, seed=m + size_k)
    _assert_every_path_same_bits(monkeypatch, b, case, dtype, lut)
    check_against_reference(b, case)


def _assert_every_path_same_bits(monkeypatch, b, case, dtype, lut=False):
    """Runs the case on every path of ISA_ENVS this CPU has (fp16: not avx512-dpbf16, which is
    avx512-fp32 for it) and asserts they all give the same bits; skips below two paths."""
    flags = cpu_flags()
    excluded = set()
    if dtype == torch.float16:
        excluded |= {"avx512-dpbf16", "avx512-dpbf16-fma"}  # fp16: the avx512-fp32 path
    paths = [name for name, need in ISA_NEEDS.items() if need <= flags and name not in excluded]
    if len(paths) < 2:
        pytest.skip(f"this CPU runs fewer than two of the paths ({paths})")
    outs = {}
    for name in paths:
        with monkeypatch.context() as mp:
            mp.setenv("W4K_W4A16_DEQUANT_THRESHOLD", "1000000")  # the kernel, not the dense route
            # AMX tiles add in their own order (their own bits: test_cpu_amx.py); the avx512
            # paths here are the vdpbf16ps / fp32 ones every ISA shares.
            mp.setenv("W4K_CPU_AMX", "0")
            if lut:
                mp.setenv("W4K_W4A16_PAIR_ROWS", "4")
            for key, value in ISA_ENVS[name].items():
                mp.setenv(key, value)
            outs[name] = call(b, case)
    first = paths[0]
    for name in paths[1:]:
        assert golden.same_bits(outs[name], outs[first]), f"{name} and {first} differ"


# The same on inputs where the fp32 summation order shows in the output (make_case's `cancel`:
# on plain random inputs an order change moves the fp32 sums by about an ulp, which the
# rounding to fp16 / bf16 hides almost always). K = 1040, every path this CPU has.
CANCEL_CASES = [(d, m) for d in (torch.float16, torch.bfloat16) for m in (1, 3, 4, 5, 8, 9, 37)]


@pytest.mark.parametrize("dtype,m", CANCEL_CASES,
                         ids=[f"{str(d)[6:]}-M{m}" for d, m in CANCEL_CASES])
@pytest.mark.parametrize("config", ["g16_zp", "g80", "chan_zp_bias"])
def test_paths_same_bits_every_isa_cancelling_input(monkeypatch, config, dtype, m):
    b = backend_or_skip("cpu", OP)
    group, zp, bias = {"g16_zp": (16, True, False), "g80": (80, False, False),
                       "chan_zp_bias": (-1, True, True)}[config]
    case = make_case(m, 1040, 192, group, dtype, None, zp, bias, seed=m, cancel=True)
    _assert_every_path_same_bits(monkeypatch, b, case, dtype)


@pytest.mark.parametrize("m", [1, 4, 7])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_paths_same_bits_every_isa_weight_rounding_edges(monkeypatch, dtype, m):
    """The weight edges of test_w4a16_gemm_avx2.py (fp16 overflow and subnormals, bf16 denormal
    and fp32-overflowing products, NaN and infinite scales) through every path this CPU has, the
    AVX-512 decode path's lookup tables (M <= 8) included: the same bits, NaN included. The
    tables form (q - z) * s as the other paths do, not as the fma q * s - z * s, which an
    infinite scale turns into inf - inf = NaN wherever q and z are both nonzero."""
    b = backend_or_skip("cpu", OP)
    case = make_case(m, 256, 128, 64, dtype, zp=True, seed=11 + m)
    if dtype == torch.float16:
        values = [60000.0, -65504.0, 2.0 ** -14, 1.5 * 2.0 ** -17, 3 * 2.0 ** -24, float("nan"),
                  float("inf")]
    else:
        values = [1e-39, -3e-39, 2.0 ** -130, 1e38, float("nan"), float("-inf")]
    _edge_scales(case, values)
    _assert_every_path_same_bits(monkeypatch, b, case, dtype)
