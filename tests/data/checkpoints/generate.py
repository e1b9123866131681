"""Regenerate the checkpoint fixtures in this directory with the real upstream tools.

Produced by (2026-11-24, CPU only, the system torch 2.14.1, transformers 5.23.0, safetensors
0.8.0):
  * autoawq 0.2.9      (``awq.modules.linear.gemm.WQLinear_GEMM.from_linear``, the GEMM version;
                        scales and zero points from ``AwqQuantizer.pseudo_quantize_tensor``;
                        dequantized by ``awq.utils.packing_utils.dequantize_gemm``)
  * auto-gptq 0.7.1    (``auto_gptq.quantization.GPTQ.fasterquant``, the GPTQ solver, on random
                        calibration activations; packed by ``qlinear_cuda.QuantLinear.pack``;
                        dequantized by that module's own CPU ``forward`` on an identity input;
                        config from ``BaseQuantizeConfig.to_dict``)
  * gptqmodel 7.7.0    (``GPTQ.quantize`` solver, ``TorchLinear.pack_block`` packing,
                        ``dequantize_weight``; config from ``QuantizeConfig.to_dict``, format
                        ``gptq_v2``), imported with logbar 0.4.15, threadpoolctl 3.8.0 and
                        device-smi 0.5.7 (its pure-Python imports); accelerate 1.15.0 and
                        psutil 7.2.2 are imported by AutoAWQ's and GPTQModel's utilities.

None of them is a test dependency and none is installed into the system Python (each pins a
torch of its own): they are downloaded as archives, unpacked under a scratch folder and imported
from there. Stubbed, because they are compiled or GPU-only: the tools' CUDA extension modules
(``autogptq_cuda_64`` / ``_256``, ``awq_ext``, ...: the import fails and the tools fall back to
their torch paths), the ``torch.cuda.synchronize()`` auto-gptq's solver times itself with (a
no-op during that call), and the ``pcre`` binding GPTQModel formats its logs with (Python's
``re`` stands in). The packages' ``__init__`` modules are skipped (they import model zoos and
calibration-data loaders): only the modules named above are imported, from the unpacked
sources; two classes whose modules cannot be imported that way (AutoAWQ's ``AwqQuantizer``,
auto-gptq's ``BaseQuantizeConfig``) have the methods used here run from their source text.

To rerun (about 30 s on 2 cores), from the repository root:

    mkdir -p /tmp/w4k-tools && cd /tmp/w4k-tools && pip download --no-deps -d dl \\
        autoawq==0.2.9 auto-gptq==0.7.1 gptqmodel==7.7.0 logbar==0.4.15 \\
        threadpoolctl==3.8.0 device-smi==0.5.7 accelerate==1.15.0 psutil==7.2.2 && cd -
    python tests/data/checkpoints/generate.py --downloads /tmp/w4k-tools/dl

The script unpacks the archives next to ``--downloads`` (``<downloads>/../src``), rewrites every
fixture directory and ``index.json``, and prints each file's size. The output is deterministic
(fixed seeds, single-threaded CPU), so rerunning with the same versions gives the same bytes.

Layout of one fixture directory (README.md in this folder says what each name means):
    config.json                {"quantization_config": <the tool's dict>}, as in a HF checkpoint
    model.safetensors          the checkpoint tensors under the tool's names:
                               <prefix>.qweight / .qzeros / .scales / .g_idx (GPTQ) / .bias
    reference.safetensors      "weight": the float weight given to the tool, float16 [N, K]
                               (nn.Linear orientation); "dequantized_weight": the tool's own
                               dequantization of what it packed, float16 [N, K]; "bias" when
                               the layer has one (float16 [N], the same as the checkpoint's)
"""

import argparse
import ast
import glob
import json
import os
import sys
import tarfile
import textwrap
import types
import zipfile

import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
PREFIX = "model.layers.0.mlp.down_proj"

TOOLS = {"autoawq": "0.2.9", "auto-gptq": "0.7.1", "gptqmodel": "7.7.0"}

