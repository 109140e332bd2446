#!/usr/bin/env bash
# Every device check of hardware/measure in one run, for a session lent a GPU (README, "Where the
# model is weakest" says what each one settles). Each script writes one JSON document to
# $OUT/NAME.json (OUT defaults to the current directory) and its errors to $OUT/NAME.err; a check
# that fails or runs past its limit leaves the others running. The limits add to 540 s, inside
# one device command (600 s).
#
#     OUT=/tmp/measured bash hardware/measure/all.sh
set -u
out="${OUT:-.}"
here="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit --format=csv > "$out/nvidia-smi.csv" 2>&1
for check in fp8_gemm:90 attention_long:180 moe_host:90 block_memory:180; do
    name="${check%%:*}" limit="${check##*:}"
    start=$(date +%s)
    timeout "$limit" python "$here/$name.py" > "$out/$name.json" 2> "$out/$name.err"
    echo "$name: rc $? in $(( $(date +%s) - start )) s"
done
