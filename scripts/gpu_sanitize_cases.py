"""Every CUDA kernel variant of w4kernels, called once on a small shape: the workload
scripts/gpu_check.sh runs under compute-sanitizer (memcheck, racecheck, synccheck, initcheck).

Each case also checks its result against :mod:`w4kernels.reference` (computed on the CPU, so the
only GPU work under the sanitizer is our kernels and the copies) and prints the max error, so
the script doubles as a quick correctness smoke test. The repack ops and awq_dequantize must
match bit for bit; the GEMMs must stay within the fp32-accumulation bound of tests/numerics.py
(the bound is restated in ``_gemm_bound``).

Variants covered (the kernel's template/launch choices, not only the ops):

* marlin_repack with and without act-order ``perm``; awq_marlin_repack; awq_dequantize fp16/bf16;
* awq_gemm with split_k_iters 1 and 8 (split-K reduction), M = 1 and 33;
* w4a16_gemm: M = 1, 17, 33, 64, 65 (16-, 32-, 48-, 64-row tiles and two row tiles), every
  scale path (per-channel, groups 32/64/128 with and without zero points, act-order with
  ``is_k_full`` True and False, group 96 through the row-group path), bias, fp16 and bf16, N =
  192 (a half-empty 128-column tile); split-K (M = 1, N = 256, K = 4096: arrival counters; runs
  across tiles, forced and the planner's for 224 tiles) and a launch without split-K (K = 128 is
  one pipeline stage); M >= 256, the dense path (marlin_dequant_kernel, the gather, a matmul)
  with zero points, act-order and a shard.

    python scripts/gpu_sanitize_cases.py              # the CUDA kernels on the GPU
    python scripts/gpu_sanitize_cases.py --simt       # the same kernels under the SIMT emulator
    python scripts/gpu_sanitize_cases.py -k w4a16     # only cases whose name contains "w4a16"
    python scripts/gpu_sanitize_cases.py -x "dense path"   # all but those
    python scripts/gpu_sanitize_cases.py --list

Exit status: 0 when every case ran and matched, 1 otherwise; without a GPU (and without
``--simt``) it prints why and exits 0.
"""

import argparse
import dataclasses
import os
import sys
import time

import torch

UNIT_ROUNDOFF = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}
DTYPE_NAME = {torch.float16: "fp16", torch.bfloat16: "bf16"}


def _import_w4kernels():
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "python"))
    import w4kernels
    return w4kernels


def _gemm_bound(a, w, ref, bias, out_dtype):
    """Elementwise bound on |kernel - ref| for a @ w (+ bias) with fp32 accumulation and one
    final rounding to fp16/bf16 (as tests/numerics.py: gamma_K * sum|a*w| + half an ulp)."""
    mag = a.double().abs() @ w.double().abs()
    if bias is not None:
        mag = mag + bias.double().abs()
    acc = (a.shape[1] + 1) * 2.0 ** -24 * mag
    return UNIT_ROUNDOFF[out_dtype] * (ref.abs() + acc) + acc + 2.0 ** -24


class Result:
    """What one case reports: the max abs error, and whether it is within the allowed error."""

    def __init__(self, err, ok, detail):
        self.err, self.ok, self.detail = err, ok, detail


def _bitwise(out, expected):
    out = out.cpu()
    if out.shape != expected.shape or out.dtype != expected.dtype:
        return Result(float("inf"), False, f"got {tuple(out.shape)} {out.dtype}, expected "
                                           f"{tuple(expected.shape)} {expected.dtype}")
    err = (out.double() - expected.double()).abs().max().item() if out.numel() else 0.0
    same = torch.equal(out.contiguous().view(torch.uint8), expected.contiguous().view(torch.uint8))
    return Result(err, same, "bit-identical" if same else "bits differ")


def _within_bound(out, ref, a, w, bias):
    out = out.cpu()
    bound = _gemm_bound(a, w, ref, bias, out.dtype)
    err = (out.double() - ref).abs()
    worst = (err / bound).max().item()
    return Result(err.max().item(), worst <= 1.0, f"{worst:.2f} of the fp32 bound")


