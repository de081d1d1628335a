#!/usr/bin/env bash
# The video benchmark (benchmarks/video.py) on a lent GPU machine, in the background so that
# no device call's 10-minute limit cuts it; vLLM 0.26 staged in /root/site by
# ../shared/gpu/stage-vllm.sh.
#   bash scripts/gpu_video.sh start [video.py arguments]   # returns at once
#   bash scripts/gpu_video.sh wait 540                      # up to 540 s; result, logs -> $OUT
set -uo pipefail
code=/root/video-code out=/root/video-out
case "${1:-}" in
  start)
    shift
    rm -rf "$code" "$out" /root/video-work && mkdir -p "$code" "$out"
    cp -r src benchmarks scripts "$code"/
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
    printf '%q ' "$@" > "$out/args"
    (cd "$code" && PYTHONPATH=/root/site:$code/src:$code/benchmarks PYTHONUNBUFFERED=1 \
      setsid bash -c "python benchmarks/video.py --work /root/video-work \
        --out $out/video.json $(cat "$out/args") > $out/log.txt 2>&1; echo \$? > $out/rc" \
      < /dev/null > /dev/null 2>&1 &)
    sleep 2; echo "started"
    ;;
  wait)
    deadline=$((SECONDS + ${2:-540}))
    while [ $SECONDS -lt $deadline ] && [ ! -e "$out/rc" ]; do sleep 5; done
    echo "rc=$(cat "$out/rc" 2>/dev/null || echo running)"
    tail -n 25 "$out/log.txt" | cut -c1-400
    ls /root/video-work/*/ 2>/dev/null
    cp "$out/log.txt" "$out/video.json" "${OUT:-/tmp}/" 2>/dev/null
    for f in /root/video-work/*/*.log; do
      k=$(basename "$(dirname "$f")"); tail -c 12000 "$f" > "${OUT:-/tmp}/$k-$(basename "$f")"
    done
    ;;
  *) echo "usage: $0 start [video.py arguments] | wait SECONDS"; exit 2 ;;
esac
