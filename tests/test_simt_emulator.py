"""Self-tests of the SIMT emulator (csrc/simt/) and of the PTX wrappers (csrc/kernels/ptx.cuh).

The C++ cases in tests/simt/*.cpp are compiled with g++ directly (no torch) in two builds,
``plain`` (-O1) and ``asan`` (-O0 -fsanitize=address,undefined), once per test session, and every
case runs in its own process. Two cases are deliberate memory bugs whose expected outcome
differs per build:

* ``bug_missing_cp_async_wait``: plain build, the kernel sums poison (NaN) and the case checks
  that; ASan build, the early read of cp.async data is reported as use-after-poison.
* ``bug_shared_memory_overflow``: ASan must report a heap-buffer-overflow in the kernel (the
  plain build cannot see it and skips it).

Also: a third build with -DW4K_SIMT_UCONTEXT (the portable fiber switch) runs the scheduling
cases; every correct case passes again with the threads of each block run in reverse and in
shuffled order; inter-block locks complete with a single run slot; nvcc compiles every wrapper
for sm_80 and sm_90 (when nvcc is present); and nothing in csrc/simt or csrc/kernels but
ptx.cuh contains inline asm.
"""

import concurrent.futures
import glob
import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CSRC = os.path.join(ROOT, "csrc")
TEST_DIR = os.path.join(ROOT, "tests", "simt")
SOURCES = sorted(glob.glob(os.path.join(TEST_DIR, "*.cpp")))
SWITCH_S = os.path.join(CSRC, "simt", "fiber_switch_x86_64.S")
NVCC = shutil.which("nvcc") or (
    "/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)

# -g1 (line tables) keeps sanitizer reports symbolized at a fraction of -g's compile time; the
# ASan+UBSan build is -O0: it compiles 3x faster than -O1 under UBSan and sees every access.
COMMON = ["-std=c++20", "-g1", "-Wall", "-Wextra", "-Werror", "-Wno-sign-compare",
          "-fno-strict-aliasing", "-DW4K_SIMT=1", "-I" + CSRC, "-pthread"]
BUILDS = {
    "plain": ["-O1"],
    "asan": ["-O0", "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"],
}
# the ucontext build only runs scheduling cases (test_ucontext_fallback)
UCONTEXT_SOURCES = [os.path.join(TEST_DIR, n) for n in ("main.cpp", "test_block.cpp")]
ASAN_ENV = {
    "ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0:halt_on_error=1",
    "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
}


def _case_names():
    names = []
    for path in SOURCES:
        with open(path) as f:
            names += re.findall(r"^TEST\((\w+)\)", f.read(), flags=re.M)
    return names


CASES = _case_names()


def _build(outdir, name, flags, sources):
    """One binary per build. The test sources are compiled as one translation unit (a generated
    file that #includes them): the emulator's inline code is then compiled once, not per file,
    which halves the build time."""
    unity = os.path.join(outdir, f"{name}_all.cpp")
    with open(unity, "w") as f:
        f.writelines(f'#include "{src}"\n' for src in sources)
    exe = os.path.join(outdir, f"simt_selftest_{name}")
    # the ucontext fallback needs no .S
    extra = [] if "-DW4K_SIMT_UCONTEXT" in flags else [SWITCH_S]
    cmd = ["g++", *COMMON, *flags, unity, *extra, "-o", exe]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"build failed: {' '.join(cmd)}\n{r.stderr[-4000:]}")
    return exe


def _build_all(outdir):
    variants = {name: (flags, SOURCES) for name, flags in BUILDS.items()}
    variants["ucontext"] = (["-O1", "-DW4K_SIMT_UCONTEXT"], UCONTEXT_SOURCES)
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:  # 2 cores
        futures = {name: pool.submit(_build, outdir, name, flags, sources)
                   for name, (flags, sources) in variants.items()}
        return {name: f.result() for name, f in futures.items()}


@pytest.fixture(scope="module")
def binaries(tmp_path_factory):
    if shutil.which("g++") is None:
        pytest.skip("g++ not found")
    return _build_all(str(tmp_path_factory.mktemp("simt_selftest")))


def _run(exe, case, build):
    env = dict(os.environ)
    if build == "asan":
        env.update(ASAN_ENV)
    return subprocess.run([exe, case], capture_output=True, text=True, timeout=120, env=env)


def test_case_list_matches_binary(binaries):
    listed = subprocess.run([binaries["plain"], "--list"], capture_output=True, text=True,
                            check=True).stdout.split()
    assert sorted(listed) == sorted(CASES)


@pytest.mark.parametrize("build", sorted(BUILDS))
@pytest.mark.parametrize("case", CASES)
def test_selftest_case(binaries, build, case):
    r = _run(binaries[build], case, build)
    out = r.stdout + r.stderr
    if case == "bug_shared_memory_overflow":
        if build != "asan":
            pytest.skip("an overflow by one element is only visible under ASan")
        assert r.returncode != 0, out
        assert "ERROR: AddressSanitizer: heap-buffer-overflow" in r.stderr, out
        assert "smem_overflow_kernel" in r.stderr, out  # the faulting kernel frame
        return
    if case == "bug_missing_cp_async_wait" and build == "asan":
        assert r.returncode != 0, out
        assert "ERROR: AddressSanitizer: use-after-poison" in r.stderr, out
        assert "cp_async_sum_kernel<false>" in r.stderr, out
        return
    assert r.returncode == 0 and f"PASS {case}" in r.stdout, out
    # the sanitizers report without failing the process in some modes: keep stderr clean
    assert "Sanitizer" not in r.stderr and "runtime error" not in r.stderr, out


