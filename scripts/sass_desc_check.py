#!/usr/bin/env python3
"""Finds global loads whose memory descriptor register nothing in the kernel writes.

On sm_90 a global load or cp.async (LDG / LDGSTS) names a 64-bit memory descriptor in a uniform
register pair, `desc[URn]`; with an L2 cache hint that descriptor carries the cache policy.
nvcc 13.0's ptxas emitted 713 hinted LDGSTS in w4kernels' GEMMs whose descriptor was `desc[UR1]`,
a register no instruction of the kernel wrote, and the H100 faulted on them ("an illegal
instruction was encountered"; csrc/kernels/ptx.cuh). This script disassembles objects with
cuobjdump and lists, per kernel, every descriptor register that is read but never written (a
flow-insensitive check: it catches that failure, not every misuse).

    python3 scripts/sass_desc_check.py OBJ... [--cuobjdump PATH]   # exit 1 if any is found
"""

import argparse
import os
import re
import shutil
import subprocess
import sys

_FUNC = re.compile(r"^\s*Function : (\S+)")
_INSN = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")
# Instructions whose first operand, a uniform register, is written.
_UR_WRITERS = ("U", "R2UR", "S2UR", "LDCU", "REDUX", "VOTEU", "CS2UR")


def find_cuobjdump():
    """A cuobjdump: $CUOBJDUMP, PATH, $CUDA_HOME/bin, or the one get-cuobjdump.sh fetches."""
    candidates = [os.environ.get("CUOBJDUMP"), shutil.which("cuobjdump"),
                  os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin",
                               "cuobjdump"),
                  os.path.expanduser("~/.cache/w4k-cuobjdump/usr/bin/cuobjdump")]
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


def undefined_descriptors(sass):
    """[(kernel, {register number: reads})] for every kernel in `sass` (cuobjdump -sass text)
    with a desc[URn] of a global load that no instruction of the kernel writes."""
    found, name, written, reads = [], None, set(), {}

    def close():
        bad = {r: n for r, n in reads.items() if r not in written}
        if name is not None and bad:
            found.append((name, bad))

    for line in sass.splitlines():
        m = _FUNC.match(line)
        if m:
            close()
            name, written, reads = m.group(1), set(), {}
            continue
        m = _INSN.search(line)
        if not m:
            continue
        op, args = m.groups()
        d = re.fullmatch(r"UR(\d+)", args.split(",")[0].strip())
        if d and op.startswith(_UR_WRITERS):
            width = 4 if ".128" in op else 2 if ".64" in op else 1
            written.update(range(int(d.group(1)), int(d.group(1)) + width))
        if op.startswith("LDG"):  # LDG and LDGSTS
            for r in re.findall(r"desc\[UR(\d+)\]", args):
                reads[int(r)] = reads.get(int(r), 0) + 1
    close()
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("objects", nargs="+")
    ap.add_argument("--cuobjdump", default=None)
    args = ap.parse_args()
    cuobjdump = args.cuobjdump or find_cuobjdump()
    if cuobjdump is None:
        sys.exit("sass_desc_check: no cuobjdump (../shared/tools/get-cuobjdump.sh fetches one)")
    bad = 0
    for obj in args.objects:
        sass = subprocess.run([cuobjdump, "-sass", obj], capture_output=True, text=True,
                              check=True).stdout
        for kernel, regs in undefined_descriptors(sass):
            bad += sum(regs.values())
            print(f"{obj}: {kernel}: never written descriptor registers (reads): {regs}")
    print(f"sass_desc_check: {bad} global loads with a descriptor register nothing writes")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
