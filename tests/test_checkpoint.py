"""w4kernels.checkpoint: GPTQ / AWQ safetensors checkpoints loaded into a model through the
public loader, checked against the float64 weight the checkpoint means, saved back in the same
format (tensor for tensor), and the quantization_config values we cannot serve.

Checkpoint tensors come from tests/layer_tensors.py (packed with explicit shifts, as AutoGPTQ /
GPTQModel / AutoAWQ store them).
"""

import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

import w4kernels
from layer_tensors import awq_layer, gptq_layer
from numerics import UNIT_ROUNDOFF, gemm_error_bound
from w4kernels import checkpoint as ckpt
from w4kernels import nn as wnn

SIZES = {"proj": (256, 128), "shard": (320, 64)}  # name: (K, N); "shard": K % 128 != 0


class _Model(torch.nn.Module):
    """Two quantized projections (one a K shard with a partial last group) and a float
    layer that stays float, named like a transformer block."""

    def __init__(self, dtype=torch.float16):
        super().__init__()
        self.proj = torch.nn.Linear(256, 128, dtype=dtype)
        self.shard = torch.nn.Linear(320, 64, bias=False, dtype=dtype)
        self.norm = torch.nn.LayerNorm(128, dtype=dtype)


def _write(tmp_path, state, qconfig, config_name="config.json"):
    d = os.path.join(tmp_path, "ckpt")
    os.makedirs(d, exist_ok=True)
    # Two shards, as large checkpoints come.
    keys = sorted(state)
    save_file({k: state[k] for k in keys[: len(keys) // 2]},
              os.path.join(d, "model-00001-of-00002.safetensors"))
    save_file({k: state[k] for k in keys[len(keys) // 2:]},
              os.path.join(d, "model-00002-of-00002.safetensors"))
    cfg = qconfig if config_name == "quantize_config.json" else {"quantization_config": qconfig}
    with open(os.path.join(d, config_name), "w") as fh:
        json.dump(cfg, fh)
    return d


def _checkpoint(method, act_order=False, sym=True, fmt="gptq", dtype=torch.float16):
    state, weights = {}, {}
    for i, (name, (k, n)) in enumerate(SIZES.items()):
        if method == "gptq":
            t, w = gptq_layer(k, n, 128, act_order, sym, dtype, fmt, bias=(name == "proj"), seed=i)
        else:
            k = 256 if name == "shard" else k  # AutoAWQ needs whole groups
            t, w = awq_layer(k, n, 128, dtype, bias=(name == "proj"), seed=i)
        state.update({f"{name}.{key}": v for key, v in t.items()})
        weights[name] = (w, t.get("bias"))
    state["norm.weight"] = torch.rand(128).to(dtype)
    state["norm.bias"] = torch.rand(128).to(dtype)
    if method == "gptq":
        qconfig = dict(quant_method="gptq", bits=4, group_size=128, desc_act=act_order, sym=sym,
                       checkpoint_format=fmt)
    else:
        qconfig = dict(quant_method="awq", bits=4, group_size=128, zero_point=True,
                       version="GEMM")
    return state, weights, qconfig


def _check_layer(module, w, bias, dtype, bias_after_rounding=False):
    """Within the fp32-sum bound plus one output rounding; AWQLinear rounds x @ w and then
    the sum with the bias: one more rounding of the result (``bias_after_rounding``)."""
    x = torch.randn(3, w.shape[0], generator=torch.Generator().manual_seed(5)).to(dtype)
    acc = x.double() @ w
    ref = acc + (0 if bias is None else bias.double())
    err = (module(x).double() - ref).abs()
    bound = gemm_error_bound(x, w, acc if bias_after_rounding else ref, dtype)
    if bias_after_rounding:
        bound = bound + UNIT_ROUNDOFF[dtype] * ref.abs()
    assert (err <= bound).all()


GPTQ_VARIANTS = [(False, True, "gptq"), (True, True, "gptq"), (False, False, "gptq"),
                 (True, False, "gptq_v2")]


@pytest.mark.parametrize("act_order,sym,fmt", GPTQ_VARIANTS)
def test_gptq_checkpoint_load_and_save(tmp_path, act_order, sym, fmt):
    state, weights, qconfig = _checkpoint("gptq", act_order, sym, fmt)
    d = _write(tmp_path, state, qconfig)
    model = w4kernels.load_quantized(_Model(), d)
    for name, (w, bias) in weights.items():
        mod = getattr(model, name)
        assert isinstance(mod, wnn.MarlinLinear)
        _check_layer(mod, w, bias, torch.float16)
    assert torch.equal(model.norm.weight, state["norm.weight"])
    out = os.path.join(tmp_path, "saved")
    w4kernels.save_quantized(model, out)
    saved = load_file(os.path.join(out, "model.safetensors"))
    assert sorted(saved) == sorted(state)
    for k in state:
        assert saved[k].dtype == state[k].dtype and torch.equal(saved[k], state[k]), k
    with open(os.path.join(out, "config.json")) as fh:
        assert json.load(fh)["quantization_config"] == qconfig


def test_awq_checkpoint_load_and_save(tmp_path):
    state, weights, qconfig = _checkpoint("awq")
    d = _write(tmp_path, state, qconfig)
    model = _Model()
    model.shard = torch.nn.Linear(256, 64, bias=False, dtype=torch.float16)
    for kernel, cls in (("marlin", wnn.MarlinLinear), ("awq", wnn.AWQLinear)):
        loaded = w4kernels.load_quantized(_copy(model), d, kernel=kernel)
        for name, (w, bias) in weights.items():
            assert isinstance(getattr(loaded, name), cls)
            _check_layer(getattr(loaded, name), w, bias, torch.float16, kernel == "awq")
        out = os.path.join(tmp_path, f"saved-{kernel}")
        w4kernels.save_quantized(loaded, out)
        saved = load_file(os.path.join(out, "model.safetensors"))
        assert sorted(saved) == sorted(state)
        for k in state:
            assert torch.equal(saved[k], state[k]), (kernel, k)
        with open(os.path.join(out, "config.json")) as fh:
            assert json.load(fh)["quantization_config"]["version"] == "gemm"


def _copy(model):
    import copy

    return copy.deepcopy(model)


def test_bf16_model_converts_fp16_checkpoint_scales_once(tmp_path):
    state, weights, qconfig = _checkpoint("gptq")
    model = w4kernels.load_quantized(_Model(torch.bfloat16), state, qconfig)
    assert model.proj.scales.dtype == torch.bfloat16
    x = torch.randn(2, 256).to(torch.bfloat16)
    assert model.proj(x).dtype == torch.bfloat16


def test_autogptq_quantize_config_json_and_kleidiai_kernel(tmp_path):
    """AutoGPTQ's own quantize_config.json (no quant_method), served by the KleidiAI kernel (a
    symmetric GPTQ checkpoint without act-order); the K shard's partial group is an error
    there, naming the layer."""
    state, weights, qconfig = _checkpoint("gptq")
    del qconfig["quant_method"]
    d = _write(tmp_path, state, qconfig, "quantize_config.json")
    with pytest.raises(ValueError, match="layer 'shard': KleidiAILinear: group_size must be"):
        w4kernels.load_quantized(_Model(torch.float32), d, kernel="kleidiai")
    model = _Model(torch.float32)
    del model.shard
    state = {k: v for k, v in state.items() if not k.startswith("shard.")}
    model = w4kernels.load_quantized(model, state, qconfig | {"quant_method": "gptq"},
                                     kernel="kleidiai")
    assert isinstance(model.proj, wnn.KleidiAILinear)
    w, bias = weights["proj"]
    # The stored weight: the fp16 scales rounded once to bf16 (KleidiAI's per-block scale
    # dtype), so within 2^-9 relative of the checkpoint's weight; the matmul is test_nn's.
    torch.testing.assert_close(model.proj.dequantize().T, w, rtol=2**-8, atol=0)
    torch.testing.assert_close(model.proj.packed_bias(), bias.float(), rtol=0, atol=0)


@pytest.mark.parametrize("change,message", [
    (dict(bits=8), "bits = 8 is not supported"),
    (dict(bits=3), "bits = 3 is not supported"),
    (dict(checkpoint_format="marlin"), "checkpoint_format = 'marlin' is not supported"),
    (dict(checkpoint_format=None, format="bitblas"), "format = 'bitblas' is not supported"),
    (dict(quant_method="bitsandbytes"), "quant_method = 'bitsandbytes' is not supported"),
    (dict(group_size=0), "group_size = 0 is not supported"),
])
def test_unservable_gptq_config(change, message):
    state, _, qconfig = _checkpoint("gptq")
    qconfig.update(change)
    with pytest.raises(ValueError, match="quantization_config: " + message):
        w4kernels.load_quantized(_Model(), state, qconfig)


@pytest.mark.parametrize("change,message", [
    (dict(version="gemv"), "version = 'gemv' is not supported"),
    (dict(version="marlin"), "version = 'marlin' is not supported"),
    (dict(zero_point=False), "zero_point = False is not supported"),
])
def test_unservable_awq_config(change, message):
    _, _, qconfig = _checkpoint("awq")
    qconfig.update(change)
    with pytest.raises(ValueError, match="quantization_config: " + message):
        ckpt.parse_quantization_config(qconfig)


def test_mismatches_are_errors(tmp_path):
    state, _, qconfig = _checkpoint("gptq")
    with pytest.raises(ValueError, match="no quantization_config"):
        w4kernels.load_quantized(_Model(), state)
    extra = dict(state, **{"other.qweight": state["proj.qweight"]})
    with pytest.raises(ValueError,
                       match="no nn.Linear of that name in the model: \\['other.qweight'\\]"):
        w4kernels.load_quantized(_Model(), extra, qconfig)
    missing = {k: v for k, v in state.items() if k != "norm.bias"}
    with pytest.raises(ValueError, match="missing \\['norm.bias'\\]"):
        w4kernels.load_quantized(_Model(), missing, qconfig)
    with pytest.raises(ValueError, match="layer 'proj': .*act-order g_idx"):
        s2, _, q2 = _checkpoint("gptq", act_order=True)
        w4kernels.load_quantized(_Model(), s2, q2, kernel="awq")
