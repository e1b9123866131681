"""w4a16_gemm (vLLM gptq_marlin_gemm semantics) against independent references.

* Numerics: ``reference.w4a16_gemm`` (float64 product of ``a[:, perm]`` and the weight:
  dequantized with one rounding to the activation dtype when G > 1, unrounded ``(q - z) * s``
  per channel, where the kernel scales the fp32 sum). The kernel differs only by its fp32
  arithmetic and the final rounding, so the tolerance is derived, not tuned (see ``tolerance``).
* Layout: the golden vectors (tests/data/marlin.json, produced by upstream vLLM / IST-DASLab
  code) are fed through the GEMM with an identity ``a``, which must return the decoded weight,
  scales and zero points exactly.
* Argument checks: one test per bad-input class, asserting the message.
"""

import pytest
import torch

import golden
from conftest import backend_or_skip
from w4kernels import ops, reference

OP = "w4a16_gemm"
DTYPES = [torch.float16, torch.bfloat16]
# Unit roundoff of the output dtype (half an ulp, relative) and of the fp32 accumulator.
U_OUT = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}
U_F32 = 2.0 ** -24


def make_case(m, size_k, size_n, group_size, dtype, act_order=None, zp=False, bias=False,
              seed=0, cancel=False):
    """Random Marlin-format operands. act_order: None, "k_full" or "shard" (a row-parallel
    shard: b_scales holds the groups of a layer twice as long, g_idx indexes them directly).

    cancel: an input on which the fp32 summation order shows in the rounded output, for the
    tests that two paths add the same products in the same order (on plain random inputs a
    different order changes the fp32 sums by an ulp or so, which the rounding to fp16 / bf16
    hides almost always). In every k-tile, row 12 repeats row 3 of the weight (the same group)
    and the activations there are +L and -L, L large: the two products cancel exactly, but each
    fp32 sum they pass through loses its low bits to L * w, and which bits depends on where in
    the order they come. Not for act-order (the rows must share a group) nor for a reference
    check (the output is mostly rounding error)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (size_k, size_n), dtype=torch.int32, generator=gen)
    if cancel:
        assert act_order is None and size_k % 16 == 0
        q.view(size_k // 16, 16, size_n)[:, 12] = q.view(size_k // 16, 16, size_n)[:, 3]
    g_idx = perm = None
    if act_order == "shard":
        num_groups = max(2, 2 * size_k // (group_size if group_size > 0 else size_k))
        g_idx = torch.randint(0, num_groups, (size_k,), generator=gen).sort().values.int()
    else:
        num_groups = 1 if group_size == -1 else size_k // group_size
        if act_order == "k_full":
            g_orig = (torch.arange(size_k) * num_groups // size_k)[torch.randperm(size_k,
                                                                                 generator=gen)]
            perm_long = torch.argsort(g_orig, stable=True)
            g_idx = g_orig[perm_long].int()
    if act_order is not None:
        perm = torch.randperm(size_k, generator=gen).int()
    s = ((torch.rand(num_groups, size_n, generator=gen) + 0.05) * 0.02).to(dtype)
    s[torch.rand(num_groups, size_n, generator=gen) < 0.25] *= -1  # negative scales too
    b_scales = reference.marlin_permute_scales(
        s, size_k, size_n, group_size if num_groups > 1 else -1)
    b_zeros = None
    if zp:
        z = torch.randint(0, 16, (num_groups, size_n), dtype=torch.int32, generator=gen)
        b_zeros = reference.marlin_zero_points(z, num_groups, size_n)
    groups = g_idx.long() if g_idx is not None else torch.arange(size_k) // (size_k // num_groups)
    w_exact = (q - (z[groups] if zp else 8)).double() * s.double()[groups]
    w = w_exact.to(dtype)
    a = torch.randn(m, size_k, generator=gen).to(dtype)
    if cancel:
        big = 60000.0 if dtype == torch.float16 else 2.0 ** 24
        a.view(m, size_k // 16, 16)[:, :, 3] = big
        a.view(m, size_k // 16, 16)[:, :, 12] = -big
    return dict(
        _w=w,  # the weight dequantized (rounded to dtype) from the unpacked operands
        _w_ref=w_exact if num_groups == 1 else w.double(),  # the one the reference multiplies
        _qz=q - (z[groups] if zp else 8),  # integer weight q - z, Marlin row order
        _s=s,  # unpermuted scales [G, N]
        a=a,
        b_q_weight=reference.marlin_pack(q),
        b_scales=b_scales,
        b_zeros=b_zeros,
        g_idx=g_idx,
        perm=perm,
        workspace=ops.marlin_workspace(size_n),
        num_bits=4,
        size_m=m,
        size_n=size_n,
        size_k=size_k,
        is_k_full=act_order != "shard",
        b_bias=(torch.randn(size_n, generator=gen) * 0.5).to(dtype) if bias else None,
        use_fp32_reduce=True,
    )


def op_args(case):
    return {k: v for k, v in case.items() if not k.startswith("_")}


def call(backend, case):
    """Run the op on the backend's device; the result comes back to the CPU."""
    c = {k: v.to(backend.device) if isinstance(v, torch.Tensor) else v for k, v in case.items()}
    return backend.op(OP)(c["a"], c["b_q_weight"], c["b_scales"], c["b_zeros"], c["g_idx"],
                          c["perm"], c["workspace"], c["num_bits"], c["size_m"], c["size_n"],
                          c["size_k"], c["is_k_full"], c["b_bias"], c["use_fp32_reduce"]).cpu()


