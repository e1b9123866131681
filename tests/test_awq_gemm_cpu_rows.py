"""awq_gemm's row path (csrc/cpu/awq_gemm_cpu_rows.h): AutoAWQ rows decoded by arithmetic with
the columns in the lanes, summed in the tile path's order, so its bits must be the portable
tile path's (chunk_scalar: W4K_CPU_ISA=scalar with the lookups off, W4K_AWQ_LUT_ROWS=0).

It runs by default for bf16 at M = 1 on a CPU with AMX-BF16 (W4K_CPU_AMX=0 turns it off there,
which is how the other path tests see the lookup path) and on an AMD CPU of family 1Ah (Zen 5) or
later, where it is a choice by the CPU alone, so the AVX2 and portable paths sum in the tile order
there too whatever W4K_CPU_ISA says (W4K_AWQ_ROW_ROWS=0 turns it off); W4K_AWQ_ROW_ROWS=n runs it
at M <= min(n, 3) on any CPU with AVX-512 BF16 + VBMI, and the AVX2 and portable paths then sum in
the tile order too, so the bits agree on every ISA with the knob set. A profiler event names the
path, so the tests know that it ran rather than the tile path it must agree with.
"""

import pytest
import torch
from torch.profiler import profile

import golden
from conftest import cpu_flags, cpuinfo_field
from numerics import assert_gemm_close
from test_awq_gemm_cpu_paths import _awq, _cancelling
from w4kernels import reference

pytestmark = pytest.mark.skipif(not hasattr(torch.ops.w4kernels, "awq_gemm"),
                                reason="w4kernels._C not built")

EVENT = "w4kernels::awq_gemm[rows]"
ROW_CPU = {"avx512f", "avx512bw", "avx512_bf16", "avx512vbmi"} <= cpu_flags()
AMX_CPU = ROW_CPU and {"amx_tile", "amx_bf16"} <= cpu_flags()


def _amd_family() -> int:
    """The CPU family /proc/cpuinfo gives an AMD CPU (0x1A: Zen 5), 0 for any other vendor."""
    family = cpuinfo_field("cpu family")
    return int(family) if cpuinfo_field("vendor_id") == "AuthenticAMD" and family else 0


# the CPUs where the row path is the default at M = 1 by the CPU alone (awq_gemm_cpu_rows.h)
ZEN5_CPU = _amd_family() >= 0x1A


def _run(monkeypatch, env, threads, x, qw, s, qz, events=None):
    with monkeypatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        old = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            if events is None:
                return torch.ops.w4kernels.awq_gemm(x, qw, s, qz, 8)
            with profile() as prof:
                out = torch.ops.w4kernels.awq_gemm(x, qw, s, qz, 8)
            events.extend(e.name for e in prof.events())
            return out
        finally:
            torch.set_num_threads(old)


ROWS = {"W4K_AWQ_ROW_ROWS": "3"}
PORTABLE = {"W4K_CPU_ISA": "scalar", "W4K_AWQ_LUT_ROWS": "0", "W4K_CPU_AMX": "0"}


def _row_cpu_or_skip():
    if not ROW_CPU:
        pytest.skip("the row path needs AVX-512 (BF16 + VBMI); on this CPU it cannot run")


# (M, K, N, group size): N = 136 a 1-word tail (17 words: a line and a word), N = 8 one word,
# 1088 = 8.5 lines, 4160 = 32.5 lines; K = 11008 86 groups; group 2: a pair per group; 40: a
# group of 2.5 strips; 1040: one group of 65 strips.
CASES = [
    (1, 256, 320, 32), (2, 256, 1088, 64), (3, 128, 136, 128), (3, 512, 64, 128),
    (1, 11008, 192, 128), (2, 1040, 136, 1040), (3, 200, 136, 40), (1, 64, 8, 2),
    (3, 512, 4160, 64), (2, 4096, 256, 32),
]


@pytest.mark.parametrize("size_m,size_k,size_n,group_size", CASES)
def test_awq_rows_bits_are_the_tile_paths(monkeypatch, size_m, size_k, size_n, group_size):
    _row_cpu_or_skip()
    qw, s, qz = _awq(size_k, size_n, group_size, torch.bfloat16, seed=size_m + size_k)
    x = torch.randn(size_m, size_k, generator=torch.Generator().manual_seed(size_n)).bfloat16()
    events = []
    out = _run(monkeypatch, ROWS, 2, x, qw, s, qz, events)
    assert EVENT in events, "the row path did not run"
    portable = _run(monkeypatch, PORTABLE, 2, x, qw, s, qz)
    assert golden.same_bits(out, portable), "row path and portable tile path differ"
    # both dot forms (vdpbf16ps, its fma form), 1 and 2 threads, every item width
    for form in ("1", "9"):
        for threads in (1, 2):
            got = _run(monkeypatch, {**ROWS, "W4K_AWQ_FMA_ROWS": form}, threads, x, qw, s, qz)
            assert golden.same_bits(got, portable), f"fma rows {form}, {threads} thread(s)"
    for lines in ("1", "3", "64"):
        got = _run(monkeypatch, {**ROWS, "W4K_AWQ_LUT_LINES": lines}, 2, x, qw, s, qz)
        assert golden.same_bits(got, portable), f"{lines} lines per item"
    # with the knob the AVX2 path sums in the same order
    avx2 = _run(monkeypatch, {**ROWS, "W4K_CPU_ISA": "avx2"}, 2, x, qw, s, qz)
    assert golden.same_bits(avx2, portable), "AVX2 path with W4K_AWQ_ROW_ROWS differs"
    w = reference.awq_dequantize(qw, s, qz)
    assert_gemm_close(out, x.double() @ w.double(), x, w)


