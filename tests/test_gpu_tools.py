"""The GPU tooling keeps working on a machine without a GPU (CI's), so that it runs unattended
the day one is at hand: scripts/gpu_check.sh, scripts/gpu_sanitize_cases.py,
scripts/gpu_check_report.py and benchmarks/bench_gpu_gemm.py.

On a machine with a GPU the no-GPU tests skip; scripts/gpu_check.sh itself is the check there.
"""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import w4kernels

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))

import gpu_check_report  # noqa: E402

no_gpu_only = pytest.mark.skipif(torch.cuda.is_available(),
                                 reason="checks the no-GPU paths; this machine has a GPU")
needs_simt = pytest.mark.skipif(not w4kernels.HAS_SIMT, reason="w4kernels._simt was not built")


def run(cmd, timeout, **env):
    """Run cmd from the repository root with this interpreter and this checkout's package."""
    full_env = dict(os.environ, PYTHON=sys.executable, **env)
    full_env["PYTHONPATH"] = os.path.join(ROOT, "python") + (
        os.pathsep + full_env["PYTHONPATH"] if full_env.get("PYTHONPATH") else "")
    r = subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, f"{cmd} exited {r.returncode}:\n{r.stdout}\n{r.stderr}"
    return r.stdout


# ---- scripts/gpu_check.sh -------------------------------------------------------------------


@no_gpu_only
def test_gpu_check_without_gpu_says_so_and_exits_0(tmp_path):
    out = tmp_path / "out"
    stdout = run(["bash", "scripts/gpu_check.sh", str(out)], timeout=120)
    assert "no GPU visible" in stdout
    summary = (out / "summary.md").read_text()
    assert summary.startswith("# gpu_check: no GPU")
    assert not (out / "build.log").exists(), "nothing may be built without a GPU"


def test_gpu_check_dry_run_records_every_step(tmp_path):
    """The dry run goes through every step's bookkeeping (timeouts, budget, summary) and shows
    the commands: the build is the CUDA module only, for the one architecture asked for."""
    out = tmp_path / "out"
    stdout = run(["bash", "scripts/gpu_check.sh", str(out)], timeout=120,
                 GPU_CHECK_DRY_RUN="1", TORCH_CUDA_ARCH_LIST="9.0", GPU_CHECK_QUICK="1")
    assert "W4K_SIMT=0 W4K_CUDA=1 TORCH_CUDA_ARCH_LIST=9.0" in stdout
    assert "bench_gpu_gemm.py --quick" in stdout
    rows = [line.split(" | ")[0].lstrip("| ") for line in
            (out / "summary.md").read_text().splitlines() if line.startswith("| ")]
    assert rows == ["step", "build", "import", "smoke", "tests", "bench_gpu_gemm",
                    "bench_gpu_gemm_graph", "bench_cuda_repack", "kernel_ab",
                    "memcheck", "racecheck", "synccheck", "initcheck", "profile",
                    "profile_source"]


# ---- benchmarks/bench_gpu_gemm.py -----------------------------------------------------------


@no_gpu_only
def test_bench_gpu_gemm_without_gpu_says_so_and_exits_0():
    stdout = run([sys.executable, "benchmarks/bench_gpu_gemm.py"], timeout=60)
    assert "no CUDA GPU visible" in stdout


@needs_simt
def test_bench_gpu_gemm_simt_runs_every_method():
    """The whole code path (layer construction with the Marlin / AWQ packers, the check against
    dequantize + matmul, the timing loop, the table) on a tiny shape under the emulator."""
    stdout = run([sys.executable, "benchmarks/bench_gpu_gemm.py", "--simt", "--quick",
                  "--m", "1", "--act-order", "--zero-points"], timeout=20)
    assert "MISMATCH" not in stdout
    row = [line for line in stdout.splitlines() if line.split()[:3] == ["1", "128", "256"]]
    assert len(row) == 1, stdout


