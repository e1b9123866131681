"""benchmarks/bench_cpu_gemm.py runs end to end (--quick: one small shape, a few seconds)."""

import os
import subprocess
import sys

import pytest
import torch

import w4kernels  # noqa: F401

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.skipif(not hasattr(torch.ops.w4kernels, "awq_gemm"),
                                reason="w4kernels._C not built")


def _bench(*args):
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(w4kernels.__file__)))
    out = subprocess.run([sys.executable, "benchmarks/bench_cpu_gemm.py", "--quick", *args],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_bench_cpu_gemm_quick_prints_every_row():
    stdout = _bench()
    rows = [line.split() for line in stdout.splitlines() if line[:4].strip() in ("1", "16")]
    names = {" ".join(r[1:-8]) for r in rows}
    for name in ["awq_gemm bf16", "awq_gemm fp16", "w4a16 gptq bf16", "w4a16 awq-zp bf16",
                 "w4a16 act-order bf16", "kleidiai int8", "torch fp32", "torch bf16",
                 "torch int4 bf16", "w4a8 gptq bf16", "w4a8 awq-zp bf16", "awq_gemm_a8 bf16"]:
        assert name in names, stdout
    assert "read bandwidth probe" in stdout and "dispatch rule" in stdout
    # per M, the same-rounds read first; every method's %rd is its weight GB/s over that read's
    reads = {r[0]: float(r[5]) for r in rows if r[1:4] == ["read", "(same", "rounds)"]}
    assert set(reads) == {"1", "16"}, stdout
    for r in rows:
        if r[1] == "read":
            continue
        rd, wgbs, read = float(r[-5].rstrip("%")), float(r[-7]), reads[r[0]]
        assert r[-5].endswith("%") and rd > 0, r
        # %rd comes from the unrounded figures; the printed GB/s have one decimal (+-0.05 each,
        # which at --quick's ~1 GB/s moves the ratio by up to ~8 %) and %rd none (+-0.5)
        lo = 100 * max(wgbs - 0.05, 0) / (read + 0.05)
        hi = 100 * (wgbs + 0.05) / max(read - 0.05, 1e-9)
        assert lo - 0.5 - 0.01 * rd <= rd <= hi + 0.5 + 0.01 * rd, (r, reads)
    try:
        import onnxruntime  # noqa: F401
        assert "ort acc4" in names, stdout
    except ImportError:
        assert "ONNX Runtime rows skipped" in stdout


def test_bench_cpu_gemm_background_load_prints_slowdowns():
    stdout = _bench("--background-load", "1", "--methods", "awq_gemm bf16,torch bf16")
    assert "slowdown" in stdout
    assert any(line.split()[:3] == ["1", "awq_gemm", "bf16"] and line.rstrip().endswith("x")
               for line in stdout.splitlines()), stdout
    # per M, ours' largest slowdown next to torch's, judged against torch's bf16 F.linear
    verdicts = [line for line in stdout.splitlines() if line.strip().startswith("under load, M =")]
    assert len(verdicts) == 2, stdout
    assert all("(awq_gemm bf16)" in v and "torch bf16" in v and "than torch bf16)" in v
               for v in verdicts), stdout


def test_bench_cpu_gemm_isa_adds_capped_rows():
    """--isa adds awq_gemm, w4a16 and int8-mode rows run with W4K_CPU_ISA capped, in the same
    table; the int8-mode rows keep their ratio to KleidiAI (x kai)."""
    stdout = _bench("--isa", "avx2", "--methods", "awq_gemm bf16,w4a16 gptq bf16,torch bf16,"
                    "w4a8 gptq bf16,awq_gemm_a8 bf16,kleidiai int8")
    rows = [line.split() for line in stdout.splitlines() if line[:4].strip() in ("1", "16")]
    names = {" ".join(r[1:-8]) for r in rows}
    assert {"awq_gemm bf16 @avx2", "w4a16 gptq bf16 @avx2", "w4a8 gptq bf16 @avx2",
            "awq_gemm_a8 bf16 @avx2"} <= names, stdout
    assert not any("kleidiai" in n and "@" in n for n in names), stdout
    for r in rows:
        if " ".join(r[1:-8]) in ("w4a8 gptq bf16 @avx2", "awq_gemm_a8 bf16 @avx2"):
            assert r[-1] != "-", stdout  # x kai


def _bench_module():
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    try:
        import bench_cpu_gemm
    finally:
        sys.path.pop(0)
    return bench_cpu_gemm


def test_bench_cpu_gemm_copy_counts_are_integers_past_the_l3():
    """Regression: byte counts that include scale bytes are floats; the copy count (used as a
    list length and modulus) must still be an int, and the copies must exceed 4 x L3."""
    bench = _bench_module()
    nbytes = 4096 * 4096 // 2 + 32 * 4096 * 2.5
    c = bench.n_copies(nbytes, quick=False)
    assert isinstance(c, int) and c * nbytes >= 4 * bench.L3_BYTES
    assert bench.n_copies(nbytes, quick=True) == 2


def test_bench_cpu_gemm_noamx_rows():
    """--isa noamx adds rows run with W4K_CPU_AMX=0 (the vdpbf16ps paths on an AMX CPU; the
    same paths as the plain rows elsewhere)."""
    stdout = _bench("--isa", "noamx", "--methods", "awq_gemm bf16,w4a16 gptq bf16,torch bf16")
    rows = [line.split() for line in stdout.splitlines() if line[:4].strip() in ("1", "16")]
    names = {" ".join(r[1:-8]) for r in rows}
    assert {"awq_gemm bf16 @noamx", "w4a16 gptq bf16 @noamx"} <= names, stdout


def test_bench_cpu_gemm_rounds_interleave_the_methods():
    """--order rounds (the default): after one warm-up call each, every round calls each method
    once, in an order shuffled per round (so no method always follows the same one), each method
    stepping through its own copies, so slow stretches of a noisy machine fall on every method
    alike; --order blocks still runs."""
    bench = _bench_module()
    log = []
    copies = {"a": 3, "b": 2, "c": 4}
    calls = {k: ((lambda i, k=k: log.append((k, i))), c) for k, c in copies.items()}
    repeats = 8
    t = bench.time_rounds(calls, repeats=repeats)
    assert set(t) == set(copies) and all(v >= 0 for v in t.values())
    assert log[:3] == [("a", 0), ("b", 0), ("c", 0)]
    rounds = [log[3 + 3 * r: 6 + 3 * r] for r in range(repeats)]
    assert len(log) == 3 + 3 * repeats
    for r, calls_r in enumerate(rounds):
        assert sorted(calls_r) == [(k, (r + 1) % copies[k]) for k in sorted(copies)], r
    orders = {tuple(k for k, _ in calls_r) for calls_r in rounds}
    assert len(orders) > 1, orders
    assert len({calls_r[0][0] for calls_r in rounds}) > 1  # not always the same one first
    stdout = _bench("--order", "blocks", "--methods", "awq_gemm bf16,torch bf16")
    assert any(line.split()[:3] == ["1", "awq_gemm", "bf16"] for line in stdout.splitlines()), stdout


def test_bench_cpu_gemm_warm_rounds_time_the_call_after_a_call_of_the_same_method():
    """--order warm-rounds: the rounds of --order rounds, each timed call right after an untimed
    call of the same method on another copy (last touched copies // 2 rounds before), so what is
    timed follows a call of its own method, never another's; with one copy both use it."""
    bench = _bench_module()
    log = []
    copies = {"a": 4, "b": 1, "c": 5}
    clock = [0.0]
    real = bench.time.perf_counter
    bench.time.perf_counter = lambda: clock[0]
    try:
        def call(k, i):
            log.append((k, i))
            clock[0] += 1.0 if len(log) % 2 == 1 else 100.0  # warm (even) 100 s, timed 1 s
        calls = {k: ((lambda i, k=k: call(k, i)), c) for k, c in copies.items()}
        repeats = 6
        t = bench.time_rounds(calls, repeats=repeats, warm=True)
    finally:
        bench.time.perf_counter = real
    assert log[:3] == [("a", 0), ("b", 0), ("c", 0)]
    body = log[3:]
    assert len(body) == 2 * 3 * repeats
    firsts = []
    for r in range(repeats):
        pairs = [body[6 * r + 2 * j: 6 * r + 2 * j + 2] for j in range(3)]
        for (kw, iw), (kt, it) in pairs:
            assert kw == kt, pairs
            assert it == (r + 1) % copies[kt]
            assert iw == (r + 1 + copies[kt] // 2) % copies[kt]
            assert iw != it or copies[kt] == 1
        firsts.append(pairs[0][0][0])
    assert len(set(firsts)) > 1  # still shuffled per round
    # only the timed calls count (the clock moves 1 s per timed call, 100 s per warm one)
    assert t == {"a": 1.0, "b": 1.0, "c": 1.0}, t
    stdout = _bench("--order", "warm-rounds", "--methods", "awq_gemm bf16")
    rows = [line.split()[:3] for line in stdout.splitlines()]
    assert ["1", "awq_gemm", "bf16"] in rows, stdout
