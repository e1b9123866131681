"""The int8-activation mode (issue 9 item 2): ``w4a8_gemm`` (Marlin-format tensors) and
``awq_gemm_a8`` (AutoAWQ tensors), CPU only.

* Against :func:`reference.w4a8_gemm` / :func:`reference.awq_gemm_a8`, which quantize the
  activation exactly as the kernels do and sum in float64: the only differences left are the
  kernels' fp32 accumulation over blocks and the output rounding (``_tight_tol``).
* Against the float64 product of the *unquantized* activation with the exact weight: the error
  bound stated in ``ops.A8_DOC`` (``_bound``), on random inputs and on blocks with outliers.
* Every path gives the same bits: the AVX-512 VNNI path, the portable C++ path
  (``W4K_CPU_ISA=scalar``), 1 and 2 threads.
* Error messages (``op: argument ...``), the Meta kernels, and the modules' opt-in.
"""

import contextlib
import os

import pytest
import torch

from w4kernels import nn as wnn
from w4kernels import ops, quant, reference
from conftest import cpu_flags
from test_w4a16_gemm import make_case

U = 2.0 ** -24  # fp32 unit roundoff
OUT_P = {torch.bfloat16: 8, torch.float16: 11}  # output rounding: |T(y) - y| <= 2^-p |y|
BF, FP = torch.bfloat16, torch.float16


@contextlib.contextmanager
def cpu_isa(value):
    old = os.environ.get("W4K_CPU_ISA")
    if value is None:
        os.environ.pop("W4K_CPU_ISA", None)
    else:
        os.environ["W4K_CPU_ISA"] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("W4K_CPU_ISA", None)
        else:
            os.environ["W4K_CPU_ISA"] = old


@contextlib.contextmanager
def threads(n):
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


# ---- operands ----------------------------------------------------------------------------------


