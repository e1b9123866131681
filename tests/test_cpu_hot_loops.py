"""The CPU kernels' innermost dot-product loops keep their accumulators in registers.

A register-blocked kernel with its accumulator array stored to the stack on every iteration
still computes the right result, so no numerics test notices; it only runs slower (2026-11-24:
a quarter of the AVX-512 decode path's speed at 8 rows in one form, a third of the AVX2
micro-kernel's). scripts/cpu_hot_loops.py disassembles the built extension and reports, for the
decode path (and its split on AMX tiles), the blocked micro-kernels (AVX-512 and AVX2) and the
KleidiAI AVX-512 tiles, any
innermost dot-product loop that stores vectors to more than one stack slot.
"""

import platform
import re
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import cpu_hot_loops  # noqa: E402


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                    reason="the checked kernels are x86-64 SIMD code")
@pytest.mark.skipif(shutil.which("objdump") is None, reason="needs objdump (binutils)")
def test_no_stack_stores_in_dot_loops():
    import w4kernels._C as ext
    result = cpu_hot_loops.check(ext.__file__)
    names = [name for name, _, _ in result]
    # The kernels are compiled into every x86-64 build (each carries its own target attribute).
    for kernel in ("pair_pass_avx512", "micro_bf16_avx512", "micro_avx2", "tile_avx512",
                   "amx_decode_chunks_impl"):
        assert any(kernel in n for n in names), f"{kernel} not found in {ext.__file__}"
    bad = [(name, slots) for name, loops, slots in result if slots > 1]
    assert not bad, "dot loops storing vectors to the stack: " + "; ".join(
        f"{name[:100]} ({slots} slots)" for name, slots in bad)
    assert all(loops >= 1 for _, loops, _ in result)


def test_checker_flags_a_spilling_loop():
    """The checker itself, on hand-written disassembly: an inner dot loop that stores two
    vectors to two stack slots counts 2 (flagged), one rewritten slot (a volatile temporary)
    counts 1; stores outside the inner loop and loops without a dot product do not count."""
    insns = [(0x00, "vmovaps %zmm5,0xc0(%rsp)"),        # before the loops
             (0x10, "vdpbf16ps %zmm1,%zmm2,%zmm3"),
             (0x16, "vmovaps %zmm3,0x40(%rsp)"),
             (0x1c, "vmovaps %zmm4,-0x80(%rbp)"),
             (0x22, "jne    10 <f+0x10>"),
             (0x28, "vmovaps %zmm6,0x100(%rsp)"),       # outer loop only
             (0x2e, "jne    0 <f>"),
             (0x34, "vmovaps %zmm7,0x140(%rsp)"),       # a loop without dot products
             (0x3a, "jne    34 <f+0x34>")]
    loops = cpu_hot_loops.dot_loops(insns)
    assert loops == [(0x10, 0x22)]
    assert cpu_hot_loops.stack_slots(insns, *loops[0]) == {("0x40", "%rsp"), ("-0x80", "%rbp")}
    one = [(a, t.replace("-0x80(%rbp)", "0x40(%rsp)")) for a, t in insns]
    assert len(cpu_hot_loops.stack_slots(one, *loops[0])) == 1


# AVX512-VBMI2 mnemonics (vpshld*/vpshrd* and the byte/word compress/expand).
VBMI2 = re.compile(r"^(vpshl?dv?[wdq]|vpshrdv?[wdq]|vpcompress[bw]|vpexpand[bw])\b")


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                    reason="the checked kernels are x86-64 SIMD code")
@pytest.mark.skipif(shutil.which("objdump") is None, reason="needs objdump (binutils)")
def test_vbmi2_only_in_the_top_index_passes():
    """pair_pass_avx512 is compiled with VBMI2 allowed in every instantiation (one target for
    the template), but only its kTop ones (pair_index_at<true>, called where the CPU has VBMI2) may
    hold VBMI2 instructions: anywhere else they would fault on an AVX-512 CPU without it
    (Skylake-SP, Cascade Lake, Cooper Lake)."""
    import w4kernels._C as ext
    users = {name for name, insns in cpu_hot_loops.functions(ext.__file__).items()
             if any(VBMI2.match(text) for _, text in insns)}
    top = {n for n in users if "pair_pass_avx512<" in n and n.split(">(")[0].endswith("true")}
    assert top, "no pair_pass_avx512<..., true> with vpshldw found"
    assert users == top, "VBMI2 instructions outside the kTop passes: " + "; ".join(
        n[:120] for n in sorted(users - top))


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"),
                    reason="the checked kernels are x86-64 SIMD code")
@pytest.mark.skipif(shutil.which("objdump") is None, reason="needs objdump (binutils)")
def test_avx2_lookup_fma_only_in_its_fma_rows():
    """The AVX2 lookup decode's products: lookup_band_row_fma_avx2 (taken where every product is
    exact) gets its FMAs from GCC contracting the tile's multiply and add, so each instantiation
    must hold vfmadd and no vmulps (else a compiler that stops contracting would leave it as slow
    as the other form without any test failing); lookup_order_band_avx2, which runs the other k-tile
    rows, must hold no FMA (its products may be inexact, and an FMA would change their bits)."""
    import w4kernels._C as ext
    funcs = cpu_hot_loops.functions(ext.__file__)
    fma_rows = {n: i for n, i in funcs.items() if "lookup_band_row_fma_avx2<" in n}
    bands = {n: i for n, i in funcs.items() if "lookup_order_band_avx2" in n}
    assert len(fma_rows) == 16 and bands, (sorted(fma_rows), sorted(bands))
    for name, insns in fma_rows.items():
        ops = [text.split()[0] for _, text in insns]
        assert any(o.startswith("vfmadd") for o in ops) and "vmulps" not in ops, name[:100]
    for name, insns in bands.items():
        assert not any(text.startswith("vfmadd") for _, text in insns), name[:100]
