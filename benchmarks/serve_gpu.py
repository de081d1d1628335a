"""GPU serving load benchmark: `vlmcache serve` vs plain vLLM, open loop (see vlmcache_lab.serve_gpu).

    python benchmarks/serve_gpu.py --geometry benchmarks/geometries/qwen2vl7b --rates 4,12,24,48
"""

import sys

from vlmcache_lab.serve_gpu import main

if __name__ == "__main__":
    sys.exit(main())
