"""GPTQ and AWQ checkpoints (safetensors + ``quantization_config``) in and out of a model.

:func:`load_quantized` takes a model built from a Hugging Face config (``transformers``'
``AutoModelForCausalLM.from_config(config)``, random weights) or any ``nn.Module`` whose
``nn.Linear`` layers carry the checkpoint's names, plus a checkpoint directory (every
``*.safetensors`` file in it, and ``config.json``'s ``quantization_config`` or AutoGPTQ's
``quantize_config.json``) or a state dict. Every Linear ``name`` with a ``name.qweight`` tensor
becomes a w4kernels module (:class:`~w4kernels.nn.MarlinLinear` by default) built from the
checkpoint's tensors; every other tensor is loaded with ``load_state_dict``.

:func:`save_quantized` writes the model back in the same format: the quantized layers as the
checkpoint tensors the tools write (GPTQ: ``qweight [K/8, N]``, ``qzeros``, ``scales``,
``g_idx``; AWQ: ``qweight [K, N/8]``, ``qzeros``, ``scales``), everything else as is, and
``config.json`` with the ``quantization_config``.

``quantization_config`` fields read (as AutoGPTQ, GPTQModel, AutoAWQ and transformers write
them): ``quant_method`` (``gptq`` | ``awq``), ``bits`` (4), ``group_size`` (-1 or > 0),
GPTQ: ``desc_act``, ``sym``, ``checkpoint_format`` (or GPTQModel's ``format``: ``gptq``, whose
``qzeros`` store zero - 1, or ``gptq_v2``, which stores zero); AWQ: ``zero_point`` (true),
``version`` (``gemm``), ``modules_to_not_convert``. Anything else we cannot serve (bits 8 or 3,
``checkpoint_format`` marlin / bitblas, AWQ ``gemv`` / ``marlin``, ``zero_point`` false, another
``quant_method``) is a ``ValueError`` naming the field and its value.
"""

import json
import os
from dataclasses import dataclass, field
from typing import Optional, Union

import torch
from torch import nn

from . import quant
from .nn import AWQLinear, KleidiAILinear, MarlinLinear

KERNELS = {"marlin": MarlinLinear, "awq": AWQLinear, "kleidiai": KleidiAILinear}


@dataclass
class QuantizationSpec:
    """A parsed ``quantization_config``."""

    quant_method: str  # "gptq" | "awq"
    bits: int = 4
    group_size: int = 128
    desc_act: bool = False
    sym: bool = True
    checkpoint_format: str = "gptq"  # GPTQ qzeros convention ("gptq" | "gptq_v2")
    modules_to_not_convert: list = field(default_factory=list)

    def to_config(self) -> dict:
        """The ``quantization_config`` dict the upstream tool writes for this format."""
        if self.quant_method == "gptq":
            return dict(quant_method="gptq", bits=self.bits, group_size=self.group_size,
                        desc_act=self.desc_act, sym=self.sym,
                        checkpoint_format=self.checkpoint_format)
        out = dict(quant_method="awq", bits=self.bits, group_size=self.group_size,
                   zero_point=True, version="gemm")
        if self.modules_to_not_convert:
            out["modules_to_not_convert"] = list(self.modules_to_not_convert)
        return out


def _field_error(name: str, value, supported: str) -> ValueError:
    return ValueError(f"quantization_config: {name} = {value!r} is not supported ({supported})")


