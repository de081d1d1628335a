"""GPU benchmark of the KV path: plain vLLM, vLLM's native CPU offloading, vLLM's native
tiering (CPU + fs), and vlmcache (vLLM's offloading connector + vlmcache's persistent tier),
batch 1 and batched, per 7B shape (dummy weights; vLLM 0.26 on the lent H100/H200)::

    python benchmarks/gpu_native_path.py --geometry benchmarks/geometries/llava7b \
        --out benchmarks/results/gpu-native-path.json
    python benchmarks/gpu_native_path.py --geometry benchmarks/geometries/qwen2vl7b \
        --out benchmarks/results/gpu-native-path.json

Both shapes write into the same JSON (``shapes``: the targets' figures; ``modes``: every
measurement).
"""

from vlmcache_lab.gpu_native_path import main

if __name__ == "__main__":
    main()
