"""Loader for the conformance vectors in tests/data (format: tests/data/GOLDEN_README.md).

The vectors were produced by the upstream implementations (vLLM, AutoAWQ, IST-DASLab Marlin,
KleidiAI); they are the independent source every packing test compares against, byte for byte.
"""

import functools
import json
import os

import numpy as np
import torch

DATA = os.path.join(os.path.dirname(__file__), "data")

_DTYPES = {
    "int32": (np.int32, torch.int32),
    "uint8": (np.uint8, torch.uint8),
    "float16": (np.float16, torch.float16),
    "bfloat16": (np.uint16, torch.bfloat16),  # stored as raw 16-bit patterns
    "float32": (np.float32, torch.float32),
}


def to_tensor(spec: dict) -> torch.Tensor:
    """A golden tensor ({dtype, shape, hex}) as a CPU torch tensor with the exact stored bits."""
    np_dtype, torch_dtype = _DTYPES[spec["dtype"]]
    raw = bytes.fromhex(spec["hex"])
    arr = np.frombuffer(raw, dtype=np_dtype).copy().reshape(spec["shape"])
    t = torch.from_numpy(arr)
    if spec["dtype"] == "bfloat16":
        t = t.view(torch.int16).view(torch.bfloat16)
    return t


@functools.lru_cache(maxsize=None)
def load(family: str) -> list:
    """All cases of tests/data/<family>.json, tensors decoded."""
    with open(os.path.join(DATA, f"{family}.json")) as f:
        doc = json.load(f)
    cases = []
    for case in doc["cases"]:
        decoded = dict(case)
        for part in ("inputs", "expected", "aux"):
            decoded[part] = {
                k: to_tensor(v) if isinstance(v, dict) and "hex" in v else v
                for k, v in (case.get(part) or {}).items()
            }
        cases.append(decoded)
    return cases


def cases(family: str, op: str) -> list:
    """Cases of one op, as pytest params with the case id as test id."""
    import pytest

    return [pytest.param(c, id=c["id"].split("/", 1)[1]) for c in load(family) if c["op"] == op]


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-exact equality (so -0.0 != +0.0 and NaN payloads count)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return bytes(a.contiguous().view(torch.uint8).flatten().numpy()) == bytes(
        b.contiguous().view(torch.uint8).flatten().numpy())