def tolerance(case, ref):
    """Elementwise error bound of the kernel against the float64 reference ``ref``.

    The kernel's fp32 value is ``sum_k a_k * w_k * (1 + t_k) + bias * (1 + t_b)`` where each
    ``1 + t`` is a product of at most R factors ``(1 + d)``, |d| <= u = 2^-24, one per fp32
    rounding the term goes through, so |t| <= gamma_R = R u / (1 - R u) (Higham, Accuracy and
    Stability, 3.1) and the fp32 error is at most gamma_R * (sum_k |a * w| + |bias|), w the
    reference's weight. Every product a * w is exact in fp32 (11-bit by at most 11-bit
    significands), so the roundings are:

    * G > 1: K - 1 additions of the products, then the bias add: R = K.
    * G == 1: K - 1 additions of the products a * (q - z), the multiply of the sum by the scale
      and the bias add (two separate roundings, the contract has no fma): R = K + 1.

    Then the final rounding to fp16/bf16: half an ulp of the fp32 value, (|ref| + fp32 error)
    * 2^-11 (fp16) or 2^-8 (bf16), plus the smallest fp16 subnormal for results near zero.
    """
    c = case
    a = c["a"].double()
    if c["perm"] is not None:
        a = a[:, c["perm"].long()]
    mag = a.abs() @ c["_w_ref"].abs()
    if c["b_bias"] is not None:
        mag = mag + c["b_bias"].double().abs()
    roundings = c["size_k"] + (1 if c["b_scales"].shape[0] == 1 else 0)
    acc_err = roundings * U_F32 / (1 - roundings * U_F32) * mag
    return U_OUT[c["a"].dtype] * (ref.abs() + acc_err) + acc_err + 2.0 ** -24


def check_against_reference(backend, case):
    out = call(backend, case)
    assert out.dtype == case["a"].dtype and out.shape == (case["size_m"], case["size_n"])
    ref = reference.w4a16_gemm(**op_args(case))
    # The reference decodes what make_case encoded (cases edited after make_case drop _w).
    if "_w" in case and case["size_k"] * case["size_n"] <= 1 << 20:
        c = case
        w = reference.marlin_dequantize(c["b_q_weight"], c["b_scales"], c["b_zeros"],
                                        c["g_idx"], c["size_k"], c["size_n"])
        assert torch.equal(w, c["_w"])
        w_ref = reference.w4a16_weight(c["b_q_weight"], c["b_scales"], c["b_zeros"],
                                       c["g_idx"], c["size_k"], c["size_n"])
        assert torch.equal(w_ref, c["_w_ref"])
    tol = tolerance(case, ref)
    err = (out.double() - ref).abs()
    worst = (err - tol).argmax()
    assert bool((err <= tol).all()), (
        f"max excess at flat index {int(worst)}: err {err.flatten()[worst].item():.3e} > "
        f"tol {tol.flatten()[worst].item():.3e}")


# ---- numerics against the float64 reference -------------------------------------------------


# (K, N, group_size) with group_size < K (group_size = K would be per-channel again).
SHAPE_GROUPS = [(k, n, g) for k, n in [(128, 64), (256, 192)] for g in (-1, 32, 64, 128) if g < k]


