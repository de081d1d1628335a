"""Which tier costs what on a video request (see vlmcache_lab.video_ablation).

    python benchmarks/video_ablation.py --out benchmarks/results/video-ablation.json
"""

import sys

from vlmcache_lab.video_ablation import main

if __name__ == "__main__":
    sys.exit(main())
