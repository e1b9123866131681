#!/usr/bin/env python3
"""The README's static table of the w4a16_gemm kernels, from the objects scripts/sass_report.sh
compiled (build/sass/w4a16_gemm_tu_sm{80,90}.o and their ptxas logs).

Per (M tile, architecture, dtype): registers, spill bytes, dynamic shared memory, and the hot
loop's non-HMMA instructions per HMMA for each scale path (sass_stats.py's "hot" path, one
steady-state iteration of the main loop, here 4 pipeline stages), and whether the weight copies
carry an L2 cache policy (sass_stats.py's gld_desc_B > 0). A second table gives the same hot
loops as warp instructions per weight byte (one HMMA m16n8k16 of a 16-row tile consumes 16 x 8
weights, 64 bytes; a 16 k-row tile of kRows rows consumes 64 bytes per kRows / 16 HMMAs).

    bash scripts/sass_report.sh build/sass w4a16 && python3 scripts/sass_table.py build/sass
    python3 scripts/sass_table.py OUTDIR [TU]   # TU: the objects' stem (default w4a16_gemm_tu)
"""

import json
import os
import re
import subprocess
import sys

MODES = ["kChannel", "kGroup", "kGroupZp", "kRow"]  # ScaleMode enum order in w4a16_gemm.cuh
LABELS = {"kChannel": "per-channel", "kGroup": "g128", "kGroupZp": "g128 + zp",
          "kRow": "act-order, group order", "kRowRows": "act-order, row groups"}
COLUMNS = MODES + ["kRowRows"]
# w4a16_gemm_kernel<T, kMBlocks, kMode>.
KERNEL_RE = re.compile(r"w4a16_gemm_kernelI(6__half|13__nv_bfloat16)Li(\d)E"
                       r"LNS0_9ScaleModeE(\d)")
# Dynamic shared memory of StageLayout<kMBlocks> (4 stages; see w4a16_gemm.cuh).
SMEM = {mb: 4 * (16 * mb * 256 + 8 * 1024 + 4 * 128 * 2 + 4 * 16 * 4 + 128 * 4) for mb in range(1, 5)}


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "build/sass"
    tu = sys.argv[2] if len(sys.argv) > 2 else "w4a16_gemm_tu"
    tools = os.environ.get("W4K_SASS_TOOLS", "../shared/tools")
    cuobjdump = subprocess.run(["bash", f"{tools}/get-cuobjdump.sh"], capture_output=True,
                               text=True).stdout.strip().splitlines()[-1]
    sys.path.insert(0, tools)
    import sass_stats  # noqa: E402  (the same hot-path analysis, loop by loop)
    row_loops = {}
    for arch in (80, 90):
        obj = f"{out}/{tu}_sm{arch}.o"
        funcs = sass_stats.parse_sass(sass_stats.run([cuobjdump, "-sass", obj]))
        work_re = re.compile(sass_stats.WORK_DEFAULT)
        for (_, name), insns in funcs.items():
            if not KERNEL_RE.search(name):
                continue
            loops = sass_stats.loops_of(insns, work_re)
            # Innermost loops only: a back edge around several main loops (ptxas lays some
            # builds out so, e.g. -DW4K_L2_CACHE_HINTS=1) is not a main loop itself.
            loops = [lp for lp in loops
                     if not any(o is not lp and o["work"] and lp["head"] <= o["head"]
                                and o["tail"] <= lp["tail"] for o in loops)]
            most = max((lp["work"] for lp in loops), default=0)
            ratios = []
            for lp in loops:
                if lp["work"] != most or most == 0:
                    continue
                hp = [insns[k] for k in sass_stats.hot_path(insns, lp, work_re)]
                work = sum(1 for i in hp if not i.never and work_re.match(i.base))
                total = sum(1 for i in hp if not i.never)
                reloads = any(i.base == "LDG" for i in hp if not i.never)
                ratios.append(((total - work) / work, total / work, reloads))
            row_loops[(f"sm_{arch}", name)] = ratios
    rows = {}
    for arch in (80, 90):
        obj = f"{out}/{tu}_sm{arch}.o"
        js = subprocess.run([sys.executable, f"{tools}/sass_stats.py", obj, "--ptxas-log",
                             f"{out}/{tu}_sm{arch}.log", "--cuobjdump", cuobjdump,
                             "--format", "json", "--kernel", KERNEL_RE.pattern],
                            capture_output=True, text=True, check=True).stdout
        for k in json.loads(js):
            m = KERNEL_RE.search(k["kernel"])
            dtype = "fp16" if m.group(1) == "6__half" else "bf16"
            mb, mode = int(m.group(2)), MODES[int(m.group(3))]
            hot, work = k["hot"]["total"], k["hot_work"]
            entry = dict(ratio=(hot - work) / work, ipb=hot / (work * 64 / mb), regs=k["regs"],
                         spill=k["ptxas"]["spill_st_B"] + k["ptxas"]["spill_ld_B"],
                         hint=k["hot_bytes"].get("gld_desc_B", 0) > 0)
            key = (mb, arch, dtype)
            rows.setdefault(key, {})[mode] = entry
            if mode == "kRow":
                # The kRow kernel holds three main loops: the group path (symmetric and with zero
                # points) it takes when act-order rows are in group order, and the row-group path
                # (the one that reloads scales from global memory). Report the symmetric group
                # loop (the smaller of the two without reloads) and the row-group loop.
                loops = row_loops[(f"sm_{arch}", k["kernel"])]
                group = min((r for r in loops if not r[2]), key=lambda r: r[0])
                rows_ = max((r for r in loops if r[2]), key=lambda r: r[0])
                entry["ratio"], entry["ipb"] = group[0], group[1] / (64 / mb)
                rows[key]["kRowRows"] = dict(entry, ratio=rows_[0], ipb=rows_[1] / (64 / mb))
    print("| M tile | arch | dtype | regs | spills (B) | dyn. smem | "
          + " | ".join(f"non-HMMA/HMMA {LABELS[m]}" for m in COLUMNS) + " | L2 hint on weights |")
    print("|---|---|---|---|---|---|" + "---|" * len(COLUMNS) + "---|")
    def cell(modes, m, key, fmt):
        return format(modes[m][key], fmt) if m in modes else "-"

    for (mb, arch, dtype), modes in sorted(rows.items()):
        regs = "/".join(str(modes[m]["regs"]) for m in MODES if m in modes)
        spills = max(modes[m]["spill"] for m in MODES if m in modes)
        hint = "yes" if all(modes[m]["hint"] for m in MODES if m in modes) else "no"
        print(f"| {16 * mb} rows | sm_{arch} | {dtype} | {regs} | {spills} | "
              f"{SMEM[mb] // 1024} KiB | "
              + " | ".join(cell(modes, m, "ratio", ".2f") for m in COLUMNS) + f" | {hint} |")
    print()
    print("| M tile | arch | dtype | "
          + " | ".join(f"instr. per weight byte {LABELS[m]}" for m in COLUMNS) + " |")
    print("|---|---|---|" + "---|" * len(COLUMNS))
    for (mb, arch, dtype), modes in sorted(rows.items()):
        print(f"| {16 * mb} rows | sm_{arch} | {dtype} | "
              + " | ".join(cell(modes, m, "ipb", ".3f") for m in COLUMNS) + " |")


if __name__ == "__main__":
    main()
