#!/usr/bin/env python3
"""Vector stores to the stack inside the CPU kernels' innermost dot-product loops.

GCC keeps an array of vector accumulators (``__m512 c[MR][4]``) in registers only when every
loop that indexes it is unrolled; when one is not (say the loop that loads the accumulators
before the k loop), it keeps the array in memory as well and stores every accumulator on every
iteration of the k loop. The results stay right, only slower: on 2026-11-24 that cost the
AVX-512 decode path a quarter of its speed at 8 rows and the AVX2 micro-kernel a third. This
script finds such loops in the built extension: for every function whose name matches one of
the patterns, each innermost loop (a backward branch and its target) that holds a dot-product
instruction must hold no vector stores to more than one stack slot (a `volatile` temporary,
which the KleidiAI epilogue uses on purpose to keep a multiply and an add unfused, is one slot
rewritten: allowed).

Usage: cpu_hot_loops.py [SO_PATH]   (default: the installed w4kernels extension)
Prints one line per function checked and exits 1 if any loop stores a vector to the stack.
Needs objdump (binutils); exits 2 without it.
"""

import re
import shutil
import subprocess
import sys

# Kernels whose inner loops must keep their accumulators in registers.
PATTERNS = [
    # bf16 / fp16, with either index form (kTop: VBMI2)
    r"w4k::cpu::pair_pass_avx512<\d+, \d+, (false|true), false, false, (false|true)>",
    r"w4k::cpu::pair_pass_avx512<[1-8], 1, false, true, false, false>",  # no-BF16 form, one line
    r"w4k::cpu::pair_pass_avx512<\d+, \d+, false, true, true, false>",   # fma form, split a
    r"w4k::cpu::micro_bf16_avx512<\d+>",
    r"w4k::cpu::micro_avx512<\d+, (true|false)>",
    r"w4k::cpu::micro_avx2<\d+, \d+, (true|false)>",
    r"w4k::kai::.*tile_avx512<\d+>",
    # the decode split on AMX tiles: its step loop (lookups, stores, TDPBF16PS) keeps the
    # shuffle constants in registers
    r"w4k::cpu::amx_decode_chunks_impl<(true|false), (true|false), \d>",
    # awq_gemm's row path (its row pairs' loop, inlined row_pass)
    r"w4k::awq_cpu::row_pass<\d, \d, \d, (true|false)>",
]
DOT = re.compile(r"^(vdpbf16ps|vfmadd\w+|vpdpbusd|vmulps|tdpbf16ps)\b")
STACK_STORE = re.compile(r"^vmov\w*\s+%[xyz]mm\d+,(-?0x[0-9a-f]+)?\((%rsp|%rbp)\)")
HEADER = re.compile(r"^([0-9a-f]+) <(.*)>:$")
INSN = re.compile(r"^\s+([0-9a-f]+):\s+(.*)$")
BRANCH = re.compile(r"^j\w+\s+([0-9a-f]+) <")


def functions(so_path):
    """{demangled name: [(address, instruction text)]} of the library's text."""
    out = subprocess.run(["objdump", "-d", "-C", "--no-show-raw-insn", so_path],
                         check=True, capture_output=True, text=True).stdout
    funcs, cur = {}, None
    for line in out.splitlines():
        m = HEADER.match(line)
        if m:
            cur = None if m.group(2).endswith("@plt") else m.group(2)
            if cur:
                funcs[cur] = []
            continue
        m = INSN.match(line)
        if m and cur:
            funcs[cur].append((int(m.group(1), 16), m.group(2)))
    return funcs


def dot_loops(insns):
    """The innermost loops (address ranges) that hold a dot-product instruction."""
    loops = []
    for addr, text in insns:
        m = BRANCH.match(text)
        if m and int(m.group(1), 16) < addr:
            loops.append((int(m.group(1), 16), addr))
    with_dot = [(lo, hi) for lo, hi in loops
                if any(DOT.match(t) for a, t in insns if lo <= a <= hi)]
    # innermost: contains no other dot loop
    return [(lo, hi) for lo, hi in with_dot
            if not any((lo2, hi2) != (lo, hi) and lo <= lo2 and hi2 <= hi for lo2, hi2 in with_dot)]


def stack_slots(insns, lo, hi):
    """The stack slots (offset, base register) that vector stores in [lo, hi] write."""
    return {m.group(1, 2) for a, t in insns if lo <= a <= hi
            for m in [STACK_STORE.match(t)] if m}


def check(so_path):
    """[(name, number of dot loops, the most stack slots one of them stores vectors to)] for the
    matching functions."""
    result = []
    for name, insns in sorted(functions(so_path).items()):
        if not any(re.search(p, name) for p in PATTERNS):
            continue
        loops = dot_loops(insns)
        slots = max((len(stack_slots(insns, lo, hi)) for lo, hi in loops), default=0)
        result.append((name, len(loops), slots))
    return result


def main():
    if shutil.which("objdump") is None:
        print("objdump not found (binutils)")
        return 2
    if len(sys.argv) > 1:
        so_path = sys.argv[1]
    else:
        import w4kernels._C as ext
        so_path = ext.__file__
    bad = 0
    for name, nloops, slots in check(so_path):
        print(f"{slots:3d} stack slots stored in one of {nloops} dot loop(s): {name[:120]}")
        bad += slots > 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
