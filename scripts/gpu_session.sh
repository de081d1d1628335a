#!/usr/bin/env bash
# The GPU KV-path benchmark on a lent GPU machine, in the background, so that no device
# call's 10-minute limit cuts a run: vLLM 0.26 staged in /root/site by
# ../shared/gpu/stage-vllm.sh.
#   bash scripts/gpu_session.sh start JOB [JOB ...]   # returns at once (setsid)
#   bash scripts/gpu_session.sh wait 540              # up to 540 s; results and logs -> $OUT
# PIN=1: each mode taking turns runs on cores of its own (--pin-cpus). UTIL: the GPU memory
# share of a whole group (default 0.9; four Qwen2-VL engines need 0.8: their batch-32 vision
# activations go past their shares).
# JOB = SHAPE:N:MODES[:profile] (gpu_native_path.py's --modes: + = at once, taking turns
# request by request; N batch-1 requests per phase, or BIG/SMALL: SMALL on an 80 GB card,
# where three LLaVA engines hold ~17k tokens of KV each, fewer than 24 prompts (each GPU hit
# must find all of a phase's prompts); profile = py-spy stacks of the batch-1
# phases, from the wheel in .gpu/tools). Jobs run one after the other on GPU 0; with
# PARALLEL=1 and two GPUs, jobs alternate between GPU 0 and GPU 1, each GPU's in order (the
# two shapes at once: half the wall time, but host contention between them spread the
# latencies of 2026-11-26's first run).
# The full set of one shape, every target's two sides taking turns:
#   llava7b:24:vllm+vlmcache+native_cpu,native_tiering,native_tiering_restart+vlmcache_restart+vllm_repeat
set -uo pipefail
code=/root/bench-code
run_job() {  # index job gpu
  local shape n modes prof out
  IFS=: read -r shape n modes prof <<< "$2"
  local mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
  if [ "$mib" -ge 100000 ]; then n=${n%/*}; else n=${n#*/}; fi
  out=/root/out-$1-$shape
  mkdir -p "$out"
  (cd "$code" && OUT=$out CUDA_VISIBLE_DEVICES=$3 PROFILE=$([ "$prof" = profile ] && echo 1 || echo 0) \
    bash scripts/gpu_bench.sh "$shape" --n "$n" --modes "$modes" --mode-timeout 1500 \
    --gpu-memory-utilization "${UTIL:-0.9}" --work /root/work-$1-$shape ${PIN:+--pin-cpus} \
    > "$out/stdout.txt" 2>&1
   echo $? > "$out/rc")
}
case "${1:-}" in
  start)
    shift
    # a job's work folder holds its persistent store: a later session's job of the same
    # index and shape would start on it (its misses loaded from the earlier one's rows)
    rm -rf "$code" /root/out-* /root/jobs-* /root/work-* && mkdir -p "$code"
    cp -r src benchmarks scripts "$code"/  # the run reads this copy: later calls resend the tree
    ls .gpu/tools/py_spy*.whl >/dev/null 2>&1 && pip install -q --no-index .gpu/tools/py_spy*.whl
    ngpu=$(nvidia-smi -L | wc -l)
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
    lanes=$([ "${PARALLEL:-0}" = 1 ] && [ "$ngpu" -ge 2 ] && echo 2 || echo 1)
    for lane in $(seq 0 $((lanes - 1))); do
      cmds="" i=0
      for job in "$@"; do
        [ $((i % lanes)) = "$lane" ] && cmds+="run_job $i '$job' $lane; "
        i=$((i + 1))
      done
      setsid bash -c "$(declare -f run_job); code=$code PIN=${PIN:-} UTIL=${UTIL:-0.9}; $cmds touch /root/jobs-done-$lane" \
        < /dev/null > /dev/null 2>&1 &
    done
    echo "$lanes" > /root/jobs-lanes
    sleep 5; echo "started $# job(s) on $lanes lane(s) of $ngpu GPU(s)"
    ;;
  wait)
    deadline=$((SECONDS + ${2:-540}))
    lanes=$(cat /root/jobs-lanes)
    while [ $SECONDS -lt $deadline ] && [ "$(ls /root/jobs-done-* 2>/dev/null | wc -l)" -lt "$lanes" ]; do
      sleep 10
    done
    for d in /root/out-*; do
      s=${d#/root/out-}
      echo "== $s rc=$(cat $d/rc 2>/dev/null || echo running)"
      grep -E "^(vllm|vlmcache|native)" "$d/stdout.txt" | cut -c1-200
      tail -n 2 "$d/stdout.txt" | cut -c1-300
      cp "$d/gpu-native-path.json" "${OUT:-/tmp}/gpu-native-path-$s.json" 2>/dev/null
      cp "$d/stdout.txt" "${OUT:-/tmp}/log-$s.txt" 2>/dev/null
      cp "$d"/prof-*.tgz "${OUT:-/tmp}/" 2>/dev/null
      ls /root/work-$s/*.log >/dev/null 2>&1 &&  # each engine's own log (vLLM's, vlmcache's)
        tar czf "${OUT:-/tmp}/enginelogs-$s.tgz" -C /root/work-$s $(cd /root/work-$s && ls *.log)
    done
    nvidia-smi --query-gpu=memory.used --format=csv,noheader
    ;;
  *) echo "usage: $0 start JOB [JOB ...] | wait SECONDS"; exit 2 ;;
esac
