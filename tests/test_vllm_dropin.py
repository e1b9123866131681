"""w4kernels.vllm called the way vLLM calls its own ops, and the schema-order ops wrappers.

vLLM's kernel tests (tests/kernels/quantization/test_marlin_gemm.py at 01065c02, test_awq.py,
test_awq_triton.py; read 2026-11-23) quantize a random weight, convert it with the Marlin
helpers and call the op with 19 positional/keyword arguments over: M/N/K factors
(1,1,1), (1,4,8), (26,37,13), (257,13,11) of (1, 64|256, 128); group sizes -1, 32, 64, 128;
act-order (GPTQ only, not per-channel, not group == K); is_k_full; fp16/bf16; a bias
permuted with marlin_permute_bias; a sliced (row-strided) input; repacks over N/K factors
(4,8), (7,5), (13,11) of (64|256, 128); AWQ dequantize/gemm over small shapes and split-K 1/8.
The tests below are ours, written from that parametrization (a few large shapes trimmed to keep
the module near a minute on a 2-core machine), and check against float64 references with a
derived error bound instead of vLLM's mean-relative 4 %.

Reference: the weight is dequantized from the unpacked GPTQ/AWQ codes (not from the Marlin
tensors the op reads), rounded once to the activation dtype when grouped, exact per channel
(README, "Numerics of w4a16_gemm").
"""

import functools
import inspect
import os

import pytest
import torch

import w4kernels
from conftest import backend_or_skip
from w4kernels import ops, quant, reference
from w4kernels import vllm as V

DTYPES = [torch.float16, torch.bfloat16]
U_OUT = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}


# ---- reference ------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def layer(kind, size_k, size_n, group_size, act_order, dtype, seed=0):
    """(checkpoint weight, float64 reference weight [K, N]) for kind "gptq" (uint4b8, optional
    act-order g_idx) or "awq" (uint4 with zero points): random codes, zero points and scales
    (some negative) in the checkpoint formats, as a quantizer would store them."""
    gen = torch.Generator().manual_seed(seed)
    groups = 1 if group_size == -1 else size_k // group_size
    q = torch.randint(0, 16, (size_k, size_n), dtype=torch.int32, generator=gen)
    scales = (torch.rand(groups, size_n, generator=gen) + 0.05) * 0.02
    scales[torch.rand(groups, size_n, generator=gen) < 0.25] *= -1
    scales = scales.to(dtype)
    row_group = torch.arange(size_k) // (size_k // groups)
    if kind == "gptq":
        g_idx = row_group[torch.randperm(size_k, generator=gen)].int() if act_order else None
        groups_of_row = row_group if g_idx is None else g_idx.long()
        g = quant.GPTQWeight(reference.pack_rows(q), scales, g_idx, group_size, size_k, size_n)
        qz = q - 8
    else:
        z = torch.randint(0, 16, (groups, size_n), dtype=torch.int32, generator=gen)
        g = quant.AWQWeight(reference.awq_pack(q), scales, reference.awq_pack(z), group_size,
                            size_k, size_n)
        groups_of_row = row_group
        qz = q - z[row_group]
    w_exact = qz.double() * scales.double()[groups_of_row]
    return g, (w_exact if groups == 1 else w_exact.to(dtype).double())


def vllm_operands(kind, g, size_k, size_n, group_size, device="cpu"):
    """The tensors vLLM's gptq_marlin / awq_marlin layers hold after loading, made with
    w4kernels.vllm's helpers (as vLLM's process_weights_after_loading does)."""
    if kind == "gptq":
        if g.g_idx is not None:
            g_idx, perm = V.marlin_sort_g_idx(g.g_idx)
        else:
            g_idx, perm = V.marlin_make_empty_g_idx(device), V.marlin_make_empty_g_idx(device)
        q = V.gptq_marlin_repack(g.qweight.to(device), perm.to(device), size_k, size_n, 4)
        zp = V.marlin_make_empty_zp(device)
        b_type = V.scalar_types.uint4b8
    else:
        g_idx, perm = V.marlin_make_empty_g_idx(device), V.marlin_make_empty_g_idx(device)
        q = V.awq_marlin_repack(g.qweight.to(device), size_k, size_n, 4)
        zp = V.awq_to_marlin_zero_points(g.qzeros, g.scales.shape[0], size_n, 4)
        b_type = V.scalar_types.uint4
    s = V.marlin_permute_scales(g.scales, size_k, size_n, group_size)
    dev = lambda t: t.to(device)  # noqa: E731
    return dict(b_q_weight=q, b_scales=dev(s), b_zeros=dev(zp), g_idx=dev(g_idx),
                perm=dev(perm), b_q_type=b_type)


