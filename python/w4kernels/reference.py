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


def marlin_pack(q: torch.Tensor) -> torch.Tensor:
    """uint4 codes ``[K, N]`` (K % 16 == 0, K*N % 1024 == 0) -> Marlin int32 ``[K/16, 2N]``."""
    k, n = q.shape
    tiles = q.reshape(k // 16, 16, n // 16, 16).permute(0, 2, 1, 3).reshape(k // 16, n * 16)
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


def marlin_dequantize(b_q_weight: torch.Tensor, b_scales: torch.Tensor,
                      b_zeros: Optional[torch.Tensor], g_idx: Optional[torch.Tensor],
                      size_k: int, size_n: int) -> torch.Tensor:
    """The weight ``w[r, n]`` of Marlin row r, in ``b_scales.dtype`` (one rounding of (q-z)*s).

    ``g(r) = g_idx[r]`` with act-order (g_idx sorted along Marlin rows), else
    ``r // (K / G)``; z = 8 without zero points (symmetric GPTQ, uint4b8).
    """
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
    return ((q - z).float() * s.float()[groups] + 0.0).to(b_scales.dtype)


def w4a16_gemm(a: torch.Tensor, b_q_weight: torch.Tensor, b_scales: torch.Tensor,
               b_zeros: Optional[torch.Tensor], g_idx: Optional[torch.Tensor],
               perm: Optional[torch.Tensor], workspace: torch.Tensor, num_bits: int, size_m: int,
               size_n: int, size_k: int, is_k_full: bool = True,
               b_bias: Optional[torch.Tensor] = None,
               use_fp32_reduce: bool = True) -> torch.Tensor:
    """``a[:, perm] @ marlin_dequantize(...) (+ bias)`` in float64 (see ops.w4a16_gemm)."""
    if perm is not None and perm.numel() > 0:
        a = a[:, perm.long()]
    w = marlin_dequantize(b_q_weight, b_scales, b_zeros, g_idx, size_k, size_n).double()
    out = a.double() @ w
    if b_bias is not None:
        out = out + b_bias.double()
    return out