# name, tool, in_features (K), out_features (N), group_size, sym, desc_act, bias, seed.
# "gptq_*" come from AutoGPTQ (checkpoint format v1: qzeros stores zero - 1), "gptqmodel_*"
# from GPTQModel (format gptq_v2: qzeros stores the zero point itself), "awq_*" from AutoAWQ.
# The last one has K = 320, not a multiple of its group size 128 (3 groups, the last one half
# full): the row-parallel shard shape of a 2560-wide layer (Phi-2's hidden size) at TP = 8.
FIXTURES = [
    ("awq_gemm_g64", "autoawq", 256, 128, 64, False, False, True, 1),
    ("gptq_sym_g64", "auto-gptq", 256, 64, 64, True, False, False, 2),
    ("gptq_sym_desc_act_g64", "auto-gptq", 256, 128, 64, True, True, True, 3),
    ("gptq_asym_g64", "auto-gptq", 256, 64, 64, False, False, False, 4),
    ("gptq_asym_desc_act_g64", "auto-gptq", 256, 128, 64, False, True, False, 5),
    ("gptqmodel_v2_asym_g64", "gptqmodel", 256, 64, 64, False, False, True, 6),
    ("gptqmodel_v2_asym_desc_act_g64", "gptqmodel", 256, 128, 64, False, True, False, 7),
    ("gptq_sym_desc_act_g128_k320", "auto-gptq", 320, 64, 128, True, True, False, 8),
]


# ---- unpacking and importing the tools ------------------------------------------------------

def unpack(downloads):
    src = os.path.join(os.path.dirname(os.path.abspath(downloads)), "src")
    os.makedirs(src, exist_ok=True)
    for path in sorted(glob.glob(os.path.join(downloads, "*"))):
        base = os.path.basename(path)
        dest = os.path.join(src, base.split("-")[0].lower().replace("_", "-"))
        if os.path.isdir(dest):
            continue
        if base.endswith(".whl"):
            with zipfile.ZipFile(path) as z:
                z.extractall(dest)
        elif base.endswith(".tar.gz"):
            with tarfile.open(path) as t:
                t.extractall(dest, filter="data")
        else:
            continue
    return src


def _source_root(src, dist, package):
    """The folder holding ``package`` inside the unpacked ``dist`` (sdists nest one level)."""
    hits = glob.glob(os.path.join(src, dist, package)) + \
        glob.glob(os.path.join(src, dist, "*", package))
    if not hits:
        sys.exit(f"generate.py: {package} not found under {os.path.join(src, dist)}; did "
                 f"pip download put {dist} into --downloads?")
    return os.path.dirname(hits[0])


def _namespace(name, path):
    """Register package ``name`` without running its ``__init__`` (see the module docstring)."""
    m = types.ModuleType(name)
    m.__path__ = [path]
    sys.modules[name] = m
    return m


def import_tools(src):
    for dist, package in (("accelerate", "accelerate"), ("psutil", "psutil"), ("logbar", "logbar"),
                          ("threadpoolctl", "threadpoolctl.py"), ("device-smi", "device_smi")):
        sys.path.insert(0, _source_root(src, dist, package))
    # Compiled modules stood in for (module docstring).
    for ext in ("autogptq_cuda_64", "autogptq_cuda_256", "autogptq_marlin_cuda",
                "exllama_kernels", "exllamav2_kernels", "awq_ext"):
        sys.modules[ext] = None  # "import ext" raises ImportError: the tools' CPU fallbacks
    import re
    sys.modules.setdefault("pcre", re)

    awq_root = _source_root(src, "autoawq", "awq")
    sys.path.insert(0, awq_root)
    for name in ("awq", "awq.modules", "awq.modules.linear", "awq.utils", "awq.quantize"):
        _namespace(name, os.path.join(awq_root, *name.split(".")))
    gptq_root = _source_root(src, "auto-gptq", "auto_gptq")
    sys.path.insert(0, gptq_root)
    for name in ("auto_gptq", "auto_gptq.nn_modules", "auto_gptq.nn_modules.qlinear",
                 "auto_gptq.modeling"):
        _namespace(name, os.path.join(gptq_root, *name.split(".")))
    gm_root = _source_root(src, "gptqmodel", "gptqmodel")
    sys.path.insert(0, gm_root)
    gm = _namespace("gptqmodel", os.path.join(gm_root, "gptqmodel"))
    gm.DEBUG_ON = False  # set by gptqmodel/__init__.py from the environment
    _namespace("gptqmodel.models", os.path.join(gm_root, "gptqmodel", "models"))


