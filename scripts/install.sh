#!/usr/bin/env bash
# Installs what w4kernels needs and builds it in place, from any fresh machine of this
# project's kind. Idempotent: a second run recompiles only what changed (ninja, in build/).
#   1. torch: an installed torch >= TORCH_MIN (setup.py) is kept; the version pinned in
#      requirements.txt is installed only when torch is missing. W4K_TORCH=<version> (or any
#      pip requirement, e.g. W4K_TORCH=torch==2.11.0) installs that torch instead.
#   2. pip installs the rest of requirements.txt (build and test tools).
#   3. `setup.py build_ext --inplace` compiles w4kernels._C (+ CUDA kernels when nvcc and a
#      CUDA torch are present) and w4kernels._simt into python/w4kernels/, printing one line
#      per compiled translation unit;
#   4. an editable pip install registers the package (W4K_NO_EXT=1: nothing is compiled twice).
# The full build log (with ptxas register/spill reports) is kept in build/w4kernels-build.log.
set -euo pipefail
cd "$(dirname "$0")/.."
pip_install() { python -m pip install --disable-pip-version-check --root-user-action=ignore "$@"; }

TORCH_MIN=$(sed -nE 's/^TORCH_MIN = "([0-9.]+)".*/\1/p' setup.py)
TORCH_PIN=$(grep -E '^torch==' requirements.txt)
installed=$(python -c "import torch; print(torch.__version__)" 2>/dev/null || true)
if [[ -n "${W4K_TORCH:-}" ]]; then
    [[ "$W4K_TORCH" =~ ^[0-9] ]] && req="torch==$W4K_TORCH" || req="$W4K_TORCH"
    echo "install.sh: installing $req (W4K_TORCH; torch before: ${installed:-none})"
    pip_install --quiet "$req"
elif [[ -z "$installed" ]]; then
    echo "install.sh: no torch found, installing $TORCH_PIN (requirements.txt)"
    pip_install --quiet "$TORCH_PIN"
elif python - "$TORCH_MIN" <<'PY'
import re, sys, torch
have = tuple(int(x) for x in re.findall(r"\d+", torch.__version__)[:2])
sys.exit(have < tuple(int(x) for x in sys.argv[1].split(".")))
PY
then
    echo "install.sh: keeping torch $installed (supported: >= $TORCH_MIN; W4K_TORCH=<version> installs another)"
else
    echo "install.sh: torch $installed is older than $TORCH_MIN, the oldest the build supports;" \
         "upgrade it, or let install.sh replace it: W4K_TORCH=${TORCH_PIN#torch==} bash scripts/install.sh" >&2
    exit 1
fi
# Everything but torch (handled above); pip leaves what is already satisfied alone.
pip_install --quiet -r <(grep -vE '^torch([^A-Za-z0-9_.-]|$)' requirements.txt)

mkdir -p build
export MAX_JOBS="${MAX_JOBS:-$(nproc)}"
echo "install.sh: compiling (4-7 min on 2 cores with the CUDA kernels, about 1 min without; a" \
     "rerun compiles only what changed); full log: build/w4kernels-build.log"
# The whole output goes to the log; ninja's "[i/n elapsed] <command>" lines, one per finished
# translation unit, reach the terminal shortened to "[i/n elapsed] <source file>".
set +e
PYTHONUNBUFFERED=1 python setup.py build_ext --inplace 2>&1 | tee build/w4kernels-build.log \
    | sed -nuE -e "s#^(\[[0-9]+/[0-9]+[^]]*\]) .* -c ([^ ]+) -o .*#  \1 \2#p" \
                -e 's#^(ninja: no work to do.*)#  \1#p' -e 's#^(w4kernels: .*)#  \1#p' \
    | sed -u "s#$PWD/##"
status=${PIPESTATUS[0]}
set -e
if [[ $status -ne 0 ]]; then
    tail -n 80 build/w4kernels-build.log
    echo "install.sh: build failed; full log in build/w4kernels-build.log" >&2
    exit 1
fi
W4K_NO_EXT=1 pip_install --quiet --no-build-isolation --no-deps -e .
python - <<'PY'
import w4kernels
print(f"w4kernels built: {w4kernels.build_info()}")
PY
# ptxas reports, one line per kernel and architecture; spills must stay at zero.
grep -E "spill stores|Compiling entry function" build/w4kernels-build.log | sed 's/^ *//' | paste - - \
    | sed -E 's/ptxas info *: *//g' | head -n 200 || true
