"""CPU speed of w4a16_gemm against torch's own ops and a read-bandwidth probe, in one run.

For each (N, K) and M it prints the median time (ms) of:

* ``gptq``: ``w4a16_gemm``, symmetric GPTQ weight, group 128; ``awq``: the same with zero
  points; ``act``: act-order (g_idx + perm, group 128);
* ``awq_gemm``: ``awq_gemm`` on AutoAWQ tensors of the same size (group 128, zero points),
  decoded on every call (its own kernel, csrc/cpu/awq_gemm_cpu.h), for the side-by-side;
* ``lin16`` / ``lin32``: ``torch.nn.functional.linear`` in the activation dtype / fp32 on the
  dense dequantized weight (what the model would run without quantization);

and, for ``gptq``, the weight GB/s (int4 bytes K * N / 2 per call) and its share of the probe
(``%bw``, the figure that matters at M = 1..4), GFLOP/s (2 M N K) and its share of the
vdpbf16ps peak given by ``--peak-tflops`` (``%pk``, what matters for M >= 8), and the speed
ratio to ``lin16`` (> 1: w4a16_gemm is faster).

Probe: numpy sums over 128 MiB fp32 arrays split across torch's thread count, rotated: the
read bandwidth the machine gives right now. Every operand is rotated over enough copies to exceed the 32 MiB L3
twice, so each call streams its weight from DRAM as in a model.

``--routes`` times every variant twice, on the kernel and on the dense route (dequantize once
+ torch's matmul; ``W4K_W4A16_DEQUANT_THRESHOLD`` forced per call), and prints per (shape,
variant) the ratio dense / kernel at each M and the rule: the smallest M from which the dense
route is faster on most rows at every larger M (the op's default threshold comes from it; the
header prints the op's current rule).

``--cpu-time`` (with ``--threads 1``) times each call by the calling thread's CPU time
(``time.thread_time``) and keeps the minimum: immune to the time slices a shared machine's
other processes take (not to their use of caches and memory), so one core's kernel speed can
be compared with torch's while others work.

``--background-load P`` starts P busy processes (pure Python loops) and measures every row
twice, quiet and then under that load, printing the slowdown of ``gptq`` and of ``lin16``
(issue 9, item 7: our op must not slow down more than torch's own under load). The machine may
be shared: the header prints the load average; read medians against the same-run baselines.

    PYTHONPATH=$PWD/python python benchmarks/bench_w4a16_cpu.py [--dtype bf16|fp16]
        [--ms 1,4,16,64,256] [--shapes 4096x4096,11008x4096,4096x11008] [--threads 2]
        [--repeats 15] [--background-load 2] [--routes --ms 16,32,64,128,256,512]
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

import w4kernels
from w4kernels import reference as R

L3_BYTES = 32 << 20
ENV_THRESHOLD = "W4K_W4A16_DEQUANT_THRESHOLD"
# The op's defaults (kW4a16DequantThreshold* in csrc/cpu/w4a16_gemm_dequant.h).
OP_DEFAULT_THRESHOLD = {"bf16": "never (bf16 stays on the kernel)",
                        "fp16": "never (fp16 stays on the kernel)"}


def print_rule(rule):
    """Per (shape, variant): the time ratio dense route / kernel at each M, and the smallest M
    from which the dense route is faster at every measured M (the op's threshold)."""
    print(f"dispatch rule ({ENV_THRESHOLD}; ratio = dequantize once + matmul / kernel, < 1: "
          "dense faster):")
    for (size_n, size_k, v), rows in rule.items():
        first = next((m for i, (m, _) in enumerate(rows)
                      if all(r < 1 for _, r in rows[i:])), None)
        ratios = " ".join(f"M={m}:{r:.2f}" for m, r in rows)
        print(f"  {size_n}x{size_k} {v:>5}: {ratios}  -> dense from M = {first}")
    ms = sorted({m for rows in rule.values() for m, _ in rows})

    def wins(m):  # rows (shape, variant) where the dense route is faster at M = m
        return sum(1 for rows in rule.values() for mm, r in rows if mm == m and r < 1)

    majority = next((m for i, m in enumerate(ms)
                     if all(2 * wins(x) > len(rule) for x in ms[i:])), None)
    print(f"  rule: dense route from M = {majority} (the smallest M from which it is faster on "
          f"most rows at every larger measured M; None: not within the measured M)")


def copies_for(nbytes, minimum=2):
    """How many copies of an nbytes operand exceed the L3 twice over."""
    return max(minimum, -(-2 * L3_BYTES // nbytes))


CPU_TIME = False  # --cpu-time: min of the calling thread's CPU time instead of the wall median


def timeit(fn, args_list, repeats, warmup=2, wall=False):
    for i in range(warmup):
        fn(*args_list[i % len(args_list)])
    cpu_time = CPU_TIME and not wall
    clock = time.thread_time if cpu_time else time.perf_counter
    times = []
    for i in range(repeats):
        args = args_list[i % len(args_list)]
        t0 = clock()
        fn(*args)
        times.append(clock() - t0)
    return min(times) if cpu_time else statistics.median(times)


def probe_gbs(repeats, threads):
    """Read bandwidth: `threads` Python threads each summing its part of a 128 MiB fp32 array
    with numpy (which releases the GIL), arrays rotated. Not torch's x.sum(): an OpenMP region
    collapses on a loaded machine (see --background-load) and would understate the memory."""
    import threading

    import numpy as np

    xs = [np.ones(32 << 20, dtype=np.float32) for _ in range(2)]

    def once(x):
        parts = np.array_split(x, threads)
        workers = [threading.Thread(target=np.sum, args=(part,)) for part in parts]
        for w in workers:
            w.start()
        for w in workers:
            w.join()

    t = timeit(once, [(x,) for x in xs], repeats, wall=True)  # the work is in other threads
    return xs[0].nbytes / t / 1e9


def make_weights(size_k, size_n, variant, dtype, gen, copies):
    """Marlin operands (b_q_weight, b_scales, b_zeros, g_idx, perm) and the dense [N, K] weight;
    for ``awq_gemm``, AutoAWQ tensors (qweight [K, N/8], scales [G, N], qzeros [G, N/8])."""
    group = 128
    out = []
    if variant == "awq_gemm":
        for _ in range(copies):
            words = (size_k, size_n // 8)
            qw = torch.randint(-2**31, 2**31 - 1, words, dtype=torch.int32, generator=gen)
            qz = torch.randint(-2**31, 2**31 - 1, (size_k // group, size_n // 8),
                               dtype=torch.int32, generator=gen)
            s = (torch.rand(size_k // group, size_n, generator=gen) * 0.01 + 0.001).to(dtype)
            out.append((qw, s, qz))
        return out, None
    for _ in range(copies):
        q = torch.randint(0, 16, (size_k, size_n), dtype=torch.int32, generator=gen)
        s = (torch.rand(size_k // group, size_n, generator=gen) * 0.01 + 0.001).to(dtype)
        zeros = g_idx = perm = None
        if variant == "awq":
            z = torch.randint(0, 16, (size_k // group, size_n), dtype=torch.int32, generator=gen)
            zeros = R.marlin_zero_points(z, size_k // group, size_n)
        if variant == "act":
            g_idx = (torch.arange(size_k) // group).int()  # sorted groups, Marlin row order
            perm = torch.randperm(size_k, generator=gen).int()
        out.append((R.marlin_pack(q), R.marlin_permute_scales(s, size_k, size_n, group), zeros,
                    g_idx, perm))
    b = out[0]
    dense = R.marlin_dequantize(b[0], b[1], b[2], None, size_k, size_n)  # [K, N] in dtype
    return out, dense.t().contiguous()


class BackgroundLoad:
    """P busy processes (started by us, stopped by their pids) while the context is open."""

    def __init__(self, procs):
        self.procs, self.children = procs, []

    def __enter__(self):
        for _ in range(self.procs):
            self.children.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
        time.sleep(0.5)  # let them get going
        return self

    def __exit__(self, *exc):
        for child in self.children:
            child.kill()
            child.wait()
        self.children = []


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"],
                    type=lambda s: {"bfloat16": "bf16", "float16": "fp16"}.get(s, s))
    ap.add_argument("--ms", default="1,4,16,64,256")
    ap.add_argument("--shapes", default="4096x4096,11008x4096,4096x11008", help="NxK,...")
    ap.add_argument("--variants", default="gptq,awq,act")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    ap.add_argument("--peak-tflops", type=float, default=0.468,
                    help="the vdpbf16ps peak of the threads used (bench_cpu_gemm.py measured "
                         "0.468 on this project's 2 cores, quiet; 0.234 for one)")
    ap.add_argument("--cpu-time", action="store_true",
                    help="with --threads 1: min of the thread's CPU time per call (see above)")
    ap.add_argument("--no-fp32", action="store_true", help="skip the fp32 F.linear baseline")
    ap.add_argument("--background-load", type=int, default=0, metavar="P",
                    help="also measure every row while P busy processes run")
    ap.add_argument("--routes", action="store_true",
                    help="time every variant on both routes (kernel: W4K_W4A16_DEQUANT_THRESHOLD "
                         "huge; dense: 0, dequantize once + torch matmul) and print the measured "
                         "dispatch rule")
    args = ap.parse_args()
    if args.cpu_time:
        if args.threads != 1:
            ap.error("--cpu-time needs --threads 1 (it times the calling thread only)")
        global CPU_TIME
        CPU_TIME = True
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    ms = [int(m) for m in args.ms.split(",")]
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    variants = args.variants.split(",")
    if args.routes:
        variants = [v if v == "awq_gemm" else f"{v}:{r}" for v in variants
                    for r in (("kern",) if v == "awq_gemm" else ("kern", "deq"))]
    gen = torch.Generator().manual_seed(0)
    op = torch.ops.w4kernels.w4a16_gemm
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    model = next((ln.split(":", 1)[1].strip() for ln in flags.splitlines()
                  if ln.startswith("model name")), "?")
    probe = probe_gbs(max(5, args.repeats // 2), torch.get_num_threads())
    print(f"cpu={model!r} threads={torch.get_num_threads()} dtype={args.dtype} group=128 "
          f"timing={'min thread CPU time' if CPU_TIME else 'wall median'} "
          f"repeats={args.repeats} torch={torch.__version__} "
          f"avx512_bf16={'avx512_bf16' in flags} W4K_CPU_ISA={os.environ.get('W4K_CPU_ISA')} "
          f"loadavg={os.getloadavg()[0]:.1f} probe={probe:.1f} GB/s "
          f"peak={args.peak_tflops} TFLOP/s background_load={args.background_load}")
    print(f"op's dispatch rule: dense route (dequantize once + torch matmul) for grouped weights "
          f"from M = {OP_DEFAULT_THRESHOLD[args.dtype]} ({ENV_THRESHOLD}="
          f"{os.environ.get(ENV_THRESHOLD, 'unset')}; --routes measures both sides)")
    head = (f"{'N':>6} {'K':>6} {'M':>4} | " + " ".join(f"{v:>7}" for v in variants) +
            f" | {'lin16':>7} {'lin32':>7} | {'GB/s':>6} {'%bw':>4} {'GFLOP/s':>7} {'%pk':>4}"
            f" {'x lin16':>7}")
    if args.background_load:
        head += f" | {'gptq@load':>9} {'slow':>5} {'lin16@load':>10} {'slow':>5}"
    print(head + ("   (times: ms, min thread CPU time)" if CPU_TIME else "   (times: ms, medians)"))
    rule = {}
    for size_n, size_k in shapes:
        n_q = copies_for(size_k * size_n // 2)
        base = {v.split(":")[0] for v in variants}
        base = {b: make_weights(size_k, size_n, b, dtype, gen, n_q) for b in sorted(base)}
        weights = {v: base[v.split(":")[0]] for v in variants}
        dense = next(w[1] for w in weights.values() if w[1] is not None)
        w16 = [dense.clone() for _ in range(copies_for(2 * size_k * size_n))]
        w32 = [] if args.no_fp32 else [dense.float() for _ in range(copies_for(4 * size_k * size_n))]
        ws = w4kernels.ops.marlin_workspace(size_n)
        for m in ms:
            a = torch.randn(m, size_k, generator=gen).to(dtype)
            a32 = a.float()

            def run(bq, bs, bz, gi, pm):
                return op(a, bq, bs, bz, gi, pm, ws, 4, m, size_n, size_k, True, None, True)

            def run_awq(qw, s, qz):
                return torch.ops.w4kernels.awq_gemm(a, qw, s, qz, 8)

            def timed(v):
                # the op reads W4K_W4A16_DEQUANT_THRESHOLD on every call
                route = v.split(":")[1] if ":" in v else None
                old = os.environ.get(ENV_THRESHOLD)
                if route:
                    os.environ[ENV_THRESHOLD] = "0" if route == "deq" else str(1 << 62)
                try:
                    fn = run_awq if v.split(":")[0] == "awq_gemm" else run
                    return timeit(fn, weights[v][0], args.repeats)
                finally:
                    if route:
                        os.environ.pop(ENV_THRESHOLD, None)
                        if old is not None:
                            os.environ[ENV_THRESHOLD] = old

            def measure():
                t = {v: timed(v) for v in variants}
                t["lin16"] = timeit(lambda w: F.linear(a, w), [(w,) for w in w16], args.repeats)
                t["lin32"] = (timeit(lambda w: F.linear(a32, w), [(w,) for w in w32],
                                     args.repeats) if w32 else float("nan"))
                return t

            t = measure()
            ref = t[variants[0]]
            gbs = size_k * size_n / 2 / ref / 1e9
            gflops = 2 * m * size_n * size_k / ref / 1e9
            line = (f"{size_n:>6} {size_k:>6} {m:>4} | " +
                    " ".join(f"{t[v] * 1e3:7.3f}" for v in variants) +
                    f" | {t['lin16'] * 1e3:7.3f} {t['lin32'] * 1e3:7.3f} | {gbs:6.1f} "
                    f"{100 * gbs / probe:4.0f} {gflops:7.1f} "
                    f"{100 * gflops / (1e3 * args.peak_tflops):4.0f} {t['lin16'] / ref:7.2f}")
            if args.background_load:
                with BackgroundLoad(args.background_load):
                    tl = measure()
                line += (f" | {tl[variants[0]] * 1e3:9.3f} {tl[variants[0]] / ref:5.1f} "
                         f"{tl['lin16'] * 1e3:10.3f} {tl['lin16'] / t['lin16']:5.1f}")
            print(line, flush=True)
            for v in variants:
                if v.endswith(":kern"):
                    rule.setdefault((size_n, size_k, v[:-5]), []).append(
                        (m, t[v[:-5] + ":deq"] / t[v]))
    if rule:
        print_rule(rule)


if __name__ == "__main__":
    main()
