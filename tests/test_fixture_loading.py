"""The upstream tools' checkpoints (tests/data/checkpoints/: AutoAWQ, auto-gptq, GPTQModel)
loaded through the public loader, w4kernels.load_quantized, from their folders (model.safetensors
+ config.json as the tools write them), on every kernel that can serve each one, against the
tools' own dequantized weight; then saved back with save_quantized, tensor for tensor.

Reference: ``x @ dequantized_weight.T + bias`` in float64, with the tool's fp16 dequantized
weight (each (q - z) * s rounded once to fp16, as MarlinLinear and AWQLinear do in fp16), within
numerics.gemm_error_bound (fp32 sums, one output rounding; AWQLinear adds its bias after the
op's rounding: one more rounding of the result). KleidiAILinear stores per-block scales in bf16 and quantizes the
activations to int8, so it is checked against its own float64 model on those scales
(reference.dyn_quant_matmul_4bit_f64) and its weight against the tool's within bf16 rounding.
"""

import json
import os

import pytest
import torch

import w4kernels
from numerics import gemm_error_bound
from w4kernels import reference

safetensors_torch = pytest.importorskip(
    "safetensors.torch", reason="safetensors (requirements.txt) is needed to read the fixtures")

HERE = os.path.join(os.path.dirname(__file__), "data", "checkpoints")
with open(os.path.join(HERE, "index.json")) as f:
    INDEX = {entry["name"]: entry for entry in json.load(f)}


def servable(entry):
    """The kernels that can serve a fixture (the others must refuse it with an error)."""
    kernels = ["marlin"]
    if not entry["desc_act"] and entry["in_features"] % entry["group_size"] == 0:
        kernels.append("awq")
        if entry["sym"] and entry["tool"] != "autoawq":
            kernels.append("kleidiai")
    return kernels


CASES = [(name, kernel) for name, e in INDEX.items() for kernel in servable(e)]


def model_for(entry):
    """A module tree with an nn.Linear at the fixture's prefix (model.layers.0.mlp.down_proj)."""
    root = torch.nn.Module()
    node = root
    *path, last = entry["prefix"].split(".")
    for part in path:
        child = torch.nn.Module()
        node.add_module(part, child)
        node = child
    node.add_module(last, torch.nn.Linear(entry["in_features"], entry["out_features"],
                                          bias=entry["bias"], dtype=torch.float16))
    return root


def reference_of(name):
    return safetensors_torch.load_file(os.path.join(HERE, name, "reference.safetensors"))


@pytest.mark.parametrize("name,kernel", CASES, ids=[f"{n}-{k}" for n, k in CASES])
def test_fixture_loads_and_matches_the_tool(name, kernel):
    entry = INDEX[name]
    model = w4kernels.load_quantized(model_for(entry), os.path.join(HERE, name), kernel=kernel)
    layer = model.get_submodule(entry["prefix"])
    assert isinstance(layer, w4kernels.checkpoint.KERNELS[kernel])
    ref = reference_of(name)
    w = ref["dequantized_weight"].double().T  # [K, N]
    bias = ref.get("bias")
    x = torch.randn(5, entry["in_features"], generator=torch.Generator().manual_seed(0))
    if kernel == "kleidiai":
        x = x.float()
        torch.testing.assert_close(layer.dequantize().T, w, rtol=2**-8, atol=0)
        ckpt = safetensors_torch.load_file(os.path.join(HERE, name, "model.safetensors"))
        q = reference.unpack_rows(ckpt[entry["prefix"] + ".qweight"], entry["in_features"]).T
        weights = (q[:, 0::2] | (q[:, 1::2] << 4)).to(torch.uint8)  # low nibble = even k
        scales = ckpt[entry["prefix"] + ".scales"].to(torch.bfloat16).T.contiguous()
        expect = reference.dyn_quant_matmul_4bit_f64(
            x, weights, scales, None if bias is None else bias.float(), layer.block_size,
            entry["in_features"], entry["out_features"])
        torch.testing.assert_close(layer(x).double(), expect, rtol=1e-5,
                                   atol=1e-5 * expect.abs().max().item())
        return
    x = x.half()
    out = layer(x).double()
    acc = x.double() @ w
    expect = acc + (0 if bias is None else bias.double())
    if kernel == "awq":  # bias added after the op's rounding: one more rounding
        bound = gemm_error_bound(x, w, acc, torch.float16) + 2.0**-11 * expect.abs()
    else:
        bound = gemm_error_bound(x, w, expect, torch.float16)
    assert ((out - expect).abs() <= bound).all()


@pytest.mark.parametrize("name", sorted(INDEX))
def test_fixture_saves_back_tensor_for_tensor(name, tmp_path):
    folder = os.path.join(HERE, name)
    entry = INDEX[name]
    kernel = "awq" if entry["tool"] == "autoawq" else "marlin"
    model = w4kernels.load_quantized(model_for(entry), folder, kernel=kernel)
    w4kernels.save_quantized(model, str(tmp_path))
    original = safetensors_torch.load_file(os.path.join(folder, "model.safetensors"))
    saved = safetensors_torch.load_file(os.path.join(tmp_path, "model.safetensors"))
    assert sorted(saved) == sorted(original)
    for k, v in original.items():
        assert saved[k].dtype == v.dtype and torch.equal(saved[k], v), k
    with open(os.path.join(folder, "config.json")) as fh:
        cfg = json.load(fh)["quantization_config"]
    with open(os.path.join(tmp_path, "config.json")) as fh:
        back = json.load(fh)["quantization_config"]
    for key in ("quant_method", "bits", "group_size", "desc_act", "sym", "zero_point"):
        if key in cfg:
            assert back[key] == cfg[key], key


def test_unservable_fixture_kernels_are_errors():
    for name, entry in INDEX.items():
        for kernel in {"awq", "kleidiai"} - set(servable(entry)):
            with pytest.raises(ValueError, match=f"layer '{entry['prefix']}'"):
                w4kernels.load_quantized(model_for(entry), os.path.join(HERE, name),
                                         kernel=kernel)


@pytest.mark.parametrize("name", sorted(n for n, e in INDEX.items() if e["tool"] != "autoawq"))
def test_gptq_qzeros_helpers_on_the_tools_checkpoints(name):
    """quant.unpack_gptq_qzeros, in the convention the fixture's config names, gives the zero
    points with which (q - z) * s is the tool's own dequantized weight, bit for bit (fp16), and
    pack_gptq_qzeros gives the tool's qzeros back."""
    from w4kernels import checkpoint, quant

    entry = INDEX[name]
    folder = os.path.join(HERE, name)
    with open(os.path.join(folder, "config.json")) as fh:
        spec = checkpoint.parse_quantization_config(json.load(fh)["quantization_config"])
    t = safetensors_torch.load_file(os.path.join(folder, "model.safetensors"))
    p = entry["prefix"] + "."
    k, n = entry["in_features"], entry["out_features"]
    zeros = quant.unpack_gptq_qzeros(t[p + "qzeros"], n, spec.checkpoint_format)
    g = t[p + "g_idx"].long()
    q = reference.unpack_rows(t[p + "qweight"], k)
    w = ((q - zeros[g]).float() * t[p + "scales"].float()[g]).half()
    assert torch.equal(w.T, reference_of(name)["dequantized_weight"])
    assert torch.equal(quant.pack_gptq_qzeros(zeros, spec.checkpoint_format), t[p + "qzeros"])
