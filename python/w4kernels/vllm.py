"""vLLM's Python API for the 4-bit ops w4kernels implements: same names, parameters, order,
defaults and return conventions, so ``from w4kernels import vllm as ops`` can stand in for
``from vllm import _custom_ops as ops`` (plus the Marlin helpers vLLM keeps in
``model_executor/layers/quantization/utils/marlin_utils.py``) at the call sites below.

Where the signatures come from (read with the project's search tool on 2026-11-23; the stored
copies of vllm-project/vllm, code not copied):

* ``vllm/_custom_ops.py`` at commit ``7bcae67b5de3f155e70026695285de25d096b801``:
  ``gptq_marlin_gemm``, ``gptq_marlin_repack``, ``awq_marlin_repack``, ``awq_gemm``,
  ``awq_dequantize``.
* ``vllm/model_executor/layers/quantization/utils/marlin_utils.py`` at
  ``007d50058a06dec0f82472d63c819244d460c40d``: ``marlin_make_workspace_new``,
  ``marlin_permute_scales``, ``marlin_permute_bias``, ``marlin_zero_points``,
  ``awq_to_marlin_zero_points``, ``marlin_make_empty_g_idx``, ``marlin_make_empty_zp``,
  ``marlin_sort_g_idx``.
* A later stored ``_custom_ops.py`` (``0002bde560dd9adcabb28b0da32f47d4c020e799``) renames
  ``gptq_marlin_gemm`` to ``marlin_gemm`` without ``g_idx``/``perm``/``is_k_full`` and drops
  ``perm`` from ``gptq_marlin_repack``; that API is not mirrored here.

Functions and what they accept:

* ``gptq_marlin_gemm``: ``b_q_type`` uint4b8 (GPTQ, no ``b_zeros``) or uint4 (AWQ, with
  ``b_zeros``); act-order ``g_idx``/``perm`` and ``is_k_full``; ``b_bias`` Marlin-permuted, as
  vLLM stores it (:func:`marlin_permute_bias`); ``c`` (written and returned). Rejected, naming
  the argument: ``a_scales`` or ``global_scale`` other than None (int8/fp8 activations,
  NVFP4), ``is_zp_float=True`` (float zero points), any other ``b_q_type`` (8-bit, signed,
  float). Accepted as no-ops: ``use_fp32_reduce`` (every backend reduces in fp32) and
  ``use_atomic_add`` (a reduction strategy of vLLM's GPU kernel; ours adds split-K partial
  sums in a fixed order instead, so the flag changes nothing).
* ``gptq_marlin_repack``, ``awq_marlin_repack``: ``num_bits=4``; ``num_bits=8`` and
  ``is_a_8bit=True`` are rejected.
* ``awq_gemm``, ``awq_dequantize``: as vLLM's; scales third, zero points fourth (below).
* helpers: ``marlin_permute_scales``, ``marlin_permute_bias``, ``marlin_zero_points``,
  ``awq_to_marlin_zero_points`` (4 bits; ``is_a_8bit=True`` rejected),
  ``marlin_make_workspace_new``, ``marlin_make_empty_g_idx``, ``marlin_make_empty_zp``,
  ``marlin_sort_g_idx``; ``scalar_types.uint4b8`` / ``uint4``.

Unsupported features raise ``NotImplementedError`` (a ``RuntimeError``), inconsistent arguments
``ValueError``, wrong kinds of objects and dtype mismatches ``TypeError``; every message names
the argument, what is expected and what was passed. The ops' own checks (shapes, layouts) then
report as ``RuntimeError`` with the op's name (``w4a16_gemm``, ``awq_gemm``, ...).

``b_q_type``: vLLM passes a ``vllm.scalar_type.ScalarType``. This module has no dependency on
vLLM: :data:`scalar_types` holds our own ``uint4b8`` and ``uint4``, and any object with vLLM's
ScalarType attributes (``size_bits``, ``bias``, ``exponent``, ``signed``) is read the same way,
so vLLM's ``scalar_types.uint4b8`` works too.

AWQ parameter names: vLLM's ``awq_gemm(input, qweight, scales, qzeros, split_k_iters)`` and
``awq_dequantize(qweight, scales, zeros, split_k_iters, thx, thy)`` take the scales third and
the packed zero points fourth, which is also what vLLM's kernel reads. Older vLLM releases
named the Python parameters ``qzeros, scales`` while passing them through in the kernel's order
(scales third), so positional callers were right and the names were not. We follow the
positional behaviour and use the names that describe it (``scales`` third, ``qzeros``/``zeros``
fourth, as the commit above does); a call that puts the int32 zero points third and the float
scales fourth is reported as swapped rather than computed.

Inputs: like vLLM's, the ops take 2-D activations; these functions also accept ``[..., K]``
(``size_m`` = the product of the leading dimensions) and return ``[..., N]``. Activations and
scales must share one dtype (fp16 or bf16); a mismatch is a ``TypeError`` that says which cast
to apply. Nothing is converted implicitly.

Numerics: grouped weights match vLLM Marlin's structure (each weight rounded once to the
activation dtype, fp32 accumulation). Per-channel (G = 1) we scale the fp32 sum in fp32 where
vLLM rounds the sum to half first (``half(half(acc) * s)``), so per-channel outputs can differ
from vLLM's by about one output ulp (README, "Numerics of w4a16_gemm").
"""

