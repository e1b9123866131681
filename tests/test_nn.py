"""w4kernels.nn: the quantized Linear modules built from checkpoint tensors and from float
layers, their state_dict round trips, dtype policy, errors, and quantize_.

Reference: tests/layer_tensors.py makes checkpoint tensors from random codes with explicit
shifts and the float64 weight they mean; outputs are checked with numerics.assert_gemm_close
(fp32 accumulation bound plus one rounding of the output; AWQLinear adds its bias after the
op's rounding, so its bound has one more rounding of the result).
"""

import io
import os

import pytest
import torch

import w4kernels
from layer_tensors import awq_layer, gptq_layer
from numerics import UNIT_ROUNDOFF, assert_gemm_close, gemm_error_bound
from w4kernels import nn as wnn
from w4kernels import ops, quant, reference


def _x(shape, dtype, seed=1):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _check(module, x, w, bias, bias_after_rounding=False):
    """module(x) against x @ w (+ bias) in float64, x [..., K] -> [..., N]. With
    ``bias_after_rounding`` (AWQLinear: the op rounds x @ w, then the bias is added and the sum
    rounded again) the bound is that of x @ w plus one more rounding of the result."""
    out = module(x)
    assert out.shape == (*x.shape[:-1], w.shape[1]) and out.dtype == x.dtype
    x2 = x.reshape(-1, x.shape[-1])
    acc = x2.double() @ w
    ref = acc if bias is None else acc + bias.double()
    if bias_after_rounding:
        bound = gemm_error_bound(x2, w, acc, out.dtype) + UNIT_ROUNDOFF[out.dtype] * ref.abs()
    else:
        bound = gemm_error_bound(x2, w, ref, out.dtype)
    err = (out.reshape(-1, w.shape[1]).double() - ref).abs()
    assert (err <= bound).all(), f"error exceeds the bound by {(err / bound).max():.3g}x"


