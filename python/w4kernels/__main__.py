"""``python -m w4kernels demo`` / ``layout``: the command line.

``demo``: quantize one LLM-sized Linear layer and run every operator.

The layer (default 4096 -> 11008, an MLP up-projection of a 7B model) is quantized to GPTQ
(act-order, group 128) and AWQ (group 128), both are converted to Marlin, and every operator
runs on the best device available. For each, the table gives the error against the float64
reference of the same quantized weights (the kernel's own error), the error against the
unquantized float layer (what quantization costs), and the median time next to a dense
``torch.matmul`` on the same device.

``layout marlin|awq|kleidiai``: where element (k, n) of a K x N weight lands in that packed
format (word, nibble) and which lane of which mma fragment consumes it, from the reference's own
index functions (:mod:`w4kernels.layout`); ``--map`` prints the lane map of one tile window,
``--png`` draws it (matplotlib, optional).
"""

import argparse
import statistics
import sys
import time

import torch

import w4kernels
from w4kernels import ops, quant, reference


def _median_ms(fn, repeats):
    fn()  # warm-up (first-touch, thread pool)
    times = []
    for _ in range(repeats):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def _errors(out, ref):
    """(max abs error, max abs error / max |ref|) of out against a float64 reference."""
    err = (out.double().cpu() - ref.double().cpu()).abs().max().item()
    return err, err / max(ref.abs().max().item(), 1e-30)


class Table:
    def __init__(self, dense_ms):
        self.dense_ms = dense_ms
        print(f"{'operator':<34}{'kernel err (abs / rel)':>26}{'vs float layer (rel)':>22}"
              f"{'time ms':>10}{'vs dense':>10}")

    def row(self, name, out, ref, float_ref, ms):
        abs_err, rel_err = _errors(out, ref)
        q_rel = _errors(out, float_ref)[1] if float_ref is not None else float("nan")
        speed = self.dense_ms / ms
        print(f"{name:<34}{abs_err:>14.3g} / {rel_err:<9.2g}{q_rel:>22.2g}{ms:>10.2f}"
              f"{speed:>9.2f}x")


def demo(args):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = DTYPES[args.dtype]
    size_k, size_n, size_m = args.k, args.n, args.m
    print(f"w4kernels demo: Linear({size_k} -> {size_n}), M = {size_m} tokens, {dtype}, "
          f"device = {device}")
    print(f"build: {w4kernels.build_info()}; threads: {torch.get_num_threads()}")

    torch.manual_seed(0)
    linear = torch.nn.Linear(size_k, size_n, bias=False)
    w = linear.weight.detach().t().contiguous()  # [K, N], the orientation the kernels read
    x = torch.randn(size_m, size_k).to(dtype)
    float_ref = x.double() @ w.double()  # the unquantized layer

    t0 = time.perf_counter()
    gptq = quant.quantize_gptq(w, 128, act_order=True, dtype=dtype)
    awq = quant.quantize_awq(w, 128, dtype=dtype)
    print(f"quantized to GPTQ (act-order, g128) and AWQ (g128) in "
          f"{time.perf_counter() - t0:.1f} s\n")

    to = lambda t: None if t is None else t.to(device)  # noqa: E731
    xd, wd = x.to(device), w.to(dtype).to(device)
    dense_ms = _median_ms(lambda: torch.matmul(xd, wd), args.repeats)
    dense32_ms = _median_ms(lambda: torch.matmul(xd.float(), wd.float()), args.repeats)
    print(f"dense torch.matmul [{size_m}x{size_k}] @ [{size_k}x{size_n}]: {dense_ms:.2f} ms in "
          f"{dtype}, {dense32_ms:.2f} ms in float32 ('vs dense' = dense {dtype} time / op time)\n")
    table = Table(dense_ms)

    # Repacks: byte-exact layout ops, so "error" is the count of differing words.
    perm = torch.argsort(gptq.g_idx, stable=True).to(torch.int32)
    gq, aq = to(gptq.qweight), to(awq.qweight)
    marlin_g = ops.marlin_repack(gq, to(perm), size_k, size_n)
    marlin_a = ops.awq_marlin_repack(aq, size_k, size_n)
    ms_g = _median_ms(lambda: ops.marlin_repack(gq, to(perm), size_k, size_n), args.repeats)
    ms_a = _median_ms(lambda: ops.awq_marlin_repack(aq, size_k, size_n), args.repeats)
    diff_g = (marlin_g.cpu() != reference.marlin_repack(gptq.qweight, perm, size_k, size_n)).sum()
    diff_a = (marlin_a.cpu() != reference.awq_marlin_repack(awq.qweight, size_k, size_n)).sum()
    print(f"{'marlin_repack (GPTQ, act-order)':<34}{int(diff_g):>14d} words differ"
          f"{'':>19}{ms_g:>10.2f}")
    print(f"{'awq_marlin_repack':<34}{int(diff_a):>14d} words differ{'':>19}{ms_a:>10.2f}")

    a_s, a_z = to(awq.scales), to(awq.qzeros)
    w_awq = awq.dequantize()
    out = ops.awq_dequantize(aq, a_s, a_z)
    ms = _median_ms(lambda: ops.awq_dequantize(aq, a_s, a_z), args.repeats)
    table.row("awq_dequantize", out, w_awq, w, ms)

    out = ops.awq_gemm(xd, aq, a_s, a_z, 8)
    ms = _median_ms(lambda: ops.awq_gemm(xd, aq, a_s, a_z, 8), args.repeats)
    table.row("awq_gemm", out, x.double() @ w_awq.double(), float_ref, ms)

    for name, src, mw in (("w4a16_gemm (GPTQ act-order)", gptq, quant.gptq_to_marlin(gptq)),
                          ("w4a16_gemm (AWQ zero points)", awq, quant.awq_to_marlin(awq))):
        args_ = (to(mw.b_q_weight), to(mw.b_scales), to(mw.b_zeros), to(mw.g_idx), to(mw.perm),
                 to(mw.workspace), 4, size_m, size_n, size_k)
        run = lambda: ops.w4a16_gemm(xd, *args_)  # noqa: E731
        out = run()
        table.row(name, out, x.double() @ src.dequantize().double(), float_ref,
                  _median_ms(run, args.repeats))

    _kleidiai_rows(table, x, w, float_ref, args.repeats)
    return 0


