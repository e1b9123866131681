"""Operator-library properties: schemas, fakes and autograd registrations checked by
torch.library.opcheck, and the ops working under torch.compile(fullgraph=True)."""

import pytest
import torch

import w4kernels
from w4kernels import ops, quant, reference


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _awq_inputs(size_k=128, size_n=64, groups=2, dtype=torch.float16):
    g = _gen()
    qweight = torch.randint(-2**31, 2**31 - 1, (size_k, size_n // 8), dtype=torch.int32, generator=g)
    qzeros = torch.randint(-2**31, 2**31 - 1, (groups, size_n // 8), dtype=torch.int32, generator=g)
    scales = (torch.rand(groups, size_n, generator=g) * 0.01).to(dtype)
    return qweight, scales, qzeros


OPCHECK_CASES = {
    "marlin_repack": lambda: (torch.randint(-2**31, 2**31 - 1, (16, 128), dtype=torch.int32,
                                            generator=_gen()),
                              torch.randperm(128, generator=_gen()).to(torch.int32), 128, 128, 4),
    "marlin_repack_noperm": lambda: (torch.zeros(8, 64, dtype=torch.int32), None, 64, 64, 4),
    "awq_marlin_repack": lambda: (torch.randint(-2**31, 2**31 - 1, (64, 8), dtype=torch.int32,
                                                generator=_gen()), 64, 64, 4),
    "awq_dequantize": lambda: (*_awq_inputs(), 0, 0, 0),
    "awq_gemm": lambda: (torch.randn(3, 128, generator=_gen()).to(torch.bfloat16),
                         *_awq_inputs(dtype=torch.bfloat16), 8),
}


@pytest.mark.parametrize("name", sorted(OPCHECK_CASES))
def test_opcheck(name):
    op = getattr(torch.ops.w4kernels, name.replace("_noperm", ""))
    torch.library.opcheck(op, OPCHECK_CASES[name]())


def test_fakes_give_real_shapes():
    """The fake of every op agrees with the real kernel on shape, dtype and device."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    for name, make in OPCHECK_CASES.items():
        op = getattr(torch.ops.w4kernels, name.replace("_noperm", ""))
        args = make()
        real = op(*args)
        with FakeTensorMode() as mode:
            fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
            fake = op(*fake_args)
        assert (fake.shape, fake.dtype, fake.device) == (real.shape, real.dtype, real.device), name


def test_torch_compile_fullgraph():
    """A quantized Linear forward built from our ops compiles as one graph and matches eager."""
    g = _gen(1)
    w = torch.randn(256, 128, generator=g) * 0.05
    awq = quant.quantize_awq(w, 64, torch.float16)

    def forward(x):
        y = ops.awq_gemm(x, awq.qweight, awq.scales, awq.qzeros, 8)
        wd = ops.awq_dequantize(awq.qweight, awq.scales, awq.qzeros)
        return y, wd

    compiled = torch.compile(forward, fullgraph=True)
    x = torch.randn(4, 256, generator=g).to(torch.float16)
    for got, want in zip(compiled(x), forward(x)):
        assert torch.equal(got, want)


def test_torch_compile_repack():
    qweight = torch.randint(-2**31, 2**31 - 1, (32, 64), dtype=torch.int32, generator=_gen(2))
    perm = torch.randperm(256, generator=_gen(3)).to(torch.int32)
    fn = torch.compile(lambda q, p: ops.marlin_repack(q, p, 256, 64), fullgraph=True,
                       backend="eager")
    assert torch.equal(fn(qweight, perm), reference.marlin_repack(qweight, perm, 256, 64))


def test_build_info():
    info = w4kernels.build_info()
    assert info["torch"] == torch.__version__
    assert isinstance(info["cuda_kernels"], bool)


def test_cuda_kernels_built_when_toolkit_present():
    """CI must compile the CUDA kernels, not silently fall back to a CPU-only build: when torch
    is a CUDA build and nvcc is on this machine, the CUDA implementations must be registered
    (unless the CPU-only build was asked for with W4K_CUDA=0)."""
    import os
    import shutil

    if os.environ.get("W4K_CUDA") == "0":
        pytest.skip("CPU-only build requested with W4K_CUDA=0")
    if torch.version.cuda is None or shutil.which("nvcc") is None and not os.path.exists(
            "/usr/local/cuda/bin/nvcc"):
        pytest.skip("no CUDA toolkit or a CPU-only torch: the CPU-only build is expected")
    for op in ("marlin_repack", "awq_marlin_repack", "awq_dequantize"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"w4kernels::{op}", "CUDA"), op
