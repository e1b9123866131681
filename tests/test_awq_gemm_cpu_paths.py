"""awq_gemm on the CPU: every kernel path gives the same bits, on the shapes that pick each path.

The CPU kernel (csrc/cpu/awq_gemm_cpu.h) has, per activation dtype and ISA:
  * M <= 8 (bf16) or 7 (fp16), K and group size multiples of 16: the table-lookup decode path
    (K in lanes);
  * otherwise the tile path (a K strip of 64 columns decoded once, 6-row micro-kernel);
and a portable mirror of each (W4K_CPU_ISA=scalar, or a CPU without AVX2) that performs the
same roundings and the same fma chain per output, so the bits must agree. The AVX2 path
(W4K_CPU_ISA=avx2, or a CPU without AVX-512 BF16/VBMI: csrc/cpu/awq_gemm_cpu_avx2.h) runs one
kernel in either summation order and must give the same bits too. On a CPU without AVX-512 the
"avx512" runs fall back to AVX2, without AVX2 both fall back to the portable code (the tests then
compare a path with itself: they still check threads and the float64 reference). The
results are also checked against the float64 reference (tests/numerics.py bound). On a CPU with
AMX the bf16 tile path would use AMX tiles, which sum in their own order: these tests turn them
off (W4K_CPU_AMX=0); test_cpu_amx.py tests that path.
"""

import pytest
import torch

import golden
from numerics import assert_gemm_close
from w4kernels import reference

pytestmark = pytest.mark.skipif(not hasattr(torch.ops.w4kernels, "awq_gemm"),
                                reason="w4kernels._C not built")


