#!/usr/bin/env bash
# Test a built wheel, not the source tree: install it (pip --target, no deps) into a fresh
# folder put on PYTHONPATH of the Python that has the machine's torch, then run the GPU tests
# from a folder outside the checkout so `import sageattention` can only find the installed copy.
#
#   bash bench/wheel_test.sh path/to/sageattention-*.whl [pytest args...]
# Env: OUT (log folder, default ./wheel-test-logs), PYTEST_ARGS (one pytest run with these
# arguments instead of the default two: the CUDA kernel tests and the sageattn GPU grid, then the
# FP4 package, dispatch and validation tests; -n 12 when pytest-xdist is there).
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
# the dispatch tests hold the hand-over limits to the measured runs in bench/results, weighed by
# bench/route_check.py (and the bench tests load other bench scripts): the scripts and the records,
# never the package
mkdir -p "$work/bench" && cp -r "$repo/bench/results" "$work/bench/results" && cp "$repo"/bench/*.py "$work/bench/"
cd "$work"
"$py" - <<'EOF' | tee "$out/wheel-import.txt"
import os, sageattention
path = os.path.dirname(sageattention.__file__)
print("imported from", path)
assert path.startswith(os.environ["PYTHONPATH"]), "sageattention was not imported from the installed wheel"
EOF
"$py" -m sageattention | tee "$out/python-m-sageattention.txt"
xdist=$("$py" -c "import xdist" 2>/dev/null && echo "-n 12" || true)
if [[ -n "${PYTEST_ARGS:-}" ]]; then
  sets=("$PYTEST_ARGS")
else
  sets=("tests/test_cuda.py tests/test_gpu.py -k sageattn $xdist"
        "tests/test_fp4.py tests/test_fp4_blackwell.py tests/test_dispatch.py tests/test_validation.py -rs $xdist")
fi
status=0
: > "$out/wheel-pytest.txt"
for set in "${sets[@]}"; do
  echo "== pytest $set" | tee -a "$out/wheel-pytest.txt"
  # shellcheck disable=SC2086
  "$py" -m pytest -q -p no:cacheprovider $set "$@" 2>&1 | tee -a "$out/wheel-pytest.txt" | tail -3
  [[ "${PIPESTATUS[0]}" == 0 ]] || status=1
done
exit "$status"