@needs_simt
def test_bench_gpu_gemm_split_blocks_ab_columns():
    """--split-blocks (the A/B of w4a16_gemm's split-K partitions, W4K_W4A16_SPLIT_BLOCKS, against
    the planner's choice): every partition checked against dequantize + matmul, its columns and
    ratio printed. The emulated device has 8 SMs: 1x and 3x are 8 and 24 blocks over the shape's
    single tile of 2 stages (24 is cut to one block per stage)."""
    stdout = run([sys.executable, "benchmarks/bench_gpu_gemm.py", "--simt", "--m", "1",
                  "--zero-points", "--split-blocks", "none", "old", "1x", "3x", "5"], timeout=60)
    assert "MISMATCH" not in stdout
    assert "1x ms" in stdout and "old x" in stdout
    row = [line for line in stdout.splitlines() if line.split()[:3] == ["1", "128", "256"]]
    assert len(row) == 1 and row[0].rstrip().endswith("x"), stdout
    assert len(row[0].split()) == 13 + 2 * 5, row


def test_bench_gpu_gemm_graph_mode_needs_a_gpu_not_the_emulator():
    """--graph times CUDA-graph replays; with --simt it is a usage error that says so (exit 2)."""
    r = subprocess.run([sys.executable, "benchmarks/bench_gpu_gemm.py", "--graph", "--simt"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert "--graph needs a GPU (CUDA graphs); --simt runs on the CPU" in r.stderr


# ---- scripts/gpu_sanitize_cases.py ----------------------------------------------------------


def test_sanitize_cases_cover_every_variant():
    stdout = run([sys.executable, "scripts/gpu_sanitize_cases.py", "--list"], timeout=60)
    names = stdout.splitlines()
    for needle in ["marlin_repack K=", "marlin_repack act-order", "awq_marlin_repack",
                   "awq_dequantize fp16", "awq_dequantize bf16", "split_k=1", "split_k=8",
                   "M=1 ", "M=17 ", "M=64 ", "M=65 ", "per-channel", "g128 zero-points",
                   "act-order k_full", "is_k_full=False", "g128 bias", "split-K",
                   "no split-K"]:
        assert any(needle in n for n in names), f"no case for {needle!r}"


@needs_simt
def test_sanitize_cases_pass_under_the_emulator():
    stdout = run([sys.executable, "scripts/gpu_sanitize_cases.py", "--simt", "-k", "M=1 "],
                 timeout=60)
    assert "MISMATCH" not in stdout and "ERROR" not in stdout
    assert " cases ok" in stdout


# ---- scripts/gpu_check_report.py ------------------------------------------------------------

PTXAS_LOG = textwrap.dedent("""\
    ptxas info    : 28 bytes gmem
    ptxas info    : Compiling entry function '_ZN3w4k1kILi1EEEvv' for 'sm_90'
    ptxas info    : Function properties for _ZN3w4k1kILi1EEEvv
    ptxas info    : Used 128 registers, used 1 barriers, 408 bytes cmem[0]
    ptxas info    : Compiling entry function '_ZN3w4k1kILi4EEEvv' for 'sm_90'
    ptxas info    : Function properties for _ZN3w4k1kILi4EEEvv
        8 bytes stack frame, 36 bytes spill stores, 40 bytes spill loads
    ptxas info    : Used 255 registers, used 1 barriers, 408 bytes cmem[0]
    """)


def test_report_reads_ptxas_registers_and_spills():
    kernels = gpu_check_report.parse_ptxas(PTXAS_LOG)
    assert [(k["arch"], k["regs"], k["st"], k["ld"], k["stack"]) for k in kernels] == [
        ("sm_90", 128, 0, 0, 0), ("sm_90", 255, 36, 40, 8)]


def test_report_key_figures(tmp_path, capsys):
    log = tmp_path / "build.log"
    log.write_text(PTXAS_LOG)
    gpu_check_report.cmd_ptxas(str(log), str(tmp_path / "ptxas.txt"))
    assert capsys.readouterr().out.strip() == "2 kernels, max 255 registers, 1 with spills"
    assert "void w4k::k<4>()" in (tmp_path / "ptxas.txt").read_text()

    junit = tmp_path / "junit.xml"
    junit.write_text('<testsuites><testsuite tests="10" failures="1" errors="0" skipped="3"/>'
                     '</testsuites>')
    gpu_check_report.cmd_junit(str(junit))
    assert capsys.readouterr().out.strip() == "6 passed, 1 failed, 0 errors, 3 skipped"

    san = tmp_path / "memcheck.log"
    san.write_text("========= COMPUTE-SANITIZER\n========= ERROR SUMMARY: 2 errors\n")
    gpu_check_report.cmd_sanitizer(str(san))
    assert capsys.readouterr().out.strip() == "2 errors"
    # Nsight Compute's section output (the layout ncu 2025.3 printed on an H100), one kernel
    prof = tmp_path / "profile.log"
    prof.write_text(
        "==PROF== Disconnected from process 1\n"
        "  void w4a16_gemm_kernel<__half, 1, 1>(GemmParams) (32, 1, 4)x(256, 1, 1), Context 1, "
        "Stream 7, Device 0, CC 9.0\n"
        "    Section: GPU Speed Of Light Throughput\n"
        "    DRAM Throughput                   %        20.12\n"
        "    Duration                         us        12.90\n"
        "    One or More Eligible                   %        42.58\n"
        "    Eligible Warps Per Scheduler        warp         0.81\n")
    gpu_check_report.cmd_ncu(str(prof))
    assert capsys.readouterr().out.strip() == (
        "w4a16_gemm_kernel grid (32, 1, 4): 12.90 us, DRAM 20.12 %, issue 42.58 %, "
        "0.81 eligible warps/scheduler")
    # racecheck's own summary line (as compute-sanitizer 2025.3 printed it on an H100)
    san.write_text("========= RACECHECK SUMMARY: 3 hazards displayed (1 error, 2 warnings)\n")
    gpu_check_report.cmd_sanitizer(str(san))
    assert capsys.readouterr().out.strip() == "1 errors, 2 warnings (3 hazards displayed)"


def test_report_ranks_stall_samples_by_opcode(tmp_path, capsys):
    """`stalls` on an Nsight Compute source-page export (the column layout ncu 2025.3 wrote on an
    H200: a kernel-name line, then the header; per-reason columns and their "(Not Issued)"
    twins): samples summed per opcode, predicates stripped, largest first."""
    csv_path = tmp_path / "profile_source.csv"
    csv_path.write_text(
        '"Kernel Name","void k(GemmParams)",\n'
        '"Address","Source","Warp Stall Sampling (All Samples)",'
        '"Warp Stall Sampling (Not-issued Samples)","stall_barrier","stall_long_sb",'
        '"stall_math","stall_barrier (Not Issued)"\n'
        '"0x10","@!P0  BRA 0x80","30","29","28","0","2","28"\n'
        '"0x20","IMAD.WIDE R78, R27, 0x4, R78","25","25","0","24","1","0"\n'
        '"0x30","BRA 0x10","20","19","19","0","1","19"\n'
        '"0x40","HMMA.16816.F32 R36, R28, R32, R36","25","10","0","0","25","0"\n')
    gpu_check_report.cmd_stalls(str(csv_path))
    assert capsys.readouterr().out.strip() == (
        "BRA 50.0 % (barrier); IMAD.WIDE 25.0 % (long_sb); HMMA.16816.F32 25.0 % (math)")
    top = (tmp_path / "profile_source.csv.top.txt").read_text().splitlines()
    assert top[0] == "100 warp-stall samples"
    assert top[2] == " 50.0 %  BRA  barrier 47, math 3"
    assert "30.0 %  @!P0 BRA 0x80  barrier 28, math 2" in top[-4]
