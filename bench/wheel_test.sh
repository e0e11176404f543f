#!/usr/bin/env bash
# Test a built wheel, not the source tree: install it (pip --target, no deps) into a fresh
# folder put on PYTHONPATH of the Python that has the machine's torch, then run the GPU tests
# from a folder outside the checkout so `import sageattention` can only find the installed copy.
#
#   bash bench/wheel_test.sh path/to/sageattention-*.whl [pytest args...]
# Env: OUT (log folder, default ./wheel-test-logs), PYTEST_ARGS (default: the CUDA kernel tests
# and the sageattn GPU grid, -n 12 when pytest-xdist is there).
set -euo pipefail
wheel=$(readlink -f "$1"); shift
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT:-$PWD/wheel-test-logs}
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

py=${PYTHON:-python3}
"$py" -m pip install --no-deps --no-index --disable-pip-version-check -q --target "$work/site" "$wheel"
export PYTHONPATH="$work/site"
cp -r "$repo/tests" "$work/tests"
cd "$work"
"$py" - <<'EOF' | tee "$out/wheel-import.txt"
import os, sageattention
path = os.path.dirname(sageattention.__file__)
print("imported from", path)
assert path.startswith(os.environ["PYTHONPATH"]), "sageattention was not imported from the installed wheel"
EOF
"$py" -m sageattention | tee "$out/python-m-sageattention.txt"
xdist=$("$py" -c "import xdist" 2>/dev/null && echo "-n 12" || true)
args=${PYTEST_ARGS:-"tests/test_cuda.py tests/test_gpu.py -k sageattn $xdist"}
# shellcheck disable=SC2086
"$py" -m pytest -q -p no:cacheprovider $args "$@" 2>&1 | tee "$out/wheel-pytest.txt" | tail -5
exit "${PIPESTATUS[0]}"
