"""Quantizers and packers that make real checkpoint tensors from float weights.

Weights are given as ``w [K, N]`` = ``linear.weight.T`` (K = in_features, N = out_features),
the orientation every w4 kernel reads. Rounding is round-to-nearest (RTN): the *formats* are
exactly GPTQ's and AutoAWQ's, so the tensors load where real checkpoints load; the error-
compensating GPTQ solver and AWQ's activation-aware scale search only change which codes are
chosen, not how they are stored.

* :func:`quantize_gptq`: symmetric uint4 with bias 8 (vLLM ``uint4b8``), per group or per
  channel, optional act-order (``g_idx``).
* :func:`quantize_awq`: asymmetric uint4 with per-group zero points, AutoAWQ packing.
* :func:`gptq_to_marlin` / :func:`awq_to_marlin`: the tensors :func:`w4kernels.ops.w4a16_gemm`
  takes, made with the repack ops and the Marlin scale / zero-point helpers below.
"""

import math
from dataclasses import dataclass
from typing import Optional

import torch

from . import reference
from .reference import (awq_to_marlin_zero_points, marlin_permute_scales,  # noqa: F401
                        marlin_zero_points)


@dataclass
class GPTQWeight:
    """A GPTQ checkpoint layer: ``qweight`` int32 [K/8, N], ``scales`` [G, N], ``g_idx`` int32 [K]
    (group of each input row; ``None`` means ``k // group_size``)."""

    qweight: torch.Tensor
    scales: torch.Tensor
    g_idx: Optional[torch.Tensor]
    group_size: int  # -1: per channel
    size_k: int
    size_n: int

    def dequantize(self, exact: bool = False) -> torch.Tensor:
        """``(q - 8) * s[g_idx[k]]`` as [K, N]: rounded once to the scales' dtype (what the
        Marlin kernels multiply with when grouped), or, with ``exact``, unrounded in float64
        (what kernels that apply the scale after the dot product compute with: int8 x int4, and
        per-channel ``w4a16_gemm``)."""
        q = reference.unpack_rows(self.qweight, self.size_k)
        if exact:
            return (q - 8).double() * self.scales.double()[self._groups()]
        return ((q - 8).float() * self.scales.float()[self._groups()] + 0.0).to(self.scales.dtype)

    def _groups(self) -> torch.Tensor:
        if self.g_idx is not None:
            return self.g_idx.long()
        gs = self.size_k if self.group_size == -1 else self.group_size
        return torch.arange(self.size_k) // gs


@dataclass
class AWQWeight:
    """An AutoAWQ ``WQLinear_GEMM`` layer: ``qweight`` int32 [K, N/8], ``scales`` [G, N],
    ``qzeros`` int32 [G, N/8]."""

    qweight: torch.Tensor
    scales: torch.Tensor
    qzeros: torch.Tensor
    group_size: int
    size_k: int
    size_n: int

    def dequantize(self) -> torch.Tensor:
        return reference.awq_dequantize(self.qweight, self.scales, self.qzeros)


