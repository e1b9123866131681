"""Typed wrappers of every ``torch.ops.w4kernels`` operator, and their fake implementations.

Notation used in the docstrings: K = ``size_k`` (the reduction dimension, the Linear layer's
``in_features``), N = ``size_n`` (``out_features``), M = number of activation rows, G = number of
quantization groups (1 for per-channel, else K / group_size). The layouts themselves are given,
as formulas, in :mod:`w4kernels.reference`.

The fakes (``torch.library.register_fake``) compute output shapes and dtypes only; they let the
ops run under ``torch.compile(fullgraph=True)`` and ``FakeTensorMode``. They are registered for
both the product namespace ``w4kernels`` and the emulator namespace ``w4kernels_simt``, whose
schemas are identical.
"""

from typing import Optional

import torch

_NAMESPACES = ("w4kernels", "w4kernels_simt")


def _register_fake(name):
    """Register one fake for ``<ns>::name`` in every namespace that defines the op."""

    def wrap(fn):
        for ns in _NAMESPACES:
            if hasattr(torch.ops, ns) and hasattr(getattr(torch.ops, ns), name):
                torch.library.register_fake(f"{ns}::{name}")(fn)
        return fn

    return wrap


def _check_same_device(op: str, **tensors) -> None:
    """Fakes run for meta tensors, and for any mix of devices that includes one: reject a mix
    instead of returning a tensor on an arbitrary device."""
    present = {k: t.device for k, t in tensors.items() if t is not None}
    if len(set(present.values())) > 1:
        listing = ", ".join(f"{k} on {d}" for k, d in present.items())
        raise RuntimeError(f"{op}: all tensors must be on the same device, got {listing}")


# ---- Marlin -------------------------------------------------------------------------------


def marlin_repack(b_q_weight: torch.Tensor, perm: Optional[torch.Tensor], size_k: int,
                  size_n: int, num_bits: int = 4) -> torch.Tensor:
    """GPTQ-packed weight to the Marlin layout (vLLM ``gptq_marlin_repack``, byte-identical).

    Args:
        b_q_weight: int32 ``[K/8, N]``, GPTQ packing along K: element (k, n) is nibble ``k % 8``
            of word ``[k/8, n]`` (uint4 code, value = code - 8 for symmetric GPTQ).
        perm: int32 ``[K]`` or None/empty. Act-order: Marlin row r takes GPTQ row ``perm[r]``
            (``perm = argsort(g_idx)``).
        size_k: K, a multiple of 16. size_n: N, a multiple of 64.
        num_bits: 4.

    Returns:
        int32 ``[K/16, 2N]`` in the Marlin layout (see :func:`reference.marlin_repack`).
    """
    return torch.ops.w4kernels.marlin_repack(b_q_weight, perm, size_k, size_n, num_bits)


