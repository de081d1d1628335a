"""What naming held media by identity saves in vLLM's server (see vlmcache_lab.held_media_probe).

    PYTHONPATH=benchmarks python benchmarks/held_media.py --out benchmarks/results/held-media-cpu.json
"""

import sys

from vlmcache_lab.held_media_probe import main

if __name__ == "__main__":
    sys.exit(main())
