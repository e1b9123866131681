"""Single-mutation input fuzzer for every op of both namespaces (run by tests/test_fuzz_inputs.py
in subprocess shards, so a crash fails a test instead of killing pytest).

From one valid call of each op, one argument at a time is replaced by: another dtype, a meta
tensor among CPU ones, another rank, each dimension changed, a view with a storage offset (a
start no longer 16-byte aligned), a strided or transposed view, NaN/Inf values, index tensors
that are not permutations, out of range or unsorted, a dirty or empty workspace, None for an
optional tensor, and negative, zero, off-by-one and huge integers. Each case must end in either

* a clean error: RuntimeError, ValueError or TypeError whose message starts with the op's name
  and names the mutated argument (a mutated integer may be blamed on any argument: a size that
  disagrees with a tensor is reported as that tensor's shape); and, unless the check reads tensor
  values, the same message when every tensor is on the meta device (the Meta kernels run the
  kernels' checks); or
* a result equal to the reference: the float64/bit-exact model of w4kernels.reference where it
  is bit-exact (repacks, packers, awq_dequantize, the LHS quantizer, the per-channel matmul),
  else the op itself on contiguous copies of the same values, bit for bit (a view is read as
  its values); non-finite values must then give non-finite outputs exactly where the float64
  reference has them. The meta call must then give the same shape and dtype.

Usage: python tests/fuzz_inputs.py SHARD NUM_SHARDS [--full]   (one JSON line per case)
W4K_FUZZ_FULL=1 selects the full sweep in the pytest wrapper.
"""

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import w4kernels  # noqa: E402
from w4kernels import ops, reference  # noqa: E402

HALF = torch.float16
ALL_DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
              torch.bfloat16, torch.float32, torch.float64, torch.bool]
# A check that reads tensor values cannot run on meta tensors (no data): its message differs.
VALUE_PHRASES = ("values must lie in", "must be a permutation", "must be sorted",
                 "must be all zeros", "must hold finite", "is not a buffer packed for",
                 "buffer packed for n=")


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _words(*shape, seed=0):
    return torch.randint(-2**31, 2**31 - 1, shape, dtype=torch.int32, generator=_gen(seed))


# ---- valid calls -----------------------------------------------------------------------------
# name -> (ordered args, reference kind). "exact": reference.<op>(*args) bit for bit;
# "self": the op on contiguous copies; "gemm": "self" plus the non-finite pattern of the float64
# reference (reference.<op>).

W4A16_ARGS = ["a", "b_q_weight", "b_scales", "b_zeros", "g_idx", "perm", "workspace", "num_bits",
              "size_m", "size_n", "size_k", "is_k_full", "b_bias", "use_fp32_reduce"]


_VALID = {}


def valid_calls():
    """The valid calls, built once per process; every case gets fresh copies (fresh_call)."""
    if not _VALID:
        _VALID.update(_build_valid_calls())
    return _VALID


def fresh_call(ns, op):
    args, kind = valid_calls()[(ns, op)]
    return {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in args.items()}, kind


