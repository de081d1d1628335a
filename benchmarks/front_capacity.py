"""The front's own capacity before an instant upstream (see vlmcache_lab.front_capacity).

    python benchmarks/front_capacity.py --model benchmarks/geometries/qwen2vl7b --clients 1,16,64
"""

import sys

from vlmcache_lab.front_capacity import main

if __name__ == "__main__":
    sys.exit(main())
