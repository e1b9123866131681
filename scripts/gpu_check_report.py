"""Helpers of scripts/gpu_check.sh: read its logs, print one key figure per step, and write the
summary. Standard library only (runs before, and independently of, the w4kernels build).

    python scripts/gpu_check_report.py ptxas BUILD_LOG OUT_TXT   # per-kernel registers / spills
    python scripts/gpu_check_report.py junit JUNIT_XML           # "P passed, F failed, ..."
    python scripts/gpu_check_report.py sanitizer LOG             # "N errors" (ERROR SUMMARY,
                                                                 #   or racecheck's RACECHECK SUMMARY)
    python scripts/gpu_check_report.py ncu LOG                   # per profiled kernel: time,
                                                                 #   DRAM %, issue %, eligible warps
    python scripts/gpu_check_report.py stalls SOURCE_CSV         # opcodes with the most warp-stall
                                                                 #   samples (ncu source page)
    python scripts/gpu_check_report.py summary OUTDIR            # OUTDIR/summary.md

OUTDIR/steps.tsv (written by gpu_check.sh) holds one line per step:
``step <TAB> rc <TAB> seconds <TAB> key figure <TAB> log file``.
"""

import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

BENCH_LOGS = [("bench_gpu_gemm", "bench_gpu_gemm.log"),
              ("bench_gpu_gemm_graph", "bench_gpu_gemm_graph.log"),
              ("bench_cuda_repack", "bench_cuda_repack.log"),
              ("kernel_ab", "kernel_ab.log")]


def _demangle(names):
    """Demangled C++ names (c++filt when present; the mangled names otherwise)."""
    tool = shutil.which("c++filt")
    if not tool or not names:
        return list(names)
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True)
    lines = out.stdout.splitlines()
    return lines if out.returncode == 0 and len(lines) == len(names) else list(names)


def parse_ptxas(log_text):
    """[(arch, registers, spill store bytes, spill load bytes, stack bytes, mangled name)] from
    nvcc ``-Xptxas -v`` output. A kernel's report starts at "Compiling entry function"; ptxas
    prints the stack/spill line only when a figure is non-zero (CUDA 13), so they default to 0."""
    kernels, cur = [], None
    for line in log_text.splitlines():
        m = re.search(r"Compiling entry function '([^']+)' for '(\w+)'", line)
        if m:
            cur = {"name": m.group(1), "arch": m.group(2), "regs": None, "st": 0, "ld": 0,
                   "stack": 0}
            kernels.append(cur)
            continue
        if cur is None:
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill "
                      r"loads", line)
        if m:
            cur["stack"], cur["st"], cur["ld"] = (int(g) for g in m.groups())
        m = re.search(r"Used (\d+) registers", line)
        if m:
            cur["regs"] = int(m.group(1))
    return kernels


def cmd_ptxas(build_log, out_txt):
    with open(build_log, errors="replace") as f:
        kernels = parse_ptxas(f.read())
    # ninja may compile a file twice (e.g. after a failure); keep the last report per kernel.
    unique = {(k["arch"], k["name"]): k for k in kernels}
    kernels = sorted(unique.values(), key=lambda k: (k["arch"], k["name"]))
    if not kernels:  # ninja found everything up to date: keep any earlier table
        print("no .cu file recompiled (no ptxas reports in the build log)")
        return
    names = _demangle([k["name"] for k in kernels])
    with open(out_txt, "w") as f:
        f.write(f"{'arch':<6} {'regs':>4} {'spill st':>8} {'spill ld':>8} {'stack':>6}  kernel\n")
        for k, name in zip(kernels, names):
            f.write(f"{k['arch']:<6} {k['regs'] if k['regs'] is not None else '?':>4} "
                    f"{k['st']:>8} {k['ld']:>8} {k['stack']:>6}  {name}\n")
    regs = [k["regs"] for k in kernels if k["regs"] is not None]
    spilling = sum(1 for k in kernels if k["st"] or k["ld"])
    print(f"{len(kernels)} kernels, max {max(regs) if regs else '?'} registers, "
          f"{spilling} with spills")


