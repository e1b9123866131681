"""KleidiAI packers: golden vectors (byte-exact, C++ and reference), reference vs C++ on random
shapes beyond the golden set, size queries, bad input, opcheck."""

import pytest
import torch

import golden
from w4kernels import ops, reference

OPS = torch.ops.w4kernels

RHS_OPS = {  # golden op name -> (our op name, per-block?)
    "kai_run_rhs_pack_nxk_qsi4cxp_qs4cxs1s0": ("rhs_pack_nxk_qsi4cxp_qs4cxs1s0", False),
    "kai_run_rhs_pack_kxn_qsi4cxp_qs4cxs1s0": ("rhs_pack_kxn_qsi4cxp_qs4cxs1s0", False),
    "kai_run_rhs_pack_nxk_qsi4c32p_qsu4c32s1s0": ("rhs_pack_nxk_qsi4c32p_qsu4c32s1s0", True),
    "kai_run_rhs_pack_kxn_qsi4c32p_qsu4c32s1s0": ("rhs_pack_kxn_qsi4c32p_qsu4c32s1s0", True),
}


def _rhs_cases():
    out = []
    for upstream in RHS_OPS:
        fam = "kleidiai_rhs_qsi4c32p" if RHS_OPS[upstream][1] else "kleidiai_rhs_qsi4cxp"
        out += [pytest.param(upstream, *p.values, id=p.id) for p in golden.cases(fam, upstream)]
    return out


def _run_rhs(fn, upstream, case):
    p, i = case["params"], case["inputs"]
    if RHS_OPS[upstream][1]:
        return fn(i["rhs"], i["scale"], i.get("bias"), p["n"], p["k"], p["bl"], p["nr"], p["kr"],
                  p["sr"])
    return fn(i["rhs"], i["scale"], i.get("bias"), p["n"], p["k"], p["nr"], p["kr"], p["sr"],
              p["rhs_zero_point"])


@pytest.mark.parametrize("impl", ["cpu", "reference"])
@pytest.mark.parametrize("upstream,case", _rhs_cases())
def test_rhs_pack_golden(upstream, case, impl):
    name = RHS_OPS[upstream][0]
    fn = getattr(OPS, name) if impl == "cpu" else getattr(reference, name)
    out = _run_rhs(fn, upstream, case)
    expected = case["expected"]["rhs_packed"]
    assert golden.same_bits(out, expected), (out != expected).nonzero()[:8].flatten().tolist()
    p = case["params"]
    size = (ops.rhs_packed_size_qsi4c32p(p["n"], p["k"], p["bl"], p["nr"], p["kr"], p["sr"])
            if RHS_OPS[upstream][1] else
            ops.rhs_packed_size_qsi4cxp(p["n"], p["k"], p["nr"], p["kr"], p["sr"]))
    assert size == expected.numel()


def test_golden_coverage():
    """The golden set exercises what the issue lists: bias on/off, zero point 0/8, padding."""
    cx = golden.load("kleidiai_rhs_qsi4cxp")
    assert {c["params"]["rhs_zero_point"] for c in cx} == {0, 8}
    assert {c["params"]["has_bias"] for c in cx} == {True, False}
    assert any(c["params"]["k"] % 2 for c in cx) and any(c["params"]["n"] % c["params"]["nr"] for c in cx)
    c32 = golden.load("kleidiai_rhs_qsi4c32p")
    assert {c["params"]["bl"] for c in c32} == {32, 64, 128}


@pytest.mark.parametrize("impl", ["cpu", "cpu_scalar", "reference"])
@pytest.mark.parametrize("case", golden.cases("kleidiai_lhs_qai8dxp", "kai_run_lhs_quant_pack_qai8dxp_f32"))
def test_lhs_quant_pack_golden(case, impl, monkeypatch):
    """cpu_scalar: W4K_KLEIDIAI_ISA=scalar forces the scalar loops instead of AVX2."""
    if impl == "cpu_scalar":
        monkeypatch.setenv("W4K_KLEIDIAI_ISA", "scalar")
    p = case["params"]
    fn = OPS.lhs_quant_pack_qai8dxp_f32 if impl == "cpu" else reference.lhs_quant_pack_qai8dxp_f32
    out = fn(case["inputs"]["lhs"], p["mr"], p["kr"], p["sr"])
    expected = case["expected"]["lhs_packed"]
    assert golden.same_bits(out, expected), (out != expected).nonzero()[:8].flatten().tolist()
    for start, end in case["expected"]["unwritten_byte_ranges"]:
        assert bool((out[start:end] == 0).all())
    assert ops.lhs_packed_size_qai8dxp(p["m"], p["k"], p["mr"], p["kr"], p["sr"]) == expected.numel()