# (K, N, group_size, act_order, sym, checkpoint_format): per channel, grouped, act-order,
# asymmetric in both qzeros conventions, and K = 320 with groups of 128 (a K shard whose last
# group is partial), with and without act-order.
GPTQ_CASES = [
    (256, 128, -1, False, True, "gptq"),
    (256, 128, 128, False, True, "gptq"),
    (256, 192, 64, True, True, "gptq"),
    (256, 128, 64, False, False, "gptq"),
    (256, 128, 32, True, False, "gptq_v2"),
    (256, 64, -1, False, False, "gptq_v2"),
    (320, 128, 128, False, True, "gptq"),
    (320, 128, 128, True, False, "gptq"),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", GPTQ_CASES, ids=lambda c: "-".join(map(str, c)))
def test_marlin_from_gptq(case, dtype):
    size_k, size_n, gs, act, sym, fmt = case
    t, w = gptq_layer(size_k, size_n, gs, act, sym, dtype, fmt)
    m = wnn.MarlinLinear.from_gptq(t["qweight"], t["qzeros"], t["scales"], t["g_idx"], t["bias"],
                                   4, gs, act, sym, fmt)
    assert m.scales.dtype == dtype and m.row_groups == (act or size_k % gs != 0 and gs != -1)
    for shape in [(1, size_k), (2, 3, size_k), (7, size_k)]:
        _check(m, _x(shape, dtype), w, t["bias"])
    torch.testing.assert_close(m.dequantize().T, w, rtol=0, atol=0)


@pytest.mark.parametrize("case", [(256, 128, 64), (512, 256, 128), (320, 64, 128)])
def test_marlin_from_awq(case):
    size_k, size_n, gs = case
    t, w = awq_layer(size_k, size_n, gs, torch.float16)
    m = wnn.MarlinLinear.from_awq(t["qweight"], t["qzeros"], t["scales"], t["bias"], gs)
    _check(m, _x((2, 5, size_k), torch.float16), w, t["bias"])


def test_awq_linear_from_awq_and_gptq():
    t, w = awq_layer(256, 128, 64, torch.float16)
    m = wnn.AWQLinear.from_awq(t["qweight"], t["qzeros"], t["scales"], t["bias"], 64)
    _check(m, _x((3, 4, 256), torch.float16), w, t["bias"], bias_after_rounding=True)
    t, w = gptq_layer(256, 128, 64, False, False, torch.bfloat16, "gptq_v2")
    m = wnn.AWQLinear.from_gptq(t["qweight"], t["qzeros"], t["scales"], t["g_idx"], t["bias"],
                                4, 64, False, False, "gptq_v2")
    _check(m, _x((5, 256), torch.bfloat16), w, t["bias"], bias_after_rounding=True)


@pytest.mark.parametrize("gs", [-1, 64])
def test_kleidiai_from_gptq(gs):
    """KleidiAI quantizes the activations per row to int8, so the reference is KleidiAI's own
    float64 model (reference.dyn_quant_matmul_4bit_f64) on the checkpoint's unpacked codes;
    the kernels sum exact int32 dot products and apply the scales in f32: relative 1e-5."""
    size_k, size_n = 256, 72
    # bf16-representable scales stored as fp16, so the per-block format (bf16 scales) holds
    # them exactly.
    t, _ = gptq_layer(size_k, size_n, gs, False, True, torch.bfloat16)
    t["scales"] = t["scales"].to(torch.float16)
    m = wnn.KleidiAILinear.from_gptq(t["qweight"], t["qzeros"], t["scales"], t["g_idx"],
                                     t["bias"], 4, gs)
    x = _x((2, 3, size_k), torch.float32)
    q = reference.unpack_rows(t["qweight"], size_k).T.to(torch.uint8)
    weights = q[:, 0::2] | (q[:, 1::2] << 4)
    s = t["scales"].float().T.contiguous()
    ref = reference.dyn_quant_matmul_4bit_f64(x, weights, s, t["bias"].float(),
                                              size_k if gs == -1 else gs, size_k, size_n)
    out = m(x)
    assert out.shape == (2, 3, size_n) and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5 * ref.abs().max().item())
    assert m(x.to(torch.bfloat16)).dtype == torch.bfloat16
    assert m(x.half()).dtype == torch.float16


# ---- the three silent mistakes of issue 10, fed through the module constructors ------------


def test_checkpoint_unsorted_g_idx_gives_correct_layer():
    """The checkpoint's unsorted g_idx passed to w4a16_gemm as is gave relative errors of
    0.12-0.69; the module sorts it and repacks with the matching perm."""
    t, w = gptq_layer(256, 128, 32, True, True, torch.float16)
    assert not bool((t["g_idx"][1:] >= t["g_idx"][:-1]).all())  # really unsorted
    m = wnn.MarlinLinear.from_gptq(t["qweight"], t["qzeros"], t["scales"], t["g_idx"],
                                   t["bias"], 4, 32, True)
    assert bool((m.g_idx[1:] >= m.g_idx[:-1]).all())
    _check(m, _x((4, 256), torch.float16), w, t["bias"])
    # The op itself refuses the unsorted g_idx (instead of the old silent garbage).
    mw = quant.gptq_to_marlin(quant.GPTQWeight(t["qweight"], t["scales"], t["g_idx"], 32, 256, 128))
    with pytest.raises(RuntimeError, match="g_idx"):
        ops.w4a16_gemm(_x((4, 256), torch.float16), mw.b_q_weight, mw.b_scales, None,
                       t["g_idx"], mw.perm, mw.workspace, 4, 4, 128, 256)


def test_checkpoint_scales_in_natural_order_give_correct_layer():
    """Scales not Marlin-permuted gave a relative error of 0.66; the constructors take the
    checkpoint's natural-order scales and permute them once."""
    t, w = gptq_layer(256, 128, 64, False, True, torch.bfloat16)
    m = wnn.MarlinLinear.from_gptq(t["qweight"], t["qzeros"], t["scales"], None, t["bias"], 4, 64)
    assert not torch.equal(m.scales, t["scales"])  # stored permuted ...
    torch.testing.assert_close(reference.marlin_unpermute_scales(m.scales, 128), t["scales"],
                               rtol=0, atol=0)  # ... from the natural order given
    _check(m, _x((3, 256), torch.bfloat16), w, t["bias"])


