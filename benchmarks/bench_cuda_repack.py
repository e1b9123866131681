"""GPU benchmark: our CUDA marlin_repack / awq_marlin_repack / awq_dequantize vs the plain-torch
reference (python/w4kernels/reference.py) run on the same GPU, same inputs, same run.

For every op and shape it first checks that both give the same bits, then times each with CUDA
events (``--warmup`` untimed calls, then ``--iters`` individually timed calls) and prints the
medians, the ratio reference/ours, and the effective bandwidth (bytes read + written / time)
of both.

    python benchmarks/bench_cuda_repack.py              # LLM-sized shapes
    python benchmarks/bench_cuda_repack.py --quick      # two small shapes
    python benchmarks/bench_cuda_repack.py --simt       # no GPU: exercise this script on CPU
                                                        # with the emulator (timings meaningless)

Without a GPU (and without ``--simt``) it prints why and exits with status 0.
"""

import argparse
import statistics
import sys
import time

import torch

import gpu_target

# (K, N) weight shapes: Llama-style projections (hidden 4096 / 8192, MLP 11008 / 14336 / 28672).
SHAPES = [(4096, 4096), (4096, 11008), (11008, 4096), (4096, 14336), (14336, 4096),
          (8192, 28672), (28672, 8192)]
QUICK_SHAPES = [(1024, 1024), (4096, 4096)]
SIMT_SHAPES = [(64, 128), (128, 192)]
GROUP_SIZE = 128


def _median_ms(fn, warmup, iters, device):
    """Median wall time of fn() in milliseconds (CUDA events on a GPU)."""
    for _ in range(warmup):
        fn()
    times = []
    if device == "cuda":
        torch.cuda.synchronize()
        for _ in range(iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    else:
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _same_bits(a, b):
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def _cases(shapes, device, ns, reference):
    """(name, shape label, ours(), ref(), bytes moved) for every op and shape."""
    gen = torch.Generator(device="cpu").manual_seed(0)

    def rand_words(*shape):
        return torch.randint(-2**31, 2**31, shape, dtype=torch.int64, generator=gen).to(
            torch.int32).to(device)

    for size_k, size_n in shapes:
        label = f"K={size_k} N={size_n}"
        marlin_bytes = 2 * size_k * size_n // 2  # 4-bit weight read once and written once

        gptq = rand_words(size_k // 8, size_n)
        yield ("marlin_repack", label,
               lambda w=gptq, k=size_k, n=size_n: ns.marlin_repack(w, None, k, n, 4),
               lambda w=gptq, k=size_k, n=size_n: reference.marlin_repack(w, None, k, n, 4),
               marlin_bytes)

        perm = torch.randperm(size_k, generator=gen).to(torch.int32).to(device)
        yield ("marlin_repack act-order", label,
               lambda w=gptq, p=perm, k=size_k, n=size_n: ns.marlin_repack(w, p, k, n, 4),
               lambda w=gptq, p=perm, k=size_k, n=size_n: reference.marlin_repack(w, p, k, n, 4),
               marlin_bytes + 4 * size_k)

        awq = rand_words(size_k, size_n // 8)
        yield ("awq_marlin_repack", label,
               lambda w=awq, k=size_k, n=size_n: ns.awq_marlin_repack(w, k, n, 4),
               lambda w=awq, k=size_k, n=size_n: reference.awq_marlin_repack(w, k, n, 4),
               marlin_bytes)

        groups = size_k // GROUP_SIZE if size_k % GROUP_SIZE == 0 else 1
        qzeros = rand_words(groups, size_n // 8)
        for dtype in (torch.float16, torch.bfloat16):
            scales = (torch.rand(groups, size_n, generator=gen) * 0.02 + 1e-3).to(dtype).to(device)
            deq_bytes = size_k * size_n // 2 + 2 * size_k * size_n + 2 * groups * size_n
            yield (f"awq_dequantize {str(dtype).split('.')[1]}", f"{label} G={groups}",
                   lambda q=awq, s=scales, z=qzeros: ns.awq_dequantize(q, s, z, 0, 0, 0),
                   lambda q=awq, s=scales, z=qzeros: reference.awq_dequantize(q, s, z, 0, 0, 0),
                   deq_bytes)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--quick", action="store_true", help="two small shapes only")
    parser.add_argument("--simt", action="store_true",
                        help="run on CPU under the SIMT emulator with tiny shapes (checks the "
                             "script itself; the timings mean nothing)")
    args = parser.parse_args()

    target = gpu_target.choose("bench_cuda_repack", args.simt)
    if not isinstance(target, gpu_target.Target):
        return target
    device, namespace, _ = target
    from w4kernels import reference
    if args.simt:
        shapes = SIMT_SHAPES
        args.warmup, args.iters = min(args.warmup, 1), min(args.iters, 3)
    else:
        shapes = QUICK_SHAPES if args.quick else SHAPES
    ns = getattr(torch.ops, namespace)

    where = torch.cuda.get_device_name() if device == "cuda" else "CPU (SIMT emulator)"
    print(f"device: {where}   torch {torch.__version__}   median of {args.iters} "
          f"(after {args.warmup} warm-up calls)")
    header = (f"{'op':<26} {'shape':<22} {'ours ms':>9} {'ref ms':>9} {'ref/ours':>9} "
              f"{'ours GB/s':>10} {'ref GB/s':>9}")
    print(header)
    print("-" * len(header))
    failures = 0
    for name, label, ours, ref, nbytes in _cases(shapes, device, ns, reference):
        try:
            expected = ref()
        except torch.cuda.OutOfMemoryError:
            print(f"{name:<26} {label:<22} skipped: the reference ran out of GPU memory")
            torch.cuda.empty_cache()
            continue
        if not _same_bits(ours(), expected):
            print(f"{name:<26} {label:<22} MISMATCH: ours differs from the reference")
            failures += 1
            continue
        del expected
        t_ours = _median_ms(ours, args.warmup, args.iters, device)
        t_ref = _median_ms(ref, args.warmup, args.iters, device)
        print(f"{name:<26} {label:<22} {t_ours:9.3f} {t_ref:9.3f} {t_ref / t_ours:8.1f}x "
              f"{nbytes / t_ours / 1e6:10.1f} {nbytes / t_ref / 1e6:9.1f}")
    if failures:
        print(f"{failures} case(s) did not match the reference")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
