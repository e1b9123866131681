"""marlin_repack / awq_marlin_repack and the Marlin scale / zero-point helpers.

Golden vectors (vLLM's own reference functions, see tests/data/GOLDEN_README.md) are the
independent truth; reference.py is checked against them first, then every backend is checked
against both, byte for byte.
"""

import pytest
import torch

import golden
from conftest import backend_or_skip
from w4kernels import quant, reference

BACKENDS = ["cpu", "simt", "cuda"]


def _run_gptq(backend, b_q_weight, perm, size_k, size_n):
    dev = backend.device
    perm = None if perm is None else perm.to(dev)
    return backend.op("marlin_repack")(b_q_weight.to(dev), perm, size_k, size_n, 4).cpu()


# ---- the reference against the golden vectors -----------------------------------------------


@pytest.mark.parametrize("case", golden.cases("marlin", "gptq_marlin_repack"))
def test_reference_gptq_repack_golden(case):
    p, i = case["params"], case["inputs"]
    out = reference.marlin_repack(i["b_q_weight"], i["perm"], p["size_k"], p["size_n"])
    assert golden.same_bits(out, case["expected"]["out"])


@pytest.mark.parametrize("case", golden.cases("marlin", "awq_marlin_repack"))
def test_reference_awq_repack_golden(case):
    p, i = case["params"], case["inputs"]
    out = reference.awq_marlin_repack(i["b_q_weight"], p["size_k"], p["size_n"])
    assert golden.same_bits(out, case["expected"]["out"])


@pytest.mark.parametrize("case", golden.cases("marlin", "marlin_perm_table"))
def test_perm_table_golden(case):
    """Which source element lands in which packed nibble, incl. the 32x32 seed example."""
    p, q = case["params"], case["inputs"]["q"].to(torch.int32)
    size_k, size_n = p["size_k"], p["size_n"]
    packed = reference.marlin_pack(q)
    assert golden.same_bits(packed, case["expected"]["out"])
    # Pack the source *indices* instead of values: nibble p must hold index perm_table[p].
    # 4-bit nibbles cannot hold indices, so pack each index bit-plane and reassemble.
    index = torch.arange(size_k * size_n).reshape(size_k, size_n)
    where = torch.zeros(size_k * size_n, dtype=torch.int64)
    for bit in range(0, 12, 4):
        plane = reference.marlin_pack(((index >> bit) & 15).to(torch.int32))
        where |= reference.unpack_cols(plane).reshape(-1).long() << bit
    assert where.tolist() == case["expected"]["perm_table"]
    assert torch.equal(reference.marlin_unpack(packed, size_k, size_n), q)


def test_seed_document_worked_example():
    """Step 3 of shared/seeds/marlin-w4-format.md: the first packed word of the 32x32 example
    holds source elements [0, 256, 8, 264, 32, 288, 40, 296] in nibbles 0..7."""
    index = torch.arange(32 * 32).reshape(32, 32)
    lo = reference.unpack_cols(reference.marlin_pack((index & 15).to(torch.int32))).reshape(-1)
    mid = reference.unpack_cols(reference.marlin_pack(((index >> 4) & 15).to(torch.int32)))
    hi = reference.unpack_cols(reference.marlin_pack(((index >> 8) & 15).to(torch.int32)))
    where = lo + (mid.reshape(-1) << 4) + (hi.reshape(-1) << 8)
    assert where[:8].tolist() == [0, 256, 8, 264, 32, 288, 40, 296]
    assert where[8:16].tolist() == [16, 272, 24, 280, 48, 304, 56, 312]
    assert where[32:40].tolist() == [64, 320, 72, 328, 96, 352, 104, 360]


@pytest.mark.parametrize("case", golden.cases("marlin", "marlin_permute_scales"))
def test_permute_scales_golden(case):
    p, s = case["params"], case["inputs"]["s"]
    out = quant.marlin_permute_scales(s, p["size_k"], p["size_n"], p["group_size"])
    assert golden.same_bits(out, case["expected"]["out"])
    assert golden.same_bits(reference.marlin_unpermute_scales(out, p["size_n"]), s)


