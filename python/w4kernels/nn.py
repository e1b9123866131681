"""Quantized ``nn.Linear`` replacements, one per kernel family, and :func:`quantize_`.

* :class:`MarlinLinear`: ``w4a16_gemm`` (vLLM gptq_marlin semantics). Serves symmetric GPTQ,
  asymmetric GPTQ, AutoAWQ weights (zero points) and act-order GPTQ.
* :class:`AWQLinear`: ``awq_gemm`` on AutoAWQ's ``WQLinear_GEMM`` tensors as they are stored.
* :class:`KleidiAILinear`: ``dyn_quant_matmul_4bit`` (dynamic int8 activations x int4
  KleidiAI-packed weights), per channel or per block; CPU only.

Every module is built either from a float ``nn.Linear`` (``from_float``: round-to-nearest, the
quantizers of :mod:`w4kernels.quant`) or from a checkpoint's tensors (``from_gptq``,
``from_awq``). All conversion (repacking, scale permutation, zero-point conversion, the scale
dtype) happens once there; ``forward`` only calls the op.

**Devices.** Each forward calls the op on the device of its tensors: on CUDA the GPU kernel, on
the CPU the C++ CPU kernel (AVX-512/AVX2 with a scalar fallback). The ops choose their own
path by M where it pays (on CUDA ``awq_gemm`` and grouped ``w4a16_gemm`` switch to dequantize
+ matmul from M = 256, ``W4K_AWQ_DEQUANT_THRESHOLD`` / ``W4K_W4A16_DEQUANT_THRESHOLD``; on the
CPU their kernels beat dequantize + matmul at every M measured, README "CPU awq_gemm"), so the
modules call the op at every M.
``module.to(device)`` moves every buffer, the Marlin workspace included.

**state_dict.** It holds the tensors the module computes with, registered as buffers (never
``None`` where a freshly built module of the same configuration has a tensor, so
``load_state_dict`` into ``Cls(in_features, out_features, ...)`` works and gives bit-identical
outputs, through ``torch.save`` or safetensors):

* :class:`MarlinLinear`: the Marlin tensors (``qweight`` int32 [K/16, 2N], Marlin-permuted
  ``scales``, Marlin ``qzeros``, sorted ``g_idx`` and the act-order ``perm``), so loading costs
  no conversion. :meth:`MarlinLinear.to_gptq` / :meth:`MarlinLinear.to_awq` give the
  checkpoint tensors back (exactly, when the scales kept their checkpoint dtype), and
  :mod:`w4kernels.checkpoint` saves a model in the GPTQ/AWQ checkpoint formats.
* :class:`AWQLinear`: AutoAWQ's own tensors (``qweight``, ``qzeros``, ``scales``, ``bias``).
* :class:`KleidiAILinear`: the KleidiAI-packed buffer (``packed_weight``, bias inside).
"""

import math
import sys
import time
from dataclasses import dataclass
from typing import Callable, Optional, Union

import torch
from torch import nn

from . import ops, quant, reference

_HALF = (torch.float16, torch.bfloat16)


def _compute_dtype(where: str, dtype: Optional[torch.dtype], fallback: torch.dtype) -> torch.dtype:
    dtype = dtype if dtype is not None else (fallback if fallback in _HALF else torch.bfloat16)
    if dtype not in _HALF:
        raise ValueError(f"{where}: dtype must be torch.float16 or torch.bfloat16 (the kernels' "
                         f"activation and scale dtype), got {dtype}")
    return dtype


def _check_linear(where: str, linear) -> None:
    if not isinstance(linear, nn.Linear):
        raise TypeError(f"{where}: expected a torch.nn.Linear, got {type(linear).__name__}")


def _float_weight(linear: nn.Linear) -> torch.Tensor:
    """``linear.weight.T`` as float32 ``[K, N]`` on the CPU (the quantizers' orientation)."""
    return linear.weight.detach().float().cpu().T.contiguous()


def _bias_of(linear: nn.Linear) -> Optional[torch.Tensor]:
    return None if linear.bias is None else linear.bias.detach()


