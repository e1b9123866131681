"""Messages that must name what the caller actually passed (reliability issue, item 6): the
rejected W4K_KLEIDIAI_ISA value, and packed_weights (not an internal argument name) for a
dyn_quant_matmul_4bit buffer on the wrong device."""

import pytest
import torch

from w4kernels import ops


def _packed(n=16, k=64):
    gen = torch.Generator().manual_seed(1)
    weights = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=gen)
    scales = torch.rand(n, generator=gen) + 0.5
    return ops.dyn_quant_pack_4bit_weight(weights, scales, None, k, k, n)


def test_bad_isa_environment_value_is_named(monkeypatch):
    packed = _packed()
    monkeypatch.setenv("W4K_KLEIDIAI_ISA", "bogus")
    with pytest.raises(RuntimeError, match=r"dyn_quant_matmul_4bit: W4K_KLEIDIAI_ISA='bogus' "
                                           r"\(the environment, read for isa='auto'\) cannot be "
                                           r"used: expected one of auto, scalar"):
        ops.dyn_quant_matmul_4bit(torch.randn(2, 64), packed, 64, 64, 16)


def test_bad_isa_argument_is_named():
    with pytest.raises(RuntimeError, match=r"dyn_quant_matmul_4bit: isa 'avx9' cannot be used"):
        ops.dyn_quant_matmul_4bit(torch.randn(2, 64), _packed(), 64, 64, 16, isa="avx9")


def test_packed_weights_on_the_wrong_device_is_named():
    op = torch.ops.w4kernels.dyn_quant_matmul_4bit.default
    with pytest.raises(RuntimeError, match=r"dyn_quant_matmul_4bit: packed_weights must be on a "
                                           r"cpu device, got meta"):
        op.redispatch(torch._C.DispatchKeySet(torch._C.DispatchKey.CPU), torch.randn(2, 64),
                      _packed().to("meta"), 64, 64, 16, "auto")


def test_fake_lhs_quant_pack_rejects_3d_like_the_kernel():
    """Under FakeTensorMode / torch.compile the fake runs: same message as the CPU kernel."""
    x = torch.randn(2, 3, 64)
    for lhs in (x, x.to("meta")):
        with pytest.raises(RuntimeError, match=r"lhs_quant_pack_qai8dxp_f32: lhs must be a 2-D "
                                               r"tensor, got 3-D"):
            ops.lhs_quant_pack_qai8dxp_f32(lhs)


@pytest.mark.parametrize("name", ["matmul_clamp_f32_qai8dxp_qsi4cxp",
                                  "matmul_clamp_f32_qai8dxp_qsi4c32p"])
def test_fake_matmul_device_error_names_the_op(name):
    """A meta/CPU mix reaches the Meta kernel, which fails as the CPU kernel does: naming the op
    the caller called (not an internal name) and the argument."""
    op = getattr(torch.ops.w4kernels, name)
    per_block = name.endswith("c32p")
    rhs_size = (ops.rhs_packed_size_qsi4c32p(8, 64, 32) if per_block
                else ops.rhs_packed_size_qsi4cxp(8, 64))
    lhs = torch.zeros(ops.lhs_packed_size_qai8dxp(1, 64), dtype=torch.uint8, device="meta")
    rhs = torch.zeros(rhs_size, dtype=torch.uint8)
    args = (lhs, rhs, 1, 8, 64) + ((32,) if per_block else ())
    with pytest.raises(RuntimeError, match=rf"{name}: lhs_packed must be on a cpu device, got meta"):
        op(*args)
