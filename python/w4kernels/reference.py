"""Plain-torch reference of every operator: the executable spec every backend is tested against.

Written to be read, not to be fast. Notation: K = ``size_k`` (reduction dim), N = ``size_n``,
``q[k, n]`` the uint4 code (0..15) of logical weight element (k, n), G the number of groups.

Packings of ``q`` (where element (k, n) ends up), in CuTe-like (shape : stride) words:

* **GPTQ** ``int32 [K/8, N]``: nibble ``k % 8`` of word ``[k // 8, n]``
  (bits ``4*(k%8) .. +3``). Symmetric GPTQ stores ``code = value + 8``.
* **AWQ** ``int32 [K, N/8]`` (AutoAWQ ``WQLinear_GEMM``): word ``[k, n // 8]``, nibble
  ``AWQ_NIBBLE[n % 8]`` with ``AWQ_NIBBLE = [0, 4, 1, 5, 2, 6, 3, 7]``; equivalently nibble ``i``
  holds column ``8c + AWQ_ORDER[i]``, ``AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]``.
* **Marlin** ``int32 [K/16, 2N]``: the K x N matrix is cut into 16x16 tiles; row ``kt`` of the
  output holds tiles ``(kt, 0), (kt, 1), ...`` each flattened row-major (256 values), i.e. value
  ``(k, n)`` sits at position ``(n // 16) * 256 + (k % 16) * 16 + n % 16`` of the 16N-value row
  ``k // 16``. The rows, concatenated, are cut into 1024-value chunks (four tiles: the
  ``m16n8k16`` B fragments of one warp for 64 columns) and within each chunk position ``p``
  receives ``chunk[MARLIN_PERM[p]]`` (:func:`marlin_weight_perm`). Packed position ``p`` is
  nibble ``p % 8`` of int32 ``p // 8``. The permutation puts the 8 values one thread of a warp
  needs in one int32, in the order the fast int4->fp16 conversion (lop3 on nibbles 0/4, 1/5, ...)
  produces them.
* **Marlin scales** ``[G, N]``: each 64-column chunk (G > 1) is permuted by
  ``SCALE_PERM[8i + j] = i + 8j``, or each 32-column chunk (G == 1, per-channel) by
  ``SCALE_PERM_SINGLE[8i + j] = 2i + [0, 1, 8, 9, 16, 17, 24, 25][j]``.
* **Marlin zero points** ``int32 [G, N/8]``: zero points ``[G, N]`` permuted per 64 columns by
  ``SCALE_PERM``, then per 8 columns by ``AWQ_ORDER``, then packed 8 per int32 along N
  (nibble i = column ``8j + i``).
"""

from typing import Optional

import math

import torch

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # nibble i of an AWQ word holds column 8c + AWQ_ORDER[i]
AWQ_NIBBLE = [0, 4, 1, 5, 2, 6, 3, 7]  # column 8c + j sits in nibble AWQ_NIBBLE[j]


# ---- bit packing along one dimension ------------------------------------------------------