def cmd_junit(xml_path):
    try:
        root = ET.parse(xml_path).getroot()
    except (OSError, ET.ParseError) as e:
        print(f"no junit report ({type(e).__name__})")
        return
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    total = {k: sum(int(s.get(k, 0)) for s in suites)
             for k in ("tests", "failures", "errors", "skipped")}
    passed = total["tests"] - total["failures"] - total["errors"] - total["skipped"]
    print(f"{passed} passed, {total['failures']} failed, {total['errors']} errors, "
          f"{total['skipped']} skipped")


def _log_text(log):
    """The log's text, or None (after printing "no log") when it cannot be read."""
    try:
        with open(log, errors="replace") as f:
            return f.read()
    except OSError:
        print("no log")
        return None


def cmd_sanitizer(log):
    text = _log_text(log)
    if text is None:
        return
    # memcheck, synccheck and initcheck end with "ERROR SUMMARY: N errors"; racecheck with
    # "RACECHECK SUMMARY: H hazards displayed (N errors, W warnings)".
    found = re.findall(r"ERROR SUMMARY: (\d+) errors?", text)
    races = re.findall(r"RACECHECK SUMMARY: (\d+) hazards? displayed \((\d+) errors?, (\d+) "
                       r"warnings?\)", text)
    if found:
        print(f"{found[-1]} errors")
    elif races:
        hazards, errors, warnings = races[-1]
        print(f"{errors} errors, {warnings} warnings ({hazards} hazards displayed)")
    else:
        print("no ERROR SUMMARY in the log")


def cmd_ncu(log):
    """One clause per kernel Nsight Compute profiled: its duration, DRAM throughput (% of peak),
    issue-slot use and eligible warps per scheduler, the figures that say whether a kernel is
    bound by memory, by issue, or by latency with too few warps."""
    text = _log_text(log)
    if text is None:
        return
    metrics = [("Duration", "{} us"), ("DRAM Throughput", "DRAM {} %"),
               ("One or More Eligible", "issue {} %"),
               ("Eligible Warps Per Scheduler", "{} eligible warps/scheduler")]
    clauses = []
    for block in re.split(r"\n(?=  \S[^\n]*\(\d+, \d+, \d+\)x\(\d+, \d+, \d+\))", text)[1:]:
        name = re.match(r"  (?:void )?([\w:]+)", block)
        grid = re.search(r"\((\d+, \d+, \d+)\)x", block)
        parts = []
        for label, fmt in metrics:
            m = re.search(rf"^\s+{re.escape(label)}\s+\S+\s+([\d.,]+)\s*$", block, re.M)
            if m:
                parts.append(fmt.format(m.group(1).replace(",", "")))
        if name and parts:
            clauses.append(f"{name.group(1)} grid ({grid.group(1) if grid else '?'}): "
                           + ", ".join(parts))
    print("; ".join(clauses) if clauses else "no profiled kernel in the log")