def _awq(size_k, size_n, group_size, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    groups = size_k // group_size
    qweight = torch.randint(-2**31, 2**31 - 1, (size_k, size_n // 8), dtype=torch.int32, generator=g)
    qzeros = torch.randint(-2**31, 2**31 - 1, (groups, size_n // 8), dtype=torch.int32, generator=g)
    scales = (torch.rand(groups, size_n, generator=g) * 0.02 + 1e-3).to(dtype)
    scales[0, :5] = -scales[0, :5]  # negative scales: q == z must still give +0
    return qweight, scales, qzeros


def _run(monkeypatch, isa, threads, x, qw, s, qz):
    monkeypatch.setenv("W4K_CPU_ISA", isa)
    # The vdpbf16ps path on a CPU with AMX too: AMX tiles add in their own order (their own
    # bits, tested in test_cpu_amx.py).
    monkeypatch.setenv("W4K_CPU_AMX", "0")
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return torch.ops.w4kernels.awq_gemm(x, qw, s, qz, 8)
    finally:
        torch.set_num_threads(old)


# (M, K, N, group size, dtype): which path each exercises is in the comment.
CASES = [
    (1, 256, 320, 32, torch.bfloat16),     # lookup path, a line and a half (partial line)
    (2, 256, 1088, 64, torch.bfloat16),    # lookup path, two work items (8 lines each) + tail
    (3, 128, 136, 128, torch.bfloat16),    # lookup path, N = 136: a 1-word tail
    (4, 512, 64, 128, torch.bfloat16),     # lookup path, M = 4
    (1, 11008, 192, 128, torch.bfloat16),  # lookup path, K = 11008 (86 groups)
    (9, 11008, 192, 128, torch.bfloat16),  # tile path, K = 11008, 43 strips of 256 rows
    (5, 11008, 192, 128, torch.bfloat16),  # lookup path at 5-8 rows (bf16): 1-line items
    (6, 256, 1088, 64, torch.bfloat16),    # lookup path, 9 work items, 1-word tail
    (7, 1040, 136, 1040, torch.bfloat16),  # lookup path, one group of 1040 rows, 1-word tail
    (8, 512, 320, 32, torch.bfloat16),     # lookup path, M = 8 (AVX2: two passes of 4 rows)
    (8, 512, 320, 32, torch.float16),      # fp16 from 8 rows: tile path
    (5, 512, 320, 32, torch.float16),      # fp16 lookup at 5-7 rows (AVX2: passes of 3 rows, 3+2)
    (6, 256, 1088, 64, torch.float16),     # fp16 lookup, 3+3 rows, 9 work items, 1-word tail
    (7, 1040, 136, 1040, torch.float16),   # fp16 lookup, 3+3+1 rows, one group of 1040 rows
    (1, 11008, 192, 128, torch.float16),   # tile path (fp16), K = 11008
    (3, 200, 136, 40, torch.bfloat16),     # tile path at small M: group size not a multiple of 16
    (2, 105, 64, 35, torch.bfloat16),      # tile path, K odd: the last bf16 pair is (x, 0)
    (2, 105, 64, 35, torch.float16),
    (7, 136, 72, 8, torch.float16),        # K not a multiple of the 128-row strip, group 8
    (299, 256, 128, 64, torch.bfloat16),   # tile path, M = 49 * 6 + 5
    (300, 256, 128, 64, torch.float16),    # tile path, M = 50 * 6
    (16, 4096, 64, 32, torch.bfloat16),    # tile path, group 32
    (4, 11008, 256, 32, torch.float16),    # lookup order (fp16: 16 lanes), K = 11008, group 32
    (37, 1001, 136, 77, torch.bfloat16),   # tile path, odd K across strips, M = 6 * 6 + 1
    (300, 105, 64, 35, torch.bfloat16),    # tile path, odd K at M = 300
    (2, 4096, 8, 32, torch.float16),       # N = 8: one word, a 1-word block
    # fp16 lookup path (lut_rows_fp16: vpermps on fp32 tables): 4 pairs per pass at M <= 2,
    # 2 at M = 3, 4; partial lines and a 1-word tail
    (1, 256, 320, 32, torch.float16),
    (2, 512, 1088, 64, torch.float16),
    (3, 128, 136, 128, torch.float16),
    # one group of 1040 rows: 128-row strips of the lookup path and a last strip of one tile
    (2, 1040, 128, 1040, torch.bfloat16),
    (1, 1040, 128, 1040, torch.float16),
]


@pytest.mark.parametrize("size_m,size_k,size_n,group_size,dtype", CASES)
def test_awq_gemm_cpu_paths_bit_identical(monkeypatch, size_m, size_k, size_n, group_size, dtype):
    qw, s, qz = _awq(size_k, size_n, group_size, dtype, seed=size_m + size_k)
    x = torch.randn(size_m, size_k, generator=torch.Generator().manual_seed(size_n)).to(dtype)
    simd2 = _run(monkeypatch, "avx512", 2, x, qw, s, qz)
    simd1 = _run(monkeypatch, "avx512", 1, x, qw, s, qz)
    # bf16 lookups: vdpbf16ps, and its fma form at every M (the default from 2 rows where two
    # FMAs are cheaper than a vdpbf16ps)
    forms = {}
    for rows in ("1000", "1"):
        monkeypatch.setenv("W4K_AWQ_FMA_ROWS", rows)
        forms[rows] = _run(monkeypatch, "avx512", 2, x, qw, s, qz)
    monkeypatch.delenv("W4K_AWQ_FMA_ROWS")
    avx2_2 = _run(monkeypatch, "avx2", 2, x, qw, s, qz)
    avx2_1 = _run(monkeypatch, "avx2", 1, x, qw, s, qz)
    # in the lookup order the AVX2 path sums by vpshufb table lookups; the knob selects
    # its fp32 strip decode in the same order
    monkeypatch.setenv("W4K_AWQ_AVX2_LOOKUP", "0")
    avx2_strip = _run(monkeypatch, "avx2", 2, x, qw, s, qz)
    monkeypatch.delenv("W4K_AWQ_AVX2_LOOKUP")
    portable = _run(monkeypatch, "scalar", 2, x, qw, s, qz)
    assert golden.same_bits(avx2_2, avx2_strip), "AVX2 path: lookups and strip decode differ"
    assert golden.same_bits(simd2, simd1), "threads 1 and 2 differ"
    assert golden.same_bits(avx2_2, avx2_1), "AVX2 path: threads 1 and 2 differ"
    assert golden.same_bits(simd2, portable), "AVX-512 and portable paths differ"
    assert golden.same_bits(forms["1000"], portable), "vdpbf16ps lookups and portable differ"
    assert golden.same_bits(forms["1"], portable), "fma-form lookups and portable differ"
    assert golden.same_bits(avx2_2, portable), "AVX2 and portable paths differ"
    w = reference.awq_dequantize(qw, s, qz)
    assert_gemm_close(simd2, x.double() @ w.double(), x, w)


@pytest.mark.parametrize("size_m,size_k,size_n,group_size,dtype", [
    (1, 512, 2176, 128, torch.bfloat16),
    (2, 512, 4160, 128, torch.bfloat16),
    (4, 512, 2176, 128, torch.float16),
    (3, 768, 4160, 48, torch.bfloat16),  # strips spanning 3-4 groups: 4 tables a block (AVX2)
    (1, 512, 1088, 16, torch.float16),   # 8 groups a strip
    (6, 512, 2176, 64, torch.bfloat16),  # M > 4: the narrow items
])
def test_awq_gemm_cpu_lookup_item_width_keeps_bits(monkeypatch, size_m, size_k, size_n,
                                                     group_size, dtype):
    # The lookup path's work items span a number of 128-column lines chosen by M, N and the
    # thread count (AVX-512: lut_lines, 4 / 8 / 16 lines; AVX2: lut_avx2_blocks, 2 / 4 / 8
    # lines); W4K_AWQ_LUT_LINES forces a width on both. N = 2176 is 17 lines (items of 8 or 16
    # lines and a short last one), N = 4160 32.5 (a partial last line). Every width must give
    # the default's bits, which are the portable path's.
    qw, s, qz = _awq(size_k, size_n, group_size, dtype, seed=size_n + group_size)
    x = torch.randn(size_m, size_k, generator=torch.Generator().manual_seed(size_m)).to(dtype)
    default = _run(monkeypatch, "avx512", 2, x, qw, s, qz)
    portable = _run(monkeypatch, "scalar", 2, x, qw, s, qz)
    assert golden.same_bits(portable, default)
    for isa in ("avx512", "avx2"):
        for threads in (1, 2):
            out = _run(monkeypatch, isa, threads, x, qw, s, qz)
            assert golden.same_bits(out, default), f"{isa}, default width, {threads} threads"
        for lines in ("1", "4", "8", "16", "64"):
            monkeypatch.setenv("W4K_AWQ_LUT_LINES", lines)
            for threads in (1, 2):
                out = _run(monkeypatch, isa, threads, x, qw, s, qz)
                assert golden.same_bits(out, default), f"{isa}, {lines} lines, {threads} threads"
            monkeypatch.delenv("W4K_AWQ_LUT_LINES")
    w = reference.awq_dequantize(qw, s, qz)
    assert_gemm_close(default, x.double() @ w.double(), x, w)


def _cancelling(qw, x, group_size):
    """Makes the fp32 summation order show in the output (as make_case's `cancel` does for
    w4a16_gemm): in every 16-row tile whose rows 3 and 12 share a group, row 12 of the weight
    repeats row 3 and x holds +L and -L there. The two products cancel exactly, but every fp32
    sum they pass through loses low bits to L * w, and which bits depends on the order: the
    tile path pairs rows (2, 3) and (12, 13), the lookup path puts them in different lanes.
    On plain random inputs an order change moves a sum by about an ulp, which the rounding to
    fp16 / bf16 hides almost always."""
    qw, x = qw.clone(), x.clone()
    fp16 = x.dtype == torch.float16
    x = (x.float() * (2.0 ** -8 if fp16 else 1.0)).to(x.dtype)  # fp16: room below 65504 for L
    big = 2.0 ** 15 if fp16 else 2.0 ** 24
    for t in range(qw.shape[0] // 16):
        r = 16 * t + 3
        for r2 in (16 * t + 12, 16 * t + 7):  # row 7: groups of 8
            if r // group_size == r2 // group_size:
                qw[r2] = qw[r]
                x[:, r], x[:, r2] = big, -big
                break
    return qw, x


@pytest.mark.parametrize("size_m,size_k,size_n,group_size,dtype", CASES)
def test_awq_gemm_cpu_paths_same_bits_cancelling_input(monkeypatch, size_m, size_k, size_n,
                                                      group_size, dtype):
    """Every path and thread count adds the same products in the same fp32 order: the same
    cases as above on inputs where a different order changes the rounded output."""
    qw, s, qz = _awq(size_k, size_n, group_size, dtype, seed=size_m + size_k)
    x = torch.randn(size_m, size_k, generator=torch.Generator().manual_seed(size_n)).to(dtype)
    qw, x = _cancelling(qw, x, group_size)
    ref = x.double() @ reference.awq_dequantize(qw, s, qz).double()
    out = _run(monkeypatch, "avx512", 2, x, qw, s, qz)
    # the input does what it is for: the fp32 rounding residue shows after the rounding to T
    assert not golden.same_bits(out, ref.to(dtype))
    for isa, threads in [("avx512", 1), ("avx2", 2), ("avx2", 1), ("scalar", 2)]:
        assert golden.same_bits(_run(monkeypatch, isa, threads, x, qw, s, qz), out), \
            f"{isa}, {threads} thread(s) differ from avx512, 2 threads"
    for rows in ("1000", "1"):  # vdpbf16ps and its fma form in the bf16 lookups
        monkeypatch.setenv("W4K_AWQ_FMA_ROWS", rows)
        assert golden.same_bits(_run(monkeypatch, "avx512", 2, x, qw, s, qz), out), rows
    monkeypatch.delenv("W4K_AWQ_FMA_ROWS")
    monkeypatch.setenv("W4K_AWQ_AVX2_LOOKUP", "0")  # the AVX2 strip decode in lookup order
    assert golden.same_bits(_run(monkeypatch, "avx2", 2, x, qw, s, qz), out)


def test_awq_gemm_cpu_lookup_path_summation_order(monkeypatch):
    """Regression guard on the lookup path's fixed order: the same result whatever the column
    position within a line, a work item or the tail (columns are independent sums)."""
    qw, s, qz = _awq(64, 1024 + 128, 64, torch.bfloat16, seed=3)
    x = torch.randn(1, 64, generator=torch.Generator().manual_seed(4)).bfloat16()
    full = _run(monkeypatch, "avx512", 2, x, qw, s, qz)
    part = _run(monkeypatch, "avx512", 2, x, qw[:, -16:].contiguous(), s[:, -128:].contiguous(),
                qz[:, -16:].contiguous())
    assert golden.same_bits(full[:, -128:], part)


@pytest.mark.parametrize("size_m", [2, 8])
def test_awq_gemm_cpu_fp16_denormal_weights_bit_identical(monkeypatch, size_m):
    """Scales of 1e-6..1e-5 make most fp16 weights denormal (< 2^-14): the portable rounding
    (round_half) must match vcvtps2ph there too, on the lookup (M = 2) and tile (M = 8) paths."""
    qw, s, qz = _awq(256, 128, 64, torch.float16, seed=size_m)
    s = (s.float() * 5e-4).half()
    assert (s.abs() < 2.0**-14).all()
    x = torch.randn(size_m, 256, generator=torch.Generator().manual_seed(9)).half()
    simd = _run(monkeypatch, "avx512", 2, x, qw, s, qz)
    avx2 = _run(monkeypatch, "avx2", 2, x, qw, s, qz)
    portable = _run(monkeypatch, "scalar", 1, x, qw, s, qz)
    assert golden.same_bits(simd, portable)
    assert golden.same_bits(avx2, portable)
    w = reference.awq_dequantize(qw, s, qz)
    assert_gemm_close(simd, x.double() @ w.double(), x, w)


@pytest.mark.parametrize("size_m", [1, 9])
def test_awq_gemm_cpu_avx2_bf16_weight_rounding_edges(monkeypatch, size_m):
    """The AVX2 path rounds bf16 weights in integer ops: it must match round_bf16 (= what
    vcvtne2ps2bf16 does) where that is not plain RNE: a denormal scale (weights below FLT_MIN
    become signed zeros) and a NaN scale (a quiet NaN), on the lookup (M = 1) and tile (M = 9)
    orders. Compared with the portable path only: vdpbf16ps would also flush denormal sums."""
    qw, s, qz = _awq(128, 128, 32, torch.bfloat16, seed=11 + size_m)
    s[1] = (s[1].float() * 1e-37).bfloat16()  # denormal scales: weights below FLT_MIN flush
    assert (s[1].float().abs() < torch.finfo(torch.float32).tiny).all()
    s[2, 3] = float("nan")                    # one column's group 2 weights are NaN
    x = torch.randn(size_m, 128, generator=torch.Generator().manual_seed(5)).bfloat16()
    avx2 = _run(monkeypatch, "avx2", 2, x, qw, s, qz)
    portable = _run(monkeypatch, "scalar", 1, x, qw, s, qz)
    assert golden.same_bits(avx2, portable)
    assert torch.isnan(avx2[:, 3]).all() and not torch.isnan(avx2[:, :3]).any()