def assert_close_to(out, a, w_ref, bias=None):
    """|out - a @ w_ref (+ bias)| within the fp32 accumulation bound (K + 2 roundings per
    term: the sums, the per-channel scale multiply, the bias add) plus the output rounding."""
    ref = a.double().cpu() @ w_ref
    mag = a.double().abs().cpu() @ w_ref.abs()
    if bias is not None:
        ref, mag = ref + bias.double().cpu(), mag + bias.double().abs().cpu()
    roundings = a.shape[-1] + 2
    acc = roundings * 2.0 ** -24 / (1 - roundings * 2.0 ** -24) * mag
    tol = U_OUT[out.dtype] * (ref.abs() + acc) + acc + 2.0 ** -24
    err = (out.double().cpu() - ref).abs()
    assert out.shape == ref.shape
    assert bool((err <= tol).all()), f"max excess {(err - tol).max().item():.3e}"


def gemm(a, ops_, *, c=None, b_bias=None, is_k_full=True, **kw):
    """vLLM's call pattern (apply_gptq_marlin_linear / test_marlin_gemm): 12 positional
    arguments, sizes and flags by keyword."""
    size_k = a.shape[-1]
    size_n = ops_["b_scales"].shape[1]
    return V.gptq_marlin_gemm(
        a, c, ops_["b_q_weight"], b_bias, ops_["b_scales"], None, None, ops_["b_zeros"],
        ops_["g_idx"], ops_["perm"], V.marlin_make_workspace_new(a.device), ops_["b_q_type"],
        size_m=a.shape[0], size_n=size_n, size_k=size_k, is_k_full=is_k_full,
        use_atomic_add=kw.get("use_atomic_add", False),
        use_fp32_reduce=kw.get("use_fp32_reduce", True), is_zp_float=False)


# ---- gptq_marlin_gemm over vLLM's parametrization -------------------------------------------


# (size_m, size_n, size_k) = MNK factor x (1, n_chunk, 128); one n_chunk per factor.
SHAPES = [(1, 64, 128), (1, 4 * 256, 8 * 128), (26, 37 * 64, 13 * 128), (257, 13 * 64, 11 * 128)]


def marlin_cases():
    cases = []
    for m, n, k in SHAPES:
        for kind in ("awq", "gptq"):
            for group_size in (-1, 32, 64, 128):
                if group_size == k:  # vLLM skips group == K (it is per-channel again)
                    continue
                for act_order in ((False, True) if kind == "gptq" else (False,)):
                    if act_order and group_size == -1:
                        continue
                    for is_k_full in (False, True):
                        cases.append(pytest.param(
                            kind, m, n, k, group_size, act_order, is_k_full,
                            id=f"{kind}-M{m}-N{n}-K{k}-g{group_size}"
                               f"{'-act' if act_order else ''}{'-kfull' if is_k_full else ''}"))
    return cases


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("kind,size_m,size_n,size_k,group_size,act_order,is_k_full",
                         marlin_cases())
def test_gptq_marlin_gemm(kind, size_m, size_n, size_k, group_size, act_order, is_k_full, dtype):
    """Full-K layers: is_k_full=False (g_idx looked up per row) must give the same product."""
    g, w_ref = layer(kind, size_k, size_n, group_size, act_order, dtype)
    a = torch.randn(size_m, size_k, generator=torch.Generator().manual_seed(size_m)).to(dtype)
    out = gemm(a, vllm_operands(kind, g, size_k, size_n, group_size), is_k_full=is_k_full)
    assert out.dtype == dtype
    assert_close_to(out, a, w_ref)


@pytest.mark.parametrize("size_m", [1, 256])
def test_gptq_marlin_gemm_with_bias(size_m):
    """vLLM stores a Marlin layer's bias permuted (marlin_permute_bias) and the op reads it so."""
    size_k, size_n = 1024, 2048
    g, w_ref = layer("gptq", size_k, size_n, 128, False, torch.float16)
    bias = (torch.randn(size_n, generator=torch.Generator().manual_seed(3)) * 10).half()
    a = torch.randn(size_m, size_k, generator=torch.Generator().manual_seed(4)).half()
    o = vllm_operands("gptq", g, size_k, size_n, 128)
    assert_close_to(gemm(a, o, b_bias=V.marlin_permute_bias(bias)), a, w_ref, bias)


