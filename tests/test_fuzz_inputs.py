"""Issue 8, item 8: the single-mutation fuzzer (tests/fuzz_inputs.py) over every op of both
namespaces, in subprocess shards: a crash or a hang fails this test naming the case instead of
killing pytest. Each case must give a clean error naming the mutated argument (the same message
on meta tensors) or a result equal to the reference; see the fuzzer's docstring for the rules.

The default sweep (about 920 cases, two shards run side by side) takes 5-25 s on this project's
2-core machine, depending on its load; W4K_FUZZ_FULL=1 runs the full sweep (about 2,400 cases:
every dtype, more sizes and integers, transposed views, non-finite fills; 15-30 s)."""

import json
import os
import subprocess
import sys

import pytest

import w4kernels

FULL = os.environ.get("W4K_FUZZ_FULL") == "1"
SHARDS = 4 if FULL else 2
TIMEOUT_S = 1800 if FULL else 300
FUZZER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fuzz_inputs.py")


def _env():
    """The shards import the same w4kernels as this process."""
    env = dict(os.environ)
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(w4kernels.__file__)))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    return env


def _parse(stdout):
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def _run_shards(shards, extra_env=None):
    """Runs the fuzzer in `shards` concurrent subprocesses: (failures, number of cases run)."""
    args = ["--full"] if FULL else []
    env = {**_env(), **(extra_env or {})}
    procs = [subprocess.Popen([sys.executable, FUZZER, str(i), str(shards)] + args,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for i in range(shards)]
    failures, total = [], 0
    for i, proc in enumerate(procs):
        try:
            out, err = proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        lines = _parse(out)
        started = [line["start"] for line in lines if "start" in line]
        if proc.returncode != 0 or not lines or "done" not in lines[-1]:
            failures.append(f"shard {i} ended with exit status {proc.returncode} in case "
                            f"{started[-1] if started else '(none)'}: {err[-1500:]}")
        for r in lines:
            if "case" in r:
                total += 1
                if r["problems"]:
                    failures.append(f"{r['case']}: {'; '.join(r['problems'])} "
                                    f"({r.get('error', 'accepted')})")
    return failures, total


def test_fuzz_inputs():
    failures, total = _run_shards(SHARDS)
    assert not failures, f"{len(failures)} of {total} cases failed:\n" + "\n".join(failures)
    assert total >= (2000 if FULL else 800)


def test_a_crash_fails_the_test_and_names_the_case():
    """The harness itself: a shard that dies (here by abort at case 3, as a segfault would)
    is reported with the case it was running; the cases before it still count."""
    failures, total = _run_shards(1, {"W4K_FUZZ_ABORT_AT": "3"})
    assert total == 3 and len(failures) == 1, failures
    assert "shard 0 ended with exit status -6 in case w4kernels::" in failures[0]