def test_lhs_ties_round_away_from_zero():
    """Regression: the 'ties' row (scale exactly 1) follows roundf, not round-half-even."""
    x = torch.tensor([[-127.5, 127.5, 0.5, 1.5, 2.5, -0.5, -1.5, -2.5] + [0.0] * 24])
    out = OPS.lhs_quant_pack_qai8dxp_f32(x, 1, 16, 2)
    q = out[:32].view(torch.int8)[:8].tolist()
    # scale 1, zero point: (-128 - (-127.5)) rounds half-even -> 0
    assert q == [-128, 127, 1, 2, 3, -1, -2, -3]


# ---- reference vs C++ beyond the golden set ----------------------------------------------------

SHAPES_CX = [  # (n, k, nr, kr, sr)
    (1, 1, 8, 16, 2), (3, 5, 8, 16, 2), (8, 4096 // 16, 8, 16, 2), (37, 123, 8, 16, 2),
    (64, 96, 4, 8, 2), (19, 200, 4, 16, 2), (10, 64, 2, 4, 2), (12, 77, 16, 32, 2),
    (7, 64, 8, 16, 1), (33, 65, 3, 8, 4),
]


@pytest.mark.parametrize("kxn", [False, True], ids=["nxk", "kxn"])
@pytest.mark.parametrize("zp", [8, 0])
@pytest.mark.parametrize("n,k,nr,kr,sr", SHAPES_CX)
def test_rhs_pack_qsi4cxp_random(n, k, nr, kr, sr, zp, kxn):
    g = torch.Generator().manual_seed(n * 1000 + k)
    shape = (k, (n + 1) // 2) if kxn else (n, (k + 1) // 2)
    rhs = torch.randint(0, 256, shape, dtype=torch.uint8, generator=g)
    scale = torch.rand(n, generator=g)
    bias = torch.randn(n, generator=g) if n % 2 else None
    name = "rhs_pack_kxn_qsi4cxp_qs4cxs1s0" if kxn else "rhs_pack_nxk_qsi4cxp_qs4cxs1s0"
    out = getattr(OPS, name)(rhs, scale, bias, n, k, nr, kr, sr, zp)
    ref = getattr(reference, name)(rhs, scale, bias, n, k, nr, kr, sr, zp)
    assert golden.same_bits(out, ref)


SHAPES_C32 = [  # (n, k, bl, nr, kr, sr)
    (1, 32, 32, 4, 16, 2), (21, 256, 32, 8, 16, 2), (16, 512, 128, 8, 16, 2),
    (5, 192, 64, 4, 8, 2), (9, 256, 256, 16, 32, 2), (30, 128, 64, 12, 16, 4),
]


@pytest.mark.parametrize("kxn", [False, True], ids=["nxk", "kxn"])
@pytest.mark.parametrize("n,k,bl,nr,kr,sr", SHAPES_C32)
def test_rhs_pack_qsi4c32p_random(n, k, bl, nr, kr, sr, kxn):
    g = torch.Generator().manual_seed(n * 1000 + k + bl)
    shape = (k, (n + 1) // 2) if kxn else (n, k // 2)
    rhs = torch.randint(0, 256, shape, dtype=torch.uint8, generator=g)
    # Mixed signs and magnitudes, so the f32 rsum order matters.
    scale = (torch.randn(n, k // bl, generator=g) * 2.0 ** torch.randint(-20, 1, (n, k // bl), generator=g)).bfloat16()
    bias = torch.randn(n, generator=g) if n % 2 else None
    name = "rhs_pack_kxn_qsi4c32p_qsu4c32s1s0" if kxn else "rhs_pack_nxk_qsi4c32p_qsu4c32s1s0"
    out = getattr(OPS, name)(rhs, scale, bias, n, k, bl, nr, kr, sr)
    ref = getattr(reference, name)(rhs, scale, bias, n, k, bl, nr, kr, sr)
    assert golden.same_bits(out, ref)


@pytest.mark.parametrize("m,k,mr,kr,sr", [(1, 4096, 1, 16, 2), (7, 100, 4, 16, 2), (33, 31, 4, 8, 2),
                                          (16, 64, 8, 16, 2), (5, 1, 3, 16, 2), (2, 257, 1, 4, 2)])
@pytest.mark.parametrize("isa", ["auto", "scalar"])
def test_lhs_quant_pack_random(m, k, mr, kr, sr, isa, monkeypatch):
    monkeypatch.setenv("W4K_KLEIDIAI_ISA", isa)
    g = torch.Generator().manual_seed(m * 100 + k)
    x = torch.randn(m, k, generator=g) * 3.0
    x[0, 0] = 0.5
    x[-1, -1] = -x.abs().max()  # the row minimum at the very end (the SIMD tail)
    out = OPS.lhs_quant_pack_qai8dxp_f32(x, mr, kr, sr)
    ref = reference.lhs_quant_pack_qai8dxp_f32(x, mr, kr, sr)
    assert golden.same_bits(out, ref)


def test_lhs_quant_pack_ties_on_every_simd_lane():
    """Regression: x.5 ties in all 32 lanes of the AVX2 block (scale 1: min -127.5, max 127.5)."""
    x = torch.arange(-127.5, 128.0, 1.0).reshape(1, -1)  # 256 values, all ties
    out = OPS.lhs_quant_pack_qai8dxp_f32(x)
    assert golden.same_bits(out, reference.lhs_quant_pack_qai8dxp_f32(x))


def test_lhs_quant_pack_strided_rows():
    x = torch.randn(6, 80)[:, :70]  # row stride 80
    assert golden.same_bits(OPS.lhs_quant_pack_qai8dxp_f32(x, 4), reference.lhs_quant_pack_qai8dxp_f32(x.contiguous(), 4))


# ---- bad input ---------------------------------------------------------------------------------

def _cx_args(n=8, k=64):
    return torch.zeros(n, k // 2, dtype=torch.uint8), torch.ones(n), None


@pytest.mark.parametrize("mutate,match", [
    (lambda a: {**a, "rhs": a["rhs"].int()}, r"rhs must have dtype Byte"),
    (lambda a: {**a, "rhs": a["rhs"][:, :-1].contiguous()}, r"rhs must have shape \[8, 32\]"),
    (lambda a: {**a, "scale": a["scale"].double()}, r"scale must have dtype Float"),
    (lambda a: {**a, "scale": torch.ones(7)}, r"scale must have shape \[8\]"),
    (lambda a: {**a, "bias": torch.ones(8, dtype=torch.bfloat16)}, r"bias must have dtype Float"),
    (lambda a: {**a, "bias": torch.ones(9)}, r"bias must have shape \[8\]"),
    (lambda a: {**a, "zp": 4}, r"rhs_zero_point must be 8 .* or 0"),
    (lambda a: {**a, "kr": 16, "sr": 3}, r"kr must be a multiple of sr"),
    (lambda a: {**a, "kr": 24, "sr": 1}, r"kr / sr .* must divide 16"),
    (lambda a: {**a, "nr": 0}, r"nr must be in \[1, 256\]"),
    (lambda a: {**a, "rhs": a["rhs"].t().contiguous().t()}, r"rhs must be contiguous"),
])
def test_rhs_pack_qsi4cxp_bad_input(mutate, match):
    rhs, scale, bias = _cx_args()
    a = mutate(dict(rhs=rhs, scale=scale, bias=bias, nr=8, kr=16, sr=2, zp=8))
    with pytest.raises(RuntimeError, match="rhs_pack_nxk_qsi4cxp_qs4cxs1s0: " + match):
        OPS.rhs_pack_nxk_qsi4cxp_qs4cxs1s0(a["rhs"], a["scale"], a["bias"], 8, 64, a["nr"], a["kr"], a["sr"], a["zp"])


@pytest.mark.parametrize("kw,match", [
    (dict(k=96, bl=64), r"k must be a multiple of bl, got k=96, bl=64"),
    (dict(bl=48), r"bl must be a positive multiple of 32, got 48"),
    (dict(nr=6), r"nr must be a multiple of 4"),
    (dict(bl=32, kr=64, sr=4), r"bl must be a multiple of kr"),
    (dict(scale_dtype=torch.float32), r"scale must have dtype BFloat16"),
    (dict(scale_shape=(8, 3)), r"scale must have shape \[8, 2\]"),
    (dict(rhs_dtype=torch.int8), r"rhs must have dtype Byte"),
])
def test_rhs_pack_qsi4c32p_bad_input(kw, match):
    n, k = 8, kw.get("k", 128)
    bl, nr, kr, sr = kw.get("bl", 64), kw.get("nr", 8), kw.get("kr", 16), kw.get("sr", 2)
    rhs = torch.zeros(n, k // 2, dtype=kw.get("rhs_dtype", torch.uint8))
    nblk = max(k // bl, 1)
    scale = torch.ones(*kw.get("scale_shape", (n, nblk)), dtype=kw.get("scale_dtype", torch.bfloat16))
    with pytest.raises(RuntimeError, match="rhs_pack_nxk_qsi4c32p_qsu4c32s1s0: " + match):
        OPS.rhs_pack_nxk_qsi4c32p_qsu4c32s1s0(rhs, scale, None, n, k, bl, nr, kr, sr)


def test_size_queries_reject_bad_parameters():
    with pytest.raises(RuntimeError, match="rhs_packed_size_qsi4c32p: k must be a multiple of bl"):
        ops.rhs_packed_size_qsi4c32p(8, 96, 64)
    with pytest.raises(RuntimeError, match="rhs_packed_size_qsi4cxp: kr must be a multiple of sr"):
        ops.rhs_packed_size_qsi4cxp(8, 64, 8, 16, 3)
    assert ops.rhs_packed_size_qsi4cxp(13, 33) == reference.rhs_packed_size_qsi4cxp(13, 33) == 704


def test_lhs_quant_pack_bad_input():
    with pytest.raises(RuntimeError, match="lhs_quant_pack_qai8dxp_f32: lhs must have dtype Float"):
        OPS.lhs_quant_pack_qai8dxp_f32(torch.zeros(2, 8, dtype=torch.float16))
    with pytest.raises(RuntimeError, match="lhs_quant_pack_qai8dxp_f32: lhs must be a 2-D tensor"):
        OPS.lhs_quant_pack_qai8dxp_f32(torch.zeros(8))
    with pytest.raises(RuntimeError, match="lhs_quant_pack_qai8dxp_f32: mr must be positive"):
        OPS.lhs_quant_pack_qai8dxp_f32(torch.zeros(2, 8), 0)


# ---- opcheck -------------------------------------------------------------------------------------

def test_opcheck_packers():
    g = torch.Generator().manual_seed(0)
    rhs = torch.randint(0, 256, (13, 17), dtype=torch.uint8, generator=g)
    torch.library.opcheck(OPS.rhs_pack_nxk_qsi4cxp_qs4cxs1s0, (rhs, torch.rand(13), torch.rand(13), 13, 33))
    torch.library.opcheck(OPS.rhs_pack_kxn_qsi4cxp_qs4cxs1s0,
                          (torch.randint(0, 256, (33, 7), dtype=torch.uint8), torch.rand(13), None, 13, 33, 4, 8, 2, 0))
    s = torch.rand(13, 2).bfloat16()
    torch.library.opcheck(OPS.rhs_pack_nxk_qsi4c32p_qsu4c32s1s0,
                          (torch.randint(0, 256, (13, 32), dtype=torch.uint8), s, None, 13, 64, 32))
    torch.library.opcheck(OPS.rhs_pack_kxn_qsi4c32p_qsu4c32s1s0,
                          (torch.randint(0, 256, (64, 7), dtype=torch.uint8), s, torch.rand(13), 13, 64, 32))
    torch.library.opcheck(OPS.lhs_quant_pack_qai8dxp_f32, (torch.randn(5, 40), 4))
