"""Chaos under load: `vlmcache serve` answering 16 clients while faults hit it.

    flock /tmp/vlmcache-heavy.lock python benchmarks/chaos.py    # -> benchmarks/results/chaos.json

About 20-30 minutes on 2 cores (one server start per fault kind, ~1-2 min each).
"""

import sys

from vlmcache_lab.chaos import main

if __name__ == "__main__":
    sys.exit(main())
