"""What a video body's size costs the front (see vlmcache_lab.front_body).

    python benchmarks/front_body.py --sizes-mb 1,3,10,30 --out front-body.json
"""

import sys

from vlmcache_lab.front_body import main

if __name__ == "__main__":
    sys.exit(main())