import os
from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from . import ops, reference

# The op namespace every function calls. Tests point it at ``torch.ops.w4kernels_simt`` to run
# the CUDA kernels under the emulator with the same Python code; nothing else should touch it.
_OPS = torch.ops.w4kernels


# ---- scalar types -------------------------------------------------------------------------


@dataclass(frozen=True)
class ScalarType:
    """The part of vLLM's ``ScalarType`` the 4-bit ops read: an integer type of ``size_bits``
    bits whose stored code c means the value ``c - bias``."""

    exponent: int
    mantissa: int
    signed: bool
    bias: int

    @property
    def size_bits(self) -> int:
        return self.exponent + self.mantissa + int(self.signed)

    def is_floating_point(self) -> bool:
        return self.exponent != 0

    def __str__(self) -> str:
        return ("" if self.signed else "u") + f"int{self.size_bits}" + (
            f"b{self.bias}" if self.bias else "")


class scalar_types:  # noqa: N801  (vLLM's name)
    """The weight types :func:`gptq_marlin_gemm` supports, named as vLLM names them."""

    uint4 = ScalarType(0, 4, False, 0)  # AWQ: code 0..15, per-group zero points in b_zeros
    uint4b8 = ScalarType(0, 4, False, 8)  # GPTQ: value = code - 8, no zero points


def _is_symmetric_uint4(op: str, b_q_type) -> bool:
    """True for uint4b8, False for uint4; anything else is an error naming ``b_q_type``."""
    try:
        size_bits, bias = int(b_q_type.size_bits), int(b_q_type.bias)
    except (AttributeError, TypeError, ValueError):
        raise TypeError(f"{op}: b_q_type must be a ScalarType (w4kernels.vllm.scalar_types.uint4b8"
                        f" or .uint4, or vLLM's own), got {b_q_type!r}") from None
    floating = getattr(b_q_type, "exponent", 0) != 0
    signed = bool(getattr(b_q_type, "signed", False))
    if floating or signed or size_bits != 4 or bias not in (0, 8):
        raise NotImplementedError(
            f"{op}: b_q_type must be uint4b8 (GPTQ) or uint4 (AWQ, with b_zeros), got "
            f"{b_q_type} ({size_bits} bits, bias {bias}{', floating point' if floating else ''}"
            f"{', signed' if signed else ''}): w4kernels implements 4-bit integer weights only")
    return bias == 8


# ---- helpers ------------------------------------------------------------------------------


def _present(t: Optional[torch.Tensor]) -> bool:
    """vLLM passes empty tensors for absent optional operands (marlin_make_empty_g_idx)."""
    return t is not None and t.numel() > 0


def _reject(op: str, name: str, value, why: str) -> None:
    raise NotImplementedError(f"{op}: {name} = {value} is not supported ({why})")


def _require_4bit_16bit_activations(op: str, num_bits: int, is_a_8bit: bool) -> None:
    """The Marlin-layout helpers exist for 4-bit weights with fp16/bf16 activations only."""
    if num_bits != 4:
        _reject(op, "num_bits", num_bits, "only 4-bit weights")
    if is_a_8bit:
        _reject(op, "is_a_8bit", is_a_8bit,
                "the 8-bit-activation Marlin layout is not implemented")


