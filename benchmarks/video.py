"""Video through `vlmcache serve` beside plain vLLM (see vlmcache_lab.video_serve).

    python benchmarks/video.py --out benchmarks/results/video.json
"""

import sys

from vlmcache_lab.video_serve import main

if __name__ == "__main__":
    sys.exit(main())
