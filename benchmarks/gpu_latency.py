"""GPU benchmark: recompute vs vLLM prefix-cache hit vs vLLM native CPU offloading vs
vlmcache (capture, CPU-tier hit, disk-tier hit), batch 1 and batched, on a 7B geometry
with dummy weights (vLLM 0.26 on the lent H100/H200; see benchmarks/README.md).

    python benchmarks/gpu_latency.py --geometry benchmarks/geometries/llava7b \
        --out benchmarks/results/gpu-llava7b.json
"""

from vlmcache.bench.gpu_latency import main

if __name__ == "__main__":
    main()