def test_bias_in_natural_order_is_not_what_vllm_passes():
    """Regression guard for the bias permutation: the same bias unpermuted gives another
    result (if gptq_marlin_gemm stopped undoing the permutation, the test above would fail)."""
    g, _ = layer("gptq", 256, 128, 64, False, torch.float16)
    o = vllm_operands("gptq", g, 256, 128, 64)
    a = torch.zeros(1, 256, dtype=torch.float16)
    bias = torch.arange(128, dtype=torch.float16)
    assert torch.equal(gemm(a, o, b_bias=V.marlin_permute_bias(bias))[0], bias)
    assert not torch.equal(gemm(a, o, b_bias=bias)[0], bias)


def test_gptq_marlin_gemm_subset_input():
    """a is a slice of a larger buffer (row stride 2K, offset 8 rows and 8 columns)."""
    size_m, size_k, size_n = 32, 1024, 2048
    g, w_ref = layer("gptq", size_k, size_n, 128, False, torch.float16)
    big = torch.randn(2 * size_m, 2 * size_k, generator=torch.Generator().manual_seed(5)).half()
    a = big[8:size_m + 8, 8:size_k + 8]
    assert a.stride(0) == 2 * size_k
    assert_close_to(gemm(a, vllm_operands("gptq", g, size_k, size_n, 128)), a, w_ref)


@pytest.mark.parametrize("backend", ["simt", "cuda"])
@pytest.mark.parametrize("kind,group_size,act_order,bias", [
    ("gptq", 128, True, False), ("awq", 64, False, True), ("gptq", -1, False, True)])
def test_gptq_marlin_gemm_kernel_backends(monkeypatch, backend, kind, group_size, act_order,
                                          bias):
    """The CUDA kernels (under the emulator, or on a GPU) through the same Python code."""
    b = backend_or_skip(backend, "w4a16_gemm")
    monkeypatch.setattr(V, "_OPS", getattr(torch.ops, b.namespace))
    size_m, size_k, size_n = 17, 256, 128
    g, w_ref = layer(kind, size_k, size_n, group_size, act_order, torch.bfloat16)
    o = vllm_operands(kind, g, size_k, size_n, group_size, device=b.device)
    a = torch.randn(size_m, size_k, generator=torch.Generator().manual_seed(6)).bfloat16()
    bias_t = torch.randn(size_n, generator=torch.Generator().manual_seed(7)).bfloat16() if bias \
        else None
    out = gemm(a.to(b.device), o,
               b_bias=None if bias_t is None else V.marlin_permute_bias(bias_t).to(b.device))
    assert_close_to(out, a, w_ref, bias_t)


# ---- gptq_marlin_gemm: arguments -----------------------------------------------------------


@pytest.fixture(scope="module")
def small():
    """(a, operands, reference weight) of a small GPTQ act-order layer."""
    g, w_ref = layer("gptq", 256, 128, 64, True, torch.float16)
    a = torch.randn(6, 256, generator=torch.Generator().manual_seed(8)).half()
    return a, vllm_operands("gptq", g, 256, 128, 64), w_ref


def test_output_written_into_c(small):
    a, o, _ = small
    c = torch.full((6, 128), float("nan"), dtype=torch.float16)
    out = gemm(a, o, c=c)
    assert out is c
    assert torch.equal(c, gemm(a, o))


def test_activations_with_leading_dims(small):
    a, o, w_ref = small
    a3 = a.reshape(2, 3, 256)
    out = V.gptq_marlin_gemm(a3, None, o["b_q_weight"], None, o["b_scales"], None, None,
                             o["b_zeros"], o["g_idx"], o["perm"],
                             V.marlin_make_workspace_new("cpu"), o["b_q_type"], 6, 128, 256)
    assert out.shape == (2, 3, 128)
    assert torch.equal(out.reshape(6, 128), gemm(a, o))


@pytest.mark.parametrize("flags", [dict(use_atomic_add=True), dict(use_fp32_reduce=False),
                                   dict(use_atomic_add=True, use_fp32_reduce=False)])
def test_reduction_flags_are_no_ops(small, flags):
    a, o, _ = small
    assert torch.equal(gemm(a, o, **flags), gemm(a, o))


