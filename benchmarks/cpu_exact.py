"""CPU benchmark of the exact tier: cache-off vs miss (capture on) vs persisted hit.

    python benchmarks/cpu_exact.py                      # tiny test model
    python benchmarks/cpu_exact.py --model-size smollm --out benchmarks/results/cpu-exact-smollm.json
"""

from vlmcache_lab.exact_latency import main

if __name__ == "__main__":
    main()
