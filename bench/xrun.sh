#!/usr/bin/env bash
# Kernel experiments in one device call: builds bench/sm90_harness.cu against one or more
# copies of the sm90 kernel sources and times each on a few shapes, in interleaved rounds.
#   VARS="name:dir:flags ..."   dir holds attn_sm90{.cuh,_host.cu,_d64.cu,_d128.cu};
#                               flags are comma-separated, e.g. -DSAGE_SM90_POLY128=4
#   REPS=N                      rounds over the variants (default 2)
#   CFGS='"D B H N causal" ...' (default: D=128 at 16k, 4k, 1k; D=64 at 16k; causal 16k)
# e.g. OUT=/tmp/x VARS="cur:csrc/kernels: p4:csrc/kernels:-DSAGE_SM90_POLY128=4" bash bench/xrun.sh
OUT=${OUT:-/tmp/xout}; mkdir -p "$OUT"
FL="-O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -DSAGE_SM90 -DSAGE_FP8 -Icsrc/kernels"
for vv in $VARS; do IFS=: read -r n d f <<< "$vv"
  (nvcc $FL ${f//,/ } bench/sm90_harness.cu "$d"/attn_sm90_host.cu "$d"/attn_sm90_d64.cu "$d"/attn_sm90_d128.cu \
     -o "$OUT/h_$n" > "$OUT/build_$n.log" 2>&1 || echo "build $n failed") &
done; wait
DEFAULT_CFGS='"128 1 32 16384 0" "128 4 32 4096 0" "128 4 32 1024 0" "64 1 32 16384 0" "128 1 32 16384 1"'
eval "cfgs=(${CFGS:-$DEFAULT_CFGS})"
for rep in $(seq "${REPS:-2}"); do
  for vv in $VARS; do IFS=: read -r n d f <<< "$vv"; [ -x "$OUT/h_$n" ] || continue
    for cfg in "${cfgs[@]}"; do echo "$n $("$OUT/h_$n" $cfg 20)"; done
  done
done