def test_act_order_perm_is_owned_by_the_module():
    """perm given to marlin_repack but not to the GEMM gave a relative error of 3.3: the module
    keeps the one perm it repacked with and passes it to every GEMM; a state dict without it
    cannot be loaded."""
    t, w = gptq_layer(256, 128, 64, True, False, torch.float16, "gptq_v2")
    m = wnn.MarlinLinear.from_gptq(t["qweight"], t["qzeros"], t["scales"], t["g_idx"],
                                   t["bias"], 4, 64, True, False, "gptq_v2")
    _check(m, _x((2, 256), torch.float16), w, t["bias"])
    sd = m.state_dict()
    del sd["perm"]
    fresh = wnn.MarlinLinear(256, 128, True, 64, zero_points=True, act_order=True)
    with pytest.raises(RuntimeError, match="perm"):
        fresh.load_state_dict(sd)


# ---- state_dict round trips -------------------------------------------------------------------


def _modules():
    """(name, module, fresh-module factory) for every family and the Marlin variants."""
    t, _ = gptq_layer(256, 128, 64, True, False, torch.float16, "gptq")
    act = wnn.MarlinLinear.from_gptq(t["qweight"], t["qzeros"], t["scales"], t["g_idx"],
                                     t["bias"], 4, 64, True, False)
    t2, _ = gptq_layer(320, 128, 128, False, True, torch.bfloat16)
    shard = wnn.MarlinLinear.from_gptq(t2["qweight"], t2["qzeros"], t2["scales"], None, None, 4,
                                       128)
    ta, _ = awq_layer(256, 128, 64, torch.float16)
    awq = wnn.AWQLinear.from_awq(ta["qweight"], ta["qzeros"], ta["scales"], ta["bias"], 64)
    lin = torch.nn.Linear(256, 128)
    kai = wnn.KleidiAILinear.from_float(lin, group_size=64)
    return [
        ("marlin-act-order-asym", act,
         lambda: wnn.MarlinLinear(256, 128, True, 64, True, True, torch.float16)),
        ("marlin-k-shard", shard,
         lambda: wnn.MarlinLinear(320, 128, False, 128, False, False, torch.bfloat16)),
        ("awq", awq, lambda: wnn.AWQLinear(256, 128, True, 64, torch.float16)),
        ("kleidiai", kai, lambda: wnn.KleidiAILinear(256, 128, True, 64)),
    ]


@pytest.mark.parametrize("via", ["torch.save", "safetensors"])
def test_state_dict_round_trip_is_bit_identical(via, tmp_path):
    from safetensors.torch import load_file, save_file

    for name, m, fresh in _modules():
        x = _x((3, m.in_features), torch.float32 if name == "kleidiai" else
               getattr(m, "scales", torch.empty(0)).dtype)
        if via == "torch.save":
            buf = io.BytesIO()
            torch.save(m.state_dict(), buf)
            buf.seek(0)
            sd = torch.load(buf)
        else:
            path = os.path.join(tmp_path, f"{name}.safetensors")
            save_file(m.state_dict(), path)
            sd = load_file(path)
        new = fresh()
        new.load_state_dict(sd)
        assert torch.equal(new(x), m(x)), name


def test_awq_linear_loads_an_autoawq_state_dict_into_bf16():
    """AutoAWQ ships fp16 scales; a bf16 module converts them once, in load_state_dict."""
    t, w = awq_layer(256, 128, 64, torch.float16)
    m = wnn.AWQLinear(256, 128, True, 64, torch.bfloat16)
    m.load_state_dict(t)
    assert m.scales.dtype == torch.bfloat16
    torch.testing.assert_close(m.scales, t["scales"].to(torch.bfloat16), rtol=0, atol=0)
    x = _x((2, 256), torch.bfloat16)
    w_bf16 = reference.awq_dequantize(m.qweight, m.scales, m.qzeros).double()
    _check(m, x, w_bf16, m.bias, bias_after_rounding=True)


