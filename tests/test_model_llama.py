"""End to end: a small Llama built locally from transformers.LlamaConfig (random weights, fixed
seed, no download), every decoder Linear replaced by a w4kernels module.

Reference model: the same Llama in bf16 whose decoder Linear weights are the quantized
modules' own dequantized weights (``module.dequantize()``, rounded to bf16: exact for the
grouped formats, which round each weight to bf16 themselves). The two models then compute the
same function, and differ only in fp32 summation order inside each GEMM, in where the
kernel rounds (one bf16 rounding of each projection's output, like cuBLAS/oneDNN), and, for
KleidiAI, in the int8 quantization of the activations (its reference is built the same way
but compared more loosely, below).

Tolerance on the logits: each of the 14 projections can land one bf16 ulp (2^-8 relative)
away from the dense model's, and that propagates through RMSNorm, attention and the residual
stream; we allow 8 ulps of the largest logit (8 * 2^-8 * max|logit|) for the 16-bit formats
and require the same greedy tokens. KleidiAI quantizes every activation row to int8 (a
relative error up to 2^-8 per element of the input, summed over K), so its logits are
allowed 5 % of max|logit| (measured: 1.4 %, 3.6 bf16 ulps): that checks the layers are right
(a wrong layout or scale gives errors of the order of the logits themselves, and the 4-bit
quantization itself moves these logits by 18-21 % from the unquantized model's), not the int8
error. Measured for the 16-bit formats: 0 ulps (GPTQ act-order, AWQ), 1.8 ulps (asymmetric
GPTQ with a per-channel 128-row layer, whose weight the kernel keeps unrounded).
"""

import copy
import os

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers (requirements.txt) "
                                   "is needed to build a Llama model")

import w4kernels  # noqa: E402
from w4kernels import nn as wnn  # noqa: E402

CONFIGS = {
    "gptq-act-order": (w4kernels.GPTQMarlinConfig(group_size=64, act_order=True), 8 * 2**-8),
    "gptq-asym": (w4kernels.GPTQMarlinConfig(group_size=128, sym=False), 8 * 2**-8),
    "awq-marlin": (w4kernels.AWQMarlinConfig(group_size=64), 8 * 2**-8),
    "awq": (w4kernels.AWQConfig(group_size=64), 8 * 2**-8),
    "kleidiai": (w4kernels.KleidiAIConfig(group_size=32), 0.05),
}


def small_llama(seed=0, tie_word_embeddings=False):
    # head_dim 64; every projection's N is a multiple of 64 (Marlin) and K of 64 (the groups).
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256,
                                   num_hidden_layers=2, num_attention_heads=2,
                                   num_key_value_heads=1, max_position_embeddings=64,
                                   tie_word_embeddings=tie_word_embeddings)
    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()


def decoder_linear(module, name):
    return name.startswith("model.layers.")


@pytest.fixture(scope="module")
def dense_model():
    return small_llama()


_CACHE = {}


def quantized_and_reference(dense_model, name):
    """(quantized model, bf16 reference model with its dequantized weights, layers replaced),
    built once per config."""
    if name not in _CACHE:
        _CACHE[name] = _build(dense_model, CONFIGS[name][0])
    return _CACHE[name]


def _build(dense_model, config):
    q = copy.deepcopy(dense_model)
    w4kernels.quantize_(q, config, filter_fn=decoder_linear)
    ref = copy.deepcopy(dense_model)
    replaced = 0
    for name, mod in q.named_modules():
        if isinstance(mod, wnn.QUANTIZED_LINEARS):
            ref.get_submodule(name).weight.data.copy_(mod.dequantize().to(torch.bfloat16))
            replaced += 1
    return q, ref, replaced


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_logits_and_generate(dense_model, name):
    tol = CONFIGS[name][1]
    q, ref, replaced = quantized_and_reference(dense_model, name)
    assert replaced == 14  # 2 layers x (q, k, v, o, gate, up, down)
    assert not any(isinstance(m, torch.nn.Linear) for n, m in q.named_modules()
                   if n.startswith("model.layers."))
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        lq, lr = q(ids).logits.float(), ref(ids).logits.float()
    assert (lq - lr).abs().max() <= tol * lr.abs().max()
    out = q.generate(ids[:1], max_new_tokens=6, do_sample=False)
    assert out.shape == (1, 18)
    if tol < 0.05:
        assert torch.equal(out, ref.generate(ids[:1], max_new_tokens=6, do_sample=False))


def test_torch_compile_fullgraph(dense_model):
    """The whole quantized model traces into one graph (the ops' fakes); aot_eager runs the
    traced graph on the real ops, so outputs are bit-identical. (Inductor also compiles it:
    slower to build, see the README.)"""
    q, _, _ = quantized_and_reference(dense_model, "gptq-act-order")
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(2))
    torch._dynamo.reset()
    compiled = torch.compile(q, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        assert torch.equal(compiled(ids).logits, q(ids).logits)


def test_save_and_load_round_trip(dense_model, tmp_path):
    """save_quantized writes a GPTQ checkpoint (config.json with quantization_config); a model
    freshly built from the same LlamaConfig loads it and gives bit-identical logits."""
    q, _, _ = quantized_and_reference(dense_model, "gptq-act-order")
    w4kernels.save_quantized(q, str(tmp_path))
    fresh = small_llama(seed=123)  # different random weights, all overwritten by the load
    w4kernels.load_quantized(fresh, str(tmp_path))
    assert fresh.w4kernels_quantization.desc_act
    ids = torch.randint(0, 256, (1, 10), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(fresh(ids).logits, q(ids).logits)
    # The module state dict round trip too (Marlin tensors, safetensors).
    from safetensors.torch import load_file, save_file

    path = os.path.join(tmp_path, "state.safetensors")
    save_file(q.state_dict(), path)
    again = small_llama(seed=7)
    w4kernels.quantize_(again, CONFIGS["gptq-act-order"][0], filter_fn=decoder_linear)
    again.load_state_dict(load_file(path))
    with torch.no_grad():
        assert torch.equal(again(ids).logits, q(ids).logits)


def test_tied_embeddings_are_saved_once_and_reloaded(tmp_path):
    """A model whose lm_head shares the embedding (tie_word_embeddings) is saved with one copy,
    as transformers saves it, and the loader accepts the tied name as loaded."""
    from safetensors.torch import load_file

    q = small_llama(seed=4, tie_word_embeddings=True)
    assert q.lm_head.weight is q.model.embed_tokens.weight
    w4kernels.quantize_(q, CONFIGS["awq"][0], filter_fn=decoder_linear)
    w4kernels.save_quantized(q, str(tmp_path))
    saved = load_file(os.path.join(tmp_path, "model.safetensors"))
    assert ("lm_head.weight" in saved) != ("model.embed_tokens.weight" in saved)
    fresh = small_llama(seed=5, tie_word_embeddings=True)
    w4kernels.load_quantized(fresh, str(tmp_path), kernel="awq")
    assert fresh.lm_head.weight is fresh.model.embed_tokens.weight
    ids = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        assert torch.equal(fresh(ids).logits, q(ids).logits)
