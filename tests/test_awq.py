"""awq_dequantize and awq_gemm, and the AWQ quantizer/packer, on every backend."""

import pytest
import torch

import golden
from conftest import backend_or_skip
from numerics import assert_gemm_close
from w4kernels import ops, quant, reference

BACKENDS = ["cpu", "simt", "cuda"]
DTYPES = [torch.float16, torch.bfloat16]


def _random_awq(size_k, size_n, groups, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    qweight = torch.randint(-2**31, 2**31 - 1, (size_k, size_n // 8), dtype=torch.int32, generator=g)
    qzeros = torch.randint(-2**31, 2**31 - 1, (groups, size_n // 8), dtype=torch.int32, generator=g)
    scales = (torch.rand(groups, size_n, generator=g) * 0.02 + 1e-3).to(dtype)
    return qweight, scales, qzeros


# ---- packing: the reference and the quantizer against AutoAWQ -------------------------------


@pytest.mark.parametrize("case", golden.cases("awq", "awq_pack"))
def test_awq_pack_golden(case):
    i, e = case["inputs"], case["expected"]
    assert golden.same_bits(reference.awq_pack(i["intweight"].to(torch.int32)), e["qweight"])
    assert golden.same_bits(reference.awq_pack(i["zeros"].to(torch.int32)), e["qzeros"])
    assert torch.equal(reference.awq_unpack(e["qweight"]), i["intweight"].to(torch.int32))


@pytest.mark.parametrize("case", golden.cases("awq", "awq_pack"))
def test_quantize_awq_error_bound(case):
    """Quantize the float weight AutoAWQ was fed (w = (q - z) * s). Our scales are re-derived
    from min/max, so compare errors: rounding the zero point (<= s/2) plus rounding the value
    (<= s/2) keeps every element within one step s of its group."""
    i, e, p = case["inputs"], case["expected"], case["params"]
    q, z, s = i["intweight"].long(), i["zeros"].long(), i["scales"]
    gs = p["group_size"] if p["group_size"] != -1 else p["in_features"]
    w = (q - z.repeat_interleave(gs, 0)).float() * s.float().repeat_interleave(gs, 0)
    a = quant.quantize_awq(w, gs, torch.float16)
    deq = a.dequantize().double()
    step = a.scales.double().repeat_interleave(gs, 0)
    assert ((deq - w.double()).abs() <= step * (1 + 2**-9)).all()


# ---- awq_dequantize -------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", golden.cases("awq", "awq_dequantize"))
def test_awq_dequantize_golden(backend, case):
    b = backend_or_skip(backend, "awq_dequantize")
    i = case["inputs"]
    out = b.op("awq_dequantize")(i["qweight"].to(b.device), i["scales"].to(b.device),
                                 i["qzeros"].to(b.device), 0, 0, 0)
    assert golden.same_bits(out.cpu(), case["expected"]["out"])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("size_k,size_n,groups", [
    (8, 8, 1), (1, 64, 1), (33, 72, 3), (128, 256, 4), (256, 200, 2), (4096, 512, 32)])
def test_awq_dequantize_random(backend, dtype, size_k, size_n, groups):
    b = backend_or_skip(backend, "awq_dequantize")
    qw, s, qz = _random_awq(size_k, size_n, groups, dtype, seed=size_k + size_n)
    s[0, :3] = -s[0, :3]  # negative scales: q == z must still give +0.0
    out = b.op("awq_dequantize")(qw.to(b.device), s.to(b.device), qz.to(b.device), 0, 0, 0)
    assert golden.same_bits(out.cpu(), reference.awq_dequantize(qw, s, qz))


# ---- awq_gemm -------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("size_m", [1, 3, 16, 33, 128])
@pytest.mark.parametrize("size_k,size_n,group_size", [
    (128, 64, 32), (256, 192, 64), (512, 136, 128), (384, 256, -1)])
def test_awq_gemm(backend, dtype, size_m, size_k, size_n, group_size):
    b = backend_or_skip(backend, "awq_gemm")
    groups = 1 if group_size == -1 else size_k // group_size
    qw, s, qz = _random_awq(size_k, size_n, groups, dtype, seed=size_m)
    x = torch.randn(size_m, size_k, generator=torch.Generator().manual_seed(size_k)).to(dtype)
    out = b.op("awq_gemm")(x.to(b.device), qw.to(b.device), s.to(b.device), qz.to(b.device), 8)
    assert out.dtype == dtype and out.shape == (size_m, size_n)
    assert_gemm_close(out, reference.awq_gemm(x, qw, s, qz), x,
                      reference.awq_dequantize(qw, s, qz))


@pytest.fixture(scope="module")
def llm_layer():
    """A real LLM layer (K=4096, N=11008, group 128) quantized from float weights, with its
    dequantized weight (computed once for the module: it is the slow part)."""
    w = torch.randn(4096, 11008, generator=torch.Generator().manual_seed(0)) * 0.02
    a = quant.quantize_awq(w, 128, torch.bfloat16)
    return a, a.dequantize()


@pytest.mark.parametrize("size_m", [1, 16])
def test_awq_gemm_llm_shape(llm_layer, size_m):
    b = backend_or_skip("cpu", "awq_gemm")
    a, w_deq = llm_layer
    x = torch.randn(size_m, 4096, generator=torch.Generator().manual_seed(size_m)).to(torch.bfloat16)
    out = b.op("awq_gemm")(x, a.qweight, a.scales, a.qzeros, 8)
    assert_gemm_close(out, x.double() @ w_deq.double(), x, w_deq)


def test_awq_gemm_strided_activations():
    """A row stride larger than K (a slice of a wider buffer) is read correctly."""
    qw, s, qz = _random_awq(128, 64, 2, torch.float16)
    wide = torch.randn(5, 200).to(torch.float16)
    x = wide[:, 10:138]
    assert not x.is_contiguous()
    out = ops.awq_gemm(x, qw, s, qz, 8)
    assert torch.equal(out, ops.awq_gemm(x.contiguous(), qw, s, qz, 8))


def test_awq_gemm_empty_m():
    qw, s, qz = _random_awq(64, 64, 2, torch.float16)
    assert ops.awq_gemm(torch.empty(0, 64, dtype=torch.float16), qw, s, qz, 8).shape == (0, 64)


@pytest.mark.parametrize("op", ["awq_dequantize", "awq_gemm"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_awq_isa_paths_agree_bitwise(op, dtype, monkeypatch):
    """The AVX-512 path and the portable fallback (W4K_CPU_ISA=scalar) perform the same
    roundings and the same fma chain, so their outputs are bit-identical."""
    qw, s, qz = _random_awq(256, 136, 4, dtype, seed=7)
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(8)).to(dtype)
    args = (x, qw, s, qz, 8) if op == "awq_gemm" else (qw, s, qz, 0, 0, 0)
    fn = getattr(torch.ops.w4kernels, op)
    outs = {}
    for isa in ("scalar", "avx2", "avx512"):
        monkeypatch.setenv("W4K_CPU_ISA", isa)
        outs[isa] = fn(*args)
    assert golden.same_bits(outs["scalar"], outs["avx512"])
    assert golden.same_bits(outs["scalar"], outs["avx2"])
