#!/usr/bin/env bash
# Installs what w4kernels needs and builds it in place (editable), from any fresh machine of
# this project's kind. Idempotent: a second run only rebuilds what changed.
# The full build log (with ptxas register/spill reports) is kept in build/w4kernels-build.log.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install --quiet --disable-pip-version-check --root-user-action=ignore -r requirements.txt
mkdir -p build
export MAX_JOBS="${MAX_JOBS:-$(nproc)}"
if ! python -m pip install --disable-pip-version-check --root-user-action=ignore --no-build-isolation --no-deps -v -e . \
        > build/w4kernels-build.log 2>&1; then
    tail -n 80 build/w4kernels-build.log
    echo "install.sh: build failed; full log in build/w4kernels-build.log" >&2
    exit 1
fi
python - <<'PY'
import w4kernels
print(f"w4kernels built: {w4kernels.build_info()}")
PY
# ptxas reports, one line per kernel and architecture; spills must stay at zero.
grep -E "spill stores|Compiling entry function" build/w4kernels-build.log | sed 's/^ *//' | paste - - \
    | sed -E 's/ptxas info *: *//g' | head -n 200 || true
