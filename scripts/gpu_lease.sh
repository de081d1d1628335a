#!/usr/bin/env bash
# One 2-GPU lease for issues 34 and 35, in three device calls after staging (vLLM 0.26 in
# /root/site from .gpu/q*, MiniLM in /root/emb-site from .gpu/emb*, .gpu/redis.tgz carried):
#   bash scripts/gpu_lease.sh tp2        # TP=2 restart (both GPUs); then starts the pair below
#   bash scripts/gpu_lease.sh pair       # waits: video bench on GPU 0 beside the serving load
#                                        # bench on GPU 1; then starts the replicas bench
#   bash scripts/gpu_lease.sh replicas   # waits for the replicas bench
# On a 1-GPU machine (2-GPU kinds withheld) the same runs go one after the other:
#   bash scripts/gpu_lease.sh one-serve   # the serving load bench (both shapes), waits
#   bash scripts/gpu_lease.sh serve-wait  # a later call: waits for it again, brings it back
#     (SERVE_SHAPES jobs may carry @LABEL, with ARGS_LABEL exported: gpu_serve.sh; e.g.
#     ARGS_oracle="--ours-layout oracle" SERVE_SHAPES="llava7b:12,56@oracle llava7b:12,56")
#   bash scripts/gpu_lease.sh one-video   # waits for it, then the video bench, waits
#   bash scripts/gpu_lease.sh video       # the video bench alone (no serving run before it)
#   bash scripts/gpu_lease.sh one-front   # waits for video; front_capacity (FRONT_WORKERS)
#   bash scripts/gpu_lease.sh one-diag    # waits for video; the serving bench again on one
#                                         # shape per DIAG_CONFIGS entry (ours' config varied)
# Each step waits at most WAIT_S (default 540) and leaves at most 8 files in $OUT (logs in
# one tarball). VIDEO_ARGS / SERVE_ARGS / SERVE_SHAPES / REPLICAS_ARGS override the runs.
set -uo pipefail
export PYTHONPATH=/root/site
wait_s=${WAIT_S:-540}
video_args=${VIDEO_ARGS:-"--model benchmarks/geometries/qwen2vl7b --dummy-weights \
  --shape qwen2vl7b-h200 --frames 60 --clips 6 --stream-requests 8 --image-frames 0 \
  --max-model-len 16384 --max-num-batched-tokens 16384 --gpu-memory-utilization 0.4 \
  --turns paired"}
# --proxy-workers 8: the front's one-process ceiling (~50 req/s) was ours' cap in the
# 2026-11-28 run. Rates of the fourth 2026-11-29 run (serve-gpu.json: plain peaked at 70
# on LLaVA and 56 on Qwen, ours at 84 / 72); no --budget-s: it skipped the high rates when
# a fresh machine's first start took 4 minutes (the run then spans two device calls)
serve_args=${SERVE_ARGS:-"--phase-s 10 --drain-s 8 --pause-s 2 --ours-layout proxy \
  --proxy-workers 8"}
serve_shapes=${SERVE_SHAPES:-"llava7b:12,56,70,84,98,112 qwen2vl7b:8,40,48,56,72,80,88"}
# one-diag: DIAG_SHAPE (default llava7b:12,56) once per DIAG_CONFIGS entry (NAME=JSON,
# space-separated; ours' --ours-config), each beside plain again: diag-NAME.json
diag_shape=${DIAG_SHAPE:-"llava7b:12,56"}
# v1runner: ours with the encoder-output tier wired, so its engine on vLLM's V1 model runner
# (the default leaves the tier out on vLLM 0.26's GPUs and keeps V2): what the runner costs
diag_configs=${DIAG_CONFIGS:-'v1runner={"encoder_cache_v1_runner":true} idle={"enable_kv_save":false,"enable_kv_load":false,"enable_encoder_cache":false}'}
# FRONT_WORKERS="1 8" (exported) adds front_capacity runs after the shapes: ~3 min more,
# past the pair step's wait unless the shapes' --budget-s leaves room

pack_logs() {  # everything but the JSON results into one tarball (the 8-file limit)
  (cd "${OUT:-/tmp}" && ls | grep -v '\.json$' > /tmp/pack.lst; \
   [ -s /tmp/pack.lst ] && tar czf "logs-$1.tgz" -T /tmp/pack.lst && xargs rm -f < /tmp/pack.lst)
  ls -la "${OUT:-/tmp}"
}

