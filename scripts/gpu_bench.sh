#!/usr/bin/env bash
# The GPU KV-path benchmark as run on the lent GPU machine (vLLM 0.26 staged in /root/site
# by ../shared/gpu/stage-vllm.sh; see ENVIRONMENT.md). One shape per call (a call has 10
# minutes), each call's result file in $OUT; join them afterwards with
#   python benchmarks/gpu_native_path.py --merge A.json B.json ... --out RESULT.json
# A whole session (several jobs in the background, no 10-minute limit): scripts/gpu_session.sh.
# Modes joined by + run at once on the GPU, taking turns request by request (engines run one
# after the other differed by 15-30% on the same GPU hit); one group per call (10 minutes):
#   bash scripts/gpu_bench.sh llava7b --modes vllm+vlmcache
#   bash scripts/gpu_bench.sh llava7b --modes native_cpu+native_tiering
#   bash scripts/gpu_bench.sh llava7b --modes vlmcache_restart+native_tiering_restart
# A mode run again in another engine process (the noise between processes): vllm#2, vlmcache#2
# PROFILE=1 adds py-spy stacks of the batch-1 phases (wheel in .gpu/tools) -> $OUT/prof-*.tgz
# vLLM's default engine (torch.compile + CUDA graphs; the first mode on a fresh machine compiles,
# ~100 s more); --eager for enforce_eager
set -uo pipefail
shape=$1; shift
case "$shape" in
  qwen2vl7b) cpu_bytes=$((8 * 1024**3)) ;;
  llava7b) cpu_bytes=$((20 * 1024**3)) ;;
  *) echo "unknown shape $shape (qwen2vl7b or llava7b)"; exit 2 ;;
esac
export PYTHONPATH=/root/site:$(pwd)/src PYTHONUNBUFFERED=1
out=${OUT:-/root/out}
mkdir -p "$out"
extra=()
if [ "${PROFILE:-0}" = 1 ]; then
  command -v py-spy >/dev/null || pip install -q --no-index .gpu/tools/py_spy*.whl
  extra=(--profile-dir "$out/prof-$shape" ${PROFILE_ARGS:-})
fi
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
df -h /root | tail -1
python benchmarks/gpu_native_path.py --geometry benchmarks/geometries/$shape --n 24 \
  --batch 32 --cpu-bytes $cpu_bytes --mode-timeout 540 --work /root/work-$shape \
  --out "$out/gpu-native-path.json" "${extra[@]}" "$@" 2>&1 | tee -a "$out/log-$shape.txt"
rc=${PIPESTATUS[0]}
[ -d "$out/prof-$shape" ] && tar -C "$out" -czf "$out/prof-$shape.tgz" "prof-$shape" && rm -r "$out/prof-$shape"
exit $rc
