"""The Meta kernels (csrc/meta.cpp, csrc/meta_kernels.h) are the ops' only fakes, and they run
the kernels' own argument checks: every error-path case of the CPU kernels gives the same
message on meta tensors, in both namespaces; a meta tensor mixed with CPU ones fails as the CPU
kernel fails; the value checks (host-only by design) are listed by name; meta outputs have the
real op's shape and dtype; torch.compile(fullgraph=True) traces dynamic batch sizes and rejects a
bad argument while tracing, with the kernel's message."""

import pytest
import torch

import test_errors_marlin_awq as ma
import test_w4a16_gemm as w4
import w4kernels
from w4kernels import ops

NAMESPACES = ["w4kernels"] + (["w4kernels_simt"] if w4kernels.HAS_SIMT else [])
CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)


def _message(fn, *args, **kwargs):
    """First line of the RuntimeError fn raises, or None when it returns."""
    try:
        fn(*args, **kwargs)
    except RuntimeError as e:
        return str(e).split("\n")[0]
    return None


def _meta(x):
    """x on the meta device with the same sizes and strides (Tensor.to('meta') would make an
    expanded or overlapping view contiguous and hide a contiguity error)."""
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    return x


def _cpu_kernel(ns, name):
    op = getattr(getattr(torch.ops, ns), name).default
    return lambda *args, **kwargs: op.redispatch(CPU_KEYS, *args, **kwargs)


def _op(ns, name):
    return getattr(getattr(torch.ops, ns), name)


# ---- Marlin repacks, awq_dequantize, awq_gemm: the error tables of test_errors_marlin_awq --------

# Checks that read tensor values: the CPU and SIMT bindings run them on the data, a Meta kernel
# has none (and CUDA would need a device sync): there they are the caller's contract.
MARLIN_AWQ_VALUE_CASES = {"perm range", "perm negative", "perm not a permutation"}

MARLIN_AWQ_CASES = (
    [pytest.param("marlin_repack", a, d, id=d) for d, a, _ in ma.REPACK_CASES]
    + [pytest.param("awq_marlin_repack", a, d, id="awq-" + d) for d, a, _ in ma.AWQ_REPACK_CASES]
    + [pytest.param("awq_dequantize", (*f(*ma._awq()), 0, 0, 0), d, id="deq-" + d)
       for d, f, _ in ma.AWQ_CASES]
    + [pytest.param("awq_gemm", (torch.zeros(2, 64, dtype=ma.H), *f(*ma._awq()), 8), d,
                    id="gemm-" + d) for d, f, _ in ma.AWQ_CASES]
    + [pytest.param("awq_gemm", (x, *ma._awq(), s), d, id="gemm-" + d)
       for d, x, s, _ in ma.AWQ_GEMM_CASES])


@pytest.mark.parametrize("ns", NAMESPACES)
@pytest.mark.parametrize("name,args,case", MARLIN_AWQ_CASES)
def test_marlin_awq_meta_errors_match_cpu(ns, name, args, case):
    cpu = _message(_op("w4kernels", name), *args)
    assert cpu is not None and cpu.startswith(name + ": ")
    meta = _message(_op(ns, name), *map(_meta, args))
    if case in MARLIN_AWQ_VALUE_CASES:
        assert meta is None, "a value check cannot run on meta tensors"
    else:
        assert meta == cpu


# ---- w4a16_gemm: the BAD_INPUTS table of test_w4a16_gemm ---------------------------------------

W4A16_VALUE_CASES = {"perm_range", "perm_not_a_permutation", "g_idx_unsorted", "g_idx_range",
                     "workspace_dirty"}
W4A16_ARGS = ["a", "b_q_weight", "b_scales", "b_zeros", "g_idx", "perm", "workspace", "num_bits",
              "size_m", "size_n", "size_k", "is_k_full", "b_bias", "use_fp32_reduce"]