def _kleidiai_rows(table, x, w, float_ref, repeats):
    """KleidiAI formats (CPU kernels): dynamic int8 activations x int4 weights, through the
    drop-in for torch.ops.aten._dyn_quant_pack_4bit_weight / _dyn_quant_matmul_4bit. The kernel
    error includes the int8 quantization of the activations (the reference uses float x)."""
    size_k, size_n = w.shape
    xf = x.float()
    for label, group_size, scale_dtype in (("per-block bl=32", 32, torch.bfloat16),
                                           ("per-channel", -1, torch.float32)):
        g = quant.quantize_gptq(w, group_size, dtype=scale_dtype)
        codes = reference.unpack_rows(g.qweight, size_k).t().to(torch.uint8)  # [N, K], zero 8
        weights = (codes[:, 0::2] | (codes[:, 1::2] << 4)).contiguous()  # low nibble = even k
        block = size_k if group_size == -1 else group_size
        scales = g.scales.t().contiguous().reshape(size_n, -1)
        if group_size == -1:
            scales = scales.reshape(size_n)
        packed = ops.dyn_quant_pack_4bit_weight(weights, scales, None, block, size_k, size_n)
        run = lambda: ops.dyn_quant_matmul_4bit(xf, packed, block, size_k, size_n)  # noqa: E731
        out = run()
        table.row(f"kleidiai int8 x int4 ({label})", out, x.double() @ g.dequantize(exact=True),
                  float_ref, _median_ms(run, repeats))


# Activation dtypes, as every command line of this project spells them (the demo, benchmarks/);
# torch's names are accepted too.
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}
DTYPE_ALIASES = {"float16": "fp16", "bfloat16": "bf16"}


class _Parser(argparse.ArgumentParser):
    """Argument errors as one line (no usage block): they are the whole message."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (--help lists the options)\n")


def _check_demo_args(parser, args):
    """Shapes the demo's formats can hold, checked before any work (not a traceback later)."""
    if args.m < 1:
        parser.error(f"--m {args.m}: the number of tokens must be at least 1")
    if args.k < 128 or args.k % 128:
        parser.error(f"--k {args.k}: in_features must be a positive multiple of 128 (the demo "
                     f"quantizes in groups of 128 along K)")
    if args.n < 64 or args.n % 64:
        parser.error(f"--n {args.n}: out_features must be a positive multiple of 64 (Marlin "
                     f"tiles N by 64)")
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: must be at least 1")