class VllmLikeScalarType:
    """A stand-in with the attributes of vLLM's ScalarType (not imported: no vLLM here)."""

    def __init__(self, exponent, mantissa, signed, bias, name):
        self.exponent, self.mantissa, self.signed, self.bias, self.name = (
            exponent, mantissa, signed, bias, name)

    @property
    def size_bits(self):
        return self.exponent + self.mantissa + self.signed

    def __str__(self):
        return self.name


def test_vllm_scalar_type_objects_are_read_by_attributes(small):
    a, o, _ = small
    o = dict(o, b_q_type=VllmLikeScalarType(0, 4, False, 8, "uint4b8"))
    assert torch.equal(gemm(a, o), gemm(a, dict(o, b_q_type=V.scalar_types.uint4b8)))
    assert str(V.scalar_types.uint4b8) == "uint4b8" and str(V.scalar_types.uint4) == "uint4"


def _call(small_, **changes):
    a, o, _ = small_
    args = dict(a=a, c=None, b_q_weight=o["b_q_weight"], b_bias=None, b_scales=o["b_scales"],
                a_scales=None, global_scale=None, b_zeros=o["b_zeros"], g_idx=o["g_idx"],
                perm=o["perm"], workspace=V.marlin_make_workspace_new("cpu"),
                b_q_type=o["b_q_type"], size_m=6, size_n=128, size_k=256)
    args.update(changes)
    return V.gptq_marlin_gemm(**args)


GEMM_ERRORS = {
    "a_scales": (dict(a_scales=torch.ones(6)), NotImplementedError,
                 r"a_scales = a torch.float32 tensor of shape \[6\] is not "
                 r"supported \(int8/fp8 activations"),
    "global_scale": (dict(global_scale=torch.ones(1)), NotImplementedError,
                     r"global_scale = a torch.float32 tensor of shape \[1\] is not supported"),
    "is_zp_float": (dict(is_zp_float=True), NotImplementedError,
                    r"is_zp_float = True is not supported \(float zero points"),
    "uint8b128": (dict(b_q_type=VllmLikeScalarType(0, 8, False, 128, "uint8b128")),
                  NotImplementedError,
                  r"b_q_type must be uint4b8 \(GPTQ\) or uint4 \(AWQ, with b_zeros\), got "
                  r"uint8b128 \(8 bits, bias 128\)"),
    "float4": (dict(b_q_type=VllmLikeScalarType(2, 1, True, 0, "float4_e2m1f")),
               NotImplementedError, r"got float4_e2m1f \(4 bits, bias 0, floating point, signed\)"),
    "not_a_type": (dict(b_q_type=4), TypeError, r"b_q_type must be a ScalarType .* got 4"),
    "uint4b8_with_zeros": (dict(b_zeros=torch.zeros(4, 16, dtype=torch.int32)), ValueError,
                           r"b_q_type = uint4b8 has no zero points .* b_zeros must be None or "
                           r"empty, got a torch.int32 tensor of shape \[4, 16\]"),
    "uint4_without_zeros": (dict(b_q_type=V.scalar_types.uint4), ValueError,
                            r"b_q_type = uint4 needs zero points: b_zeros must be the int32 "
                            r"\[G, N/8\] Marlin zero points, got a torch.int32 tensor of shape "
                            r"\[0\]"),
    "a_float32": (dict(a=torch.zeros(6, 256)), TypeError,
                  r"a has dtype torch.float32 but b_scales has dtype torch.float16; .* cast the "
                  r"activations: a.to\(torch.float16\)"),
    "a_bfloat16": (dict(a=torch.zeros(6, 256, dtype=torch.bfloat16)), TypeError,
                   r"cast the activations: a.to\(torch.float16\), or convert the scales once: "
                   r"b_scales.to\(torch.bfloat16\)"),
    "c_shape": (dict(c=torch.empty(6, 64, dtype=torch.float16)), ValueError,
                r"c must be None or the output, torch.float16 of shape \[6, 128\] on cpu, got "
                r"torch.float16 of shape \[6, 64\]"),
    "c_dtype": (dict(c=torch.empty(6, 128)), ValueError, r"got torch.float32 of shape \[6, 128\]"),
    "bias_shape": (dict(b_bias=torch.zeros(64, dtype=torch.float16)), ValueError,
                   r"b_bias must have shape \[size_n\] = \[128\] \(Marlin column order\), got "
                   r"\[64\]"),
    "size_m_rows": (dict(a=torch.zeros(2, 3, 256, dtype=torch.float16), size_m=5), ValueError,
                    r"size_m = 5, but a of shape \[2, 3, 256\] has 6 rows"),
}