start_pair() {
  # shellcheck disable=SC2086
  CUDA_VISIBLE_DEVICES=0 bash scripts/gpu_video.sh start $video_args
  # shellcheck disable=SC2086
  CUDA_VISIBLE_DEVICES=1 ARGS="$serve_args" bash scripts/gpu_serve.sh start $serve_shapes
}

case "${1:-}" in
  tp2)
    TP_ARGS=${TP_ARGS:-"--n 6"} bash scripts/gpu_replicas.sh start tp2
    bash scripts/gpu_replicas.sh wait "$wait_s"
    pack_logs tp2
    start_pair
    ;;
  pair)
    started=$SECONDS
    bash scripts/gpu_video.sh wait "$wait_s"
    bash scripts/gpu_serve.sh wait $((wait_s - (SECONDS - started)))
    pack_logs pair
    ARGS=${REPLICAS_ARGS:-} bash scripts/gpu_replicas.sh start replicas
    ;;
  replicas)
    bash scripts/gpu_replicas.sh wait "$wait_s"
    pack_logs replicas
    ;;
  one-serve)
    # shellcheck disable=SC2086
    ARGS="$serve_args" bash scripts/gpu_serve.sh start $serve_shapes
    bash scripts/gpu_serve.sh wait "$wait_s"
    pack_logs serve
    ;;
  serve-wait)  # a later call of a serving run that one-serve started: wait, bring back
    bash scripts/gpu_serve.sh wait "$wait_s"
    pack_logs serve
    ;;
  one-video)
    started=$SECONDS
    bash scripts/gpu_serve.sh wait "$wait_s"
    if [ -e /root/serve-out/done ]; then
      pack_logs serve
      # shellcheck disable=SC2086
      bash scripts/gpu_video.sh start $video_args
      bash scripts/gpu_video.sh wait $((wait_s - (SECONDS - started)))
      pack_logs video
    fi
    ;;
  video)  # a lease for the video bench alone: start it and wait
    # shellcheck disable=SC2086
    bash scripts/gpu_video.sh start $video_args
    bash scripts/gpu_video.sh wait "$wait_s"
    pack_logs video
    ;;
  one-front)
    bash scripts/gpu_video.sh wait "$wait_s"
    pack_logs video
    for n in ${FRONT_WORKERS:-8}; do
      # Redis as gpu_serve.sh unpacked it (this call carries no bundle)
      (r=/root/serve-redis/redis && cd /root/serve-code && \
       PATH=$r:$PATH PYTHONPATH=/root/site:$r/py:/root/serve-code/src:/root/serve-code/benchmarks \
       python benchmarks/front_capacity.py --model benchmarks/geometries/qwen2vl7b \
         --clients 1,16,64 --seconds 2.5 --miss-rps 500 --workers "$n" \
         --gpu-highest-rate "${FRONT_GPU_RATE:-120}" \
         --device "NVIDIA H200 machine's CPUs ($(nproc) cores)" \
         --out "${OUT:-/tmp}/front-capacity-w$n.json" > "${OUT:-/tmp}/log-front-w$n.txt" 2>&1)
      tail -n 5 "${OUT:-/tmp}/log-front-w$n.txt"
    done
    pack_logs front
    ;;
  one-diag)
    started=$SECONDS
    bash scripts/gpu_video.sh wait "$wait_s"
    pack_logs video
    for entry in $diag_configs; do
      name=${entry%%=*} config=${entry#*=}
      left=$((wait_s - (SECONDS - started)))
      [ "$left" -gt 150 ] || { echo "no time left for diag $name"; break; }
      # shellcheck disable=SC2086
      ARGS="$serve_args --ours-config '$config'" bash scripts/gpu_serve.sh start $diag_shape
      bash scripts/gpu_serve.sh wait "$left"
      s=${diag_shape%%:*}
      mv "${OUT:-/tmp}/serve-gpu-$s.json" "${OUT:-/tmp}/diag-$name.json" 2>/dev/null
      pack_logs "diag-$name"
    done
    ;;
  *) echo "usage: $0 tp2 | pair | replicas | one-serve | serve-wait | one-video | video |" \
       "one-front | one-diag"
     exit 2 ;;
esac