def _describe(t: Optional[torch.Tensor]) -> str:
    if t is None:
        return "None"
    return f"a {t.dtype} tensor of shape {list(t.shape)}"


def _check_not_swapped(op: str, scales: torch.Tensor, zeros_name: str,
                       zeros: torch.Tensor) -> None:
    """Catch the zero points and scales passed in the order of old vLLM's parameter names."""
    if scales.dtype == torch.int32 and zeros.is_floating_point():
        raise TypeError(
            f"{op}: scales (3rd argument) is int32 and {zeros_name} (4th) is {zeros.dtype}: they "
            f"are swapped. The kernel reads the float scales third and the packed int32 zero "
            f"points fourth (older vLLM wrappers named these parameters the other way round but "
            f"passed them in this order); call {op}(..., scales, {zeros_name}, ...)")


# ---- GPTQ / AWQ Marlin --------------------------------------------------------------------


def gptq_marlin_repack(b_q_weight: torch.Tensor, perm: torch.Tensor, size_k: int, size_n: int,
                       num_bits: int, is_a_8bit: bool = False) -> torch.Tensor:
    """GPTQ int32 ``[K/8, N]`` (act-order: Marlin row r = GPTQ row ``perm[r]``; an empty
    ``perm`` means none) -> Marlin int32 ``[K/16, 2N]``, byte-identical to vLLM's."""
    _require_4bit_16bit_activations("gptq_marlin_repack", num_bits, is_a_8bit)
    return _OPS.marlin_repack(b_q_weight, perm, size_k, size_n, num_bits)


def awq_marlin_repack(b_q_weight: torch.Tensor, size_k: int, size_n: int, num_bits: int,
                      is_a_8bit: bool = False) -> torch.Tensor:
    """AutoAWQ int32 ``[K, N/8]`` -> Marlin int32 ``[K/16, 2N]``, byte-identical to vLLM's."""
    _require_4bit_16bit_activations("awq_marlin_repack", num_bits, is_a_8bit)
    return _OPS.awq_marlin_repack(b_q_weight, size_k, size_n, num_bits)