def _method_source(path, class_name, method):
    """Source of ``class_name.method`` in ``path``, dedented (to run a method of a class whose
    module cannot be imported without the tool's model zoo)."""
    tree = ast.parse(open(path).read())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == method:
                    return textwrap.dedent(ast.get_source_segment(open(path).read(), item))
    raise LookupError(f"{class_name}.{method} not in {path}")


# ---- the three tools ------------------------------------------------------------------------

def calibration(size_k, seed):
    """Calibration activations [512, K]: channels of very different magnitude, so act-order
    (which quantizes the channels of largest Hessian diagonal first) reorders them."""
    g = torch.Generator().manual_seed(1000 + seed)
    channel_scale = torch.exp(torch.randn(size_k, generator=g))
    return torch.randn(512, size_k, generator=g) * channel_scale


def float_linear(size_k, size_n, bias, seed):
    g = torch.Generator().manual_seed(seed)
    linear = nn.Linear(size_k, size_n, bias=bias)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(size_n, size_k, generator=g) * 0.05)
        if bias:
            linear.bias.copy_(torch.randn(size_n, generator=g) * 0.1)
    return linear.half()  # the tools work on float16 models


def run_autoawq(linear, group_size):
    from awq.modules.linear.gemm import WQLinear_GEMM
    from awq.utils.packing_utils import dequantize_gemm

    # AwqQuantizer._apply_quant: pseudo-quantize the weight in place, then WQLinear_GEMM.
    # from_linear with the transposed scales and zeros. AwqQuantizer itself imports the
    # calibration-data loader, so its method is run from source on a namespace holding the
    # attributes it reads.
    path = sys.modules["awq.modules.linear.gemm"].__file__.replace(
        os.path.join("modules", "linear", "gemm.py"), os.path.join("quantize", "quantizer.py"))
    scope = {"torch": torch}
    exec(_method_source(path, "AwqQuantizer", "pseudo_quantize_tensor"), scope)
    quantizer = types.SimpleNamespace(w_bit=4, group_size=group_size, zero_point=True)
    w, scales, zeros = scope["pseudo_quantize_tensor"](quantizer, linear.weight.data)
    linear.weight.data = w
    q = WQLinear_GEMM.from_linear(linear, 4, group_size, False, scales.t().contiguous(),
                                  zeros.t().contiguous())
    tensors = {"qweight": q.qweight, "qzeros": q.qzeros, "scales": q.scales}
    if q.bias is not None:
        tensors["bias"] = q.bias
    dequantized = dequantize_gemm(q.qweight, q.qzeros, q.scales, 4, group_size)  # [K, N]

    config_path = path.replace(os.path.join("quantize", "quantizer.py"),
                               os.path.join("models", "_config.py"))
    scope = {}
    exec(compile(open(config_path).read(), config_path, "exec"), scope)
    cfg = scope["AwqConfig"](zero_point=True, q_group_size=group_size, w_bit=4, version="GEMM")
    return tensors, dequantized.t(), cfg.to_transformers_dict()