def _element(text):
    """``--at K,N`` -> (k, n)."""
    try:
        k, n = (int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected k,n (two integers, e.g. 17,130)")
    return k, n


def layout(args, parser):
    from w4kernels import layout as lay

    kw = {}
    if args.format == "kleidiai":
        kw = {"bl": args.bl, "nr": args.nr, "kr": args.kr, "sr": args.sr}
    elif args.bl or (args.nr, args.kr, args.sr) != (8, 16, 2):
        parser.error(f"--bl, --nr, --kr and --sr describe the KleidiAI packing; {args.format} "
                     f"has no such parameters")
    try:
        locations = [lay.locate(args.format, k, n, args.k, args.n, **kw) for k, n in args.at]
        window = None
        if args.map or args.png:
            window = lay.tile_map(args.format, args.k, args.n, *args.origin, **kw)
    except ValueError as e:
        parser.error(str(e))
    title = {"marlin": f"Marlin, K x N = {args.k} x {args.n}",
             "awq": f"AutoAWQ GEMM, K x N = {args.k} x {args.n}",
             "kleidiai": (f"KleidiAI {'qsi4c32p, bl = ' + str(args.bl) if args.bl else 'qsi4cxp'}"
                          f", N x K = {args.n} x {args.k}, nr = {args.nr}, kr = {args.kr}, "
                          f"sr = {args.sr}")}[args.format]
    print(f"layout: {title}")
    for loc in locations:
        print(lay.describe(loc))
    if window is not None and args.map:
        print(lay.format_map(args.format, window))
    if window is not None and args.png:
        try:
            lay.draw_map(args.format, window, args.png, title)
        except ImportError:
            print("python -m w4kernels layout: --png needs matplotlib, which is not installed "
                  "(pip install matplotlib); the text output (--at, --map) does not",
                  file=sys.stderr)
            return 1
        print(f"wrote {args.png}")
    return 0


def main(argv=None):
    parser = _Parser(prog="python -m w4kernels")
    sub = parser.add_subparsers(dest="command", required=True)
    lp = sub.add_parser("layout", help="where element (k, n) lands in a packed format, and the "
                                       "lane and mma fragment that consume it")
    lp.add_argument("format", choices=["marlin", "awq", "kleidiai"])
    lp.add_argument("--k", type=int, default=128, help="K, in_features (default 128)")
    lp.add_argument("--n", type=int, default=128, help="N, out_features (default 128)")
    lp.add_argument("--at", type=_element, action="append", default=[], metavar="K,N",
                    help="element to locate (repeatable)")
    lp.add_argument("--map", action="store_true",
                    help="print the lane map (KleidiAI: byte map) of one tile window")
    lp.add_argument("--origin", type=_element, default=(0, 0), metavar="K,N",
                    help="first element of the --map / --png window (default 0,0)")
    lp.add_argument("--png", metavar="PATH", help="draw the window's tile map (needs matplotlib)")
    lp.add_argument("--bl", type=int, default=0,
                    help="KleidiAI block length: 0 = per-channel qsi4cxp (default), else qsi4c32p")
    lp.add_argument("--nr", type=int, default=8, help="KleidiAI nr (default 8)")
    lp.add_argument("--kr", type=int, default=16, help="KleidiAI kr (default 16)")
    lp.add_argument("--sr", type=int, default=2, help="KleidiAI sr (default 2)")
    d = sub.add_parser("demo", help="quantize an LLM-sized Linear layer and run every operator")
    d.add_argument("--m", type=int, default=16, help="tokens (activation rows)")
    d.add_argument("--k", type=int, default=4096, help="in_features (a multiple of 128)")
    d.add_argument("--n", type=int, default=11008, help="out_features (a multiple of 64)")
    d.add_argument("--dtype", type=lambda s: DTYPE_ALIASES.get(s, s), choices=list(DTYPES),
                   default="bf16", help="activation dtype (float16 / bfloat16 accepted)")
    d.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    if args.command == "layout":
        if not (args.at or args.map or args.png):
            args.at = [(0, 0)]
        return layout(args, lp)
    _check_demo_args(d, args)
    return demo(args)


if __name__ == "__main__":
    sys.exit(main())
