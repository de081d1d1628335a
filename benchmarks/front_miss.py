"""What a miss costs the front itself, in process (see vlmcache_lab.front_miss).

    python benchmarks/front_miss.py --questions unique --paraphrase on --out front-miss.json
"""

import sys

from vlmcache_lab.front_miss import main

if __name__ == "__main__":
    sys.exit(main())