def run_autogptq(linear, x, group_size, sym, desc_act):
    from auto_gptq.nn_modules.qlinear.qlinear_cuda import QuantLinear
    from auto_gptq.quantization import GPTQ

    # BaseGPTQForCausalLM.quantize: configure the quantizer, one batch of activations through
    # add_batch (the forward hook), fasterquant with the config's damp / group / act-order.
    gptq = GPTQ(linear)
    gptq.quantizer.configure(4, perchannel=True, sym=sym, mse=False)
    gptq.add_batch(x.half(), None)
    synchronize, torch.cuda.synchronize = torch.cuda.synchronize, lambda *a, **k: None
    try:  # fasterquant times itself with torch.cuda.synchronize(): a no-op on this CPU run
        scale, zero, g_idx = gptq.fasterquant(percdamp=0.01, group_size=group_size,
                                              actorder=desc_act, static_groups=False)
    finally:
        torch.cuda.synchronize = synchronize
    # pack_model: qlinear_cuda is AutoGPTQ's choice for desc_act (and the g_idx-aware CPU
    # forward); every AutoGPTQ QuantLinear packs the same way.
    q = QuantLinear(4, group_size, linear.in_features, linear.out_features,
                    linear.bias is not None)
    q.pack(linear.cpu(), scale.cpu(), zero.cpu(), g_idx.cpu())
    tensors = {"qweight": q.qweight, "qzeros": q.qzeros, "scales": q.scales, "g_idx": q.g_idx}
    if q.bias is not None:
        tensors["bias"] = q.bias
    bias, q.bias = q.bias, None
    dequantized = q(torch.eye(linear.in_features, dtype=torch.float16))  # [K, N]: x @ W
    q.bias = bias

    base = os.path.join(os.path.dirname(sys.modules["auto_gptq.quantization"].__file__),
                        os.pardir, "modeling", "_base.py")
    config = _autogptq_config(os.path.normpath(base), group_size, sym, desc_act)
    return tensors, dequantized.t(), config


def _autogptq_config(path, group_size, sym, desc_act):
    """BaseQuantizeConfig(...).to_dict(), the class taken from auto_gptq/modeling/_base.py (the
    module imports the whole model zoo; the dataclass needs only transformers' hub mixin)."""
    tree = ast.parse(open(path).read())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef)
               and n.name == "BaseQuantizeConfig")
    scope = {}
    exec("import json, os, copy, logging\nfrom dataclasses import dataclass, field, fields\n"
         "from os.path import isdir, join\nfrom typing import Dict, List, Optional, Union\n"
         "from transformers.utils.hub import PushToHubMixin\nlogger = logging.getLogger()\n",
         scope)
    exec(ast.get_source_segment(open(path).read(), cls) + "\n", scope)
    # decorators are part of the class node's source only from its first line; re-apply
    cfg_cls = scope["BaseQuantizeConfig"]
    if not hasattr(cfg_cls, "__dataclass_fields__"):
        cfg_cls = scope["dataclass"](cfg_cls)
    return cfg_cls(bits=4, group_size=group_size, desc_act=desc_act, sym=sym).to_dict()


def run_gptqmodel(linear, x, group_size, sym, desc_act):
    from gptqmodel.nn_modules.qlinear.torch import TorchLinear
    from gptqmodel.quantization.config import FORMAT, QuantizeConfig
    from gptqmodel.quantization.gptq import GPTQ

    # offload_to_disk=False: nothing is offloaded here, and its default puts a random temporary
    # folder name into the saved config.
    qcfg = QuantizeConfig(bits=4, group_size=group_size, desc_act=desc_act, sym=sym,
                          format=FORMAT.GPTQ_V2, offload_to_disk=False)
    # GPTQProcessor.preprocess: the task's fallback settings and a per-channel quantizer.
    gptq = GPTQ(linear, qcfg)
    gptq.fallback = qcfg.fallback
    gptq.expected_nsamples = None
    gptq.quantizer.configure(perchannel=True)
    gptq.add_batch(x.half(), None)
    q_weight, scale, zero, g_idx = gptq.quantize()[:4]
    linear.weight.data = q_weight  # as its quantization loop does before packing
    q = TorchLinear(bits=4, group_size=group_size, sym=sym, desc_act=desc_act,
                         in_features=linear.in_features, out_features=linear.out_features,
                         bias=linear.bias is not None, format=FORMAT.GPTQ_V2)
    # pack_module: pack_block on CPU. GPTQModel packs the zero points as they are (its internal
    # format v2) and converts to v1 only when saving format "gptq"; format "gptq_v2" is saved
    # as packed.
    q.pack_block(linear.cpu(), scale.cpu(), zero.cpu(), g_idx.cpu())
    q.post_init()
    tensors = {"qweight": q.qweight, "qzeros": q.qzeros, "scales": q.scales, "g_idx": q.g_idx}
    if q.bias is not None:
        tensors["bias"] = q.bias
    dequantized = q.dequantize_weight()  # [K, N]
    return tensors, dequantized.t(), _gptqmodel_saved_config(qcfg)