class Cases:
    """Builds every case's CPU inputs with w4kernels.quant / reference and runs the op on
    ``device`` through namespace ``ns`` (torch.ops.w4kernels or torch.ops.w4kernels_simt)."""

    def __init__(self, w4kernels, ns, device):
        self.quant, self.reference = w4kernels.quant, w4kernels.reference
        self.ops = w4kernels.ops
        self.ns, self.device = ns, device
        self.gen = torch.Generator().manual_seed(0)

    def to_dev(self, t):
        return None if t is None else t.to(self.device)

    def randn(self, *shape, scale=1.0):
        return torch.randn(*shape, generator=self.gen) * scale

    # ---- repack and dequantize: bit-exact against the reference ------------------------------

    def marlin_repack(self, size_k, size_n, act_order):
        g = self.quant.quantize_gptq(self.randn(size_k, size_n), 128, act_order)
        perm = torch.argsort(g.g_idx, stable=True).to(torch.int32) if act_order else None
        out = self.ns.marlin_repack(self.to_dev(g.qweight), self.to_dev(perm), size_k, size_n, 4)
        return _bitwise(out, self.reference.marlin_repack(g.qweight, perm, size_k, size_n, 4))

    def awq_marlin_repack(self, size_k, size_n):
        a = self.quant.quantize_awq(self.randn(size_k, size_n), 64)
        out = self.ns.awq_marlin_repack(self.to_dev(a.qweight), size_k, size_n, 4)
        return _bitwise(out, self.reference.awq_marlin_repack(a.qweight, size_k, size_n, 4))

    def awq_dequantize(self, size_k, size_n, group_size, dtype):
        a = self.quant.quantize_awq(self.randn(size_k, size_n), group_size, dtype)
        out = self.ns.awq_dequantize(self.to_dev(a.qweight), self.to_dev(a.scales),
                                     self.to_dev(a.qzeros), 0, 0, 0)
        return _bitwise(out, self.reference.awq_dequantize(a.qweight, a.scales, a.qzeros))

    # ---- GEMMs: within the fp32-accumulation bound ---------------------------------------------

    def awq_gemm(self, m, size_k, size_n, group_size, dtype, split_k_iters):
        a = self.quant.quantize_awq(self.randn(size_k, size_n), group_size, dtype)
        x = self.randn(m, size_k).to(dtype)
        out = self.ns.awq_gemm(self.to_dev(x), self.to_dev(a.qweight), self.to_dev(a.scales),
                               self.to_dev(a.qzeros), split_k_iters)
        ref = self.reference.awq_gemm(x, a.qweight, a.scales, a.qzeros)
        return _within_bound(out, ref, x, a.dequantize(), None)

    def _marlin_layer(self, size_k, size_n, group_size, dtype, variant):
        """A Marlin-format layer made by the project's quantizers: "gptq" (symmetric),
        "awq" (zero points), "act" (GPTQ act-order), "act-rows" (act-order with the last
        group's first row moved into the group before: sorted, but not r / group_size, so the
        row-group path runs), or "shard" (the first half of the rows of an act-order layer twice
        as long: b_scales keeps every group of the full layer and g_idx indexes it directly, so
        is_k_full is False)."""
        if variant == "awq":
            return self.quant.awq_to_marlin(
                self.quant.quantize_awq(self.randn(size_k, size_n, scale=0.05), group_size,
                                        dtype))
        full_k = 2 * size_k if variant == "shard" else size_k
        g = self.quant.quantize_gptq(self.randn(full_k, size_n, scale=0.05), group_size,
                                     act_order=variant in ("act", "act-rows", "shard"),
                                     dtype=dtype)
        if variant == "shard":
            g = type(g)(g.qweight[: size_k // 8].contiguous(), g.scales,
                        g.g_idx[:size_k].contiguous(), group_size, size_k, size_n)
        mw = self.quant.gptq_to_marlin(g)
        if variant == "act-rows":
            g_idx = mw.g_idx.clone()
            g_idx[size_k - group_size] -= 1
            mw = dataclasses.replace(mw, g_idx=g_idx)
        return mw

    def w4a16_gemm(self, m, size_k, size_n, group_size, dtype, variant="gptq", bias=False,
                   split_blocks=None):
        """split_blocks: W4K_W4A16_SPLIT_BLOCKS for this call (None: the planner's choice)."""
        mw = self._marlin_layer(size_k, size_n, group_size, dtype, variant)
        a = self.randn(m, size_k).to(dtype)
        b_bias = self.randn(size_n, scale=0.5).to(dtype) if bias else None
        is_k_full = variant != "shard"
        workspace = self.to_dev(mw.workspace)
        if split_blocks is not None:
            os.environ["W4K_W4A16_SPLIT_BLOCKS"] = str(split_blocks)
        try:
            out = self.ns.w4a16_gemm(
                self.to_dev(a), self.to_dev(mw.b_q_weight), self.to_dev(mw.b_scales),
                self.to_dev(mw.b_zeros), self.to_dev(mw.g_idx), self.to_dev(mw.perm), workspace,
                4, m, size_n, size_k, is_k_full, self.to_dev(b_bias), True)
        finally:
            os.environ.pop("W4K_W4A16_SPLIT_BLOCKS", None)
        ref = self.reference.w4a16_gemm(a, mw.b_q_weight, mw.b_scales, mw.b_zeros, mw.g_idx,
                                        mw.perm, mw.workspace, 4, m, size_n, size_k, is_k_full,
                                        b_bias)
        w = self.reference.marlin_dequantize(mw.b_q_weight, mw.b_scales, mw.b_zeros, mw.g_idx,
                                             size_k, size_n)
        a_rows = a[:, mw.perm.long()] if mw.perm is not None else a
        result = _within_bound(out, ref, a_rows, w, b_bias)
        held = int(workspace.count_nonzero())
        if held:  # the split-K arrival counters must be back at zero for the next call
            return Result(result.err, False, f"{held} workspace counters left non-zero")
        return result


def case_list(c: Cases):
    """(name, thunk) for every case, cheapest first."""
    f16, bf16 = torch.float16, torch.bfloat16
    cases = [
        ("marlin_repack K=256 N=192", lambda: c.marlin_repack(256, 192, False)),
        ("marlin_repack act-order K=256 N=192", lambda: c.marlin_repack(256, 192, True)),
        ("awq_marlin_repack K=128 N=256", lambda: c.awq_marlin_repack(128, 256)),
    ]
    for dt in (f16, bf16):
        cases.append((f"awq_dequantize {DTYPE_NAME[dt]} K=256 N=128 g64",
                      lambda dt=dt: c.awq_dequantize(256, 128, 64, dt)))
    for m in (1, 33):
        for split in (1, 8):
            dt = f16 if split == 1 else bf16
            cases.append((f"awq_gemm {DTYPE_NAME[dt]} M={m} K=512 N=128 g128 split_k={split}",
                          lambda m=m, split=split, dt=dt: c.awq_gemm(m, 512, 128, 128, dt, split)))
    # N not a multiple of the N tile (256 columns at M <= 32, 128 above): the last tile is shifted
    # left to end at the row (its overlap with the previous tile is stored once); N = 584 also
    # pads qweight rows to 16 bytes.
    cases.append(("awq_gemm bf16 M=1 K=512 N=640 g64 split_k=8",
                  lambda: c.awq_gemm(1, 512, 640, 64, bf16, 8)))
    cases.append(("awq_gemm fp16 M=33 K=512 N=584 g128 split_k=1",
                  lambda: c.awq_gemm(33, 512, 584, 128, f16, 1)))
    # Groups of 32 with K % 64 == 32: 64-row k-tiles, K's last one of 32 rows (its missing B rows
    # not copied, activations and second scales/qzeros row zero-filled), in the last of 3 splits.
    cases.append(("awq_gemm bf16 M=1 K=608 N=256 g32 split_k=3",
                  lambda: c.awq_gemm(1, 608, 256, 32, bf16, 3)))
    # Groups of 160 (odd multiple of 32): the same 64-row k-tiles, each 32-row half's scales /
    # qzeros row counted on its own (a group ends inside a k-tile), K = 480 ends in a 32-row tile.
    cases.append(("awq_gemm fp16 M=5 K=480 N=256 g160 split_k=4",
                  lambda: c.awq_gemm(5, 480, 256, 160, f16, 4)))
    # M picks the tile height: 16 rows (M=1), 32 (M=17), 48 (M=33), 64 (M=64), two row tiles (65).
    for m, dt in ((1, f16), (17, bf16), (33, f16), (64, f16), (65, bf16)):
        cases.append((f"w4a16_gemm {DTYPE_NAME[dt]} M={m} K=256 N=128 per-channel",
                      lambda m=m, dt=dt: c.w4a16_gemm(m, 256, 128, -1, dt)))
    options = [  # (label, group_size, variant, bias)
        ("g128", 128, "gptq", False),
        ("g128 zero-points", 128, "awq", False),
        ("g128 act-order k_full", 128, "act", False),
        ("g128 act-order shard (is_k_full=False)", 128, "shard", False),
        ("g128 bias", 128, "gptq", True),
        ("g32 zero-points", 32, "awq", False),
        ("g64", 64, "gptq", True),
    ]
    for label, gs, variant, bias in options:
        for m, dt in ((1, f16), (33, bf16)):
            cases.append((f"w4a16_gemm {DTYPE_NAME[dt]} M={m} K=256 N=128 {label}",
                          lambda m=m, dt=dt, gs=gs, v=variant, b=bias:
                          c.w4a16_gemm(m, 256, 128, gs, dt, v, b)))
    cases += [
        ("w4a16_gemm fp16 M=1 K=4096 N=256 g128 split-K",
         lambda: c.w4a16_gemm(1, 4096, 256, 128, f16)),
        # Balanced split-K runs that start and end inside tiles: forced (6 tiles of 64 rows x
        # 16 stages in 13 runs), and the planner's own choice for 224 tiles (more than the SMs).
        ("w4a16_gemm fp16 M=70 K=2048 N=384 g128 zero-points bias, 13 split-K runs across tiles",
         lambda: c.w4a16_gemm(70, 2048, 384, 128, f16, "awq", True, split_blocks=13)),
        ("w4a16_gemm bf16 M=1 K=1024 N=28672 g128 (224 tiles: the planner's split-K)",
         lambda: c.w4a16_gemm(1, 1024, 28672, 128, bf16)),
        ("w4a16_gemm bf16 M=1040 K=128 N=64 per-channel no split-K (one stage of K)",
         lambda: c.w4a16_gemm(1040, 128, 64, -1, bf16, bias=True)),
        ("w4a16_gemm bf16 M=5 K=384 N=128 g96 (row-group path)",
         lambda: c.w4a16_gemm(5, 384, 128, 96, bf16)),
        ("w4a16_gemm bf16 M=9 K=256 N=192 g64 act-order (half-empty column tile)",
         lambda: c.w4a16_gemm(9, 256, 192, 64, bf16, "act")),
        ("w4a16_gemm fp16 M=3 K=4352 N=128 g128 act-order, a row out of group order in the"
         " last gather block (row-group path)",
         lambda: c.w4a16_gemm(3, 4352, 128, 128, f16, "act-rows")),
        ("w4a16_gemm fp16 M=9 K=256 N=192 g64 zero-points (half-empty column tile)",
         lambda: c.w4a16_gemm(9, 256, 192, 64, f16, "awq", True)),
        # M >= 256 (kW4a16DequantThresholdCuda): marlin_dequant_kernel + a cuBLAS matmul
        ("w4a16_gemm bf16 M=300 K=256 N=640 g128 zero-points bias (dense path: dequantize +"
         " matmul)", lambda: c.w4a16_gemm(300, 256, 640, 128, bf16, "awq", True)),
        ("w4a16_gemm fp16 M=256 K=384 N=192 g64 act-order (dense path, gathered a)",
         lambda: c.w4a16_gemm(256, 384, 192, 64, f16, "act")),
        ("w4a16_gemm fp16 M=260 K=256 N=128 g128 act-order shard (dense path, row groups)",
         lambda: c.w4a16_gemm(260, 256, 128, 128, f16, "shard")),
    ]
    return cases


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--simt", action="store_true",
                        help="run the CUDA kernels on CPU under the SIMT emulator")
    parser.add_argument("-k", dest="select", default="",
                        help="only the cases whose name contains this substring")
    parser.add_argument("-x", dest="exclude", default=None,
                        help="leave out the cases whose name contains this substring")
    parser.add_argument("--list", action="store_true", help="print the case names and exit")
    args = parser.parse_args()

    if not args.simt and not args.list and not torch.cuda.is_available():
        print("gpu_sanitize_cases: no CUDA GPU visible (torch.cuda.is_available() is False); "
              "nothing to run. Pass --simt to run the same cases under the emulator.")
        return 0
    w4kernels = _import_w4kernels()
    if args.simt:
        if not w4kernels.HAS_SIMT:
            print("gpu_sanitize_cases: w4kernels._simt was not built (W4K_SIMT=0)")
            return 1
        ns, device = torch.ops.w4kernels_simt, "cpu"
    else:
        ns, device = torch.ops.w4kernels, "cuda"
        if not args.list and not w4kernels.build_info()["cuda_kernels"]:
            print("gpu_sanitize_cases: this w4kernels build has no CUDA kernels; rebuild with "
                  "W4K_CUDA=1 python setup.py build_ext --inplace")
            return 1

    cases = [(n, f) for n, f in case_list(Cases(w4kernels, ns, device))
             if args.select in n and not (args.exclude and args.exclude in n)]
    if args.list:
        print("\n".join(n for n, _ in cases))
        return 0
    where = torch.cuda.get_device_name() if device == "cuda" else "CPU (SIMT emulator)"
    print(f"device: {where}   torch {torch.__version__}   {len(cases)} cases")
    failures = 0
    for name, run in cases:
        t0 = time.perf_counter()
        try:
            r = run()
            if device == "cuda":
                torch.cuda.synchronize()  # an asynchronous kernel fault surfaces here, per case
        except Exception as e:  # noqa: BLE001  (report and go on: the sanitizer log has the rest)
            print(f"ERROR    {name}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            failures += 1
            continue
        status = "ok" if r.ok else "MISMATCH"
        failures += not r.ok
        print(f"{status:<8} {name:<72} max err {r.err:.3e} ({r.detail}) "
              f"{time.perf_counter() - t0:.1f}s")
    print(f"{len(cases) - failures} of {len(cases)} cases ok")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
