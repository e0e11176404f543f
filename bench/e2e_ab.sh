#!/usr/bin/env bash
# End to end A/B of two versions of the kernel sources in one device call: `sageattn`'s
# kernels with their quantization, through bench/bench.py, rather than the kernel alone
# (bench/xrun.sh). Run it from a tree that is already built in place (device_run.sh's build
# step): that tree is "new". "old" is a copy of it, outside the tree, with the files of
# OLD_FILES laid over csrc/kernels/ and rebuilt. bench.py then runs in alternating processes,
# old, new, new, old, ... so that neither is always the one timed on a warmer board. Each
# variant runs its own copy of bench.py, which puts its own tree first on sys.path.
#   OLD_FILES=dir     files to lay over csrc/kernels/ in the copy (e.g. the old attn_sm90.cuh,
#                     carried as an untracked folder)
#   ROUNDS=N          old/new pairs (default 2; the order flips every round)
#   AB_ARGS="..."     bench.py's arguments (default: the D=128 acceptance shapes, cuda_sm90
#                     beside cuDNN, 3 repeats); each set is a separate process per variant,
#                     sets separated by ';'
#   OUT               logs, each run's JSON and summary.md (bench/ab_summary.py)
# e.g. OUT=$OUT/ab OLD_FILES=_ab_old bash bench/e2e_ab.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-device-out/ab}
OLD_FILES=${OLD_FILES:?OLD_FILES: a folder of files to lay over csrc/kernels/ in the old copy}
ABDIR=${ABDIR:-/tmp/sageattn-ab-old}
AB_ARGS=${AB_ARGS:-"--n 4096 16384 --d 128 --no-causal --backends cuda_sm90 sdpa_cudnn --repeats 3;--n 16384 --d 128 --causal-only --backends cuda_sm90 sdpa_cudnn --repeats 3"}
mkdir -p "$OUT"
compgen -G "sageattention/_qattn_sm90*.so" >/dev/null || { echo "build this tree first (device_run.sh STEPS=build)"; exit 1; }
t0=$(date +%s)
rm -rf "$ABDIR" && mkdir -p "$ABDIR"
# the sources only: the copy builds its own objects (torch's build.ninja names absolute paths)
tar --exclude=./build --exclude=./.git --exclude="./${OUT#./}" --exclude='*.so' -cf - . | tar -xf - -C "$ABDIR"
cp -r "$OLD_FILES"/. "$ABDIR/csrc/kernels/"
source bench/libstdcxx_env.sh
echo "old copy: $(find "$OLD_FILES" -type f | wc -l) file(s) of $OLD_FILES laid over csrc/kernels/; building"
(cd "$ABDIR" && python setup.py build_ext --inplace >"$OUT/build_old.log" 2>&1) || { tail -30 "$OUT/build_old.log"; exit 1; }
echo "[$(( $(date +%s) - t0 ))s] old built"
IFS=';' read -ra sets <<< "$AB_ARGS"
for r in $(seq "${ROUNDS:-2}"); do
  order="old new"; (( r % 2 == 0 )) && order="new old"
  for v in $order; do
    tree=$PWD; [[ $v == old ]] && tree=$ABDIR
    for i in "${!sets[@]}"; do
      # shellcheck disable=SC2086
      python "$tree/bench/bench.py" ${sets[$i]} --out "$OUT/$v-r$r-s$i" >"$OUT/$v-r$r-s$i.log" 2>&1 \
        || { echo "bench failed: $v round $r set $i"; tail -20 "$OUT/$v-r$r-s$i.log"; }
    done
    echo "[$(( $(date +%s) - t0 ))s] round $r $v done"
  done
done
python bench/ab_summary.py "$OUT" | tee "$OUT/summary.md"