@dataclass
class MarlinWeight:
    """Everything :func:`w4kernels.ops.w4a16_gemm` needs besides the activations."""

    b_q_weight: torch.Tensor  # int32 [K/16, 2N]
    b_scales: torch.Tensor  # [G, N], Marlin-permuted
    b_zeros: Optional[torch.Tensor]  # int32 [G, N/8] Marlin zero points (AWQ), or None (GPTQ)
    g_idx: Optional[torch.Tensor]  # int32 [K], sorted group index per Marlin row (act-order)
    perm: Optional[torch.Tensor]  # int32 [K], act-order permutation of the activations
    workspace: torch.Tensor
    size_k: int
    size_n: int

    def gemm(self, a: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``a [..., K] @ weight (+ bias [N])`` -> ``[..., N]`` in ``a``'s dtype."""
        from . import ops

        return ops.w4a16_gemm(a, self.b_q_weight, self.b_scales, self.b_zeros, self.g_idx,
                              self.perm, self.workspace, 4, math.prod(a.shape[:-1]),
                              self.size_n, self.size_k, True, bias)


def _groups_of(w: torch.Tensor, group_size: int) -> int:
    size_k = w.shape[0]
    if group_size == -1:
        return 1
    if group_size <= 0 or size_k % group_size:
        raise ValueError(f"group_size must be -1 or a positive divisor of K = {size_k}, "
                         f"got {group_size}")
    return size_k // group_size


def quantize_gptq(w: torch.Tensor, group_size: int = 128, act_order: bool = False,
                  dtype: torch.dtype = torch.float16,
                  importance: Optional[torch.Tensor] = None) -> GPTQWeight:
    """Symmetric 4-bit GPTQ quantization of ``w [K, N]``.

    Per group and column: ``s = max(max(w) / 7, min(w) / -8)`` (vLLM's uint4b8 rule), stored in
    ``dtype``; codes ``q = clamp(round(w / s), -8, 7) + 8``.

    With ``act_order`` the rows are quantized in decreasing order of ``importance`` (GPTQ uses
    the Hessian diagonal; default: the row's mean |w|) and groups are formed along that order,
    so ``g_idx[k] = rank(k) // group_size`` is not monotone in k.
    """
    size_k, size_n = w.shape
    if size_k % 8:
        raise ValueError(f"K must be a multiple of 8 for GPTQ packing, got {size_k}")
    groups = _groups_of(w, group_size)
    gs = size_k // groups
    w = w.float()
    if act_order:
        if importance is None:
            importance = w.abs().mean(dim=1)
        order = torch.argsort(importance, descending=True, stable=True)
        rank = torch.empty_like(order)
        rank[order] = torch.arange(size_k)
        g_idx = (rank // gs).to(torch.int32)
    else:
        g_idx = None
    groups_of_row = g_idx.long() if g_idx is not None else torch.arange(size_k) // gs
    scales = torch.empty(groups, size_n)
    for g in range(groups):
        rows = w[groups_of_row == g]
        hi = rows.amax(dim=0).clamp(min=0)
        lo = rows.amin(dim=0).clamp(max=0)
        scales[g] = torch.maximum(hi / 7, lo / -8)
    scales = torch.where(scales == 0, torch.ones_like(scales), scales).to(dtype)
    s = scales.float()[groups_of_row]
    q = (torch.round(w / s).clamp(-8, 7) + 8).to(torch.int32)
    return GPTQWeight(reference.pack_rows(q), scales, g_idx, group_size, size_k, size_n)


def quantize_awq(w: torch.Tensor, group_size: int = 128,
                 dtype: torch.dtype = torch.float16) -> AWQWeight:
    """Asymmetric 4-bit quantization of ``w [K, N]`` in AutoAWQ's format.

    Per group and column: ``s = (max - min) / 15``, zero point ``z = clamp(round(-min / s), 0,
    15)``, codes ``q = clamp(round(w / s) + z, 0, 15)``; scales in ``dtype``.
    """
    size_k, size_n = w.shape
    if size_n % 8:
        raise ValueError(f"N must be a multiple of 8 for AWQ packing, got {size_n}")
    groups = _groups_of(w, group_size)
    wg = w.float().reshape(groups, size_k // groups, size_n)
    hi = wg.amax(dim=1).clamp(min=0)
    lo = wg.amin(dim=1).clamp(max=0)
    scales = ((hi - lo) / 15)
    scales = torch.where(scales == 0, torch.ones_like(scales), scales).to(dtype)
    s = scales.float()
    zeros = torch.round(-lo / s).clamp(0, 15)
    q = (torch.round(wg / s[:, None]) + zeros[:, None]).clamp(0, 15)
    q = q.reshape(size_k, size_n).to(torch.int32)
    return AWQWeight(reference.awq_pack(q), scales, reference.awq_pack(zeros.to(torch.int32)),
                     group_size, size_k, size_n)


def gptq_to_marlin(g: GPTQWeight) -> MarlinWeight:
    """Repack a GPTQ layer for :func:`ops.w4a16_gemm` (vLLM's gptq_marlin conversion)."""
    from . import ops

    perm = g_idx = None
    if g.g_idx is not None:
        perm = torch.argsort(g.g_idx, stable=True).to(torch.int32)
        g_idx = g.g_idx[perm.long()].contiguous()
    qweight = ops.marlin_repack(g.qweight, perm, g.size_k, g.size_n)
    scales = marlin_permute_scales(g.scales, g.size_k, g.size_n, g.group_size)
    return MarlinWeight(qweight, scales, None, g_idx, perm,
                        _workspace(g.size_n, g.qweight.device), g.size_k, g.size_n)


def awq_to_marlin(a: AWQWeight) -> MarlinWeight:
    """Repack an AutoAWQ layer for :func:`ops.w4a16_gemm` (vLLM's awq_marlin conversion)."""
    from . import ops

    qweight = ops.awq_marlin_repack(a.qweight, a.size_k, a.size_n)
    scales = marlin_permute_scales(a.scales, a.size_k, a.size_n, a.group_size)
    zeros = awq_to_marlin_zero_points(a.qzeros, a.scales.shape[0], a.size_n)
    return MarlinWeight(qweight, scales, zeros, None, None,
                        _workspace(a.size_n, a.qweight.device), a.size_k, a.size_n)


def _workspace(size_n: int, device) -> torch.Tensor:
    from . import ops

    return ops.marlin_workspace(size_n, device)