def _build_valid_calls():
    from test_w4a16_gemm import make_case

    g = _gen(1)
    q, z = _words(64, 8, seed=2), _words(2, 8, seed=3)
    s = (torch.rand(2, 64, generator=g) * 0.01 + 0.001).to(HALF)
    w = make_case(2, 128, 64, 32, HALF, "k_full", zp=True, bias=True)
    rhs = torch.randint(0, 256, (8, 32), dtype=torch.uint8, generator=g)
    rhs_kxn = torch.randint(0, 256, (64, 4), dtype=torch.uint8, generator=g)
    scale = torch.rand(8, generator=g) + 0.5
    scale32 = (torch.rand(8, 2, generator=g) + 0.5).bfloat16()
    bias = torch.randn(8, generator=g)
    lhs = torch.randn(3, 64, generator=g)
    lp4 = ops.lhs_quant_pack_qai8dxp_f32(lhs, 4)
    lp1 = ops.lhs_quant_pack_qai8dxp_f32(lhs, 1)
    rp = ops.rhs_pack_nxk_qsi4cxp_qs4cxs1s0(rhs, scale, bias, 8, 64)
    rp32 = ops.rhs_pack_nxk_qsi4c32p_qsu4c32s1s0(rhs, scale32, bias, 8, 64, 32)
    marlin_awq = {
        "marlin_repack": (dict(b_q_weight=_words(4, 64, seed=4),
                               perm=torch.randperm(32, generator=g).int(), size_k=32, size_n=64,
                               num_bits=4), "exact"),
        "awq_marlin_repack": (dict(b_q_weight=_words(32, 8, seed=5), size_k=32, size_n=64,
                                   num_bits=4), "exact"),
        "awq_dequantize": (dict(qweight=q, scales=s, qzeros=z, split_k_iters=0, thx=0, thy=0),
                           "exact"),
        "awq_gemm": (dict(x=torch.randn(3, 64, generator=g).to(HALF), qweight=q, scales=s,
                          qzeros=z, split_k_iters=8), "gemm"),
        "w4a16_gemm": ({k: w[k] for k in W4A16_ARGS}, "gemm"),
    }
    kleidiai = {
        "rhs_pack_nxk_qsi4cxp_qs4cxs1s0": (dict(rhs=rhs, scale=scale, bias=bias, n=8, k=64, nr=8,
                                                kr=16, sr=2, rhs_zero_point=8), "exact"),
        "rhs_pack_kxn_qsi4cxp_qs4cxs1s0": (dict(rhs=rhs_kxn, scale=scale, bias=None, n=8, k=64,
                                                nr=8, kr=16, sr=2, rhs_zero_point=0), "exact"),
        "rhs_pack_nxk_qsi4c32p_qsu4c32s1s0": (dict(rhs=rhs, scale=scale32, bias=bias, n=8, k=64,
                                                   bl=32, nr=8, kr=16, sr=2), "exact"),
        "rhs_pack_kxn_qsi4c32p_qsu4c32s1s0": (dict(rhs=rhs_kxn, scale=scale32, bias=None, n=8,
                                                   k=64, bl=32, nr=8, kr=16, sr=2), "exact"),
        "lhs_quant_pack_qai8dxp_f32": (dict(lhs=lhs, mr=4, kr=16, sr=2), "exact"),
        "matmul_clamp_f32_qai8dxp_qsi4cxp": (dict(lhs_packed=lp4, rhs_packed=rp, m=3, n=8, k=64,
                                                  mr=4, nr=8, kr=16, sr=2, clamp_min=-1.0,
                                                  clamp_max=None, out_dtype=None, isa="auto"),
                                             "exact"),
        "matmul_clamp_f32_qai8dxp_qsi4c32p": (dict(lhs_packed=lp1, rhs_packed=rp32, m=3, n=8,
                                                   k=64, bl=32, mr=1, nr=8, kr=16, sr=2,
                                                   clamp_min=None, clamp_max=2.0,
                                                   out_dtype=torch.bfloat16, isa="auto"), "self"),
        "dyn_quant_pack_4bit_weight": (dict(weights=rhs, scales_zeros=scale32, bias=bias,
                                            block_size=32, in_features=64, out_features=8),
                                       "self"),
        "dyn_quant_matmul_4bit": (dict(inp=torch.randn(2, 3, 64, generator=g), packed_weights=rp,
                                       block_size=64, in_features=64, out_features=8,
                                       isa="auto"), "self"),
        "rhs_packed_size_qsi4cxp": (dict(n=8, k=64, nr=8, kr=16, sr=2), "exact"),
        "rhs_packed_size_qsi4c32p": (dict(n=8, k=64, bl=32, nr=8, kr=16, sr=2), "exact"),
        "lhs_packed_size_qai8dxp": (dict(m=3, k=64, mr=4, kr=16, sr=2), "exact"),
    }
    # The int8-activation mode (CPU only: not in the emulator namespace).
    w4a8_args = ["a", "b_q_weight", "b_scales", "b_zeros", "g_idx", "perm", "num_bits", "size_m",
                 "size_n", "size_k", "is_k_full", "b_bias"]
    int8_mode = {
        "w4a8_gemm": ({k: w[k] for k in w4a8_args}, "gemm"),
        "awq_gemm_a8": (dict(x=torch.randn(3, 64, generator=g).to(HALF), qweight=q, scales=s,
                             qzeros=z), "gemm"),
    }
    calls = {("w4kernels", k): v for k, v in {**marlin_awq, **kleidiai, **int8_mode}.items()}
    if w4kernels.HAS_SIMT:
        calls.update({("w4kernels_simt", k): v for k, v in marlin_awq.items()})
    return calls


# ---- mutations -------------------------------------------------------------------------------

def _offset_view(t):
    """Same values, storage offset 1 (the start moves by one element: not 16-byte aligned)."""
    buf = torch.empty(t.numel() + 1, dtype=t.dtype)
    v = buf[1:].view(t.shape)
    v.copy_(t)
    return v


def _strided_view(t):
    """Same values, every other element of a twice-as-long last dimension."""
    buf = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
    v = buf[..., ::2]
    v.copy_(t)
    return v


def _transposed_view(t):
    return t.t().contiguous().t()


def _resized(t, dim, size):
    shape = list(t.shape)
    shape[dim] = size
    out = torch.zeros(shape, dtype=t.dtype)
    idx = tuple(slice(0, min(a, b)) for a, b in zip(shape, t.shape))
    out[idx] = t[idx]
    return out