def _num_groups(size_k: int, group_size: int) -> int:
    return 1 if group_size == -1 else -(-size_k // group_size)


def _check_group_size(where: str, group_size: int) -> None:
    if group_size != -1 and group_size <= 0:
        raise ValueError(f"{where}: group_size must be -1 (per channel) or positive, got "
                         f"{group_size}")


def _as_half_input(where: str, x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if not x.is_floating_point():
        raise TypeError(f"{where}: input must be a floating-point tensor, got {x.dtype}")
    return x if x.dtype == dtype else x.to(dtype)


_ACT_QUANT = (None, "int8")

# The ops' default overloads, called by the modules' forward without the Python wrappers.
_W4A16_GEMM = torch.ops.w4kernels.w4a16_gemm.default
_W4A8_GEMM = torch.ops.w4kernels.w4a8_gemm.default
_AWQ_GEMM = torch.ops.w4kernels.awq_gemm.default
_AWQ_GEMM_A8 = torch.ops.w4kernels.awq_gemm_a8.default


def _check_act_quant(where: str, act_quant) -> None:
    if act_quant not in _ACT_QUANT:
        raise ValueError(f"{where}: act_quant must be None or 'int8', got {act_quant!r}")


# ---- Marlin (w4a16_gemm) -----------------------------------------------------------------------


class MarlinLinear(nn.Module):
    """``y = x @ W.T + bias`` with a 4-bit weight in the Marlin layout (``ops.w4a16_gemm``).

    Serves symmetric GPTQ (value = code - 8), asymmetric GPTQ and AutoAWQ weights (4-bit zero
    points), per channel or in groups, with GPTQ act-order (``desc_act``). The module owns the
    act-order bookkeeping: it sorts the checkpoint's ``g_idx``, repacks the weight with
    ``perm = argsort(g_idx)`` and hands the same ``perm`` to every GEMM, and permutes the scales
    and zero points for Marlin itself. A last group shorter than ``group_size`` (a K shard of a
    tensor-parallel checkpoint) is served through the same row-group path (identity ``perm``).

    Buffers (the state_dict; K = in_features, N = out_features, G = ceil(K / group_size) or 1):
        qweight: int32 ``[K/16, 2N]`` Marlin layout (rows in ``perm`` order with act-order).
        scales: ``dtype`` ``[G, N]``, Marlin-permuted.
        qzeros: int32 ``[G, N/8]`` Marlin zero points, or ``[0]`` (symmetric: zero point 8).
        g_idx: int32 ``[K]`` group of each Marlin row (sorted), or ``[0]`` without row groups.
        perm: int32 ``[K]`` activation column of each Marlin row, or ``[0]``.
        bias: ``dtype`` ``[N]`` or None.
        workspace: int32, not persistent (the GPU kernel's split-K counters, kept zero).

    Dtype policy: the module computes in ``dtype`` (float16 or bfloat16), the dtype its scales
    and bias are stored in; checkpoint scales of another dtype are converted once when the
    module is built (fp16 -> bf16 rounds each scale once, relative error <= 2^-9).
    ``module.to(torch.bfloat16)`` converts them too, once. Inputs of another floating dtype
    (float32 on the CPU, say) are accepted: they are cast to ``dtype`` on the way in and the
    result is cast back to the input's dtype. Float32 scales (``model.float()``) are an error
    in ``forward``: the kernels multiply in 16-bit.

    Args:
        in_features: K, a multiple of 16. out_features: N, a multiple of 64.
        bias: whether the layer has a bias.
        group_size: -1 (per channel) or the group length (need not divide K).
        zero_points: whether the weight has zero points (asymmetric GPTQ, AWQ).
        act_order: whether the layer has row groups given by ``g_idx`` (GPTQ ``desc_act``).
        dtype: compute dtype, float16 or bfloat16.
        device: where the buffers live.
        act_quant: None (default: ``w4a16_gemm``, the exact contract) or ``"int8"``: the CPU
            int8-activation mode ``ops.w4a8_gemm`` (activations quantized per call to int8 per
            block of K; extra error bounded in ``ops.A8_DOC``; CPU only; the group size must
            be a multiple of 16 dividing K, act-order layers need ``is_k_full``). An attribute:
            ``module.act_quant = "int8"`` switches a built or loaded module; not in the
            state_dict.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 group_size: int = 128, zero_points: bool = False, act_order: bool = False,
                 dtype: torch.dtype = torch.float16, device=None, act_quant: Optional[str] = None):
        super().__init__()
        where = "MarlinLinear"
        if in_features <= 0 or in_features % 16:
            raise ValueError(f"{where}: in_features (K) must be a positive multiple of 16 (one "
                             f"Marlin tile), got {in_features}")
        if out_features <= 0 or out_features % 64:
            raise ValueError(f"{where}: out_features (N) must be a positive multiple of 64 (one "
                             f"Marlin chunk), got {out_features}")
        _check_group_size(where, group_size)
        dtype = _compute_dtype(where, dtype, dtype)
        self.in_features, self.out_features = in_features, out_features
        self.group_size = group_size
        groups = _num_groups(in_features, group_size)
        # Row groups (g_idx + perm) for act-order, and for a partial last group, which the
        # plain grouped path (G divides K) cannot express.
        self.row_groups = act_order or in_features % groups != 0
        self.act_order = act_order
        self.zero_points = zero_points
        self.is_k_full = in_features % groups == 0
        k, n = in_features, out_features
        i32 = dict(dtype=torch.int32, device=device)
        self.register_buffer("qweight", torch.zeros(k // 16, 2 * n, **i32))
        self.register_buffer("scales", torch.zeros(groups, n, dtype=dtype, device=device))
        self.register_buffer("qzeros", torch.zeros((groups, n // 8) if zero_points else (0,),
                                                   **i32))
        self.register_buffer("g_idx", torch.zeros(k if self.row_groups else 0, **i32))
        self.register_buffer("perm", torch.zeros(k if self.row_groups else 0, **i32))
        self.register_buffer("bias", torch.zeros(n, dtype=dtype, device=device) if bias else None)
        self.register_buffer("workspace", ops.marlin_workspace(n, device), persistent=False)
        self.act_quant = act_quant

    @property
    def act_quant(self) -> Optional[str]:
        """None (exact ``w4a16_gemm``) or ``"int8"`` (``w4a8_gemm``, CPU)."""
        return self._act_quant

    @act_quant.setter
    def act_quant(self, value: Optional[str]) -> None:
        _check_act_quant(type(self).__name__, value)
        self._act_quant = value

    # -- construction --

    @classmethod
    def from_float(cls, linear: nn.Linear, group_size: int = 128, act_order: bool = False,
                   sym: bool = True, method: str = "gptq",
                   dtype: Optional[torch.dtype] = None) -> "MarlinLinear":
        """Quantize a float ``nn.Linear`` (round to nearest) and return it as a MarlinLinear.

        Args:
            linear: ``weight [N, K]`` any float dtype, any device (the module lands there).
            group_size: -1 or a divisor of K.
            act_order: GPTQ act-order (groups along decreasing mean |w| of the rows).
            sym: symmetric (zero point 8) or asymmetric GPTQ; ``method="gptq"`` only.
            method: ``"gptq"`` (:func:`quant.quantize_gptq`) or ``"awq"`` (AutoAWQ's
                asymmetric format, :func:`quant.quantize_awq`; no act-order).
            dtype: compute dtype; default the layer's if float16/bfloat16, else bfloat16.
        """
        _check_linear("MarlinLinear.from_float", linear)
        dtype = _compute_dtype("MarlinLinear.from_float", dtype, linear.weight.dtype)
        w = _float_weight(linear)
        if method == "gptq":
            g = quant.quantize_gptq(w, group_size, act_order, dtype, sym=sym)
            m = cls._from_gptq_weight(g, _bias_of(linear), dtype)
        elif method == "awq":
            if act_order:
                raise ValueError("MarlinLinear.from_float: act_order applies to method='gptq' "
                                 "only, got method='awq'")
            a = quant.quantize_awq(w, group_size, dtype)
            m = cls.from_awq(a.qweight, a.qzeros, a.scales, _bias_of(linear), group_size, dtype)
        else:
            raise ValueError(f"MarlinLinear.from_float: method must be 'gptq' or 'awq', got "
                             f"{method!r}")
        return m.to(linear.weight.device)

    @classmethod
    def from_gptq(cls, qweight: torch.Tensor, qzeros: Optional[torch.Tensor],
                  scales: torch.Tensor, g_idx: Optional[torch.Tensor],
                  bias: Optional[torch.Tensor], bits: int = 4, group_size: int = 128,
                  desc_act: bool = False, sym: bool = True, checkpoint_format: str = "gptq",
                  dtype: Optional[torch.dtype] = None) -> "MarlinLinear":
        """A GPTQ checkpoint layer (AutoGPTQ / GPTQModel ``QuantLinear`` tensors).

        Args:
            qweight: int32 ``[K/8, N]``, GPTQ packing along K.
            qzeros: int32 ``[G, N/8]`` or None (symmetric). Read with
                :func:`quant.unpack_gptq_qzeros` in ``checkpoint_format``'s convention
                (``"gptq"``: stored zero - 1, AutoGPTQ; ``"gptq_v2"``: stored zero, GPTQModel).
            scales: float16/bfloat16/float32 ``[G, N]`` in natural column order (as stored).
            g_idx: int32 ``[K]``, the checkpoint's (unsorted with act-order), or None.
            bias: ``[N]`` or None.
            bits: 4 (anything else is an error). group_size: -1 or > 0.
            desc_act: the checkpoint's flag; True requires ``g_idx``.
            sym: the checkpoint's flag; with ``sym=True`` every zero point must be 8 (a
                mismatch usually means the wrong ``checkpoint_format``, which is an error).
            dtype: compute dtype; default the scales' if 16-bit, else bfloat16.

        The layer takes the row groups from ``g_idx`` whatever ``desc_act`` says (a
        ``g_idx`` equal to ``k // group_size`` is the plain grouped layer).
        """
        where = "MarlinLinear.from_gptq"
        if desc_act and g_idx is None:
            raise ValueError(f"{where}: desc_act=True needs the checkpoint's g_idx, got None")
        g = quant.gptq_from_checkpoint(qweight, qzeros, scales, g_idx, group_size,
                                       checkpoint_format, bits, where)
        _check_sym(where, sym, g, checkpoint_format)
        return cls._from_gptq_weight(g, bias, _compute_dtype(where, dtype, scales.dtype))

    @classmethod
    def _from_gptq_weight(cls, g: quant.GPTQWeight, bias: Optional[torch.Tensor],
                          dtype: torch.dtype) -> "MarlinLinear":
        device = g.qweight.device
        m = cls(g.size_k, g.size_n, bias is not None, g.group_size, g.zeros is not None,
                g.g_idx is not None, dtype, device)
        perm = None
        if m.row_groups:
            groups_of_row = (g.g_idx.long() if g.g_idx is not None
                             else torch.arange(g.size_k, device=device) // g.group_size)
            perm = torch.argsort(groups_of_row, stable=True).to(torch.int32)
            m.perm.copy_(perm)
            m.g_idx.copy_(groups_of_row[perm.long()])
        m.qweight.copy_(ops.marlin_repack(g.qweight.contiguous(), perm, g.size_k, g.size_n))
        m._set_scales_zeros(g.scales, g.zeros, bias)
        return m

    @classmethod
    def from_awq(cls, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
                 bias: Optional[torch.Tensor], group_size: int = 128,
                 dtype: Optional[torch.dtype] = None) -> "MarlinLinear":
        """An AutoAWQ ``WQLinear_GEMM`` layer (vLLM's awq_marlin conversion).

        Args:
            qweight: int32 ``[K, N/8]``, AutoAWQ packing along N.
            qzeros: int32 ``[G, N/8]``, packed like qweight (zero points as stored).
            scales: ``[G, N]``, natural column order. bias: ``[N]`` or None.
            group_size: -1 or > 0 (G = ceil(K / group_size)).
            dtype: compute dtype; default the scales' if 16-bit, else bfloat16.
        """
        where = "MarlinLinear.from_awq"
        size_k, size_n = _check_awq_tensors(where, qweight, qzeros, scales, group_size)
        dtype = _compute_dtype(where, dtype, scales.dtype)
        m = cls(size_k, size_n, bias is not None, group_size, True, False, dtype, qweight.device)
        if m.row_groups:  # partial last group: natural row order, explicit groups
            rows = torch.arange(size_k, device=qweight.device)
            m.perm.copy_(rows)
            m.g_idx.copy_(rows // group_size)
        m.qweight.copy_(ops.awq_marlin_repack(qweight.contiguous(), size_k, size_n))
        m._set_scales_zeros(scales, reference.awq_unpack(qzeros.cpu()), bias)
        return m

    def _set_scales_zeros(self, scales, zeros, bias):
        size_k, size_n = self.in_features, self.out_features
        s = scales.detach().cpu().to(self.scales.dtype)
        # marlin_permute_scales picks the per-channel permutation for G == 1 (group_size -1 or
        # >= K) and the grouped one otherwise, as vLLM does.
        gs = self.group_size if s.shape[0] > 1 else -1
        self.scales.copy_(reference.marlin_permute_scales(s, size_k, size_n, gs))
        if zeros is not None:
            self.qzeros.copy_(reference.marlin_zero_points(zeros.cpu(), s.shape[0], size_n))
        if bias is not None:
            if tuple(bias.shape) != (size_n,):
                raise ValueError(f"MarlinLinear: bias must be [N = {size_n}], got "
                                 f"{list(bias.shape)}")
            self.bias.copy_(bias.detach().to(self.bias.dtype))

    # -- back to checkpoint tensors --

    def _codes_natural(self):
        """(codes int32 [K, N] in input-row order, group of each input row int64 [K])."""
        size_k, size_n = self.in_features, self.out_features
        q = reference.marlin_unpack(self.qweight.cpu(), size_k, size_n)
        if self.row_groups:
            perm = self.perm.cpu().long()
            natural = torch.empty_like(q)
            natural[perm] = q
            groups = torch.empty(size_k, dtype=torch.long)
            groups[perm] = self.g_idx.cpu().long()
            return natural, groups
        return q, torch.arange(size_k) // (size_k // self.scales.shape[0])

    def _natural_scales_zeros(self):
        s = reference.marlin_unpermute_scales(self.scales.cpu(), self.out_features)
        z = None
        if self.zero_points:
            z = reference.marlin_unpack_zero_points(self.qzeros.cpu(), self.out_features)
        return s, z

    def to_gptq(self, checkpoint_format: str = "gptq") -> dict:
        """The layer as GPTQ checkpoint tensors (CPU): ``qweight`` int32 [K/8, N], ``qzeros``
        int32 [G, N/8] in ``checkpoint_format``'s convention, ``scales`` [G, N] (natural
        order, this module's dtype), ``g_idx`` int32 [K] (unsorted, as the checkpoint had it),
        ``bias`` when present."""
        q, groups = self._codes_natural()
        s, z = self._natural_scales_zeros()
        if z is None:
            z = torch.full(tuple(s.shape), 8, dtype=torch.int32)
        out = dict(qweight=reference.pack_rows(q),
                   qzeros=quant.pack_gptq_qzeros(z, checkpoint_format), scales=s,
                   g_idx=groups.to(torch.int32))
        if self.bias is not None:
            out["bias"] = self.bias.cpu()
        return out

    def to_awq(self) -> dict:
        """The layer as AutoAWQ ``WQLinear_GEMM`` tensors (CPU): ``qweight`` int32 [K, N/8],
        ``qzeros`` int32 [G, N/8], ``scales`` [G, N], ``bias``. Act-order layers have no AWQ form
        (error)."""
        if self.act_order:
            raise ValueError("MarlinLinear.to_awq: an act-order (desc_act) layer has no AutoAWQ "
                             "form; save it with to_gptq")
        q, _ = self._codes_natural()
        s, z = self._natural_scales_zeros()
        if z is None:
            z = torch.full(tuple(s.shape), 8, dtype=torch.int32)
        out = dict(qweight=reference.awq_pack(q), qzeros=reference.awq_pack(z), scales=s)
        if self.bias is not None:
            out["bias"] = self.bias.cpu()
        return out

    def dequantize(self) -> torch.Tensor:
        """The float64 weight ``[N, K]`` (nn.Linear orientation) this layer multiplies with:
        grouped, each ``(q - z) * s`` rounded once to ``dtype``; per channel, unrounded (README,
        "Numerics of w4a16_gemm")."""
        w = reference.w4a16_weight(
            self.qweight.cpu(), self.scales.cpu(), self.qzeros.cpu() if self.zero_points else None,
            self.g_idx.cpu() if self.row_groups else None, self.in_features, self.out_features)
        if self.row_groups:
            natural = torch.empty_like(w)
            natural[self.perm.cpu().long()] = w
            w = natural
        return w.T.contiguous()

    # -- compute --

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The op is called directly (its default overload), not through ops.w4a16_gemm: the
        # wrapper's checks are this module's invariants (input cast to the scales' dtype, M
        # taken from the flattening), and each buffer is read once from _buffers rather than
        # through nn.Module.__getattr__. At a decode step's M = 1 this Python work was a
        # fixed ~7 us of every call (README "Whole-model speed"); the op still checks
        # every tensor.
        buffers = self._buffers
        scales = buffers["scales"]
        dtype = scales.dtype
        if dtype not in _HALF:
            raise TypeError(f"MarlinLinear: scales are {dtype}, but the Marlin kernels compute in "
                            f"float16 or bfloat16 (was the model converted with .float()?): "
                            f"convert the module with .to(torch.bfloat16) or .half()")
        a = x if x.dtype == dtype else _as_half_input("MarlinLinear", x, dtype)
        if a.dim() == 0:  # the wrapper's error
            ops._flatten_rows("MarlinLinear", "x", a)
        lead = a.shape[:-1] if a.dim() != 2 else None
        a2 = a if lead is None else a.reshape(-1, a.shape[-1])
        size_m, size_n = a2.shape[0], self.out_features
        if self._act_quant == "int8":
            out = _W4A8_GEMM(a2, buffers["qweight"], scales, buffers["qzeros"], buffers["g_idx"],
                             buffers["perm"], 4, size_m, size_n, self.in_features,
                             self.is_k_full, buffers["bias"])
        else:
            out = _W4A16_GEMM(a2, buffers["qweight"], scales, buffers["qzeros"],
                              buffers["g_idx"], buffers["perm"], buffers["workspace"], 4, size_m,
                              size_n, self.in_features, self.is_k_full, buffers["bias"], True)
        if lead is not None:
            out = out.view(*lead, size_n)
        return out if out.dtype == x.dtype else out.to(x.dtype)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, group_size={self.group_size}, "
                f"zero_points={self.zero_points}, act_order={self.act_order}, "
                f"dtype={self.scales.dtype}" +
                (f", act_quant={self.act_quant}" if self.act_quant else ""))


def _check_sym(where: str, sym: bool, g: quant.GPTQWeight, checkpoint_format: str) -> None:
    if sym and g.zeros is not None:
        seen = sorted(set(g.zeros.unique().tolist()))[:4]
        raise ValueError(
            f"{where}: sym=True but the qzeros decode (checkpoint_format = "
            f"{checkpoint_format!r}) to zero points {seen} instead of 8: the checkpoint_format "
            f"is probably wrong ('gptq' stores zero - 1, 'gptq_v2' stores zero), or the layer is "
            f"asymmetric (sym=False)")


def _check_awq_tensors(where, qweight, qzeros, scales, group_size):
    if qweight.dtype != torch.int32 or qweight.dim() != 2:
        raise ValueError(f"{where}: qweight must be int32 [K, N/8], got {qweight.dtype} "
                         f"{list(qweight.shape)}")
    _check_group_size(where, group_size)
    size_k, size_n = qweight.shape[0], qweight.shape[1] * 8
    groups = _num_groups(size_k, group_size)
    if scales.dim() != 2 or tuple(scales.shape) != (groups, size_n):
        raise ValueError(f"{where}: scales must be [G, N] = [{groups}, {size_n}] (K = {size_k}, "
                         f"group_size = {group_size}), got {list(scales.shape)}")
    if (qzeros is None or qzeros.dtype != torch.int32
            or tuple(qzeros.shape) != (groups, size_n // 8)):
        got = None if qzeros is None else f"{qzeros.dtype} {list(qzeros.shape)}"
        raise ValueError(f"{where}: qzeros must be int32 [G, N/8] = [{groups}, {size_n // 8}], "
                         f"got {got}")
    return size_k, size_n


# ---- AutoAWQ layout (awq_gemm) ---------------------------------------------------------------


class AWQLinear(nn.Module):
    """``y = x @ W.T + bias`` on AutoAWQ ``WQLinear_GEMM`` tensors as stored (``ops.awq_gemm``).

    Buffers (the state_dict, AutoAWQ's names and layouts, so an AutoAWQ layer's state dict
    loads directly; K = in_features, N = out_features, G = K / group_size):
        qweight: int32 ``[K, N/8]``; qzeros: int32 ``[G, N/8]``; scales: ``dtype`` ``[G, N]``;
        bias: ``dtype`` ``[N]`` or None.

    The op has no bias argument: the bias is added to the op's rounded output (one more
    rounding than ``MarlinLinear``, which adds it in fp32). Dtype policy as
    :class:`MarlinLinear`: computes in ``dtype``; AutoAWQ's fp16 scales loaded into a bf16
    module are converted once (``load_state_dict`` copies into the bf16 buffer); other input
    dtypes are cast in and the output cast back.

    Args:
        in_features: K (group_size must divide it). out_features: N, a multiple of 8.
        bias, group_size (-1 or > 0), dtype (float16/bfloat16), device.
        act_quant: None (default: ``awq_gemm``) or ``"int8"``: the CPU int8-activation mode
            ``ops.awq_gemm_a8`` on the same tensors (group size a multiple of 16, N a multiple
            of 64; extra error bounded in ``ops.A8_DOC``). An attribute, as in
            :class:`MarlinLinear`.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 group_size: int = 128, dtype: torch.dtype = torch.float16, device=None,
                 act_quant: Optional[str] = None):
        super().__init__()
        where = "AWQLinear"
        _check_group_size(where, group_size)
        if out_features <= 0 or out_features % 8:
            raise ValueError(f"{where}: out_features (N) must be a positive multiple of 8 (AWQ "
                             f"packs 8 columns per int32), got {out_features}")
        groups = _num_groups(in_features, group_size)
        if in_features <= 0 or in_features % groups:
            raise ValueError(f"{where}: group_size = {group_size} must divide in_features (K) = "
                             f"{in_features} (awq_gemm has no partial groups; MarlinLinear "
                             f"serves them)")
        dtype = _compute_dtype(where, dtype, dtype)
        self.in_features, self.out_features, self.group_size = in_features, out_features, group_size
        i32 = dict(dtype=torch.int32, device=device)
        self.register_buffer("qweight", torch.zeros(in_features, out_features // 8, **i32))
        self.register_buffer("qzeros", torch.zeros(groups, out_features // 8, **i32))
        self.register_buffer("scales", torch.zeros(groups, out_features, dtype=dtype,
                                                   device=device))
        self.register_buffer("bias", torch.zeros(out_features, dtype=dtype, device=device)
                             if bias else None)
        self.act_quant = act_quant

    act_quant = MarlinLinear.act_quant

    @classmethod
    def from_float(cls, linear: nn.Linear, group_size: int = 128, act_order: bool = False,
                   dtype: Optional[torch.dtype] = None,
                   act_quant: Optional[str] = None) -> "AWQLinear":
        """Quantize a float ``nn.Linear`` with :func:`quant.quantize_awq` (round to nearest,
        asymmetric). ``act_order`` must be False (awq_gemm has no row permutation).
        ``act_quant``: as the constructor's."""
        _check_act_quant("AWQLinear.from_float", act_quant)
        _check_linear("AWQLinear.from_float", linear)
        if act_order:
            raise ValueError("AWQLinear.from_float: act_order=True is not servable by awq_gemm "
                             "(no row permutation); use MarlinLinear")
        dtype = _compute_dtype("AWQLinear.from_float", dtype, linear.weight.dtype)
        a = quant.quantize_awq(_float_weight(linear), group_size, dtype)
        m = cls.from_awq(a.qweight, a.qzeros, a.scales, _bias_of(linear), group_size, dtype)
        m.act_quant = act_quant
        return m.to(linear.weight.device)

    @classmethod
    def from_awq(cls, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor,
                 bias: Optional[torch.Tensor], group_size: int = 128,
                 dtype: Optional[torch.dtype] = None) -> "AWQLinear":
        """AutoAWQ tensors as stored (arguments as :meth:`MarlinLinear.from_awq`)."""
        where = "AWQLinear.from_awq"
        size_k, size_n = _check_awq_tensors(where, qweight, qzeros, scales, group_size)
        dtype = _compute_dtype(where, dtype, scales.dtype)
        m = cls(size_k, size_n, bias is not None, group_size, dtype, qweight.device)
        m.qweight.copy_(qweight)
        m.qzeros.copy_(qzeros)
        m.scales.copy_(scales.detach().to(dtype))
        if bias is not None:
            m.bias.copy_(bias.detach().to(dtype))
        return m

    @classmethod
    def from_gptq(cls, qweight: torch.Tensor, qzeros: Optional[torch.Tensor],
                  scales: torch.Tensor, g_idx: Optional[torch.Tensor],
                  bias: Optional[torch.Tensor], bits: int = 4, group_size: int = 128,
                  desc_act: bool = False, sym: bool = True, checkpoint_format: str = "gptq",
                  dtype: Optional[torch.dtype] = None) -> "AWQLinear":
        """A GPTQ layer without act-order, repacked once into AutoAWQ's layout (arguments as
        :meth:`MarlinLinear.from_gptq`). Act-order (a ``g_idx`` other than ``k // group_size``)
        is an error: awq_gemm has no row permutation."""
        where = "AWQLinear.from_gptq"
        g = quant.gptq_from_checkpoint(qweight, qzeros, scales, g_idx, group_size,
                                       checkpoint_format, bits, where)
        _check_sym(where, sym, g, checkpoint_format)
        if g.g_idx is not None:
            raise ValueError(f"{where}: act-order g_idx (desc_act) is not servable by awq_gemm (no "
                             f"row permutation); use MarlinLinear")
        q = reference.unpack_rows(g.qweight.cpu(), g.size_k)
        z = g.zeros if g.zeros is not None else torch.full(tuple(g.scales.shape), 8,
                                                           dtype=torch.int32)
        dev = qweight.device
        return cls.from_awq(reference.awq_pack(q).to(dev), reference.awq_pack(z.cpu()).to(dev),
                            scales, bias, group_size, _compute_dtype(where, dtype, scales.dtype))

    def to_awq(self) -> dict:
        """The AutoAWQ tensors (CPU)."""
        out = dict(qweight=self.qweight.cpu(), qzeros=self.qzeros.cpu(), scales=self.scales.cpu())
        if self.bias is not None:
            out["bias"] = self.bias.cpu()
        return out

    def dequantize(self) -> torch.Tensor:
        """The float64 weight ``[N, K]``: ``(q - z) * s`` rounded once to ``dtype``."""
        return reference.awq_dequantize(self.qweight.cpu(), self.scales.cpu(),
                                        self.qzeros.cpu()).double().T.contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The ops are called directly, as in MarlinLinear.forward (why: there).
        buffers = self._buffers
        scales = buffers["scales"]
        a = x if x.dtype == scales.dtype else _as_half_input("AWQLinear", x, scales.dtype)
        if a.dim() == 0:  # the wrapper's error
            ops._flatten_rows("AWQLinear", "x", a)
        lead = a.shape[:-1] if a.dim() != 2 else None
        a2 = a if lead is None else a.reshape(-1, a.shape[-1])
        if self._act_quant == "int8":
            out = _AWQ_GEMM_A8(a2, buffers["qweight"], scales, buffers["qzeros"])
        else:
            out = _AWQ_GEMM(a2, buffers["qweight"], scales, buffers["qzeros"], 8)
        if lead is not None:
            out = out.view(*lead, out.shape[-1])
        bias = buffers["bias"]
        if bias is not None:
            out = out + bias
        return out if out.dtype == x.dtype else out.to(x.dtype)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, group_size={self.group_size}, "
                f"dtype={self.scales.dtype}" +
                (f", act_quant={self.act_quant}" if self.act_quant else ""))


# ---- KleidiAI (dyn_quant_matmul_4bit) ----------------------------------------------------------


class KleidiAILinear(nn.Module):
    """``y = x @ W.T + bias`` with activations quantized per row to int8 on the fly and a
    symmetric int4 weight in KleidiAI's packed format (``ops.dyn_quant_matmul_4bit``, the
    ``aten._dyn_quant_matmul_4bit`` drop-in). CPU only.

    Weight: value = code - 8, per channel (``group_size=-1``: float32 scale per output) or per
    block of ``group_size`` inputs (a multiple of 32 dividing K; bfloat16 scales, KleidiAI's
    qsi4c32p format: float16 checkpoint scales are rounded once to bf16 at load).

    Buffer (the state_dict): ``packed_weight`` uint8 ``[rhs_packed_size]``, the KleidiAI buffer
    (nr=8, kr=16, sr=2) with the codes, scales, row sums and bias, as
    ``aten._dyn_quant_pack_4bit_weight`` makes it.

    Dtype policy: float32 and bfloat16 inputs run as they are and give that dtype; other
    floating inputs (float16) are computed in float32 and cast back.

    Args:
        in_features: K, even. out_features: N. bias: whether the layer has a bias.
        group_size: -1 or a multiple of 32 dividing K.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 group_size: int = -1, device=None):
        super().__init__()
        where = "KleidiAILinear"
        _check_group_size(where, group_size)
        if in_features <= 0 or in_features % 2 or out_features <= 0:
            raise ValueError(f"{where}: in_features (K) must be positive and even (two codes per "
                             f"byte) and out_features positive, got K = {in_features}, "
                             f"N = {out_features}")
        if group_size != -1 and (group_size % 32 or in_features % group_size):
            raise ValueError(f"{where}: group_size must be -1 (per channel) or a multiple of 32 "
                             f"dividing in_features = {in_features}, got {group_size}")
        self.in_features, self.out_features, self.group_size = in_features, out_features, group_size
        self.has_bias = bias
        self.block_size = in_features if group_size == -1 else group_size
        if group_size == -1:
            size = ops.rhs_packed_size_qsi4cxp(out_features, in_features)
        else:
            size = ops.rhs_packed_size_qsi4c32p(out_features, in_features, group_size)
        self.register_buffer("packed_weight", torch.zeros(size, dtype=torch.uint8, device=device))

    @classmethod
    def _from_codes(cls, q: torch.Tensor, scales: torch.Tensor, bias, group_size: int):
        """codes int [K, N] (0..15, value code - 8), scales [G, N] -> module."""
        size_k, size_n = q.shape
        m = cls(size_k, size_n, bias is not None, group_size)
        qt = q.T.to(torch.uint8)
        weights = (qt[:, 0::2] | (qt[:, 1::2] << 4)).contiguous()  # low nibble = even k
        if group_size == -1:
            s = scales.reshape(size_n).float()
        else:
            s = scales.T.contiguous().to(torch.bfloat16)
        b = None if bias is None else bias.detach().float().cpu()
        m.packed_weight.copy_(ops.dyn_quant_pack_4bit_weight(weights, s, b, m.block_size,
                                                             size_k, size_n))
        return m

    @classmethod
    def from_float(cls, linear: nn.Linear, group_size: int = -1,
                   act_order: bool = False) -> "KleidiAILinear":
        """Quantize a float ``nn.Linear`` symmetrically (round to nearest, vLLM's uint4b8 rule
        of :func:`quant.quantize_gptq`, scales computed in the format's scale dtype)."""
        _check_linear("KleidiAILinear.from_float", linear)
        if act_order:
            raise ValueError("KleidiAILinear.from_float: act_order=True is not servable (the "
                             "KleidiAI formats have no row permutation)")
        if linear.weight.device.type != "cpu":
            raise ValueError(f"KleidiAILinear.from_float: KleidiAI kernels run on the CPU, got "
                             f"a layer on {linear.weight.device}")
        w = _float_weight(linear)
        cls(w.shape[0], w.shape[1], False, group_size)  # argument checks before quantizing
        sdtype = torch.float32 if group_size == -1 else torch.bfloat16
        g = quant.quantize_gptq(w, group_size, False, sdtype)
        q = reference.unpack_rows(g.qweight, g.size_k)
        return cls._from_codes(q, g.scales, _bias_of(linear), group_size)

    @classmethod
    def from_gptq(cls, qweight: torch.Tensor, qzeros: Optional[torch.Tensor],
                  scales: torch.Tensor, g_idx: Optional[torch.Tensor],
                  bias: Optional[torch.Tensor], bits: int = 4, group_size: int = 128,
                  desc_act: bool = False, sym: bool = True,
                  checkpoint_format: str = "gptq") -> "KleidiAILinear":
        """A symmetric GPTQ layer without act-order (arguments as
        :meth:`MarlinLinear.from_gptq`). Zero points other than 8 and act-order are errors
        (the KleidiAI formats are symmetric and have no row permutation)."""
        where = "KleidiAILinear.from_gptq"
        g = quant.gptq_from_checkpoint(qweight.cpu(), None if qzeros is None else qzeros.cpu(),
                                       scales.cpu(), None if g_idx is None else g_idx.cpu(),
                                       group_size, checkpoint_format, bits, where)
        _check_sym(where, sym, g, checkpoint_format)
        if g.zeros is not None:
            raise ValueError(f"{where}: asymmetric GPTQ (zero points other than 8) has no KleidiAI "
                             f"form (zero point fixed at 8); use MarlinLinear")
        if g.g_idx is not None:
            raise ValueError(f"{where}: act-order g_idx (desc_act) is not servable by the KleidiAI "
                             f"kernels (no row permutation); use MarlinLinear")
        q = reference.unpack_rows(g.qweight, g.size_k)
        return cls._from_codes(q, g.scales, bias, group_size)

    @classmethod
    def from_awq(cls, qweight, qzeros, scales, bias, group_size=128) -> "KleidiAILinear":
        """Always an error: AutoAWQ weights have zero points, the KleidiAI formats do not."""
        raise ValueError("KleidiAILinear.from_awq: AutoAWQ weights have per-group zero points, "
                         "which the KleidiAI formats (zero point fixed at 8) cannot hold; use "
                         "MarlinLinear or AWQLinear")

    def dequantize(self) -> torch.Tensor:
        """The float64 weight ``[N, K]`` stored in the packed buffer (codes times scales)."""
        n, k = self.out_features, self.in_features
        bl = 0 if self.group_size == -1 else self.group_size
        rhs = reference.kai_unpack_rhs(self.packed_weight.cpu(), n, k, bl=bl)
        w = rhs["w"][:, :k].double()
        if bl == 0:
            return w * (rhs["scale"].double() * 16)  # per channel the buffer holds s / 16
        return w * rhs["scale"].double().repeat_interleave(bl, dim=1)

    def packed_bias(self) -> Optional[torch.Tensor]:
        if not self.has_bias:
            return None
        bl = 0 if self.group_size == -1 else self.group_size
        return reference.kai_unpack_rhs(self.packed_weight.cpu(), self.out_features,
                                        self.in_features, bl=bl)["bias"]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu":
            raise RuntimeError(f"KleidiAILinear: the KleidiAI kernels run on the CPU, got input "
                               f"on {x.device}")
        a = x if x.dtype in (torch.float32, torch.bfloat16) else _as_half_input(
            "KleidiAILinear", x, torch.float32)
        out = ops.dyn_quant_matmul_4bit(a, self.packed_weight, self.block_size,
                                        self.in_features, self.out_features)
        return out if out.dtype == x.dtype else out.to(x.dtype)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.has_bias}, group_size={self.group_size}")


QUANTIZED_LINEARS = (MarlinLinear, AWQLinear, KleidiAILinear)


# ---- quantize_ ---------------------------------------------------------------------------------


@dataclass
class GPTQMarlinConfig:
    """Round-to-nearest GPTQ (symmetric, or ``sym=False``), optional act-order, served by
    :class:`MarlinLinear`. ``dtype``: compute dtype (default: the layer's if 16-bit, else
    bfloat16)."""

    group_size: int = 128
    act_order: bool = False
    sym: bool = True
    dtype: Optional[torch.dtype] = None

    def convert(self, linear: nn.Linear) -> nn.Module:
        return MarlinLinear.from_float(linear, self.group_size, self.act_order, self.sym,
                                       "gptq", self.dtype)


@dataclass
class AWQMarlinConfig:
    """AutoAWQ's asymmetric format (round to nearest), served by :class:`MarlinLinear`."""

    group_size: int = 128
    dtype: Optional[torch.dtype] = None

    def convert(self, linear: nn.Linear) -> nn.Module:
        return MarlinLinear.from_float(linear, self.group_size, method="awq", dtype=self.dtype)


@dataclass
class AWQConfig:
    """AutoAWQ's asymmetric format (round to nearest), served by :class:`AWQLinear`."""

    group_size: int = 128
    dtype: Optional[torch.dtype] = None

    def convert(self, linear: nn.Linear) -> nn.Module:
        return AWQLinear.from_float(linear, self.group_size, dtype=self.dtype)


@dataclass
class KleidiAIConfig:
    """Symmetric int4 per channel (``group_size=-1``) or per block, served by
    :class:`KleidiAILinear` (CPU)."""

    group_size: int = -1

    def convert(self, linear: nn.Linear) -> nn.Module:
        return KleidiAILinear.from_float(linear, self.group_size)


QuantizeConfig = Union[GPTQMarlinConfig, AWQMarlinConfig, AWQConfig, KleidiAIConfig]


def quantize_(model: nn.Module, config: QuantizeConfig,
              filter_fn: Optional[Callable[[nn.Module, str], bool]] = None,
              progress: Union[bool, None, Callable[[int, int, str], None]] = None) -> nn.Module:
    """Replace, in place, every ``nn.Linear`` of ``model`` that ``filter_fn`` selects by the
    w4kernels module ``config`` describes (torchao's ``quantize_(model, config)``).

    Args:
        model: any module; it is modified in place and returned.
        config: :class:`GPTQMarlinConfig`, :class:`AWQMarlinConfig`, :class:`AWQConfig` or
            :class:`KleidiAIConfig` (anything with ``convert(linear) -> nn.Module``).
        filter_fn: ``filter_fn(module, fully_qualified_name) -> bool``; default: every
            ``nn.Linear``. A selected layer the format cannot serve (e.g. N not a multiple of
            64 for Marlin) is an error naming the layer.
        progress: True prints ``quantize_: done/total layers (name)`` to stderr after each
            layer; None (default) does so only once the run has taken 2 s; False never; a
            callable gets ``(done, total, name)``.
    """
    if not hasattr(config, "convert"):
        raise TypeError(f"quantize_: config must be a w4kernels config (GPTQMarlinConfig, "
                        f"AWQMarlinConfig, AWQConfig, KleidiAIConfig), got "
                        f"{type(config).__name__}")
    if filter_fn is None:
        filter_fn = lambda module, name: isinstance(module, nn.Linear)  # noqa: E731
    selected = [(name, mod) for name, mod in model.named_modules()
                if isinstance(mod, nn.Linear) and filter_fn(mod, name)]
    start = time.perf_counter()
    for done, (name, linear) in enumerate(selected, 1):
        try:
            new = config.convert(linear)
        except (ValueError, TypeError) as e:
            raise type(e)(f"quantize_: layer {name!r} ({linear.in_features} -> "
                          f"{linear.out_features}): {e}") from e
        model.set_submodule(name, new)
        if callable(progress):
            progress(done, len(selected), name)
        elif progress or (progress is None and time.perf_counter() - start > 2.0):
            print(f"quantize_: {done}/{len(selected)} layers ({name})", file=sys.stderr,
                  flush=True)
    return model
