"""The CPU GEMMs' thread pool (csrc/cpu/w4a16_gemm_work_queue.h).

w4a16_gemm, w4a8_gemm and awq_gemm run their work items either on torch's OpenMP team or on the
library's own workers (W4K_QUEUE = auto | omp | own, read per call). Both give the same bits;
auto leaves OpenMP for the own workers when the caller had to wait for a late team thread.
"""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import golden
from conftest import backend_or_skip
from test_w4a16_gemm import OP, call, make_case
from w4kernels import ops


@pytest.fixture
def two_threads():
    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    if torch.get_num_threads() < 2:
        pytest.skip("torch runs one thread here, so every job runs inline on the caller")
    yield
    torch.set_num_threads(saved)


def _awq_operands(m, size_k, size_n, group, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    qweight = torch.randint(-2**31, 2**31 - 1, (size_k, size_n // 8), dtype=torch.int32,
                            generator=gen)
    qzeros = torch.randint(-2**31, 2**31 - 1, (size_k // group, size_n // 8), dtype=torch.int32,
                           generator=gen)
    scales = (torch.rand(size_k // group, size_n, generator=gen) * 0.01 + 1e-3).to(dtype)
    x = torch.randn(m, size_k, generator=gen).to(dtype)
    return x, qweight, scales, qzeros


def _every_op(m, dtype, seed):
    """name -> thunk: the three ops that run on the queue, on one small problem each."""
    backend_or_skip("cpu", OP)
    case = make_case(m, 1024, 448, 128, dtype, zp=True, bias=True, seed=seed)
    x, qw, s, qz = _awq_operands(m, 1024, 448, 64, dtype, seed)
    c = case
    return {
        "w4a16_gemm": lambda: call(backend_or_skip("cpu", OP), case),
        "awq_gemm": lambda: ops.awq_gemm(x, qw, s, qz, 8),
        "w4a8_gemm": lambda: ops.w4a8_gemm(c["a"], c["b_q_weight"], c["b_scales"], c["b_zeros"],
                                           None, None, 4, m, c["size_n"], c["size_k"]),
    }


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("m", [1, 4, 37])
def test_openmp_and_own_workers_same_bits(monkeypatch, two_threads, dtype, m):
    """Every item writes its own outputs in a fixed order, so the team that runs the items
    does not change a bit; each forced mode runs only on its own kind of thread."""
    thunks = _every_op(m, dtype, seed=m)
    results = {}
    for mode in ["own", "omp", "auto"]:
        monkeypatch.setenv("W4K_QUEUE", mode)
        before = ops.cpu_thread_stats()
        results[mode] = {name: f() for name, f in thunks.items()}
        after = ops.cpu_thread_stats()
        if mode == "own":
            assert after["openmp"] == before["openmp"] and after["own"] > before["own"]
        if mode == "omp":
            assert after["own"] == before["own"] and after["openmp"] > before["openmp"]
    for name in thunks:
        assert golden.same_bits(results["own"][name], results["omp"][name]), name
        assert golden.same_bits(results["own"][name], results["auto"][name]), name


# The start of the scripts the tests below run in a fresh process (auto's state is per
# process): two threads (else "SKIP"), the imports and a w4a16_gemm case of 8 work items.
_FRESH_PREAMBLE = textwrap.dedent(f"""
    import os, sys, torch
    sys.path.insert(0, {os.path.dirname(__file__)!r})
    torch.set_num_threads(2)
    if torch.get_num_threads() < 2:
        print("SKIP"); sys.exit(0)
    import golden
    from conftest import backend_or_skip
    from test_w4a16_gemm import OP, call, make_case
    from w4kernels import ops
    b = backend_or_skip("cpu", OP)
    case = make_case(1, 4096, 1024, 128, torch.bfloat16, zp=True, seed=3)
""")


def test_auto_leaves_openmp_after_a_late_team_thread():
    """A fresh process (auto's state is per process): with the test hook making the OpenMP team
    thread start 20 ms late, the caller does every item, waits at the region's end, counts the
    job late and runs the following jobs on its own workers, with the same results."""
    script = _FRESH_PREAMBLE + textwrap.dedent("""
        os.environ["W4K_QUEUE"] = "omp"  # forced modes leave auto's state alone
        expected = call(b, case)  # the team's first jobs (its threads start)
        call(b, case)
        os.environ["W4K_QUEUE"] = "auto"
        s0 = ops.cpu_thread_stats()
        os.environ["W4K_QUEUE_TEST_LATE_US"] = "20000"
        late = call(b, case)
        s1 = ops.cpu_thread_stats()
        after = [call(b, case) for _ in range(5)]
        s2 = ops.cpu_thread_stats()
        assert s1["late_openmp"] == s0["late_openmp"] + 1, (s0, s1)  # the first job of the call
        assert s2["openmp"] == s1["openmp"] and s2["own"] > s1["own"], (s1, s2)
        assert s2["late_openmp"] == s1["late_openmp"], (s1, s2)
        assert all(golden.same_bits(r, expected) for r in [late] + after)
        print("OK")
    """)
    _run_fresh(script, {})


def _run_fresh(script, extra_env):
    """Runs `script` in a new Python process (auto's state is per process), libgomp's wait
    policy left at its default unless extra_env sets it."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("W4K_QUEUE") and k != "OMP_WAIT_POLICY"}
    env.update(extra_env)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    if out.stdout.strip() == "SKIP":
        pytest.skip("torch runs one thread here, so every job runs inline on the caller")
    if out.stdout.strip() == "SKIP-CPUS":
        pytest.skip("this process may run on one CPU only, so there is no other CPU to steer to")
    assert out.stdout.strip().endswith("OK"), out.stdout
    return out.stdout


def test_auto_uses_own_workers_under_passive_openmp():
    """OMP_WAIT_POLICY=passive: OpenMP's threads sleep after every region, so auto runs every
    job on the own workers (same bits as forced OpenMP)."""
    script = _FRESH_PREAMBLE + textwrap.dedent("""
        os.environ["W4K_QUEUE"] = "omp"
        expected = call(b, case)
        os.environ["W4K_QUEUE"] = "auto"
        s0 = ops.cpu_thread_stats()
        out = [call(b, case) for _ in range(3)]
        s1 = ops.cpu_thread_stats()
        assert s1["openmp"] == s0["openmp"] and s1["own"] > s0["own"], (s0, s1)
        assert all(golden.same_bits(r, expected) for r in out)
        print("OK")
    """)
    _run_fresh(script, {"OMP_WAIT_POLICY": "PASSIVE"})


def test_late_openmp_job_gives_the_same_bits(monkeypatch, two_threads):
    """Forced OpenMP with a team thread 5 ms late: the caller claims every item itself, the late
    thread finds none; the result is the normal one."""
    thunks = _every_op(4, torch.bfloat16, seed=9)
    monkeypatch.setenv("W4K_QUEUE", "own")
    expected = {name: f() for name, f in thunks.items()}
    monkeypatch.setenv("W4K_QUEUE", "omp")
    monkeypatch.setenv("W4K_QUEUE_TEST_LATE_US", "5000")
    for name, f in thunks.items():
        assert golden.same_bits(f(), expected[name]), name


_STEER_SCRIPT = _FRESH_PREAMBLE + textwrap.dedent("""
    import time
    if len(os.sched_getaffinity(0)) < 2:
        print("SKIP-CPUS"); sys.exit(0)
    def masks():
        out = {}
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/status") as f:
                out[tid] = [l for l in f if l.startswith("Cpus_allowed_list")][0].split()[1]
        return out
    usual = masks()[str(os.getpid())]  # the main thread's, which every thread inherits
    os.environ["W4K_QUEUE"] = "omp"
    expected = call(b, case)
    os.environ["W4K_QUEUE"] = "own"
    call(b, case)  # the worker starts: at the first job of this call it is not asleep yet
    s0 = ops.cpu_thread_stats()
    out = []
    for _ in range(4):
        time.sleep(0.02)  # the worker (W4K_QUEUE_SPIN_US=0: no poll) is asleep at each call
        out.append(call(b, case))
    s1 = ops.cpu_thread_stats()
    assert all(golden.same_bits(r, expected) for r in out)
    time.sleep(0.05)  # the worker restores its mask after its last item
    after = masks()
    assert all(m == usual for m in after.values()), (usual, after)
    print("STEERED", s1["steered_wakes"] - s0["steered_wakes"])
    print("OK")
""")


@pytest.mark.parametrize("steer", ["default", "0"])
def test_woken_worker_is_steered_off_the_callers_cpu(steer):
    """A worker woken from its sleep gets the caller's CPU taken out of its mask for the job
    (the scheduler cannot queue it behind the caller) and has its mask back afterwards, every
    thread of the process as it was; W4K_QUEUE_STEER=0 turns it off. Same bits either way."""
    if not sys.platform.startswith("linux"):
        pytest.skip("steering uses Linux CPU masks (pthread_setaffinity_np)")
    env = {"W4K_QUEUE_SPIN_US": "0"}
    if steer == "0":
        env["W4K_QUEUE_STEER"] = "0"
    stdout = _run_fresh(_STEER_SCRIPT, env)
    lines = stdout.split()
    steered = int(lines[lines.index("STEERED") + 1])
    # Every one of the 4 calls runs its jobs with the worker asleep at the first one.
    assert (steered >= 4) if steer == "default" else (steered == 0), stdout


@pytest.mark.parametrize("mode", ["own", "omp"])
def test_an_item_that_throws_fails_the_job_with_its_message(monkeypatch, two_threads, mode):
    """The KleidiAI activation quantizer checks its rows per piece, on whichever thread runs the
    piece: a bad row in the last piece fails the call with the check's message (rethrown on the
    caller, the other pieces finished or skipped), and the queue runs the next job normally."""
    monkeypatch.setenv("W4K_QUEUE", mode)
    gen = torch.Generator().manual_seed(12)
    x = torch.randn(300, 64, generator=gen)  # 300 rows: pieces of >= 256 rows -> 2 pieces
    expected = ops.lhs_quant_pack_qai8dxp_f32(x)
    bad = x.clone()
    bad[290, 7] = float("nan")
    for _ in range(3):
        with pytest.raises(RuntimeError, match=r"lhs_quant_pack_qai8dxp_f32: lhs must hold "
                                               r"finite values .* got lhs\[290, 7\] = nan"):
            ops.lhs_quant_pack_qai8dxp_f32(bad)
        assert golden.same_bits(ops.lhs_quant_pack_qai8dxp_f32(x), expected)
