"""Issue 8, item 2: KleidiAI buffers have no header, so a buffer packed under other parameters
with the same byte count passes every size check. The matmuls read the per-row metadata a
packer writes (csrc/kleidiai_checks.h, check_lhs_packed_values / check_rhs_packed_values) and
reject what no packer produces; the packers refuse non-finite scales and biases so that a
non-finite value in a buffer always means a misread one. Sizes below are derived from the size
queries (and asserted equal: each test is about a collision)."""

import pytest
import torch

from w4kernels import ops, reference

OPS = torch.ops.w4kernels


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _weights(n, k, seed=0):
    return torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=_gen(seed))


def test_issue_per_channel_buffer_passed_as_block_64():
    """n = 24, k = 128: per-channel and per-block (bl = 64) buffers are both 1824 bytes; the
    per-channel one read as per-block returned +-3.4e38."""
    n, k = 24, 128
    assert ops.rhs_packed_size_qsi4cxp(n, k) == ops.rhs_packed_size_qsi4c32p(n, k, 64) == 1824
    packed = ops.dyn_quant_pack_4bit_weight(_weights(n, k), torch.rand(n, generator=_gen(1)) + 0.5,
                                            None, k, k, n)
    x = torch.randn(3, k, generator=_gen(2))
    ops.dyn_quant_matmul_4bit(x, packed, k, k, n)  # its own parameters: fine
    with pytest.raises(RuntimeError, match=r"dyn_quant_matmul_4bit: packed_weights is not a "
                                           r"per-block qsi4c32p buffer packed for n=24, k=128, "
                                           r"bl=64, nr=8"):
        ops.dyn_quant_matmul_4bit(x, packed, 64, k, n)


def test_issue_lhs_packed_with_mr_4_passed_as_mr_1():
    m, n, k = 4, 8, 64
    assert ops.lhs_packed_size_qai8dxp(m, k, 4) == ops.lhs_packed_size_qai8dxp(m, k, 1)
    lhs = ops.lhs_quant_pack_qai8dxp_f32(torch.randn(m, k, generator=_gen(3)), 4)
    rhs = ops.rhs_pack_nxk_qsi4cxp_qs4cxs1s0(_weights(n, k), torch.ones(n), None, n, k)
    OPS.matmul_clamp_f32_qai8dxp_qsi4cxp(lhs, rhs, m, n, k, 4)
    with pytest.raises(RuntimeError, match=r"matmul_clamp_f32_qai8dxp_qsi4cxp: lhs_packed is not "
                                           r"a buffer packed for m=4, k=64, mr=1: row 0 holds"):
        OPS.matmul_clamp_f32_qai8dxp_qsi4cxp(lhs, rhs, m, n, k, 1)


def test_per_block_buffer_passed_as_per_channel():
    n, k = 24, 128
    scales = (torch.rand(n, 2, generator=_gen(4)) + 0.5).bfloat16()
    packed = ops.dyn_quant_pack_4bit_weight(_weights(n, k), scales, None, 64, k, n)
    with pytest.raises(RuntimeError, match=r"dyn_quant_matmul_4bit: packed_weights is not a "
                                           r"per-channel qsi4cxp buffer packed for n=24, k=128"):
        ops.dyn_quant_matmul_4bit(torch.randn(2, k), packed, k, k, n)


def test_rhs_packed_with_nr_8_passed_as_nr_1():
    """Found by the fuzzer: n = 8, k = 64 is 352 bytes for nr = 8 and for nr = 1."""
    n, k = 8, 64
    assert ops.rhs_packed_size_qsi4cxp(n, k, 8) == ops.rhs_packed_size_qsi4cxp(n, k, 1)
    rhs = ops.rhs_pack_nxk_qsi4cxp_qs4cxs1s0(_weights(n, k, 5), torch.rand(n) + 0.5, None, n, k)
    lhs = ops.lhs_quant_pack_qai8dxp_f32(torch.randn(2, k, generator=_gen(6)))
    with pytest.raises(RuntimeError, match=r"rhs_packed is not a per-channel qsi4cxp buffer "
                                           r"packed for n=8, k=64, nr=1"):
        OPS.matmul_clamp_f32_qai8dxp_qsi4cxp(lhs, rhs, 2, n, k, 1, 1)