@pytest.mark.parametrize("ns", NAMESPACES)
@pytest.mark.parametrize("name", list(w4.BAD_INPUTS))
def test_w4a16_gemm_meta_errors_match_cpu(ns, name):
    case = w4._base()
    modify, _ = w4.BAD_INPUTS[name]
    modify(case)
    args = [case[k] for k in W4A16_ARGS]
    cpu = _message(_cpu_kernel("w4kernels", "w4a16_gemm"), *args)
    assert cpu is not None and cpu.startswith("w4a16_gemm: ")
    if name.endswith("_meta"):
        # One argument on meta, the rest on CPU: the dispatcher picks the Meta kernel, which
        # reports the mix exactly as the CPU kernel does.
        assert _message(_op(ns, "w4a16_gemm"), *args) == cpu
        return
    meta = _message(_op(ns, "w4a16_gemm"), *map(_meta, args))
    if name in W4A16_VALUE_CASES:
        assert meta is None, "a value check cannot run on meta tensors"
    else:
        assert meta == cpu


# ---- KleidiAI ops ------------------------------------------------------------------------------

N, K = 8, 64
OPS = torch.ops.w4kernels


def _u8(*shape):
    return torch.zeros(shape, dtype=torch.uint8)


def _packed_cx(n=N, k=K):
    return ops.rhs_pack_nxk_qsi4cxp_qs4cxs1s0(_u8(n, k // 2), torch.ones(n), None, n, k)


def _lhs(m=3, k=K, mr=1):
    return ops.lhs_quant_pack_qai8dxp_f32(torch.zeros(m, k), mr)


KAI_CASES = {  # description -> (op name, args, kwargs)
    "pack_cx rhs dtype": ("rhs_pack_nxk_qsi4cxp_qs4cxs1s0",
                          (_u8(N, 32).int(), torch.ones(N), None, N, K), {}),
    "pack_cx rhs strides": ("rhs_pack_nxk_qsi4cxp_qs4cxs1s0",
                            (_u8(32, N).t(), torch.ones(N), None, N, K), {}),
    "pack_cx scale shape": ("rhs_pack_kxn_qsi4cxp_qs4cxs1s0",
                            (_u8(K, 4), torch.ones(N + 1), None, N, K), {}),
    "pack_cx bias dtype": ("rhs_pack_nxk_qsi4cxp_qs4cxs1s0",
                           (_u8(N, 32), torch.ones(N), torch.ones(N).double(), N, K), {}),
    "pack_cx zero point": ("rhs_pack_nxk_qsi4cxp_qs4cxs1s0",
                           (_u8(N, 32), torch.ones(N), None, N, K, 8, 16, 2, 4), {}),
    "pack_cx n huge": ("rhs_pack_nxk_qsi4cxp_qs4cxs1s0",
                       (_u8(N, 32), torch.ones(N), None, 2**40, K), {}),
    "pack_c32 bl": ("rhs_pack_nxk_qsi4c32p_qsu4c32s1s0",
                    (_u8(N, 32), torch.ones(N, 2).bfloat16(), None, N, K, 48), {}),
    "pack_c32 scale dtype": ("rhs_pack_kxn_qsi4c32p_qsu4c32s1s0",
                             (_u8(K, 4), torch.ones(N, 2), None, N, K, 32), {}),
    "lhs 3-D": ("lhs_quant_pack_qai8dxp_f32", (torch.zeros(2, 3, K),), {}),
    "lhs dtype": ("lhs_quant_pack_qai8dxp_f32", (torch.zeros(2, K, dtype=torch.float16),), {}),
    "lhs column stride": ("lhs_quant_pack_qai8dxp_f32", (torch.zeros(K, 2).t(),), {}),
    "lhs mr huge": ("lhs_quant_pack_qai8dxp_f32", (torch.zeros(2, K), 2**31), {}),
    "matmul out_dtype": ("matmul_clamp_f32_qai8dxp_qsi4cxp", (_lhs(), _packed_cx(), 3, N, K),
                         {"out_dtype": torch.float16}),
    "matmul lhs size": ("matmul_clamp_f32_qai8dxp_qsi4cxp", (_lhs(), _packed_cx(), 4, N, K), {}),
    "matmul rhs size": ("matmul_clamp_f32_qai8dxp_qsi4c32p", (_lhs(), _packed_cx(), 3, N, K, 64),
                        {}),
    # Found by the fuzzer: bl <= 0 made the per-block op run the per-channel layout.
    "matmul c32p bl=0": ("matmul_clamp_f32_qai8dxp_qsi4c32p", (_lhs(), _packed_cx(), 3, N, K, 0),
                         {}),
    "matmul c32p bl=-1": ("matmul_clamp_f32_qai8dxp_qsi4c32p", (_lhs(), _packed_cx(), 3, N, K, -1),
                          {}),
    "matmul NaN clamp": ("matmul_clamp_f32_qai8dxp_qsi4cxp", (_lhs(), _packed_cx(), 3, N, K),
                         {"clamp_min": float("nan")}),
    "matmul isa": ("matmul_clamp_f32_qai8dxp_qsi4cxp", (_lhs(), _packed_cx(), 3, N, K),
                   {"isa": "avx9"}),
    "matmul k bound": ("matmul_clamp_f32_qai8dxp_qsi4cxp", (_lhs(), _packed_cx(), 3, N, 200000),
                       {}),
    "matmul lhs dtype": ("matmul_clamp_f32_qai8dxp_qsi4cxp",
                         (_lhs().view(torch.int8), _packed_cx(), 3, N, K), {}),
    "dyn pack block size": ("dyn_quant_pack_4bit_weight",
                            (_u8(N, 32), torch.ones(N, 2).bfloat16(), None, 48, K, N), {}),
    "dyn pack scales dtype": ("dyn_quant_pack_4bit_weight",
                              (_u8(N, 32), torch.ones(N, dtype=torch.float16), None, K, K, N), {}),
    "dyn pack scales shape": ("dyn_quant_pack_4bit_weight",
                              (_u8(N, 32), torch.ones(N, 4).bfloat16(), None, 32, K, N), {}),
    "dyn pack bias shape": ("dyn_quant_pack_4bit_weight",
                            (_u8(N, 32), torch.ones(N), torch.ones(N + 1), K, K, N), {}),
    "dyn matmul inp K": ("dyn_quant_matmul_4bit", (torch.zeros(2, 3, 32), _packed_cx(), K, K, N),
                         {}),
    "dyn matmul inp dtype": ("dyn_quant_matmul_4bit",
                             (torch.zeros(2, K, dtype=torch.float16), _packed_cx(), K, K, N), {}),
    "dyn matmul packed size": ("dyn_quant_matmul_4bit",
                               (torch.zeros(2, 128), _packed_cx(N, 128), 32, 128, N), {}),
    "dyn matmul k bound": ("dyn_quant_matmul_4bit",
                           (torch.zeros(2, 131104), _packed_cx(), 131104, 131104, N), {}),
}


@pytest.mark.parametrize("case", list(KAI_CASES))
def test_kleidiai_meta_errors_match_cpu(case):
    name, args, kwargs = KAI_CASES[case]
    cpu = _message(_op("w4kernels", name), *args, **kwargs)
    assert cpu is not None and cpu.startswith(name + ": ")
    assert _message(_op("w4kernels", name), *map(_meta, args), **kwargs) == cpu


def test_kleidiai_meta_cpu_mix_fails_as_the_cpu_kernel():
    lhs, rhs = _lhs(), _packed_cx()
    for lhs_, rhs_ in ((_meta(lhs), rhs), (lhs, _meta(rhs))):
        cpu = _message(_cpu_kernel("w4kernels", "matmul_clamp_f32_qai8dxp_qsi4cxp"), lhs_, rhs_, 3,
                       N, K)
        assert "must be on a cpu device, got meta" in cpu
        assert _message(OPS.matmul_clamp_f32_qai8dxp_qsi4cxp, lhs_, rhs_, 3, N, K) == cpu


# ---- meta outputs are the real outputs' shape and dtype ----------------------------------------

def _valid_calls():
    w = w4._base()
    q, s, z = ma._awq()
    packed_c32 = ops.rhs_pack_nxk_qsi4c32p_qsu4c32s1s0(_u8(N, 32), torch.ones(N, 2).bfloat16(),
                                                       None, N, K, 32)
    return {
        "marlin_repack": (ma._words(16, 64), torch.randperm(128).int(), 128, 64, 4),
        "awq_marlin_repack": (ma._words(128, 8), 128, 64, 4),
        "awq_dequantize": (q, s, z, 0, 0, 0),
        "awq_gemm": (torch.zeros(3, 64, dtype=ma.H), q, s, z, 8),
        "w4a16_gemm": tuple(w[k] for k in W4A16_ARGS),
        "rhs_pack_nxk_qsi4cxp_qs4cxs1s0": (_u8(13, 17), torch.ones(13), None, 13, 33),
        "rhs_pack_kxn_qsi4cxp_qs4cxs1s0": (_u8(33, 7), torch.ones(13), None, 13, 33, 4, 8, 2, 0),
        "rhs_pack_nxk_qsi4c32p_qsu4c32s1s0": (_u8(N, 32), torch.ones(N, 2).bfloat16(), None, N,
                                              K, 32),
        "rhs_pack_kxn_qsi4c32p_qsu4c32s1s0": (_u8(K, 4), torch.ones(N, 2).bfloat16(), None, N, K,
                                              32),
        "lhs_quant_pack_qai8dxp_f32": (torch.zeros(5, 40), 4),
        "matmul_clamp_f32_qai8dxp_qsi4cxp": (_lhs(5, K, 4), _packed_cx(), 5, N, K, 4),
        "matmul_clamp_f32_qai8dxp_qsi4c32p": (_lhs(), packed_c32, 3, N, K, 32, 1, 8, 16, 2, None,
                                              None, torch.bfloat16),
        "dyn_quant_pack_4bit_weight": (_u8(N, 32), torch.ones(N, 2).bfloat16(), torch.ones(N), 32,
                                       K, N),
        "dyn_quant_matmul_4bit": (torch.zeros(2, 3, K).bfloat16(), packed_c32, 32, K, N),
    }


@pytest.mark.parametrize("ns", NAMESPACES)
def test_meta_outputs_have_the_real_shape_and_dtype(ns):
    calls = _valid_calls()
    for name, args in calls.items():
        if not torch._C._dispatch_has_kernel_for_dispatch_key(f"{ns}::{name}", "CPU"):
            assert ns == "w4kernels_simt", name  # the emulator builds the CUDA kernels only
            continue
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"{ns}::{name}", "Meta"), name
        real = _op(ns, name)(*args)
        fake = _op(ns, name)(*map(_meta, args))
        assert (fake.shape, fake.dtype, fake.device.type) == (real.shape, real.dtype, "meta"), name
        assert fake.is_contiguous() and real.is_contiguous(), name


@pytest.mark.skipif(not w4kernels.HAS_SIMT, reason="w4kernels._simt was not built (W4K_SIMT=0)")
@pytest.mark.parametrize("name", ["marlin_repack", "awq_marlin_repack", "awq_dequantize",
                                  "awq_gemm", "w4a16_gemm"])
def test_opcheck_emulator_namespace(name):
    """The emulator namespace's Meta kernels pass torch.library.opcheck (fake vs real, schema,
    dynamic shapes) as the product's do (tests/test_library.py and friends)."""
    torch.library.opcheck(_op("w4kernels_simt", name), _valid_calls()[name])


def test_every_tensor_op_has_a_meta_kernel_and_no_python_fake():
    schemas = [s for s in torch._C._jit_get_all_schemas() if s.name.startswith("w4kernels::")]
    assert len(schemas) >= 17
    for s in schemas:
        name = s.name.split("::")[1]
        if any(a.type.isSubtypeOf(torch._C.TensorType.get()) or "Tensor" in str(a.type)
               for a in s.arguments):
            assert torch._C._dispatch_has_kernel_for_dispatch_key(s.name, "Meta"), s.name
        holder = torch._library.simple_registry.singleton.find(s.name).fake_impl
        assert holder.kernel is None, f"{name}: a Python fake would shadow the Meta kernel"


# ---- FakeTensorMode and torch.compile ------------------------------------------------------------

def test_fake_mode_rejects_what_the_issue_found_accepted():
    """Issue 8, item 5: the old fakes returned float32 for float32 activations and float16 for
    out_dtype=float16; the kernels reject both, and now so do the fakes, with the same message."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    case = w4._base()
    case["a"] = case["a"].float()
    args = [case[k] for k in W4A16_ARGS]
    cpu = _message(OPS.w4a16_gemm, *args)
    with FakeTensorMode() as mode:
        fake_args = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        assert _message(OPS.w4a16_gemm, *fake_args) == cpu
    lhs, rhs = _lhs(), _packed_cx()
    cpu = _message(OPS.matmul_clamp_f32_qai8dxp_qsi4cxp, lhs, rhs, 3, N, K,
                   out_dtype=torch.float16)
    with FakeTensorMode() as mode:
        assert _message(OPS.matmul_clamp_f32_qai8dxp_qsi4cxp, mode.from_tensor(lhs),
                        mode.from_tensor(rhs), 3, N, K, out_dtype=torch.float16) == cpu


def test_compile_dynamic_batch_matches_eager():
    """dynamic=True: the activations' rows are symbols, the Meta kernels carry them through."""
    torch._dynamo.reset()
    q, s, z = ma._awq()
    w = w4._base()
    packed = _packed_cx()

    def forward(x):
        y = torch.ops.w4kernels.awq_gemm(x, q, s, z, 8)
        y2 = torch.ops.w4kernels.w4a16_gemm(
            torch.cat([x, x], 1), w["b_q_weight"], w["b_scales"], w["b_zeros"], w["g_idx"],
            w["perm"], w["workspace"], 4, x.shape[0], 128, 128, True, w["b_bias"], True)
        y3 = torch.ops.w4kernels.dyn_quant_matmul_4bit(x.float(), packed, K, K, N)
        lp = torch.ops.w4kernels.lhs_quant_pack_qai8dxp_f32(x.float(), 4)
        return y, y2, y3, lp

    compiled = torch.compile(forward, fullgraph=True, dynamic=True, backend="eager")
    for m in (3, 5):
        x = torch.randn(m, 64, generator=torch.Generator().manual_seed(m)).half()
        for got, want in zip(compiled(x), forward(x)):
            assert got.shape == want.shape and torch.equal(got, want)


def test_compile_rejects_a_bad_argument_while_tracing():
    torch._dynamo.reset()
    q, s, z = ma._awq()
    x = torch.zeros(2, 32, dtype=ma.H)  # K = 32, qweight has K = 64
    cpu = _message(OPS.awq_gemm, x, q, s, z, 8)

    def forward(x):
        return torch.ops.w4kernels.awq_gemm(x, q, s, z, 8)

    # Dynamo's TorchRuntimeError: raised by fake propagation, before any kernel runs.
    with pytest.raises(torch._dynamo.exc.TorchRuntimeError) as info:
        torch.compile(forward, fullgraph=True, backend="eager")(x)
    assert cpu in str(info.value)
