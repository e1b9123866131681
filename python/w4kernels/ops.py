"""Typed wrappers of every ``torch.ops.w4kernels`` operator.

Notation used in the docstrings: K = ``size_k`` (the reduction dimension, the Linear layer's
``in_features``), N = ``size_n`` (``out_features``), M = number of activation rows, G = number of
quantization groups (1 for per-channel, else K / group_size). The layouts themselves are given,
as formulas, in :mod:`w4kernels.reference`.

The ops have no Python fakes: their Meta kernels (``csrc/meta.cpp``, ``csrc/meta_kernels.h``)
run the CPU/CUDA bindings' own argument checks and build the output's shape and dtype, so under
``FakeTensorMode`` and ``torch.compile(fullgraph=True)`` a bad argument fails while tracing with
the kernel's message, and a meta tensor is rejected exactly as the kernel rejects it. Checks
that read tensor values (``perm`` is a permutation, ``g_idx`` sorted, ``workspace`` zero) run in
the host kernels only.

Every wrapper takes its op's arguments in the schema's order, with the schema's names and
defaults (``csrc/schemas.h``; ``tests/test_vllm_dropin.py`` compares them), so a positional call
written from the README's operator table means the same through the wrapper and through
``torch.ops.w4kernels``. Trailing arguments the schema leaves without a default may get one here
(``num_bits=4``, ``is_k_full=True``, ``split_k_iters``); no argument moves. The GEMM wrappers
also accept activations ``[..., K]`` (the ops keep vLLM's 2-D contract) and reject activations
whose dtype differs from the scales' with the cast to apply. vLLM's own signatures, argument
for argument, are in :mod:`w4kernels.vllm`.
"""

from typing import Optional

import torch

_HALF_DTYPES = (torch.float16, torch.bfloat16)


def _check_activation_dtype(op: str, a_name: str, a: torch.Tensor, s_name: str,
                            s: torch.Tensor) -> None:
    """The kernels take activations and scales of one dtype (fp16 or bf16), and the op's own
    check only says they differ: say which cast fixes it. Nothing is converted implicitly (a
    silent cast per call would hide a copy of every activation)."""
    if a.dtype == s.dtype:
        return
    if s.dtype in _HALF_DTYPES:
        hint = f"cast the activations: {a_name}.to({s.dtype})"
        if a.dtype in _HALF_DTYPES:
            hint += f", or convert the scales once: {s_name}.to({a.dtype})"
    elif a.dtype in _HALF_DTYPES:
        hint = f"convert the scales once: {s_name}.to({a.dtype})"
    else:
        hint = (f"use float16 or bfloat16 for both, e.g. {s_name}.to(torch.float16) and "
                f"{a_name}.to(torch.float16)")
    raise TypeError(f"{op}: {a_name} has dtype {a.dtype} but {s_name} has dtype {s.dtype}; "
                    f"they must be the same float16 or bfloat16 dtype: {hint}")


def _flatten_rows(op: str, name: str, t: torch.Tensor):
    """``[..., K]`` -> (``[M, K]``, leading shape or None when ``t`` already was 2-D)."""
    if t.dim() == 2:
        return t, None
    if t.dim() == 0:
        raise ValueError(f"{op}: {name} must have at least 1 dimension ([..., K]), got a scalar")
    return t.reshape(-1, t.shape[-1]), tuple(t.shape[:-1])


# ---- Marlin -------------------------------------------------------------------------------


def marlin_repack(b_q_weight: torch.Tensor, perm: Optional[torch.Tensor], size_k: int,
                  size_n: int, num_bits: int = 4) -> torch.Tensor:
    """GPTQ-packed weight to the Marlin layout (vLLM ``gptq_marlin_repack``, byte-identical).

    Args:
        b_q_weight: int32 ``[K/8, N]``, GPTQ packing along K: element (k, n) is nibble ``k % 8``
            of word ``[k/8, n]`` (uint4 code, value = code - 8 for symmetric GPTQ).
        perm: int32 ``[K]`` or None/empty. Act-order: Marlin row r takes GPTQ row ``perm[r]``
            (``perm = argsort(g_idx)``).
        size_k: K, a multiple of 16. size_n: N, a multiple of 64.
        num_bits: 4 (default 4; the schema has no default).

    Returns:
        int32 ``[K/16, 2N]`` in the Marlin layout (see :func:`reference.marlin_repack`).
    """
    return torch.ops.w4kernels.marlin_repack(b_q_weight, perm, size_k, size_n, num_bits)