@pytest.mark.parametrize("name", list(GEMM_ERRORS))
def test_gptq_marlin_gemm_rejects(small, name):
    changes, exc, message = GEMM_ERRORS[name]
    _call(small)  # the unchanged call is valid
    with pytest.raises(exc, match=r"gptq_marlin_gemm: .*" + message):
        _call(small, **changes)


def test_vllm_positional_call_to_our_op_fails_clearly(small):
    """The 19-argument vLLM call goes to w4kernels.vllm; the op itself (14 arguments, another
    order) rejects it instead of computing something else."""
    a, o, _ = small
    with pytest.raises(RuntimeError, match=r"w4a16_gemm\(\) expected at most 14 argument\(s\) "
                                           r"but received 15"):
        torch.ops.w4kernels.w4a16_gemm(a, None, o["b_q_weight"], None, o["b_scales"], None, None,
                                       o["b_zeros"], o["g_idx"], o["perm"],
                                       V.marlin_make_workspace_new("cpu"), 4, 6, 128, 256)


# ---- repacks ----------------------------------------------------------------------------------


NK = [(4, 8), (7, 5), (13, 11)]


@pytest.mark.parametrize("n_chunk", [64, 256])
@pytest.mark.parametrize("nk", NK, ids=[f"n{n}k{k}" for n, k in NK])
@pytest.mark.parametrize("act_order", [False, True], ids=["noact", "act"])
def test_gptq_marlin_repack(act_order, nk, n_chunk):
    size_n, size_k = nk[0] * n_chunk, nk[1] * 128
    gen = torch.Generator().manual_seed(size_k + size_n)
    q = torch.randint(0, 16, (size_k, size_n), dtype=torch.int32, generator=gen)
    perm = torch.randperm(size_k, generator=gen).int() if act_order else V.marlin_make_empty_g_idx(
        "cpu")
    out = V.gptq_marlin_repack(reference.pack_rows(q), perm, size_k, size_n, 4)
    assert torch.equal(out, reference.marlin_pack(q[perm.long()] if act_order else q))


@pytest.mark.parametrize("n_chunk", [64, 256])
@pytest.mark.parametrize("nk", NK, ids=[f"n{n}k{k}" for n, k in NK])
def test_awq_marlin_repack(nk, n_chunk):
    size_n, size_k = nk[0] * n_chunk, nk[1] * 128
    q = torch.randint(0, 16, (size_k, size_n), dtype=torch.int32,
                      generator=torch.Generator().manual_seed(size_k))
    out = V.awq_marlin_repack(reference.awq_pack(q), size_k, size_n, 4)
    assert torch.equal(out, reference.marlin_pack(q))


@pytest.mark.parametrize("backend", ["simt", "cuda"])
def test_repacks_kernel_backends(monkeypatch, backend):
    b = backend_or_skip(backend, "marlin_repack")
    q = torch.randint(0, 16, (256, 128), dtype=torch.int32,
                      generator=torch.Generator().manual_seed(9))
    perm = torch.randperm(256, generator=torch.Generator().manual_seed(9)).int()
    expected = (reference.marlin_pack(q[perm.long()]), reference.marlin_pack(q))
    monkeypatch.setattr(V, "_OPS", getattr(torch.ops, b.namespace))
    d = b.device
    assert torch.equal(V.gptq_marlin_repack(reference.pack_rows(q).to(d), perm.to(d), 256, 128,
                                            4).cpu(), expected[0])
    assert torch.equal(V.awq_marlin_repack(reference.awq_pack(q).to(d), 256, 128, 4).cpu(),
                       expected[1])