@pytest.mark.parametrize("bl", [0, 32])
def test_every_legal_parameter_set_passes_its_own_buffer(bl):
    """The metadata checks accept what the packers write, including extreme weights (all -8 or
    all 7 give the rsum bounds), negative and tiny scales, padded rows and a partial K."""
    m, k = 5, 96 if bl == 0 else 128
    for n in (1, 13):
        for code in (0, 15, None):
            w = (torch.full((n, k // 2), code * 17, dtype=torch.uint8) if code is not None
                 else _weights(n, k, 7))
            for nr, kr, sr in ((8, 16, 2), (4, 8, 2), (16, 16, 2)):
                if bl == 0:
                    s = torch.rand(n, generator=_gen(8)) * 2 - 1
                    rhs = ops.rhs_pack_nxk_qsi4cxp_qs4cxs1s0(w, s * 1e-30, None, n, k, nr, kr, sr)
                else:
                    s = ((torch.rand(n, k // bl, generator=_gen(9)) * 2 - 1) * 1e-3).bfloat16()
                    rhs = ops.rhs_pack_nxk_qsi4c32p_qsu4c32s1s0(w, s, torch.randn(n), n, k, bl,
                                                                nr, kr, sr)
                for mr in (1, 4):
                    lhs = ops.lhs_quant_pack_qai8dxp_f32(
                        torch.cat([torch.zeros(1, k), torch.randn(m - 1, k, generator=_gen(10))]),
                        mr, kr, sr)
                    args = (lhs, rhs, m, n, k) + ((bl,) if bl else ()) + (mr, nr, kr, sr)
                    op = OPS.matmul_clamp_f32_qai8dxp_qsi4c32p if bl else \
                        OPS.matmul_clamp_f32_qai8dxp_qsi4cxp
                    assert op(*args).shape == (m, n)


@pytest.mark.parametrize("name,make", [
    ("scale", lambda n, k: (_weights(n, k), torch.tensor([1.0, float("nan")] * (n // 2)), None)),
    ("bias", lambda n, k: (_weights(n, k), torch.ones(n), torch.tensor([float("inf")] * n))),
])
def test_packers_refuse_non_finite_scale_and_bias(name, make):
    n, k = 8, 64
    with pytest.raises(RuntimeError, match=rf"rhs_pack_nxk_qsi4cxp_qs4cxs1s0: {name} must hold "
                                           rf"finite values .* got {name}.flatten\(\)\[\d\] = "):
        OPS.rhs_pack_nxk_qsi4cxp_qs4cxs1s0(*make(n, k), n, k)
    scales = torch.ones(n, 2).bfloat16()
    scales[3, 1] = float("-inf")
    with pytest.raises(RuntimeError, match=r"dyn_quant_pack_4bit_weight: scales_zeros must hold "
                                           r"finite values .* got "
                                           r"scales_zeros.flatten\(\)\[7\] = -inf"):
        ops.dyn_quant_pack_4bit_weight(_weights(n, k), scales, None, 32, k, n)


def test_quantizers_refuse_non_finite_activations():
    """Found by the fuzzer: a NaN or an infinity in a row made every code of the row garbage
    (the reference cannot even define it)."""
    x = torch.randn(3, 64, generator=_gen(11))
    x[2, 5] = float("nan")
    with pytest.raises(RuntimeError, match=r"lhs_quant_pack_qai8dxp_f32: lhs must hold finite "
                                           r"values .* got lhs\[2, 5\] = nan"):
        ops.lhs_quant_pack_qai8dxp_f32(x)
    packed = ops.dyn_quant_pack_4bit_weight(_weights(8, 64), torch.ones(8), None, 64, 64, 8)
    x[2, 5] = float("inf")
    with pytest.raises(RuntimeError, match=r"dyn_quant_matmul_4bit: inp must hold finite values "
                                           r".* got inp\[2, 5\] = inf"):
        ops.dyn_quant_matmul_4bit(x, packed, 64, 64, 8)


def test_the_checks_read_the_metadata_the_reference_defines():
    """The slots checked are the reference layout's metadata: corrupting one rsum (a value no
    packer writes) is caught, and the unpacked metadata of a good buffer satisfy the bounds."""
    n, k = 13, 100
    rhs = ops.rhs_pack_nxk_qsi4cxp_qs4cxs1s0(_weights(n, k, 12), torch.rand(n) + 0.1, None, n, k)
    meta = reference.kai_unpack_rhs(rhs, n, k)
    k_i = 128  # K rounded up to 32
    assert bool(((meta["rsum"] % 16 == 0) & (meta["rsum"] >= -128 * k_i)
                 & (meta["rsum"] <= 112 * k_i)).all())
    bad = rhs.clone()
    offset = 8 * k_i // 2 + 4 * 3  # nr-block 0, row 3's rsum
    bad[offset:offset + 4] = torch.tensor([1], dtype=torch.int32).view(torch.uint8)
    lhs = ops.lhs_quant_pack_qai8dxp_f32(torch.randn(2, k, generator=_gen(13)))
    with pytest.raises(RuntimeError, match=r"rhs_packed is not a per-channel qsi4cxp buffer .* "
                                           r"row 3 holds rsum 1,"):
        OPS.matmul_clamp_f32_qai8dxp_qsi4cxp(lhs, bad, 2, n, k)