def _set(t, index, value):
    t = t.clone()
    t.view(-1)[index] = value
    return t


def _cast(t, dtype):
    if dtype == torch.bool:
        return t != 0
    return t.to(dtype)


def tensor_mutations(name, t, full):
    """(label, new value, kind) for one tensor argument; kind "value" marks value mutations."""
    out = []
    others = [d for d in ALL_DTYPES if d != t.dtype]
    if not full:  # a neighbour in width and a different kind
        others = others[ALL_DTYPES.index(t.dtype) % len(others)::4][:2]
    out += [(f"dtype {d}", _cast(t, d), "dtype") for d in others]
    out.append(("meta", t.to("meta"), "device"))
    out.append(("unsqueeze", t.unsqueeze(0), "rank"))
    if t.dim() > 1:
        out.append(("flatten", t.reshape(-1), "rank"))
    if t.dim() >= 1 and full:
        out.append(("scalar", t.reshape(-1)[0].clone(), "rank"))
    for d in range(t.dim()):
        sizes = {0, t.shape[d] + 1, max(t.shape[d] - 1, 0)} | ({2 * t.shape[d]} if full else set())
        sizes.discard(t.shape[d])
        if not full:
            sizes = {t.shape[d] + 1} if d % 2 else {max(t.shape[d] - 1, 0)}
        out += [(f"dim{d}={n}", _resized(t, d, n), "shape") for n in sorted(sizes)]
    if t.numel() > 0:
        out.append(("offset view", _offset_view(t), "layout"))
        if t.dim() >= 1:
            out.append(("strided view", _strided_view(t), "layout"))
        if t.dim() == 2 and full:
            out.append(("transposed view", _transposed_view(t), "layout"))
    if t.is_floating_point() and t.numel() > 0:
        out.append(("nan", _set(t, 0, float("nan")), "value"))
        out.append(("inf", _set(t, -1, float("inf")), "value"))
        if full:
            out.append(("-inf all", torch.full_like(t, float("-inf")), "value"))
    if name in ("perm", "g_idx") and t.numel() > 1:
        n = t.numel()
        out.append(("duplicate", _set(t, 1, int(t[0])), "value"))
        out.append(("zeros", torch.zeros_like(t), "value"))
        out.append(("too large", _set(t, 0, n if name == "perm" else int(t.max()) + 1), "value"))
        out.append(("negative", _set(t, n - 1, -1), "value"))
        out.append(("reversed", t.flip(0).contiguous(), "value"))
    if name == "workspace":
        out.append(("dirty", _set(t, 0, 1), "value"))
        out.append(("empty", t[:0], "shape"))
    if name in ("rhs_packed", "packed_weights", "lhs_packed") and full:
        out.append(("all 0xff", torch.full_like(t, 255), "value"))
    return out


def scalar_mutations(name, v, full):
    if isinstance(v, bool):
        return [("flipped", not v, "value")]
    if isinstance(v, int):
        vals = [-1, 0, v + 1, 2**62] if not full else \
            [-1, 0, 1, v - 1, v + 1, 2 * v, 2**31 - 1, 2**31, 2**62, -2**63, 2**63 - 1]
        return [(f"= {x}", x, "int") for x in dict.fromkeys(vals) if x != v]
    if isinstance(v, float) or (v is None and name.startswith("clamp")):
        vals = [float("nan"), float("inf"), -float("inf")] + ([3e38, -0.0] if full else [])
        return [(f"= {x}", x, "value") for x in vals]
    if isinstance(v, torch.dtype) or name == "out_dtype":
        return [(f"= {d}", d, "dtype") for d in (torch.float16, torch.int32, torch.float64)]
    if isinstance(v, str):
        vals = ["bogus", ""] + (["AVX512", "auto "] if full else [])
        return [(f"= {x!r}", x, "str") for x in vals]
    return []


def cases(full):
    """Deterministic list of (ns, op, arg, label)."""
    out = []
    for (ns, op), (args, _) in valid_calls().items():
        for arg, v in args.items():
            if isinstance(v, torch.Tensor):
                muts = tensor_mutations(arg, v, full)
                if arg in ("perm", "g_idx", "b_zeros", "b_bias", "bias"):
                    muts.append(("None", None, "value"))
            else:
                muts = scalar_mutations(arg, v, full)
            out += [(ns, op, arg, label) for label, _, _ in muts]
    return out


def _mutation(ns, op, arg, label, full):
    args, kind = fresh_call(ns, op)
    v = args[arg]
    muts = tensor_mutations(arg, v, full) if isinstance(v, torch.Tensor) else \
        scalar_mutations(arg, v, full)
    if isinstance(v, torch.Tensor) and arg in ("perm", "g_idx", "b_zeros", "b_bias", "bias"):
        muts.append(("None", None, "value"))
    new, mkind = next((m, k) for lab, m, k in muts if lab == label)
    return args, kind, new, mkind