def gptq_marlin_gemm(a: torch.Tensor, c: Optional[torch.Tensor], b_q_weight: torch.Tensor,
                     b_bias: Optional[torch.Tensor], b_scales: torch.Tensor,
                     a_scales: Optional[torch.Tensor], global_scale: Optional[torch.Tensor],
                     b_zeros: Optional[torch.Tensor], g_idx: Optional[torch.Tensor],
                     perm: Optional[torch.Tensor], workspace: torch.Tensor, b_q_type,
                     size_m: int, size_n: int, size_k: int, is_k_full: bool = True,
                     use_atomic_add: bool = False, use_fp32_reduce: bool = False,
                     is_zp_float: bool = False) -> torch.Tensor:
    """``a @ W (+ b_bias)`` for a Marlin int4 weight, vLLM's ``gptq_marlin_gemm``.

    Computed by :func:`w4kernels.ops.w4a16_gemm` (formula and numerics there). Arguments as
    vLLM's: ``a`` fp16/bf16 ``[M, K]`` (or ``[..., K]``); ``c`` None or the output tensor to
    write (shape ``[M, N]``, ``a``'s dtype and device), which is then returned; ``b_bias``
    ``[N]`` in Marlin's per-channel column order (vLLM permutes layer biases with
    :func:`marlin_permute_bias` when it loads them); ``b_scales`` from
    :func:`marlin_permute_scales`; ``b_zeros`` from :func:`marlin_zero_points` /
    :func:`awq_to_marlin_zero_points` for ``uint4``, None or empty for ``uint4b8``; ``g_idx`` and
    ``perm`` both None/empty, or the sorted group index and the act-order permutation;
    ``workspace`` from :func:`marlin_make_workspace_new`. See the module docstring for the
    arguments that are rejected or accepted as no-ops.
    """
    op = "gptq_marlin_gemm"
    symmetric = _is_symmetric_uint4(op, b_q_type)
    if a_scales is not None:
        _reject(op, "a_scales", _describe(a_scales),
                "int8/fp8 activations; pass fp16 or bf16 activations and a_scales=None")
    if global_scale is not None:
        _reject(op, "global_scale", _describe(global_scale),
                "NVFP4 weights; pass global_scale=None")
    if is_zp_float:
        _reject(op, "is_zp_float", is_zp_float,
                "float zero points; b_zeros must hold packed integer zero points")
    if symmetric and _present(b_zeros):
        raise ValueError(f"{op}: b_q_type = {b_q_type} has no zero points (value = code - 8), "
                         f"so b_zeros must be None or empty, got {_describe(b_zeros)}; use "
                         f"scalar_types.uint4 for zero-point (AWQ) weights")
    if not symmetric and not _present(b_zeros):
        raise ValueError(f"{op}: b_q_type = {b_q_type} needs zero points: b_zeros must be the "
                         f"int32 [G, N/8] Marlin zero points, got {_describe(b_zeros)}; use "
                         f"scalar_types.uint4b8 for symmetric (GPTQ) weights")
    ops._check_activation_dtype(op, "a", a, "b_scales", b_scales)
    a2, lead = ops._flatten_rows(op, "a", a)
    if a.dim() != 2 and a2.shape[0] != size_m:
        raise ValueError(f"{op}: size_m = {size_m}, but a of shape {list(a.shape)} has "
                         f"{a2.shape[0]} rows (the product of its leading dimensions)")
    out_shape = (size_m, size_n) if lead is None else (*lead, size_n)
    if c is not None and (tuple(c.shape) != tuple(out_shape) or c.dtype != a.dtype
                          or c.device != a.device):
        raise ValueError(f"{op}: c must be None or the output, {a.dtype} of shape "
                         f"{list(out_shape)} on {a.device}, got {c.dtype} of shape "
                         f"{list(c.shape)} on {c.device}")
    bias = None
    if _present(b_bias):
        if b_bias.dim() != 1 or b_bias.shape[0] != size_n:
            raise ValueError(f"{op}: b_bias must have shape [size_n] = [{size_n}] (Marlin "
                             f"column order), got {list(b_bias.shape)}")
        bias = _marlin_unpermute_bias(b_bias)
    out = _OPS.w4a16_gemm(a2, b_q_weight, b_scales, b_zeros if _present(b_zeros) else None,
                          g_idx, perm, workspace, 4, size_m, size_n, size_k, is_k_full, bias,
                          True)
    if lead is not None:
        out = out.reshape(out_shape)
    if c is None:
        return out
    return c.copy_(out)


# ---- AWQ ----------------------------------------------------------------------------------


def awq_dequantize(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                   split_k_iters: int, thx: int, thy: int) -> torch.Tensor:
    """AutoAWQ weight -> ``(q - z) * s`` as ``[K, N]`` in ``scales``' dtype (vLLM's
    ``awq_dequantize``). ``zeros`` are the packed int32 zero points ``[G, N/8]``;
    ``split_k_iters``, ``thx``, ``thy`` pick vLLM's launch shape and do not change the result
    (0 = automatic)."""
    _check_not_swapped("awq_dequantize", scales, "zeros", zeros)
    return _OPS.awq_dequantize(qweight, scales, zeros, split_k_iters, thx, thy)


def awq_gemm(input: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,  # noqa: A002
             qzeros: torch.Tensor, split_k_iters: int) -> torch.Tensor:
    """``input @ awq_dequantize(qweight, scales, qzeros)``, vLLM's ``awq_gemm``.

    ``input`` fp16/bf16 ``[M, K]`` (or ``[..., K]``) in ``scales``' dtype; scales third, packed
    zero points fourth (module docstring); ``split_k_iters`` 1..32. Returns ``[M, N]``
    (``[..., N]``) in ``input``'s dtype.
    """
    _check_not_swapped("awq_gemm", scales, "qzeros", qzeros)
    ops._check_activation_dtype("awq_gemm", "input", input, "scales", scales)
    x2, lead = ops._flatten_rows("awq_gemm", "input", input)
    out = _OPS.awq_gemm(x2, qweight, scales, qzeros, split_k_iters)
    return out if lead is None else out.reshape(*lead, out.shape[-1])


# ---- Marlin helpers (vLLM: quantization/utils/marlin_utils.py) -----------------------------