def marlin_case(m, k, n, group, dtype, act_order=None, zp=False, bias=False, seed=0):
    """(w4a8_gemm args, a in weight-row order, exact float64 weight [K, N] in Marlin row order,
    group size)."""
    c = make_case(m, k, n, group, dtype, act_order, zp=zp, bias=bias, seed=seed)
    args = [c["a"], c["b_q_weight"], c["b_scales"], c["b_zeros"], c["g_idx"], c["perm"], 4, m, n,
            k, True, c["b_bias"]]
    num_groups = c["_s"].shape[0]
    groups = (c["g_idx"].long() if c["g_idx"] is not None
              else torch.arange(k) // (k // num_groups))
    w = c["_qz"].double() * c["_s"].double()[groups]
    a_rows = c["a"][:, c["perm"].long()] if c["perm"] is not None else c["a"]
    return args, a_rows, w, k // num_groups


def awq_case(m, k, n, group, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    num_groups = k // group
    q = torch.randint(0, 16, (k, n), dtype=torch.int32, generator=gen)
    z = torch.randint(0, 16, (num_groups, n), dtype=torch.int32, generator=gen)
    s = ((torch.rand(num_groups, n, generator=gen) + 0.05) * 0.02).to(dtype)
    s[torch.rand(num_groups, n, generator=gen) < 0.25] *= -1
    x = torch.randn(m, k, generator=gen).to(dtype)
    w = (q - z.repeat_interleave(group, 0)).double() * s.double().repeat_interleave(group, 0)
    return [x, reference.awq_pack(q), s, reference.awq_pack(z)], x, w, group


def _tight_tol(out_ref, a_rows, w, group, bias):
    """What the kernels may add to the float64 sums of the reference: the fp32 fma chain over
    B blocks (each step rounds once, and sa * sw rounds once: (B + 2) u times the sum of the
    terms' magnitudes, bounded by sum_b sa_b * sum_k |qa_k * w_k| <= the same with the
    activation's |a| + sa / 2) plus the output rounding."""
    block = reference.a8_block_size(group)
    nb = a_rows.shape[1] // block
    qa, sa = reference.quantize_a8(a_rows, block)
    mag = torch.einsum("mbk,bkn->mbn", qa.double().abs().reshape(-1, nb, block),
                       w.abs().reshape(nb, block, -1))
    terms = (mag * sa.double().unsqueeze(-1)).sum(1)
    if bias is not None:
        terms = terms + bias.double().abs()
    p = OUT_P[a_rows.dtype]
    return (nb + 2) * U * terms * (1 + 2.0 ** -p) + 2.0 ** -p * out_ref.abs() + 2.0 ** -24


def _bound(out, a_rows, w, group, bias):
    """ops.A8_DOC's bound on |out - a @ w| (a unquantized, w exact)."""
    block = reference.a8_block_size(group)
    nb = a_rows.shape[1] // block
    qa, sa = reference.quantize_a8(a_rows, block)
    wabs = w.abs().reshape(nb, block, -1).sum(1)  # [B, N]
    act = (sa.double() / 2 * (1 + 2.0 ** -16)) @ wabs
    mag = torch.einsum("mbk,bkn->mbn", qa.double().abs().reshape(-1, nb, block),
                       w.abs().reshape(nb, block, -1))
    terms = (mag * sa.double().unsqueeze(-1)).sum(1)
    if bias is not None:
        terms = terms + bias.double().abs()
    p = OUT_P[a_rows.dtype]
    return act + (nb + 2) * U * terms + 2.0 ** -p * out.double().abs() + 2.0 ** -24


def _exact(a_rows, w, bias):
    out = a_rows.double() @ w
    return out if bias is None else out + bias.double()


# ---- Marlin: w4a8_gemm ---------------------------------------------------------------------------

# (M, K, N, group, act_order, zero points, bias, dtype)
MARLIN_CASES = [
    (1, 256, 128, 128, None, False, False, BF),
    (3, 512, 192, 64, None, True, True, FP),
    (4, 256, 64, 32, "k_full", True, False, BF),
    (2, 512, 128, 256, None, False, True, BF),     # group 256: blocks of 128 inside a group
    (7, 1024, 128, -1, None, False, True, BF),     # per channel: blocks of 128
    (13, 1040, 64, -1, None, True, False, FP),     # per channel, K = 1040: blocks of 16
    (37, 256, 320, 128, "k_full", False, True, FP),  # N = 5 chunks
    (6, 384, 64, 128, "k_full", True, True, BF),
    (300, 128, 64, 64, None, True, False, BF),
    (5, 11008, 64, 128, None, False, False, BF),
    (2, 256, 1600, 128, None, True, False, BF),  # 25 chunks: 1-4-row items of 4 chunks + 1
]


def _id(c):
    m, k, n, g, ao, zp, bias, dt = c
    return f"m{m}-k{k}-n{n}-g{g}-{ao or 'plain'}{'-zp' if zp else ''}{'-bias' if bias else ''}-" \
           f"{'bf16' if dt == BF else 'fp16'}"


@pytest.mark.parametrize("case", MARLIN_CASES, ids=[_id(c) for c in MARLIN_CASES])
def test_w4a8_gemm_reference_paths_and_bound(case):
    m, k, n, g, ao, zp, bias, dt = case
    args, a_rows, w, group = marlin_case(m, k, n, g, dt, ao, zp, bias, seed=m + k)
    out = ops.w4a8_gemm(*args)
    assert out.dtype == dt and out.shape == (m, n)
    b = args[-1]
    ref = reference.w4a8_gemm(*args)
    assert ((out.double() - ref).abs() <= _tight_tol(ref, a_rows, w, group, b)).all()
    assert ((out.double() - _exact(a_rows, w, b)).abs() <= _bound(out, a_rows, w, group, b)).all()
    # every path, any thread count: the same bits
    with threads(1):
        assert torch.equal(ops.w4a8_gemm(*args), out)
    with cpu_isa("scalar"):
        assert torch.equal(ops.w4a8_gemm(*args), out)
        with threads(1):
            assert torch.equal(ops.w4a8_gemm(*args), out)


def test_w4a8_gemm_m_sweep_paths():
    """M = 1..8, 11, 16, 17: the Marlin paths by rows (1: one row in registers; 2-4: row pairs
    over half chunks; 5-16: one panel zmm for all rows; 17+: L1 panels and 6-row tiles with
    their remainders)."""
    args, a_rows, w, group = marlin_case(17, 512, 128, 64, BF, "k_full", True, True, seed=3)
    for m in list(range(1, 9)) + [11, 16, 17]:
        a = args[0][:m]
        am = [a] + args[1:7] + [m] + args[8:]
        out = ops.w4a8_gemm(*am)
        with cpu_isa("scalar"):
            assert torch.equal(ops.w4a8_gemm(*am), out), m
        ref = reference.w4a8_gemm(*am)
        assert ((out.double() - ref).abs() <= _tight_tol(ref, a_rows[:m], w, group,
                                                          am[-1])).all(), m


def test_w4a8_gemm_strips_per_thread_same_bits():
    """At 1-4 rows the AVX-512 and AVX2 paths give each thread one strip of the columns (Marlin:
    N = 17 chunks, 2 threads: strips of 10 and 7 chunks); the bits are those of the portable
    loop on 1 and 2 threads, and of the AVX2 path."""
    args, _, _, _ = marlin_case(4, 256, 1088, 64, FP, zp=True, seed=11)
    for m in range(1, 5):
        am = [args[0][:m]] + args[1:7] + [m] + args[8:]
        outs = []
        for isa in (None, "avx2", "scalar"):
            with cpu_isa(isa):
                for t in (1, 2):
                    with threads(t):
                        outs.append(ops.w4a8_gemm(*am))
        assert all(torch.equal(o, outs[0]) for o in outs), m


def test_w4a8_gemm_strided_a_and_wrapper_shapes():
    args, _, _, _ = marlin_case(6, 256, 128, 128, BF, seed=5)
    a = args[0]
    wide = torch.zeros(6, 300, dtype=BF)
    wide[:, :256] = a
    strided = [wide[:, :256]] + args[1:]
    assert torch.equal(ops.w4a8_gemm(*strided), ops.w4a8_gemm(*args))
    out3 = ops.w4a8_gemm(a.reshape(2, 3, 256), *args[1:])
    assert torch.equal(out3.reshape(6, 128), ops.w4a8_gemm(*args))
    empty = ops.w4a8_gemm(a[:0], *args[1:7], 0, *args[8:])
    assert empty.shape == (0, 128)


# ---- AWQ: awq_gemm_a8 ----------------------------------------------------------------------------

AWQ_CASES = [(1, 256, 128, 128, BF), (4, 512, 192, 64, FP), (6, 256, 64, 32, BF),
             (9, 1024, 128, 1024, FP), (300, 128, 128, 64, BF), (2, 11008, 128, 128, BF),
             (17, 256, 320, 128, FP), (1, 512, 320, 64, FP), (3, 256, 576, 32, BF),
             (11, 256, 704, 64, BF)]  # 5-16 rows: items of 8 and 3 chunks, panel pairs + 1


@pytest.mark.parametrize("case", AWQ_CASES, ids=[f"m{c[0]}-k{c[1]}-n{c[2]}-g{c[3]}-"
                                                 f"{'bf16' if c[4] == BF else 'fp16'}"
                                                 for c in AWQ_CASES])
def test_awq_gemm_a8_reference_paths_and_bound(case):
    m, k, n, g, dt = case
    args, x, w, group = awq_case(m, k, n, g, dt, seed=m)
    out = ops.awq_gemm_a8(*args)
    assert out.dtype == dt and out.shape == (m, n)
    ref = reference.awq_gemm_a8(*args)
    assert ((out.double() - ref).abs() <= _tight_tol(ref, x, w, group, None)).all()
    assert ((out.double() - _exact(x, w, None)).abs() <= _bound(out, x, w, group, None)).all()
    with threads(1):
        assert torch.equal(ops.awq_gemm_a8(*args), out)
    with cpu_isa("scalar"):
        assert torch.equal(ops.awq_gemm_a8(*args), out)


def test_awq_and_marlin_formats_agree():
    """The same weight through awq_gemm_a8 and, converted once, w4a8_gemm: the same integer sums
    and scale products, so the same bits."""
    awq = quant.quantize_awq(torch.randn(512, 256, generator=torch.Generator().manual_seed(1)),
                             128, BF)
    mw = quant.awq_to_marlin(awq)
    x = torch.randn(5, 512, generator=torch.Generator().manual_seed(2)).to(BF)
    got = ops.awq_gemm_a8(x, awq.qweight, awq.scales, awq.qzeros)
    assert torch.equal(got, ops.w4a8_gemm(x, mw.b_q_weight, mw.b_scales, mw.b_zeros, None, None,
                                          4, 5, 256, 512))


PAIRS_EVENT = "w4kernels::awq_gemm_a8[unpack pairs]"


@contextlib.contextmanager
def _env_var(name, value):
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


SWEEPS_EVENT = "w4kernels::awq_gemm_a8[sweeps]"


def _awq_a8_pairs_ran(args, event=PAIRS_EVENT):
    """awq_gemm_a8's output, and whether the AWQ chunk pairs ran (their profiler event; or
    `event`'s)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        out = ops.awq_gemm_a8(*args)
    return out, any(e.name == event for e in prof.events())


# (K, N, group, dtype): N = 11 chunks (2 threads: items of 6 and 5 chunks, 3 pairs, and 2 pairs
# and a lone chunk; more than 4 rows: items of 8 chunks, two groups of two pairs, and of 3),
# 5 blocks of 128; N = 5 chunks, 7 blocks of 64; N = 69 chunks, 8 blocks of 32: at 1-4 rows the
# sweeps' sub-strips of 64 / R pairs at most split the items (2 threads: 18 pairs, and 16 and a
# lone chunk; 1 thread: 34 pairs and a lone chunk, 1-3 sub-strips).
PAIR_SHAPES = [(640, 704, 128, BF), (448, 320, 64, FP), (256, 4416, 32, FP)]


@pytest.mark.skipif(not {"avx512f", "avx512bw", "avx512_vnni", "avx512vbmi"} <= cpu_flags(),
                    reason="this CPU has no AVX-512 VNNI with VBMI: awq_gemm_a8 runs its AVX2 or "
                           "portable path, which the other tests cover")
@pytest.mark.parametrize("shape", PAIR_SHAPES,
                         ids=[f"k{s[0]}-n{s[1]}-g{s[2]}" for s in PAIR_SHAPES])
def test_awq_gemm_a8_unpack_pairs_m_sweep(shape):
    """AWQ on AVX-512 decodes chunk pairs by byte unpacks (1-4 rows: one strip of the columns
    per thread, read in sweeps of 8-16 rows, in sub-strips; more rows: L1 panels of half pairs
    for 3-6-row register tiles, or from 10 rows for the AMX-INT8 tiles where the CPU has them).
    The path ran (its profiler event; the sweeps' at 1-4 rows only), and the integer sums being
    exact, it gives the bits of the vpermt2b decode (W4K_A8_AWQ_PAIRS=0) and of the portable
    loop, on 1 and 2 threads, and the reference's within the int8 mode's bound."""
    k, n, g, dt = shape
    args, x, w, group = awq_case(23, k, n, g, dt, seed=k + n)
    for m in list(range(1, 11)) + [13, 16, 17, 23]:
        a = [args[0][:m]] + args[1:]
        out, ran = _awq_a8_pairs_ran(a)
        assert ran, m
        assert _awq_a8_pairs_ran(a, SWEEPS_EVENT)[1] == (m <= 4), m
        with _env_var("W4K_A8_AWQ_PAIRS", "0"):
            old, ran_old = _awq_a8_pairs_ran(a)
        assert not ran_old and torch.equal(_bits(old), _bits(out)), m
        for t in (1, 2):  # the items the shapes' comment describes, whatever the machine
            with threads(t):
                assert torch.equal(_bits(ops.awq_gemm_a8(*a)), _bits(out)), (m, t)
        with cpu_isa("scalar"):
            assert torch.equal(_bits(ops.awq_gemm_a8(*a)), _bits(out)), m
        ref = reference.awq_gemm_a8(*a)
        assert ((out.double() - ref).abs() <= _tight_tol(ref, x[:m], w, group, None)).all(), m


# ---- summation order: every path adds the block terms in the same fp32 order ---------------------


def _cancelling_blocks(m, k, n, group, dtype, seed):
    """(q [K, N], z [G, N], s [G, N], x [M, K]) on which the int8 mode's fp32 order over blocks
    shows in the output. The integer sums within a block are exact, so the order that can differ
    between paths is that of the fp32 chain over blocks: block 3 repeats block 1 (codes, and the
    scales and zero points of its group) with the activations negated, and both carry activations
    2^20 times the others'. Their terms cancel exactly (the negated block quantizes to the negated
    codes with the same scale), but every fp32 sum they pass through loses the low bits of the
    small terms, and which bits depends on the order. On plain random inputs an order change
    moves a sum by about an ulp, which the rounding to fp16 / bf16 hides almost always."""
    gen = torch.Generator().manual_seed(seed)
    groups = 1 if group == -1 else k // group
    gsize = k // groups
    b = reference.a8_block_size(gsize)
    assert k // b >= 4
    q = torch.randint(0, 16, (k, n), dtype=torch.int32, generator=gen)
    z = torch.randint(0, 16, (groups, n), dtype=torch.int32, generator=gen)
    s = ((torch.rand(groups, n, generator=gen) + 0.05) * 0.02)
    s[torch.rand(groups, n, generator=gen) < 0.25] *= -1
    q[3 * b:4 * b] = q[b:2 * b]
    s[3 * b // gsize], z[3 * b // gsize] = s[b // gsize], z[b // gsize]
    x = torch.randn(m, k, generator=gen) * 2.0 ** -10
    x[:, b:2 * b] *= 2.0 ** 20
    x[:, 3 * b:4 * b] = -x[:, b:2 * b]
    return q, z, s.to(dtype), x.to(dtype)


# (M, K, N, group, zero points, dtype): M over the row paths (1, 2-4, 5-16, 17+)
CANCEL_CASES = [(1, 1024, 128, 128, False, BF), (3, 512, 192, 64, True, FP),
                (7, 1024, 128, -1, True, BF), (17, 512, 320, 128, False, FP),
                (300, 512, 64, 128, True, BF), (2, 1024, 128, 256, False, FP),
                (11, 512, 704, 32, True, BF)]


def _bits(t):
    """The output's raw 16-bit patterns: equal bits, NaN payloads and signed zeros included."""
    return t.view(torch.int16)


def assert_paths_agree(op, args):
    """op(*args) under W4K_CPU_ISA=avx2 (2 and 1 threads) equals avx512 and scalar, bit for bit."""
    with cpu_isa("avx2"):
        out = op(*args)
        with threads(1):
            assert torch.equal(_bits(op(*args)), _bits(out)), "avx2: 1 thread vs 2"
    with threads(2):
        with cpu_isa("avx512"):
            assert torch.equal(_bits(op(*args)), _bits(out)), "avx2 vs avx512"
        with cpu_isa("scalar"):
            assert torch.equal(_bits(op(*args)), _bits(out)), "avx2 vs scalar"
    return out


def _all_paths(op, args):
    """assert_paths_agree (avx2 with 2 and 1 threads, avx512, scalar) and avx512 with 1 thread:
    all the same bits (a path this CPU lacks falls back to the next), returned once."""
    out = assert_paths_agree(op, args)
    with cpu_isa("avx512"), threads(1):
        assert torch.equal(_bits(op(*args)), _bits(out)), "avx512: 1 thread vs avx2"
    return out


@pytest.mark.parametrize("case", CANCEL_CASES, ids=[str(c[:5]) for c in CANCEL_CASES])
def test_paths_same_bits_cancelling_blocks(case):
    m, k, n, g, zp, dt = case
    q, z, s, x = _cancelling_blocks(m, k, n, g, dt, seed=m + k)
    groups = s.shape[0]
    marlin = [x, reference.marlin_pack(q), reference.marlin_permute_scales(s, k, n, g),
              reference.marlin_zero_points(z, groups, n) if zp else None, None, None, 4, m, n, k,
              True, None]
    if not zp:
        z = torch.full_like(z, 8)  # Marlin without zero points: q - 8
    awq = [x, reference.awq_pack(q), s, reference.awq_pack(z)]
    for op, args in [(ops.w4a8_gemm, marlin), (ops.awq_gemm_a8, awq)]:
        if op is ops.awq_gemm_a8 and g == -1:
            continue  # AutoAWQ tensors always have groups
        out = _all_paths(op, args)
        # the input does what it is for: the fp32 residue of the cancelled terms shows
        ref = (reference.w4a8_gemm(*args) if op is ops.w4a8_gemm
               else reference.awq_gemm_a8(*args))
        assert not torch.equal(out, ref.to(dt))


# ---- the bound under adversarial activations ----------------------------------------------------


def _adversarial(m, k, dtype, seed):
    """Rows of: an outlier (x1000) in every block of 128, a block of tiny values next to a huge
    one, values all equal to +-absmax, and a plain row."""
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=gen)
    a[0, ::128] *= 1000.0
    a[1, :64] *= 1e-3
    a[1, 64] = 300.0
    a[2] = torch.where(torch.rand(k, generator=gen) < 0.5, -5.0, 5.0)
    a[3, 5::128] = 1e4 if dtype == FP else 1e30
    return a.to(dtype)


@pytest.mark.parametrize("dt", [BF, FP], ids=["bf16", "fp16"])
def test_error_bound_adversarial(dt):
    args, _, w, group = marlin_case(6, 1024, 128, 128, dt, None, True, True, seed=7)
    args[0] = _adversarial(6, 1024, dt, 8)
    out = ops.w4a8_gemm(*args)
    ex = _exact(args[0], w, args[-1])
    assert ((out.double() - ex).abs() <= _bound(out, args[0], w, group, args[-1])).all()
    xa, _, wa, ga = awq_case(6, 1024, 128, 64, dt, seed=9)
    xa[0] = _adversarial(6, 1024, dt, 10)
    outa = ops.awq_gemm_a8(*xa)
    assert ((outa.double() - _exact(xa[0], wa, None)).abs()
            <= _bound(outa, xa[0], wa, ga, None)).all()


def test_zero_and_nonfinite_blocks():
    """An all-zero block contributes exactly 0 (sa = 0, qa = 0); an inf or NaN activation makes
    its row NaN (never a finite value that hides it), the other rows unaffected; both paths."""
    args, _, _, _ = marlin_case(3, 256, 64, 128, BF, seed=11)
    a = args[0].clone()
    a[0, :128] = 0
    a[1, 7] = float("inf")
    a[2, 200] = float("nan")
    args[0] = a
    out = ops.w4a8_gemm(*args)
    with cpu_isa("scalar"):
        assert torch.equal(ops.w4a8_gemm(*args).isnan(), out.isnan())
    assert out[0].isfinite().all() and out[1:].isnan().all()
    ref = reference.w4a8_gemm(*args)
    assert torch.equal(ref.isnan(), out.isnan())
    zero_rest = args[0].clone()
    zero_rest[0, 128:] = 0
    args[0] = zero_rest
    assert (ops.w4a8_gemm(*args)[0] == 0).all()


@pytest.mark.parametrize("m", [3, 8, 16])
def test_awq_nonfinite_inputs_every_path(m):
    """awq_gemm_a8 on hostile inputs, at the row counts of its AVX-512 paths (the chunk pairs in
    registers, the register tiles, the AMX-INT8 tiles where the CPU has them): an all-zero block,
    an inf and a NaN activation, a NaN and an inf scale (in a pair's high-nibble column and in the
    odd last chunk): the same bits on every path (NaNs included), the reference's NaN pattern."""
    args, _, _, _ = awq_case(m, 512, 320, 128, BF, seed=m)
    x, s = args[0].clone(), args[2].clone()
    x[0, :128] = 0
    x[1, 7] = float("inf")
    x[2, 300] = float("nan")
    s[1, 2] = float("nan")    # column 2: a high nibble of word 0 (AutoAWQ order)
    s[0, 300] = float("inf")  # the fifth chunk: the item's odd last chunk
    args = [x, args[1], s, args[3]]
    out = ops.awq_gemm_a8(*args)
    with _env_var("W4K_A8_AWQ_PAIRS", "0"):
        assert torch.equal(_bits(ops.awq_gemm_a8(*args)), _bits(out))
    with cpu_isa("scalar"):
        assert torch.equal(_bits(ops.awq_gemm_a8(*args)), _bits(out))
    ref = reference.awq_gemm_a8(*args)
    assert torch.equal(ref.isnan(), out.isnan())
    assert out[1:3].isnan().all() and out[:, 2].isnan().all()
    assert out[0].isfinite().sum() == 318 and out[3:, :2].isfinite().all()


def test_measured_error_next_to_the_exact_path():
    """The int8 mode's error against float64 is a few times the exact path's (bf16 output
    rounding), not more: README "int8-activation mode" quotes these ratios."""
    args, a_rows, w, _ = marlin_case(16, 1024, 256, 128, BF, seed=12)
    ex = _exact(a_rows, w, None)
    rel = ((ops.w4a8_gemm(*args).double() - ex).norm() / ex.norm()).item()
    exact = reference.w4a16_gemm(*args[:6], ops.marlin_workspace(256), 4, 16, 256, 1024)
    rel16 = ((ops.w4a16_gemm(*args[:6], ops.marlin_workspace(256), 4, 16, 256, 1024).double()
              - exact).norm() / exact.norm()).item()
    # int8 activations: sa / sqrt(12) per element, about 1 / (127 * sqrt(12) * ~0.4) relative
    # to a normal block's rms: ~0.5 %; the exact path: bf16 output rounding ~0.2 %.
    assert 1e-3 < rel < 1.5e-2 and rel16 < 4e-3


# ---- errors, Meta kernels, library -------------------------------------------------------------


def _marlin_err_args():
    args, _, _, _ = marlin_case(2, 128, 64, 64, FP, "k_full", seed=13)
    return args


def test_errors_name_op_argument_and_value():
    args = _marlin_err_args()
    op = torch.ops.w4kernels.w4a8_gemm
    bad = list(args)
    bad[2] = torch.zeros(16, 64, dtype=FP)  # 16 groups of 8 rows
    bad[3] = bad[4] = bad[5] = None
    with pytest.raises(RuntimeError, match=r"^w4a8_gemm: the group size K / G = 128 / 16 = 8 must "
                                           r"be a multiple of 16"):
        op(*bad)
    bad = list(args)
    bad[4] = torch.zeros(128, dtype=torch.int32)  # sorted but not r // 64
    with pytest.raises(RuntimeError, match=r"^w4a8_gemm: g_idx values must lie in group order .* "
                                           r"got g_idx\[64\] = 0"):
        op(*bad)
    bad = list(args)
    bad[10] = False
    with pytest.raises(RuntimeError, match=r"^w4a8_gemm: act-order .* needs is_k_full=True"):
        op(*bad)
    bad = list(args)
    bad[2] = args[2].to(BF)
    with pytest.raises(RuntimeError, match=r"^w4a8_gemm: b_scales must have the dtype of a"):
        op(*bad)
    with pytest.raises(TypeError, match=r"^w4a8_gemm: a has dtype torch.float16 but b_scales has "
                                        r"dtype torch.bfloat16"):
        ops.w4a8_gemm(*bad)
    bad = list(args)
    bad[0] = args[0].float()
    with pytest.raises(RuntimeError, match=r"^w4a8_gemm: a must have dtype float16 or bfloat16"):
        op(*bad)
    x, q, s, z = awq_case(2, 128, 64, 64, FP)[0]
    aop = torch.ops.w4kernels.awq_gemm_a8
    with pytest.raises(RuntimeError, match=r"^awq_gemm_a8: qweight must have N = 8 \* "
                                           r"qweight.size\(1\) a multiple of 64 .* got N = 32"):
        aop(x, q[:, :4].contiguous(), s[:, :32].contiguous(), z[:, :4].contiguous())
    with pytest.raises(RuntimeError, match=r"^awq_gemm_a8: the group size K / G = 128 / 16 = 8"):
        aop(x, q, torch.ones(16, 64, dtype=FP), torch.zeros(16, 8, dtype=torch.int32))
    with pytest.raises(RuntimeError, match=r"^awq_gemm_a8: x must have K = qweight.size\(0\) = 128"):
        aop(x[:, :64], q, s, z)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensors_give_the_cpu_only_error():
    args = [t.cuda() if isinstance(t, torch.Tensor) else t for t in _marlin_err_args()]
    with pytest.raises(RuntimeError, match=r"^w4a8_gemm: the int8-activation mode is CPU-only"):
        ops.w4a8_gemm(*args)
    x, q, s, z = [t.cuda() for t in awq_case(2, 128, 64, 64, FP)[0]]
    with pytest.raises(RuntimeError, match=r"^awq_gemm_a8: the int8-activation mode is CPU-only"):
        ops.awq_gemm_a8(x, q, s, z)


def test_meta_kernels_and_opcheck():
    from torch._subclasses.fake_tensor import FakeTensorMode

    args = _marlin_err_args()
    awq_args = awq_case(3, 128, 64, 64, BF)[0]
    for op, a in [(torch.ops.w4kernels.w4a8_gemm, args),
                  (torch.ops.w4kernels.awq_gemm_a8, awq_args)]:
        torch.library.opcheck(op, a)
        real = op(*a)
        with FakeTensorMode() as mode:
            fake = op(*[mode.from_tensor(t) if isinstance(t, torch.Tensor) else t for t in a])
        assert (fake.shape, fake.dtype) == (real.shape, real.dtype)
    bad = list(args)
    bad[1] = torch.empty(8, 64, dtype=torch.int32, device="meta")
    bad = [t.to("meta") if isinstance(t, torch.Tensor) else t for t in bad]
    with pytest.raises(RuntimeError, match=r"^w4a8_gemm: b_q_weight must have shape \[8, 128\]"):
        torch.ops.w4kernels.w4a8_gemm(*bad)


# ---- modules: opt-in ---------------------------------------------------------------------------


def test_modules_opt_in():
    lin = torch.nn.Linear(256, 128, bias=True)
    x = torch.randn(3, 256, generator=torch.Generator().manual_seed(4)).to(BF)
    m = wnn.MarlinLinear.from_float(lin, group_size=128, dtype=BF)
    assert m.act_quant is None
    exact = m(x)
    m.act_quant = "int8"
    got = m(x)
    assert torch.equal(got, ops.w4a8_gemm(x, m.qweight, m.scales, None, None, None, 4, 3, 128, 256,
                                          True, m.bias))
    assert not torch.equal(got, exact)
    assert "act_quant=int8" in repr(m)
    a = wnn.AWQLinear.from_float(lin, group_size=64, dtype=BF, act_quant="int8")
    want = ops.awq_gemm_a8(x, a.qweight, a.scales, a.qzeros) + a.bias
    assert torch.equal(a(x), want)
    with pytest.raises(ValueError, match=r"^MarlinLinear: act_quant must be None or 'int8', got "
                                         r"'int4'"):
        wnn.MarlinLinear(256, 128, act_quant="int4")
    with pytest.raises(ValueError, match=r"^AWQLinear: act_quant must be None or 'int8'"):
        a.act_quant = "fp8"
