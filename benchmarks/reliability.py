"""Local-store fault kinds (corrupt/truncated chunks and manifests, disk full, kill -9
during sync and async writes, 4 processes on one store, hostile names, planted symlinks)
-> benchmarks/results/reliability.json (merged: other kinds and `replicas` are kept).

    python benchmarks/reliability.py [--trials 50] [--out benchmarks/results/reliability.json]
"""

from vlmcache_lab.reliability import main

if __name__ == "__main__":
    main()
