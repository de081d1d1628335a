"""Tenant fairness (seed 004): tenant A floods unique images while tenant B replays a catalog.

    python benchmarks/fairness.py        # writes benchmarks/results/fairness.json
"""

from vlmcache_lab.fairness import main

if __name__ == "__main__":
    main()
