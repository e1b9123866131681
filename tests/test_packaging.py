"""What a user meets before any kernel runs: the import of an unbuilt tree, the demo's command
line, and the wheel (`pip wheel --no-build-isolation .` installed into a fresh venv).

The wheel test is here rather than in .ci/run so the README's test command, which is what CI
runs, covers the packaging too. It builds with the configuration of the in-place build the
suite is testing (CUDA kernels and emulator in or out), so ninja finds every object already
compiled in build/temp.* and the wheel costs a link, a zip and a venv (seconds, not minutes).
"""

import os
import shutil
import subprocess
import sys
import zipfile

import pytest
import torch

import w4kernels
from w4kernels import __main__ as cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "python", "w4kernels")


def _clean_env(**overrides):
    """The environment of a user's shell: no PYTHONPATH pointing into this source tree."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(overrides)
    return env


def test_import_of_unbuilt_tree_says_how_to_build(tmp_path):
    """Regression: an unbuilt checkout used to fail with "cannot import name '_C' from
    partially initialized module 'w4kernels' (most likely due to a circular import)"."""
    shutil.copytree(PACKAGE, tmp_path / "w4kernels",
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    r = subprocess.run(
        [sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); import w4kernels",
         str(tmp_path)], capture_output=True, text=True, cwd=tmp_path, env=_clean_env())
    assert r.returncode == 1, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("ImportError: w4kernels is not built"), r.stderr
    assert "bash scripts/install.sh" in last and "pip install --no-build-isolation -e ." in last
    assert "circular import" not in r.stderr


# --- the demo's command line --------------------------------------------------------------

BAD_DEMO_ARGS = [
    (["--k", "4000"], "--k 4000: in_features must be a positive multiple of 128"),
    (["--k", "0"], "--k 0: in_features must be a positive multiple of 128"),
    (["--n", "1000"], "--n 1000: out_features must be a positive multiple of 64"),
    (["--m", "0"], "--m 0: the number of tokens must be at least 1"),
    (["--repeats", "0"], "--repeats 0: must be at least 1"),
    (["--dtype", "fp8"], "argument --dtype: invalid choice: 'fp8'"),
    (["--m", "x"], "argument --m: invalid int value: 'x'"),
]


@pytest.mark.parametrize("argv,message", BAD_DEMO_ARGS,
                         ids=[" ".join(argv) for argv, _ in BAD_DEMO_ARGS])
def test_demo_rejects_bad_arguments_in_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["demo", *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("python -m w4kernels demo: error: "), err
    assert message in err


def test_demo_bad_argument_from_the_shell_is_one_line_not_a_traceback():
    # The package under test (the one conftest imported), whatever installed one is elsewhere.
    tested = os.path.dirname(os.path.dirname(w4kernels.__file__))
    r = subprocess.run([sys.executable, "-m", "w4kernels", "demo", "--k", "4000"],
                       capture_output=True, text=True, env=_clean_env(PYTHONPATH=tested))
    assert r.returncode == 2
    assert r.stdout == "" and r.stderr.count("\n") == 1, r.stderr
    assert "--k 4000: in_features must be a positive multiple of 128" in r.stderr


@pytest.mark.parametrize("spelling,name", [("fp16", "fp16"), ("bf16", "bf16"),
                                           ("float16", "fp16"), ("bfloat16", "bf16")])
def test_demo_dtype_spellings(spelling, name, monkeypatch):
    """fp16 / bf16, as in benchmarks/; torch's names are accepted too."""
    seen = []

    def fake_demo(args):
        seen.append(args.dtype)
        return 0

    monkeypatch.setattr(cli, "demo", fake_demo)
    assert cli.main(["demo", "--dtype", spelling]) == 0
    assert seen == [name]


# --- the wheel ----------------------------------------------------------------------------

SMOKE = """
import sys, torch, w4kernels
from w4kernels import ops, quant, reference
assert w4kernels.__file__.startswith(sys.prefix), w4kernels.__file__  # the wheel, not the tree
w = torch.randn(256, 128)
g = quant.quantize_gptq(w, 128, act_order=True, dtype=torch.float16)
perm = torch.argsort(g.g_idx, stable=True).to(torch.int32)
assert torch.equal(ops.marlin_repack(g.qweight, perm, 256, 128),
                   reference.marlin_repack(g.qweight, perm, 256, 128))
print(w4kernels.build_info())
"""


def test_wheel_installs_into_a_fresh_venv_and_runs(tmp_path):
    try:
        import venv  # noqa: F401
    except ImportError:
        pytest.skip("this Python has no venv module, so there is no fresh venv to install into")
    info = w4kernels.build_info()
    # Same configuration as the in-place build => the same compile commands => nothing for
    # ninja to recompile. TORCH_CUDA_ARCH_LIST and MAX_JOBS come from the environment, as in
    # scripts/install.sh.
    env = _clean_env(W4K_CUDA="1" if info["cuda_kernels"] else "0",
                     W4K_SIMT="1" if info["simt_emulator"] else "0")
    dist = tmp_path / "dist"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation",
                        "--no-deps", "--disable-pip-version-check", "-w", str(dist), ROOT],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    wheels = list(dist.glob("w4kernels-*.whl"))
    assert len(wheels) == 1, os.listdir(dist)

    # A fresh venv whose only other packages are those of the environment running this test,
    # reached through a .pth file (what `--system-site-packages` does for the base Python's
    # site-packages; inside a venv that would be the wrong torch). Their .pth files are not
    # processed, so this tree's editable registration stays out. torch and numpy are
    # therefore the ones the wheel was built with and nothing is downloaded (--no-index).
    # --no-deps: pip would otherwise re-resolve torch's own requirements against that
    # environment, whose state (an old setuptools in a venv) is not what this test checks;
    # the wheel's torch requirement is checked against the running torch below instead.
    venv_dir = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv_dir)], check=True)
    python = str(venv_dir / "bin" / "python")
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True, text=True, check=True).stdout.strip()
    outer = [p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages")]
    with open(os.path.join(purelib, "outer-site-packages.pth"), "w") as f:
        f.write("".join(p + "\n" for p in outer))
    r = subprocess.run([python, "-m", "pip", "install", "--no-index", "--no-deps",
                        "--disable-pip-version-check", str(wheels[0])],
                       capture_output=True, text=True, env=_clean_env())
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    with zipfile.ZipFile(wheels[0]) as whl:
        metadata = whl.read(next(n for n in whl.namelist()
                                 if n.endswith(".dist-info/METADATA"))).decode()
    major, minor = torch.__version__.split(".")[:2]
    assert f"Requires-Dist: torch=={major}.{minor}.*" in metadata.splitlines()

    # Run outside the source tree, so only the installed wheel can be imported.
    r = subprocess.run([python, "-c", SMOKE], capture_output=True, text=True, cwd=tmp_path,
                       env=_clean_env())
    assert r.returncode == 0, r.stderr[-4000:]
    assert r.stdout.strip() == str(info), (r.stdout, info)
    r = subprocess.run([python, "-m", "w4kernels", "demo", "--k", "256", "--n", "128", "--m",
                        "3", "--repeats", "1"], capture_output=True, text=True, cwd=tmp_path,
                       env=_clean_env())
    assert r.returncode == 0, r.stderr[-4000:]
    assert "w4a16_gemm (AWQ zero points)" in r.stdout
