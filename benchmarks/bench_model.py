"""Whole-model decode speed: a Llama built from transformers.LlamaConfig (random weights, no
download) in dense fp32, dense bf16 and with every decoder Linear on each w4kernels format,
timed in the same run on the best device (CUDA if present, else the CPU).

For each variant it prints the median over ``--repeats`` of a greedy ``generate`` of
``--new`` tokens after a ``--prompt``-token prompt (batch ``--batch``), as tokens/s (new
tokens / wall time, prefill included), and the ratio against dense bf16 and dense fp32 of the
same run. The default model (hidden 2048, 4 layers, MLP 5632: 180 M decoder weights, 90 MB at
4 bits, 360 MB in bf16) streams well past the 32 MiB L3 on every step, so decode is weight
bandwidth bound as in a real model. ``lm_head``, embeddings, norms and attention stay in the
model's dtype in every variant.

Requires transformers (requirements.txt). The machine this project runs on is shared: read
the spread column (max/min of the repeats) as the noise level.

    PYTHONPATH=$PWD/python python benchmarks/bench_model.py [--layers 4] [--hidden 2048]
        [--intermediate 5632] [--new 32] [--prompt 16] [--batch 1] [--repeats 3]
        [--threads N] [--only dense-bf16,gptq-marlin] [--per-layer]

``--per-layer`` also times each Linear of the first decoder layer alone at M = 1 (its weight
stays in the cache: the per-call cost without the weight stream) and prints, per variant, the
microseconds of each and their sum over the model's layers, next to the decode step's time.
"""

import argparse
import copy
import statistics
import sys
import time

import torch

import w4kernels


def build(args):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden,
                      intermediate_size=args.intermediate, num_hidden_layers=args.layers,
                      num_attention_heads=args.hidden // 128,
                      num_key_value_heads=max(1, args.hidden // 512),
                      max_position_embeddings=args.prompt + args.new + 8)
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


def variants(device):
    """name -> (model dtype, w4kernels config or None[, act_quant of the 4-bit modules])."""
    out = {
        "dense-fp32": (torch.float32, None),
        "dense-bf16": (torch.bfloat16, None),
        "gptq-marlin g128": (torch.bfloat16, w4kernels.GPTQMarlinConfig(group_size=128)),
        "gptq-marlin g128 act-order": (torch.bfloat16,
                                       w4kernels.GPTQMarlinConfig(group_size=128, act_order=True)),
        "awq-marlin g128": (torch.bfloat16, w4kernels.AWQMarlinConfig(group_size=128)),
        "awq (awq_gemm) g128": (torch.bfloat16, w4kernels.AWQConfig(group_size=128)),
    }
    if device == "cpu":  # the int8-activation mode (opt-in, CPU only) of the same layers
        out["gptq-marlin g128 int8-act"] = out["gptq-marlin g128"] + ("int8",)
        out["awq (awq_gemm) g128 int8-act"] = out["awq (awq_gemm) g128"] + ("int8",)
        out["kleidiai per-channel"] = (torch.bfloat16, w4kernels.KleidiAIConfig(group_size=-1))
        out["kleidiai bl32"] = (torch.bfloat16, w4kernels.KleidiAIConfig(group_size=32))
    if device == "cuda":  # fp16 is the GPU kernels' fastest path
        out["gptq-marlin g128 fp16"] = (torch.float16, w4kernels.GPTQMarlinConfig(group_size=128))
    return out


def time_generate(model, ids, new, repeats, device):
    def run():
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False)
        if device == "cuda":
            torch.cuda.synchronize()
        assert out.shape[1] == ids.shape[1] + new
        return time.perf_counter() - t0

    run()  # warm-up (allocations, kernel configuration caches)
    return [run() for _ in range(repeats)]


