"""GPU benchmark: our w4a16_gemm (Marlin layout) and awq_gemm against cuBLAS on the dense weight
and against "dequantize + matmul" (our awq_dequantize, then torch.matmul), same GPU, same run.

Layers are K x N (K = in_features, the reduction dimension; N = out_features): the weight of
``y[M, N] = x[M, K] @ W[K, N]``. Shapes (K, N): (4096, 4096), (4096, 11008), (11008, 4096),
(8192, 28672) (Llama-7B attention and MLP, Llama-70B MLP up-projection). Weights are
4-bit with group size 128 (GPTQ symmetric by default; ``--zero-points``: AWQ-style zero points,
``--act-order``: GPTQ act-order with the activation permutation). All four methods multiply by
the same weight values: the dense weight *is* awq_dequantize of the quantized one.

Method (per shape, dtype and M): check once that w4a16_gemm and awq_gemm match the fp32 matmul
of the dequantized weight within the fp32-accumulation bound, then time each method with CUDA
events: ``--warmup`` untimed calls, then ``--iters`` calls each between its own pair of events,
queued behind a ``torch.cuda._sleep`` kernel so that the times are GPU time, not launch
overhead. Every call uses the next of several copies of the weights, enough copies
(``ceil(4 * 50 MB / weight bytes)``, at least 2) that the weights come from HBM, not from the
H100's 50 MB L2. Medians are printed.

Columns: ms per method; w4a16 TFLOP/s (2MNK / time); w4a16 weight GB/s (int4 weight + scales
[+ zero points] bytes / time) and its share of the copy bandwidth (a device-to-device copy of
1 GiB measured in the same run: read + write bytes / time); speedups over cuBLAS; the ideal
speedup from bytes moved, (dense 16-bit weight + x + y bytes) / (int4 weight + scales + x + y
bytes), which is what a purely memory-bound kernel could reach.

    python benchmarks/bench_gpu_gemm.py                       # full M sweep, 4 shapes, fp16 + bf16
    python benchmarks/bench_gpu_gemm.py --quick               # 4 values of M, 2 shapes, fp16
    python benchmarks/bench_gpu_gemm.py --m 1 16 --dtype bf16 --act-order
    python benchmarks/bench_gpu_gemm.py --graph --m 1 4 16 64 128   # CUDA-graph replays
    python benchmarks/bench_gpu_gemm.py --graph --split-blocks none old 1x 2x --m 1 16 128
    python benchmarks/bench_gpu_gemm.py --simt                # no GPU: exercise this script on
                                                              # CPU (emulator; times meaningless)

``--split-blocks V ...``: A/B of w4a16_gemm's split-K partitions against the planner's choice,
timed in the same run on the same weight copies (W4K_W4A16_SPLIT_BLOCKS, read per call). V is
``none`` (one block per tile), ``Nx`` (N blocks per SM, balanced runs), ``old`` (each tile cut
into the uniform split count of the planner before 2026-11-27: resident blocks / tiles, fewer
when one per SM covers 3/4 of the SMs; resident = 2 blocks per SM at 16 rows, else 1, as
ptxas allocates on sm_90) or a block count. Extra columns: ms per V and "V x" = planner ms /
V ms (> 1: V is faster than the planner's choice).

The copy bandwidth is always timed with events (a copy captured in a CUDA graph runs as a
memcpy node, measured at 2.7 TB/s against 4.2 TB/s on an H200: not the device's bandwidth).

Without a GPU (and without ``--simt``) it prints why and exits with status 0.
"""

import argparse
import math
import os
import statistics
import sys
import time

import torch

import gpu_target