REPACK_ERRORS = [
    (lambda: V.gptq_marlin_repack(torch.zeros(16, 64, dtype=torch.int32), None, 128, 64, 8),
     r"gptq_marlin_repack: num_bits = 8 is not supported \(only 4-bit weights\)"),
    (lambda: V.gptq_marlin_repack(torch.zeros(16, 64, dtype=torch.int32), None, 128, 64, 4, True),
     r"gptq_marlin_repack: is_a_8bit = True is not supported"),
    (lambda: V.awq_marlin_repack(torch.zeros(128, 8, dtype=torch.int32), 128, 64, 8),
     r"awq_marlin_repack: num_bits = 8 is not supported"),
    (lambda: V.awq_marlin_repack(torch.zeros(128, 8, dtype=torch.int32), 128, 64, 4, True),
     r"awq_marlin_repack: is_a_8bit = True is not supported"),
    (lambda: V.marlin_permute_scales(torch.ones(2, 64), 128, 64, 64, True),
     r"marlin_permute_scales: is_a_8bit = True is not supported"),
    (lambda: V.marlin_zero_points(torch.zeros(2, 64, dtype=torch.int32), 2, 64, 8),
     r"marlin_zero_points: num_bits = 8 is not supported"),
    (lambda: V.awq_to_marlin_zero_points(torch.zeros(2, 8, dtype=torch.int32), 2, 64, 4, True),
     r"awq_to_marlin_zero_points: is_a_8bit = True is not supported"),
]


@pytest.mark.parametrize("call,message", REPACK_ERRORS)
def test_unsupported_layouts_rejected(call, message):
    with pytest.raises(NotImplementedError, match=message):
        call()


# ---- AWQ ------------------------------------------------------------------------------------