def time_layers(model, dtype, repeats):
    """{linear name: median microseconds of one forward at M = 1} for model.layers.0's Linears
    (or their quantized replacements); the same module called back to back, weight in cache."""
    out = {}
    layer = model.model.layers[0]
    device = next(model.parameters()).device
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for name, module in layer.named_modules():
        k = getattr(module, "in_features", None)
        if k is None or not name:
            continue
        x = torch.randn(1, 1, k, generator=torch.Generator().manual_seed(2)).to(device, dtype)
        calls = max(20, int(2e8 // (k * module.out_features)))
        with torch.no_grad():
            for _ in range(5):
                module(x)
            times = []
            for _ in range(repeats):
                sync()
                t0 = time.perf_counter()
                for _ in range(calls):
                    module(x)
                sync()
                times.append((time.perf_counter() - t0) / calls * 1e6)
        out[name] = statistics.median(times)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--intermediate", type=int, default=5632)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--prompt", type=int, default=16)
    p.add_argument("--new", type=int, default=32)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--only", default=None, help="comma-separated variant names")
    p.add_argument("--per-layer", action="store_true",
                   help="also time each Linear of layer 0 alone at M = 1 (weight in cache)")
    args = p.parse_args()
    try:
        import transformers
    except ImportError:
        sys.exit("bench_model.py needs transformers: pip install transformers (requirements.txt)")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    base = build(args)
    n_dec = sum(m.weight.numel() for n, m in base.named_modules()
                if isinstance(m, torch.nn.Linear) and n.startswith("model.layers."))
    print(f"torch {torch.__version__}  transformers {transformers.__version__}  device={device}  "
          f"threads={torch.get_num_threads()}  layers={args.layers} hidden={args.hidden} "
          f"mlp={args.intermediate} vocab={args.vocab}  decoder weights {n_dec / 1e6:.0f} M  "
          f"batch={args.batch} prompt={args.prompt} new={args.new} repeats={args.repeats}")
    ids = torch.randint(0, args.vocab, (args.batch, args.prompt),
                        generator=torch.Generator().manual_seed(1)).to(device)
    results, layer_us = {}, {}
    chosen = variants(device)
    if args.only:
        chosen = {k: v for k, v in chosen.items() if k in args.only.split(",")}
    for name, (dtype, config, *act_quant) in chosen.items():
        model = copy.deepcopy(base).to(dtype)
        t0 = time.perf_counter()
        if config is not None:
            w4kernels.quantize_(model, config, filter_fn=lambda m, n: n.startswith("model.layers."),
                                progress=False)
        for module in model.modules():
            if act_quant and hasattr(module, "act_quant"):
                module.act_quant = act_quant[0]
        prep = time.perf_counter() - t0
        model = model.to(device)
        times = time_generate(model, ids, args.new, args.repeats, device)
        med = statistics.median(times)
        results[name] = times
        if args.per_layer:
            layer_us[name] = time_layers(model, dtype, max(5, args.repeats))
        print(f"  measured {name:28s} {args.batch * args.new / med:8.2f} tok/s  "
              f"(quantize {prep:.1f} s)", flush=True)
        del model
    print()
    print(f"{'variant':30s} {'tok/s':>9s} {'ms/token':>9s} {'x bf16':>7s} {'x fp32':>7s} "
          f"{'spread':>7s}")
    medians = {name: statistics.median(t) for name, t in results.items()}
    for name, times in results.items():
        med = medians[name]
        tps = args.batch * args.new / med
        rb = medians.get("dense-bf16", float("nan")) / med
        rf = medians.get("dense-fp32", float("nan")) / med
        print(f"{name:30s} {tps:9.2f} {1000 * med / args.new:9.2f} {rb:7.2f} {rf:7.2f} "
              f"{max(times) / min(times):6.2f}x")
    if layer_us:
        print()
        print("per-call us of layer 0's Linears at M = 1, weight in cache (median); 'x layers': "
              "their sum times the layer count, in ms")
        names = list(next(iter(layer_us.values())))
        print(f"{'variant':30s} " + " ".join(f"{n.split('.')[-1]:>9s}" for n in names) +
              f" {'x layers':>9s}")
        for variant, us in layer_us.items():
            print(f"{variant:30s} " + " ".join(f"{us.get(n, float('nan')):9.1f}" for n in names) +
                  f" {sum(us.values()) * args.layers / 1000:9.2f}")


if __name__ == "__main__":
    main()
