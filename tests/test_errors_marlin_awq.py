"""Bad input to marlin_repack, awq_marlin_repack, awq_dequantize and awq_gemm: every class gets
a clear error naming the argument, the expectation and what was passed."""

import pytest
import torch

from w4kernels import ops

I32 = torch.int32
CPU_KEYS = torch._C.DispatchKeySet("CPU")


def _words(*shape):
    return torch.zeros(shape, dtype=I32)


def _cpu_kernel(name):
    """Call the CPU kernel itself, whatever devices the arguments are on (to test its device
    checks without a GPU: normal dispatch would route meta tensors to the fake)."""
    op = getattr(torch.ops.w4kernels, name).default
    return lambda *args: op.redispatch(CPU_KEYS, *args)


# ---- marlin_repack ----------------------------------------------------------------------------

REPACK_CASES = [
    # (description, args, expected message regex)
    ("num_bits", (_words(16, 64), None, 128, 64, 8), r"num_bits must be 4 .*got 8"),
    ("size_k multiple", (_words(2, 64), None, 24, 64, 4), r"size_k must be a multiple of 16, got 24"),
    ("size_n multiple", (_words(16, 96), None, 128, 96, 4), r"size_n must be a multiple of 64, got 96"),
    ("size_k empty", (_words(0, 64), None, 0, 64, 4), r"size_k must be positive, got 0"),
    ("dtype", (torch.zeros(16, 64, dtype=torch.int64), None, 128, 64, 4),
     r"b_q_weight must have dtype Int, got Long"),
    ("rank", (_words(16 * 64), None, 128, 64, 4), r"b_q_weight must be a 2-D tensor, got 1-D"),
    ("shape", (_words(8, 64), None, 128, 64, 4),
     r"b_q_weight must have shape \[16, 64\], got \[8, 64\]"),
    ("non-contiguous", (_words(64, 16).t(), None, 128, 64, 4), r"b_q_weight must be contiguous"),
    ("perm dtype", (_words(16, 64), torch.zeros(128, dtype=torch.int64), 128, 64, 4),
     r"perm must have dtype Int, got Long"),
    ("perm length", (_words(16, 64), torch.zeros(100, dtype=I32), 128, 64, 4),
     r"perm must have shape \[128\], got \[100\]"),
    ("perm range", (_words(16, 64), torch.full((128,), 128, dtype=I32), 128, 64, 4),
     r"perm values must lie in \[0, 128\), got perm\[0\] = 128"),
    ("perm negative", (_words(16, 64), torch.full((128,), -1, dtype=I32), 128, 64, 4),
     r"perm values must lie in \[0, 128\), got perm\[0\] = -1"),
    ("perm not a permutation", (_words(16, 64), torch.zeros(128, dtype=I32), 128, 64, 4),
     r"perm must be a permutation of \[0, 128\), got perm\[0\] = perm\[1\] = 0"),
]


@pytest.mark.parametrize("args,match", [pytest.param(a, m, id=d) for d, a, m in REPACK_CASES])
def test_marlin_repack_errors(args, match):
    with pytest.raises(RuntimeError, match=r"marlin_repack: " + match):
        ops.marlin_repack(*args)


def test_marlin_repack_wrong_device():
    with pytest.raises(RuntimeError, match=r"marlin_repack: b_q_weight must be on a cpu device, "
                                           r"got meta"):
        _cpu_kernel("marlin_repack")(_words(16, 64).to("meta"), None, 128, 64, 4)


def test_marlin_repack_mixed_devices():
    perm = torch.zeros(128, dtype=I32, device="meta")
    with pytest.raises(RuntimeError, match=r"marlin_repack: perm must be on the same device as "
                                           r"b_q_weight \(cpu\), got meta"):
        _cpu_kernel("marlin_repack")(_words(16, 64), perm, 128, 64, 4)
    # Through the dispatcher the meta perm reaches the Meta kernel: the CPU kernel's message.
    with pytest.raises(RuntimeError, match=r"marlin_repack: perm must be on the same device as "
                                           r"b_q_weight \(cpu\), got meta"):
        ops.marlin_repack(_words(16, 64), perm, 128, 64)