# ---- dtype policy --------------------------------------------------------------------------


def test_dtype_policy():
    t, w = gptq_layer(256, 128, 64, False, True, torch.float16)
    m = wnn.MarlinLinear.from_gptq(t["qweight"], t["qzeros"], t["scales"], None, t["bias"], 4, 64,
                                   dtype=torch.bfloat16)  # fp16 checkpoint scales -> bf16 once
    assert m.scales.dtype == torch.bfloat16 and m.bias.dtype == torch.bfloat16
    x = _x((2, 256), torch.float32)
    out = m(x)  # fp32 activations: cast in, result cast back
    assert out.dtype == torch.float32
    assert torch.equal(out, m(x.to(torch.bfloat16)).float())
    m.half()
    assert m.scales.dtype == torch.float16 and m.qweight.dtype == torch.int32
    m.float()
    with pytest.raises(TypeError, match="MarlinLinear: scales are torch.float32"):
        m(x)


# ---- errors ------------------------------------------------------------------------------------


def test_constructor_errors():
    t, _ = gptq_layer(256, 128, 64, True, True, torch.float16)
    with pytest.raises(ValueError, match="bits = 8 is not supported"):
        wnn.MarlinLinear.from_gptq(t["qweight"], t["qzeros"], t["scales"], t["g_idx"], None, 8, 64)
    with pytest.raises(ValueError, match="desc_act=True needs the checkpoint's g_idx"):
        wnn.MarlinLinear.from_gptq(t["qweight"], t["qzeros"], t["scales"], None, None, 4, 64, True)
    with pytest.raises(ValueError, match="act-order g_idx .* not servable by awq_gemm"):
        wnn.AWQLinear.from_gptq(t["qweight"], t["qzeros"], t["scales"], t["g_idx"], None, 4, 64)
    with pytest.raises(ValueError, match="not servable by the KleidiAI"):
        wnn.KleidiAILinear.from_gptq(t["qweight"], t["qzeros"], t["scales"], t["g_idx"], None,
                                     4, 64)
    ta, _ = awq_layer(256, 128, 64, torch.float16)
    with pytest.raises(ValueError, match="KleidiAILinear.from_awq: AutoAWQ weights have"):
        wnn.KleidiAILinear.from_awq(ta["qweight"], ta["qzeros"], ta["scales"], None, 64)
    with pytest.raises(ValueError, match="scales must be .* \\[4, 128\\]"):
        wnn.MarlinLinear.from_awq(ta["qweight"], ta["qzeros"], ta["scales"][:2], None, 64)
    with pytest.raises(ValueError, match="out_features \\(N\\) must be a positive multiple of 64"):
        wnn.MarlinLinear(256, 96)
    with pytest.raises(ValueError, match="dtype must be torch.float16 or torch.bfloat16"):
        wnn.MarlinLinear(256, 128, dtype=torch.float32)
    with pytest.raises(ValueError, match="group_size must be -1 .* multiple of 32"):
        wnn.KleidiAILinear(256, 64, group_size=48)


def test_symmetric_flag_catches_the_wrong_qzeros_convention():
    """A symmetric GPTQModel v2 checkpoint (qzeros = 8) read as AutoGPTQ's convention decodes
    to zero points 9: an error naming checkpoint_format, not a silent offset of one code."""
    t, _ = gptq_layer(256, 128, 64, False, True, torch.float16, "gptq_v2")
    with pytest.raises(ValueError, match="zero points \\[9\\] instead of 8: the checkpoint_format"):
        wnn.MarlinLinear.from_gptq(t["qweight"], t["qzeros"], t["scales"], None, None, 4, 64,
                                   sym=True, checkpoint_format="gptq")


