"""Cascade lookup latency (resolve p50/p90, embedding vs search) with 100k entries per tier.

    python benchmarks/lookup_latency.py                  # 100k entries, 30 requests per scenario
    python benchmarks/lookup_latency.py --entries 20000 --out /tmp/lookup-latency.json
"""

from vlmcache_lab.lookup_latency import main

if __name__ == "__main__":
    main()