@pytest.mark.parametrize("case", golden.cases("marlin", "marlin_zero_points"))
def test_zero_points_golden(case):
    p, zp = case["params"], case["inputs"]["zp"]
    out = quant.marlin_zero_points(zp, p["size_k"], p["size_n"], 4)
    assert golden.same_bits(out, case["expected"]["out"])
    assert torch.equal(reference.marlin_unpack_zero_points(out, p["size_n"]), zp)


@pytest.mark.parametrize("case", golden.cases("marlin", "awq_to_marlin_zero_points"))
def test_awq_to_marlin_zero_points_golden(case):
    p = case["params"]
    out = quant.awq_to_marlin_zero_points(case["inputs"]["qzeros"], p["size_k"], p["size_n"], 4)
    assert golden.same_bits(out, case["expected"]["out"])


@pytest.mark.parametrize("case", golden.cases("marlin", "marlin_layer_pack"))
def test_ist_daslab_layer_pack_golden(case):
    """The original Marlin Layer.pack gives the same bytes as vLLM's repack of the same codes."""
    p, i = case["params"], case["inputs"]
    size_k, size_n = p["size_k"], p["size_n"]
    gptq = reference.pack_rows(i["q"].to(torch.int32))
    assert golden.same_bits(reference.marlin_repack(gptq, None, size_k, size_n),
                            case["expected"]["B"])
    s = quant.marlin_permute_scales(i["s"], size_k, size_n, p["group_size"])
    assert golden.same_bits(s, case["expected"]["s"])


# ---- every backend against the golden vectors and the reference ------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", golden.cases("marlin", "gptq_marlin_repack"))
def test_gptq_repack_golden(backend, case):
    b = backend_or_skip(backend, "marlin_repack")
    p, i = case["params"], case["inputs"]
    out = _run_gptq(b, i["b_q_weight"], i["perm"], p["size_k"], p["size_n"])
    assert golden.same_bits(out, case["expected"]["out"])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", golden.cases("marlin", "awq_marlin_repack"))
def test_awq_repack_golden(backend, case):
    b = backend_or_skip(backend, "awq_marlin_repack")
    p, i = case["params"], case["inputs"]
    out = b.op("awq_marlin_repack")(i["b_q_weight"].to(b.device), p["size_k"], p["size_n"], 4)
    assert golden.same_bits(out.cpu(), case["expected"]["out"])


def _random_words(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-2**31, 2**31 - 1, shape, dtype=torch.int32, generator=g)


SHAPES = [(16, 64), (32, 128), (48, 192), (4096, 256), (256, 11008 // 64 * 64)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("size_k,size_n", SHAPES)
@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_repack_random(backend, size_k, size_n, act_order):
    b = backend_or_skip(backend, "marlin_repack")
    w = _random_words(size_k // 8, size_n, seed=size_k + size_n)
    perm = torch.randperm(size_k, generator=torch.Generator().manual_seed(1)).to(torch.int32) \
        if act_order else None
    out = _run_gptq(b, w, perm, size_k, size_n)
    assert torch.equal(out, reference.marlin_repack(w, perm, size_k, size_n))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("size_k,size_n", SHAPES)
def test_awq_repack_random(backend, size_k, size_n):
    b = backend_or_skip(backend, "awq_marlin_repack")
    w = _random_words(size_k, size_n // 8, seed=size_k * size_n)
    out = b.op("awq_marlin_repack")(w.to(b.device), size_k, size_n, 4).cpu()
    assert torch.equal(out, reference.awq_marlin_repack(w, size_k, size_n))


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty_perm_means_no_act_order(backend):
    """vLLM passes an empty tensor instead of None when there is no act-order."""
    b = backend_or_skip(backend, "marlin_repack")
    w = _random_words(16, 64)
    empty = torch.empty(0, dtype=torch.int32)
    assert torch.equal(_run_gptq(b, w, empty, 128, 64), _run_gptq(b, w, None, 128, 64))