SHAPES = [(4096, 4096), (4096, 11008), (11008, 4096), (8192, 28672)]  # (K, N)
QUICK_SHAPES = [(4096, 4096), (4096, 11008)]
SIMT_SHAPES = [(256, 128)]
M_SWEEP = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
QUICK_M = [1, 16, 128, 1024]
SIMT_M = [1, 33]
GROUP_SIZE = 128
L2_BYTES = 50e6  # H100 / H200 L2
MAX_COPIES = 64
SPLIT_ENV = "W4K_W4A16_SPLIT_BLOCKS"  # read by the w4a16_gemm binding on every call
STAGE_K, TILE_N, MIN_STAGES_PER_SPLIT = 128, 128, 4  # csrc/kernels/w4a16_gemm.cuh
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
UNIT_ROUNDOFF = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8}


def copies_for(nbytes, simt):
    """Weight copies to rotate through so that the set is 4x the L2 (2 under the emulator)."""
    if simt:
        return 2
    return min(MAX_COPIES, max(2, math.ceil(4 * L2_BYTES / nbytes)))


class Timer:
    """Median time of fn(i), i = the weight copy to use, in ms."""

    def __init__(self, device, warmup, iters):
        self.device, self.warmup, self.iters = device, warmup, iters
        self.drained = False  # set when the launch queue ran dry (times then include overhead)
        self.sleep_ms = 5.0  # doubled (up to 80 ms) whenever the queue runs dry
        if device == "cuda":
            self.cycles_per_ms = self._cycles_per_ms()

    @staticmethod
    def _cycles_per_ms():
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1000)  # load the kernel before timing it
        start.record()
        torch.cuda._sleep(10_000_000)
        end.record()
        end.synchronize()
        return int(10_000_000 / max(start.elapsed_time(end), 1e-3))

    def __call__(self, fn, copies):
        for i in range(self.warmup):
            fn(i % copies)
        if self.device != "cuda":
            times = []
            for i in range(self.iters):
                t0 = time.perf_counter()
                fn(i % copies)
                times.append((time.perf_counter() - t0) * 1e3)
            return statistics.median(times)
        while True:
            times, drained = self._gpu_times(fn, copies)
            if not drained:
                return statistics.median(times)
            if self.sleep_ms >= 80:  # give up: report it once, at the end
                self.drained = True
                return statistics.median(times)
            self.sleep_ms *= 2

    def _gpu_times(self, fn, copies):
        torch.cuda.synchronize()
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(self.iters)]
        queue_start = torch.cuda.Event(enable_timing=True)
        # The sleep keeps the GPU busy while the CPU enqueues every call, so each event pair
        # brackets GPU work only. Enqueueing runs at a steady rate, so the queue ran dry iff
        # the CPU finished after the GPU would have (sleep + the GPU's span of the calls).
        torch.cuda._sleep(int(self.cycles_per_ms * self.sleep_ms))
        queue_start.record()
        t0 = time.perf_counter()
        for i, (start, end) in enumerate(events):
            start.record()
            fn(i % copies)
            end.record()
        host_ms = (time.perf_counter() - t0) * 1e3
        torch.cuda.synchronize()
        drained = host_ms > self.sleep_ms + queue_start.elapsed_time(events[-1][1])
        return [s.elapsed_time(e) for s, e in events], drained