def cmd_summary(outdir):
    steps = []
    path = os.path.join(outdir, "steps.tsv")
    if os.path.exists(path):
        with open(path) as f:
            steps = [line.rstrip("\n").split("\t") for line in f if line.strip()]
    header_path = os.path.join(outdir, "header.md")
    lines = []
    if os.path.exists(header_path):
        with open(header_path) as f:
            lines.append(f.read().rstrip("\n"))
        lines.append("")
    lines += ["| step | rc | seconds | key figure | log |", "|---|---|---|---|---|"]
    for fields in steps:
        fields += [""] * (5 - len(fields))
        step, rc, secs, figure, log = fields[:5]
        lines.append(f"| {step} | {rc} | {secs} | {figure} | {log} |")
    for title, name in BENCH_LOGS:
        log = os.path.join(outdir, name)
        if os.path.exists(log):
            with open(log, errors="replace") as f:
                body = f.read().rstrip("\n")
            lines += ["", f"## {title}", "", "```", body, "```"]
    ptxas = os.path.join(outdir, "ptxas.txt")
    if os.path.exists(ptxas):
        with open(ptxas) as f:
            lines += ["", "## ptxas (registers, spill bytes)", "", "```", f.read().rstrip("\n"),
                      "```"]
    with open(os.path.join(outdir, "summary.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def stall_samples(csv_path):
    """The rows of an Nsight Compute source-page export (`ncu --import R --page source
    --print-source sass --csv`): [(instruction, samples, {reason: samples})], or [] without
    warp-stall samples."""
    import csv
    with open(csv_path, newline="", errors="replace") as f:
        rows = list(csv.reader(f))
    header_at = next((i for i, r in enumerate(rows) if "Source" in r and any(
        c.startswith("Warp Stall Sampling (All") for c in r)), None)
    if header_at is None:
        return []
    header = rows[header_at]
    source = header.index("Source")
    samples = next(i for i, c in enumerate(header) if c.startswith("Warp Stall Sampling (All"))
    reasons = [(i, c[len("stall_"):]) for i, c in enumerate(header)
               if c.startswith("stall_") and "Not Issued" not in c]

    def num(row, i):
        try:
            return float(row[i]) if i < len(row) and row[i] else 0.0
        except ValueError:
            return 0.0
    return [(" ".join(r[source].split()), num(r, samples),
             {name: num(r, i) for i, name in reasons if num(r, i) > 0})
            for r in rows[header_at + 1:] if len(r) > samples]


def _opcode(instr):  # "@!P0 BRA 0x..." -> "BRA", "IMAD.WIDE R78, ..." -> "IMAD.WIDE"
    words = instr.split(" ")
    return words[1] if words[0].startswith("@") and len(words) > 1 else words[0]


def cmd_stalls(csv_path):
    """The key figure of the profile_source step: the three opcodes with the most warp-stall
    samples (share of all samples, main reason); CSV.top.txt gets the top ten opcodes and the
    top ten instructions, each with its three main reasons."""
    if not os.path.exists(csv_path):
        print(f"no {os.path.basename(csv_path)}")
        return
    rows = stall_samples(csv_path)
    total = sum(n for _, n, _ in rows)
    if total == 0:
        print("no warp-stall samples in the export")
        return
    by_op = {}
    for instr, n, why in rows:
        op_n, op_why = by_op.get(_opcode(instr), (0.0, {}))
        for reason, v in why.items():
            op_why[reason] = op_why.get(reason, 0.0) + v
        by_op[_opcode(instr)] = (op_n + n, op_why)

    def line(name, n, why):
        top = sorted(why.items(), key=lambda kv: -kv[1])[:3]
        return (f"{100 * n / total:5.1f} %  {name}  "
                + ", ".join(f"{reason} {int(v)}" for reason, v in top))
    ops = sorted(by_op.items(), key=lambda kv: -kv[1][0])
    with open(csv_path + ".top.txt", "w") as f:
        f.write(f"{int(total)} warp-stall samples\nby opcode:\n")
        f.writelines(line(op, n, why) + "\n" for op, (n, why) in ops[:10])
        f.write("by instruction:\n")
        f.writelines(line(instr, n, why) + "\n"
                     for instr, n, why in sorted(rows, key=lambda r: -r[1])[:10])
    print("; ".join(f"{op} {100 * n / total:.1f} % ({max(why, key=why.get) if why else '?'})"
                    for op, (n, why) in ops[:3]))


def main(argv):
    commands = {"ptxas": (cmd_ptxas, 2), "junit": (cmd_junit, 1), "ncu": (cmd_ncu, 1),
                "stalls": (cmd_stalls, 1),
                "sanitizer": (cmd_sanitizer, 1), "summary": (cmd_summary, 1)}
    if len(argv) < 2 or argv[1] not in commands or len(argv) - 2 != commands[argv[1]][1]:
        print(__doc__, file=sys.stderr)
        return 2
    fn, _ = commands[argv[1]]
    fn(*argv[2:])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
