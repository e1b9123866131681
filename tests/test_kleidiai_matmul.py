"""KleidiAI matmul (qai8dxp x qsi4cxp / qsi4c32p): every SIMD path the CPU has plus the forced
scalar fallback against the plain-torch reference (same integer dot products and the same f32
epilogue), against a float64 product of the dequantized operands, and against PyTorch's
torch.ops.aten._dyn_quant_matmul_4bit on the same inputs."""

import pytest
import torch

from w4kernels import ops, reference

OPS = torch.ops.w4kernels
ISAS = ops.kleidiai_isas()  # every path this CPU runs; "scalar" is always there
EPS32 = 2.0 ** -24


def make_operands(m, n, k, bl=0, mr=1, nr=8, kr=16, sr=2, bias=True, seed=0, x_scale=1.0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * x_scale
    w = torch.randint(0, 256, (n, (k + 1) // 2), dtype=torch.uint8, generator=g)
    b = torch.randn(n, generator=g) if bias else None
    if bl == 0:
        s = torch.rand(n, generator=g) * 0.05 + 0.001
        rp = OPS.rhs_pack_nxk_qsi4cxp_qs4cxs1s0(w, s, b, n, k, nr, kr, sr, 8)
    else:
        s = (torch.rand(n, k // bl, generator=g) * 0.05 + 0.001).bfloat16()
        rp = OPS.rhs_pack_nxk_qsi4c32p_qsu4c32s1s0(w, s, b, n, k, bl, nr, kr, sr)
    lp = OPS.lhs_quant_pack_qai8dxp_f32(x, mr, kr, sr)
    return x, lp, rp


def run(lp, rp, m, n, k, bl=0, mr=1, nr=8, kr=16, sr=2, isa="auto", **kw):
    if bl == 0:
        return OPS.matmul_clamp_f32_qai8dxp_qsi4cxp(lp, rp, m, n, k, mr, nr, kr, sr, isa=isa, **kw)
    return OPS.matmul_clamp_f32_qai8dxp_qsi4c32p(lp, rp, m, n, k, bl, mr, nr, kr, sr, isa=isa, **kw)


def run_ref(lp, rp, m, n, k, bl=0, mr=1, nr=8, kr=16, sr=2, **kw):
    if bl == 0:
        return reference.matmul_clamp_f32_qai8dxp_qsi4cxp(lp, rp, m, n, k, mr, nr, kr, sr, **kw)
    return reference.matmul_clamp_f32_qai8dxp_qsi4c32p(lp, rp, m, n, k, bl, mr, nr, kr, sr, **kw)


def assert_matches_reference(y, r, bl):
    if bl == 0:  # integer accumulation + three separately rounded f32 ops: bit-exact
        assert torch.equal(y, r), (y - r).abs().max()
    else:  # the reference evaluates the fmas in f64 (one extra rounding, see its docstring)
        torch.testing.assert_close(y, r, rtol=4 * EPS32, atol=4 * EPS32 * float(r.abs().max()))


SHAPES = [  # (m, n, k, bl, mr)
    (1, 8, 32, 0, 1), (1, 13, 33, 0, 1), (3, 40, 256, 0, 4), (17, 24, 100, 0, 1),
    (70, 16, 64, 0, 4), (9, 1, 7, 0, 1), (1, 4096 // 64, 4096, 0, 1),
    (1, 8, 32, 32, 1), (5, 24, 128, 32, 4), (9, 40, 256, 64, 1), (70, 16, 256, 128, 1),
    (2, 11, 512, 256, 1),
]


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("m,n,k,bl,mr", SHAPES)
def test_matmul_matches_reference(m, n, k, bl, mr, isa):
    _, lp, rp = make_operands(m, n, k, bl, mr, seed=m + n + k)
    y = run(lp, rp, m, n, k, bl, mr, isa=isa)
    assert y.shape == (m, n) and y.dtype == torch.float32
    assert_matches_reference(y, run_ref(lp, rp, m, n, k, bl, mr), bl)


@pytest.mark.parametrize("nr,kr,sr", [(4, 16, 2), (4, 8, 2), (16, 16, 2), (8, 8, 2)])
@pytest.mark.parametrize("bl", [0, 64])
def test_matmul_other_packing_parameters(nr, kr, sr, bl):
    """Parameters without a SIMD kernel run the scalar one whatever isa says."""
    m, n, k = 6, 21, 128
    _, lp, rp = make_operands(m, n, k, bl, 4, nr, kr, sr, seed=nr + kr)
    r = run_ref(lp, rp, m, n, k, bl, 4, nr, kr, sr)
    for isa in ISAS:
        assert_matches_reference(run(lp, rp, m, n, k, bl, 4, nr, kr, sr, isa=isa), r, bl)


@pytest.mark.parametrize("bl", [0, 32, 128])
def test_all_paths_bit_identical_llm_shape(bl):
    """Regression for the SIMD tails: M not a multiple of the tile, M > 64 (two M chunks),
    N not a multiple of nr, realistic K."""
    m, n, k = 67, 4096 // 32 + 3, 4096
    _, lp, rp = make_operands(m, n, k, bl, seed=7)
    outs = {isa: run(lp, rp, m, n, k, bl, isa=isa) for isa in ISAS}
    for isa in ISAS:
        assert torch.equal(outs[isa], outs["scalar"]), isa


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("m,n,k,bl", [(4, 40, 256, 0), (3, 24, 512, 32), (1, 16, 4096, 128)])
def test_matmul_vs_float64_dequantized(m, n, k, bl, isa):
    """Against x_deq @ w_deq.T + bias in float64 from the operands' own quantized values.
    The kernels' integer part is exact; only the f32 epilogue rounds: per-channel three ops,
    per-block one fma per K block plus three more, each with relative error <= 2^-24 of the
    running magnitude, which is bounded by sum_k |x_deq w_deq| + |bias|."""
    _, lp, rp = make_operands(m, n, k, bl, seed=3)
    y = run(lp, rp, m, n, k, bl, isa=isa).double()
    exact = reference.kai_matmul_dequantized_f64(lp, rp, m, n, k, bl=bl)
    q, off, ls = reference.kai_unpack_lhs_qai8dxp(lp, m, k)
    rhs = reference.kai_unpack_rhs(rp, n, k, bl=bl)
    xa = ((q.double() + off.double()[:, None]) * ls.double()[:, None]).abs()
    s = rhs["scale"].double() * (16 if bl == 0 else 1)
    wa = (rhs["w"].double() * (s if bl == 0 else s.repeat_interleave(bl, 1))).abs()
    magnitude = xa @ wa.T + rhs["bias"].double().abs()
    steps = (k // bl if bl else 1) + 4
    assert bool(((y - exact).abs() <= steps * EPS32 * magnitude + 1e-30).all())


@pytest.mark.parametrize("bl", [0, 64])
def test_clamp_bias_and_bf16_output(bl):
    m, n, k = 5, 19, 128
    _, lp, rp = make_operands(m, n, k, bl, seed=11)
    full = run(lp, rp, m, n, k, bl)
    lo, hi = -0.25, 0.5
    for isa in ISAS:
        y = run(lp, rp, m, n, k, bl, isa=isa, clamp_min=lo, clamp_max=hi)
        assert torch.equal(y, full.clamp(lo, hi))
        assert_matches_reference(y, run_ref(lp, rp, m, n, k, bl, clamp_min=lo, clamp_max=hi), bl)
        yb = run(lp, rp, m, n, k, bl, isa=isa, out_dtype=torch.bfloat16)
        assert yb.dtype == torch.bfloat16 and torch.equal(yb, full.bfloat16())
    _, lp0, rp0 = make_operands(m, n, k, bl, bias=False, seed=11)
    assert not torch.equal(run(lp0, rp0, m, n, k, bl), full)  # the bias is applied


def test_force_path_with_env(monkeypatch):
    monkeypatch.setenv("W4K_KLEIDIAI_ISA", "scalar")
    assert ops.kleidiai_isa() == "scalar"
    m, n, k = 3, 16, 64
    _, lp, rp = make_operands(m, n, k)
    assert torch.equal(run(lp, rp, m, n, k), run(lp, rp, m, n, k, isa=ISAS[-1]))
    monkeypatch.setenv("W4K_KLEIDIAI_ISA", "sse9")
    with pytest.raises(RuntimeError, match=r"W4K_KLEIDIAI_ISA='sse9' \(the environment, read "
                                           r"for isa='auto'\) cannot be used: expected one of"):
        run(lp, rp, m, n, k)


def test_best_path_is_used_by_default(monkeypatch):
    monkeypatch.delenv("W4K_KLEIDIAI_ISA", raising=False)
    monkeypatch.delenv("W4K_CPU_ISA", raising=False)
    expected = {"avx512": ["avx512f", "avx512_vnni"], "avx2": ["avx2"]}
    flags = open("/proc/cpuinfo").read().split("flags")[1].split("\n")[0].split()
    best = ops.kleidiai_isa()
    assert best == ISAS[-1]
    if all(f in flags for f in expected["avx512"]):
        assert best == "avx512"


# ---- drop-in path vs PyTorch -------------------------------------------------------------------

def torch_dyn_quant(x, w, s, block_size, k, n):
    packed = torch.ops.aten._dyn_quant_pack_4bit_weight(w, s, None, block_size, k, n)
    return torch.ops.aten._dyn_quant_matmul_4bit(x, packed, block_size, k, n)


@pytest.mark.parametrize("m,n,k,block_size", [(1, 16, 64, 64), (3, 24, 128, 32), (7, 40, 256, 128),
                                              (4, 8, 96, 96), (2, 256, 1024, 1024), (5, 48, 512, 64)])
def test_dyn_quant_matches_torch(m, n, k, block_size):
    g = torch.Generator().manual_seed(m * n)
    x = torch.randn(m, k, generator=g)
    w = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g)
    s = torch.rand(n, k // block_size, generator=g) * 0.1
    s = s.reshape(n) if block_size == k else s.bfloat16()
    expected = torch_dyn_quant(x, w, s, block_size, k, n)
    packed = ops.dyn_quant_pack_4bit_weight(w, s, None, block_size, k, n)
    for isa in ISAS:
        y = ops.dyn_quant_matmul_4bit(x, packed, block_size, k, n, isa=isa)
        if block_size == k:
            # Same integers, same three f32 ops in the same order: bit-identical.
            assert torch.equal(y, expected), (y - expected).abs().max()
        else:
            # PyTorch sums f32(iacc_j) * s_j per block (offset folded into iacc_j); KleidiAI's
            # order is fma per block plus a final rsum fma: a few f32 roundings apart.
            bound = (k // block_size + 4) * EPS32 * (x.abs().max() * 8 * s.float().abs().max() * k) + 1e-30
            assert float((y - expected).abs().max()) <= float(bound)


@pytest.mark.parametrize("block_size", [256, 64])
def test_dyn_quant_with_bias_and_batch_dims_vs_float64(block_size):
    k, n = 256, 40
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, k, generator=g)
    w = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g)
    s = torch.rand(n, k // block_size, generator=g) * 0.1
    s = s.reshape(n) if block_size == k else s.bfloat16()
    b = torch.randn(n, generator=g)
    packed = ops.dyn_quant_pack_4bit_weight(w, s, b, block_size, k, n)
    y = ops.dyn_quant_matmul_4bit(x, packed, block_size, k, n)
    assert y.shape == (2, 3, n)
    exact = reference.dyn_quant_matmul_4bit_f64(x, w, s, b, block_size, k, n)
    torch.testing.assert_close(y.double(), exact, rtol=1e-5, atol=1e-5)
    yb = ops.dyn_quant_matmul_4bit(x.bfloat16(), packed, block_size, k, n)
    assert yb.dtype == torch.bfloat16


# ---- bad input ---------------------------------------------------------------------------------

def test_matmul_bad_input():
    m, n, k = 3, 16, 64
    _, lp, rp = make_operands(m, n, k)
    op = "matmul_clamp_f32_qai8dxp_qsi4cxp"
    with pytest.raises(RuntimeError, match=op + r": rhs_packed must hold 704 bytes .*got 703"):
        run(lp, rp[:-1], m, n, k)
    with pytest.raises(RuntimeError, match=op + r": lhs_packed must hold 288 bytes .*m=4.*got 216"):
        run(lp, rp, 4, n, k)  # packed for 3 rows of 72 bytes, called with m=4
    with pytest.raises(RuntimeError, match=op + r": lhs_packed must have dtype Byte"):
        run(lp.view(torch.int8), rp, m, n, k)
    with pytest.raises(RuntimeError, match=op + r": isa 'avx9' .*expected one of"):
        run(lp, rp, m, n, k, isa="avx9")
    with pytest.raises(RuntimeError, match=op + r": out_dtype must be float32 or bfloat16"):
        run(lp, rp, m, n, k, out_dtype=torch.float16)
    with pytest.raises(RuntimeError, match=op + r": kr must be a multiple of sr"):
        run(lp, rp, m, n, k, kr=16, sr=3)
    with pytest.raises(RuntimeError, match=r"matmul_clamp_f32_qai8dxp_qsi4c32p: k must be a multiple of bl"):
        run(lp, rp, m, n, k, bl=96)
    with pytest.raises(RuntimeError, match=op + r": k must be <= 131072 \(int32 accumulators\), got 200000"):
        run(lp, rp, m, n, 200000)
    if "avxvnni" not in ISAS:
        with pytest.raises(RuntimeError, match=r"isa 'avxvnni' .*does not support it"):
            run(lp, rp, m, n, k, isa="avxvnni")


def test_dyn_quant_bad_input():
    n, k = 8, 64
    w = torch.zeros(n, k // 2, dtype=torch.uint8)
    op = "dyn_quant_pack_4bit_weight"
    with pytest.raises(RuntimeError, match=op + r": block_size must equal in_features .* got block_size=48"):
        ops.dyn_quant_pack_4bit_weight(w, torch.ones(n, 2).bfloat16(), None, 48, k, n)
    with pytest.raises(RuntimeError, match=op + r": scales_zeros must have dtype BFloat16"):
        ops.dyn_quant_pack_4bit_weight(w, torch.ones(n, 2), None, 32, k, n)
    with pytest.raises(RuntimeError, match=op + r": scales_zeros must have shape \[8, 2\]"):
        ops.dyn_quant_pack_4bit_weight(w, torch.ones(n, 4).bfloat16(), None, 32, k, n)
    with pytest.raises(RuntimeError, match=op + r": weights must have shape \[8, 32\]"):
        ops.dyn_quant_pack_4bit_weight(w[:, :16], torch.ones(n), None, k, k, n)
    with pytest.raises(RuntimeError, match=op + r": scales_zeros must have dtype float32 or bfloat16"):
        ops.dyn_quant_pack_4bit_weight(w, torch.ones(n, dtype=torch.float16), None, k, k, n)
    packed = ops.dyn_quant_pack_4bit_weight(w, torch.ones(n), None, k, k, n)
    with pytest.raises(RuntimeError, match=r"dyn_quant_matmul_4bit: inp must have shape \[\.\.\., in_features=64\]"):
        ops.dyn_quant_matmul_4bit(torch.zeros(2, 32), packed, k, k, n)
    # A per-channel buffer used as per-block: caught by its size (608 vs 640 bytes here; like
    # PyTorch's own check, sizes are all it can see, and some (n, k, bl) sizes coincide).
    k = 128
    packed = ops.dyn_quant_pack_4bit_weight(torch.zeros(n, k // 2, dtype=torch.uint8), torch.ones(n), None, k, k, n)
    with pytest.raises(RuntimeError, match=r"dyn_quant_matmul_4bit: packed_weights must be the uint8 buffer .*640 bytes.*608"):
        ops.dyn_quant_matmul_4bit(torch.zeros(2, k), packed, 32, k, n)
    with pytest.raises(RuntimeError, match=r"dyn_quant_matmul_4bit: inp must have dtype float32 or bfloat16"):
        ops.dyn_quant_matmul_4bit(torch.zeros(2, k, dtype=torch.float16), packed, k, k, n)


# ---- opcheck -------------------------------------------------------------------------------------

@pytest.mark.parametrize("bl", [0, 64])
def test_opcheck_matmul(bl):
    m, n, k = 3, 13, 128
    _, lp, rp = make_operands(m, n, k, bl)
    if bl == 0:
        torch.library.opcheck(OPS.matmul_clamp_f32_qai8dxp_qsi4cxp, (lp, rp, m, n, k), {"clamp_max": 1.0})
    else:
        torch.library.opcheck(OPS.matmul_clamp_f32_qai8dxp_qsi4c32p, (lp, rp, m, n, k, bl),
                              {"out_dtype": torch.bfloat16})


def test_opcheck_dyn_quant():
    n, k = 16, 128
    w = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8)
    s = torch.rand(n, 2).bfloat16()
    torch.library.opcheck(OPS.dyn_quant_pack_4bit_weight, (w, s, torch.randn(n), 64, k, n))
    packed = ops.dyn_quant_pack_4bit_weight(w, s, None, 64, k, n)
    torch.library.opcheck(OPS.dyn_quant_matmul_4bit, (torch.randn(2, 5, k), packed, 64, k, n))


def test_compile_fullgraph():
    n, k = 16, 128
    w = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8)
    packed = ops.dyn_quant_pack_4bit_weight(w, torch.rand(n), None, k, k, n)
    f = torch.compile(lambda x: ops.dyn_quant_matmul_4bit(x, packed, k, k, n) * 2, fullgraph=True)
    x = torch.randn(3, k)
    assert torch.equal(f(x), ops.dyn_quant_matmul_4bit(x, packed, k, k, n) * 2)


def test_library_wide_isa_cap(monkeypatch):
    """W4K_CPU_ISA (the cap every w4kernels CPU kernel honours) also caps isa="auto" here;
    W4K_KLEIDIAI_ISA, when set, wins."""
    monkeypatch.delenv("W4K_KLEIDIAI_ISA", raising=False)
    monkeypatch.setenv("W4K_CPU_ISA", "scalar")
    assert ops.kleidiai_isa() == "scalar"
    if "avx2" in ISAS:
        monkeypatch.setenv("W4K_CPU_ISA", "avx2")
        assert ops.kleidiai_isa() in ("avx2", "avxvnni")
        monkeypatch.setenv("W4K_KLEIDIAI_ISA", "avx2")
        monkeypatch.setenv("W4K_CPU_ISA", "scalar")
        assert ops.kleidiai_isa() == "avx2"


def test_size_queries_under_fake_mode():
    """The size ops take only ints, so the fakes can call them inside FakeTensorMode."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        assert ops.rhs_packed_size_qsi4cxp(13, 33) == reference.rhs_packed_size_qsi4cxp(13, 33)
        assert ops.rhs_packed_size_qsi4c32p(13, 128, 64, 4) == reference.rhs_packed_size_qsi4c32p(13, 128, 64, 4)
        assert ops.lhs_packed_size_qai8dxp(5, 100, 4) == reference.lhs_packed_size_qai8dxp(5, 100, 4)
