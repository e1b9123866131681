"""Benchmark: what the packed-buffer value checks (issue 8, item 2) cost next to the ops.

Times, in one run, the KleidiAI matmul (ops.matmul_clamp_f32_qai8dxp_qsi4c*p, which includes
the checks) against the checks alone (check_lhs_packed_values + check_rhs_packed_values over every
nr-block, csrc/kleidiai_checks.h, through a tiny inline extension), and the LHS quantizer
(ops.lhs_quant_pack_qai8dxp_f32) against its finite-value scan (check_finite_rows). The checks
are timed reading from memory (buffers rotate through copies exceeding 4x the 32 MiB L3), an
upper bound: inside the op the RHS check reads each nr-block's metadata just before the kernel
reads the same block, and each quantizer task scans the rows it packs right after (the
"cached scan" column times the scan on data already in cache, single-threaded). Every time is
the median of --repeats runs. The machine may be shared: read the spread.

Usage: PYTHONPATH=python python benchmarks/bench_packed_checks.py [--repeats 9]
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see bench_kleidiai.py

import torch  # noqa: E402
from torch.utils import cpp_extension  # noqa: E402

from w4kernels import ops  # noqa: E402

L3_BYTES = 32 * 2 ** 20
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_SRC = r"""
#include <torch/extension.h>
#include "kleidiai_checks.h"

void rhs_checks(const at::Tensor& rhs, int64_t n, int64_t k, int64_t nr, int64_t bl) {
  const int64_t blocks = (n + nr - 1) / nr;
  w4k::check_rhs_packed_values("bench", "rhs_packed", rhs.data_ptr<uint8_t>(), n, k, nr, bl, 0,
                               blocks);
}
void lhs_checks(const at::Tensor& lhs, int64_t m, int64_t k, int64_t mr) {
  w4k::check_lhs_packed_values("bench", "lhs_packed", lhs.data_ptr<uint8_t>(), m, k, mr);
}
void finite_rows(const at::Tensor& x) { w4k::check_finite_rows("bench", "lhs", x); }
"""


def _median_time(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    mid = times[len(times) // 4: len(times) - len(times) // 4] or times
    return statistics.median(times), max(mid) / min(mid)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=9)
    args = p.parse_args()
    ext = cpp_extension.load_inline(
        "w4k_bench_checks", cpp_sources=_SRC, functions=["rhs_checks", "lhs_checks", "finite_rows"],
        extra_include_paths=[os.path.join(ROOT, "csrc")], extra_cflags=["-O3", "-std=c++20"],
        verbose=False)
    gen = torch.Generator().manual_seed(0)
    print(f"threads {torch.get_num_threads()}; times are medians of {args.repeats} repeats over "
          f"rotated copies; spread = max/min of the middle half")
    print(f"{'case':<34} {'op us':>10} {'checks us':>10} {'checks/op':>10} {'spread':>14}")
    for n, k in ((4096, 4096), (11008, 4096)):
        for bl in (0, 32):
            w = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=gen)
            if bl:
                s = (torch.rand(n, k // bl, generator=gen) + 0.5).bfloat16()
                rhs = ops.rhs_pack_nxk_qsi4c32p_qsu4c32s1s0(w, s, None, n, k, bl)
            else:
                rhs = ops.rhs_pack_nxk_qsi4cxp_qs4cxs1s0(w, torch.rand(n) + 0.5, None, n, k)
            copies = [rhs.clone() for _ in range(max(2, 4 * L3_BYTES // rhs.numel() + 1))]
            for m in (1, 16):
                lhs = ops.lhs_quant_pack_qai8dxp_f32(torch.randn(m, k, generator=gen))
                op = (ops.matmul_clamp_f32_qai8dxp_qsi4c32p if bl else
                      ops.matmul_clamp_f32_qai8dxp_qsi4cxp)
                extra = (bl,) if bl else ()

                def run_op():
                    for c in copies:
                        op(lhs, c, m, n, k, *extra)

                def run_checks():
                    for c in copies:
                        ext.lhs_checks(lhs, m, k, 1)
                        ext.rhs_checks(c, n, k, 8, bl)

                run_op()
                t_op, s_op = _median_time(run_op, args.repeats)
                t_ck, s_ck = _median_time(run_checks, args.repeats)
                per = 1e6 / len(copies)
                print(f"{f'matmul n={n} k={k} bl={bl} m={m}':<34} {t_op * per:>10.1f} "
                      f"{t_ck * per:>10.2f} {t_ck / t_op:>10.4f} {s_op:>6.2f}/{s_ck:<6.2f}")
    k = 4096
    for m in (1, 16, 256):
        xs = [torch.randn(m, k, generator=gen) for _ in range(max(2, 4 * L3_BYTES // (4 * m * k)))]

        def run_pack():
            for x in xs:
                ops.lhs_quant_pack_qai8dxp_f32(x)

        def run_scan():
            for x in xs:
                ext.finite_rows(x)

        def run_scan_hot():  # what the op pays: it scans the rows a task is about to pack
            for _ in xs:
                ext.finite_rows(xs[0])

        run_pack()
        t_op, s_op = _median_time(run_pack, args.repeats)
        t_ck, s_ck = _median_time(run_scan, args.repeats)
        t_hot, _ = _median_time(run_scan_hot, args.repeats)
        per = 1e6 / len(xs)
        print(f"{f'lhs_quant_pack m={m} k={k}':<34} {t_op * per:>10.1f} {t_ck * per:>10.2f} "
              f"{t_ck / t_op:>10.4f} {s_op:>6.2f}/{s_ck:<6.2f}  cached scan "
              f"{t_hot * per:.2f} us = {t_hot / t_op:.4f} of the op")


if __name__ == "__main__":
    main()
