"""What the scheduler's promise of a stored encoder output costs (see vlmcache_lab.encoder_promise).

    python benchmarks/encoder_promise.py --out benchmarks/results/encoder-promise.json
"""

import sys

from vlmcache_lab.encoder_promise import main

if __name__ == "__main__":
    sys.exit(main())
