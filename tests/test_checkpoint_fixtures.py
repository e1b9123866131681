"""The checkpoint fixtures in tests/data/checkpoints/, proven at op level.

Each fixture is a layer quantized and packed by AutoAWQ, auto-gptq or GPTQModel themselves,
stored with the tool's own dequantization of what it packed (``dequantized_weight``). Here the
existing ops and reference functions read the checkpoint tensors and must give that weight:

* AWQ: ``awq_dequantize`` (op and reference), bit for bit.
* GPTQ: unpacking ``qweight`` / ``qzeros`` under the zero-point convention the config names
  (auto-gptq's v1 stores ``zero - 1``, GPTQModel's ``gptq_v2`` the zero point), bit for bit;
  the wrong convention must not match; then ``marlin_repack`` + ``w4a16_gemm`` with the
  identity as activations, whose output rows are the weight's rows, bit for bit (each weight is
  rounded once to fp16 and every output sums one nonzero product), and with random activations
  against the float64 reference within the fp32-accumulation bound (tests/numerics.py).
* The K = 320 fixture (3 groups of 128, the last half full) runs as a row-parallel shard does
  (``is_k_full=False``): whole, and cut into two 160-row shards whose outputs add up.

The float weight given to each tool is recovered within one quantization step, so the pair
(weight, dequantized_weight) of every fixture belongs together.
"""

import json
import os

import pytest
import torch

from conftest import backend_or_skip
from numerics import assert_gemm_close
from w4kernels import ops, quant, reference

safetensors_torch = pytest.importorskip(
    "safetensors.torch", reason="safetensors (requirements.txt) is needed to read the fixtures")

HERE = os.path.join(os.path.dirname(__file__), "data", "checkpoints")
with open(os.path.join(HERE, "index.json")) as f:
    INDEX = {entry["name"]: entry for entry in json.load(f)}
AWQ = [n for n, e in INDEX.items() if e["tool"] == "autoawq"]
GPTQ = [n for n, e in INDEX.items() if e["tool"] != "autoawq"]


def load(name):
    """(index entry, quantization_config, checkpoint tensors without the prefix, reference)."""
    entry = INDEX[name]
    folder = os.path.join(HERE, name)
    with open(os.path.join(folder, "config.json")) as f:
        config = json.load(f)["quantization_config"]
    prefix = entry["prefix"] + "."
    tensors = {k[len(prefix):]: v for k, v in
               safetensors_torch.load_file(os.path.join(folder, "model.safetensors")).items()}
    ref = safetensors_torch.load_file(os.path.join(folder, "reference.safetensors"))
    return entry, config, tensors, ref


def zero_offset(config):
    """What to add to a 4-bit qzeros field to get the zero point, from the config alone:
    checkpoint_format "gptq_v2" stores the zero point, "gptq" (or no field: auto-gptq) zero - 1."""
    fmt = config.get("checkpoint_format", "gptq")
    assert fmt in ("gptq", "gptq_v2"), fmt
    return 0 if fmt == "gptq_v2" else 1


def gptq_dequantize(tensors, size_k, offset):
    """The documented GPTQ formula on the unpacked integers, rounded once to the scales' dtype:
    ``w[k, n] = (q[k, n] - z[g_idx[k], n]) * s[g_idx[k], n]`` as [K, N]."""
    q = reference.unpack_rows(tensors["qweight"], size_k)
    z = reference.unpack_cols(tensors["qzeros"]) + offset
    g = tensors["g_idx"].long()
    s = tensors["scales"]
    return ((q - z[g]).float() * s.float()[g]).to(s.dtype)


