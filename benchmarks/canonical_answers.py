"""``response_after_canonical`` off and on through `vlmcache serve` (see
vlmcache_lab.canonical_answers).

    flock /tmp/vlmcache-heavy.lock python benchmarks/canonical_answers.py
"""

import sys

from vlmcache_lab.canonical_answers import main

if __name__ == "__main__":
    sys.exit(main())
