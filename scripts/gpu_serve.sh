#!/usr/bin/env bash
# The GPU serving load benchmark (benchmarks/serve_gpu.py) on a lent GPU machine, in the
# background so that no device call's 10-minute limit cuts a run; vLLM 0.26 staged in
# /root/site by ../shared/gpu/stage-vllm.sh.
#   ARGS="--phase-s 10 --drain-s 8 --pause-s 2 --ours-layout proxy --budget-s 265" \
#     bash scripts/gpu_serve.sh start "qwen2vl7b:6,10,14,18,24" "llava7b:24,36,48,60,72"
#   bash scripts/gpu_serve.sh wait 550    # up to 550 s; per-shape results and logs -> $OUT
#   ARGS_oracle="--ours-layout oracle" bash scripts/gpu_serve.sh start "llava7b:12,56@oracle" \
#     "llava7b:12,56"    # a label's runs are named SHAPE-LABEL and get ARGS_LABEL too
# Shapes run one after the other (each: both servers at once on the GPU, 0.4 of its memory
# each); a shape's file is written when it finishes. ARGS: more serve_gpu.py arguments
# (--budget-s: each shape's share of the call; see serve_gpu.py's docstring). The paraphrase tiers are on when the text
# embedder was staged in /root/emb-site (scripts/stage_embedder.sh; .gpu/emb0, .gpu/emb1).
# With .gpu/redis.tgz carried, its redis-server is on PATH (ARGS="... --proxy-workers 8").
# FRONT_WORKERS="1 8": after the shapes, benchmarks/front_capacity.py once per worker count
# on this host's CPUs (front-capacity-w<N>.json).
set -uo pipefail
code=/root/serve-code
case "${1:-}" in
  start)
    shift
    rm -rf "$code" /root/serve-out /root/serve-work-* && mkdir -p "$code" /root/serve-out
    cp -r src benchmarks scripts "$code"/
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
    cmds=""
    for job in "$@"; do
      # SHAPE:RATES, or SHAPE:RATES@LABEL: then named SHAPE-LABEL, with ARGS_LABEL's
      # arguments after ARGS (one shape run several ways in one chain)
      spec=${job%%@*} label=""; [ "$spec" != "$job" ] && label=${job#*@}
      shape=${spec%%:*} rates=${spec#*:} name=${spec%%:*}${label:+-$label}
      extra=""; [ -n "$label" ] && { v="ARGS_$label"; extra=${!v:-}; }
      cmds+="python benchmarks/serve_gpu.py --geometry benchmarks/geometries/$shape --rates $rates \
        --work /root/serve-work-$name --out /root/serve-out/serve-gpu-$name.json ${ARGS:-} $extra \
        > /root/serve-out/log-$name.txt 2>&1; echo \$? > /root/serve-out/rc-$name; "
    done
    for n in ${FRONT_WORKERS:-}; do
      cmds+="python benchmarks/front_capacity.py --model benchmarks/geometries/qwen2vl7b \
        --clients 1,16,64 --seconds 2.5 --miss-rps 500 --workers $n --gpu-highest-rate 120 \
        --device \"GPU host's CPUs ($(nproc) cores)\" --out /root/serve-out/front-capacity-w$n.json \
        > /root/serve-out/log-front-w$n.txt 2>&1; "
    done
    . scripts/gpu_redis.sh && redis_bundle /root/serve-redis  # sets path, redispy
    emb=""; [ -f /root/emb-site/.complete ] && emb=/root/emb-site:
    echo "text embedder: ${emb:-not staged (paraphrase tiers off)}"
    (cd "$code" && PATH=$path PYTHONPATH=/root/site:$redispy$emb$code/src:$code/benchmarks \
      PYTHONUNBUFFERED=1 \
      setsid bash -c "$cmds touch /root/serve-out/done" < /dev/null > /dev/null 2>&1 &)
    sleep 2; echo "started $# shape(s)"
    ;;
  wait)
    deadline=$((SECONDS + ${2:-540}))
    while [ $SECONDS -lt $deadline ] && [ ! -e /root/serve-out/done ]; do sleep 10; done
    for f in /root/serve-out/log-*.txt; do
      s=$(basename "$f" .txt); s=${s#log-}
      case "$s" in front-w*) continue ;; esac  # front_capacity's: copied below
      echo "== $s rc=$(cat /root/serve-out/rc-$s 2>/dev/null || echo running)"
      grep -E "rate |Error|error" "$f" | tail -n 12 | cut -c1-400
      cp "$f" /root/serve-out/serve-gpu-$s.json "${OUT:-/tmp}/" 2>/dev/null
      tail -c 20000 /root/serve-work-$s/ours.log > "${OUT:-/tmp}/ours-$s.log" 2>/dev/null
      tail -c 8000 /root/serve-work-$s/plain.log > "${OUT:-/tmp}/plain-$s.log" 2>/dev/null
      tail -c 8000 /root/serve-work-$s/proxy.log > "${OUT:-/tmp}/proxy-$s.log" 2>/dev/null
    done
    cp /root/serve-out/front-capacity-w*.json /root/serve-out/log-front-w*.txt \
      "${OUT:-/tmp}/" 2>/dev/null
    nvidia-smi --query-gpu=memory.used --format=csv,noheader
    ;;
  *) echo "usage: $0 start SHAPE:RATES [...] | wait SECONDS"; exit 2 ;;
esac
