"""The first requests after a proxy's start (see vlmcache_lab.first_requests).

    python benchmarks/first_requests.py --model benchmarks/geometries/qwen2vl7b --requests 12
"""

import sys

from vlmcache_lab.first_requests import main

if __name__ == "__main__":
    sys.exit(main())