def awq_marlin_repack(b_q_weight: torch.Tensor, size_k: int, size_n: int,
                      num_bits: int = 4) -> torch.Tensor:
    """AWQ-packed weight to the Marlin layout (vLLM ``awq_marlin_repack``, byte-identical).

    Args:
        b_q_weight: int32 ``[K, N/8]``, AutoAWQ packing along N: column ``8c + j`` is nibble
            ``[0, 4, 1, 5, 2, 6, 3, 7][j]`` of word ``[k, c]``.
        size_k: K, a multiple of 16. size_n: N, a multiple of 64.
        num_bits: 4 (default 4; the schema has no default).

    Returns:
        int32 ``[K/16, 2N]`` in the Marlin layout.
    """
    return torch.ops.w4kernels.awq_marlin_repack(b_q_weight, size_k, size_n, num_bits)


def w4a16_gemm(a: torch.Tensor, b_q_weight: torch.Tensor, b_scales: torch.Tensor,
               b_zeros: Optional[torch.Tensor], g_idx: Optional[torch.Tensor],
               perm: Optional[torch.Tensor], workspace: torch.Tensor, num_bits: int, size_m: int,
               size_n: int, size_k: int, is_k_full: bool = True,
               b_bias: Optional[torch.Tensor] = None,
               use_fp32_reduce: bool = True) -> torch.Tensor:
    """fp16/bf16 activations times a Marlin int4 weight (vLLM ``gptq_marlin_gemm`` semantics).

    Arguments in the op schema's order (``torch.ops.w4kernels.w4a16_gemm``). For vLLM's own
    signature (``c``, ``b_q_type``, bias fourth, ...) use :func:`w4kernels.vllm.gptq_marlin_gemm`.

    ``out[m, n] = sum_r a[m, perm[r]] * (q[r, n] - z) * s (+ b_bias[n])``, where the weight
    row r of the Marlin layout holds activation column ``perm[r]`` (act-order) or r, ``q`` is
    the uint4 code, ``s = b_scales[g(r), n]``, ``z = 8`` (GPTQ, symmetric) or the unpacked
    Marlin zero point ``b_zeros[g(r), n]`` (AWQ), and ``g(r) = g_idx[r]`` (act-order) or
    ``r // group_size`` (``group_size = K / G``). With T = ``a``'s dtype, it is computed as:

    * G > 1 (grouped): ``w[r, n] = T((q - z) * s)``, each weight rounded once (as Marlin
      dequantizes to fp16/bf16 before its fp32-accumulating mma); the products ``a * w`` are
      accumulated in fp32, the bias is added in fp32, and the result is rounded once to T.
    * G == 1 (per-channel; vLLM Marlin's structure): ``acc = sum_r a * (q - z)`` in fp32 with
      the exact integer weight, then ``y = acc * s[n]`` and ``y + b_bias[n]`` as two fp32
      roundings (no fma), then one rounding to T. (vLLM rounds ``acc`` to half and multiplies
      by the half scale, ``half(half(acc) * s)``; the two differ by about an ulp of the output.)

    On CUDA, from M = 256 rows on (``W4K_W4A16_DEQUANT_THRESHOLD`` overrides it per call) a
    grouped layer is dequantized once into the same rounded ``w`` and multiplied with torch's
    matmul (cuBLAS, fp32 accumulation; torch's ``allow_fp16_reduced_precision_reduction`` /
    ``allow_bf16_reduced_precision_reduction`` settings apply there); per-channel layers keep
    the tensor-core kernel at every M.

    None and empty tensors both mean "absent" for ``b_zeros``, ``g_idx``, ``perm`` and
    ``b_bias``; ``g_idx`` and ``perm`` come together. M = 0 gives an empty ``[0, N]`` result.

    Args:
        a: float16 or bfloat16 ``[..., K]``, unit stride along K. The op itself takes 2-D
            ``[M, K]`` (row stride may exceed K); this wrapper flattens the leading dimensions
            into M and gives the result back as ``[..., N]``. Every other tensor must be
            contiguous.
        b_q_weight: int32 ``[K/16, 2N]``, Marlin layout (:func:`marlin_repack`).
        b_scales: same dtype as ``a``, ``[G, N]``, permuted with
            :func:`w4kernels.quant.marlin_permute_scales`. G = 1 means per-channel. A dtype
            that differs from ``a``'s is an error that says which cast to apply.
        b_zeros: int32 ``[G, N/8]`` Marlin zero points (:func:`quant.marlin_zero_points`), or
            None for symmetric weights (zero point 8).
        g_idx: int32 ``[K]`` group of each Marlin row, *sorted* (``g_idx[perm]``), or None.
        perm: int32 ``[K]`` act-order permutation (``argsort`` of the GPTQ g_idx), or None.
        workspace: int32, contiguous, at least 1 element, all zeros on first use (the GPU
            kernel's split-K arrival counters, one per output tile that splits; it is left
            zeroed). Any size works: split-K is used only when every tile's counter fits, so
            vLLM's ``marlin_make_workspace_new`` (one int per SM) and :func:`marlin_workspace`
            both do. Host backends check that it is zero; on the GPU a dirty workspace cannot
            hang but gives wrong results, and two calls running concurrently (two streams)
            need two workspaces.
        num_bits: 4.
        size_m: M, the number of activation rows: the product of ``a``'s leading dimensions
            (kept, as in the schema, and checked against ``a``).
        size_n, size_k: N, K. K is the local K of this shard.
        is_k_full: False when this is a row-parallel shard of an act-order layer: ``b_scales``
            then holds every group of the full layer and ``g_idx`` indexes it directly. With
            act-order and ``is_k_full``, G must divide K (without act-order it always must).
            Default True (the schema has no default).
        b_bias: optional ``[N]`` bias in ``a``'s dtype, in natural column order (vLLM's op
            takes it Marlin-permuted; :func:`w4kernels.vllm.gptq_marlin_gemm` converts).
        use_fp32_reduce: accepted for vLLM compatibility; every backend reduces in fp32.

    Returns:
        ``[..., N]`` in ``a``'s dtype (``[M, N]`` for a 2-D ``a``).
    """
    _check_activation_dtype("w4a16_gemm", "a", a, "b_scales", b_scales)
    a2, lead = _flatten_rows("w4a16_gemm", "a", a)
    if a.dim() != 2 and a2.shape[0] != size_m:  # 2-D: the op's own check names the shapes
        raise ValueError(f"w4a16_gemm: size_m = {size_m}, but a of shape {list(a.shape)} has "
                         f"{a2.shape[0]} rows (the product of its leading dimensions)")
    out = torch.ops.w4kernels.w4a16_gemm(a2, b_q_weight, b_scales, b_zeros, g_idx, perm,
                                         workspace, num_bits, size_m, size_n, size_k, is_k_full,
                                         b_bias, use_fp32_reduce)
    return out if lead is None else out.reshape(*lead, size_n)


