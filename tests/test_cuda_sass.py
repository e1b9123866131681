"""The compiled GEMMs' SASS has no global load whose memory descriptor register nothing writes:
the form in which nvcc 13.0's ptxas encoded the L2-hinted weight copies that faulted on an H100
(csrc/kernels/ptx.cuh, scripts/sass_desc_check.py). Reads the objects of the last build
(scripts/install.sh builds the CUDA module in build/temp.*, scripts/gpu_check.sh in
build/gpu-check*), disassembled with cuobjdump."""

import glob
import importlib.util
import os
import subprocess

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
_spec = importlib.util.spec_from_file_location(
    "sass_desc_check", os.path.join(ROOT, "scripts", "sass_desc_check.py"))
sass_desc_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sass_desc_check)

# Two kernels in cuobjdump's format: the first reads desc[UR1] that nothing writes (the
# faulting form), the second reads desc[UR4], which its ULDC.64 writes (with UR5).
_SASS = """
        Function : bad_kernel
        /*0010*/                   ULDC.64 UR4, c[0x0][0x208] ;
        /*0020*/                   LDGSTS.E.BYPASS.128 [R3+UR0+0x400], desc[UR1][R16.64], !P6 ;
        /*0030*/                   LDGSTS.E.BYPASS.128 [R3+UR0+0x600], desc[UR1][R16.64+0x200] ;
        /*0040*/                   LDG.E R5, desc[UR4][R8.64] ;
        Function : good_kernel
        /*0010*/                   UMOV UR7, 0x12f00000 ;
        /*0020*/                   ULDC.64 UR4, c[0x0][0x208] ;
        /*0030*/                   UMOV UR6, URZ ;
        /*0040*/                   LDGSTS.E.BYPASS.128 [R3+0x400], desc[UR6][R16.64], !P6 ;
        /*0050*/               @P0 LDG.E R5, desc[UR4][R8.64] ;
"""


def test_checker_finds_a_never_written_descriptor():
    assert sass_desc_check.undefined_descriptors(_SASS) == [("bad_kernel", {1: 2})]
    assert sass_desc_check.undefined_descriptors(_SASS.split("Function : good")[0]) != []
    good = "        Function : good" + _SASS.split("Function : good")[1]
    assert sass_desc_check.undefined_descriptors(good) == []


def _last_cuda_objects():
    """The CUDA objects of the build directory whose w4a16_gemm.o is newest ([] if none)."""
    dirs = [os.path.dirname(o) for pattern in ("temp.*", "gpu-check*") for o in
            glob.glob(os.path.join(ROOT, "build", pattern, "csrc", "cuda", "w4a16_gemm.o"))]
    if not dirs:
        return []
    newest = max(dirs, key=lambda d: os.path.getmtime(os.path.join(d, "w4a16_gemm.o")))
    return sorted(glob.glob(os.path.join(newest, "*.o")))


def test_built_kernels_name_only_written_descriptors():
    objects = _last_cuda_objects()
    if not objects:
        pytest.skip("no CUDA objects in build/temp.* or build/gpu-check* (a CPU-only build: no "
                    "nvcc or a CPU torch)")
    cuobjdump = sass_desc_check.find_cuobjdump()
    if cuobjdump is None:
        pytest.skip("no cuobjdump to disassemble the build with (CUDA 13 ships none; "
                    "../shared/tools/get-cuobjdump.sh fetches one, or set CUOBJDUMP)")
    gemms = [o for o in objects if os.path.basename(o) in ("w4a16_gemm.o", "awq_gemm.o")]
    assert len(gemms) == 2, objects
    for obj in objects:
        sass = subprocess.run([cuobjdump, "-sass", obj], capture_output=True, text=True,
                              check=True).stdout
        if obj in gemms:
            assert sass.count("LDGSTS") > 100, obj  # the check saw the GEMMs' copies
        assert sass_desc_check.undefined_descriptors(sass) == [], obj
