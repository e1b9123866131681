"""Checkpoint tensors of one quantized layer, made from random codes the way the upstream tools
store them, with the float64 weight they mean: the independent reference of test_nn.py and
test_checkpoint.py.

The packing here is written out with explicit shifts (not with w4kernels.quant's helpers, which
the tests check): GPTQ ``qweight[k // 8, n]`` holds row k in bits ``4 (k % 8)``; GPTQ
``qzeros[g, n // 8]`` holds column n in bits ``4 (n % 8)``, storing ``zero - 1`` (AutoGPTQ,
checkpoint_format "gptq") or ``zero`` ("gptq_v2"); AutoAWQ ``qweight[k, n // 8]`` /
``qzeros[g, n // 8]`` hold column ``8c + [0, 2, 4, 6, 1, 3, 5, 7][i]`` in nibble i.
"""

import torch

AWQ_COLUMN_OF_NIBBLE = [0, 2, 4, 6, 1, 3, 5, 7]


def _words(nibbles: torch.Tensor) -> torch.Tensor:
    """[..., 8] nibbles (nibble i at bits 4i) -> int32 words (two's complement)."""
    w = sum((nibbles[..., i].long() & 15) << (4 * i) for i in range(8))
    return torch.where(w >= 2**31, w - 2**32, w).to(torch.int32)


def gptq_pack_qweight(q: torch.Tensor) -> torch.Tensor:
    k, n = q.shape
    return _words(q.reshape(k // 8, 8, n).permute(0, 2, 1))


def gptq_pack_qzeros(z: torch.Tensor, checkpoint_format: str) -> torch.Tensor:
    stored = z - 1 if checkpoint_format == "gptq" else z
    g, n = z.shape
    return _words(stored.reshape(g, n // 8, 8))


def awq_pack(q: torch.Tensor) -> torch.Tensor:
    r, n = q.shape
    return _words(q.reshape(r, n // 8, 8)[:, :, AWQ_COLUMN_OF_NIBBLE])


def gptq_layer(size_k, size_n, group_size, act_order, sym, dtype, checkpoint_format="gptq",
               bias=True, seed=0):
    """(tensors dict as a GPTQ checkpoint stores them, float64 weight [K, N]).

    The weight is ``(q - z) * s`` with z = 8 when symmetric; grouped layers round it once to
    ``dtype`` (what the Marlin kernels multiply with), per-channel layers keep it exact (README,
    "Numerics of w4a16_gemm"). A last group shorter than group_size is allowed (K shard)."""
    gen = torch.Generator().manual_seed(seed)
    groups = 1 if group_size == -1 else -(-size_k // group_size)
    q = torch.randint(0, 16, (size_k, size_n), dtype=torch.int32, generator=gen)
    s = (torch.rand(groups, size_n, generator=gen) + 0.05) * 0.02
    s[torch.rand(groups, size_n, generator=gen) < 0.25] *= -1
    s = s.to(dtype)
    z = (torch.full((groups, size_n), 8, dtype=torch.int32) if sym else
         torch.randint(1, 16, (groups, size_n), dtype=torch.int32, generator=gen))
    g_idx = torch.arange(size_k) // (size_k if group_size == -1 else group_size)
    if act_order:
        g_idx = g_idx[torch.randperm(size_k, generator=gen)]
    w = (q - z[g_idx]).double() * s.double()[g_idx]
    if groups > 1:
        w = w.to(dtype).double()
    t = dict(qweight=gptq_pack_qweight(q), qzeros=gptq_pack_qzeros(z, checkpoint_format),
             scales=s, g_idx=g_idx.to(torch.int32))
    if bias:
        t["bias"] = (torch.randn(size_n, generator=gen) * 0.1).to(dtype)
    return t, w


def awq_layer(size_k, size_n, group_size, dtype, bias=True, seed=0):
    """(AutoAWQ WQLinear_GEMM tensors, float64 weight [K, N] rounded once to dtype)."""
    gen = torch.Generator().manual_seed(seed)
    groups = 1 if group_size == -1 else -(-size_k // group_size)
    q = torch.randint(0, 16, (size_k, size_n), dtype=torch.int32, generator=gen)
    s = ((torch.rand(groups, size_n, generator=gen) + 0.05) * 0.02).to(dtype)
    z = torch.randint(0, 16, (groups, size_n), dtype=torch.int32, generator=gen)
    rows = torch.arange(size_k) // (size_k if group_size == -1 else group_size)
    w = ((q - z[rows]).double() * s.double()[rows]).to(dtype).double()
    t = dict(qweight=awq_pack(q), qzeros=awq_pack(z), scales=s)
    if bias:
        t["bias"] = (torch.randn(size_n, generator=gen) * 0.1).to(dtype)
    return t, w
