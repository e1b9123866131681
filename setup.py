"""Build script for w4kernels.

Two extension modules are built:

* ``w4kernels._C``: the product. C++ CPU kernels (``csrc/cpu``) always; the CUDA kernels
  (``csrc/cuda/*.cu``) whenever torch is a CUDA build and a CUDA toolkit is found.
* ``w4kernels._simt``: the same CUDA kernel sources (``csrc/kernels``) compiled by the host
  C++ compiler against the SIMT emulator (``csrc/simt``), registered for CPU tensors under the
  ``w4kernels_simt`` namespace so the tests can run the CUDA kernels without a GPU.

Environment:

* ``W4K_CUDA=1`` forces the CUDA build (fails if it cannot be done), ``W4K_CUDA=0`` forces a
  CPU-only ``_C``; unset means "CUDA when possible".
* ``W4K_SIMT=0`` skips the emulator module (it is built by default).
* ``TORCH_CUDA_ARCH_LIST`` defaults to ``8.0;9.0+PTX`` (sm_80 and sm_90 SASS, compute_90 PTX
  for newer GPUs to JIT from); torch's own default needs a visible GPU.
* ``MAX_JOBS`` is honoured by ninja through torch's build extension.
* ``W4K_NO_EXT=1`` builds nothing (scripts/install.sh compiles in place first, then registers
  the package with an editable pip install).

torch is imported from the environment that runs this script, never from an isolated build
environment: a C++ extension only loads into the torch it was compiled against, so the build
must see the torch the user will run with (``pip install --no-build-isolation .``).
"""

import glob
import os
import re
import subprocess
import sys

from setuptools import find_packages, setup

# Oldest torch the build supports (scripts/install.sh reads this line). 2.11 is the torch of
# this project's GPU machines; the extension was built against 2.11.0+cu130 and 2.14.1+cu130.
TORCH_MIN = "2.11"

try:
    import torch
    from torch.utils import cpp_extension
except ImportError:
    # pip's default isolated build environment holds only setuptools and wheel. Downloading
    # torch into it would build against a torch other than the user's (the extension would then
    # fail to load), so stop here with the fix instead of a ModuleNotFoundError traceback.
    sys.exit(f"w4kernels: torch is not importable here, and the extension must be compiled "
             f"against the torch it will run with: install torch >= {TORCH_MIN} first, then "
             f"`pip install --no-build-isolation .` (plain `pip install .` builds in an "
             f"isolated environment without torch)")

TORCH_VERSION = tuple(int(x) for x in re.findall(r"\d+", torch.__version__)[:2])
if TORCH_VERSION < tuple(int(x) for x in TORCH_MIN.split(".")):
    sys.exit(f"w4kernels: torch {torch.__version__} is older than {TORCH_MIN}, the oldest "
             f"torch this build supports; upgrade torch (scripts/install.sh: "
             f"W4K_TORCH=<version> bash scripts/install.sh)")

ROOT = os.path.dirname(os.path.abspath(__file__))


def _rel(pattern):
    return sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, pattern)))