class GraphTimer:
    """``--graph``: median time per call of fn(i), replayed from a CUDA graph that holds one call
    per weight copy (so the weights still rotate), ``iters`` calls per sample, 5 samples. No
    launch gaps and no per-call event overhead: the time a decode step replaying CUDA graphs (as
    vLLM's does) sees."""

    drained = False  # graphs never drain the launch queue

    def __init__(self, warmup, iters):
        self.warmup, self.iters = warmup, iters

    def __call__(self, fn, copies):
        side = torch.cuda.Stream()  # warm-up on a side stream, as torch.cuda.graphs asks
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for i in range(max(self.warmup, copies)):
                fn(i % copies)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(copies):
                fn(i)
        graph.replay()
        torch.cuda.synchronize()
        replays = max(1, -(-self.iters // copies))
        times = []
        for _ in range(5):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(replays):
                graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / (replays * copies))
        del graph
        return statistics.median(times)


def copy_bandwidth(device, timer):
    """Bytes read + written per second of a device-to-device copy (1 GiB on a GPU)."""
    nbytes = (1 << 30) if device == "cuda" else (1 << 24)
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    src.fill_(1)
    dst = torch.empty_like(src)
    ms = timer(lambda i: dst.copy_(src), 1)
    del src, dst
    return 2 * nbytes / (ms * 1e-3)


class Layer:
    """One quantized K x N layer in every format the methods take, ``copies`` times each, plus
    the dense weight. Made on the device from random uint4 codes (the quantizer's rounding is
    irrelevant to speed; the reference packers give the exact checkpoint layouts)."""

    def __init__(self, w4kernels, ns, device, size_k, size_n, dtype, zero_points, act_order,
                 simt):
        ref = w4kernels.reference
        self.size_k, self.size_n, self.dtype = size_k, size_n, dtype
        groups = size_k // GROUP_SIZE
        gen = torch.Generator(device=device).manual_seed(size_k * 7 + size_n)
        q = torch.randint(0, 16, (size_k, size_n), dtype=torch.int32, device=device,
                          generator=gen)
        scales = (torch.rand(groups, size_n, device=device, generator=gen) * 0.02
                  + 1e-3).to(dtype)
        if zero_points:
            zeros = torch.randint(0, 16, (groups, size_n), dtype=torch.int32, device=device,
                                  generator=gen)
        else:  # zero point 8 everywhere: AWQ's formula then gives GPTQ's symmetric weight
            zeros = torch.full((groups, size_n), 8, dtype=torch.int32, device=device)
        qweight, qzeros = ref.awq_pack(q), ref.awq_pack(zeros)

        self.perm = self.g_idx = None
        if act_order:
            # A permutation within each group: g_idx[perm] stays sorted (as Marlin requires)
            # and the group of row k stays k // 128, so the dense weight is unchanged, while
            # the kernel does all the act-order work (gathering x's columns, g_idx lookups).
            keys = torch.rand(size_k, device=device, generator=gen) + (
                torch.arange(size_k, device=device) // GROUP_SIZE)
            self.perm = torch.argsort(keys).to(torch.int32)
            self.g_idx = (self.perm // GROUP_SIZE).to(torch.int32)
            b_q_weight = ns.marlin_repack(ref.pack_rows(q), self.perm, size_k, size_n, 4)
        else:
            b_q_weight = ns.awq_marlin_repack(qweight, size_k, size_n, 4)
        del q
        b_scales = ref.marlin_permute_scales(scales, size_k, size_n, GROUP_SIZE)
        b_zeros = ref.awq_to_marlin_zero_points(qzeros, groups, size_n) if zero_points else None
        self.dense = ns.awq_dequantize(qweight, scales, qzeros, 0, 0, 0)
        self.workspace = w4kernels.ops.marlin_workspace(size_n, device)

        self.int4_bytes = size_k * size_n // 2 + scales.numel() * scales.element_size() + (
            qzeros.numel() * 4 if zero_points else 0)
        self.dense_bytes = self.dense.numel() * self.dense.element_size()
        self.n_int4 = copies_for(self.int4_bytes, simt)
        self.n_dense = copies_for(self.dense_bytes, simt)
        # Copy 0 is the original; the clones only need the same values at other addresses.
        self.awq = [(qweight, scales, qzeros)] + [
            (qweight.clone(), scales.clone(), qzeros.clone()) for _ in range(self.n_int4 - 1)]
        self.marlin = [(b_q_weight, b_scales, b_zeros)] + [
            (b_q_weight.clone(), b_scales.clone(), None if b_zeros is None else b_zeros.clone())
            for _ in range(self.n_int4 - 1)]
        self.denses = [self.dense] + [self.dense.clone() for _ in range(self.n_dense - 1)]


def old_split_blocks(m, size_n, size_k, num_sms):
    """The block count of the uniform split-K planned before 2026-11-27 (0: no split)."""
    m_blocks = 1 if m <= 16 else 2 if m <= 32 else 3 if m <= 48 else 4
    tiles = -(-m // (16 * m_blocks)) * -(-size_n // TILE_N)
    stages = -(-size_k // STAGE_K)
    resident = (2 if m_blocks == 1 else 1) * num_sms
    if tiles >= resident:
        return 0
    splits = resident // tiles
    one_per_sm = num_sms // tiles
    if one_per_sm >= 1 and 4 * tiles * one_per_sm >= 3 * num_sms:
        splits = min(splits, one_per_sm)
    splits = min(splits, stages // MIN_STAGES_PER_SPLIT)
    if splits <= 1:
        return 0
    per_split = -(-stages // splits)
    return tiles * -(-stages // per_split)


def split_blocks_value(token, m, size_n, size_k, num_sms):
    """W4K_W4A16_SPLIT_BLOCKS for a --split-blocks token."""
    if token == "none":
        return 0
    if token == "old":
        return old_split_blocks(m, size_n, size_k, num_sms)
    if token.endswith("x"):
        return int(token[:-1]) * num_sms
    return int(token)


def methods(ns, layer, split_k_iters, split_tokens=(), num_sms=1):
    """name -> (fn(x, i), copies): the four ways to compute x @ W with weight copy i, plus
    w4a16_gemm with W4K_W4A16_SPLIT_BLOCKS per --split-blocks token (the plain w4a16 column
    then runs with it unset: the planner's choice)."""
    k, n = layer.size_k, layer.size_n

    def w4a16_call(x, i):
        b_q_weight, b_scales, b_zeros = layer.marlin[i]
        return ns.w4a16_gemm(x, b_q_weight, b_scales, b_zeros, layer.g_idx, layer.perm,
                             layer.workspace, 4, x.shape[0], n, k, True, None, True)

    def with_split(token):
        def fn(x, i):
            if token is None:
                os.environ.pop(SPLIT_ENV, None)
            else:
                os.environ[SPLIT_ENV] = str(split_blocks_value(token, x.shape[0], n, k, num_sms))
            return w4a16_call(x, i)
        return fn

    w4a16 = with_split(None) if split_tokens else w4a16_call

    def awq(x, i):
        qweight, scales, qzeros = layer.awq[i]
        return ns.awq_gemm(x, qweight, scales, qzeros, split_k_iters)

    def deq_mm(x, i):
        qweight, scales, qzeros = layer.awq[i]
        return torch.matmul(x, ns.awq_dequantize(qweight, scales, qzeros, 0, 0, 0))

    def cublas(x, i):
        return torch.matmul(x, layer.denses[i])

    fns = {"cublas": (cublas, layer.n_dense), "deq+mm": (deq_mm, layer.n_int4),
           "w4a16": (w4a16, layer.n_int4), "awq": (awq, layer.n_int4)}
    for token in split_tokens:
        fns[f"split {token}"] = (with_split(token), layer.n_int4)
    return fns


def check(name, out, x, layer):
    """Max error of out against the fp32 matmul of the dequantized weight, and whether it is
    within the fp32-accumulation bound (both sides accumulate in fp32 and round once)."""
    w = layer.dense.float()
    ref = x.float() @ w
    mag = x.float().abs() @ w.abs()
    acc = 2 * (layer.size_k + 1) * 2.0 ** -24 * mag  # ours and the fp32 reference
    bound = UNIT_ROUNDOFF[layer.dtype] * (ref.abs() + acc) + acc + 2.0 ** -24
    err = (out.float() - ref).abs()
    worst = (err / bound).max().item()
    return err.max().item(), worst <= 1.0, f"{name}: max err {err.max().item():.3e}, " \
                                           f"{worst:.2f} of the bound"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--m", type=int, nargs="+", help="values of M (default: 1 .. 4096)")
    parser.add_argument("--dtype", choices=["fp16", "bf16", "both"], default=None,
                        type=lambda s: {"float16": "fp16", "bfloat16": "bf16"}.get(s, s),
                        help="activation dtype (default: both; fp16 with --quick; torch's "
                             "float16 / bfloat16 accepted)")
    parser.add_argument("--act-order", action="store_true", help="GPTQ act-order for w4a16")
    parser.add_argument("--zero-points", action="store_true",
                        help="random zero points (w4a16 takes its AWQ-style zero-point path)")
    parser.add_argument("--split-k-iters", type=int, default=8, help="awq_gemm's split_k_iters")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--quick", action="store_true",
                        help=f"M in {QUICK_M}, shapes {QUICK_SHAPES}, fp16, fewer iterations")
    parser.add_argument("--graph", action="store_true",
                        help="time calls replayed from CUDA graphs (no launch gaps or per-call "
                             "events; decode as vLLM runs it) instead of event pairs per call")
    parser.add_argument("--split-blocks", nargs="+", default=[], metavar="V",
                        help="also time w4a16_gemm with these split-K partitions (none, old, "
                             "Nx = N blocks per SM, or a block count): columns V ms, "
                             "V x = planner ms / V ms")
    parser.add_argument("--simt", action="store_true",
                        help="run on CPU under the SIMT emulator with a tiny shape (checks the "
                             "script itself; the timings mean nothing)")
    args = parser.parse_args()
    if args.graph and args.simt:
        parser.error("--graph needs a GPU (CUDA graphs); --simt runs on the CPU")

    target = gpu_target.choose("bench_gpu_gemm", args.simt)
    if not isinstance(target, gpu_target.Target):
        return target
    device, namespace, w4kernels = target
    if args.simt:
        shapes = SIMT_SHAPES
        m_values = args.m or SIMT_M
        args.warmup, args.iters = min(args.warmup, 1), min(args.iters, 2)
    else:
        shapes = QUICK_SHAPES if args.quick else SHAPES
        m_values = args.m or (QUICK_M if args.quick else M_SWEEP)
        if args.quick:
            args.iters = min(args.iters, 10)
    dtype_names = {"fp16": ["fp16"], "bf16": ["bf16"], "both": ["fp16", "bf16"],
                   None: ["fp16"] if args.quick or args.simt else ["fp16", "bf16"]}[args.dtype]

    ns = getattr(torch.ops, namespace)

    timer = GraphTimer(args.warmup, args.iters) if args.graph else Timer(device, args.warmup,
                                                                          args.iters)
    copy_bw = copy_bandwidth(device, Timer(device, args.warmup, args.iters))
    where = torch.cuda.get_device_name() if device == "cuda" else "CPU (SIMT emulator)"
    variant = "GPTQ" + (" act-order" if args.act_order else "") + (
        " + zero points" if args.zero_points else "")
    how = (f"CUDA graphs, median of 5 samples of ~{args.iters} replayed calls" if args.graph
           else f"events per call, median of {args.iters}")
    print(f"device: {where}   torch {torch.__version__}   {how} "
          f"(after {args.warmup} warm-up calls)")
    print(f"weights: int4 {variant}, group {GROUP_SIZE}; awq_gemm split_k_iters="
          f"{args.split_k_iters}; copy bandwidth (read + write): {copy_bw / 1e9:.0f} GB/s")

    header = (f"{'M':>5} {'N':>6} {'K':>6} {'cuBLAS ms':>10} {'deq+mm ms':>10} {'w4a16 ms':>9} "
              f"{'awq ms':>9} {'TFLOP/s':>8} {'wt GB/s':>8} {'%copy':>6} {'w4a16 x':>8} "
              f"{'awq x':>6} {'ideal x':>8}")
    num_sms = (torch.cuda.get_device_properties(0).multi_processor_count if device == "cuda"
               else int(os.environ.get("W4K_SIMT_SMS", "8")))
    for token in args.split_blocks:
        header += f" {token + ' ms':>9} {token + ' x':>7}"
    if args.split_blocks:
        print(f"--split-blocks: w4a16 = the planner's split-K, 'V ms' = {SPLIT_ENV} set for V "
              f"({num_sms} SMs); V x = w4a16 ms / V ms")
    failures = 0
    graph_failures = set()  # --graph: methods whose calls could not be captured (nan in the table)
    for dname in dtype_names:
        dtype = DTYPES[dname]
        for size_k, size_n in shapes:
            try:
                layer = Layer(w4kernels, ns, device, size_k, size_n, dtype, args.zero_points,
                              args.act_order, args.simt)
            except torch.cuda.OutOfMemoryError:
                print(f"{dname} K={size_k} N={size_n}: skipped, out of GPU memory")
                torch.cuda.empty_cache()
                continue
            fns = methods(ns, layer, args.split_k_iters, args.split_blocks, num_sms)
            print(f"\n{dname}  K={size_k} N={size_n}  weight copies: int4 {layer.n_int4} x "
                  f"{layer.int4_bytes / 1e6:.1f} MB, dense {layer.n_dense} x "
                  f"{layer.dense_bytes / 1e6:.1f} MB")
            x_check = torch.randn(min(max(m_values), 64), size_k, device=device).to(dtype)
            ok = True
            checks = [("w4a16", x_check), ("awq", x_check)]
            checks += [(f"split {token}", x_check) for token in args.split_blocks]
            for name, xc in checks:
                _, good, text = check(name, fns[name][0](xc, 0), xc, layer)
                if not good:
                    print(f"MISMATCH {text}")
                    ok = False
            if not ok:
                failures += 1
                continue
            print(header)
            print("-" * len(header))
            for m in m_values:
                x = torch.randn(m, size_k, device=device).to(dtype)

                def time_method(name, fn, copies):
                    try:
                        return timer(lambda i: fn(x, i), copies)
                    except RuntimeError as e:  # --graph: a method that cannot be captured
                        if not args.graph or isinstance(e, torch.cuda.OutOfMemoryError):
                            raise
                        graph_failures.add(f"{name}: {str(e).splitlines()[0] if str(e) else e}")
                        return float("nan")

                try:
                    ms = {name: time_method(name, fn, copies)
                          for name, (fn, copies) in fns.items()}
                except torch.cuda.OutOfMemoryError:
                    print(f"{m:>5} {size_n:>6} {size_k:>6}  skipped: out of GPU memory")
                    torch.cuda.empty_cache()
                    continue
                act_bytes = (m * size_k + m * size_n) * x.element_size()
                ideal = (layer.dense_bytes + act_bytes) / (layer.int4_bytes + act_bytes)
                wt_gbs = layer.int4_bytes / (ms["w4a16"] * 1e-3) / 1e9
                print(f"{m:>5} {size_n:>6} {size_k:>6} {ms['cublas']:10.4f} {ms['deq+mm']:10.4f} "
                      f"{ms['w4a16']:9.4f} {ms['awq']:9.4f} "
                      f"{2 * m * size_n * size_k / (ms['w4a16'] * 1e-3) / 1e12:8.1f} "
                      f"{wt_gbs:8.0f} {100 * wt_gbs * 1e9 / copy_bw:5.0f}% "
                      f"{ms['cublas'] / ms['w4a16']:7.2f}x {ms['cublas'] / ms['awq']:5.2f}x "
                      f"{ideal:7.2f}x"
                      + "".join(f" {ms['split ' + t]:9.4f} {ms['w4a16'] / ms['split ' + t]:6.2f}x"
                                for t in args.split_blocks))
            del layer, fns
            if device == "cuda":
                torch.cuda.empty_cache()
    for text in sorted(graph_failures):
        print(f"note: --graph could not capture {text}; its cells are nan")
    if timer.drained:
        print("\nnote: enqueueing outlasted the GPU work queued ahead of it at least once; "
              "the smallest times may include launch overhead")
    os.environ.pop(SPLIT_ENV, None)
    if failures:
        print(f"{failures} shape(s) did not match dequantize + matmul")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
