"""Quantizers and packers that make real checkpoint tensors from float weights.

Weights are given as ``w [K, N]`` = ``linear.weight.T`` (K = in_features, N = out_features),
the orientation every w4 kernel reads. Rounding is round-to-nearest (RTN): the *formats* are
exactly GPTQ's and AutoAWQ's, so the tensors load where real checkpoints load; the error-
compensating GPTQ solver and AWQ's activation-aware scale search only change which codes are
chosen, not how they are stored.

* :func:`quantize_gptq`: symmetric uint4 with bias 8 (vLLM ``uint4b8``), or asymmetric with
  per-group zero points (``sym=False``), per group or per channel, optional act-order
  (``g_idx``).
* :func:`pack_gptq_qzeros` / :func:`unpack_gptq_qzeros`: GPTQ ``qzeros`` in the two checkpoint
  conventions (AutoGPTQ's ``gptq``, stored as zero - 1; GPTQModel's ``gptq_v2``, stored as is).
* :func:`gptq_from_checkpoint`: a :class:`GPTQWeight` from a checkpoint's tensors.
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
    (group of each input row; ``None`` means ``k // group_size``), ``zeros`` int32 [G, N] the
    unpacked zero points 0..15 (``None``: symmetric, zero point 8)."""

    qweight: torch.Tensor
    scales: torch.Tensor
    g_idx: Optional[torch.Tensor]
    group_size: int  # -1: per channel
    size_k: int
    size_n: int
    zeros: Optional[torch.Tensor] = None

    def dequantize(self, exact: bool = False) -> torch.Tensor:
        """``(q - 8) * s[g_idx[k]]`` as [K, N]: rounded once to the scales' dtype (what the
        Marlin kernels multiply with when grouped), or, with ``exact``, unrounded in float64
        (what kernels that apply the scale after the dot product compute with: int8 x int4, and
        per-channel ``w4a16_gemm``)."""
        groups = self._groups()
        q = reference.unpack_rows(self.qweight, self.size_k)
        qz = q - (8 if self.zeros is None else self.zeros[groups])
        if exact:
            return qz.double() * self.scales.double()[groups]
        return (qz.float() * self.scales.float()[groups] + 0.0).to(self.scales.dtype)

    def qzeros(self, checkpoint_format: str = "gptq") -> torch.Tensor:
        """The checkpoint's packed ``qzeros`` int32 [G, N/8] (zero point 8 when symmetric)."""
        zeros = self.zeros
        if zeros is None:
            zeros = torch.full(tuple(self.scales.shape), 8, dtype=torch.int32)
        return pack_gptq_qzeros(zeros, checkpoint_format)

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
                  importance: Optional[torch.Tensor] = None, sym: bool = True) -> GPTQWeight:
    """4-bit GPTQ quantization of ``w [K, N]``, symmetric or (``sym=False``) asymmetric.

    Symmetric, per group and column: ``s = max(max(w) / 7, min(w) / -8)`` (vLLM's uint4b8
    rule), stored in ``dtype``; codes ``q = clamp(round(w / s), -8, 7) + 8``. Asymmetric (GPTQ's
    ``sym=False`` quantizer): ``s = (max - min) / 15`` with max >= 0 >= min, zero point
    ``z = clamp(round(-min / s), 0, 15)``, codes ``q = clamp(round(w / s) + z, 0, 15)``.

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
    los = torch.empty(groups, size_n)
    for g in range(groups):
        rows = w[groups_of_row == g]
        hi = rows.amax(dim=0).clamp(min=0)
        lo = rows.amin(dim=0).clamp(max=0)
        scales[g] = torch.maximum(hi / 7, lo / -8) if sym else (hi - lo) / 15
        los[g] = lo
    scales = torch.where(scales == 0, torch.ones_like(scales), scales).to(dtype)
    s = scales.float()[groups_of_row]
    if sym:
        q = (torch.round(w / s).clamp(-8, 7) + 8).to(torch.int32)
        return GPTQWeight(reference.pack_rows(q), scales, g_idx, group_size, size_k, size_n)
    zeros = torch.round(-los / scales.float()).clamp(0, 15).to(torch.int32)
    q = (torch.round(w / s) + zeros[groups_of_row]).clamp(0, 15).to(torch.int32)
    return GPTQWeight(reference.pack_rows(q), scales, g_idx, group_size, size_k, size_n, zeros)


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
    zeros = None
    if g.zeros is not None:
        zeros = marlin_zero_points(g.zeros, g.scales.shape[0], g.size_n)
    return MarlinWeight(qweight, scales, zeros, g_idx, perm,
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


# ---- GPTQ zero points ---------------------------------------------------------------------
#
# A GPTQ checkpoint stores its zero points as ``qzeros`` int32 [G, N/8], packed along N like
# pack_cols (column 8j + i in nibble i of word j). Two conventions exist for the stored value:
#
# * ``gptq`` (AutoGPTQ, GPTQModel's "v1", what transformers calls checkpoint_format "gptq"):
#   stored = (zero - 1) mod 16, and readers add 1 back. A symmetric layer (zero 8) stores 7
#   (words 0x77777777). A zero point of 0 is stored as 15 and read back as 16: AutoGPTQ's own
#   kernels then compute with 16, which a 4-bit zero point cannot hold, so we reject it.
# * ``gptq_v2`` (GPTQModel's internal format, checkpoint_format "gptq_v2"): stored = zero.

GPTQ_CHECKPOINT_FORMATS = ("gptq", "gptq_v2")


def _check_gptq_format(checkpoint_format: str) -> None:
    if checkpoint_format not in GPTQ_CHECKPOINT_FORMATS:
        raise ValueError(f"GPTQ checkpoint_format must be one of {GPTQ_CHECKPOINT_FORMATS}, got "
                         f"{checkpoint_format!r}")


def pack_gptq_qzeros(zeros: torch.Tensor, checkpoint_format: str = "gptq") -> torch.Tensor:
    """Zero points int [G, N] (0..15) -> the checkpoint's ``qzeros`` int32 [G, N/8].

    ``checkpoint_format``: ``"gptq"`` stores ``(zero - 1) mod 16`` (AutoGPTQ), ``"gptq_v2"``
    stores ``zero`` (GPTQModel v2)."""
    _check_gptq_format(checkpoint_format)
    zeros = zeros.to(torch.int32)
    if zeros.numel() and (zeros.min() < 0 or zeros.max() > 15):
        raise ValueError(f"pack_gptq_qzeros: zero points must be in 0..15, got "
                         f"{zeros.min().item()}..{zeros.max().item()}")
    if checkpoint_format == "gptq" and (zeros == 0).any():
        g, n = (zeros == 0).nonzero()[0].tolist()
        raise ValueError(f"pack_gptq_qzeros: zero point 0 (at [{g}, {n}]) cannot be stored in the "
                         f"'gptq' (v1) convention, which stores zero - 1 and reads 0 - 1 back as "
                         f"16; use checkpoint_format='gptq_v2'")
    stored = zeros - 1 if checkpoint_format == "gptq" else zeros
    return reference.pack_cols(stored)


def unpack_gptq_qzeros(qzeros: torch.Tensor, size_n: int,
                       checkpoint_format: str = "gptq") -> torch.Tensor:
    """The checkpoint's ``qzeros`` int32 [G, N/8] -> zero points int32 [G, N] (0..15).

    ``"gptq"`` adds 1 to the stored nibble (AutoGPTQ); a stored 15 would read as 16, which is
    an error (no 4-bit kernel can apply it). ``"gptq_v2"`` returns the nibbles as stored."""
    _check_gptq_format(checkpoint_format)
    if qzeros.dtype != torch.int32 or qzeros.dim() != 2 or qzeros.shape[1] * 8 != size_n:
        raise ValueError(f"unpack_gptq_qzeros: qzeros must be int32 [G, N/8 = {size_n // 8}], got "
                         f"{qzeros.dtype} {list(qzeros.shape)}")
    zeros = reference.unpack_cols(qzeros.cpu()).to(qzeros.device)
    if checkpoint_format == "gptq":
        zeros = zeros + 1
        if (zeros == 16).any():
            g, n = (zeros == 16).nonzero()[0].tolist()
            raise ValueError(
                f"unpack_gptq_qzeros: qzeros[{g}, {n // 8}] nibble {n % 8} is 15, which the "
                f"'gptq' (v1) convention reads as zero point 16 (a 0 stored as 0 - 1): 4-bit "
                f"kernels cannot apply it. Re-export the layer as 'gptq_v2' or requantize it")
    return zeros


def gptq_from_checkpoint(qweight: torch.Tensor, qzeros: Optional[torch.Tensor],
                         scales: torch.Tensor, g_idx: Optional[torch.Tensor], group_size: int,
                         checkpoint_format: str = "gptq", bits: int = 4,
                         where: str = "gptq") -> GPTQWeight:
    """Check a GPTQ checkpoint layer's tensors and return them as a :class:`GPTQWeight`.

    Args:
        qweight: int32 ``[K/8, N]`` (GPTQ packing along K).
        qzeros: int32 ``[G, N/8]`` in ``checkpoint_format``'s convention, or None (symmetric).
            Zero points that are all 8 are stored as ``zeros=None`` (the symmetric kernels).
        scales: float ``[G, N]``, G = ceil(K / group_size) (1 per channel).
        g_idx: int32 ``[K]`` group of each input row (any order: act-order checkpoints store
            it unsorted), or None for ``k // group_size``.
        group_size: -1 (per channel) or > 0; the last group may be partial (a K shard).
        where: prefix of error messages (the layer's name).
    """
    if bits != 4:
        raise ValueError(f"{where}: bits = {bits} is not supported (4-bit weights only)")
    if qweight.dtype != torch.int32 or qweight.dim() != 2:
        raise ValueError(f"{where}: qweight must be int32 [K/8, N], got {qweight.dtype} "
                         f"{list(qweight.shape)}")
    size_k, size_n = qweight.shape[0] * 8, qweight.shape[1]
    if group_size != -1 and group_size <= 0:
        raise ValueError(f"{where}: group_size must be -1 or positive, got {group_size}")
    groups = 1 if group_size == -1 else -(-size_k // group_size)
    if (scales.dim() != 2 or tuple(scales.shape) != (groups, size_n)
            or not scales.is_floating_point()):
        raise ValueError(f"{where}: scales must be float [G, N] = [{groups}, {size_n}] (K = "
                         f"{size_k}, group_size = {group_size}), got {scales.dtype} "
                         f"{list(scales.shape)}")
    if g_idx is not None:
        if g_idx.dim() != 1 or g_idx.shape[0] != size_k:
            raise ValueError(f"{where}: g_idx must be [K = {size_k}], got {list(g_idx.shape)}")
        g_idx = g_idx.to(torch.int32)
        if g_idx.numel() and (g_idx.min() < 0 or g_idx.max() >= groups):
            raise ValueError(f"{where}: g_idx entries must be in [0, G = {groups}), got "
                             f"{g_idx.min().item()}..{g_idx.max().item()}")
        trivial = torch.arange(size_k, device=g_idx.device) // (size_k if group_size == -1
                                                                  else group_size)
        if torch.equal(g_idx.long(), trivial):
            g_idx = None
    zeros = None
    if qzeros is not None:
        if qzeros.dim() != 2 or tuple(qzeros.shape) != (groups, size_n // 8):
            raise ValueError(f"{where}: qzeros must be int32 [G, N/8] = [{groups}, {size_n // 8}], "
                             f"got {qzeros.dtype} {list(qzeros.shape)}")
        zeros = unpack_gptq_qzeros(qzeros, size_n, checkpoint_format)
        if bool((zeros == 8).all()):
            zeros = None
    return GPTQWeight(qweight, scales, g_idx, group_size, size_k, size_n, zeros)