@pytest.mark.parametrize("size_m", [1, 2, 3])
def test_awq_rows_order_on_cancelling_input(monkeypatch, size_m):
    """On inputs where the fp32 order shows after the rounding to bf16, the row path gives the
    tile order's bits and not the lookup order's."""
    _row_cpu_or_skip()
    qw, s, qz = _awq(512, 320, 64, torch.bfloat16, seed=size_m)
    x = torch.randn(size_m, 512, generator=torch.Generator().manual_seed(7)).bfloat16()
    qw, x = _cancelling(qw, x, 64)
    out = _run(monkeypatch, ROWS, 2, x, qw, s, qz)
    assert golden.same_bits(out, _run(monkeypatch, PORTABLE, 2, x, qw, s, qz))
    lookup = _run(monkeypatch, {"W4K_CPU_ISA": "scalar", "W4K_CPU_AMX": "0",
                                "W4K_AWQ_ROW_ROWS": "0"}, 2, x, qw, s, qz)
    assert not golden.same_bits(out, lookup), "the input does not show the order"


@pytest.mark.parametrize("value", [float("inf"), float("nan"), 2.0 ** 124, -(2.0 ** 123)])
def test_awq_rows_hostile_scale_takes_the_portable_line(monkeypatch, value):
    """A scale the decode cannot take exactly ((16 + z) s may overflow where (-z) s does not; not
    finite) sends its 128-column line to the portable code: the same bits (NaN included) as the
    portable path, the other lines on the row path."""
    _row_cpu_or_skip()
    qw, s, qz = _awq(256, 520, 32, torch.bfloat16, seed=5)
    s[3, 130] = value  # line 1 of 5 (columns 128..255), group 3
    # small x: with a scale of 2^124 the portable sums stay finite, while 16 s would be inf
    x = (torch.randn(2, 256, generator=torch.Generator().manual_seed(6)) * 2.0 ** -8).bfloat16()
    for m in (1, 2):
        out = _run(monkeypatch, ROWS, 2, x[:m], qw, s, qz)
        portable = _run(monkeypatch, PORTABLE, 2, x[:m], qw, s, qz)
        assert golden.same_bits(out, portable)
        if abs(value) < float("inf"):
            assert torch.isfinite(portable).all()


def test_awq_rows_default_rows(monkeypatch):
    """Where it runs without the knob: bf16 at M = 1 on a CPU with AMX-BF16 (not at 2, not
    with W4K_CPU_AMX=0, not for fp16, not with an odd group size) and on an AMD CPU of family
    1Ah or later (there W4K_CPU_AMX=0 does not turn it off, W4K_AWQ_ROW_ROWS=0 does, and the
    AVX2 and portable paths then give its bits), nowhere on other CPUs."""
    if not ROW_CPU:
        pytest.skip("the row path needs AVX-512 (BF16 + VBMI); on this CPU it cannot run")
    monkeypatch.delenv("W4K_AWQ_ROW_ROWS", raising=False)
    amx = AMX_CPU
    qw, s, qz = _awq(256, 256, 64, torch.bfloat16, seed=1)
    for m in (1, 2, 4):
        x = torch.randn(m, 256, generator=torch.Generator().manual_seed(m)).bfloat16()
        events = []
        _run(monkeypatch, {}, 2, x, qw, s, qz, events)
        assert (EVENT in events) == ((amx or ZEN5_CPU) and m == 1), m
        events = []
        out = _run(monkeypatch, {"W4K_CPU_AMX": "0"}, 2, x, qw, s, qz, events)
        assert (EVENT in events) == (ZEN5_CPU and m == 1), m
        if ZEN5_CPU:  # a choice by the CPU: the other ISAs sum in the same order
            for isa in ("avx2", "scalar"):
                got = _run(monkeypatch, {"W4K_CPU_ISA": isa}, 2, x, qw, s, qz)
                assert golden.same_bits(got, out), (m, isa)
        events = []
        _run(monkeypatch, {"W4K_AWQ_ROW_ROWS": "0"}, 2, x, qw, s, qz, events)
        assert EVENT not in events
        events = []
        _run(monkeypatch, {}, 2, x.half(), qw, s.half(), qz, events)
        assert EVENT not in events
    qw, s, qz = _awq(210, 256, 35, torch.bfloat16, seed=2)
    x = torch.randn(1, 210, generator=torch.Generator().manual_seed(3)).bfloat16()
    events = []
    out = _run(monkeypatch, ROWS, 2, x, qw, s, qz, events)
    assert EVENT not in events
    assert golden.same_bits(out, _run(monkeypatch, PORTABLE, 2, x, qw, s, qz))
