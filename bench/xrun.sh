#!/usr/bin/env bash
# Kernel experiments in one device call: builds a standalone harness against one or more
# copies of the kernel sources and times each on a few shapes, in interleaved rounds.
#   HARNESS=attn (default) | quant
#                               attn: bench/sm90_harness.cu with dir/attn_sm90{_host,_d64,_d128}.cu
#                               quant: bench/quant_harness.cu with dir/quant_qkv.cu and the attn files
#   VARS="name:dir:flags ..."   dir holds those sources; flags are comma-separated,
#                               e.g. -DSAGE_SM90_POLY128=4
#   REPS=N                      rounds over the variants (default 2)
#   CFGS='"..." ...'            the harness's arguments per shape (defaults below)
# e.g. OUT=/tmp/x VARS="cur:csrc/kernels: p4:csrc/kernels:-DSAGE_SM90_POLY128=4" bash bench/xrun.sh
OUT=${OUT:-/tmp/xout}; mkdir -p "$OUT"
FL="-O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -DSAGE_SM90 -DSAGE_FP8 -Icsrc/kernels"
for vv in $VARS; do IFS=: read -r n d f <<< "$vv"
  if [ "${HARNESS:-attn}" = quant ]; then srcs="bench/quant_harness.cu $d/quant_qkv.cu $d/attn_sm90_host.cu $d/attn_sm90_d64.cu $d/attn_sm90_d96.cu $d/attn_sm90_d128.cu $d/attn_sm90_d192.cu $d/attn_sm90_d256.cu"
  else srcs="bench/sm90_harness.cu $d/attn_sm90_host.cu $d/attn_sm90_d64.cu $d/attn_sm90_d96.cu $d/attn_sm90_d128.cu $d/attn_sm90_d192.cu $d/attn_sm90_d256.cu"; fi
  (nvcc $FL ${f//,/ } $srcs -o "$OUT/h_$n" > "$OUT/build_$n.log" 2>&1 || echo "build $n failed") &
done; wait
if [ "${HARNESS:-attn}" = quant ]; then  # D B H N [v_full] [iters]
  DEFAULT_CFGS='"128 4 32 1024" "128 4 32 2048" "128 4 32 4096" "128 4 32 16384" "64 4 32 1024"'
  ITERS=""
else  # D B H N causal [iters 20]
  DEFAULT_CFGS='"128 1 32 16384 0" "128 4 32 4096 0" "128 4 32 1024 0" "64 1 32 16384 0" "128 1 32 16384 1"'
  ITERS=20
fi
eval "cfgs=(${CFGS:-$DEFAULT_CFGS})"
for rep in $(seq "${REPS:-2}"); do
  for vv in $VARS; do IFS=: read -r n d f <<< "$vv"; [ -x "$OUT/h_$n" ] || continue
    for cfg in "${cfgs[@]}"; do echo "$n $("$OUT/h_$n" $cfg $ITERS)"; done
  done
done
