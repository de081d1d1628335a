"""What a first sight of a clip costs the front (see vlmcache_lab.video_front).

    python benchmarks/video_front.py --clips 8 --frames 60 --size 224 --out video-front.json
"""

import sys

from vlmcache_lab.video_front import main

if __name__ == "__main__":
    sys.exit(main())