@pytest.mark.parametrize("backend", ["cpu", "simt", "cuda"])
@pytest.mark.parametrize("size_k,size_n,group_size", SHAPE_GROUPS)
@pytest.mark.parametrize("m", [1, 3, 16, 33, 128])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_shapes(backend, dtype, m, size_k, size_n, group_size):
    b = backend_or_skip(backend, OP)
    check_against_reference(b, make_case(m, size_k, size_n, group_size, dtype, seed=m))


@pytest.mark.parametrize("backend", ["cpu", "simt", "cuda"])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("zp", [False, True], ids=["sym", "zp"])
@pytest.mark.parametrize("group_size,act_order", [
    pytest.param(g, a, id=f"g{g}-{a or 'noact'}") for g in (-1, 32, 64, 128)
    for a in (None, "k_full", "shard") if not (a == "shard" and g == -1)])  # a shard has > 1 group
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("m", [3, 33])
def test_options(backend, m, dtype, group_size, act_order, zp, bias):
    """Act-order (full K and row-parallel shard), zero points and bias. M = 3 takes the CPU
    kernel's small-M (lookup-table) path, M = 33 its blocked path with a remainder after the
    6-row register blocks. Act-order + zero points is not a vLLM combination but the formula
    is the same, so it is tested too."""
    b = backend_or_skip(backend, OP)
    check_against_reference(b, make_case(m, 256, 192, group_size, dtype, act_order, zp, bias,
                                         seed=7))


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 8])
@pytest.mark.parametrize("act_order", [None, "shard"], ids=["noact", "shard"])
@pytest.mark.parametrize("lut_rows", ["0", "8"], ids=["blocked", "lut"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_cpu_small_m_paths(monkeypatch, dtype, lut_rows, act_order, m):
    """Both AVX-512 small-M variants (lookup tables and the blocked dequantize-then-FMA path,
    selected with W4K_W4A16_LUT_ROWS) at every row-block remainder, with zero points and bias.
    The act-order shard has random group boundaries, so some k-tiles span two groups (the
    lookup-table path dequantizes those row by row). The decode path, which takes these M by
    default, is turned off (W4K_W4A16_PAIR_ROWS=0) so that these paths run."""
    b = backend_or_skip("cpu", OP)
    monkeypatch.setenv("W4K_W4A16_LUT_ROWS", lut_rows)
    monkeypatch.setenv("W4K_W4A16_PAIR_ROWS", "0")
    case = make_case(m, 512, 128, 64, dtype, act_order, zp=True, bias=True, seed=m)
    if act_order:
        g = case["g_idx"].reshape(-1, 16)
        assert bool((g[:, 0] != g[:, -1]).any()), "want tiles that span two groups"
    check_against_reference(b, case)


LLAMA_CASES = [  # (dtype, variant, m); the float64 reference of this shape takes seconds
    (torch.float16, "gptq", 1), (torch.bfloat16, "gptq", 16), (torch.bfloat16, "awq", 1),
    (torch.float16, "act", 16),
]


@pytest.mark.parametrize("backend", ["cpu", "simt", "cuda"])
@pytest.mark.parametrize("dtype,variant,m", LLAMA_CASES,
                         ids=[f"{str(d)[6:]}-{v}-M{m}" for d, v, m in LLAMA_CASES])
def test_llama_mlp_shape(backend, dtype, variant, m):
    """A realistic layer (K, N) = (4096, 11008) with group size 128: GPTQ, AWQ (zero points)
    and act-order."""
    b = backend_or_skip(backend, OP)
    act_order = "k_full" if variant == "act" else None
    check_against_reference(b, make_case(m, 4096, 11008, 128, dtype, act_order,
                                         zp=variant == "awq", seed=11))


CAPS = {"scalar": ("W4K_CPU_ISA", "scalar"), "avx2": ("W4K_CPU_ISA", "avx2"),
        "avx512-no-bf16-dot": ("W4K_W4A16_DPBF16", "0")}


@pytest.mark.parametrize("m", [1, 5, 33])
@pytest.mark.parametrize("config", ["g64", "g-1_zp_bias", "act_shard"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("cap", list(CAPS))
def test_capped_isa(monkeypatch, cap, dtype, config, m):
    """The kernel paths a machine without AVX-512 (W4K_CPU_ISA=avx2: the AVX2 twin of the
    portable C++; W4K_CPU_ISA=scalar: the portable C++) or without AVX512-BF16 (fp32 FMAs for
    bf16 too) would run."""
    b = backend_or_skip("cpu", OP)
    monkeypatch.setenv(*CAPS[cap])
    args = {"g64": (64, None, False, False), "g-1_zp_bias": (-1, None, True, True),
            "act_shard": (32, "shard", False, True)}[config]
    check_against_reference(b, make_case(m, 256, 128, args[0], dtype, *args[1:], seed=3))


# Every CPU kernel path, by the environment that selects it on an AVX512-BF16 machine (on a
# machine without some of them, several entries run the same path).
CPU_PATHS = {
    "default": {},
    "lut": {"W4K_W4A16_LUT_ROWS": "64"},
    "blocked": {"W4K_W4A16_LUT_ROWS": "0"},
    "blocked-no-bf16-dot": {"W4K_W4A16_LUT_ROWS": "0", "W4K_W4A16_DPBF16": "0"},
    "avx2": {"W4K_CPU_ISA": "avx2"},
    "scalar": {"W4K_CPU_ISA": "scalar"},
}


@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
@pytest.mark.parametrize("zp,act_order", [(False, None), (True, None), (False, "k_full"),
                                          (True, "k_full")], ids=["sym", "zp", "act", "act_zp"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_cpu_paths_same_bits_per_channel(monkeypatch, dtype, zp, act_order, bias):
    """Per channel, every CPU path must implement the epilogue identically: out =
    T((acc * s) + bias), a separate fp32 multiply and add (no fma), after an exact (q - z)
    dequantization. Small-integer activations make every fp32 partial sum of a * (q - z) an
    exact integer (|acc| <= 8 * 15 * K < 2^24), so acc is the same in any summation order and
    each path must match the contract to the bit (for general inputs the paths sum in
    different orders and only agree within the rounding bound)."""
    b = backend_or_skip("cpu", OP)
    m, size_k, size_n = 33, 512, 128
    case = make_case(m, size_k, size_n, -1, dtype, act_order, zp, bias, seed=13)
    gen = torch.Generator().manual_seed(13)
    case["a"] = torch.randint(-8, 9, (m, size_k), generator=gen).to(dtype)
    a = case["a"].double()
    if act_order:
        a = a[:, case["perm"].long()]
    acc = (a @ case["_qz"].double()).float()  # exact integers
    y = acc * case["_s"].float()  # one fp32 rounding
    y = y + (case["b_bias"].float() if bias else 0.0)  # another
    expected = y.to(dtype)
    for name, env in CPU_PATHS.items():
        with monkeypatch.context() as mp:
            for key, value in env.items():
                mp.setenv(key, value)
            assert golden.same_bits(call(b, case), expected), name


def _fma_witnesses(dtype, count, gen):
    """`count` per-channel epilogues (acc, s, bias) whose contract result T((acc * s) + bias)
    differs from the fused T(fma(acc, s, bias)): acc = sum_k A[k] * d[k] with A below and
    integers d in [-8, 7] (exact in fp32: multiples of 2^-10 below 2^12), s and bias in T."""
    found = []
    while sum(len(f[0]) for f in found) < count:
        d = torch.randint(-8, 8, (1 << 20, 4), generator=gen)
        acc = (d.double() @ WITNESS_A.double()).float()
        s = (torch.randn(1 << 20, generator=gen) * 0.01).to(dtype).float()
        b = (acc * s * (torch.rand(1 << 20, generator=gen) * 4 - 2)).to(dtype).float()
        contract = ((acc * s) + b).to(dtype)
        # acc * s is exact in float64 (22 + 11 bits) and so is the sum (b's exponent is near
        # the product's): one rounding to fp32 is the fma.
        fused = (acc.double() * s.double() + b.double()).float().to(dtype)
        hit = contract.view(torch.int16) != fused.view(torch.int16)
        found.append((d[hit], s[hit], b[hit]))
    d, s, b = (torch.cat(x)[:count] for x in zip(*found))
    return d, s.to(dtype), b.to(dtype)


WITNESS_A = torch.tensor([2.0 ** 8, 2.0 ** 2, 2.0 ** -4, 2.0 ** -10])


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
def test_cpu_paths_per_channel_epilogue_no_fma(monkeypatch, dtype):
    """Per channel, the scale multiply and the bias add are two fp32 roundings on every path:
    each of the 64 columns is an (acc, s, bias) whose output would differ if the two were
    fused into one fma (as GCC contracts a * b + c wherever FMA is enabled) or reordered."""
    b = backend_or_skip("cpu", OP)
    size_k, size_n = 16, 64
    d, s, bias = _fma_witnesses(dtype, size_n, torch.Generator().manual_seed(17))
    q = torch.full((size_k, size_n), 8, dtype=torch.int32)
    q[:4] += d.t().int()
    case = make_case(1, size_k, size_n, -1, dtype, bias=True)
    a = torch.zeros(1, size_k)
    a[0, :4] = WITNESS_A
    case.update(a=a.to(dtype), b_q_weight=reference.marlin_pack(q), b_bias=bias,
                b_scales=reference.marlin_permute_scales(s.reshape(1, -1), size_k, size_n, -1))
    acc = (d.double() @ WITNESS_A.double()).float()
    expected = ((acc * s.float()) + bias.float()).to(dtype).reshape(1, -1)
    for name, env in CPU_PATHS.items():
        with monkeypatch.context() as mp:
            for key, value in env.items():
                mp.setenv(key, value)
            assert golden.same_bits(call(b, case), expected), name


def test_scalar_and_avx512_agree(monkeypatch):
    """Both paths round the weights identically; only the fp32 summation order may differ."""
    b = backend_or_skip("cpu", OP)
    case = make_case(9, 512, 256, 128, torch.float16, "k_full", seed=5)
    fast = call(b, case)
    monkeypatch.setenv("W4K_CPU_ISA", "scalar")
    tol = tolerance(case, reference.w4a16_gemm(**op_args(case)))
    assert bool(((call(b, case).double() - fast.double()).abs() <= 2 * tol).all())


@pytest.mark.parametrize("size_k,groups", [(1152, 9), (1008, 1)], ids=["grouped", "per_channel"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("backend", ["cpu", "simt", "cuda"])
def test_where_the_scale_is_applied(backend, dtype, size_k, groups):
    """Regression for the two contracts. All weights of a column are equal (q - 8 = 7, the same
    scale in every group: group 128, the GPU kernel's per-stage scale path), a = 1 and
    K < 2^13, so every fp32 partial sum is exact:

    * G > 1: w = T(7 * s) before the fp32 accumulation, the output is T(K * T(7 * s));
    * G == 1: the scale multiplies the fp32 sum K * 7, the output is T(fp32(K * 7 * s)) (the
      product is exact: 9 significant bits of K * 7 = 7056 times those of s).

    The scales make the two differ in some columns, so each kernel must use its own order."""
    b = backend_or_skip(backend, OP)
    size_n = 64
    q = torch.full((size_k, size_n), 15, dtype=torch.int32)  # q - 8 = 7
    s = torch.linspace(0.01, 0.02, size_n).to(dtype).reshape(1, size_n)
    case = make_case(1, size_k, size_n, -1, dtype)
    case.update(a=torch.ones(1, size_k, dtype=dtype), b_q_weight=reference.marlin_pack(q),
                b_scales=reference.marlin_permute_scales(s.repeat(groups, 1), size_k, size_n,
                                                         size_k // groups if groups > 1 else -1))
    rounded_first = (size_k * (7.0 * s.double()).to(dtype).double()).to(dtype)
    scaled_sum = (size_k * 7.0 * s.double()).to(dtype)
    assert not torch.equal(rounded_first, scaled_sum), "scales must make the two orders differ"
    assert golden.same_bits(call(b, case), rounded_first if groups > 1 else scaled_sum)


def test_a_with_row_stride():
    """a may be a column slice of a wider tensor (row stride > K), as vLLM allows."""
    b = backend_or_skip("cpu", OP)
    case = make_case(7, 256, 128, 64, torch.bfloat16, seed=2)
    wide = torch.randn(7, 256 + 40).to(torch.bfloat16)
    wide[:, 8:264] = case["a"]
    case["a"] = wide[:, 8:264]
    assert case["a"].stride(0) == 296
    check_against_reference(b, case)


def test_empty_m_returns_empty():
    b = backend_or_skip("cpu", OP)
    case = make_case(0, 128, 64, 32, torch.float16)
    out = call(b, case)
    assert out.shape == (0, 64) and out.dtype == torch.float16


@pytest.mark.parametrize("config", ["g128", "act_zp_bias", "shard"])
def test_opcheck(config):
    backend_or_skip("cpu", OP)
    args = {"g128": (128, None, False, False), "act_zp_bias": (64, "k_full", True, True),
            "shard": (32, "shard", False, False)}[config]
    case = make_case(5, 256, 128, args[0], torch.bfloat16, *args[1:], seed=4)
    c = case
    torch.library.opcheck(
        torch.ops.w4kernels.w4a16_gemm,
        (c["a"], c["b_q_weight"], c["b_scales"], c["b_zeros"], c["g_idx"], c["perm"],
         c["workspace"], 4, c["size_m"], c["size_n"], c["size_k"], c["is_k_full"], c["b_bias"],
         True))


# ---- layout against the golden vectors ------------------------------------------------------


def identity_gemm(backend, b_q_weight, b_scales, b_zeros, size_k, size_n, g_idx=None,
                  perm=None):
    """a = I (K x K, fp16/bf16 like the scales): the output is the dequantized weight itself."""
    a = torch.eye(size_k, dtype=b_scales.dtype, device=b_scales.device)
    if perm is not None:  # a[:, perm] must be I again so that row r of the output is weight row r
        a = a[:, torch.argsort(perm.long())]
    return backend.op(OP)(a, b_q_weight, b_scales, b_zeros, g_idx, perm,
                          ops.marlin_workspace(size_n, b_scales.device), 4, size_k, size_n,
                          size_k, True, None, True)


@pytest.mark.parametrize("case", golden.cases("marlin", "gptq_marlin_repack"))
def test_golden_gptq_repack_layout(case):
    """Upstream gptq_marlin_repack output decodes to the GPTQ codes (Marlin row r = GPTQ row
    perm[r]): with unit scales and z = 8 the GEMM returns q - 8 exactly."""
    b = backend_or_skip("cpu", OP)
    k, n = case["params"]["size_k"], case["params"]["size_n"]
    gptq = case["inputs"]["b_q_weight"]
    shifts = (4 * (torch.arange(k) % 8)).reshape(k, 1)
    q = (gptq.repeat_interleave(8, dim=0) >> shifts) & 0xF  # nibble k % 8 of word [k // 8, n]
    perm = case["inputs"]["perm"]
    if perm.numel() > 0:
        q = q[perm.long()]
    out = identity_gemm(b, case["expected"]["out"], torch.ones(1, n, dtype=torch.float16), None,
                        k, n)
    assert torch.equal(out, (q - 8).to(torch.float16))


@pytest.mark.parametrize("case", golden.cases("marlin", "marlin_permute_scales"))
def test_golden_scale_permutation(case):
    """Upstream-permuted scales decode to the original ones: every code 9 (w = s) and a = I."""
    b = backend_or_skip("cpu", OP)
    k, n = case["params"]["size_k"], case["params"]["size_n"]
    s, s_marlin = case["inputs"]["s"], case["expected"]["out"]
    nines = torch.full((k // 16, 2 * n), 0x99999999 - (1 << 32), dtype=torch.int32)
    out = identity_gemm(b, nines, s_marlin, None, k, n)
    assert golden.same_bits(out, s.repeat_interleave(k // s.shape[0], dim=0))


@pytest.mark.parametrize("case", golden.cases("marlin", "marlin_zero_points"))
def test_golden_zero_points(case):
    """Upstream Marlin zero points decode to the original ones: every code 0, unit scales, so
    w = -z."""
    b = backend_or_skip("cpu", OP)
    g, n, k = case["params"]["size_k"], case["params"]["size_n"], case["params"]["weight_size_k"]
    zeros = torch.zeros(k // 16, 2 * n, dtype=torch.int32)
    out = identity_gemm(b, zeros, torch.ones(g, n, dtype=torch.bfloat16),
                        case["expected"]["out"], k, n)
    expected = -case["inputs"]["zp"].repeat_interleave(k // g, dim=0).to(torch.bfloat16)
    assert torch.equal(out, expected)


@pytest.mark.parametrize("case", golden.cases("marlin", "marlin_layer_pack"))
def test_golden_layer_pack(case):
    """IST-DASLab Marlin Layer.pack (weight + fp16 scales): the GEMM with a = I returns
    fp16((q - 8) * s) bit for bit."""
    b = backend_or_skip("cpu", OP)
    k, n = case["params"]["size_k"], case["params"]["size_n"]
    q, s = case["inputs"]["q"].int(), case["inputs"]["s"]
    out = identity_gemm(b, case["expected"]["B"], case["expected"]["s"], None, k, n)
    g = s.shape[0]
    expected = ((q - 8).float() * s.float().repeat_interleave(k // g, dim=0)).to(torch.float16)
    assert golden.same_bits(out, expected)


# ---- argument checks ------------------------------------------------------------------------


def _base():
    """A valid case with every optional argument present (act-order, zero points, bias)."""
    return make_case(4, 128, 128, 32, torch.float16, "k_full", zp=True, bias=True)


# name -> (modification of _base(), expected message regex)
BAD_INPUTS = {
    # dtypes
    "a_dtype": (lambda c: c.update(a=c["a"].float()), r"a must have dtype float16 or bfloat16"),
    "b_q_weight_dtype": (lambda c: c.update(b_q_weight=c["b_q_weight"].long()),
                         r"b_q_weight must have dtype Int, got Long"),
    "b_scales_dtype": (lambda c: c.update(b_scales=c["b_scales"].bfloat16()),
                       r"b_scales must have the dtype of a \(Half\), got BFloat16"),
    "b_zeros_dtype": (lambda c: c.update(b_zeros=c["b_zeros"].short()),
                      r"b_zeros must have dtype Int, got Short"),
    "g_idx_dtype": (lambda c: c.update(g_idx=c["g_idx"].long()),
                    r"g_idx must have dtype Int, got Long"),
    "perm_dtype": (lambda c: c.update(perm=c["perm"].long()), r"perm must have dtype Int"),
    "workspace_dtype": (lambda c: c.update(workspace=c["workspace"].float()),
                        r"workspace must have dtype Int, got Float"),
    "bias_dtype": (lambda c: c.update(b_bias=c["b_bias"].float()),
                   r"b_bias must have the dtype of a \(Half\), got Float"),
    # devices
    "a_meta": (lambda c: c.update(a=c["a"].to("meta")), r"a must be on a cpu device, got meta"),
    "b_q_weight_meta": (lambda c: c.update(b_q_weight=c["b_q_weight"].to("meta")),
                        r"b_q_weight must be on a cpu device, got meta"),
    "b_scales_meta": (lambda c: c.update(b_scales=c["b_scales"].to("meta")),
                      r"b_scales must be on a cpu device, got meta"),
    "perm_meta": (lambda c: c.update(perm=c["perm"].to("meta")),
                  r"perm must be on a cpu device, got meta"),
    # ranks
    "a_rank": (lambda c: c.update(a=c["a"].reshape(1, 4, 128)), r"a must be a 2-D tensor, got 3-D"),
    "b_q_weight_rank": (lambda c: c.update(b_q_weight=c["b_q_weight"].flatten()),
                        r"b_q_weight must be a 2-D tensor, got 1-D"),
    "g_idx_rank": (lambda c: c.update(g_idx=c["g_idx"].reshape(2, 64)),
                   r"g_idx must be a 1-D tensor, got 2-D"),
    # shapes vs sizes
    "size_m": (lambda c: c.update(size_m=5), r"a must have shape \[5, 128\], got \[4, 128\]"),
    "size_k": (lambda c: c.update(size_k=256), r"a must have shape \[4, 256\], got \[4, 128\]"),
    "size_n": (lambda c: c.update(size_n=192),
               r"b_q_weight must have shape \[8, 384\], got \[8, 256\]"),
    "scales_n": (lambda c: c.update(b_scales=c["b_scales"][:, :64].contiguous()),
                 r"b_scales must have shape \[num_groups >= 1, size_n = 128\], got \[4, 64\]"),
    "zeros_groups": (lambda c: c.update(b_zeros=c["b_zeros"][:2].contiguous()),
                     r"b_scales and b_zeros must have the same number of groups \(size\(0\)\), "
                     r"got b_scales \[4, 128\] and b_zeros \[2, 16\]"),
    "bias_shape": (lambda c: c.update(b_bias=c["b_bias"][:64].contiguous()),
                   r"b_bias must have shape \[128\], got \[64\]"),
    # tile multiples
    "k_multiple": (lambda c: c.update(size_k=120, a=c["a"][:, :120].contiguous()),
                   r"size_k must be a multiple of 16, got 120"),
    "n_multiple": (lambda c: c.update(size_n=96), r"size_n must be a multiple of 64, got 96"),
    # groups
    "groups_divide_k": (lambda c: c.update(g_idx=None, perm=None, b_zeros=None,
                                           b_scales=torch.ones(3, 128, dtype=torch.float16)),
                        r"number of groups \(b_scales.size\(0\) = 3\) must divide size_k = 128"),
    "act_groups_divide_k": (lambda c: c.update(b_zeros=None,
                                               b_scales=torch.ones(3, 128, dtype=torch.float16)),
                            r"with act-order and is_k_full, the number of groups"),
    # act-order tensors
    "perm_length": (lambda c: c.update(perm=c["perm"][:64].contiguous()),
                    r"perm must have shape \[128\], got \[64\]"),
    "g_idx_length": (lambda c: c.update(g_idx=torch.zeros(127, dtype=torch.int32)),
                     r"g_idx must have shape \[128\], got \[127\]"),
    "perm_range": (lambda c: c["perm"].__setitem__(3, 128),
                   r"perm values must lie in \[0, 128\), got perm\[3\] = 128"),
    "perm_not_a_permutation": (lambda c: c["perm"].copy_(torch.zeros(128, dtype=torch.int32)),
                               r"perm must be a permutation of \[0, 128\), got perm\[0\] = "
                               r"perm\[1\] = 0"),
    "g_idx_unsorted": (lambda c: c["g_idx"].__setitem__(0, 3),
                       r"g_idx must be sorted .* got g_idx\[0\] = 3 > g_idx\[1\] = 0"),
    "g_idx_range": (lambda c: c["g_idx"].__setitem__(-1, 4),
                    r"g_idx values must lie in \[0, 4\), got g_idx\[127\] = 4"),
    "g_idx_without_perm": (lambda c: c.update(perm=None),
                           r"g_idx and perm must both be given .* got g_idx given and perm absent"),
    # bits, empty sizes, workspace
    "num_bits": (lambda c: c.update(num_bits=8), r"num_bits must be 4 .*got 8"),
    "k_zero": (lambda c: c.update(size_k=0, a=c["a"][:, :0]), r"size_k must be positive, got 0"),
    "n_zero": (lambda c: c.update(size_n=0), r"size_n must be positive, got 0"),
    "workspace_empty": (lambda c: c.update(workspace=torch.zeros(0, dtype=torch.int32)),
                        r"workspace must have at least 1 element, got shape \[0\]"),
    "workspace_expanded": (
        lambda c: c.update(workspace=torch.zeros(1, dtype=torch.int32).expand(32)),
        r"workspace must be contiguous"),
    "workspace_dirty": (lambda c: c["workspace"].__setitem__(5, 3),
                        r"workspace must be all zeros .* got workspace\[5\] = 3"),
    # contiguity
    "a_column_stride": (lambda c: c.update(a=c["a"].t().contiguous().t()),
                        r"a must be unit-stride along K"),
    "b_q_weight_noncontiguous": (
        lambda c: c.update(b_q_weight=torch.cat([c["b_q_weight"]] * 2, dim=1)[:, ::2]),
        r"b_q_weight must be contiguous"),
    "b_scales_noncontiguous": (
        lambda c: c.update(b_scales=c["b_scales"].t().contiguous().t()),
        r"b_scales must be contiguous"),
    "perm_noncontiguous": (lambda c: c.update(perm=torch.cat([c["perm"]] * 2)[::2]),
                           r"perm must be contiguous"),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_bad_input(name):
    """The CPU kernel is called through redispatch so that 'meta' tensors reach its device
    check (a plain call with any meta argument would dispatch to the fake)."""
    backend_or_skip("cpu", OP)
    case = _base()
    call_cpu_kernel(case)  # the base case itself is valid
    modify, message = BAD_INPUTS[name]
    modify(case)
    with pytest.raises(RuntimeError, match="w4a16_gemm: .*" + message):
        call_cpu_kernel(case)


def call_cpu_kernel(case):
    c = case
    return torch.ops.w4kernels.w4a16_gemm.default.redispatch(
        torch._C.DispatchKeySet(torch._C.DispatchKey.CPU), c["a"], c["b_q_weight"],
        c["b_scales"], c["b_zeros"], c["g_idx"], c["perm"], c["workspace"], c["num_bits"],
        c["size_m"], c["size_n"], c["size_k"], c["is_k_full"], c["b_bias"], c["use_fp32_reduce"])