# ---- running one case ------------------------------------------------------------------------

def _meta(x):
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    return x


def _canonical(x):
    return x.contiguous().clone() if isinstance(x, torch.Tensor) else x


def _same(a, b):
    return (a.shape == b.shape and a.dtype == b.dtype
            and torch.equal(torch.nan_to_num(a), torch.nan_to_num(b))
            and torch.equal(a.isnan(), b.isnan()))


def _call(ns, op, args):
    return getattr(getattr(torch.ops, ns), op)(*args.values())


def _reference(op, args):
    vals = list(args.values())
    if op in ("awq_dequantize", "marlin_repack", "awq_marlin_repack") or op.startswith("rhs_pack") \
            or op.startswith("lhs_quant") or op.endswith("_size_qsi4cxp") \
            or op.endswith("_size_qsi4c32p") or op.endswith("_size_qai8dxp"):
        return getattr(reference, op)(*vals)
    if op == "matmul_clamp_f32_qai8dxp_qsi4cxp":
        return reference.matmul_clamp_f32_qai8dxp_qsi4cxp(*vals[:11])
    return getattr(reference, op)(*vals)


def run_case(ns, op, arg, label, full):
    args, kind, new, mkind = _mutation(ns, op, arg, label, full)
    args = dict(args)
    args[arg] = new
    result = dict(case=f"{ns}::{op} {arg} {label}")
    try:
        out = _call(ns, op, args)
    except (RuntimeError, ValueError, TypeError) as e:
        msg = str(e).split("\n")[0]
        result["error"] = msg
        problems = []
        if not msg.startswith(op + ": ") and not msg.startswith(op.replace("_4bit", "") + ": "):
            problems.append("message does not start with the op name")
        names = list(args) if mkind == "int" else [arg]
        if not any(n in msg for n in names):
            problems.append(f"message does not name {arg}")
        if mkind != "device" and not any(p in msg for p in VALUE_PHRASES):
            try:
                _call(ns, op, {k: _meta(v) for k, v in args.items()})
                meta = None
            except (RuntimeError, ValueError, TypeError) as e2:
                meta = str(e2).split("\n")[0]
            if meta != msg:
                problems.append(f"meta says {meta!r}")
        result["problems"] = problems
        return result
    result["accepted"] = True
    problems = []
    if isinstance(out, torch.Tensor):
        meta = _call(ns, op, {k: _meta(v) for k, v in args.items()})
        if (meta.shape, meta.dtype) != (out.shape, out.dtype):
            problems.append(f"meta gives {tuple(meta.shape)} {meta.dtype}, the op "
                            f"{tuple(out.shape)} {out.dtype}")
    if mkind == "device":  # every tensor on meta: a meta result is all there is to check
        if isinstance(out, torch.Tensor) and out.device.type != "meta":
            problems.append(f"a meta input gave a result on {out.device}")
    elif kind == "exact":
        want = _reference(op, {k: _canonical(v) for k, v in args.items()})
        ok = _same(out, want) if isinstance(out, torch.Tensor) else out == want
        if not ok:
            problems.append("differs from the bit-exact reference")
    else:
        want = _call(ns, op, {k: _canonical(v) for k, v in args.items()})
        if not _same(out, want):
            problems.append("differs from the op on contiguous copies")
        if kind == "gemm" and mkind == "value":
            ref = _reference(op, {k: _canonical(v) for k, v in args.items()})
            if not torch.equal(out.isfinite(), ref.isfinite()):
                problems.append("non-finite outputs differ from the float64 reference's")
    result["problems"] = problems
    return result


def main():
    shard, num_shards = int(sys.argv[1]), int(sys.argv[2])
    full = "--full" in sys.argv
    # Test hook: die like a segfaulting kernel would, at this case (test_fuzz_inputs checks that
    # the harness reports it).
    abort_at = int(os.environ.get("W4K_FUZZ_ABORT_AT", "-1"))
    all_cases = cases(full)
    for i in range(shard, len(all_cases), num_shards):
        ns, op, arg, label = all_cases[i]
        print(json.dumps(dict(start=f"{ns}::{op} {arg} {label}")), flush=True)
        if i == abort_at:
            os.abort()
        try:
            r = run_case(ns, op, arg, label, full)
        except Exception as e:  # an exception type the ops must not raise
            first = str(e).splitlines()[0] if str(e) else ""
            r = dict(case=f"{ns}::{op} {arg} {label}",
                     problems=[f"raised {type(e).__name__}: {first}"])
        print(json.dumps(r), flush=True)
    print(json.dumps(dict(done=len(range(shard, len(all_cases), num_shards)))), flush=True)


if __name__ == "__main__":
    main()
