"""Serving load benchmark through `vlmcache serve` on this machine (see vlmcache_lab.serve_load).

    flock /tmp/vlmcache-heavy.lock python benchmarks/serve.py --requests 1200 --concurrency 16
"""

import sys

from vlmcache_lab.serve_load import main

if __name__ == "__main__":
    sys.exit(main())
