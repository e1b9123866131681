"""w4kernels: matrix multiplication with 4-bit weights (Marlin, AWQ and KleidiAI formats).

Importing the package loads the compiled operator library, so ``torch.ops.w4kernels.<op>``
is available, and registers the fake (meta) implementations used by ``torch.compile``.

* :mod:`w4kernels.ops`: typed, documented wrappers of every operator.
* :mod:`w4kernels.reference`: every operator in plain torch, the executable spec.
* :mod:`w4kernels.quant`: quantizers and packers that make real checkpoint tensors.
* :mod:`w4kernels.nn`: quantized Linear modules (``MarlinLinear``, ``AWQLinear``,
  ``KleidiAILinear``) and :func:`quantize_` (swap a model's Linear layers for them).
* :mod:`w4kernels.checkpoint`: load and save GPTQ / AWQ checkpoints (safetensors +
  ``quantization_config``) into a model.
* :mod:`w4kernels.vllm`: vLLM's ``_custom_ops`` signatures for the ops we implement
  (``from w4kernels import vllm as ops`` in place of ``from vllm import _custom_ops as ops``).
"""

import importlib.util

import torch

if importlib.util.find_spec(f"{__name__}._C") is None:
    # Without this check a source checkout that was never compiled fails with "cannot import
    # name '_C' from partially initialized module ... (most likely due to a circular import)".
    raise ImportError(
        f"w4kernels is not built: {__path__[0]} has no compiled w4kernels._C. Build it with "
        f"`bash scripts/install.sh` (from the source tree), or "
        f"`pip install --no-build-isolation -e .` with torch installed")

from . import _C  # noqa: E402,F401  (registers torch.ops.w4kernels.*)

try:  # the SIMT emulator build of the CUDA kernels (torch.ops.w4kernels_simt.*)
    from . import _simt  # noqa: F401

    HAS_SIMT = True
except ImportError:
    HAS_SIMT = False

from . import ops, quant, reference, vllm  # noqa: E402,F401
from . import checkpoint, nn  # noqa: E402,F401
from .checkpoint import load_quantized, save_quantized  # noqa: E402,F401
from .nn import (AWQConfig, AWQMarlinConfig, GPTQMarlinConfig, KleidiAIConfig,  # noqa: E402,F401
                 quantize_)

__all__ = ["ops", "quant", "reference", "vllm", "nn", "checkpoint", "quantize_",
           "load_quantized", "save_quantized", "GPTQMarlinConfig", "AWQMarlinConfig",
           "AWQConfig", "KleidiAIConfig", "build_info", "HAS_SIMT"]


def _has_kernel(op: str, key: str) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(f"w4kernels::{op}", key)


def build_info() -> dict:
    """What this build contains: torch version, whether CUDA kernels and the emulator are in."""
    return {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_kernels": _has_kernel("marlin_repack", "CUDA"),
        "simt_emulator": HAS_SIMT,
        "cuda_available": torch.cuda.is_available(),
    }
