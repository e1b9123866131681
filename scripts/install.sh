#!/usr/bin/env bash
# Installs what w4kernels needs and builds it in place, from any fresh machine of this
# project's kind. Idempotent: a second run recompiles only what changed (ninja, in build/).
#   1. pip installs requirements.txt (the pinned torch, build and test tools);
#   2. `setup.py build_ext --inplace` compiles w4kernels._C (+ CUDA kernels when nvcc and a
#      CUDA torch are present) and w4kernels._simt into python/w4kernels/;
#   3. an editable pip install registers the package (W4K_NO_EXT=1: nothing is compiled twice).
# The full build log (with ptxas register/spill reports) is kept in build/w4kernels-build.log.
set -euo pipefail
cd "$(dirname "$0")/.."
pip_install() { python -m pip install --disable-pip-version-check --root-user-action=ignore "$@"; }
pip_install --quiet -r requirements.txt
mkdir -p build
export MAX_JOBS="${MAX_JOBS:-$(nproc)}"
if ! python setup.py build_ext --inplace > build/w4kernels-build.log 2>&1; then
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