def parse_quantization_config(config) -> QuantizationSpec:
    """Check a ``quantization_config`` (dict, or an object with ``to_dict()`` such as
    transformers' ``GPTQConfig`` / ``AwqConfig``) and return what w4kernels will serve."""
    if hasattr(config, "to_dict"):
        config = config.to_dict()
    if not isinstance(config, dict):
        raise TypeError(f"quantization_config must be a dict, got {type(config).__name__}")
    method = str(config.get("quant_method", "")).lower()
    if method not in ("gptq", "awq"):
        raise _field_error("quant_method", config.get("quant_method"), "gptq or awq")
    bits = config.get("bits", config.get("w_bit", 4))
    if bits != 4:
        raise _field_error("bits", bits, "w4kernels serves 4-bit weights only")
    group_size = config.get("group_size", config.get("q_group_size", 128))
    if not isinstance(group_size, int) or (group_size != -1 and group_size <= 0):
        raise _field_error("group_size", group_size, "-1 or a positive integer")
    if method == "gptq":
        fmt = config.get("checkpoint_format") or config.get("format") or "gptq"
        if str(fmt).lower() not in quant.GPTQ_CHECKPOINT_FORMATS:
            key = "checkpoint_format" if config.get("checkpoint_format") else "format"
            raise _field_error(key, fmt, "gptq (AutoGPTQ, qzeros = zero - 1) or gptq_v2 "
                                         "(GPTQModel, qzeros = zero)")
        if config.get("is_marlin_format"):
            raise _field_error("is_marlin_format", config["is_marlin_format"],
                               "checkpoints in the GPTQ packing; a Marlin-format export is not")
        pack_dtype = config.get("pack_dtype", "int32")
        if str(pack_dtype).replace("torch.", "") != "int32":
            raise _field_error("pack_dtype", pack_dtype, "int32 packing")
        return QuantizationSpec("gptq", 4, group_size, bool(config.get("desc_act", False)),
                                bool(config.get("sym", True)), str(fmt).lower())
    version = str(config.get("version", "gemm")).lower()
    if version != "gemm":
        raise _field_error("version", config.get("version"),
                           "gemm, AutoAWQ's WQLinear_GEMM packing")
    zero_point = config.get("zero_point", True)
    if not zero_point:
        raise _field_error("zero_point", zero_point, "AWQ GEMM checkpoints have zero points")
    return QuantizationSpec("awq", 4, group_size, sym=False,
                            modules_to_not_convert=list(config.get("modules_to_not_convert")
                                                        or []))


