"""Serving load benchmark through `vlmcache serve` on this machine (see vlmcache.bench.serve_load).

    flock /tmp/vlmcache-heavy.lock python benchmarks/serve.py --requests 1200 --concurrency 16
"""

import sys

from vlmcache.bench.serve_load import main

if __name__ == "__main__":
    sys.exit(main())
