#!/usr/bin/env bash
# The device checks of hardware/measure in one run, for a session lent a GPU (README, "Where the
# model is weakest" says what each one settles). Each script writes one JSON document to
# $OUT/NAME.json (OUT defaults to the current directory) and its errors to $OUT/NAME.err; a check
# that fails or runs past its limit leaves the others running. The default checks come in the
# order of the issue's criteria they bear on (the host time of small MoE layers and the pipelined
# memory first) and their limits add to 560 s, inside one device command (600 s); checks named as
# NAME:LIMIT arguments run instead (block_memory:180 is the one left out of the default run).
#
#     OUT=/tmp/measured bash hardware/measure/all.sh
#     OUT=/tmp/measured bash hardware/measure/all.sh block_memory:180
set -u
out="${OUT:-.}"
here="$(cd "$(dirname "$0")" && pwd)"
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total,power.limit --format=csv > "$out/nvidia-smi.csv" 2>&1
checks=("$@")
[ ${#checks[@]} -eq 0 ] && checks=(moe_host:90 pp_stage_memory:230 fp8_gemm:70 attention_long:170)
for check in "${checks[@]}"; do
    name="${check%%:*}" limit="${check##*:}"
    start=$(date +%s)
    timeout "$limit" python "$here/$name.py" > "$out/$name.json" 2> "$out/$name.err"
    echo "$name: rc $? in $(( $(date +%s) - start )) s"
done