def marlin_workspace(size_n: int, device=None) -> torch.Tensor:
    """A zeroed workspace large enough for :func:`w4a16_gemm` with this N."""
    return torch.zeros(max(size_n // 64, 1) * 16, dtype=torch.int32, device=device)


# ---- AWQ ----------------------------------------------------------------------------------


def awq_dequantize(qweight: torch.Tensor, scales: torch.Tensor, qzeros: torch.Tensor,
                   split_k_iters: int = 0, thx: int = 0, thy: int = 0) -> torch.Tensor:
    """Dequantize an AutoAWQ ``WQLinear_GEMM`` weight (vLLM ``awq_dequantize``).

    Args:
        qweight: int32 ``[K, N/8]``; column ``8c + j`` is nibble ``[0, 4, 1, 5, 2, 6, 3, 7][j]``
            of word ``[k, c]`` (AWQ order).
        scales: float16 or bfloat16 ``[G, N]``; group size = K / G.
        qzeros: int32 ``[G, N/8]``, zero points packed like ``qweight``.
        split_k_iters, thx, thy: accepted for vLLM compatibility; 0 (the default here; the
            schema has none) lets the kernel choose.

    Returns:
        ``[K, N]`` in ``scales``' dtype: ``(q - z) * s`` rounded once to nearest-even.
    """
    return torch.ops.w4kernels.awq_dequantize(qweight, scales, qzeros, split_k_iters, thx, thy)


def awq_gemm(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, qzeros: torch.Tensor,
             split_k_iters: int = 8) -> torch.Tensor:
    """``x @ awq_dequantize(qweight, scales, qzeros)`` without materializing the weight.

    Arguments in the op schema's order: scales third, zero points fourth (as vLLM's kernel
    reads them).

    Args:
        x: float16 or bfloat16 ``[..., K]``, the dtype of ``scales`` (a different dtype is an
            error that says which cast to apply). The op takes 2-D ``[M, K]``; this wrapper
            flattens the leading dimensions and returns ``[..., N]``.
        qweight, scales, qzeros: as :func:`awq_dequantize`.
        split_k_iters: vLLM's K-split factor for the GPU kernel (1..32); the result does not
            depend on it beyond fp32 summation order. Default 8 (the schema has no default).

    Returns:
        ``[..., N]`` in ``x``'s dtype, accumulated in fp32.
    """
    _check_activation_dtype("awq_gemm", "x", x, "scales", scales)
    x2, lead = _flatten_rows("awq_gemm", "x", x)
    out = torch.ops.w4kernels.awq_gemm(x2, qweight, scales, qzeros, split_k_iters)
    return out if lead is None else out.reshape(*lead, out.shape[-1])


# ---- int8-activation mode (CPU) ------------------------------------------------------------
#
# Opt-in speed mode for the Marlin and AWQ formats on the CPU: the activations are quantized per
# call to int8, per row and per block of K (symmetric, scale = absmax / 127, as llama.cpp's Q8_0
# and ONNX Runtime's MatMulNBits accuracy level 4), the int4 x int8 products are summed exactly
# in int32 (AVX512-VNNI vpdpbusd) and scaled in fp32. It is NOT the w4a16 contract: the
# activation rounding adds an error (bound below) that w4a16_gemm / awq_gemm do not have, so it
# is never their default. CPU only: there is no CUDA kernel (a CUDA tensor is an error).

A8_DOC = """Numerics of the int8-activation mode (w4a8_gemm, awq_gemm_a8).

    Activation blocks: the block is the weight group when the group is <= 128 rows of K (32, 64,
    128), else the largest of 128, 64, 32, 16 dividing it (per channel: of K). For row m and
    block b (rows in the weight's row order, act-order applied):
    ``sa = absmax(a[m, b]) / 127`` (fp32), ``qa = round_half_even(a / sa)`` in [-127, 127]
    (an all-zero block: sa = 0, qa = 0; a NaN or inf in the block makes that row's outputs NaN).
    Then, exactly in int32, ``isum = sum_k q * qa - z * sum_k qa`` (q the 0..15 codes, z the zero
    point: 8 for symmetric GPTQ) and in fp32, blocks ascending,
    ``acc = fma(float(isum), sa * sw, acc)``, ``y = acc (+ bias)``, ``out = T(y)``. Every CPU path
    (AVX-512 VNNI, portable C++) gives the same bits, with any thread count.

    Error bound against the float64 product of the *unquantized* activation with the exact
    weight ``w = (q - z) * sw`` (not rounded to T: the mode never rounds the weight):
    ``|out - a @ w| <= sum_b (sa_b / 2) (1 + 2^-16) sum_{k in b} |w[k, n]|``
    ``             + (B + 2) 2^-24 (sum_b |isum_b * sa_b * sw| + |bias|)``
    ``             + 2^-p |out|``
    (B blocks of K; p = 8 for bf16, 11 for fp16: the output rounding). The first term is the
    activation rounding, ``|a - sa * qa| <= sa / 2`` per element (plus the fp32 rounding of
    ``a / sa``, <= 127 * 2^-24 * sa); it dominates. tests/test_int8_act.py checks the bound on
    random inputs and on blocks with outliers, and the kernel against
    :func:`w4kernels.reference.w4a8_gemm` (the same quantized activation, float64 sums).
    Measured typical error (relative Frobenius norm of ``out - a @ w`` over ``|a @ w|``; normal
    activations, uniform codes, scales 0.001-0.02 of both signs, M = 16, K = 4096, N = 512):
    5.3e-3 to 6.7e-3 for bf16 and fp16 alike (groups 32 and 128, per channel), against
    1.7e-3 to 2.2e-3 (bf16) and 2.1e-4 to 2.8e-4 (fp16) for the exact ``w4a16_gemm`` on the same
    inputs (its error is the rounding of the weight and of the output to T).
    """


def w4a8_gemm(a: torch.Tensor, b_q_weight: torch.Tensor, b_scales: torch.Tensor,
              b_zeros: Optional[torch.Tensor], g_idx: Optional[torch.Tensor],
              perm: Optional[torch.Tensor], num_bits: int, size_m: int, size_n: int,
              size_k: int, is_k_full: bool = True,
              b_bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """int8-activation mode of :func:`w4a16_gemm` (CPU only): Marlin-format int4 weights times
    activations quantized per call to int8 (dynamic, symmetric, per row and block of K).

    ``out[m, n] ~= sum_r a[m, perm[r]] * (q[r, n] - z) * s (+ b_bias[n])`` with the activation
    rounded to int8 per block (numerics and error bound: ``A8_DOC`` in this module). Arguments
    as :func:`w4a16_gemm`, in its order, without ``workspace`` and ``use_fp32_reduce`` (the GPU
    kernel's): None or empty mean "absent" for ``b_zeros``, ``g_idx``, ``perm``, ``b_bias``.

    Args:
        a: float16 or bfloat16 ``[..., K]``, unit stride along K (the op takes ``[M, K]``, row
            stride may exceed K; this wrapper flattens the leading dimensions). CPU.
        b_q_weight: int32 ``[K/16, 2N]``, Marlin layout (:func:`marlin_repack`).
        b_scales: ``a``'s dtype, ``[G, N]``, Marlin-permuted; G = 1 is per channel. The group
            size K / G must be a multiple of 16.
        b_zeros: int32 ``[G, N/8]`` Marlin zero points, or None (symmetric: zero point 8).
        g_idx: int32 ``[K]``, the group of each Marlin row, sorted, or None. With act-order it
            must be in group order, ``g_idx[r] == r // (K / G)`` (the sorted g_idx of every full
            GPTQ desc_act layer), and ``is_k_full`` True.
        perm: int32 ``[K]`` act-order permutation (Marlin row r multiplies ``a[:, perm[r]]``),
            or None.
        num_bits: 4. size_m: M (rows of ``a``). size_n: N, a multiple of 64. size_k: K, a
            multiple of 16.
        is_k_full: must be True with act-order (default True).
        b_bias: optional ``[N]`` in ``a``'s dtype, natural column order, added in fp32.

    Returns:
        ``[..., N]`` in ``a``'s dtype.
    """
    _check_activation_dtype("w4a8_gemm", "a", a, "b_scales", b_scales)
    a2, lead = _flatten_rows("w4a8_gemm", "a", a)
    if a.dim() != 2 and a2.shape[0] != size_m:
        raise ValueError(f"w4a8_gemm: size_m = {size_m}, but a of shape {list(a.shape)} has "
                         f"{a2.shape[0]} rows (the product of its leading dimensions)")
    out = torch.ops.w4kernels.w4a8_gemm(a2, b_q_weight, b_scales, b_zeros, g_idx, perm, num_bits,
                                        size_m, size_n, size_k, is_k_full, b_bias)
    return out if lead is None else out.reshape(*lead, size_n)


def awq_gemm_a8(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                qzeros: torch.Tensor) -> torch.Tensor:
    """int8-activation mode of :func:`awq_gemm` (CPU only): AutoAWQ tensors as stored, the
    activations quantized per call to int8 (numerics and error bound: ``A8_DOC``).

    Args:
        x: float16 or bfloat16 ``[..., K]`` in ``scales``' dtype, unit stride along K (the op
            takes ``[M, K]``; this wrapper flattens the leading dimensions). CPU.
        qweight: int32 ``[K, N/8]``; column ``8c + j`` is nibble ``[0, 4, 1, 5, 2, 6, 3, 7][j]``
            of word ``[k, c]``. N must be a multiple of 64.
        scales: float16 or bfloat16 ``[G, N]``; the group size K / G must be a multiple of 16.
        qzeros: int32 ``[G, N/8]``, zero points packed like ``qweight``.

    Returns:
        ``[..., N]`` in ``x``'s dtype.
    """
    _check_activation_dtype("awq_gemm_a8", "x", x, "scales", scales)
    x2, lead = _flatten_rows("awq_gemm_a8", "x", x)
    out = torch.ops.w4kernels.awq_gemm_a8(x2, qweight, scales, qzeros)
    return out if lead is None else out.reshape(*lead, out.shape[-1])


w4a8_gemm.__doc__ += "\n" + A8_DOC
awq_gemm_a8.__doc__ += "\n" + A8_DOC


# ---- KleidiAI -----------------------------------------------------------------------------
#
# Layouts (names as KleidiAI's): qsi4cxp = per-channel signed int4 RHS, qsi4c32p = per-block
# (bl) signed int4 RHS with bf16 scales, qai8dxp = per-row asymmetric int8 LHS; "nxk"/"kxn" is
# the source orientation and "s1s0" says two int4 per byte, low nibble = lower index. The byte
# layouts are spelled out in :mod:`w4kernels.reference` ("KleidiAI" section). Defaults
# (nr, kr, sr) = (8, 16, 2) are what the fast x86 kernels are written for; other legal values
# run the scalar kernel. Kernel path: ``isa="auto"`` (env ``W4K_KLEIDIAI_ISA`` if set, else the
# best the CPU has), or "avx512", "avxvnni", "avx2", "scalar".
#
# Packed buffers have no header (they stay byte-identical with KleidiAI's), so the parameters a
# buffer was packed with are the caller's contract: a matmul must get the same n, k, bl, nr, kr,
# sr (RHS) and m, k, mr, kr, sr (LHS) as the packer did. What the ops check: the byte count, and
# the per-row metadata every packer writes (LHS zero points in [-127, 128] and positive finite
# 1/scale; per-channel rsum a multiple of 16 within the int4 range, finite scale and bias;
# per-block finite bf16 scales of the first and last K block, finite rsum and bias). Parameters
# that give the same byte count (per-channel n=24, k=128 and per-block bl=64 are both 1824
# bytes; an LHS of m % 4 == 0 rows is as long for mr=4 as for mr=1; nr=8 and nr=1 at n=8) are
# thus caught by their metadata, which land on other data. Not caught: a different kr / sr
# (same metadata, weights in another order), and a buffer whose bytes were altered without
# breaking those invariants. The packers refuse non-finite scales and biases and the quantizers
# non-finite activations, so no packed buffer carries a NaN or an infinity.


def rhs_packed_size_qsi4cxp(n: int, k: int, nr: int = 8, kr: int = 16, sr: int = 2) -> int:
    """Bytes of a per-channel packed RHS (KleidiAI ``kai_get_rhs_packed_size_*_qsi4cxp_*``)."""
    return torch.ops.w4kernels.rhs_packed_size_qsi4cxp(n, k, nr, kr, sr)


def rhs_packed_size_qsi4c32p(n: int, k: int, bl: int, nr: int = 8, kr: int = 16,
                             sr: int = 2) -> int:
    """Bytes of a per-block packed RHS (KleidiAI ``kai_get_rhs_packed_size_*_qsi4c32p_*``)."""
    return torch.ops.w4kernels.rhs_packed_size_qsi4c32p(n, k, bl, nr, kr, sr)


def lhs_packed_size_qai8dxp(m: int, k: int, mr: int = 1, kr: int = 16, sr: int = 2) -> int:
    """Bytes of a packed LHS (KleidiAI ``kai_get_lhs_packed_size_lhs_quant_pack_qai8dxp_f32``)."""
    return torch.ops.w4kernels.lhs_packed_size_qai8dxp(m, k, mr, kr, sr)


def rhs_pack_nxk_qsi4cxp_qs4cxs1s0(rhs: torch.Tensor, scale: torch.Tensor,
                                   bias: Optional[torch.Tensor], n: int, k: int, nr: int = 8,
                                   kr: int = 16, sr: int = 2,
                                   rhs_zero_point: int = 8) -> torch.Tensor:
    """Pack a per-channel int4 weight (N x K source) like KleidiAI, byte for byte.

    Args:
        rhs: uint8 ``[n, ceil(k/2)]``; element (n, k) is the low nibble of byte ``k // 2`` for
            even k, the high nibble for odd k.
        scale: float32 ``[n]``, the dequantization scale: w = (q - rhs_zero_point) * scale;
            finite (rejected otherwise, see the section comment).
        bias: float32 ``[n]`` or None (zeros are stored); finite.
        n, k: N, K (any positive K; K is padded to a multiple of 32).
        nr, kr, sr: KleidiAI packing parameters; kr % sr == 0 and kr / sr divides 16.
        rhs_zero_point: 8 (nibbles are unsigned 0..15) or 0 (nibbles are signed int4).

    Returns:
        uint8 ``[rhs_packed_size_qsi4cxp(n, k, nr, kr, sr)]``.
    """
    return torch.ops.w4kernels.rhs_pack_nxk_qsi4cxp_qs4cxs1s0(rhs, scale, bias, n, k, nr, kr, sr,
                                                              rhs_zero_point)


def rhs_pack_kxn_qsi4cxp_qs4cxs1s0(rhs: torch.Tensor, scale: torch.Tensor,
                                   bias: Optional[torch.Tensor], n: int, k: int, nr: int = 8,
                                   kr: int = 16, sr: int = 2,
                                   rhs_zero_point: int = 8) -> torch.Tensor:
    """As :func:`rhs_pack_nxk_qsi4cxp_qs4cxs1s0` from a K x N source: uint8 ``[k, ceil(n/2)]``,
    element (k, n) in byte ``n // 2``, low nibble for even n."""
    return torch.ops.w4kernels.rhs_pack_kxn_qsi4cxp_qs4cxs1s0(rhs, scale, bias, n, k, nr, kr, sr,
                                                              rhs_zero_point)


def rhs_pack_nxk_qsi4c32p_qsu4c32s1s0(rhs: torch.Tensor, scale: torch.Tensor,
                                      bias: Optional[torch.Tensor], n: int, k: int, bl: int,
                                      nr: int = 8, kr: int = 16, sr: int = 2) -> torch.Tensor:
    """Pack a per-block uint4 weight (zero point 8; N x K source) like KleidiAI, byte for byte.

    Args:
        rhs: uint8 ``[n, k/2]``, low nibble = even k.
        scale: bfloat16 ``[n, k/bl]``: w = (q - 8) * scale[n, k // bl]; finite.
        bias: float32 ``[n]`` or None; finite.
        bl: block length, a multiple of 32 (and of kr) dividing k. nr: a multiple of 4.

    Returns:
        uint8 ``[rhs_packed_size_qsi4c32p(n, k, bl, nr, kr, sr)]``.
    """
    return torch.ops.w4kernels.rhs_pack_nxk_qsi4c32p_qsu4c32s1s0(rhs, scale, bias, n, k, bl, nr,
                                                                 kr, sr)


def rhs_pack_kxn_qsi4c32p_qsu4c32s1s0(rhs: torch.Tensor, scale: torch.Tensor,
                                      bias: Optional[torch.Tensor], n: int, k: int, bl: int,
                                      nr: int = 8, kr: int = 16, sr: int = 2) -> torch.Tensor:
    """As :func:`rhs_pack_nxk_qsi4c32p_qsu4c32s1s0` from a K x N source uint8 ``[k, ceil(n/2)]``."""
    return torch.ops.w4kernels.rhs_pack_kxn_qsi4c32p_qsu4c32s1s0(rhs, scale, bias, n, k, bl, nr,
                                                                 kr, sr)


def lhs_quant_pack_qai8dxp_f32(lhs: torch.Tensor, mr: int = 1, kr: int = 16,
                               sr: int = 2) -> torch.Tensor:
    """Quantize f32 activations per row to asymmetric int8 and pack them like KleidiAI.

    Args:
        lhs: float32 ``[m, k]`` (unit stride along k; finite values: NaN or infinity is
            rejected, a row's int8 quantization has no meaning for them).
        mr: rows interleaved per group; kr, sr: as the RHS (only kr / sr matters here).

    Returns:
        uint8 ``[lhs_packed_size_qai8dxp(m, k, mr, kr, sr)]``; slots of rows >= m in the last
        group are 0.
    """
    return torch.ops.w4kernels.lhs_quant_pack_qai8dxp_f32(lhs, mr, kr, sr)


def matmul_clamp_f32_qai8dxp_qsi4cxp(lhs_packed: torch.Tensor, rhs_packed: torch.Tensor, m: int,
                                     n: int, k: int, mr: int = 1, nr: int = 8, kr: int = 16,
                                     sr: int = 2, clamp_min: Optional[float] = None,
                                     clamp_max: Optional[float] = None,
                                     out_dtype: Optional[torch.dtype] = None,
                                     isa: str = "auto") -> torch.Tensor:
    """Packed int8 LHS (qai8dxp) times packed per-channel int4 RHS (qsi4cxp) -> ``[m, n]``.

    KleidiAI's epilogue: ``iacc = 16*dot + (-zp)*rsum`` (int32), then
    ``clamp((f32(iacc) * rhs_scale) * lhs_scale + bias, clamp_min, clamp_max)``.

    Args:
        lhs_packed: uint8 from :func:`lhs_quant_pack_qai8dxp_f32` (same m, k, mr, kr, sr: the
            caller's contract; see the section comment for what is checked).
        rhs_packed: uint8 from a qsi4cxp packer (same n, k, nr, kr, sr, likewise).
        clamp_min, clamp_max: None = -FLT_MAX / FLT_MAX.
        out_dtype: torch.float32 (default) or torch.bfloat16 (the f32 result rounded to nearest).
        isa: kernel path, see the section comment.
    """
    return torch.ops.w4kernels.matmul_clamp_f32_qai8dxp_qsi4cxp(
        lhs_packed, rhs_packed, m, n, k, mr, nr, kr, sr, clamp_min, clamp_max, out_dtype, isa)


def matmul_clamp_f32_qai8dxp_qsi4c32p(lhs_packed: torch.Tensor, rhs_packed: torch.Tensor, m: int,
                                      n: int, k: int, bl: int, mr: int = 1, nr: int = 8,
                                      kr: int = 16, sr: int = 2,
                                      clamp_min: Optional[float] = None,
                                      clamp_max: Optional[float] = None,
                                      out_dtype: Optional[torch.dtype] = None,
                                      isa: str = "auto") -> torch.Tensor:
    """Packed int8 LHS (qai8dxp) times packed per-block int4 RHS (qsi4c32p) -> ``[m, n]``.

    KleidiAI's epilogue: ``acc = fma(f32(16*dot_j), s_j/16, acc)`` over K blocks j, then
    ``acc = fma(rsum, f32(-zp), acc)``; out = ``clamp(acc * lhs_scale + bias)``.
    Arguments as :func:`matmul_clamp_f32_qai8dxp_qsi4cxp` plus ``bl``.
    """
    return torch.ops.w4kernels.matmul_clamp_f32_qai8dxp_qsi4c32p(
        lhs_packed, rhs_packed, m, n, k, bl, mr, nr, kr, sr, clamp_min, clamp_max, out_dtype, isa)


def dyn_quant_pack_4bit_weight(weights: torch.Tensor, scales_zeros: torch.Tensor,
                               bias: Optional[torch.Tensor], block_size: int, in_features: int,
                               out_features: int) -> torch.Tensor:
    """Drop-in for ``torch.ops.aten._dyn_quant_pack_4bit_weight`` (same arguments).

    Args:
        weights: uint8 ``[out_features, in_features/2]``, q in 0..15 (value q - 8), low nibble
            = even k.
        scales_zeros: per-channel (``block_size == in_features``): float32 (or bfloat16)
            ``[out_features]`` / ``[out_features, 1]``; per-block: bfloat16
            ``[out_features, in_features/block_size]``.
        bias: float32 ``[out_features]`` or None (PyTorch's x86 fallback rejects a bias; its
            KleidiAI path and this op accept one).
        block_size: in_features, or a multiple of 32 dividing in_features.

    Returns:
        uint8 KleidiAI buffer (nr=8, kr=16, sr=2): qsi4cxp or qsi4c32p.
    """
    return torch.ops.w4kernels.dyn_quant_pack_4bit_weight(weights, scales_zeros, bias, block_size,
                                                          in_features, out_features)


def dyn_quant_matmul_4bit(inp: torch.Tensor, packed_weights: torch.Tensor, block_size: int,
                          in_features: int, out_features: int,
                          isa: str = "auto") -> torch.Tensor:
    """Drop-in for ``torch.ops.aten._dyn_quant_matmul_4bit``: quantize ``inp`` per row to int8
    (qai8dxp), multiply by the packed weight, add the bias.

    Args:
        inp: float32 or bfloat16 ``[..., in_features]``; the result has inp's dtype.
        packed_weights: from :func:`dyn_quant_pack_4bit_weight` with the same sizes and
            block_size (the caller's contract: a buffer of another block_size is rejected by
            its size or, where the sizes coincide, by its metadata; see the section comment).
        inp must be finite (NaN or infinity has no int8 quantization: rejected).

    Returns:
        ``[..., out_features]``.
    """
    return torch.ops.w4kernels.dyn_quant_matmul_4bit(inp, packed_weights, block_size,
                                                     in_features, out_features, isa)


def cpu_thread_stats() -> dict:
    """How the CPU Marlin / AWQ GEMMs' multi-threaded jobs ran so far in this process.

    ``openmp``: jobs run on torch's OpenMP team; ``own``: on the library's own workers;
    ``late_openmp``: OpenMP jobs whose calling thread waited at the region's end for a team
    thread that started late or was preempted (each sends the next 32 jobs or more to the own
    workers); ``steered_wakes``: own workers woken from their sleep with the calling thread's CPU
    taken out of their CPU mask for that job (so the scheduler cannot queue them behind the
    caller; ``W4K_QUEUE_STEER=0`` turns it off). ``W4K_QUEUE=auto|omp|own`` chooses (default
    auto; README "Threads").
    """
    openmp, own, late, steered = torch.ops.w4kernels.cpu_thread_stats()
    return {"openmp": openmp, "own": own, "late_openmp": late, "steered_wakes": steered}


def kleidiai_isa(isa: str = "auto") -> str:
    """The kernel path ``isa`` resolves to on this CPU (raises if the CPU lacks it)."""
    return torch.ops.w4kernels.kleidiai_isa(isa)


def kleidiai_isas() -> list:
    """Every kernel path this CPU can run, best last (for tests and benchmarks)."""
    out = []
    for name in ("scalar", "avx2", "avxvnni", "avx512"):
        try:
            out.append(kleidiai_isa(name))
        except RuntimeError:
            pass
    return out
