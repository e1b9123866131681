"""Where the GPU benchmarks run: on the GPU, or, with ``--simt``, on the CPU under the SIMT
emulator (tiny shapes: that checks the script itself, its timings mean nothing)."""

import os
import sys
from typing import NamedTuple, Optional

import torch


class Target(NamedTuple):
    device: str  # "cuda", or "cpu" under the emulator
    namespace: str  # torch.ops namespace of the kernels: w4kernels or w4kernels_simt
    w4kernels: object  # the imported package


def import_w4kernels():
    """The package of this checkout (benchmarks run from a source tree, built in place)."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import w4kernels
    return w4kernels


def choose(script: str, simt: bool):
    """A Target, or the exit status after printing why there is none: 0 without a GPU (nothing
    to measure here), 1 when the build lacks the kernels asked for."""
    if not simt and not torch.cuda.is_available():
        print(f"{script}: no CUDA GPU visible (torch.cuda.is_available() is False); nothing to "
              "benchmark. Run it on a GPU machine, or pass --simt to exercise the script under "
              "the emulator.")
        return 0
    w4kernels = import_w4kernels()
    if simt and not w4kernels.HAS_SIMT:
        print(f"{script}: w4kernels._simt was not built (W4K_SIMT=0)")
        return 1
    if not simt and not w4kernels.build_info()["cuda_kernels"]:
        print(f"{script}: this w4kernels build has no CUDA kernels; rebuild with "
              "W4K_CUDA=1 python setup.py build_ext --inplace")
        return 1
    return Target("cpu", "w4kernels_simt", w4kernels) if simt else Target("cuda", "w4kernels",
                                                                          w4kernels)
