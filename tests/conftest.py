"""Shared fixtures: the backends every numerical test runs on.

* ``cpu``:  the C++ CPU kernels, ``torch.ops.w4kernels.*`` on CPU tensors.
* ``simt``: the CUDA kernels compiled for the host and run lane by lane under the SIMT
  emulator, ``torch.ops.w4kernels_simt.*`` on CPU tensors.
* ``cuda``: the CUDA kernels on a real GPU, ``torch.ops.w4kernels.*`` on CUDA tensors.
"""

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

import w4kernels  # noqa: E402


class Backend:
    def __init__(self, name: str, namespace: str, device: str):
        self.name, self.namespace, self.device = name, namespace, device

    def op(self, name: str):
        return getattr(getattr(torch.ops, self.namespace), name)

    def has(self, name: str) -> bool:
        key = "CUDA" if self.device == "cuda" else "CPU"
        return torch._C._dispatch_has_kernel_for_dispatch_key(f"{self.namespace}::{name}", key)

    def __repr__(self):
        return self.name


BACKENDS = {
    "cpu": Backend("cpu", "w4kernels", "cpu"),
    "simt": Backend("simt", "w4kernels_simt", "cpu"),
    "cuda": Backend("cuda", "w4kernels", "cuda"),
}


def backend_or_skip(name: str, op: str) -> Backend:
    b = BACKENDS[name]
    if name == "cuda" and not torch.cuda.is_available():
        pytest.skip("cuda backend: no GPU on this machine (the kernels run under 'simt' instead)")
    if name == "simt" and not w4kernels.HAS_SIMT:
        pytest.skip("simt backend: w4kernels._simt was not built (W4K_SIMT=0)")
    if not b.has(op):
        pytest.skip(f"{name} backend has no kernel for {op}")
    return b


def cpuinfo_field(name: str):
    """The value of the first `name` line of /proc/cpuinfo (None where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, sep, value = line.partition(":")
                if sep and key.strip() == name:
                    return value.strip()
    except OSError:
        pass
    return None


def cpu_flags() -> set:
    """The CPU feature flags of /proc/cpuinfo (empty where there is none)."""
    return set((cpuinfo_field("flags") or "").split())