@pytest.mark.parametrize("case", ["thread_block_indices_3d",
                                  "static_shared_private_per_block_with_grid_barrier",
                                  "inter_block_lock_reverse_order_needs_concurrency",
                                  "inter_block_lock_spin_with_warp_vote_or_barriers",
                                  "cp_async_commit_wait_group_semantics",
                                  "kernel_exception_propagates_to_launcher",
                                  "fiber_stacks_hold_large_locals"])
def test_ucontext_fallback(binaries, case):
    r = _run(binaries["ucontext"], case, "ucontext")
    assert r.returncode == 0 and f"PASS {case}" in r.stdout, r.stdout + r.stderr


def test_single_worker_still_runs_inter_block_locks(binaries):
    # With one run slot, the reverse-order chain only completes if spinning blocks give their
    # slot away to the blocks they wait for.
    env = dict(os.environ, W4K_SIMT_WORKERS="1")
    r = subprocess.run([binaries["plain"], "inter_block_lock_reverse_order_needs_concurrency",
                        "static_shared_private_per_block_with_grid_barrier",
                        "inter_block_lock_spin_with_warp_vote_or_barriers"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("schedule", ["reverse", "shuffle"])
def test_correct_cases_pass_under_every_thread_order(binaries, schedule):
    # Correct kernels must not depend on the order the emulator runs threads in (the fault cases
    # are excluded: they are still caught, but which lane is named first depends on the order).
    cases = [c for c in CASES
             if not c.startswith("bug_") and c != "schedule_orders_expose_missing_syncthreads"]
    env = dict(os.environ, W4K_SIMT_SCHEDULE=schedule, W4K_SIMT_SEED="11")
    r = subprocess.run([binaries["plain"], *cases], capture_output=True, text=True, timeout=300,
                       env=env)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.skipif(NVCC is None, reason="nvcc not found")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_nvcc_compiles_every_wrapper(tmp_path, arch):
    """Every wrapper of ptx.cuh compiles to its instruction. The L2 cache-hint forms are on by
    default; -DW4K_L2_CACHE_HINTS=0 (the escape hatch, should a GPU fault on them again:
    csrc/kernels/ptx.cuh) must emit none of them and fall back to the plain cp.async.cg."""
    src = os.path.join(TEST_DIR, "nvcc_all_wrappers.cu")
    hinted = ["createpolicy.fractional.L2::evict_first.b64",
              "cp.async.cg.shared.global.L2::cache_hint"]
    plain = tmp_path / f"plain_{arch}.ptx"
    r = subprocess.run([NVCC, f"-arch={arch}", "-DW4K_L2_CACHE_HINTS=0", "-I" + CSRC, "-ptx",
                        src, "-o", str(plain)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    for instr in hinted:
        assert instr not in plain.read_text(), f"{instr} in the {arch} PTX without hints"
    assert "cp.async.cg.shared.global" in plain.read_text()
    ptx = tmp_path / f"all_{arch}.ptx"
    r = subprocess.run([NVCC, f"-arch={arch}", "-I" + CSRC, "-ptx", src, "-o", str(ptx)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    text = ptx.read_text()
    for instr in ["mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
                  "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
                  "ldmatrix.sync.aligned.m8n8.x1.shared.b16",
                  "ldmatrix.sync.aligned.m8n8.x2.shared.b16",
                  "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
                  "ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16",
                  "ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16",
                  "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16",
                  "cp.async.ca.shared.global", "cp.async.cg.shared.global",
                  "createpolicy.fractional.L2::evict_first.b64",
                  "cp.async.cg.shared.global.L2::cache_hint",
                  "cp.async.commit_group", "cp.async.wait_group", "cp.async.wait_all",
                  "lop3.b32", "prmt.b32", "ld.global.acquire.gpu.b32",
                  "red.release.gpu.global.add.s32", "st.release.gpu.global.b32", "bar.sync"]:
        assert instr in text, f"{instr} missing from the {arch} PTX"


def test_no_inline_asm_outside_ptx_header():
    """Project rule: every inline PTX instruction is a wrapper in csrc/kernels/ptx.cuh (so the
    emulator can stand in for it); no other C/C++/CUDA source under csrc/ contains asm."""
    offenders = []
    for path in glob.glob(os.path.join(CSRC, "**", "*"), recursive=True):
        if not path.endswith((".h", ".cuh", ".cpp", ".cu", ".cc")):
            continue
        if os.path.relpath(path, CSRC) == os.path.join("kernels", "ptx.cuh"):
            continue
        with open(path, errors="replace") as f:
            if re.search(r"\basm\s*(volatile\s*)?\(|__asm__", f.read()):
                offenders.append(os.path.relpath(path, ROOT))
    assert not offenders, f"inline asm outside csrc/kernels/ptx.cuh: {offenders}"