def marlin_make_workspace_new(device: torch.device, max_blocks_per_sm: int = 1) -> torch.Tensor:
    """Zeroed int32 workspace of ``max_blocks_per_sm`` ints per SM of a CUDA ``device``, as
    vLLM's. Our kernel needs only >= 1 zeroed int (README, "Split-K without waiting"), so any
    size works. On other devices (CPU, meta) there are no SMs: one int per CPU core
    (``os.cpu_count()``) times ``max_blocks_per_sm``; the host backends only check it is zero."""
    device = torch.device(device)
    if device.type == "cuda":
        units = torch.cuda.get_device_properties(device).multi_processor_count
    else:
        units = os.cpu_count() or 1
    return torch.zeros(units * max_blocks_per_sm, dtype=torch.int32, device=device,
                       requires_grad=False)


def marlin_make_empty_g_idx(device: torch.device) -> torch.Tensor:
    """An empty int32 parameter: "no act-order" for ``g_idx`` and ``perm``."""
    return torch.nn.Parameter(torch.empty(0, dtype=torch.int32, device=device),
                              requires_grad=False)


def marlin_make_empty_zp(device: torch.device) -> torch.Tensor:
    """An empty int32 parameter: "no zero points" for ``b_zeros``."""
    return torch.nn.Parameter(torch.empty(0, dtype=torch.int32, device=device),
                              requires_grad=False)


def marlin_sort_g_idx(g_idx: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(``g_idx`` sorted, the int32 permutation that sorts it): the ``g_idx`` and ``perm`` of
    an act-order layer. Any permutation that sorts ``g_idx`` is valid; this one is stable."""
    perm = torch.argsort(g_idx, stable=True).to(torch.int32)
    return g_idx[perm.long()], perm


def marlin_permute_scales(s: torch.Tensor, size_k: int, size_n: int, group_size: int,
                          is_a_8bit: bool = False) -> torch.Tensor:
    """Scales ``[G, N]`` -> Marlin order (per 64 columns when grouped, per 32 per-channel)."""
    if is_a_8bit:
        _reject("marlin_permute_scales", "is_a_8bit", is_a_8bit,
                "the 8-bit-activation Marlin layout is not implemented")
    return reference.marlin_permute_scales(s, size_k, size_n, group_size)


def marlin_permute_bias(s: torch.Tensor) -> torch.Tensor:
    """Bias ``[N]`` -> the Marlin per-channel column order :func:`gptq_marlin_gemm` reads."""
    _, single = reference.marlin_scale_perms()
    return s.reshape(-1, len(single))[:, single].reshape(s.shape).contiguous()


def _marlin_unpermute_bias(s: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`marlin_permute_bias`: our op takes the bias in natural order."""
    _, single = reference.marlin_scale_perms()
    out = torch.empty_like(s.reshape(-1, len(single)))
    out[:, single] = s.reshape(-1, len(single))
    return out.reshape(s.shape)


def marlin_zero_points(zp: torch.Tensor, size_k: int, size_n: int, num_bits: int,
                       is_a_8bit: bool = False) -> torch.Tensor:
    """Zero points ``[G, N]`` (0..15) -> Marlin int32 ``[G, N/8]``; ``size_k`` is G, as in
    vLLM's callers."""
    _require_4bit_16bit_activations("marlin_zero_points", num_bits, is_a_8bit)
    return reference.marlin_zero_points(zp, size_k, size_n, num_bits)


def awq_to_marlin_zero_points(q_zp_packed: torch.Tensor, size_k: int, size_n: int,
                              num_bits: int, is_a_8bit: bool = False) -> torch.Tensor:
    """AutoAWQ ``qzeros`` int32 ``[G, N/8]`` -> Marlin zero points ``[G, N/8]`` (``size_k``
    is G)."""
    _require_4bit_16bit_activations("awq_to_marlin_zero_points", num_bits, is_a_8bit)
    return reference.awq_to_marlin_zero_points(q_zp_packed, size_k, size_n, num_bits)


__all__ = [
    "ScalarType", "scalar_types", "gptq_marlin_gemm", "gptq_marlin_repack", "awq_marlin_repack",
    "awq_gemm", "awq_dequantize", "marlin_make_workspace_new", "marlin_make_empty_g_idx",
    "marlin_make_empty_zp", "marlin_sort_g_idx", "marlin_permute_scales", "marlin_permute_bias",
    "marlin_zero_points", "awq_to_marlin_zero_points",
]
