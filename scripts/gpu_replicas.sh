#!/usr/bin/env bash
# Issue 35's multi-GPU benchmarks on the lent 2-GPU machine, in the background so that no
# device call's 10-minute limit cuts a run; vLLM 0.26 staged in /root/site by
# ../shared/gpu/stage-vllm.sh (the .gpu/q* parts):
#   replicas: benchmarks/replicas_gpu.py (1 replica vs 2 round robin vs 2 affinity behind
#             vlmcache proxy; one Redis from .gpu/redis.tgz, scripts/bundle_redis.sh, when it
#             is carried and runs, else one shared store directory) -> replicas-gpu.json
#   tp2:      benchmarks/tp_restart.py (TP=2 engine, restart, then TP=1 on the same store)
#             -> tp2-gpu.json
#   bash scripts/gpu_replicas.sh start replicas   # returns at once (or: start tp2)
#   bash scripts/gpu_replicas.sh wait 520         # up to 520 s; JSON and logs -> $OUT
# Jobs given together run one after the other. The paraphrase tiers are on where MiniLM was
# staged in /root/emb-site (scripts/stage_embedder.sh: .gpu/emb0, .gpu/emb1), as in
# gpu_serve.sh. SHAPE: a folder of benchmarks/geometries (default llava7b); ARGS / TP_ARGS:
# more replicas_gpu.py / tp_restart.py arguments.
set -uo pipefail
# NVLink multicast stays off (the lent machines' rule; kept even if the image sets them),
# and vLLM's symmetric-memory all-reduce (TP=2) with it
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 \
  VLLM_ALLREDUCE_USE_SYMM_MEM=0
code=/root/multi-code out=/root/multi-out
case "${1:-}" in
  start)
    shift
    [ $# -gt 0 ] || set -- replicas
    if [ -e /root/multi-run.pid ]; then  # an earlier call's run on a still-warm machine
      kill -- -"$(cat /root/multi-run.pid)" 2>/dev/null; rm -f /root/multi-run.pid
    fi
    rm -rf "$code" "$out" /root/multi-work-* /root/redis && mkdir -p "$code" "$out"
    cp -r src benchmarks scripts "$code"/
    . scripts/gpu_redis.sh && redis_bundle /root  # sets path, redispy (else: one store dir)
    emb=""; [ -f /root/emb-site/.complete ] && emb=/root/emb-site:  # scripts/stage_embedder.sh
    echo "text embedder: ${emb:-not staged (paraphrase tiers off)}"
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
    geo=benchmarks/geometries/${SHAPE:-llava7b}
    cmds=""
    for job in "$@"; do
      case "$job" in
        replicas) cmds+="python benchmarks/replicas_gpu.py --geometry $geo --gpus 0,1 \
          --work /root/multi-work-replicas --out $out/replicas-gpu.json ${ARGS:-} \
          > $out/log-replicas.txt 2>&1; echo \$? > $out/rc-replicas; " ;;
        tp2) cmds+="python benchmarks/tp_restart.py --geometry $geo --tp 2 \
          --work /root/multi-work-tp2 --out $out/tp2-gpu.json ${TP_ARGS:-} \
          > $out/log-tp2.txt 2>&1; echo \$? > $out/rc-tp2; " ;;
        *) echo "unknown job $job (replicas, tp2)"; exit 2 ;;
      esac
    done
    (cd "$code" && PATH=$path PYTHONPATH=/root/site:$redispy$emb$code/src:$code/benchmarks \
      PYTHONUNBUFFERED=1 setsid bash -c "$cmds touch $out/done" < /dev/null > /dev/null 2>&1 &
     echo $! > /root/multi-run.pid)
    sleep 2; echo "started: $*"
    ;;
  wait)
    deadline=$((SECONDS + ${2:-520}))
    while [ $SECONDS -lt $deadline ] && [ ! -e $out/done ]; do sleep 10; done
    for f in $out/log-*.txt; do
      [ -e "$f" ] || continue
      j=$(basename "$f" .txt); j=${j#log-}
      echo "== $j rc=$(cat $out/rc-$j 2>/dev/null || echo running)"
      grep -E "arm |phase |Error|error" "$f" | tail -n 20 | cut -c1-400
      cp "$f" "${OUT:-/tmp}/"
    done
    cp $out/*.json "${OUT:-/tmp}/" 2>/dev/null
    for f in /root/multi-work-*/*.log; do  # each server's and proxy's own log (tails)
      [ -e "$f" ] || continue
      d=$(basename "$(dirname "$f")"); d=${d#multi-work-}
      tail -c 20000 "$f" > "${OUT:-/tmp}/$d-$(basename "$f")"
    done
    nvidia-smi --query-gpu=memory.used --format=csv,noheader
    ;;
  *) echo "usage: $0 start [replicas] [tp2] | wait SECONDS"; exit 2 ;;
esac