# ---- GPTQ zero-point conventions (quant.py) --------------------------------------------------


def test_gptq_qzeros_conventions():
    z = torch.randint(1, 16, (3, 64), generator=torch.Generator().manual_seed(0), dtype=torch.int32)
    from layer_tensors import gptq_pack_qzeros

    for fmt in ("gptq", "gptq_v2"):
        packed = quant.pack_gptq_qzeros(z, fmt)
        assert torch.equal(packed, gptq_pack_qzeros(z, fmt))
        assert torch.equal(quant.unpack_gptq_qzeros(packed, 64, fmt), z)
    eights = torch.full((1, 8), 8, dtype=torch.int32)
    assert quant.pack_gptq_qzeros(eights, "gptq").item() == 0x77777777  # AutoGPTQ symmetric
    assert quant.pack_gptq_qzeros(eights, "gptq_v2").item() == -0x77777778  # 0x88888888
    with pytest.raises(ValueError, match="zero point 0 .* cannot be stored in the 'gptq'"):
        quant.pack_gptq_qzeros(torch.zeros(1, 8, dtype=torch.int32), "gptq")
    with pytest.raises(ValueError, match="reads as zero point 16"):
        quant.unpack_gptq_qzeros(torch.full((1, 1), -1, dtype=torch.int32), 8, "gptq")
    with pytest.raises(ValueError, match="checkpoint_format must be one of"):
        quant.pack_gptq_qzeros(eights, "gptq_v3")


def test_asymmetric_gptq_quantizer():
    w = torch.randn(128, 64, generator=torch.Generator().manual_seed(3))
    g = quant.quantize_gptq(w, 32, sym=False, dtype=torch.float32)
    assert g.zeros is not None and g.zeros.shape == (4, 64)
    # RTN with a zero point: every weight within half a step of its code's value.
    err = (g.dequantize(exact=True) - w.double()).abs()
    step = g.scales.double().repeat_interleave(32, dim=0)
    assert bool((err <= 0.5 * step + 1e-6).all())


# ---- from_float and quantize_ -------------------------------------------------------------


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(128, 256)
        self.down = torch.nn.Linear(256, 128, bias=False)
        self.head = torch.nn.Linear(128, 10)

    def forward(self, x):
        return self.head(self.down(torch.relu(self.up(x))))


@pytest.mark.parametrize("config", [
    w4kernels.GPTQMarlinConfig(group_size=64, act_order=True),
    w4kernels.GPTQMarlinConfig(group_size=-1, sym=False),
    w4kernels.AWQMarlinConfig(group_size=64),
    w4kernels.AWQConfig(group_size=64),
    w4kernels.KleidiAIConfig(group_size=32),
], ids=lambda c: type(c).__name__ + str(c.group_size))
def test_quantize_(config):
    torch.manual_seed(0)
    model = _Block().to(torch.bfloat16)
    dense = {n: m.weight.detach().clone() for n, m in model.named_modules()
             if isinstance(m, torch.nn.Linear)}
    seen = []
    w4kernels.quantize_(model, config, filter_fn=lambda m, name: name != "head",
                        progress=lambda done, total, name: seen.append((done, total, name)))
    assert seen == [(1, 2, "up"), (2, 2, "down")]
    assert isinstance(model.head, torch.nn.Linear)
    assert isinstance(model.up, wnn.QUANTIZED_LINEARS)
    # The quantized weight stays within half a quantization step of the dense one: relative
    # error of a 4-bit RTN weight is at most 1/2 of a step of ~1/8 to 1/15 of the group range.
    for name in ("up", "down"):
        mod = getattr(model, name)
        wq, wd = mod.dequantize().float(), dense[name].float()
        assert (wq - wd).abs().max() <= 0.1 * wd.abs().max()
    x = torch.randn(2, 3, 128).to(torch.bfloat16)
    assert model(x).shape == (2, 3, 10)