def pack_rows(q: torch.Tensor) -> torch.Tensor:
    """uint4 codes ``[K, N]`` -> int32 ``[K/8, N]``, value k in nibble ``k % 8`` (GPTQ)."""
    k, n = q.shape
    q = q.to(torch.int64).reshape(k // 8, 8, n)
    words = sum(q[:, i, :] << (4 * i) for i in range(8))
    return _to_int32(words)


def unpack_rows(packed: torch.Tensor, size_k: int) -> torch.Tensor:
    """int32 ``[K/8, N]`` -> codes ``[K, N]`` (int32), inverse of :func:`pack_rows`."""
    w = packed.to(torch.int64) & 0xFFFFFFFF
    q = torch.stack([(w >> (4 * i)) & 15 for i in range(8)], dim=1)
    return q.reshape(-1, packed.shape[1])[:size_k].to(torch.int32)


def pack_cols(q: torch.Tensor) -> torch.Tensor:
    """uint4 codes ``[R, N]`` -> int32 ``[R, N/8]``, column 8j+i in nibble i of word j."""
    r, n = q.shape
    q = q.to(torch.int64).reshape(r, n // 8, 8)
    return _to_int32(sum(q[:, :, i] << (4 * i) for i in range(8)))


def unpack_cols(packed: torch.Tensor) -> torch.Tensor:
    """int32 ``[R, N/8]`` -> codes ``[R, N]`` (int32), inverse of :func:`pack_cols`."""
    w = packed.to(torch.int64) & 0xFFFFFFFF
    return torch.stack([(w >> (4 * i)) & 15 for i in range(8)], dim=2).reshape(
        packed.shape[0], -1).to(torch.int32)


def _to_int32(words: torch.Tensor) -> torch.Tensor:
    """Reinterpret unsigned 32-bit values held in int64 as int32 (two's complement)."""
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def awq_pack(q: torch.Tensor) -> torch.Tensor:
    """uint4 codes ``[R, N]`` -> AutoAWQ int32 ``[R, N/8]`` (nibble i = column 8c+AWQ_ORDER[i])."""
    r, n = q.shape
    return pack_cols(q.reshape(r, n // 8, 8)[:, :, AWQ_ORDER].reshape(r, n))


def awq_unpack(packed: torch.Tensor) -> torch.Tensor:
    """AutoAWQ int32 ``[R, N/8]`` -> codes ``[R, N]`` (int32), inverse of :func:`awq_pack`."""
    q = unpack_cols(packed)
    r, n = q.shape
    return q.reshape(r, n // 8, 8)[:, :, AWQ_NIBBLE].reshape(r, n)


# ---- Marlin layout ------------------------------------------------------------------------


def marlin_weight_perm() -> torch.Tensor:
    """The 1024-entry permutation of one Marlin chunk: packed position p takes chunk[perm[p]].

    For thread i of a warp (i in 0..31), the 8 values it needs from a 16x16 tile are rows
    ``2(i%4), 2(i%4)+1, 2(i%4)+8, 2(i%4)+9`` of columns ``i//4`` and ``i//4 + 8`` (the B
    fragment of ``mma.m16n8k16`` for both 8-column halves); the four tiles of a chunk follow at
    +256 each, and each group of 8 is reordered by ``AWQ_ORDER`` for the int4->fp16 trick.
    """
    perm = []
    for i in range(32):
        col = i // 4
        base = [16 * row + col + 8 * block
                for block in (0, 1)
                for row in (2 * (i % 4), 2 * (i % 4) + 1, 2 * (i % 4 + 4), 2 * (i % 4 + 4) + 1)]
        for j in range(4):
            perm.extend(p + 256 * j for p in base)
    perm = torch.tensor(perm).reshape(-1, 8)[:, AWQ_ORDER].reshape(-1)
    return perm


def marlin_tile_rows(q: torch.Tensor) -> torch.Tensor:
    """``[K, N]`` (any dtype) -> ``[K/16, 16N]``, the values of Marlin row ``k // 16`` before the
    chunk permutation: 16x16 tiles ``(kt, 0), (kt, 1), ...`` each flattened row-major, i.e.
    ``(k, n)`` at position ``(n // 16) * 256 + (k % 16) * 16 + n % 16``. Shared by
    :func:`marlin_pack` and :mod:`w4kernels.layout`."""
    k, n = q.shape
    return q.reshape(k // 16, 16, n // 16, 16).permute(0, 2, 1, 3).reshape(k // 16, n * 16)


def marlin_pack(q: torch.Tensor) -> torch.Tensor:
    """uint4 codes ``[K, N]`` (K % 16 == 0, K*N % 1024 == 0) -> Marlin int32 ``[K/16, 2N]``."""
    k, n = q.shape
    tiles = marlin_tile_rows(q)
    permuted = tiles.reshape(-1, 1024)[:, marlin_weight_perm()].reshape(k // 16, n * 16)
    return pack_cols(permuted)


def marlin_unpack(packed: torch.Tensor, size_k: int, size_n: int) -> torch.Tensor:
    """Marlin int32 ``[K/16, 2N]`` -> codes ``[K, N]`` (int32), inverse of :func:`marlin_pack`."""
    permuted = unpack_cols(packed).reshape(-1, 1024)
    chunk = torch.empty_like(permuted)
    chunk[:, marlin_weight_perm()] = permuted
    tiles = chunk.reshape(size_k // 16, size_n // 16, 16, 16).permute(0, 2, 1, 3)
    return tiles.reshape(size_k, size_n)


def marlin_repack(b_q_weight: torch.Tensor, perm: Optional[torch.Tensor], size_k: int,
                  size_n: int, num_bits: int = 4) -> torch.Tensor:
    """GPTQ int32 ``[K/8, N]`` (+ act-order ``perm``: Marlin row r = GPTQ row perm[r]) -> Marlin."""
    q = unpack_rows(b_q_weight, size_k)
    if perm is not None and perm.numel() > 0:
        q = q[perm.long()]
    return marlin_pack(q)


def awq_marlin_repack(b_q_weight: torch.Tensor, size_k: int, size_n: int,
                      num_bits: int = 4) -> torch.Tensor:
    """AutoAWQ int32 ``[K, N/8]`` -> Marlin int32 ``[K/16, 2N]``."""
    return marlin_pack(awq_unpack(b_q_weight))


def marlin_scale_perms():
    """(SCALE_PERM, SCALE_PERM_SINGLE): the 64-wide (grouped) and 32-wide (per-channel) perms."""
    scale_perm = [i + 8 * j for i in range(8) for j in range(8)]
    scale_perm_single = [2 * i + j for i in range(4) for j in (0, 1, 8, 9, 16, 17, 24, 25)]
    return scale_perm, scale_perm_single


def marlin_permute_scales(s: torch.Tensor, size_k: int, size_n: int,
                          group_size: int) -> torch.Tensor:
    """Scales ``[G, N]`` -> Marlin order (vLLM ``marlin_permute_scales``)."""
    scale_perm, scale_perm_single = marlin_scale_perms()
    p = scale_perm if (group_size != -1 and group_size < size_k) else scale_perm_single
    return s.reshape(-1, len(p))[:, p].reshape(-1, size_n).contiguous()


def marlin_unpermute_scales(s: torch.Tensor, size_n: int) -> torch.Tensor:
    """Inverse of :func:`marlin_permute_scales`; the permutation follows from G = s.shape[0]."""
    scale_perm, scale_perm_single = marlin_scale_perms()
    p = torch.tensor(scale_perm if s.shape[0] > 1 else scale_perm_single)
    out = torch.empty_like(s.reshape(-1, len(p)))
    out[:, p] = s.reshape(-1, len(p))
    return out.reshape(-1, size_n)


def marlin_zero_points(zp: torch.Tensor, size_k: int, size_n: int,
                       num_bits: int = 4) -> torch.Tensor:
    """Zero points ``[G, N]`` (0..15) -> Marlin int32 ``[G, N/8]``. ``size_k`` is G, as in vLLM."""
    scale_perm, _ = marlin_scale_perms()
    zp = zp.reshape(-1, 64)[:, scale_perm].reshape(-1, 8)[:, AWQ_ORDER]
    return pack_cols(zp.reshape(-1, size_n))


def marlin_unpack_zero_points(packed: torch.Tensor, size_n: int) -> torch.Tensor:
    """Marlin int32 ``[G, N/8]`` -> zero points ``[G, N]``, inverse of :func:`marlin_zero_points`."""
    scale_perm, _ = marlin_scale_perms()
    z = unpack_cols(packed).reshape(-1, 8)
    z8 = torch.empty_like(z)
    z8[:, AWQ_ORDER] = z
    z8 = z8.reshape(-1, 64)
    out = torch.empty_like(z8)
    out[:, scale_perm] = z8
    return out.reshape(-1, size_n)


def awq_to_marlin_zero_points(qzeros: torch.Tensor, size_k: int, size_n: int,
                              num_bits: int = 4) -> torch.Tensor:
    """AutoAWQ qzeros ``[G, N/8]`` -> Marlin zero points ``[G, N/8]`` (``size_k`` is G)."""
    return marlin_zero_points(awq_unpack(qzeros), size_k, size_n, num_bits)


# ---- dequantization and GEMMs -------------------------------------------------------------


def awq_dequantize(qweight: torch.Tensor, scales: torch.Tensor, qzeros: torch.Tensor,
                   split_k_iters: int = 0, thx: int = 0, thy: int = 0) -> torch.Tensor:
    """``w[k, n] = (q[k, n] - z[g, n]) * s[g, n]``, ``g = k // (K / G)``, in ``scales.dtype``.

    The product of a 5-bit integer and a 16-bit float is exact in float32, so rounding that to
    fp16/bf16 is the single round-to-nearest-even of the exact value. ``+ 0.0`` turns a -0.0
    (q == z, negative scale) into +0.0, as the GPU kernel's fma(q - z, s, +0) does.
    """
    size_k = qweight.shape[0]
    group_size = size_k // scales.shape[0]
    q = awq_unpack(qweight)
    z = awq_unpack(qzeros).repeat_interleave(group_size, dim=0)
    s = scales.float().repeat_interleave(group_size, dim=0)
    return ((q - z).float() * s + 0.0).to(scales.dtype)


def awq_gemm(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, qzeros: torch.Tensor,
             split_k_iters: int = 8) -> torch.Tensor:
    """``x @ awq_dequantize(...)`` in float64 (weights rounded to ``scales.dtype`` first, as the
    kernels do), returned in float64 so tests can measure the kernels' error."""
    w = awq_dequantize(qweight, scales, qzeros).double()
    return x.double() @ w


def _marlin_codes_scales(b_q_weight: torch.Tensor, b_scales: torch.Tensor,
                         b_zeros: Optional[torch.Tensor], g_idx: Optional[torch.Tensor],
                         size_k: int, size_n: int):
    """(q - z as int32 [K, N], the scale of each element as float32 [K, N]), Marlin row order."""
    q = marlin_unpack(b_q_weight, size_k, size_n)
    s = marlin_unpermute_scales(b_scales, size_n)
    if g_idx is not None and g_idx.numel() > 0:
        groups = g_idx.long()
    else:
        groups = torch.arange(size_k) // (size_k // s.shape[0])
    if b_zeros is not None and b_zeros.numel() > 0:
        z = marlin_unpack_zero_points(b_zeros, size_n)[groups]
    else:
        z = torch.full_like(q, 8)
    return q - z, s.float()[groups]


def marlin_dequantize(b_q_weight: torch.Tensor, b_scales: torch.Tensor,
                      b_zeros: Optional[torch.Tensor], g_idx: Optional[torch.Tensor],
                      size_k: int, size_n: int) -> torch.Tensor:
    """The weight ``w[r, n]`` of Marlin row r, in ``b_scales.dtype`` (one rounding of (q-z)*s).

    ``g(r) = g_idx[r]`` with act-order (g_idx sorted along Marlin rows), else
    ``r // (K / G)``; z = 8 without zero points (symmetric GPTQ, uint4b8). This is the weight
    :func:`w4a16_gemm` multiplies with when G > 1; per-channel (G == 1) it uses the unrounded
    one (:func:`w4a16_weight`).
    """
    qz, s = _marlin_codes_scales(b_q_weight, b_scales, b_zeros, g_idx, size_k, size_n)
    return (qz.float() * s + 0.0).to(b_scales.dtype)


def w4a16_weight(b_q_weight: torch.Tensor, b_scales: torch.Tensor,
                 b_zeros: Optional[torch.Tensor], g_idx: Optional[torch.Tensor], size_k: int,
                 size_n: int) -> torch.Tensor:
    """The float64 weight of :func:`w4a16_gemm`: per channel (G == 1) the exact ``(q - z) * s``,
    grouped (G > 1) :func:`marlin_dequantize`'s rounded one."""
    if b_scales.shape[0] == 1:
        qz, s = _marlin_codes_scales(b_q_weight, b_scales, b_zeros, g_idx, size_k, size_n)
        return qz.double() * s.double()
    return marlin_dequantize(b_q_weight, b_scales, b_zeros, g_idx, size_k, size_n).double()


def w4a16_gemm(a: torch.Tensor, b_q_weight: torch.Tensor, b_scales: torch.Tensor,
               b_zeros: Optional[torch.Tensor], g_idx: Optional[torch.Tensor],
               perm: Optional[torch.Tensor], workspace: torch.Tensor, num_bits: int, size_m: int,
               size_n: int, size_k: int, is_k_full: bool = True,
               b_bias: Optional[torch.Tensor] = None,
               use_fp32_reduce: bool = True) -> torch.Tensor:
    """``a[:, perm] @ w (+ bias)`` in float64, ``w`` = :func:`w4a16_weight` (see ops.w4a16_gemm).

    The value each kernel approximates with fp32 sums and one rounding of the output:

    * G > 1 (grouped): ``w = T((q - z) * s)``, each weight rounded once to the activation dtype
      T, as the kernels dequantize before they multiply.
    * G == 1 (per-channel): ``w = (q - z) * s`` unrounded, i.e. ``s[n] * sum_k a * (q - z)``
      exactly: the kernels sum ``a * (q - z)`` (exact integers) and multiply the fp32 sum by
      the scale once (vLLM Marlin's structure), then add the bias.
    """
    if perm is not None and perm.numel() > 0:
        a = a[:, perm.long()]
    w = w4a16_weight(b_q_weight, b_scales, b_zeros, g_idx, size_k, size_n)
    out = a.double() @ w
    if b_bias is not None:
        out = out + b_bias.double()
    return out


# ---- int8-activation mode (w4a8_gemm, awq_gemm_a8) ----------------------------------------


def a8_block_size(group_size: int) -> int:
    """Activation block of the int8 mode for a weight group of ``group_size`` rows of K (a
    multiple of 16): the group up to 128 rows, else the largest of 128, 64, 32, 16 dividing it."""
    for b in (128, 64, 32, 16):
        if group_size % b == 0:
            return b
    raise ValueError(f"a8_block_size: the group size must be a multiple of 16, got {group_size}")


def quantize_a8(a: torch.Tensor, block: int):
    """Per row and block of ``block`` columns: ``sa = absmax / 127`` (float32) and
    ``qa = round_half_even(a / sa)`` (int32 in [-127, 127]; 0 where sa is 0, inf or NaN), as the
    kernels compute them (float32 division, correctly rounded). Returns (qa ``[M, K]``,
    sa ``[M, K / block]``)."""
    m, k = a.shape
    x = a.float().reshape(m, k // block, block)
    sa = x.abs().amax(-1) / 127
    ok = (torch.isfinite(sa) & (sa != 0)).unsqueeze(-1)
    q = torch.where(ok, torch.round(x / torch.where(ok, sa.unsqueeze(-1), 1)), 0)
    return q.to(torch.int32).reshape(m, k), sa


def _a8_gemm(a: torch.Tensor, q: torch.Tensor, s: torch.Tensor, z: torch.Tensor,
             group_size: int, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """float64 of the int8 mode: a [M, K] (weight row order), codes q [K, N], scales s [G, N],
    zero points z [G, N]. ``sum_b isum_b * float32(sa_b * sw)``: the integer sums and the
    float32 scale products are the kernels' own; only the fp32 accumulation and the output
    rounding are left out."""
    m, k = a.shape
    n = q.shape[1]
    block = a8_block_size(group_size)
    nb = k // block
    qa, sa = quantize_a8(a, block)
    qz = (q - z.repeat_interleave(group_size, dim=0)).double().reshape(nb, block, n)
    isum = torch.einsum("mbk,bkn->mbn", qa.double().reshape(m, nb, block), qz)  # exact integers
    group_of_block = torch.arange(nb) * block // group_size
    t = (sa.unsqueeze(-1) * s.float()[group_of_block].unsqueeze(0)).double()  # float32 products
    out = (isum * t).sum(1)
    if bias is not None and bias.numel() > 0:
        out = out + bias.double()
    return out


def w4a8_gemm(a: torch.Tensor, b_q_weight: torch.Tensor, b_scales: torch.Tensor,
              b_zeros: Optional[torch.Tensor], g_idx: Optional[torch.Tensor],
              perm: Optional[torch.Tensor], num_bits: int, size_m: int, size_n: int, size_k: int,
              is_k_full: bool = True, b_bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The int8-activation mode of :func:`w4a16_gemm` in float64 (``ops.A8_DOC``): the
    activation quantized exactly as the kernels do, then exact sums."""
    if perm is not None and perm.numel() > 0:
        a = a[:, perm.long()]
    q = marlin_unpack(b_q_weight, size_k, size_n)
    s = marlin_unpermute_scales(b_scales, size_n)
    if b_zeros is not None and b_zeros.numel() > 0:
        z = marlin_unpack_zero_points(b_zeros, size_n)
    else:
        z = torch.full(tuple(s.shape), 8, dtype=torch.int32)
    return _a8_gemm(a, q, s, z, size_k // s.shape[0], b_bias)


def awq_gemm_a8(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                qzeros: torch.Tensor) -> torch.Tensor:
    """The int8-activation mode of :func:`awq_gemm` in float64 (see :func:`w4a8_gemm`)."""
    size_k = qweight.shape[0]
    return _a8_gemm(x, awq_unpack(qweight), scales, awq_unpack(qzeros),
                    size_k // scales.shape[0], None)


# ---- KleidiAI ---------------------------------------------------------------------------------
#
# KleidiAI packed layouts: see KAI_LAYOUT (also appended to each packer's docstring).

import torch  # noqa: E402  (kept local to this section so it stands alone)


KAI_LAYOUT = """KleidiAI packed layouts (the spec of every ``rhs_pack_*`` / ``lhs_quant_pack_*`` below).

    KleidiAI's int4 formats (ARM-software/kleidiai, "kai" below), written from the layout
    formulas. Vocabulary: RHS = the N x K weight, LHS = the M x K activation; nr rows of N are
    packed together, a row's K values go out kr at a time over sr steps, so one *segment* is
    B = kr / sr bytes; bl is the K block of per-block scales; mr LHS rows are interleaved.
    K_i = roundup(K, 32) is the padded K of every packed buffer.

    Packed RHS, one nr-block per rows n0 = b*nr .. n0+nr-1 (rows >= N are padding):

      qsi4cxp (per-channel):  [ weights: nr*K_i/2 B | rsum: nr x int32 | scale: nr x f32 | bias: nr x f32 ]
      qsi4c32p (per-block):   [ per K block j: weights nr*bl/2 B | scale: nr x bf16 ]... [ rsum: nr x f32 | bias: nr x f32 ]

    Weights of one area of L k-values (L = K_i, or bl starting at k = j*bl): byte i, with
      s = i // B, b = i % B:   row r = s % nr,   kk = (s // nr) * B + b,   k0 = kk + (kk // 16) * 16
    holds w(n0 + r, k0) in the low nibble and w(n0 + r, k0 + 16) in the high nibble. In CuTe
    terms, the 32 k of one 16-byte column pair are split k -> (k % 16, k // 16) = (byte, nibble),
    and the bytes are laid out (B, nr, L/2/B) : (1, B, nr*B) - B bytes of row 0, B of row 1, ...
    With the defaults (nr, kr, sr) = (8, 16, 2), one 32-k chunk is 128 bytes: rows 0-7 x 8 bytes
    for k 0-7 / 16-23, then rows 0-7 x 8 bytes for k 8-15 / 24-31.
    Each nibble is w = q - rhs_zero_point as a two's-complement int4 (q ^ 8 for zero point 8, q
    as given for zero point 0); k >= K stores 0.
      rsum (per-channel) = 16 * sum_k w(n, k);  scale = s_n / 16 (the kernels read each nibble
          as 16 * w);  bias = bias_n or 0.
      rsum (per-block) = f32 sum, one term per B-byte segment in increasing k, of
          s_{n,j} * (sum of the segment's 2B values of w);  scale = raw bf16 s_{n,j}.
    Padded rows: NxK source -> copies of row N-1. KxN source -> the byte of row N-1, but the
    nibble chosen by the parity of the *unclamped* n (so with even N they alternate between rows
    N-2 and N-1; with odd N the odd ones read the source's unused pad nibble); scale, bias: row N-1.

    Packed LHS qai8dxp, one mr-group of rows:
      [ int8 values: mr*K_i B | -zero_point: mr x int32 | 1/scale: mr x f32 ]
      value (r, k) of the group at byte ((k // B) * mr + r) * B + k % B; k >= K repeats x[K-1].
"""


def _kai_check_nr_kr_sr(nr, kr, sr):
    if not (1 <= nr <= 256) or kr < 1 or sr < 1 or kr % sr or 16 % (kr // sr):
        raise ValueError(f"nr={nr}, kr={kr}, sr={sr}: need 1 <= nr <= 256, kr % sr == 0 and "
                         "kr / sr dividing 16")


def _kai_roundup(a, b):
    return (a + b - 1) // b * b


def rhs_packed_size_qsi4cxp(n: int, k: int, nr: int = 8, kr: int = 16, sr: int = 2) -> int:
    """Bytes of a per-channel packed RHS: ceil(n/nr) blocks of nr * (K_i/2 + 12)."""
    _kai_check_nr_kr_sr(nr, kr, sr)
    return _kai_roundup(n, nr) // nr * nr * (_kai_roundup(k, 32) // 2 + 12)


def rhs_packed_size_qsi4c32p(n: int, k: int, bl: int, nr: int = 8, kr: int = 16,
                             sr: int = 2) -> int:
    """Bytes of a per-block packed RHS: ceil(n/nr) blocks of nr * ((bl/2 + 2) * K/bl + 8)."""
    _kai_check_nr_kr_sr(nr, kr, sr)
    return _kai_roundup(n, nr) // nr * nr * ((bl // 2 + 2) * (_kai_roundup(k, bl) // bl) + 8)


def lhs_packed_size_qai8dxp(m: int, k: int, mr: int = 1, kr: int = 16, sr: int = 2) -> int:
    """Bytes of a packed LHS: ceil(m/mr) groups of mr * (K_i + 8)."""
    return _kai_roundup(m, mr) // mr * mr * (_kai_roundup(k, 32) + 8)


def _kai_source_codes(rhs, n, k, kxn, n_pad, k_pad, pad_code):
    """uint4 codes [n_pad, k_pad] of the source, with KleidiAI's row and K padding rules."""
    nib = torch.stack([rhs & 0x0F, rhs >> 4], dim=-1).reshape(rhs.shape[0], -1).long()
    rows = torch.arange(n_pad)
    clamped = rows.clamp(max=n - 1)
    ks = torch.arange(k_pad)
    kc = ks.clamp(max=k - 1)
    if kxn:  # nib[k, j]: element n = j; padded rows keep their own parity
        codes = nib[kc[None, :], (2 * (clamped // 2) + rows % 2)[:, None]]
    else:
        codes = nib[clamped[:, None], kc[None, :]]
    return torch.where(ks[None, :] < k, codes, torch.full_like(codes, pad_code))


def _kai_weight_index(nr, kr, sr, area_k):
    """(row, k0) of every byte of one nr-block weight area of area_k k-values."""
    seg = kr // sr
    i = torch.arange(nr * area_k // 2)
    s, b = i // seg, i % seg
    kk = (s // nr) * seg + b
    return s % nr, kk + (kk // 16) * 16


def _kai_signed4(v):
    return torch.where(v >= 8, v - 16, v)


def _kai_bytes(t):
    return t.contiguous().view(torch.uint8).flatten()


def _kai_rhs_pack_qsi4cxp(rhs, scale, bias, n, k, nr, kr, sr, rhs_zero_point, kxn):
    _kai_check_nr_kr_sr(nr, kr, sr)
    k_i, n_p = _kai_roundup(k, 32), _kai_roundup(n, nr)
    codes = _kai_source_codes(rhs, n, k, kxn, n_p, k_i, rhs_zero_point)
    stored = codes ^ 8 if rhs_zero_point == 8 else codes  # nibble = two's-complement q - zp
    w = _kai_signed4(stored)
    r, k0 = _kai_weight_index(nr, kr, sr, k_i)
    rows_clamped = torch.arange(n_p).clamp(max=n - 1)
    out = []
    for blk in range(n_p // nr):
        rows = blk * nr + r
        out.append((stored[rows, k0] | (stored[rows, k0 + 16] << 4)).to(torch.uint8))
        sl = slice(blk * nr, blk * nr + nr)
        out.append(_kai_bytes((16 * w[sl].sum(1)).to(torch.int32)))
        out.append(_kai_bytes(scale[rows_clamped[sl]] * 0.0625))
        out.append(_kai_bytes(bias[rows_clamped[sl]] if bias is not None
                              else torch.zeros(nr, dtype=torch.float32)))
    return torch.cat(out)


def rhs_pack_nxk_qsi4cxp_qs4cxs1s0(rhs, scale, bias, n, k, nr=8, kr=16, sr=2,
                                   rhs_zero_point=8):
    """Per-channel int4 RHS from an N x K source -> KleidiAI qsi4cxp bytes (layout above).

    rhs: uint8 [n, ceil(k/2)], element (n, k) in byte k // 2, low nibble for even k ("s1s0").
    scale: f32 [n]; bias: f32 [n] or None; rhs_zero_point: 8 (q in 0..15) or 0 (signed int4).
    """
    return _kai_rhs_pack_qsi4cxp(rhs, scale, bias, n, k, nr, kr, sr, rhs_zero_point, False)


def rhs_pack_kxn_qsi4cxp_qs4cxs1s0(rhs, scale, bias, n, k, nr=8, kr=16, sr=2,
                                   rhs_zero_point=8):
    """As :func:`rhs_pack_nxk_qsi4cxp_qs4cxs1s0` from a K x N source: uint8 [k, ceil(n/2)],
    element (k, n) in byte n // 2, low nibble for even n."""
    return _kai_rhs_pack_qsi4cxp(rhs, scale, bias, n, k, nr, kr, sr, rhs_zero_point, True)


def _kai_rhs_pack_qsi4c32p(rhs, scale, bias, n, k, bl, nr, kr, sr, kxn):
    _kai_check_nr_kr_sr(nr, kr, sr)
    if nr % 4 or bl % 32 or bl % kr or k % bl:
        raise ValueError(f"nr={nr}, bl={bl}, kr={kr}, k={k}: need nr % 4 == 0, bl % 32 == 0, "
                         "bl % kr == 0 and k % bl == 0")
    seg = kr // sr
    n_p, nkb = _kai_roundup(n, nr), k // bl
    stored = _kai_source_codes(rhs, n, k, kxn, n_p, k, 8) ^ 8
    w = _kai_signed4(stored)
    r, k0 = _kai_weight_index(nr, kr, sr, bl)
    rows_clamped = torch.arange(n_p).clamp(max=n - 1)
    s_f32 = scale.float()
    out = []
    for blk in range(n_p // nr):
        rows = torch.arange(blk * nr, blk * nr + nr)
        src = rows_clamped[rows]
        rsum = torch.zeros(nr, dtype=torch.float32)
        for j in range(nkb):
            out.append((stored[blk * nr + r, j * bl + k0]
                        | (stored[blk * nr + r, j * bl + k0 + 16] << 4)).to(torch.uint8))
            out.append(_kai_bytes(scale[src, j]))
            # One f32 add per B-byte segment, in increasing k (each segment sum is exact).
            for sup in range(bl // 2 // seg):
                kk = sup * seg + torch.arange(seg)
                kseg = j * bl + kk + (kk // 16) * 16
                seg_sum = (w[rows][:, kseg] + w[rows][:, kseg + 16]).sum(1)
                rsum = rsum + seg_sum.float() * s_f32[src, j]
        out.append(_kai_bytes(rsum))
        out.append(_kai_bytes(bias[src] if bias is not None
                              else torch.zeros(nr, dtype=torch.float32)))
    return torch.cat(out)


def rhs_pack_nxk_qsi4c32p_qsu4c32s1s0(rhs, scale, bias, n, k, bl, nr=8, kr=16, sr=2):
    """Per-block (bl) uint4 RHS (zero point 8) from an N x K source -> KleidiAI qsi4c32p bytes.

    rhs: uint8 [n, k/2] ("s1s0": low nibble = even k); scale: bf16 [n, k/bl]; bias f32 [n]/None.
    """
    return _kai_rhs_pack_qsi4c32p(rhs, scale, bias, n, k, bl, nr, kr, sr, False)


def rhs_pack_kxn_qsi4c32p_qsu4c32s1s0(rhs, scale, bias, n, k, bl, nr=8, kr=16, sr=2):
    """As :func:`rhs_pack_nxk_qsi4c32p_qsu4c32s1s0` from a K x N source uint8 [k, ceil(n/2)]."""
    return _kai_rhs_pack_qsi4c32p(rhs, scale, bias, n, k, bl, nr, kr, sr, True)


def _kai_roundf(v):
    """C roundf (ties away from zero) on a float32 tensor, exactly: trunc plus a correction."""
    t = torch.trunc(v)
    d = v - t
    return t + (d >= 0.5).float() - (d <= -0.5).float()


def lhs_quant_pack_qai8dxp_f32(lhs, mr=1, kr=16, sr=2):
    """f32 [m, k] -> KleidiAI qai8dxp bytes: per-row asymmetric int8, mr rows interleaved.

    Per row (all f32, each op rounded on its own): rmin = min(0, min x), rmax = max(0, max x);
    scale = 255 / (rmax - rmin) (1 if equal); zp = clamp(-128 - rmin*scale if
    (-128 + rmin*scale) + (127 + rmax*scale) > 0 else 127 - rmax*scale, -128, 127), rounded
    half-to-even; q = clamp(roundf(x * scale) + zp, -128, 127) with roundf ties away from zero.
    Stored: q, then -zp (int32) and 1/scale (f32). Slots of rows >= m stay 0.
    """
    m, k = lhs.shape
    seg, k_i = kr // sr, _kai_roundup(k, 32)
    groups = _kai_roundup(m, mr) // mr
    buf = torch.zeros(groups, mr * k_i + 8 * mr, dtype=torch.uint8)
    x = lhs.float()
    f32 = lambda v: torch.tensor(v, dtype=torch.float32)  # noqa: E731
    for row in range(m):
        xr = x[row]
        rmin = torch.minimum(xr.min(), f32(0.0))
        rmax = torch.maximum(xr.max(), f32(0.0))
        scale = f32(1.0) if rmin == rmax else f32(255.0) / (rmax - rmin)
        recip = f32(1.0) / scale
        dmin, dmax = rmin * scale, rmax * scale
        zp = (f32(-128.0) - dmin) if ((f32(-128.0) + dmin) + (f32(127.0) + dmax)) > 0 \
            else (f32(127.0) - dmax)
        zp = int(torch.round(zp.clamp(-128.0, 127.0)))
        xp = torch.cat([xr, xr[-1:].expand(k_i - k)])
        q = (_kai_roundf(xp * scale).clamp(-65536, 65536).int() + zp).clamp(-128, 127)
        g, r = divmod(row, mr)
        segs = q.to(torch.int8).view(torch.uint8).reshape(k_i // seg, seg)
        area = buf[g, : mr * k_i].view(k_i // seg, mr, seg)
        area[:, r, :] = segs
        buf[g, mr * k_i + 4 * r: mr * k_i + 4 * r + 4] = _kai_bytes(torch.tensor([-zp], dtype=torch.int32))
        buf[g, mr * k_i + 4 * mr + 4 * r: mr * k_i + 4 * mr + 4 * r + 4] = _kai_bytes(recip.reshape(1))
    return buf.flatten()


def kai_unpack_lhs_qai8dxp(lhs_packed, m, k, mr=1, kr=16, sr=2):
    """Packed LHS -> (q int32 [m, K_i], offset = -zp int32 [m], recip_scale f32 [m])."""
    seg, k_i = kr // sr, _kai_roundup(k, 32)
    g = lhs_packed.reshape(-1, mr * k_i + 8 * mr)
    vals = g[:, : mr * k_i].view(torch.int8).reshape(-1, k_i // seg, mr, seg)
    q = vals.permute(0, 2, 1, 3).reshape(-1, k_i)[:m].int()
    off = g[:, mr * k_i: mr * k_i + 4 * mr].contiguous().view(torch.int32).reshape(-1)[:m]
    rs = g[:, mr * k_i + 4 * mr:].contiguous().view(torch.float32).reshape(-1)[:m]
    return q, off, rs


def kai_unpack_rhs(rhs_packed, n, k, nr=8, kr=16, sr=2, bl=0):
    """Packed RHS -> dict(w int32 [N, K_i] signed int4, rsum, scale [N] or [N, K/bl], bias).

    Inverts the weight formula above; per-block scale is returned as f32 (bf16 values).
    """
    k_i = _kai_roundup(k, 32)
    area = k_i if bl == 0 else bl
    nkb = 1 if bl == 0 else k // bl
    r, k0 = _kai_weight_index(nr, kr, sr, area)
    n_p = _kai_roundup(n, nr)
    blocks = rhs_packed.reshape(n_p // nr, -1)
    w = torch.zeros(n_p, nkb * area, dtype=torch.int32)
    scales = torch.zeros(n_p, nkb, dtype=torch.float32)
    pos = 0
    for j in range(nkb):
        wb = blocks[:, pos: pos + nr * area // 2].int()
        pos += nr * area // 2
        rows = torch.arange(n_p // nr)[:, None] * nr + r[None, :]
        w[rows, j * area + k0[None, :]] = _kai_signed4(wb & 0x0F)
        w[rows, j * area + k0[None, :] + 16] = _kai_signed4(wb >> 4)
        if bl:
            scales[:, j] = blocks[:, pos: pos + 2 * nr].contiguous().view(torch.bfloat16).reshape(-1).float()
            pos += 2 * nr
    tail = blocks[:, pos:].contiguous()
    if bl == 0:
        rsum = tail[:, : 4 * nr].contiguous().view(torch.int32).reshape(-1)
        scales = tail[:, 4 * nr: 8 * nr].contiguous().view(torch.float32).reshape(-1, 1)
        bias = tail[:, 8 * nr:].contiguous().view(torch.float32).reshape(-1)
    else:
        rsum = tail[:, : 4 * nr].contiguous().view(torch.float32).reshape(-1)
        bias = tail[:, 4 * nr:].contiguous().view(torch.float32).reshape(-1)
    return dict(w=w[:n], rsum=rsum[:n], scale=scales[:n], bias=bias[:n])


def _kai_matmul(lhs_packed, rhs_packed, m, n, k, mr, nr, kr, sr, bl, clamp_min, clamp_max):
    q, off, lhs_scale = kai_unpack_lhs_qai8dxp(lhs_packed, m, k, mr, kr, sr)
    rhs = kai_unpack_rhs(rhs_packed, n, k, nr, kr, sr, bl)
    for name, bound in (("clamp_min", clamp_min), ("clamp_max", clamp_max)):
        if bound is not None and math.isnan(bound):
            raise ValueError(f"{name} must not be NaN")  # as the ops: no "clamp to NaN"
    lo = -3.4028234663852886e38 if clamp_min is None else clamp_min
    hi = 3.4028234663852886e38 if clamp_max is None else clamp_max
    if bl == 0:
        dot = q.long() @ rhs["w"].long().T  # exact integer dot products
        iacc = (16 * dot + off.long()[:, None] * rhs["rsum"].long()[None, :]).int()
        v = iacc.float() * rhs["scale"].reshape(1, -1)
    else:
        # acc = fma(float(16 * dot_j), s_j / 16, acc) per block, then fma(rsum, offset, acc).
        # Evaluated as f64 (exact product) rounded to f32: this can differ from a true fma
        # by double rounding, an ulp at most, and only in rare ties.
        acc = torch.zeros(m, n, dtype=torch.float32)
        for j in range(k // bl):
            dot = q[:, j * bl:(j + 1) * bl].long() @ rhs["w"][:, j * bl:(j + 1) * bl].long().T
            d = (rhs["scale"][:, j] * 0.0625).double()
            acc = ((16 * dot).float().double() * d[None, :] + acc.double()).float()
        v = (rhs["rsum"].double()[None, :] * off.float().double()[:, None] + acc.double()).float()
    v = v * lhs_scale[:, None]
    v = v + rhs["bias"][None, :]
    return torch.clamp(v, lo, hi)


def matmul_clamp_f32_qai8dxp_qsi4cxp(lhs_packed, rhs_packed, m, n, k, mr=1, nr=8, kr=16, sr=2,
                                     clamp_min=None, clamp_max=None):
    """KleidiAI's per-channel epilogue: iacc = 16*dot + (-zp)*rsum (int32);
    out = clamp((f32(iacc) * rhs_scale) * lhs_scale + bias), each op rounded to f32."""
    return _kai_matmul(lhs_packed, rhs_packed, m, n, k, mr, nr, kr, sr, 0, clamp_min, clamp_max)


def matmul_clamp_f32_qai8dxp_qsi4c32p(lhs_packed, rhs_packed, m, n, k, bl, mr=1, nr=8, kr=16,
                                      sr=2, clamp_min=None, clamp_max=None):
    """KleidiAI's per-block epilogue (see _kai_matmul); output f32 [m, n]."""
    return _kai_matmul(lhs_packed, rhs_packed, m, n, k, mr, nr, kr, sr, bl, clamp_min, clamp_max)


def kai_matmul_dequantized_f64(lhs_packed, rhs_packed, m, n, k, mr=1, nr=8, kr=16, sr=2, bl=0):
    """float64 x_deq @ w_deq.T + bias from the packed operands' own values: the exact product
    the kernels approximate (x_deq = (q - zp) / scale_lhs, w_deq = w * s)."""
    q, off, lhs_scale = kai_unpack_lhs_qai8dxp(lhs_packed, m, k, mr, kr, sr)
    rhs = kai_unpack_rhs(rhs_packed, n, k, nr, kr, sr, bl)
    x = (q.double() + off.double()[:, None]) * lhs_scale.double()[:, None]
    if bl == 0:
        w = rhs["w"].double() * (rhs["scale"].double() * 16)  # stored scale is s / 16
    else:
        w = rhs["w"].double() * rhs["scale"].double().repeat_interleave(bl, dim=1)
    return x @ w.T + rhs["bias"].double()[None, :]


def dyn_quant_matmul_4bit_f64(inp, weights, scales_zeros, bias, block_size, in_features,
                              out_features):
    """float64 model of torch.ops.aten._dyn_quant_matmul_4bit from the *unpacked* inputs:
    the LHS quantized as qai8dxp, the weight (q - 8) * scale with q = low nibble for even k."""
    k, n = in_features, out_features
    x = inp.reshape(-1, k).float()
    lp = lhs_quant_pack_qai8dxp_f32(x, 1, 16, 2)
    q, off, ls = kai_unpack_lhs_qai8dxp(lp, x.shape[0], k, 1, 16, 2)
    xd = (q[:, :k].double() + off.double()[:, None]) * ls.double()[:, None]
    codes = torch.stack([weights & 0x0F, weights >> 4], -1).reshape(n, k).double() - 8
    s = scales_zeros.double().reshape(n, -1).repeat_interleave(block_size, dim=1)
    out = xd @ (codes * s).T
    if bias is not None:
        out = out + bias.double()
    return out.reshape(*inp.shape[:-1], n)


for _fn in (rhs_pack_nxk_qsi4cxp_qs4cxs1s0, rhs_pack_kxn_qsi4cxp_qs4cxs1s0,
            rhs_pack_nxk_qsi4c32p_qsu4c32s1s0, rhs_pack_kxn_qsi4c32p_qsu4c32s1s0,
            lhs_quant_pack_qai8dxp_f32):
    _fn.__doc__ = (_fn.__doc__ or "") + "\n\n    " + KAI_LAYOUT.replace("\n", "\n    ")