AWQ_REPACK_CASES = [
    ("num_bits", (_words(128, 8), 128, 64, 2), r"num_bits must be 4"),
    ("size_n multiple", (_words(128, 4), 128, 32, 4), r"size_n must be a multiple of 64, got 32"),
    ("shape", (_words(64, 8), 128, 64, 4), r"b_q_weight must have shape \[128, 8\], got \[64, 8\]"),
    ("dtype", (torch.zeros(128, 8, dtype=torch.uint8), 128, 64, 4),
     r"b_q_weight must have dtype Int, got Byte"),
]


@pytest.mark.parametrize("args,match", [pytest.param(a, m, id=d) for d, a, m in AWQ_REPACK_CASES])
def test_awq_marlin_repack_errors(args, match):
    with pytest.raises(RuntimeError, match=r"awq_marlin_repack: " + match):
        ops.awq_marlin_repack(*args)


# ---- awq_dequantize / awq_gemm ----------------------------------------------------------------

H = torch.float16


def _awq(size_k=64, size_n=64, groups=2, dtype=H):
    return _words(size_k, size_n // 8), torch.ones(groups, size_n, dtype=dtype), _words(groups, size_n // 8)


AWQ_CASES = [
    ("qweight dtype", lambda q, s, z: (q.float(), s, z), r"qweight must have dtype Int, got Float"),
    ("scales dtype", lambda q, s, z: (q, s.float(), z),
     r"scales must have dtype float16 or bfloat16, got Float"),
    ("qzeros dtype", lambda q, s, z: (q, s, z.long()), r"qzeros must have dtype Int, got Long"),
    ("qweight rank", lambda q, s, z: (q.flatten(), s, z), r"qweight must be a 2-D tensor, got 1-D"),
    ("scales columns", lambda q, s, z: (q, s[:, :32], z),
     r"scales must have N = 8 \* qweight.size\(1\) = 64 columns, got shape \[2, 32\]"),
    ("groups divide K", lambda q, s, z: (q, torch.ones(3, 64, dtype=H), _words(3, 8)),
     r"scales.size\(0\) \(the number of groups\) must divide K = qweight.size\(0\) = 64, got 3"),
    ("qzeros groups", lambda q, s, z: (q, s, _words(1, 8)),
     r"scales and qzeros must have the same number of groups \(size\(0\)\), got scales "
     r"\[2, 64\] and qzeros \[1, 8\]"),
    ("scales groups", lambda q, s, z: (q, s[:1].contiguous(), z),  # blames neither alone
     r"scales and qzeros must have the same number of groups \(size\(0\)\), got scales "
     r"\[1, 64\] and qzeros \[2, 8\]"),
    ("qzeros columns", lambda q, s, z: (q, s, _words(2, 4)),
     r"qzeros must have shape \[2, 8\], got \[2, 4\]"),
    ("empty", lambda q, s, z: (_words(0, 8), s, z), r"qweight must be non-empty \[K, N/8\]"),
    ("non-contiguous", lambda q, s, z: (q, torch.ones(64, 2, dtype=H).t(), z),
     r"scales must be contiguous"),
]


@pytest.mark.parametrize("make,match", [pytest.param(f, m, id=d) for d, f, m in AWQ_CASES])
def test_awq_dequantize_errors(make, match):
    with pytest.raises(RuntimeError, match=r"awq_dequantize: " + match):
        ops.awq_dequantize(*make(*_awq()))


@pytest.mark.parametrize("make,match", [pytest.param(f, m, id=d) for d, f, m in AWQ_CASES])
def test_awq_gemm_weight_errors(make, match):
    """The op's own checks (the wrapper reports an x/scales dtype mismatch before the op:
    tests/test_vllm_dropin.py)."""
    x = torch.zeros(2, 64, dtype=H)
    with pytest.raises(RuntimeError, match=r"awq_gemm: " + match):
        torch.ops.w4kernels.awq_gemm(x, *make(*_awq()), 8)


AWQ_GEMM_CASES = [
    ("x dtype", torch.zeros(2, 64, dtype=torch.bfloat16), 8,
     r"x must have the dtype of scales \(Half\), got BFloat16"),
    ("x rank", torch.zeros(2, 1, 64, dtype=H), 8, r"x must be a 2-D tensor, got 3-D"),
    ("x columns", torch.zeros(2, 32, dtype=H), 8,
     r"x must have K = qweight.size\(0\) = 64 columns, got shape \[2, 32\]"),
    ("x column stride", torch.zeros(64, 2, dtype=H).t(), 8, r"x must have unit stride along K"),
    ("split_k_iters", torch.zeros(2, 64, dtype=H), 0, r"split_k_iters must lie in \[1, 32\], got 0"),
]


@pytest.mark.parametrize("x,split,match", [pytest.param(x, s, m, id=d) for d, x, s, m in AWQ_GEMM_CASES])
def test_awq_gemm_errors(x, split, match):
    with pytest.raises(RuntimeError, match=r"awq_gemm: " + match):
        torch.ops.w4kernels.awq_gemm(x, *_awq(), split)


def test_awq_wrong_and_mixed_devices():
    q, s, z = _awq()
    with pytest.raises(RuntimeError, match=r"awq_dequantize: qweight must be on a cpu device, got meta"):
        _cpu_kernel("awq_dequantize")(q.to("meta"), s.to("meta"), z.to("meta"), 0, 0, 0)
    with pytest.raises(RuntimeError, match=r"awq_dequantize: scales must be on the same device as "
                                           r"qweight \(cpu\), got meta"):
        _cpu_kernel("awq_dequantize")(q, s.to("meta"), z, 0, 0, 0)
    with pytest.raises(RuntimeError, match=r"awq_gemm: x must be on the same device as qweight"):
        _cpu_kernel("awq_gemm")(torch.zeros(2, 64, dtype=H, device="meta"), q, s, z, 8)
    # Through the dispatcher a meta argument reaches the Meta kernel: the CPU kernel's message.
    with pytest.raises(RuntimeError, match=r"awq_gemm: x must be on the same device as qweight "
                                           r"\(cpu\), got meta"):
        ops.awq_gemm(torch.zeros(2, 64, dtype=H, device="meta"), q, s, z, 8)


# ---- the emulator build reports the same errors -------------------------------------------------


def _message(fn, *args):
    try:
        fn(*args)
    except RuntimeError as e:
        return str(e).split("\n")[0]
    return None


@pytest.mark.parametrize("name,args", [pytest.param("marlin_repack", a, id=d) for d, a, _ in REPACK_CASES]
                         + [pytest.param("awq_marlin_repack", a, id="awq-" + d) for d, a, _ in AWQ_REPACK_CASES]
                         + [pytest.param("awq_dequantize", (*f(*_awq()), 0, 0, 0), id="deq-" + d)
                            for d, f, _ in AWQ_CASES]
                         + [pytest.param("awq_gemm", (torch.zeros(2, 64, dtype=H), *f(*_awq()), 8),
                                         id="gemm-" + d) for d, f, _ in AWQ_CASES]
                         + [pytest.param("awq_gemm", (x, *_awq(), s), id="gemm-" + d)
                            for d, x, s, _ in AWQ_GEMM_CASES])
def test_simt_errors_match_cpu(name, args):
    """The CUDA bindings share the check functions; the emulator build proves it here."""
    import w4kernels

    if not w4kernels.HAS_SIMT:
        pytest.skip("w4kernels._simt was not built (W4K_SIMT=0)")
    cpu = _message(getattr(torch.ops.w4kernels, name), *args)
    simt = _message(getattr(torch.ops.w4kernels_simt, name), *args)
    assert cpu is not None and cpu == simt