def test_quantize_names_the_unservable_layer(capsys):
    model = _Block()
    with pytest.raises(ValueError, match="quantize_: layer 'head' \\(128 -> 10\\): MarlinLinear"):
        w4kernels.quantize_(model, w4kernels.GPTQMarlinConfig(group_size=64), progress=True)
    assert "quantize_: 2/3 layers (down)" in capsys.readouterr().err
    with pytest.raises(TypeError, match="config must be a w4kernels config"):
        w4kernels.quantize_(model, {"bits": 4})


def test_extra_repr():
    m = wnn.MarlinLinear(256, 128, True, 64, True, True, torch.bfloat16)
    assert repr(m) == ("MarlinLinear(in_features=256, out_features=128, bias=True, group_size=64, "
                       "zero_points=True, act_order=True, dtype=torch.bfloat16)")
    assert "group_size=32" in repr(wnn.KleidiAILinear(64, 8, False, 32))
    assert "dtype=torch.float16" in repr(wnn.AWQLinear(128, 64, False, 64))


# ---- the GPU kernels on the modules' tensors ------------------------------------------------


SIMT_CASES = [GPTQ_CASES[2], GPTQ_CASES[4], GPTQ_CASES[5], GPTQ_CASES[7]]


@pytest.mark.parametrize("backend", ["simt", "cuda"])
@pytest.mark.parametrize("case", SIMT_CASES, ids=lambda c: "-".join(map(str, c)))
def test_gpu_kernels_on_module_tensors(case, backend):
    """On CUDA a MarlinLinear calls the GPU kernel with the tensors it built: run that kernel
    on them (under the SIMT emulator here; on a real GPU where there is one) for act-order,
    zero points, per channel and the K shard (is_k_full=False)."""
    from conftest import backend_or_skip

    b = backend_or_skip(backend, "w4a16_gemm")
    size_k, size_n, gs, act, sym, fmt = case
    t, w = gptq_layer(size_k, size_n, gs, act, sym, torch.float16, fmt)
    m = wnn.MarlinLinear.from_gptq(t["qweight"], t["qzeros"], t["scales"], t["g_idx"], t["bias"],
                                   4, gs, act, sym, fmt).to(b.device)
    x = _x((5, size_k), torch.float16).to(b.device)
    if backend == "cuda":
        out = m(x)
    else:
        out = b.op("w4a16_gemm")(x, m.qweight, m.scales, m.qzeros, m.g_idx, m.perm, m.workspace,
                                 4, 5, size_n, size_k, m.is_k_full, m.bias, True)
    ref = x.cpu().double() @ w + t["bias"].double()
    assert_gemm_close(out.cpu(), ref, x.cpu(), w)


@pytest.mark.parametrize("backend", ["simt", "cuda"])
def test_gpu_awq_kernel_on_awq_linear_tensors(backend):
    from conftest import backend_or_skip

    b = backend_or_skip(backend, "awq_gemm")
    t, w = awq_layer(256, 128, 64, torch.float16, bias=False)
    m = wnn.AWQLinear.from_awq(t["qweight"], t["qzeros"], t["scales"], None, 64).to(b.device)
    x = _x((3, 256), torch.float16).to(b.device)
    out = m(x) if backend == "cuda" else b.op("awq_gemm")(x, m.qweight, m.scales, m.qzeros, 8)
    assert_gemm_close(out.cpu(), x.cpu().double() @ w, x.cpu(), w)


@pytest.mark.parametrize("rows", [1, 4, 5, 127, 128, 200])
def test_awq_linear_cpu_paths_by_m(rows):
    """On the CPU, awq_gemm's decode (M <= 4) and tile paths: within the bound of the same
    float64 reference (the weight rounded once to the dtype, fp32 sums, bias added after the
    rounding)."""
    t, w = awq_layer(128, 64, 32, torch.bfloat16)
    m = wnn.AWQLinear.from_awq(t["qweight"], t["qzeros"], t["scales"], t["bias"], 32)
    _check(m, _x((rows, 128), torch.bfloat16), w, t["bias"], bias_after_rounding=True)