def _checkpoint_files(directory: str) -> list:
    """The weight files of a checkpoint directory, as transformers picks them: those named by
    ``model.safetensors.index.json`` (sharded), else ``model*.safetensors``, else every
    ``*.safetensors``."""
    index = os.path.join(directory, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as fh:
            names = sorted(set(json.load(fh)["weight_map"].values()))
        return [os.path.join(directory, n) for n in names]
    every = sorted(f for f in os.listdir(directory) if f.endswith(".safetensors"))
    model = [f for f in every if f.startswith("model")]
    return [os.path.join(directory, f) for f in (model or every)]


def read_checkpoint(path: str):
    """(state dict of every tensor, the quantization_config dict or None) from a checkpoint
    directory (weight files as :func:`_checkpoint_files` picks them, ``config.json`` /
    ``quantize_config.json``) or one ``.safetensors`` file."""
    from safetensors.torch import load_file

    if os.path.isfile(path):
        files, directory = [path], os.path.dirname(path)
    elif os.path.isdir(path):
        directory = path
        files = _checkpoint_files(path)
        if not files:
            raise FileNotFoundError(f"read_checkpoint: no *.safetensors file in {path}")
    else:
        raise FileNotFoundError(f"read_checkpoint: {path} is neither a file nor a directory")
    state = {}
    for f in files:
        state.update(load_file(f))
    config = None
    cfg_path = os.path.join(directory, "config.json")
    if os.path.isfile(cfg_path):
        with open(cfg_path) as fh:
            config = json.load(fh).get("quantization_config")
    qcfg_path = os.path.join(directory, "quantize_config.json")  # AutoGPTQ's own file
    if config is None and os.path.isfile(qcfg_path):
        with open(qcfg_path) as fh:
            config = dict(json.load(fh))
        config.setdefault("quant_method", "gptq")
    return state, config


def _build(kernel: str, spec: QuantizationSpec, t: dict, dtype, where: str) -> nn.Module:
    cls = KERNELS[kernel]
    bias = t.get("bias")
    if spec.quant_method == "gptq":
        extra = {} if cls is KleidiAILinear else dict(dtype=dtype)
        try:
            return cls.from_gptq(t["qweight"], t.get("qzeros"), t["scales"], t.get("g_idx"), bias,
                                 spec.bits, spec.group_size, spec.desc_act, spec.sym,
                                 spec.checkpoint_format, **extra)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from e
    if "qzeros" not in t:
        raise ValueError(f"{where}: an AWQ layer needs qzeros, the checkpoint has none")
    try:
        if cls is KleidiAILinear:
            return cls.from_awq(t["qweight"], t["qzeros"], t["scales"], bias, spec.group_size)
        return cls.from_awq(t["qweight"], t["qzeros"], t["scales"], bias, spec.group_size, dtype)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from e


_LAYER_TENSORS = ("qweight", "qzeros", "scales", "g_idx", "bias")


def load_quantized(model: nn.Module, checkpoint: Union[str, dict], quantization_config=None,
                   kernel: str = "marlin", dtype: Optional[torch.dtype] = None,
                   strict: bool = True) -> nn.Module:
    """Load a GPTQ/AWQ checkpoint into ``model``, replacing its quantized Linear layers.

    Args:
        model: the float model (e.g. ``AutoModelForCausalLM.from_config(config)``); modified in
            place and returned. Its non-quantized tensors (embeddings, norms, ``lm_head``)
            are loaded from the checkpoint too.
        checkpoint: a directory of ``*.safetensors`` files (with ``config.json``), one file,
            or a state dict.
        quantization_config: dict / ``GPTQConfig`` / ``AwqConfig``; default: the model
            config's ``quantization_config``, else the checkpoint directory's.
        kernel: ``"marlin"`` (:class:`MarlinLinear`, every format), ``"awq"``
            (:class:`AWQLinear`: AWQ, GPTQ without act-order) or ``"kleidiai"``
            (:class:`KleidiAILinear`: symmetric GPTQ without act-order, CPU).
        dtype: compute dtype of the quantized layers (float16/bfloat16); default the model's
            if it is 16-bit, else the checkpoint's scales' (scales are converted once, here).
        strict: every checkpoint tensor must be used and every model tensor loaded.

    The parsed config is kept as ``model.w4kernels_quantization`` for :func:`save_quantized`.
    """
    if kernel not in KERNELS:
        raise ValueError(f"load_quantized: kernel must be one of {sorted(KERNELS)}, got {kernel!r}")
    if isinstance(checkpoint, dict):
        state, file_config = dict(checkpoint), None
    else:
        state, file_config = read_checkpoint(checkpoint)
    if quantization_config is None:
        quantization_config = getattr(getattr(model, "config", None), "quantization_config", None)
    if quantization_config is None:
        quantization_config = file_config
    if quantization_config is None:
        raise ValueError("load_quantized: no quantization_config (pass one, or load from a "
                         "directory whose config.json has it)")
    spec = parse_quantization_config(quantization_config)
    if dtype is None:
        params = [p for p in model.parameters() if p.is_floating_point()]
        if params and params[0].dtype in (torch.float16, torch.bfloat16):
            dtype = params[0].dtype
    targets = [(name, mod) for name, mod in model.named_modules()
               if isinstance(mod, nn.Linear) and f"{name}.qweight" in state]
    for name, linear in targets:
        t = {k: state.pop(f"{name}.{k}") for k in _LAYER_TENSORS if f"{name}.{k}" in state}
        new = _build(kernel, spec, t, dtype, f"load_quantized: layer {name!r}")
        if (new.in_features, new.out_features) != (linear.in_features, linear.out_features):
            raise ValueError(f"load_quantized: layer {name!r} is {linear.in_features} -> "
                             f"{linear.out_features} in the model but {new.in_features} -> "
                             f"{new.out_features} in the checkpoint")
        model.set_submodule(name, new.to(linear.weight.device))
    leftover = sorted(k for k in state if k.endswith(".qweight"))
    if strict and leftover:
        raise ValueError(f"load_quantized: quantized tensors with no nn.Linear of that name in the "
                         f"model: {leftover[:5]}")
    result = model.load_state_dict(state, strict=False)
    replaced = tuple(f"{name}." for name, _ in targets)  # their buffers were set from the layer
    loaded = set(state)
    missing = [k for k in result.missing_keys
               if not k.startswith(replaced) and not (_aliases(model, k) & loaded)]
    if strict and (missing or result.unexpected_keys):
        raise ValueError(f"load_quantized: the checkpoint does not match the model: missing "
                         f"{missing[:8]}, unexpected {result.unexpected_keys[:8]}")
    model.w4kernels_quantization = spec
    return model


def _aliases(model: nn.Module, key: str) -> set:
    """The other names of the tensor ``key`` (tied weights: a checkpoint stores one of them,
    e.g. ``embed_tokens.weight`` for a tied ``lm_head.weight``)."""
    tensors = dict(model.named_parameters(remove_duplicate=False))
    t = tensors.get(key)
    return set() if t is None else {k for k, v in tensors.items() if v is t and k != key}


def _infer_spec(model: nn.Module) -> QuantizationSpec:
    mods = [m for m in model.modules() if isinstance(m, (MarlinLinear, AWQLinear))]
    if not mods:
        raise ValueError("save_quantized: the model has no MarlinLinear / AWQLinear layer")
    sizes = {m.group_size for m in mods}
    if len(sizes) > 1:
        raise ValueError(f"save_quantized: the layers use different group sizes {sorted(sizes)}, "
                         f"which one quantization_config cannot describe")
    if all(isinstance(m, AWQLinear) for m in mods):
        return QuantizationSpec("awq", group_size=sizes.pop(), sym=False)
    marlin = [m for m in mods if isinstance(m, MarlinLinear)]
    return QuantizationSpec("gptq", group_size=sizes.pop(),
                            desc_act=any(m.act_order for m in marlin),
                            sym=not any(m.zero_points for m in mods),
                            checkpoint_format="gptq" if not any(m.zero_points for m in mods)
                            else "gptq_v2")


def quantized_state_dict(model: nn.Module, spec: QuantizationSpec) -> dict:
    """``model.state_dict()`` with every quantized layer's tensors in the checkpoint format of
    ``spec`` (all on the CPU)."""
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    for name, mod in model.named_modules():
        if isinstance(mod, KleidiAILinear):
            raise ValueError(f"save_quantized: layer {name!r} is a KleidiAILinear, which has no "
                             f"GPTQ/AWQ checkpoint form")
        if not isinstance(mod, (MarlinLinear, AWQLinear)):
            continue
        for k in list(state):
            if k.startswith(f"{name}.") and "." not in k[len(name) + 1:]:
                del state[k]
        if spec.quant_method == "awq":
            tensors = mod.to_awq()
        elif isinstance(mod, AWQLinear):
            raise ValueError(f"save_quantized: layer {name!r} is an AWQLinear; save it with "
                             f"quant_method 'awq'")
        else:
            tensors = mod.to_gptq(spec.checkpoint_format)
        state.update({f"{name}.{k}": v.contiguous() for k, v in tensors.items()})
    return state


def save_quantized(model: nn.Module, directory: str, quantization_config=None) -> None:
    """Write ``model`` as a GPTQ/AWQ checkpoint: ``directory/model.safetensors`` and
    ``directory/config.json`` (the model config's fields when it has a transformers config,
    plus ``quantization_config``).

    ``quantization_config``: default the one the model was loaded with
    (``model.w4kernels_quantization``), else inferred from the modules (AWQ when every layer
    is an :class:`AWQLinear`; GPTQ otherwise, ``gptq_v2`` when there are zero points, which
    the ``gptq`` convention cannot store when a zero point is 0).
    """
    from safetensors.torch import save_file

    if quantization_config is not None:
        spec = parse_quantization_config(quantization_config)
    else:
        spec = getattr(model, "w4kernels_quantization", None) or _infer_spec(model)
    state = quantized_state_dict(model, spec)
    seen = set()
    for k in list(state):  # tied weights: stored once, as transformers does (safetensors
        v = state[k]       # refuses tensors sharing memory); load_quantized re-ties them
        key = (v.untyped_storage().data_ptr(), v.storage_offset(), tuple(v.shape), v.dtype)
        if v.numel() and key in seen:
            del state[k]
        seen.add(key)
    os.makedirs(directory, exist_ok=True)
    save_file(state, os.path.join(directory, "model.safetensors"), metadata={"format": "pt"})
    config = {}
    model_config = getattr(model, "config", None)
    if model_config is not None and hasattr(model_config, "to_dict"):
        config = model_config.to_dict()
    config["quantization_config"] = spec.to_config()
    with open(os.path.join(directory, "config.json"), "w") as fh:
        json.dump(config, fh, indent=2, default=str)