def _awq_random(size_k, size_n, group_size, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    groups = 1 if group_size == -1 else size_k // group_size
    qweight = torch.randint(0, 2**31 - 1, (size_k, size_n // 8), dtype=torch.int32, generator=gen)
    qzeros = torch.randint(0, 2**31 - 1, (groups, size_n // 8), dtype=torch.int32, generator=gen)
    scales = torch.rand(groups, size_n, generator=gen).to(dtype)
    return qweight, scales, qzeros


@pytest.mark.parametrize("group_size", [-1, 32, 64, 128])
@pytest.mark.parametrize("qweight_cols", [16, 448])
@pytest.mark.parametrize("qweight_rows", [128, 1024])
def test_awq_dequantize(qweight_rows, qweight_cols, group_size):
    """vLLM's call: awq_dequantize(qweight, scales, zeros, 0, 0, 0); bit-exact."""
    qweight, scales, qzeros = _awq_random(qweight_rows, qweight_cols * 8, group_size,
                                          torch.float16, qweight_rows + qweight_cols)
    out = V.awq_dequantize(qweight, scales, qzeros, 0, 0, 0)
    assert torch.equal(out, reference.awq_dequantize(qweight, scales, qzeros))


@pytest.mark.parametrize("split_k_iters", [1, 8])
@pytest.mark.parametrize("group_size", [-1, 32, 64, 128])
@pytest.mark.parametrize("size_n", [16, 24, 32])
@pytest.mark.parametrize("size_m", [1, 2, 4, 8, 14, 17, 23, 32])
def test_awq_gemm(size_m, size_n, group_size, split_k_iters):
    """vLLM's call: awq_gemm(input, qweight, scales, qzeros, split_k_iters), K = 128."""
    qweight, scales, qzeros = _awq_random(128, size_n, group_size, torch.float16, size_m)
    x = torch.rand(size_m, 128, generator=torch.Generator().manual_seed(size_n)).half()
    out = V.awq_gemm(x, qweight, scales, qzeros, split_k_iters)
    w = reference.awq_dequantize(qweight, scales, qzeros).double()
    assert out.shape == (size_m, size_n)
    assert_close_to(out, x, w)


@pytest.mark.parametrize("backend", ["simt", "cuda"])
def test_awq_kernel_backends(monkeypatch, backend):
    b = backend_or_skip(backend, "awq_gemm")
    qweight, scales, qzeros = _awq_random(256, 64, 64, torch.bfloat16, 10)
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(11)).bfloat16()
    monkeypatch.setattr(V, "_OPS", getattr(torch.ops, b.namespace))
    d = lambda t: t.to(b.device)  # noqa: E731
    w = V.awq_dequantize(d(qweight), d(scales), d(qzeros), 0, 0, 0).cpu()
    assert torch.equal(w, reference.awq_dequantize(qweight, scales, qzeros))
    assert_close_to(V.awq_gemm(d(x), d(qweight), d(scales), d(qzeros), 8), x, w.double())


def test_awq_gemm_keywords_and_leading_dims():
    qweight, scales, qzeros = _awq_random(128, 64, 32, torch.float16, 12)
    x = torch.randn(2, 3, 128, generator=torch.Generator().manual_seed(12)).half()
    out = V.awq_gemm(input=x, qweight=qweight, scales=scales, qzeros=qzeros, split_k_iters=8)
    assert out.shape == (2, 3, 64)
    assert torch.equal(out.reshape(6, 64), V.awq_gemm(x.reshape(6, 128), qweight, scales,
                                                      qzeros, 8))


def test_awq_zero_points_and_scales_swapped():
    """The trap: older vLLM named awq_gemm's parameters (input, qweight, qzeros, scales) while
    passing scales third. Our names follow the positional behaviour; a swapped call is an
    error, not a product of zero points and scales."""
    qweight, scales, qzeros = _awq_random(128, 64, 32, torch.float16, 13)
    x = torch.randn(2, 128).half()
    with pytest.raises(TypeError, match=r"awq_gemm: scales \(3rd argument\) is int32 and qzeros "
                                        r"\(4th\) is torch.float16: they are swapped"):
        V.awq_gemm(x, qweight, qzeros, scales, 8)
    with pytest.raises(TypeError, match=r"awq_dequantize: scales \(3rd argument\) is int32 and "
                                        r"zeros \(4th\) is torch.float16: they are swapped"):
        V.awq_dequantize(qweight, qzeros, scales, 0, 0, 0)


def test_awq_gemm_dtype_mismatch_names_the_cast():
    qweight, scales, qzeros = _awq_random(128, 64, 32, torch.bfloat16, 14)
    with pytest.raises(TypeError, match=r"awq_gemm: input has dtype torch.float32 but scales has "
                                        r"dtype torch.bfloat16; .* input.to\(torch.bfloat16\)"):
        V.awq_gemm(torch.zeros(2, 128), qweight, scales, qzeros, 8)


# ---- helpers ----------------------------------------------------------------------------------


def test_workspace_cpu():
    ws = V.marlin_make_workspace_new(torch.device("cpu"), 2)
    assert ws.dtype == torch.int32 and not ws.requires_grad
    assert ws.shape == (2 * (os.cpu_count() or 1),) and not bool(ws.any())


def test_workspace_cuda():
    if not torch.cuda.is_available():
        pytest.skip("cuda: no GPU on this machine")
    ws = V.marlin_make_workspace_new(torch.device("cuda"))
    assert ws.shape == (torch.cuda.get_device_properties(0).multi_processor_count,)


def test_helpers_match_the_reference_layouts():
    gen = torch.Generator().manual_seed(15)
    s = torch.rand(4, 128, generator=gen).half()
    assert torch.equal(V.marlin_permute_scales(s, 256, 128, 64),
                       reference.marlin_permute_scales(s, 256, 128, 64))
    z = torch.randint(0, 16, (4, 128), dtype=torch.int32, generator=gen)
    assert torch.equal(V.marlin_zero_points(z, 4, 128, 4), reference.marlin_zero_points(z, 4, 128))
    assert torch.equal(V.awq_to_marlin_zero_points(reference.awq_pack(z), 4, 128, 4),
                       reference.marlin_zero_points(z, 4, 128))
    bias = torch.arange(64.0)
    assert torch.equal(V._marlin_unpermute_bias(V.marlin_permute_bias(bias)), bias)
    assert not torch.equal(V.marlin_permute_bias(bias), bias)
    g_idx = torch.tensor([2, 0, 1, 0, 2, 1], dtype=torch.int32)
    sorted_g, perm = V.marlin_sort_g_idx(g_idx)
    assert perm.dtype == torch.int32 and torch.equal(g_idx[perm.long()], sorted_g)
    assert bool((sorted_g[1:] >= sorted_g[:-1]).all())


# ---- signatures -------------------------------------------------------------------------------

R = inspect.Parameter.empty  # "required"

# Read from vLLM (module docstring of w4kernels.vllm for the commits): name -> [(param, default)].
VLLM_SIGNATURES = {
    "gptq_marlin_gemm": [("a", R), ("c", R), ("b_q_weight", R), ("b_bias", R), ("b_scales", R),
                         ("a_scales", R), ("global_scale", R), ("b_zeros", R), ("g_idx", R),
                         ("perm", R), ("workspace", R), ("b_q_type", R), ("size_m", R),
                         ("size_n", R), ("size_k", R), ("is_k_full", True),
                         ("use_atomic_add", False), ("use_fp32_reduce", False),
                         ("is_zp_float", False)],
    "gptq_marlin_repack": [("b_q_weight", R), ("perm", R), ("size_k", R), ("size_n", R),
                           ("num_bits", R), ("is_a_8bit", False)],
    "awq_marlin_repack": [("b_q_weight", R), ("size_k", R), ("size_n", R), ("num_bits", R),
                          ("is_a_8bit", False)],
    "awq_dequantize": [("qweight", R), ("scales", R), ("zeros", R), ("split_k_iters", R),
                       ("thx", R), ("thy", R)],
    "awq_gemm": [("input", R), ("qweight", R), ("scales", R), ("qzeros", R),
                 ("split_k_iters", R)],
    "marlin_make_workspace_new": [("device", R), ("max_blocks_per_sm", 1)],
    "marlin_permute_scales": [("s", R), ("size_k", R), ("size_n", R), ("group_size", R),
                              ("is_a_8bit", False)],
    "marlin_permute_bias": [("s", R)],
    "marlin_zero_points": [("zp", R), ("size_k", R), ("size_n", R), ("num_bits", R),
                           ("is_a_8bit", False)],
    "awq_to_marlin_zero_points": [("q_zp_packed", R), ("size_k", R), ("size_n", R),
                                  ("num_bits", R), ("is_a_8bit", False)],
    "marlin_make_empty_g_idx": [("device", R)],
    "marlin_make_empty_zp": [("device", R)],
    "marlin_sort_g_idx": [("g_idx", R)],
}


@pytest.mark.parametrize("name", list(VLLM_SIGNATURES))
def test_signature_is_vllms(name):
    params = inspect.signature(getattr(V, name)).parameters.values()
    assert [(p.name, p.default) for p in params] == VLLM_SIGNATURES[name]
    assert all(p.kind == p.POSITIONAL_OR_KEYWORD for p in params)


@pytest.mark.parametrize("name", ["marlin_repack", "awq_marlin_repack", "w4a16_gemm",
                                  "awq_dequantize", "awq_gemm"])
def test_ops_wrapper_follows_the_schema(name):
    """w4kernels.ops wrappers: the schema's argument names in the schema's order, and exactly
    its defaults."""
    schema = getattr(torch.ops.w4kernels, name).default._schema
    params = list(inspect.signature(getattr(ops, name)).parameters.values())
    assert [p.name for p in params] == [a.name for a in schema.arguments]
    for p, a in zip(params, schema.arguments):
        if a.has_default_value():
            assert p.default == a.default_value, p.name
        else:
            assert p.default is inspect.Parameter.empty, f"{p.name}: the schema has no default"


def test_ops_w4a16_gemm_positional_in_schema_order(small):
    """A call written from the README table (the schema) works through the wrapper."""
    a, o, w_ref = small
    args = (a, o["b_q_weight"], o["b_scales"], None, o["g_idx"], o["perm"],
            ops.marlin_workspace(128), 4, 6, 128, 256, True, None, True)
    assert torch.equal(ops.w4a16_gemm(*args), torch.ops.w4kernels.w4a16_gemm(*args))
    assert_close_to(ops.w4a16_gemm(*args), a, w_ref)


def test_ops_wrappers_leading_dims_and_dtype_errors(small):
    a, o, _ = small
    ws = ops.marlin_workspace(128)
    args = (o["b_q_weight"], o["b_scales"], None, o["g_idx"], o["perm"], ws, 4)
    out = ops.w4a16_gemm(a.reshape(3, 2, 256), *args, 6, 128, 256)
    assert out.shape == (3, 2, 128) and torch.equal(out.reshape(6, 128),
                                                    ops.w4a16_gemm(a, *args, 6, 128, 256))
    with pytest.raises(TypeError, match=r"w4a16_gemm: a has dtype torch.float32 but b_scales has "
                                        r"dtype torch.float16; .* a.to\(torch.float16\)"):
        ops.w4a16_gemm(a.float(), *args, 6, 128, 256)
    qweight, scales, qzeros = _awq_random(128, 64, 32, torch.float16, 16)
    with pytest.raises(TypeError, match=r"awq_gemm: x has dtype torch.float32 but scales has "
                                        r"dtype torch.float16"):
        ops.awq_gemm(torch.zeros(2, 128), qweight, scales, qzeros, 8)
    assert ops.awq_gemm(torch.zeros(4, 1, 128, dtype=torch.float16), qweight, scales, qzeros,
                        8).shape == (4, 1, 64)


def test_package_exports_vllm():
    assert w4kernels.vllm is V