@_register_fake("marlin_repack")
def _marlin_repack_fake(b_q_weight, perm, size_k, size_n, num_bits):
    _check_same_device("marlin_repack", b_q_weight=b_q_weight, perm=perm)
    return b_q_weight.new_empty((size_k // 16, size_n * 16 // 8))


def awq_marlin_repack(b_q_weight: torch.Tensor, size_k: int, size_n: int,
                      num_bits: int = 4) -> torch.Tensor:
    """AWQ-packed weight to the Marlin layout (vLLM ``awq_marlin_repack``, byte-identical).

    Args:
        b_q_weight: int32 ``[K, N/8]``, AutoAWQ packing along N: column ``8c + j`` is nibble
            ``[0, 4, 1, 5, 2, 6, 3, 7][j]`` of word ``[k, c]``.
        size_k: K, a multiple of 16. size_n: N, a multiple of 64.
        num_bits: 4.

    Returns:
        int32 ``[K/16, 2N]`` in the Marlin layout.
    """
    return torch.ops.w4kernels.awq_marlin_repack(b_q_weight, size_k, size_n, num_bits)


@_register_fake("awq_marlin_repack")
def _awq_marlin_repack_fake(b_q_weight, size_k, size_n, num_bits):
    return b_q_weight.new_empty((size_k // 16, size_n * 16 // 8))


def w4a16_gemm(a: torch.Tensor, b_q_weight: torch.Tensor, b_scales: torch.Tensor,
               b_zeros: Optional[torch.Tensor], g_idx: Optional[torch.Tensor],
               perm: Optional[torch.Tensor], workspace: torch.Tensor, size_m: int, size_n: int,
               size_k: int, is_k_full: bool = True, b_bias: Optional[torch.Tensor] = None,
               use_fp32_reduce: bool = True, num_bits: int = 4) -> torch.Tensor:
    """fp16/bf16 activations times a Marlin int4 weight (vLLM ``gptq_marlin_gemm`` semantics).

    ``out[m, n] = sum_r a[m, perm[r]] * w[r, n] (+ b_bias[n])``, where the weight row r of the
    Marlin layout holds activation column ``perm[r]`` (act-order) or r, and
    ``w[r, n] = (q[r, n] - z) * s`` rounded once to ``a``'s dtype (as Marlin dequantizes to
    fp16/bf16 before its fp32-accumulating mma) with ``q`` the uint4 code,
    ``s = b_scales[g(r), n]``, ``z = 8`` (GPTQ, symmetric) or the unpacked Marlin zero point
    ``b_zeros[g(r), n]`` (AWQ), and ``g(r) = g_idx[r]`` (act-order) or ``r // group_size``
    (``group_size = K / G``). The products are accumulated in fp32, the bias is added in fp32,
    and the result is rounded once to ``a``'s dtype. (vLLM's GPU kernel applies per-channel
    (G = 1) scales after the accumulation instead, ``half(half(acc) * s)``; the two differ by
    about an ulp of the output.)

    None and empty tensors both mean "absent" for ``b_zeros``, ``g_idx``, ``perm`` and
    ``b_bias``; ``g_idx`` and ``perm`` come together. M = 0 gives an empty ``[0, N]`` result.

    Args:
        a: float16 or bfloat16 ``[M, K]``, unit stride along K (row stride may exceed K).
            Every other tensor must be contiguous.
        b_q_weight: int32 ``[K/16, 2N]``, Marlin layout (:func:`marlin_repack`).
        b_scales: same dtype as ``a``, ``[G, N]``, permuted with
            :func:`w4kernels.quant.marlin_permute_scales`. G = 1 means per-channel.
        b_zeros: int32 ``[G, N/8]`` Marlin zero points (:func:`quant.marlin_zero_points`), or
            None for symmetric weights (zero point 8).
        g_idx: int32 ``[K]`` group of each Marlin row, *sorted* (``g_idx[perm]``), or None.
        perm: int32 ``[K]`` act-order permutation (``argsort`` of the GPTQ g_idx), or None.
        workspace: int32, at least ``N / 64 * 16`` elements, zero-filled (GPU lock array;
            checked but not used by the CPU kernel).
        size_m, size_n, size_k: M, N, K. K is the local K of this shard.
        is_k_full: False when this is a row-parallel shard of an act-order layer: ``b_scales``
            then holds every group of the full layer and ``g_idx`` indexes it directly. With
            act-order and ``is_k_full``, G must divide K (without act-order it always must).
        b_bias: optional ``[N]`` bias in ``a``'s dtype.
        use_fp32_reduce: accumulate split-K partial sums in fp32 (always true on CPU).
        num_bits: 4.

    Returns:
        ``[M, N]`` in ``a``'s dtype.
    """
    return torch.ops.w4kernels.w4a16_gemm(a, b_q_weight, b_scales, b_zeros, g_idx, perm,
                                          workspace, num_bits, size_m, size_n, size_k, is_k_full,
                                          b_bias, use_fp32_reduce)


@_register_fake("w4a16_gemm")
def _w4a16_gemm_fake(a, b_q_weight, b_scales, b_zeros, g_idx, perm, workspace, num_bits, size_m,
                     size_n, size_k, is_k_full, b_bias=None, use_fp32_reduce=True):
    _check_same_device("w4a16_gemm", a=a, b_q_weight=b_q_weight, b_scales=b_scales,
                       b_zeros=b_zeros, g_idx=g_idx, perm=perm, workspace=workspace,
                       b_bias=b_bias)
    return a.new_empty((size_m, size_n))


def marlin_workspace(size_n: int, device=None) -> torch.Tensor:
    """A zeroed workspace large enough for :func:`w4a16_gemm` with this N."""
    return torch.zeros(max(size_n // 64, 1) * 16, dtype=torch.int32, device=device)


# ---- AWQ ----------------------------------------------------------------------------------


def awq_dequantize(qweight: torch.Tensor, scales: torch.Tensor, qzeros: torch.Tensor,
                   split_k_iters: int = 0, thx: int = 0, thy: int = 0) -> torch.Tensor:
    """Dequantize an AutoAWQ ``WQLinear_GEMM`` weight (vLLM ``awq_dequantize``).

    Args:
        qweight: int32 ``[K, N/8]``; column ``8c + j`` is nibble ``[0, 4, 1, 5, 2, 6, 3, 7][j]``
            of word ``[k, c]`` (AWQ order).
        scales: float16 or bfloat16 ``[G, N]``; group size = K / G.
        qzeros: int32 ``[G, N/8]``, zero points packed like ``qweight``.
        split_k_iters, thx, thy: accepted for vLLM compatibility; 0 lets the kernel choose.

    Returns:
        ``[K, N]`` in ``scales``' dtype: ``(q - z) * s`` rounded once to nearest-even.
    """
    return torch.ops.w4kernels.awq_dequantize(qweight, scales, qzeros, split_k_iters, thx, thy)


@_register_fake("awq_dequantize")
def _awq_dequantize_fake(qweight, scales, qzeros, split_k_iters, thx, thy):
    _check_same_device("awq_dequantize", qweight=qweight, scales=scales, qzeros=qzeros)
    return scales.new_empty((qweight.shape[0], qweight.shape[1] * 8))


def awq_gemm(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, qzeros: torch.Tensor,
             split_k_iters: int = 8) -> torch.Tensor:
    """``x @ awq_dequantize(qweight, scales, qzeros)`` without materializing the weight.

    Args:
        x: float16 or bfloat16 ``[M, K]`` (same dtype as ``scales``).
        qweight, scales, qzeros: as :func:`awq_dequantize`.
        split_k_iters: vLLM's K-split factor for the GPU kernel (1..32); the result does not
            depend on it beyond fp32 summation order.

    Returns:
        ``[M, N]`` in ``x``'s dtype, accumulated in fp32.
    """
    return torch.ops.w4kernels.awq_gemm(x, qweight, scales, qzeros, split_k_iters)


@_register_fake("awq_gemm")
def _awq_gemm_fake(x, qweight, scales, qzeros, split_k_iters):
    _check_same_device("awq_gemm", x=x, qweight=qweight, scales=scales, qzeros=qzeros)
    return x.new_empty((x.shape[0], qweight.shape[1] * 8))


# ---- KleidiAI -----------------------------------------------------------------------------
