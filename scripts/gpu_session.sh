#!/usr/bin/env bash
# The whole GPU KV-path benchmark on a lent two-GPU machine: both shapes at once, one per GPU
# (one shape per GPU when there are two, else one after the other), in the background, so
# that no device call's 10-minute limit cuts a run of ~15 minutes. vLLM 0.26 staged in
# /root/site by ../shared/gpu/stage-vllm.sh.
#   bash scripts/gpu_session.sh start      # returns at once; the run goes on under setsid
#   bash scripts/gpu_session.sh wait 540   # up to 540 s; copies results and logs to $OUT
# Modes (gpu_native_path.py's --modes; + = at once, taking turns request by request):
# every target's two sides take turns: plain vLLM, vlmcache and vLLM's native CPU offload;
# then vLLM's native tiering alone (its capture); then both restarts beside plain vLLM again
# (the recompute a restart is judged against).
set -uo pipefail
MODES=${MODES:-vllm+vlmcache+native_cpu,native_tiering,native_tiering_restart+vlmcache_restart+vllm_repeat}
code=/root/bench-code
case "${1:-}" in
  start)
    rm -rf "$code" /root/out-* && mkdir -p "$code"
    cp -r src benchmarks scripts "$code"/  # the run reads this copy: later calls resend the tree
    ngpu=$(nvidia-smi -L | wc -l)
    gib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
    # three LLaVA engines share a GPU: on an 80 GB card each holds ~17k tokens of KV, so a
    # phase's prompts (each GPU hit finds all of them) are 16 there, 24 on a larger card
    llava_n=$([ "$gib" -ge 100000 ] && echo 24 || echo 16)
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
    df -h /root /dev/shm | tail -2
    run() {  # shape gpu n
      mkdir -p /root/out-$1
      (cd "$code" && OUT=/root/out-$1 CUDA_VISIBLE_DEVICES=$2 bash scripts/gpu_bench.sh "$1" \
        --n "$3" --modes "$MODES" --mode-timeout 1500 --gpu-memory-utilization 0.9 "${@:4}" \
        > /root/out-$1/stdout.txt 2>&1; echo $? > /root/out-$1/rc)
    }
    if [ "$ngpu" -ge 2 ]; then
      setsid bash -c "$(declare -f run); MODES='$MODES' code=$code; run llava7b 0 $llava_n" \
        < /dev/null > /dev/null 2>&1 &
      setsid bash -c "$(declare -f run); MODES='$MODES' code=$code; run qwen2vl7b 1 24" \
        < /dev/null > /dev/null 2>&1 &
    else
      setsid bash -c "$(declare -f run); MODES='$MODES' code=$code; run llava7b 0 $llava_n; \
        run qwen2vl7b 0 24" < /dev/null > /dev/null 2>&1 &
    fi
    sleep 5; echo "started: $ngpu GPU(s), llava n=$llava_n, modes $MODES"
    ;;
  wait)
    deadline=$((SECONDS + ${2:-540}))
    while [ $SECONDS -lt $deadline ]; do
      [ -f /root/out-llava7b/rc ] && [ -f /root/out-qwen2vl7b/rc ] && break
      sleep 10
    done
    for d in /root/out-*; do
      s=${d#/root/out-}
      echo "== $s rc=$(cat $d/rc 2>/dev/null || echo running)"
      grep -E "^(vllm|vlmcache|native)" "$d/stdout.txt" | cut -c1-300
      tail -n 3 "$d/stdout.txt"
      cp "$d/gpu-native-path.json" "${OUT:-/tmp}/gpu-native-path-$s.json" 2>/dev/null
      cp "$d/stdout.txt" "${OUT:-/tmp}/log-$s.txt" 2>/dev/null
    done
    nvidia-smi --query-gpu=memory.used --format=csv,noheader
    ;;
  *) echo "usage: $0 start | wait SECONDS"; exit 2 ;;
esac