def _nvcc_major():
    """Major version of CUDA_HOME's nvcc, None when it cannot be run."""
    try:
        out = subprocess.run([os.path.join(cpp_extension.CUDA_HOME, "bin", "nvcc"), "--version"],
                             capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    m = re.search(r"release (\d+)\.", out)
    return int(m.group(1)) if m else None


def _want_cuda():
    forced = os.environ.get("W4K_CUDA")
    have_toolkit = cpp_extension.CUDA_HOME is not None
    have_torch_cuda = torch.version.cuda is not None
    if forced == "0":
        return False
    if forced == "1":
        if not (have_toolkit and have_torch_cuda):
            raise RuntimeError(
                f"W4K_CUDA=1 but torch.version.cuda={torch.version.cuda!r} and "
                f"CUDA_HOME={cpp_extension.CUDA_HOME!r}: both are needed for the CUDA build")
        return True
    if not (have_toolkit and have_torch_cuda):
        return False
    # torch refuses to compile with an nvcc of another CUDA major version than its own. A user
    # keeps the torch they have (scripts/install.sh), which may be a cu12x build next to a
    # CUDA 13 toolkit: build the CPU kernels then, and say why, rather than fail.
    nvcc_major = _nvcc_major()
    torch_major = int(torch.version.cuda.split(".")[0])
    if nvcc_major is not None and nvcc_major != torch_major:
        print(f"w4kernels: torch {torch.__version__} is built with CUDA {torch.version.cuda} but "
              f"{cpp_extension.CUDA_HOME} has CUDA {nvcc_major}: building without the CUDA "
              f"kernels (a matching toolkit, or W4K_CUDA=1 to see torch's error)", flush=True)
        return False
    return True


WITH_CUDA = _want_cuda()
WITH_SIMT = os.environ.get("W4K_SIMT", "1") != "0"

if WITH_CUDA and not os.environ.get("TORCH_CUDA_ARCH_LIST"):
    os.environ["TORCH_CUDA_ARCH_LIST"] = "8.0;9.0+PTX"

# ninja prints one line per finished translation unit, "[i/n] <command>" ("pip install -v" and
# scripts/install.sh show them); the elapsed seconds tell how far a 5-minute build has got.
os.environ.setdefault("NINJA_STATUS", "[%f/%t %es] ")

# -std=c++20 pinned here rather than left to torch: cpp_extension adds its own default only
# when no -std is given, and that default moved from c++17 to c++20 in torch 2.12/2.13 (newer
# ATen headers refuse C++17). Pinning it compiles our sources in the same language mode under
# every torch, e.g. the torch 2.11 of the GPU machines (scripts/gpu_check.sh) and 2.14 here.
# -Wno-maybe-uninitialized: GCC 12 reports false positives inside its own AVX-512 intrinsics.
# -g0 overrides the -g Python's own CFLAGS add: debug info roughly doubles the time spent on
# torch's headers and CI time is a budget (the emulator module keeps line tables, below).
CXX_FLAGS = ["-std=c++20", "-O3", "-fopenmp", "-Wall", "-Wno-unused-function",
             "-Wno-sign-compare", "-Wno-maybe-uninitialized", "-g0"]
LINK_FLAGS = ["-fopenmp"]
INCLUDES = [os.path.join(ROOT, "csrc")]

ext_modules = []

c_sources = ["csrc/ops.cpp", "csrc/meta.cpp"] + _rel("csrc/cpu/*.cpp")
c_defines = []
c_nvcc = [
    "-std=c++20", "-O3", "-lineinfo", "--expt-relaxed-constexpr", "-Xptxas", "-v",
    "-Xptxas", "-warn-spills", "-Xcompiler", "-fopenmp",
]
# W4K_L2_CACHE_HINTS=0: build the GEMMs' weight copies without their L2 evict_first hint (the
# escape hatch, should a GPU fault on the hinted copies: csrc/kernels/ptx.cuh). Default: on.
L2_CACHE_HINTS = os.environ.get("W4K_L2_CACHE_HINTS", "1") != "0"
c_nvcc.append(f"-DW4K_L2_CACHE_HINTS={int(L2_CACHE_HINTS)}")
if WITH_CUDA:
    c_sources += _rel("csrc/cuda/*.cu")
    c_defines.append(("W4K_WITH_CUDA", "1"))
    ext_modules.append(cpp_extension.CUDAExtension(
        "w4kernels._C", c_sources, include_dirs=INCLUDES, define_macros=c_defines,
        extra_compile_args={"cxx": CXX_FLAGS, "nvcc": c_nvcc}, extra_link_args=LINK_FLAGS))
else:
    ext_modules.append(cpp_extension.CppExtension(
        "w4kernels._C", c_sources, include_dirs=INCLUDES, define_macros=c_defines,
        extra_compile_args={"cxx": CXX_FLAGS}, extra_link_args=LINK_FLAGS))

SIMT_SOURCES = _rel("csrc/simt/*.cpp")
if WITH_SIMT and SIMT_SOURCES:
    # [simt] the emulator's fiber context switch is a hand-written .S (no inline asm in C++).
    SIMT_SOURCES += _rel("csrc/simt/*.S")
    # Type punning through reinterpret_cast is everywhere in CUDA kernels: the emulator build
    # must not let the host compiler assume strict aliasing.
    # -Wno-unknown-pragmas: kernels keep their "#pragma unroll" for nvcc; g++ does not know it.
    # -g1: line tables, so the emulator's call-site addresses resolve with addr2line.
    simt_flags = CXX_FLAGS + ["-fno-strict-aliasing", "-DW4K_SIMT=1", "-Wno-unknown-pragmas",
                              "-g1"]
    ext_modules.append(cpp_extension.CppExtension(
        "w4kernels._simt", SIMT_SOURCES, include_dirs=INCLUDES,
        extra_compile_args={"cxx": simt_flags}, extra_link_args=LINK_FLAGS + ["-pthread"]))

class BuildExtension(cpp_extension.BuildExtension):
    """torch's BuildExtension that also accepts '.S' sources ([simt] fiber switch)."""

    def build_extensions(self):
        if ".S" not in self.compiler.src_extensions:
            self.compiler.src_extensions.append(".S")
        super().build_extensions()


if os.environ.get("W4K_NO_EXT") == "1":
    # scripts/install.sh has already built the modules in place; pip only registers the package.
    ext_modules = []

setup(
    name="w4kernels",
    packages=find_packages("python"),
    package_dir={"": "python"},
    ext_modules=ext_modules,
    cmdclass={"build_ext": BuildExtension},
    # The compiled modules load only into the torch release they were built against (torch's
    # C++ ABI changes between minor releases), so an installed build or wheel requires that
    # release: pip then refuses, or replaces, a torch the extension could not load into.
    install_requires=[f"torch=={TORCH_VERSION[0]}.{TORCH_VERSION[1]}.*", "numpy"],
)