def _gptqmodel_saved_config(qcfg):
    """The quantization_config ModelWriter.save_quantized writes: the meta fields it sets
    (models/writer.py, the same calls in the same order), then QuantizeConfig.to_dict()."""
    from gptqmodel.quantization import config as c

    qcfg.meta_set_versionable(key=c.META_FIELD_QUANTIZER,
                              value=[f"{c.META_QUANTIZER_GPTQMODEL}:{TOOLS['gptqmodel']}"])
    qcfg.meta_set(key=c.META_FIELD_URI, value=c.META_VALUE_URI)
    qcfg.meta_set(key=c.META_FIELD_DAMP_PERCENT, value=qcfg.damp_percent)
    qcfg.meta_set(key=c.META_FIELD_DAMP_AUTO_INCREMENT, value=qcfg.damp_auto_increment)
    qcfg.meta_set(key=c.META_FIELD_STATIC_GROUPS, value=qcfg.static_groups)
    qcfg.meta_set(key=c.META_FIELD_TRUE_SEQUENTIAL, value=qcfg.true_sequential)
    qcfg.meta_set(key=c.META_FIELD_MSE, value=qcfg.mse)
    qcfg.meta_set(key=c.META_FIELD_GPTAQ_ENABLED, value=None)
    qcfg.meta_set(key=c.META_FIELD_FOEM_ENABLED, value=None)
    qcfg.meta_set(key=c.META_FIELD_ACT_GROUP_AWARE, value=qcfg.act_group_aware)
    return qcfg.to_dict()


# ---- writing --------------------------------------------------------------------------------

def write_fixture(name, tool, size_k, size_n, group_size, sym, desc_act, bias, seed):
    from safetensors.torch import save_file

    torch.manual_seed(seed)
    linear = float_linear(size_k, size_n, bias, seed)
    weight = linear.weight.detach().clone()
    x = calibration(size_k, seed)
    if tool == "autoawq":
        tensors, dequantized, config = run_autoawq(linear, group_size)
    elif tool == "auto-gptq":
        tensors, dequantized, config = run_autogptq(linear, x, group_size, sym, desc_act)
    else:
        tensors, dequantized, config = run_gptqmodel(linear, x, group_size, sym, desc_act)

    out = os.path.join(HERE, name)
    os.makedirs(out, exist_ok=True)
    save_file({f"{PREFIX}.{k}": v.detach().contiguous() for k, v in tensors.items()},
              os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
    ref = {"weight": weight, "dequantized_weight": dequantized.detach().to(torch.float16)}
    if bias:
        ref["bias"] = tensors["bias"].detach()
    save_file({k: v.contiguous() for k, v in ref.items()},
              os.path.join(out, "reference.safetensors"))
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump({"quantization_config": config}, f, indent=2, sort_keys=True, default=str)
        f.write("\n")
    return {"name": name, "tool": tool, "tool_version": TOOLS[tool], "prefix": PREFIX,
            "in_features": size_k, "out_features": size_n, "group_size": group_size,
            "sym": sym, "desc_act": desc_act, "bias": bias,
            "qzeros_convention": ("zero" if tool != "auto-gptq" else "zero - 1")}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--downloads", required=True,
                        help="folder holding the pip-downloaded archives (module docstring)")
    args = parser.parse_args()
    torch.set_num_threads(1)  # deterministic reductions in the GPTQ solvers
    import_tools(unpack(args.downloads))
    index = [write_fixture(*f) for f in FIXTURES]
    with open(os.path.join(HERE, "index.json"), "w") as f:
        json.dump(index, f, indent=2)
        f.write("\n")
    total = 0
    for path in sorted(glob.glob(os.path.join(HERE, "*", "*"))):
        total += os.path.getsize(path)
        print(f"{os.path.getsize(path):>8}  {os.path.relpath(path, HERE)}")
    print(f"{total:>8}  total")


if __name__ == "__main__":
    main()