def to_marlin(tensors, size_k, size_n, group_size, sym, offset, rows=None):
    """Checkpoint GPTQ tensors -> the w4a16_gemm arguments (vLLM's gptq_marlin conversion):
    act-order perm = argsort(g_idx), g_idx sorted, scales Marlin-permuted, zero points (asym)
    unpacked under the checkpoint's convention and re-packed for Marlin. ``rows``: a slice of
    input rows (a row-parallel shard); the scales and zero points stay whole, as on a shard."""
    qweight, g_idx = tensors["qweight"], tensors["g_idx"]
    if rows is not None:
        qweight = qweight[rows.start // 8:rows.stop // 8].contiguous()
        g_idx = g_idx[rows].contiguous()
        size_k = rows.stop - rows.start
    perm = torch.argsort(g_idx, stable=True).to(torch.int32)
    b_q_weight = ops.marlin_repack(qweight, perm, size_k, size_n)
    groups = tensors["scales"].shape[0]
    b_scales = quant.marlin_permute_scales(tensors["scales"], size_k, size_n, group_size)
    b_zeros = None
    if not sym:
        z = reference.unpack_cols(tensors["qzeros"]) + offset
        b_zeros = quant.marlin_zero_points(z, groups, size_n)
    return b_q_weight, b_scales, b_zeros, g_idx[perm.long()].contiguous(), perm, size_k


def gemm(backend, a, marlin, size_n, is_k_full=True):
    b_q_weight, b_scales, b_zeros, g_idx, perm, size_k = marlin
    dev = backend.device
    to = lambda t: None if t is None else t.to(dev)  # noqa: E731
    out = backend.op("w4a16_gemm")(
        a.to(dev), to(b_q_weight), to(b_scales), to(b_zeros), to(g_idx), to(perm),
        ops.marlin_workspace(size_n, dev), 4, a.shape[0], size_n, size_k, is_k_full, None, True)
    return out.cpu()


# ---- the fixtures themselves ------------------------------------------------------------------

@pytest.mark.parametrize("name", list(INDEX))
def test_layout_and_config(name):
    """Names, shapes and dtypes as the tools write them, and a config that says what the index
    says (the loader reads only the config)."""
    entry, config, tensors, ref = load(name)
    size_k, size_n, gs = entry["in_features"], entry["out_features"], entry["group_size"]
    groups = -(-size_k // gs)
    assert config["bits"] == 4 and config["group_size"] == gs
    expected = {"qweight", "qzeros", "scales"} | ({"bias"} if entry["bias"] else set())
    if entry["tool"] == "autoawq":
        assert config["quant_method"] == "awq" and config["version"] == "gemm"
        assert config["zero_point"] is True
        assert tensors["qweight"].shape == (size_k, size_n // 8)
    else:
        expected.add("g_idx")
        assert config["quant_method"] == "gptq"
        assert config["sym"] == entry["sym"] and config["desc_act"] == entry["desc_act"]
        assert config.get("checkpoint_format", "gptq") == \
            ("gptq_v2" if entry["tool"] == "gptqmodel" else "gptq")
        assert tensors["qweight"].shape == (size_k // 8, size_n)
        assert tensors["g_idx"].shape == (size_k,) and tensors["g_idx"].dtype == torch.int32
        natural = torch.arange(size_k, dtype=torch.int32) // gs
        assert torch.equal(tensors["g_idx"], natural) != entry["desc_act"]
    assert set(tensors) == expected
    assert tensors["qzeros"].shape == (groups, size_n // 8)
    assert tensors["scales"].shape == (groups, size_n)
    assert tensors["scales"].dtype == torch.float16
    assert ref["weight"].shape == ref["dequantized_weight"].shape == (size_n, size_k)
    if entry["bias"]:
        assert torch.equal(ref["bias"], tensors["bias"])


@pytest.mark.parametrize("name", list(INDEX))
def test_dequantized_weight_is_the_input_quantized(name):
    """The float weight and the tool's dequantized weight belong together.

    AWQ (round to nearest): every element within one quantization step (its group's scale;
    half a step from the rounding, up to a whole one where the rounded zero point shifts the
    grid), plus the fp16 rounding of both. GPTQ: the solver's error feedback moves single
    weights by several steps on purpose (it minimizes the output error on the calibration
    activations, not the weight error), so the check is the relative Frobenius error: 4-bit
    RTN gives about 0.1, the solver 0.12-0.30 on these fixtures (low-importance channels
    absorb error); below 0.35 passes, while an unrelated weight of the same scale gives about
    1.4 (checked with the weight rolled by one row)."""
    entry, _, tensors, ref = load(name)
    size_k = entry["in_features"]
    w, deq = ref["weight"].double(), ref["dequantized_weight"].double()
    if entry["tool"] == "autoawq":
        groups = torch.arange(size_k) // entry["group_size"]
        step = tensors["scales"].double()[groups].t()  # [N, K]
        err = (w - deq).abs()
        assert (err <= step + 2.0**-10 * w.abs()).all(), \
            f"worst error {(err / step).max():.3g} steps"
    rel = lambda x: ((x - deq).norm() / x.norm()).item()  # noqa: E731
    assert rel(w) < 0.35
    assert rel(w.roll(1, dims=0)) > 1.0


@pytest.mark.parametrize("name", [n for n in GPTQ if INDEX[n]["tool"] == "auto-gptq"
                                  and not INDEX[n]["sym"]])
def test_autogptq_v1_has_no_zero_point_zero(name):
    """auto-gptq stores zero - 1 through uint32 ORs: a zero point of 0 would become 0xFFFFFFFF
    and corrupt the whole qzeros word. The fixtures must not depend on that upstream bug."""
    _, _, tensors, _ = load(name)
    assert (reference.unpack_cols(tensors["qzeros"]) + 1).min() >= 1


# ---- AWQ: awq_dequantize ----------------------------------------------------------------------

@pytest.mark.parametrize("name", AWQ)
@pytest.mark.parametrize("backend", ["cpu", "simt", "cuda"])
def test_awq_dequantize_matches_autoawq(backend, name):
    b = backend_or_skip(backend, "awq_dequantize")
    _, _, tensors, ref = load(name)
    expected = ref["dequantized_weight"].t()  # [K, N]
    assert torch.equal(reference.awq_dequantize(tensors["qweight"], tensors["scales"],
                                                tensors["qzeros"]), expected)
    out = b.op("awq_dequantize")(tensors["qweight"].to(b.device), tensors["scales"].to(b.device),
                                 tensors["qzeros"].to(b.device), 0, 0, 0)
    assert torch.equal(out.cpu(), expected)


# ---- GPTQ: the zero-point conventions, then Marlin --------------------------------------------

@pytest.mark.parametrize("name", GPTQ)
def test_gptq_unpacked_matches_tool(name):
    entry, config, tensors, ref = load(name)
    offset = zero_offset(config)
    expected = ref["dequantized_weight"].t()  # [K, N]
    assert torch.equal(gptq_dequantize(tensors, entry["in_features"], offset), expected)
    # The other convention gives another weight: the fixture pins the convention down.
    wrong = gptq_dequantize(tensors, entry["in_features"], 1 - offset)
    assert not torch.equal(wrong, expected)


@pytest.mark.parametrize("name", [n for n in GPTQ if INDEX[n]["in_features"] % INDEX[n]
                                  ["group_size"] == 0])
@pytest.mark.parametrize("backend", ["cpu", "simt", "cuda"])
def test_gptq_on_marlin_matches_tool(backend, name):
    b = backend_or_skip(backend, "w4a16_gemm")
    entry, config, tensors, ref = load(name)
    size_k, size_n = entry["in_features"], entry["out_features"]
    marlin = to_marlin(tensors, size_k, size_n, entry["group_size"], entry["sym"],
                       zero_offset(config))
    expected = ref["dequantized_weight"].t()  # [K, N]
    # Identity activations: output row k is the weight's row k (act-order's perm routes
    # activation column k to its Marlin row), exactly.
    eye = torch.eye(size_k, dtype=torch.float16)
    assert torch.equal(gemm(b, eye, marlin, size_n), expected)
    a = torch.randn(5, size_k, generator=torch.Generator().manual_seed(0)).half()
    assert_gemm_close(gemm(b, a, marlin, size_n), a.double() @ expected.double(), a, expected)


@pytest.mark.parametrize("backend", ["cpu", "simt", "cuda"])
def test_gptq_k_not_multiple_of_group_as_shard(backend):
    """K = 320 with group 128 (3 groups, the last half full): Marlin runs it as a shard, with
    is_k_full=False and every group's scale; cut into two 160-row row-parallel shards, the
    partial outputs add up to the layer's."""
    b = backend_or_skip(backend, "w4a16_gemm")
    name = "gptq_sym_desc_act_g128_k320"
    entry, config, tensors, ref = load(name)
    size_k, size_n, gs = entry["in_features"], entry["out_features"], entry["group_size"]
    assert size_k % gs and tensors["scales"].shape[0] == -(-size_k // gs)
    expected = ref["dequantized_weight"].t()
    offset = zero_offset(config)
    marlin = to_marlin(tensors, size_k, size_n, gs, entry["sym"], offset)
    eye = torch.eye(size_k, dtype=torch.float16)
    assert torch.equal(gemm(b, eye, marlin, size_n, is_k_full=False), expected)

    a = torch.randn(3, size_k, generator=torch.Generator().manual_seed(1)).half()
    ref_out = a.double() @ expected.double()
    half = size_k // 2
    partial = []
    for shard in (slice(0, half), slice(half, size_k)):
        m = to_marlin(tensors, size_k, size_n, gs, entry["sym"], offset, rows=shard)
        out = gemm(b, a[:, shard].contiguous(), m, size_n, is_k_full=False)
        assert_gemm_close(out, a[:, shard].double() @ expected[shard].double(),
                          a[:, shard], expected[shard])
        partial.append(out.double())
    # Each shard's output is rounded to fp16 once: the sum is within two output roundings.
    tol = 2 * 2.0**-11 * (partial[0].abs() + partial[1].abs()) + \
        320 * 2.0**-24 * (a.double().abs() @ expected.double().abs())
    assert ((partial[0] + partial[1] - ref_out).abs() <= tol).all()
